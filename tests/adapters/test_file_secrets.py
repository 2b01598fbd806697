"""The embedded secret store keeps values private to the owner and out of every log line."""

from __future__ import annotations

import io
import logging
import stat
from pathlib import Path

import pytest

from shared.adapters.file_secrets import FileSecretStore
from shared.domain.errors import InvalidMessage
from shared.logging import configure_logging

TOKEN = "hf_" + "FileStoreTokenValue0123456789abcdef"  # built so no scanner mistakes it for a real token


def test_a_stored_secret_reads_back_latest_and_is_private(tmp_path: Path) -> None:
    store = FileSecretStore(tmp_path / "secrets")
    assert store.get("tpuctl-hf-token") is None
    first = store.put("tpuctl-hf-token", "old-value-123")
    second = store.put("tpuctl-hf-token", TOKEN)
    assert (first, second) == ("secrets/tpuctl-hf-token/versions/1", "secrets/tpuctl-hf-token/versions/2")
    assert store.get("tpuctl-hf-token") == TOKEN
    for path in (tmp_path / "secrets" / "tpuctl-hf-token").iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "secrets").stat().st_mode) == 0o700


def test_a_value_read_from_the_store_is_redacted_from_logs(tmp_path: Path) -> None:
    FileSecretStore(tmp_path).put("key", TOKEN)
    stream = io.StringIO()
    handler = configure_logging("INFO", stream)
    try:
        logging.getLogger("tpuctl.test").info("leaking %s", FileSecretStore(tmp_path).get("key"))
    finally:
        logging.getLogger().removeHandler(handler)
    assert TOKEN not in stream.getvalue()


@pytest.mark.parametrize("name", ["../escape", "a/b", "", "-lead"])
def test_a_bad_secret_name_is_refused_with_the_field(tmp_path: Path, name: str) -> None:
    with pytest.raises(InvalidMessage, match="name"):
        FileSecretStore(tmp_path).put(name, "value-123456")
    assert not any(tmp_path.rglob("v*"))

"""JSON log lines as Cloud Logging parses them, and secrets that never reach the output."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from shared.logging import configure_logging, deployment_logger, register_secret

SECRET = "hf_" + "TestTokenThatMustNeverBeLogged12345"  # built so no scanner mistakes it for a real token


@pytest.fixture
def log_stream() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    handler = configure_logging("DEBUG", stream)
    yield stream
    logging.getLogger().removeHandler(handler)


def _lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_line_carries_severity_message_and_the_ids(log_stream: io.StringIO) -> None:
    log = deployment_logger(logging.getLogger("tpuctl.test"), deployment_id="gemma-a", command_id="c-1")
    log.warning("zone %s stocked out", "us-east5-b", extra={"zone": "us-east5-b"})
    (line,) = _lines(log_stream)
    assert line["severity"] == "WARNING"
    assert line["message"] == "zone us-east5-b stocked out"
    assert line["deployment_id"] == "gemma-a"
    assert line["command_id"] == "c-1"
    assert line["zone"] == "us-east5-b"


def test_a_secret_logged_by_mistake_never_reaches_the_output(log_stream: io.StringIO) -> None:
    register_secret(SECRET)
    log = logging.getLogger("tpuctl.test")
    log.info("token is %s", SECRET)
    log.info("inline " + SECRET)
    log.info("in extras", extra={"headers": {"Authorization": f"Bearer {SECRET}"}, "argv": ["--token", SECRET]})
    try:
        raise RuntimeError(f"failed with {SECRET}")
    except RuntimeError:
        log.exception("boom")
    output = log_stream.getvalue()
    assert SECRET not in output
    assert output.count("[REDACTED]") >= 5
    assert len(_lines(log_stream)) == 4


def test_short_values_are_not_registered_as_secrets(log_stream: io.StringIO) -> None:
    register_secret("abc")
    logging.getLogger("tpuctl.test").info("abc stays readable")
    assert _lines(log_stream)[0]["message"] == "abc stays readable"

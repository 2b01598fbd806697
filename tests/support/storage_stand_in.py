"""The twin's Cloud Storage stand-in as the controller reaches it (no token), with buckets made, for sim tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from localcloud.vm_twin.google_apis import GoogleApis
from localcloud.vm_twin.metadata_server import TokenIssuer
from shared.adapters.file_secrets import FileSecretStore


@contextlib.contextmanager
def storage_stand_in(folder: Path, buckets: dict[str, str], project: str = "tpuctl-twin") -> Iterator[GoogleApis]:
    """Served on a loopback port until the block ends; ``buckets`` maps each bucket to its location."""
    apis = GoogleApis(
        project, FileSecretStore(folder / "secrets"), folder / "storage", TokenIssuer(), require_token=False
    )
    for bucket, location in buckets.items():
        apis.create_bucket(bucket, location=location)
    apis.start()
    try:
        yield apis
    finally:
        apis.stop()

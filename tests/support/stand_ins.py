"""The twin's HTTP stand-ins served for a sim test: Cloud Storage as the controller reaches it, the Hub."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from localcloud.vm_twin.google_apis import GoogleApis
from localcloud.vm_twin.hub_api import HubStandIn
from localcloud.vm_twin.metadata_server import TokenIssuer
from shared.adapters.file_secrets import FileSecretStore


@contextlib.contextmanager
def storage_stand_in(folder: Path, buckets: dict[str, str], project: str = "tpuctl-twin") -> Iterator[GoogleApis]:
    """Storage with no token asked, served until the block ends; ``buckets`` maps each bucket to its location."""
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


@contextlib.contextmanager
def hub_stand_in(repos: dict[str, tuple[Path, str]]) -> Iterator[HubStandIn]:
    """The Hub serving each repository (model directory, commit) until the block ends."""
    served = HubStandIn(repos)
    served.start()
    try:
        yield served
    finally:
        served.stop()

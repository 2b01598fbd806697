"""Put a model's weights in the VM's Hugging Face cache: from the boot disk, the region's cache bucket, or the Hub.

Runs once per boot in the short-lived download container, before vLLM starts (``python -m node_agent.weights_restore``
with the node-agent bundle on ``PYTHONPATH``). For every file the Hub lists at the pinned revision:

1. on the boot disk already (``blobs/<digest>``, written only after its check): kept;
2. in the cache bucket (``shared.domain.weights_cache``): read in parallel ranged parts, hashed, and used only if it
   is the Hub's digest; a bad object is refused, logged, and replaced by the Hub's bytes (``ifGenerationMatch`` on
   the refused generation, so a concurrent good refill is never undone);
3. else from the Hub, hashed the same way, then written to the bucket if the object is still absent (another
   filler's 412 is fine: its bytes are checked by whoever reads them).

The cache only ever saves time: a bucket that cannot be read or written is logged and the Hub serves. Then the
snapshot links and the ref are written, so vLLM (offline) finds the revision. A report line says where the bytes
came from; the startup script puts it in the boot stages (``tpuctl/stages``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from shared.domain.errors import CloudError
from shared.domain.models import region_of
from shared.domain.weights_cache import (
    FileDigest,
    HubFile,
    HubListing,
    cache_object_name,
    check_cache_buckets,
    choose_bucket,
    repo_folder,
    weights_source,
)

__all__ = [
    "CacheBucket",
    "Hub",
    "RestoreReport",
    "WeightsError",
    "cache_arguments",
    "cache_for",
    "restore_weights",
    "vm_cache",
]

log = logging.getLogger("tpuctl.weights")
_PARTIAL = ".tpuctl-partial"
_READ_BYTES = 4 * 1024 * 1024


class WeightsError(RuntimeError):
    """The weights could not be put in place (the message names the file and the fix)."""


class CacheBucket(Protocol):
    bucket: str

    def location(self) -> str: ...
    def stat(self, name: str) -> tuple[int, int] | None: ...
    def read_to(self, name: str, generation: int, size: int, path: Path) -> None: ...
    def write_from(self, name: str, path: Path, *, if_generation: int) -> bool: ...
    def where(self, name: str) -> str: ...


class Hub(Protocol):
    def listing(self, repo_id: str, revision: str) -> HubListing: ...
    def download_to(self, repo_id: str, commit: str, file: HubFile, path: Path) -> None: ...


@dataclass
class RestoreReport:
    """Where each byte came from, what was refused, what was filled."""

    commit: str
    total_bytes: int = 0
    bytes_from: dict[str, int] = field(default_factory=lambda: {"disk": 0, "bucket": 0, "hub": 0})
    refused: list[str] = field(default_factory=list)  # files whose cached object failed its digest
    filled: int = 0
    cache: str = ""  # the bucket read, or why none was

    @property
    def source(self) -> str:
        return weights_source(self.bytes_from["disk"], self.bytes_from["bucket"], self.bytes_from["hub"])

    def stage_detail(self) -> str:
        """``source,bytes`` as the ``weights`` boot stage carries it."""
        return f"{self.source},{self.total_bytes}"

    def as_json(self) -> str:
        return json.dumps({**dataclasses.asdict(self), "source": self.source}, sort_keys=True)


def restore_weights(
    repo_id: str, revision: str, hub_home: Path, hub: Hub, cache: CacheBucket | None, *, parallel: int = 4
) -> RestoreReport:
    """Every file of ``repo_id@revision`` under ``hub_home`` (the Hub cache's ``hub/`` directory), checked."""
    listing = hub.listing(repo_id, revision)
    repo = hub_home / repo_folder(repo_id)
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    unique = list({file.digest: file for file in listing.files}.values())  # one blob however many paths share it
    with ThreadPoolExecutor(max_workers=max(1, parallel), thread_name_prefix="weights") as pool:
        outcomes = list(pool.map(lambda file: _obtain(listing, file, repo, hub, cache), unique))
    report = RestoreReport(commit=listing.commit, total_bytes=sum(file.size for file in unique))
    for file, outcome in zip(unique, outcomes, strict=True):
        report.bytes_from[outcome.source] += file.size
        report.refused += [file.path] if outcome.refused else []
        report.filled += int(outcome.filled)
    _link_snapshot(repo, listing, revision)
    return report


@dataclass(frozen=True, slots=True)
class _Outcome:
    source: str  # disk, bucket or hub
    refused: bool = False  # the bucket's object was not the Hub's bytes
    filled: bool = False  # this VM wrote the object


def _obtain(listing: HubListing, file: HubFile, repo: Path, hub: Hub, cache: CacheBucket | None) -> _Outcome:
    """One file into ``blobs/<digest>``: from the disk, the bucket, or the Hub (then into the bucket)."""
    blob = repo / "blobs" / file.digest
    if blob.is_file() and blob.stat().st_size == file.size:
        return _Outcome("disk")
    partial = blob.with_name(file.digest + _PARTIAL)
    name = cache_object_name(listing.repo_id, file)
    refused_generation = 0
    if cache is not None:
        found = _cached(cache, name, file, partial)
        if found == 0:
            os.replace(partial, blob)
            return _Outcome("bucket")
        if found is not None:
            refused_generation = found
            log.warning(
                "refused %s for %s: not the Hub's digest %s; the Hub's bytes replace it",
                cache.where(name),
                file.path,
                file.digest[:16],
            )
    try:
        hub.download_to(listing.repo_id, listing.commit, file, partial)
    except CloudError as exc:
        partial.unlink(missing_ok=True)
        raise WeightsError(f"cannot download {file.path}: {exc}") from exc
    if not _digest_of(partial, file).matches():
        partial.unlink(missing_ok=True)
        raise WeightsError(f"the Hub's bytes of {file.path} do not match its own digest {file.digest[:16]}: retry")
    os.replace(partial, blob)
    filled = cache is not None and _fill(cache, name, blob, refused_generation)
    return _Outcome("hub", refused=refused_generation > 0, filled=filled)


def _cached(cache: CacheBucket, name: str, file: HubFile, partial: Path) -> int | None:
    """0: the object was read into ``partial`` and is good; N: generation N is bad (refuse it); None: no object."""
    try:
        found = cache.stat(name)
        if found is None:
            return None
        size, generation = found
        if size == file.size:
            cache.read_to(name, generation, size, partial)
            if _digest_of(partial, file).matches():
                return 0
        partial.unlink(missing_ok=True)
        return generation
    except CloudError as exc:
        partial.unlink(missing_ok=True)
        log.warning("the weights cache is not readable (%s): %s comes from the Hub", exc, file.path)
        return None


def _fill(cache: CacheBucket, name: str, blob: Path, if_generation: int) -> bool:
    try:
        return cache.write_from(name, blob, if_generation=if_generation)
    except CloudError as exc:
        log.warning("the weights cache is not writable (%s): %s stays uncached", exc, blob.name[:16])
        return False


def _digest_of(path: Path, file: HubFile) -> FileDigest:
    digest = FileDigest(file)
    with path.open("rb") as handle:
        while chunk := handle.read(_READ_BYTES):
            digest.update(chunk)
    return digest


def _link_snapshot(repo: Path, listing: HubListing, revision: str) -> None:
    """``snapshots/<commit>/<path>`` -> ``blobs/<digest>`` (relative links), ``refs/<revision>``: the Hub's layout."""
    snapshot = repo / "snapshots" / listing.commit
    for file in listing.files:
        link = snapshot / file.path
        link.parent.mkdir(parents=True, exist_ok=True)
        target = os.path.relpath(repo / "blobs" / file.digest, link.parent)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)
    ref = revision or "main"
    if ref != listing.commit:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(listing.commit, encoding="utf-8")


def cache_for(
    buckets: dict[str, str], cross_region: bool, region: str, open_bucket: Callable[[str], CacheBucket]
) -> tuple[CacheBucket | None, str]:
    """The bucket a VM in ``region`` may read: its region's, another only if allowed; its location is checked too,
    so a mislabelled bucket of another region is not read (egress) unless cross-region reads are allowed."""
    choice = choose_bucket(buckets, region, cross_region=cross_region)
    if choice.bucket is None:
        return None, choice.reason
    bucket = open_bucket(choice.bucket)
    try:
        location = bucket.location()
    except CloudError as exc:
        return None, f"the cache bucket {choice.bucket} is not readable: {exc}"
    if location != region and not cross_region:
        return None, f"the cache bucket {choice.bucket} is in {location or 'an unknown place'}, not {region}: not read"
    return bucket, choice.reason


def cache_arguments(entries: list[str]) -> dict[str, str]:
    """The ``--cache REGION=BUCKET`` words as a checked map (the weights restore's and the compile cache's);
    ValueError names the bad one."""
    if bad := [entry for entry in entries if "=" not in entry]:
        raise ValueError(f"--cache {bad[0]!r} is not REGION=BUCKET")
    return check_cache_buckets(dict(entry.split("=", 1) for entry in entries))


def vm_cache(buckets: dict[str, str], cross_region: bool) -> tuple[CacheBucket | None, str]:
    """``cache_for`` this VM: its region from the metadata server, buckets as its service account reaches them (the
    weights restore's and the compile cache's)."""
    if not buckets:
        return None, "no cache bucket configured (no --cache)"
    from shared.adapters.weights_cache_bucket import WeightsCacheBucket, vm_zone
    from shared.config import Settings

    try:
        region = region_of(vm_zone())
    except CloudError as exc:
        return None, f"the VM's region is unknown ({exc}): the cache is not read"
    endpoint = Settings().storage_endpoint
    return cache_for(buckets, cross_region, region, lambda name: WeightsCacheBucket.on_vm(name, endpoint=endpoint))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="node_agent.weights_restore", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="Hub model id, ORG/NAME")
    parser.add_argument("--revision", default="", help="a commit or branch ('' = main)")
    parser.add_argument("--cache", action="append", default=[], metavar="REGION=BUCKET", help="a region's cache")
    parser.add_argument("--cross-region", action="store_true", help="may read another region's cache (egress)")
    parser.add_argument("--report", type=Path, help="write 'source,bytes' here for the boot stages")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    from shared.adapters.hub_files import HubFiles

    try:
        buckets = cache_arguments(args.cache)
    except ValueError as exc:
        print(f"weights: {exc}", file=sys.stderr)
        return 2
    cache, why = vm_cache(buckets, args.cross_region)
    log.info("weights cache: %s", why)
    hub_home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface") / "hub"
    try:
        report = restore_weights(
            args.model, args.revision, hub_home, HubFiles.from_environment(dict(os.environ)), cache
        )
    except (WeightsError, CloudError) as exc:
        print(f"weights: {exc}", file=sys.stderr)
        return 1
    report.cache = cache.bucket if cache is not None else why
    if args.report is not None:
        args.report.write_text(report.stage_detail(), encoding="utf-8")
    print(report.as_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())

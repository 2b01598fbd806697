"""The regional weights cache: what an entry is, how it is named, which bucket a VM may read, and how a file is checked.

Why this shape: a TPU VM is hostile once it serves (it parses untrusted prompts), and every VM of a region may write
the cache. So nothing a VM wrote is trusted: an object is named by the Hugging Face Hub's own digest of the file
(the LFS SHA-256, or the git blob id of a small file), the reader takes that digest from the Hub's listing of the
pinned revision, and every byte restored is hashed against it before it reaches vLLM. A bad object is refused
(the file comes from the Hub and replaces it); a missing one is a miss. A hostile writer can at worst empty the
cache; it cannot change what a model computes.

Objects: ``weights/models--ORG--NAME/blobs/<digest>`` (the Hub cache's own ``blobs/`` naming), one bucket per region
(an entry is read only in its region unless the user allows cross-region reads: egress is billed per byte).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from shared.domain.models import region_of

__all__ = [
    "LFS_SUFFIXES",
    "STORAGE_USD_PER_GB_MONTH",
    "WEIGHTS_PREFIX",
    "BucketChoice",
    "FileDigest",
    "HubFile",
    "HubListing",
    "cache_object_name",
    "check_cache_buckets",
    "check_repo_id",
    "choose_bucket",
    "parse_hub_listing",
    "regions_of",
    "repo_folder",
    "storage_usd_per_month",
    "weights_source",
]

WEIGHTS_PREFIX = "weights/"
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".onnx")
# Standard storage, regional, per GB-month (Cloud Storage pricing, 2026): what a cached model costs to keep.
STORAGE_USD_PER_GB_MONTH = 0.020
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_SHA1 = re.compile(r"^[0-9a-f]{40}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_REGION = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")
_MAX_FILES = 10_000


@dataclass(frozen=True, slots=True)
class HubFile:
    """One file of a revision as the Hub lists it: its path, size and the digest its bytes must have."""

    path: str
    size: int
    digest: str  # LFS: hex SHA-256 of the bytes; else the git blob id (SHA-1 of "blob <size>\\0" + bytes)
    lfs: bool


@dataclass(frozen=True, slots=True)
class HubListing:
    """A revision resolved by the Hub: the commit it names and its files."""

    repo_id: str
    commit: str
    files: tuple[HubFile, ...]

    @property
    def total_bytes(self) -> int:
        return sum(file.size for file in self.files)


class FileDigest:
    """The running digest that decides whether bytes are the Hub's: SHA-256 for LFS files, the git blob id else."""

    def __init__(self, file: HubFile) -> None:
        self._file = file
        if file.lfs:
            self._hash = hashlib.sha256()
        else:
            self._hash = hashlib.sha1(usedforsecurity=False)  # git's own blob id; the Hub names small files by it
            self._hash.update(b"blob %d\x00" % file.size)
        self.size = 0

    def update(self, chunk: bytes) -> None:
        self._hash.update(chunk)
        self.size += len(chunk)

    def matches(self) -> bool:
        return self.size == self._file.size and self._hash.hexdigest() == self._file.digest


def repo_folder(repo_id: str) -> str:
    """The Hub cache's folder name of a model repository (``models--ORG--NAME``)."""
    return "models--" + repo_id.replace("/", "--")


def cache_object_name(repo_id: str, file: HubFile) -> str:
    """The object that holds ``file``'s bytes: named by the Hub's digest, so one name has one right content."""
    return f"{WEIGHTS_PREFIX}{repo_folder(repo_id)}/blobs/{file.digest}"


def check_repo_id(repo_id: str) -> str:
    """``repo_id`` if it is a Hub model id (``ORG/NAME``): it becomes part of URLs and of cache object names."""
    if not _REPO_ID.fullmatch(repo_id) or ".." in repo_id:
        raise ValueError(f"model: {repo_id!r} is not a Hub repository id (ORG/NAME)")
    return repo_id


def parse_hub_listing(repo_id: str, body: object) -> HubListing:
    """The Hub's ``/api/models/R/revision/V?blobs=true`` answer, checked; ValueError names what is wrong."""
    check_repo_id(repo_id)
    if not isinstance(body, Mapping):
        raise ValueError("the Hub's listing is not a JSON object")
    commit = body.get("sha")
    siblings = body.get("siblings")
    if not isinstance(commit, str) or not _SHA1.fullmatch(commit):
        raise ValueError(f"the Hub's listing has no commit sha (got {str(commit)[:60]!r})")
    if not isinstance(siblings, list) or not siblings or len(siblings) > _MAX_FILES:
        raise ValueError(f"the Hub's listing of {repo_id}@{commit} has no files, or over {_MAX_FILES}")
    return HubListing(repo_id, commit, tuple(_hub_file(entry) for entry in siblings))


def _hub_file(entry: object) -> HubFile:
    if not isinstance(entry, Mapping):
        raise ValueError("a file of the Hub's listing is not an object")
    path, size, lfs = entry.get("rfilename"), entry.get("size"), entry.get("lfs")
    if not isinstance(path, str) or not path or path.startswith("/") or "\\" in path:
        raise ValueError(f"the Hub lists a file with an unusable path {str(path)[:80]!r}")
    if any(part in ("", ".", "..") for part in path.split("/")):
        raise ValueError(f"the Hub lists a file whose path leaves its folder: {path[:80]!r}")
    if isinstance(lfs, Mapping):
        digest, size = lfs.get("sha256"), lfs.get("size", size)
        pattern = _SHA256
    else:
        digest, pattern = entry.get("blobId"), _SHA1
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ValueError(f"the Hub lists {path} without a size (ask with blobs=true)")
    if not isinstance(digest, str) or not pattern.fullmatch(digest):
        raise ValueError(f"the Hub lists {path} without a digest (ask with blobs=true)")
    return HubFile(path=path, size=size, digest=digest, lfs=isinstance(lfs, Mapping))


@dataclass(frozen=True, slots=True)
class BucketChoice:
    """The cache bucket a VM in ``region`` reads (None: boot from the Hub) and why."""

    bucket: str | None
    reason: str


def choose_bucket(buckets: Mapping[str, str], region: str, *, cross_region: bool) -> BucketChoice:
    """The region's own bucket; another region's only when the user allowed cross-region reads (egress cost)."""
    if region in buckets:
        return BucketChoice(buckets[region], f"the {region} cache")
    if not buckets:
        return BucketChoice(None, "no weights cache is installed (terraform: weights_cache_regions)")
    if cross_region:
        other = sorted(buckets)[0]
        return BucketChoice(buckets[other], f"the {other} cache, read across regions (allowed; egress is billed)")
    return BucketChoice(
        None,
        f"no weights cache in {region} (caches: {', '.join(sorted(buckets))}): not read across regions, whose "
        f"egress is billed; add {region} to terraform's weights_cache_regions, or allow cross-region reads",
    )


def check_cache_buckets(buckets: Mapping[str, str]) -> dict[str, str]:
    """``{region: bucket}`` checked (region names, bucket names); ValueError names the bad entry and the fix."""
    checked: dict[str, str] = {}
    for region, bucket in buckets.items():
        if not _REGION.fullmatch(region):
            raise ValueError(f"weights_cache_buckets: {region!r} is not a region (e.g. us-east5)")
        if not re.fullmatch(r"[a-z0-9][a-z0-9_.-]{1,61}[a-z0-9]", bucket) or ".." in bucket:
            raise ValueError(f"weights_cache_buckets: {bucket!r} for {region} is not a Cloud Storage bucket name")
        checked[region] = bucket
    return checked


def weights_source(from_disk: int, from_bucket: int, from_hub: int) -> str:
    """The boot stage's weights source: ``cached`` (the boot disk), ``bucket``, ``hub``, or ``mixed``."""
    used = [name for name, count in (("bucket", from_bucket), ("hub", from_hub)) if count]
    if not used:
        return "cached" if from_disk else "hub"
    return used[0] if len(used) == 1 else "mixed"


def storage_usd_per_month(total_bytes: int) -> float:
    """What keeping ``total_bytes`` in the cache costs a month (Standard storage, regional)."""
    return round(total_bytes / 1e9 * STORAGE_USD_PER_GB_MONTH, 2)


def regions_of(zones: Iterable[str]) -> list[str]:
    """The regions of ``zones`` (``us-east5-b`` -> ``us-east5``), first-seen order."""
    return list(dict.fromkeys(region_of(zone) for zone in zones))

"""The weights restore on stateful fakes of the Hub and a cache bucket: every byte checked against the Hub's digest.

The fakes keep state the way the real services do (a bucket holds objects by generation and honours
``ifGenerationMatch``; the Hub lists digests and serves bytes), so each test drives the restore and then reads the
resulting state: what is on disk, what the bucket holds, what the Hub served.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import Counter
from pathlib import Path

import pytest

from node_agent.weights_restore import RestoreReport, WeightsError, cache_for, restore_weights
from shared.domain.weights_cache import (
    FileDigest,
    HubFile,
    HubListing,
    cache_object_name,
    choose_bucket,
    parse_hub_listing,
    repo_folder,
    storage_usd_per_month,
    weights_source,
)
from tests.support.memory_bucket import MemoryBucket

REPO = "google/gemma-4-e4b-it"
COMMIT = "a" * 40
FILES = {
    "config.json": b'{"model_type": "gemma4"}',
    "model-00001-of-00002.safetensors": b"\x01" * 3000,
    "model-00002-of-00002.safetensors": b"\x02" * 2000,
    "tokenizer/tokenizer.json": b'{"vocab": {}}',
}


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\x00" % len(data) + data, usedforsecurity=False).hexdigest()


def hub_file(path: str, data: bytes) -> HubFile:
    lfs = path.endswith(".safetensors")
    digest = hashlib.sha256(data).hexdigest() if lfs else git_blob_id(data)
    return HubFile(path=path, size=len(data), digest=digest, lfs=lfs)


class FakeHub:
    """The Hub's listing and bytes; ``tampered`` paths serve other bytes than the listing's digest."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = dict(files)
        self.served: Counter[str] = Counter()
        self.tampered: set[str] = set()
        self.before_download = threading.Event()
        self.before_download.set()

    def listing(self, repo_id: str, revision: str) -> HubListing:
        return HubListing(repo_id, COMMIT, tuple(hub_file(path, data) for path, data in self.files.items()))

    def download_to(self, repo_id: str, commit: str, file: HubFile, path: Path) -> None:
        self.before_download.wait(5)
        self.served[file.path] += 1
        data = self.files[file.path]
        path.write_bytes(data[::-1] + b"!" if file.path in self.tampered else data)


def snapshot_bytes(home: Path) -> dict[str, bytes]:
    snapshot = home / repo_folder(REPO) / "snapshots" / COMMIT
    return {path: (snapshot / path).read_bytes() for path in FILES}


def object_of(path: str) -> str:
    return cache_object_name(REPO, hub_file(path, FILES[path]))


def test_a_cold_boot_downloads_from_the_hub_fills_the_bucket_and_lays_out_the_hub_cache(tmp_path: Path) -> None:
    hub, bucket = FakeHub(FILES), MemoryBucket()
    report = restore_weights(REPO, "", tmp_path, hub, bucket)
    assert report.source == "hub" and report.filled == len(FILES) and report.refused == []
    assert report.total_bytes == sum(len(data) for data in FILES.values())
    assert snapshot_bytes(tmp_path) == FILES
    assert (tmp_path / repo_folder(REPO) / "refs" / "main").read_text() == COMMIT
    assert {name: data for name, (_generation, data) in bucket.objects.items()} == {
        object_of(path): data for path, data in FILES.items()
    }
    assert not list((tmp_path / repo_folder(REPO) / "blobs").glob("*.tpuctl-partial"))


def test_a_warm_boot_elsewhere_in_the_region_restores_every_byte_from_the_bucket(tmp_path: Path) -> None:
    hub, bucket = FakeHub(FILES), MemoryBucket()
    restore_weights(REPO, "", tmp_path / "first-vm", hub, bucket)
    served = sum(hub.served.values())
    report = restore_weights(REPO, "", tmp_path / "second-vm", hub, bucket)
    assert report.source == "bucket" and report.filled == 0
    assert sum(hub.served.values()) == served  # the Hub was not asked again
    assert report.stage_detail() == f"bucket,{report.total_bytes}"
    assert snapshot_bytes(tmp_path / "second-vm") == FILES


def test_a_cached_object_with_a_bad_hash_is_refused_and_refilled(tmp_path: Path) -> None:
    hub, bucket = FakeHub(FILES), MemoryBucket()
    shard = "model-00001-of-00002.safetensors"
    bucket.put(object_of(shard), b"\x66" * len(FILES[shard]))  # same size, other bytes: a poisoned entry
    bad_generation = bucket.objects[object_of(shard)][0]
    report = restore_weights(REPO, "", tmp_path / "vm", hub, bucket)
    assert report.refused == [shard] and report.source == "hub"
    assert snapshot_bytes(tmp_path / "vm")[shard] == FILES[shard]  # the poisoned bytes never reached the disk
    generation, data = bucket.objects[object_of(shard)]
    assert data == FILES[shard] and generation > bad_generation  # replaced, on the refused generation only
    again = restore_weights(REPO, "", tmp_path / "next-vm", hub, bucket)
    assert again.source == "bucket" and again.refused == []


def test_a_cached_object_of_the_wrong_size_is_refused_without_reading_it(tmp_path: Path) -> None:
    hub, bucket = FakeHub(FILES), MemoryBucket()
    bucket.put(object_of("config.json"), b"{}")
    report = restore_weights(REPO, "", tmp_path, hub, bucket)
    assert report.refused == ["config.json"] and bucket.reads[object_of("config.json")] == 0
    assert bucket.objects[object_of("config.json")][1] == FILES["config.json"]


def test_two_vms_filling_the_same_entry_at_once_leave_one_good_entry(tmp_path: Path) -> None:
    hub, bucket = FakeHub(FILES), MemoryBucket()
    hub.before_download.clear()  # both VMs miss before either fills
    reports: list[RestoreReport] = []
    vms = [
        threading.Thread(target=lambda home=home: reports.append(restore_weights(REPO, "", home, hub, bucket)))
        for home in (tmp_path / "a", tmp_path / "b")
    ]
    for vm in vms:
        vm.start()
    hub.before_download.set()
    for vm in vms:
        vm.join(30)
    assert len(reports) == 2 and sum(report.filled for report in reports) == len(FILES)
    assert set(bucket.writes.values()) == {1}  # a loser's write was refused (or it read the winner's): never applied
    assert {name: data for name, (_g, data) in bucket.objects.items()} == {
        object_of(path): data for path, data in FILES.items()
    }


def test_bytes_from_the_hub_that_miss_its_own_digest_fail_the_restore_and_leave_nothing(tmp_path: Path) -> None:
    hub, bucket = FakeHub(FILES), MemoryBucket()
    hub.tampered.add("config.json")
    with pytest.raises(WeightsError, match=re.escape("config.json do not match its own digest")):
        restore_weights(REPO, "", tmp_path, hub, bucket)
    assert object_of("config.json") not in bucket.objects
    blobs = tmp_path / repo_folder(REPO) / "blobs"
    assert not (blobs / hub_file("config.json", FILES["config.json"]).digest).exists()
    assert not list(blobs.glob("*.tpuctl-partial"))


def test_an_unreadable_bucket_costs_time_not_the_boot(tmp_path: Path) -> None:
    hub, bucket = FakeHub(FILES), MemoryBucket()
    bucket.broken = True
    report = restore_weights(REPO, "", tmp_path, hub, bucket)
    assert report.source == "hub" and snapshot_bytes(tmp_path) == FILES


def test_files_on_the_boot_disk_are_kept_and_the_rest_restored(tmp_path: Path) -> None:
    hub, bucket = FakeHub(FILES), MemoryBucket()
    restore_weights(REPO, "", tmp_path, hub, bucket)
    (tmp_path / repo_folder(REPO) / "blobs" / hub_file("config.json", FILES["config.json"]).digest).unlink()
    report = restore_weights(REPO, "", tmp_path, hub, None)
    assert report.bytes_from["disk"] == report.total_bytes - len(FILES["config.json"])
    assert report.source == "hub" and snapshot_bytes(tmp_path) == FILES


def test_a_pinned_commit_writes_no_branch_ref(tmp_path: Path) -> None:
    restore_weights(REPO, COMMIT, tmp_path, FakeHub(FILES), None)
    assert not (tmp_path / repo_folder(REPO) / "refs").exists()
    assert snapshot_bytes(tmp_path) == FILES


def test_a_vm_reads_only_its_own_regions_cache_unless_cross_region_reads_are_allowed() -> None:
    opened: list[str] = []

    def open_bucket(name: str) -> MemoryBucket:
        opened.append(name)
        return MemoryBucket(name, location="europe-west4")

    buckets = {"europe-west4": "cache-eu"}
    cache, why = cache_for(buckets, False, "us-east5", open_bucket)
    assert cache is None and "not read across regions" in why and opened == []
    cache, why = cache_for(buckets, True, "us-east5", open_bucket)
    assert cache is not None and cache.bucket == "cache-eu" and "egress" in why


def test_a_bucket_mapped_to_the_region_but_located_elsewhere_is_not_read() -> None:
    def open_bucket(name: str) -> MemoryBucket:
        return MemoryBucket(name, location="us")  # a multi-region bucket named as if it were us-east5's

    cache, why = cache_for({"us-east5": "cache-us"}, False, "us-east5", open_bucket)
    assert cache is None and "is in us, not us-east5" in why


def test_the_git_blob_digest_is_gits_own() -> None:
    data = b"hello\n"
    file = HubFile("README.md", len(data), "ce013625030ba8dba906f756967f9e9ca394464a", lfs=False)  # git hash-object
    digest = FileDigest(file)
    digest.update(data)
    assert digest.matches()
    short = FileDigest(file)
    short.update(data[:-1])
    assert not short.matches()


@pytest.mark.parametrize(
    ("sibling", "problem"),
    [
        ({"rfilename": "../../etc/passwd", "size": 1, "blobId": "a" * 40}, "leaves its folder"),
        ({"rfilename": "/abs", "size": 1, "blobId": "a" * 40}, "unusable path"),
        ({"rfilename": "model.safetensors", "size": 1, "lfs": {"sha256": "xyz", "size": 1}}, "without a digest"),
        ({"rfilename": "config.json", "blobId": "a" * 40}, "without a size"),
    ],
)
def test_a_hub_listing_that_could_escape_or_cannot_be_checked_is_refused(sibling: dict, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_hub_listing(REPO, {"sha": COMMIT, "siblings": [sibling]})


def test_a_repo_id_that_is_not_org_slash_name_is_refused() -> None:
    with pytest.raises(ValueError, match=re.escape("model: '../x' is not a Hub repository id")):
        parse_hub_listing("../x", {"sha": COMMIT, "siblings": []})


def test_the_region_choice_and_the_source_names() -> None:
    assert choose_bucket({}, "us-east5", cross_region=True).bucket is None
    assert choose_bucket({"us-east5": "b"}, "us-east5", cross_region=False).bucket == "b"
    assert weights_source(10, 0, 0) == "cached"
    assert weights_source(10, 5, 0) == "bucket"
    assert weights_source(0, 5, 5) == "mixed"
    assert storage_usd_per_month(62_579_490_816) == 1.25

"""The weights restore with its real adapters against the twin's Hub and Cloud Storage stand-ins, over real HTTP.

What the issue asks the cache to prove, on the wire the VM speaks: a warm boot reads no byte from the Hub; an entry
with a bad hash is refused and refilled; two VMs filling one entry leave one good entry; a cache in another region
is not read unless allowed; what a plan reports as cached is what the bucket holds.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

import shared.adapters.weights_cache_bucket as bucket_module
from localcloud.vm_twin.google_apis import GoogleApis
from localcloud.vm_twin.hub_api import HubStandIn
from node_agent.weights_restore import RestoreReport, cache_for, restore_weights
from shared.adapters.hub_files import HubFiles
from shared.adapters.weights_cache_bucket import CloudStorageCacheState, WeightsCacheBucket
from shared.domain.errors import CloudError
from shared.domain.weights_cache import repo_folder
from tests.support.stand_ins import hub_stand_in, storage_stand_in

REPO = "google/gemma-4-e4b-it"
COMMIT = "c" * 40
BUCKET = "tpuctl-twin-weights-us-east5"
FILES = {
    "config.json": b'{"model_type": "gemma4"}\n',
    "model.safetensors": bytes(range(256)) * 40,
    "tokenizer.json": b'{"version": "1.0"}\n',
}


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    for name, data in FILES.items():
        (folder / name).write_bytes(data)
    return folder


@pytest.fixture
def hub(model_dir: Path) -> Iterator[HubStandIn]:
    with hub_stand_in({REPO: (model_dir, COMMIT)}) as served:
        yield served


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[GoogleApis]:
    with storage_stand_in(tmp_path, {BUCKET: "us-east5", "tpuctl-twin-weights-europe-west4": "europe-west4"}) as apis:
        yield apis


def cache(storage: GoogleApis, bucket: str = BUCKET) -> WeightsCacheBucket:
    return WeightsCacheBucket(bucket, requests.Session(), endpoint=storage.base_url)


def restore(home: Path, hub: HubStandIn, storage: GoogleApis) -> RestoreReport:
    return restore_weights(REPO, "", home, HubFiles(hub.base_url), cache(storage))


def on_disk(home: Path) -> dict[str, bytes]:
    snapshot = home / repo_folder(REPO) / "snapshots" / COMMIT
    return {name: (snapshot / name).read_bytes() for name in FILES}


def hub_downloads(hub: HubStandIn) -> int:
    return sum(hub.downloads.values())


def test_the_first_boot_fills_the_bucket_and_the_next_reads_no_byte_from_the_hub(
    tmp_path: Path, hub: HubStandIn, storage: GoogleApis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bucket_module, "PART_BYTES", 1000)  # the shard is read as 11 ranged parts in parallel
    state = CloudStorageCacheState(endpoint=storage.base_url)
    assert state.cached_bytes(BUCKET, REPO) == 0
    cold = restore(tmp_path / "vm-1", hub, storage)
    assert cold.source == "hub" and cold.filled == len(FILES) and hub_downloads(hub) == len(FILES)
    assert state.cached_bytes(BUCKET, REPO) == sum(len(data) for data in FILES.values())
    warm = restore(tmp_path / "vm-2", hub, storage)
    assert warm.source == "bucket" and hub_downloads(hub) == len(FILES)  # not one more file from the Hub
    assert on_disk(tmp_path / "vm-2") == FILES
    assert (tmp_path / "vm-2" / repo_folder(REPO) / "refs" / "main").read_text() == COMMIT


def test_an_entry_with_a_bad_hash_is_refused_and_refilled(tmp_path: Path, hub: HubStandIn, storage: GoogleApis) -> None:
    restore(tmp_path / "vm-1", hub, storage)
    objects = [path for path in (storage.buckets_dir / BUCKET).rglob("*") if path.is_file()]
    shard = next(path for path in objects if path.stat().st_size == len(FILES["model.safetensors"]))
    shard.write_bytes(b"\xff" * len(FILES["model.safetensors"]))  # a hostile VM's bytes, same size
    name = shard.relative_to(storage.buckets_dir / BUCKET).as_posix()
    poisoned_generation = storage.object_generation(BUCKET, name)
    report = restore(tmp_path / "vm-2", hub, storage)
    assert report.refused == ["model.safetensors"] and report.source == "mixed"
    assert on_disk(tmp_path / "vm-2") == FILES  # the poisoned bytes never reached the model
    assert shard.read_bytes() == FILES["model.safetensors"]
    assert (storage.object_generation(BUCKET, name) or 0) > (poisoned_generation or 0)
    assert restore(tmp_path / "vm-3", hub, storage).source == "bucket"


def test_two_vms_filling_the_same_entry_at_once_leave_one_good_entry(
    tmp_path: Path, hub: HubStandIn, storage: GoogleApis
) -> None:
    reports: list[RestoreReport] = []
    start = threading.Barrier(2)

    def boot(home: Path) -> None:
        start.wait(5)
        reports.append(restore(home, hub, storage))

    vms = [threading.Thread(target=boot, args=(tmp_path / name,)) for name in ("vm-a", "vm-b")]
    for vm in vms:
        vm.start()
    for vm in vms:
        vm.join(60)
    assert len(reports) == 2 and all(on_disk(tmp_path / name) == FILES for name in ("vm-a", "vm-b"))
    assert sum(report.filled for report in reports) == len(FILES)  # each object written once, by one of them
    warm = restore(tmp_path / "vm-c", hub, storage)
    assert warm.source == "bucket" and on_disk(tmp_path / "vm-c") == FILES


def test_a_cache_in_another_region_is_never_read_unless_allowed(storage: GoogleApis) -> None:
    misplaced = {"us-east5": "tpuctl-twin-weights-europe-west4"}  # a map that names another region's bucket
    chosen, why = cache_for(misplaced, False, "us-east5", lambda name: cache(storage, name))
    assert chosen is None and "is in europe-west4, not us-east5" in why
    only_europe = {"europe-west4": "tpuctl-twin-weights-europe-west4"}
    chosen, why = cache_for(only_europe, False, "us-east5", lambda name: cache(storage, name))
    assert chosen is None and "not read across regions" in why
    chosen, _why = cache_for(only_europe, True, "us-east5", lambda name: cache(storage, name))
    assert chosen is not None and chosen.bucket == "tpuctl-twin-weights-europe-west4"


def test_a_missing_bucket_is_a_classified_error_naming_it(storage: GoogleApis) -> None:
    with pytest.raises(CloudError, match="tpuctl-twin-no-such-bucket"):
        CloudStorageCacheState(endpoint=storage.base_url).cached_bytes("tpuctl-twin-no-such-bucket", REPO)

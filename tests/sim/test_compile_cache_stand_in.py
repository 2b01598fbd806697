"""The compile cache's command line against the twin's Cloud Storage and metadata server stand-ins, over real HTTP.

Each VM is a metadata server of its own (its zone, its service account, its tokens), so ``python -m
node_agent.compile_cache`` finds its region and its bucket as on Google Cloud, and the Storage stand-in holds its
writes to Terraform's rule: only the prewarm builder's account may write under ``compile/``. What is proved: a
builder's fill is a serving VM's hit; a serving VM cannot fill; a damaged archive is refused, then repaired by the
next fill; a VM in another region reads nothing across regions unless allowed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.auth.compute_engine import _metadata

import shared.adapters.weights_cache_bucket as bucket_module
from localcloud.vm_twin.google_apis import GoogleApis
from localcloud.vm_twin.metadata_server import GuestAttributes, MetadataServer, TokenIssuer, VmIdentity
from node_agent.compile_cache import main
from shared.adapters.file_secrets import FileSecretStore
from shared.adapters.weights_cache_bucket import CloudStorageCacheState
from shared.domain.compile_cache import COMPILE_PREFIX, archive_name
from tests.support.file_trees import read_tree, write_tree

PROJECT = "tpuctl-twin"
MODEL = "google/gemma-4-e4b-it"
KEY = "0123456789abcdef0123456789abcdef"
BUCKET = "tpuctl-twin-weights-us-east5"
EUROPE = "tpuctl-twin-weights-europe-west4"
BUILDER = f"tpuctl-tpu-builder@{PROJECT}.iam.gserviceaccount.com"
SERVER = f"tpuctl-tpu-vm@{PROJECT}.iam.gserviceaccount.com"
COMPILED = {
    "xla_cache/jit_forward-7f3a/executable.bin": bytes(range(256)) * 64,
    "xla_cache/jit_sample-19c2": b"sample executable",
    "torch_compile_cache/torch_aot_compile/abc/rank_0_0/model": b"inductor kernels",
}


class Cloud:
    """Storage for every VM (one token issuer), and a way to be one VM: its metadata server, found by google-auth."""

    def __init__(self, folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.folder = folder
        self.tokens = TokenIssuer()
        self.apis = GoogleApis(
            PROJECT,
            FileSecretStore(folder / "secrets"),
            folder / "storage",
            self.tokens,
            prefix_writers={COMPILE_PREFIX: {BUILDER}},
        )
        self.apis.create_bucket(BUCKET, location="us-east5")
        self.apis.create_bucket(EUROPE, location="europe-west4")
        self._monkeypatch = monkeypatch
        self._vms = 0

    @contextlib.contextmanager
    def vm(self, zone: str, account: str) -> Iterator[None]:
        self._vms += 1
        identity = VmIdentity(PROJECT, 412345678901, zone, f"vm-{self._vms}", self._vms, account)
        nothing = GuestAttributes(put=lambda *_: None, read=list, delete=lambda *_: None)
        server = MetadataServer(identity, dict, nothing, self.tokens)
        host = server.start()
        self._monkeypatch.setattr(_metadata, "_GCE_METADATA_HOST", host)  # what GCE_METADATA_HOST sets at import
        self._monkeypatch.setenv("GCE_METADATA_IP", host)  # google-auth's ping reads this one at call time
        self._monkeypatch.setenv("TPUCTL_STORAGE_ENDPOINT", self.apis.base_url)
        try:
            yield
        finally:
            server.stop()

    def run(self, action: str, folder: Path, *extra: str, caches: tuple[str, ...] = (f"us-east5={BUCKET}",)) -> str:
        """``python -m node_agent.compile_cache ACTION`` as the current VM: its exit code and report line."""
        report = folder.parent / f"{folder.name}.report"
        argv = [action, "--model", MODEL, "--key", KEY, "--cache-dir", str(folder), "--report", str(report)]
        code = main([*argv, *(word for cache in caches for word in ("--cache", cache)), *extra])
        return f"{code}:{report.read_text().strip() if report.exists() else ''}"

    def compile_objects(self, bucket: str = BUCKET) -> dict[str, Path]:
        root = self.apis.buckets_dir / bucket
        return {path.relative_to(root).as_posix(): path for path in (root / "compile").rglob("*") if path.is_file()}

    def fill_as_builder(self) -> tuple[int, str]:
        with self.vm("us-east5-b", BUILDER):
            result = self.run("fill", write_tree(self.folder / f"builder-{self._vms}", COMPILED))
        code, line = result.split(":")
        outcome, size, digest = line.split(",")
        assert (code, outcome) == ("0", "filled"), result
        return int(size), digest


@pytest.fixture
def cloud(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cloud]:
    served = Cloud(tmp_path, monkeypatch)
    served.apis.start()
    try:
        yield served
    finally:
        served.apis.stop()


def test_a_builders_fill_is_a_serving_vms_hit(cloud: Cloud, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bucket_module, "SINGLE_UPLOAD_BYTES", 1024)  # the archive goes up in a resumable session
    monkeypatch.setattr(bucket_module, "PART_BYTES", 4096)  # and comes down in ranged parts, in parallel
    size, digest = cloud.fill_as_builder()
    objects = cloud.compile_objects()
    assert sorted(objects) == sorted(
        [f"compile/models--google--gemma-4-e4b-it/{KEY}.json", archive_name(MODEL, KEY, digest)]
    )
    assert objects[archive_name(MODEL, KEY, digest)].stat().st_size == size
    with cloud.vm("us-east5-a", SERVER):
        assert cloud.run("restore", cloud.folder / "server") == f"0:hit,{size}"
        assert read_tree(cloud.folder / "server") == COMPILED
        assert cloud.run("restore", cloud.folder / "server") == "0:local"  # a reboot on the same disk
    with cloud.vm("us-east5-b", BUILDER):
        assert cloud.run("fill", write_tree(cloud.folder / "builder-again", COMPILED)) == f"0:present,{size},{digest}"


def test_a_serving_vm_may_not_fill_the_compile_cache(cloud: Cloud) -> None:
    with cloud.vm("us-east5-a", SERVER):
        assert cloud.run("fill", write_tree(cloud.folder / "server", COMPILED)) == "1:denied"
        assert cloud.run("restore", cloud.folder / "other-server") == "0:miss"
    assert cloud.compile_objects() == {}


def test_a_corrupted_archive_is_refused_then_repaired_by_the_next_fill(cloud: Cloud) -> None:
    size, digest = cloud.fill_as_builder()
    stored = cloud.compile_objects()[archive_name(MODEL, KEY, digest)]
    poisoned = b"\xff" * size  # a hostile writer's bytes, same size
    stored.write_bytes(poisoned)
    poisoned_generation = cloud.apis.object_generation(BUCKET, archive_name(MODEL, KEY, digest)) or 0
    with cloud.vm("us-east5-a", SERVER):
        assert cloud.run("restore", cloud.folder / "server-1") == "0:refused"
    assert read_tree(cloud.folder / "server-1") == {}  # nothing extracted, no scratch left
    assert cloud.fill_as_builder() == (size, digest)
    assert stored.read_bytes() != poisoned
    assert (cloud.apis.object_generation(BUCKET, archive_name(MODEL, KEY, digest)) or 0) > poisoned_generation
    with cloud.vm("us-east5-a", SERVER):
        assert cloud.run("restore", cloud.folder / "server-2") == f"0:hit,{size}"
    assert read_tree(cloud.folder / "server-2") == COMPILED


def test_a_vm_in_another_region_reads_nothing_across_regions_unless_allowed(cloud: Cloud) -> None:
    size, _digest = cloud.fill_as_builder()
    before = len(cloud.apis.calls)
    with cloud.vm("europe-west4-a", SERVER):
        assert cloud.run("restore", cloud.folder / "eu-1") == "0:off"  # no cache in europe-west4
        mislabelled = (f"europe-west4={BUCKET}",)  # a map naming the us-east5 bucket for europe-west4
        assert cloud.run("restore", cloud.folder / "eu-2", caches=mislabelled) == "0:off"
        assert cloud.run("restore", cloud.folder / "eu-3", caches=(f"europe-west4={EUROPE}",)) == "0:miss"
    object_reads = [path for method, path in cloud.apis.calls[before:] if f"/b/{BUCKET}/o" in path]
    assert object_reads == [] and read_tree(cloud.folder / "eu-1") == read_tree(cloud.folder / "eu-2") == {}
    with cloud.vm("europe-west4-a", SERVER):
        assert cloud.run("restore", cloud.folder / "eu-4", "--cross-region") == f"0:hit,{size}"
    assert read_tree(cloud.folder / "eu-4") == COMPILED


def test_the_plan_reads_an_entry_as_a_boot_would(cloud: Cloud) -> None:
    """The gateway's reader (the plan's compile cache state), anonymous on the controller side as in the twin."""
    controller = GoogleApis(
        PROJECT, FileSecretStore(cloud.folder / "secrets"), cloud.folder / "storage", cloud.tokens, require_token=False
    )
    controller.start()
    try:
        state = CloudStorageCacheState(endpoint=controller.base_url)
        assert state.compiled_bytes(BUCKET, MODEL, KEY) is None
        size, digest = cloud.fill_as_builder()
        assert state.compiled_bytes(BUCKET, MODEL, KEY) == size
        assert state.compiled_bytes(BUCKET, MODEL, "f" * 32) is None  # another plan's key
        cloud.compile_objects()[archive_name(MODEL, KEY, digest)].write_bytes(b"cut short")
        assert state.compiled_bytes(BUCKET, MODEL, KEY) is None  # a boot would refuse it: cold, not warm
    finally:
        controller.stop()

"""The compile cache's restore and fill on a stateful fake of the region's cache bucket.

The fake keeps objects by generation and honours ``ifGenerationMatch`` atomically (412 as False), as Cloud Storage
does, and can refuse writes with a 403 as it does for a serving VM's account; each test drives a fill or a restore
and then reads the resulting state: what is under the cache directory, what the bucket holds.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import threading
from collections import Counter
from pathlib import Path

import pytest

import node_agent.compile_cache as compile_cache_module
from node_agent.compile_cache import (
    Outcome,
    fill_compiled,
    has_compiled_artefacts,
    main,
    pack_compiled,
    restore_compiled,
)
from shared.domain.compile_cache import COMPILED_DIRS, CompileManifest, archive_name, manifest_name
from shared.domain.errors import CloudError, ErrorClass
from tests.support.file_trees import read_tree as _read_tree
from tests.support.file_trees import write_tree
from tests.support.memory_bucket import MemoryBucket

MODEL = "google/gemma-4-e4b-it"
KEY = "0123456789abcdef0123456789abcdef"
OTHER_KEY = "f" * 32
COMPILED = {
    "xla_cache/jit_forward-7f3a/executable.bin": bytes(range(256)) * 20,
    "xla_cache/jit_forward-7f3a/metadata.json": b'{"version": 3}',
    "xla_cache/jit_sample-19c2": b"\x00\x01\x02 sample",
    "torch_compile_cache/torch_aot_compile/abc/rank_0_0/model": b"inductor kernels",
}


class FakeBucket(MemoryBucket):
    """The shared in-memory bucket; an unreadable one answers 503 here, and the entry's manifest reads back."""

    def __init__(self) -> None:
        super().__init__()
        self.broken_error = CloudError(ErrorClass.TRANSIENT, "HTTP 503", code=503)

    def manifest(self, key: str = KEY) -> dict[str, object]:
        return dict(json.loads(self.objects[manifest_name(MODEL, key)][1]))


def read_tree(root: Path) -> dict[str, bytes]:
    return _read_tree(root, COMPILED_DIRS)


def builder_fill(
    tmp_path: Path, bucket: FakeBucket, files: dict[str, bytes] = COMPILED, name: str = "builder"
) -> Outcome:
    return fill_compiled(MODEL, KEY, write_tree(tmp_path / name, files), bucket)


def leftovers(root: Path) -> list[str]:
    """What a restore left in the cache directory besides what it should (scratch, compiled dirs)."""
    return sorted(path.name for path in root.iterdir()) if root.is_dir() else []


def publish_raw(bucket: FakeBucket, archive: bytes, key: str = KEY) -> None:
    """An entry as a (hostile or broken) writer would leave it: any archive bytes, a manifest that matches them."""
    digest = hashlib.sha256(archive).hexdigest()
    name = archive_name(MODEL, key, digest)
    bucket.put(name, archive)
    bucket.put(manifest_name(MODEL, key), CompileManifest(key, name, digest, len(archive)).to_json().encode())


def tar_of(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buffer.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info, b"evil bytes"


def test_a_fill_then_a_restore_puts_every_compiled_file_back_byte_for_byte(tmp_path: Path) -> None:
    bucket = FakeBucket()
    filled = builder_fill(tmp_path, bucket)
    archive = bucket.objects[str(bucket.manifest()["archive"])][1]
    assert filled == Outcome("filled", len(archive), hashlib.sha256(archive).hexdigest())
    assert filled.report_line() == f"filled,{len(archive)},{filled.sha256}"
    restored = restore_compiled(MODEL, KEY, tmp_path / "server", bucket)
    assert restored == Outcome("hit", len(archive), filled.sha256) and restored.report_line() == f"hit,{len(archive)}"
    assert read_tree(tmp_path / "server") == COMPILED
    assert leftovers(tmp_path / "server") == sorted(COMPILED_DIRS)  # no scratch left behind


def test_a_second_fill_finds_the_entry_present_and_writes_nothing(tmp_path: Path) -> None:
    bucket = FakeBucket()
    first = builder_fill(tmp_path, bucket, name="builder-1")
    before = dict(bucket.objects)
    second = builder_fill(tmp_path, bucket, name="builder-2")
    assert second == Outcome("present", first.bytes, first.sha256) and second.report_line().startswith("present,")
    assert bucket.objects == before


def test_no_entry_is_a_miss_and_no_bucket_is_off(tmp_path: Path) -> None:
    assert restore_compiled(MODEL, KEY, tmp_path / "server", FakeBucket()).report_line() == "miss"
    assert restore_compiled(MODEL, KEY, tmp_path / "server", None).report_line() == "off"
    assert fill_compiled(MODEL, KEY, write_tree(tmp_path / "b", COMPILED), None) == Outcome("off")


def test_an_unreadable_bucket_is_off_and_the_boot_goes_on(tmp_path: Path) -> None:
    bucket = FakeBucket()
    builder_fill(tmp_path, bucket)
    bucket.broken = True
    assert restore_compiled(MODEL, KEY, tmp_path / "server", bucket) == Outcome("off")
    assert not has_compiled_artefacts(tmp_path / "server")


def test_a_tampered_archive_is_refused_and_nothing_is_extracted(tmp_path: Path) -> None:
    bucket = FakeBucket()
    builder_fill(tmp_path, bucket)
    name = str(bucket.manifest()["archive"])
    data = bytearray(bucket.objects[name][1])
    data[700] ^= 0xFF  # a byte of a file's contents, same size
    bucket.put(name, bytes(data))
    assert restore_compiled(MODEL, KEY, tmp_path / "server", bucket) == Outcome("refused")
    assert not has_compiled_artefacts(tmp_path / "server") and leftovers(tmp_path / "server") == []


def test_an_archive_of_another_size_than_its_manifest_says_is_refused_unread(tmp_path: Path) -> None:
    bucket = FakeBucket()
    builder_fill(tmp_path, bucket)
    name = str(bucket.manifest()["archive"])
    bucket.put(name, bucket.objects[name][1] + b"\x00" * 512)
    reads_before, stats_before = bucket.reads[name], bucket.stats[name]
    assert restore_compiled(MODEL, KEY, tmp_path / "server", bucket) == Outcome("refused")
    assert (bucket.reads[name], bucket.stats[name]) == (reads_before, stats_before + 1)  # looked at, never read


@pytest.mark.parametrize(
    "manifest",
    [
        pytest.param(None, id="names-another-key"),
        pytest.param(b"[" * 3000, id="deeply-nested"),
        pytest.param(b"{" + b" " * 5000 + b"}", id="oversized"),
        pytest.param(b'{"key": "x"}', id="missing-fields"),
    ],
)
def test_a_bad_manifest_is_refused(tmp_path: Path, manifest: bytes | None) -> None:
    bucket = FakeBucket()
    builder_fill(tmp_path, bucket)
    if manifest is None:  # another entry's good manifest copied under this key
        manifest = bucket.objects[manifest_name(MODEL, KEY)][1]
        bucket.put(manifest_name(MODEL, OTHER_KEY), manifest)
        assert restore_compiled(MODEL, OTHER_KEY, tmp_path / "server", bucket) == Outcome("refused")
    else:
        bucket.put(manifest_name(MODEL, KEY), manifest)
        assert restore_compiled(MODEL, KEY, tmp_path / "server", bucket) == Outcome("refused")
    assert not has_compiled_artefacts(tmp_path / "server")


@pytest.mark.parametrize(
    "hostile",
    [
        pytest.param(member("xla_cache/../../evil"), id="dot-dot"),
        pytest.param(member("../evil"), id="parent"),
        pytest.param(member("{outside}/evil"), id="absolute"),
        pytest.param(member("xla_cache/link", tarfile.SYMTYPE, "{outside}/evil"), id="symlink"),
        pytest.param(member("xla_cache/hard", tarfile.LNKTYPE, "xla_cache/ok"), id="hardlink"),
        pytest.param(member("xla_cache/fifo", tarfile.FIFOTYPE), id="fifo"),
        pytest.param(member("xla_cache/dev", tarfile.CHRTYPE), id="device"),
        pytest.param(member("other_cache/file"), id="not-a-compiled-dir"),
        pytest.param(member("xla_cache"), id="top-as-a-file"),
    ],
)
def test_an_archive_with_anything_but_files_and_dirs_under_the_compiled_dirs_is_refused(
    tmp_path: Path, hostile: tuple[tarfile.TarInfo, bytes]
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    info, data = hostile
    info.name = info.name.format(outside=outside)
    info.linkname = info.linkname.format(outside=outside)
    good_dir = tarfile.TarInfo("xla_cache")
    good_dir.type = tarfile.DIRTYPE
    bucket = FakeBucket()
    publish_raw(bucket, tar_of((good_dir, b""), member("xla_cache/ok"), (info, data)))
    server = tmp_path / "vm" / "vllm"
    assert restore_compiled(MODEL, KEY, server, bucket) == Outcome("refused")
    assert not has_compiled_artefacts(server) and leftovers(server) == []
    assert list(outside.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["outside", "vm"]
    assert [p.name for p in (tmp_path / "vm").iterdir()] == ["vllm"]


def test_local_artefacts_are_kept_and_the_bucket_is_not_read(tmp_path: Path) -> None:
    bucket = FakeBucket()
    builder_fill(tmp_path, bucket)
    bucket.reads.clear()
    bucket.stats.clear()
    server = write_tree(tmp_path / "server", {"xla_cache/mine/executable.bin": b"compiled here"})
    assert restore_compiled(MODEL, KEY, server, bucket) == Outcome("local")
    assert bucket.reads == bucket.stats == Counter() and read_tree(server) == {
        "xla_cache/mine/executable.bin": b"compiled here"
    }


def test_empty_compiled_dirs_are_not_local_and_are_replaced_by_the_entry(tmp_path: Path) -> None:
    bucket = FakeBucket()
    builder_fill(tmp_path, bucket)
    server = tmp_path / "server"
    (server / "xla_cache" / "empty").mkdir(parents=True)
    assert restore_compiled(MODEL, KEY, server, bucket).outcome == "hit"
    assert read_tree(server) == COMPILED and not (server / "xla_cache" / "empty").exists()


def test_a_fill_after_a_refused_manifest_refills_it_and_the_next_restore_is_a_hit(tmp_path: Path) -> None:
    bucket = FakeBucket()
    bucket.put(manifest_name(MODEL, KEY), b"not json at all")
    refused_generation = bucket.objects[manifest_name(MODEL, KEY)][0]
    assert restore_compiled(MODEL, KEY, tmp_path / "server-1", bucket) == Outcome("refused")
    filled = builder_fill(tmp_path, bucket)
    assert filled.outcome == "filled" and bucket.objects[manifest_name(MODEL, KEY)][0] > refused_generation
    assert bucket.manifest()["sha256"] == filled.sha256
    assert restore_compiled(MODEL, KEY, tmp_path / "server-2", bucket).outcome == "hit"
    assert read_tree(tmp_path / "server-2") == COMPILED


def test_a_fill_after_a_tampered_archive_replaces_its_bytes_and_the_next_restore_is_a_hit(tmp_path: Path) -> None:
    bucket = FakeBucket()
    first = builder_fill(tmp_path, bucket, name="builder-1")
    name = archive_name(MODEL, KEY, first.sha256)
    bucket.put(name, b"\xff" * first.bytes)  # same size, other bytes
    assert restore_compiled(MODEL, KEY, tmp_path / "server-1", bucket) == Outcome("refused")
    again = builder_fill(tmp_path, bucket, name="builder-2")
    assert again == first  # filled: the same archive, its bytes written again
    assert hashlib.sha256(bucket.objects[name][1]).hexdigest() == first.sha256
    assert restore_compiled(MODEL, KEY, tmp_path / "server-2", bucket).outcome == "hit"


def test_a_manifest_whose_archive_is_gone_is_refilled(tmp_path: Path) -> None:
    bucket = FakeBucket()
    publish_raw(bucket, tar_of(member("xla_cache/old")))
    del bucket.objects[str(bucket.manifest()["archive"])]  # age-deleted before its manifest
    filled = builder_fill(tmp_path, bucket)
    assert filled.outcome == "filled" and bucket.manifest()["sha256"] == filled.sha256
    assert restore_compiled(MODEL, KEY, tmp_path / "server", bucket).outcome == "hit"


def test_two_builders_filling_at_once_leave_one_entry_that_restores(tmp_path: Path) -> None:
    bucket = FakeBucket()
    trees = {
        "builder-a": COMPILED,
        "builder-b": {**COMPILED, "xla_cache/jit_forward-7f3a/executable.bin": b"other executable bytes"},
    }
    outcomes: dict[str, Outcome] = {}
    start = threading.Barrier(2)

    def build(name: str) -> None:
        start.wait(5)
        outcomes[name] = builder_fill(tmp_path, bucket, trees[name], name)

    threads = [threading.Thread(target=build, args=(name,)) for name in trees]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(outcome.outcome for outcome in outcomes.values()) == ["filled", "present"]
    winner = next(name for name, outcome in outcomes.items() if outcome.outcome == "filled")
    assert all(outcome.sha256 == outcomes[winner].sha256 for outcome in outcomes.values())
    assert [name for name in bucket.objects if name.endswith(".json")] == [manifest_name(MODEL, KEY)]
    assert restore_compiled(MODEL, KEY, tmp_path / "server", bucket).outcome == "hit"
    assert read_tree(tmp_path / "server") == trees[winner]


def test_a_fill_whose_writes_are_denied_reports_denied_and_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = FakeBucket()
    bucket.deny_writes = True
    monkeypatch.setattr(compile_cache_module, "vm_cache", lambda buckets, cross: (bucket, "the us-east5 cache"))
    report = tmp_path / "report"
    argv = ["fill", "--model", MODEL, "--key", KEY, "--cache-dir", str(write_tree(tmp_path / "b", COMPILED))]
    assert main([*argv, "--report", str(report), "--cache", "us-east5=cache-us-east5"]) == 1
    assert report.read_text() == "denied\n" and bucket.objects == {}


def test_the_command_line_round_trip_writes_report_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bucket = FakeBucket()
    monkeypatch.setattr(compile_cache_module, "vm_cache", lambda buckets, cross: (bucket, "the us-east5 cache"))
    report = tmp_path / "report"

    def run(action: str, folder: Path) -> int:
        argv = [action, "--model", MODEL, "--key", KEY, "--cache-dir", str(folder), "--report", str(report)]
        return main([*argv, "--cache", "us-east5=cache-us-east5"])

    assert run("fill", write_tree(tmp_path / "builder", COMPILED)) == 0
    size, digest = report.read_text().strip().split(",")[1:]
    assert report.read_text() == f"filled,{size},{digest}\n" and int(size) > 0 and len(digest) == 64
    assert run("restore", tmp_path / "server") == 0 and report.read_text() == f"hit,{size}\n"
    assert run("restore", tmp_path / "server") == 0 and report.read_text() == "local\n"
    assert run("fill", tmp_path / "nothing-compiled") == 1 and report.read_text() == "empty\n"


@pytest.mark.parametrize(
    "bad",
    [["--key", "not-a-key"], ["--model", "../etc"], ["--cache", "us-east5"], ["--cache", "Nowhere=bucket"]],
)
def test_bad_arguments_exit_2_and_write_no_report(tmp_path: Path, bad: list[str]) -> None:
    argv = {"--model": MODEL, "--key": KEY, "--cache-dir": str(tmp_path / "vllm"), "--report": str(tmp_path / "r")}
    argv.update({bad[0]: bad[1]} if bad[0] != "--cache" else {})
    words = ["restore", *(word for pair in argv.items() for word in pair)]
    assert main([*words, *(bad if bad[0] == "--cache" else [])]) == 2
    assert not (tmp_path / "r").exists()


def test_the_archive_is_the_same_bytes_for_the_same_files(tmp_path: Path) -> None:
    first = write_tree(tmp_path / "a", COMPILED)
    second = write_tree(tmp_path / "b", dict(reversed(COMPILED.items())))  # other creation order
    for path in second.rglob("*"):
        os.utime(path, (1_700_000_000, 1_700_000_000))
        os.chmod(path, 0o700 if path.is_dir() else 0o600)
    (second / "xla_cache" / "link").symlink_to(second / "xla_cache" / "jit_sample-19c2")  # links are left out
    assert pack_compiled(first, tmp_path / "a.tar") == pack_compiled(second, tmp_path / "b.tar") == len(COMPILED)
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()
    with tarfile.open(tmp_path / "a.tar") as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == sorted(m.name for m in members)
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, 0, "", "")}
    assert {m.mode for m in members if m.isdir()} == {0o755} and {m.mode for m in members if m.isreg()} == {0o644}


def test_nothing_compiled_is_empty_and_writes_nothing(tmp_path: Path) -> None:
    bucket = FakeBucket()
    folder = tmp_path / "vllm"
    (folder / "xla_cache" / "sub").mkdir(parents=True)
    assert fill_compiled(MODEL, KEY, folder, bucket) == Outcome("empty") and bucket.objects == {}

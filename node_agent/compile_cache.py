"""Restore vLLM's compiled artefacts from the region's cache bucket before a serving boot; fill them from a builder.

Why: compiling a model for a TPU slice takes many minutes, and every VM of one plan and slice compiles the same
executables. A prewarm builder compiles once and ``fill``s the entry; each serving VM ``restore``s it before vLLM
starts (``python -m node_agent.compile_cache {restore|fill}`` in a short-lived container of the pinned image, the
node-agent bundle on ``PYTHONPATH``). Names, manifest and trust model: ``shared.domain.compile_cache``. Only
builders may write ``compile/``; a reader still checks the archive against its manifest's size and SHA-256 and
extracts only regular files and directories under ``COMPILED_DIRS``, aside first, so a damaged entry is refused
and never half-extracted.

The cache only ever saves time: a restore that cannot read the bucket, or refuses what it read, logs why and exits
0 (vLLM compiles). A fill that wrote nothing exits 1 (``denied``: a builder under the wrong service account). The
report line for the boot stages: ``hit,BYTES`` | ``miss`` | ``refused`` | ``local`` | ``off`` for a restore,
``filled,BYTES,SHA256`` | ``present,BYTES,SHA256`` | ``empty`` | ``denied`` | ``off`` for a fill.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import logging
import os
import platform
import shutil
import stat
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from node_agent.weights_restore import CacheBucket, cache_arguments, vm_cache
from shared.adapters.compile_cache_entry import read_manifest
from shared.domain.compile_cache import (
    COMPILED_DIRS,
    CompileManifest,
    archive_name,
    manifest_name,
)
from shared.domain.errors import CloudError, ErrorClass
from shared.domain.weights_cache import check_repo_id

__all__ = [
    "Outcome",
    "fill_compiled",
    "has_compiled_artefacts",
    "main",
    "pack_compiled",
    "restore_compiled",
]

log = logging.getLogger("tpuctl.compile_cache")
_WORK_PREFIX = ".tpuctl-compile-"
_WRITE_ROUNDS = 3  # conditional writes lost to another writer before a fill gives up
_SHOWN = 200  # characters of an untrusted member name in a log line


class _Refused(Exception):
    """The entry is not what its manifest promises, or not safe to extract (the message says which)."""


class _Denied(Exception):
    """Cloud Storage refused this VM's write (403): its account may not write ``compile/``."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a restore or a fill did: one of ``RESTORE_OUTCOMES`` or ``FILL_OUTCOMES``, the archive's size, digest."""

    outcome: str
    bytes: int = 0
    sha256: str = ""

    def report_line(self) -> str:
        if self.outcome == "hit":
            return f"hit,{self.bytes}"
        if self.outcome in ("filled", "present"):
            return f"{self.outcome},{self.bytes},{self.sha256}"
        return self.outcome


@dataclass(frozen=True, slots=True)
class _Stored:
    """An object as found against the bytes expected: its generation (0: none) and what is wrong ("": nothing)."""

    generation: int
    problem: str


# ---------------------------------------------------------------- restore


def restore_compiled(
    model: str, key: str, cache_dir: Path, cache: CacheBucket | None, why_off: str = "no compile cache configured"
) -> Outcome:
    """``model``'s entry ``key`` unpacked into ``cache_dir``, unless compiled artefacts are there already."""
    if has_compiled_artefacts(cache_dir):
        log.info("compiled artefacts are on this disk already: the compile cache is not read")
        return Outcome("local")
    if cache is None:
        log.info("compile cache off: %s", why_off)
        return Outcome("off")
    try:
        with _work_dir(cache_dir) as work:
            return _restore_entry(model, key, cache_dir, cache, work)
    except _Refused as exc:
        log.warning(
            "refused the compile cache entry %s: %s; vLLM compiles", cache.where(manifest_name(model, key)), exc
        )
        return Outcome("refused")
    except (CloudError, OSError) as exc:
        log.warning("the compile cache is not readable (%s): vLLM compiles", exc)
        return Outcome("off")


def _restore_entry(model: str, key: str, cache_dir: Path, cache: CacheBucket, work: Path) -> Outcome:
    found = read_manifest(cache, model, key, work / "manifest.json")
    if found is None:
        log.info("no compile cache entry %s: vLLM compiles", cache.where(manifest_name(model, key)))
        return Outcome("miss")
    manifest = found[1]
    if isinstance(manifest, str):
        raise _Refused(manifest)
    archive = work / "archive.tar"
    stored = _check_stored(cache, manifest.archive, manifest.bytes, manifest.sha256, archive)
    if stored.problem:
        raise _Refused(f"its archive {cache.where(manifest.archive)} {stored.problem}")
    _extract_into(archive, cache_dir, work / "staging")
    log.info("restored %s (%d bytes) into %s", cache.where(manifest.archive), manifest.bytes, cache_dir)
    return Outcome("hit", manifest.bytes, manifest.sha256)


def _check_stored(cache: CacheBucket, name: str, size: int, sha256: str, path: Path) -> _Stored:
    """Whether ``name`` holds ``size`` bytes with this SHA-256, read (generation-pinned) into ``path``."""
    found = cache.stat(name)
    if found is None:
        return _Stored(0, "is missing")
    stored_size, generation = found
    if stored_size != size:
        return _Stored(generation, f"is {stored_size} bytes, not {size}")
    cache.read_to(name, generation, size, path)
    digest = _sha256_of(path)
    if digest != sha256:
        return _Stored(generation, f"has SHA-256 {digest}, not {sha256}")
    return _Stored(generation, "")


def _extract_into(archive: Path, cache_dir: Path, staging: Path) -> None:
    """The archive's compiled directories into ``cache_dir``: every member checked, extracted aside, then moved."""
    if not hasattr(tarfile, "data_filter"):
        raise _Refused(f"Python {platform.python_version()} has no tarfile data filter: nothing is extracted")
    staging.mkdir()
    try:
        with tarfile.open(archive, mode="r:") as tar:
            members = tar.getmembers()
            for member in members:
                _check_member(member)
            tar.extractall(staging, members=members, filter="data")
    except tarfile.TarError as exc:
        raise _Refused(f"the archive cannot be extracted safely: {str(exc)[:_SHOWN]}") from exc
    _move_into_place(staging, cache_dir)


def _check_member(member: tarfile.TarInfo) -> None:
    """Only ``COMPILED_DIRS`` themselves (directories) and regular files and directories below them."""
    path = PurePosixPath(member.name)
    shown = repr(member.name[:_SHOWN])
    if path.is_absolute() or ".." in path.parts or not path.parts or path.parts[0] not in COMPILED_DIRS:
        raise _Refused(f"the archive holds {shown}, outside {' and '.join(COMPILED_DIRS)}")
    if not (member.isreg() or member.isdir()):
        raise _Refused(f"the archive holds {shown}, neither a regular file nor a directory")
    if len(path.parts) == 1 and not member.isdir():
        raise _Refused(f"the archive holds {shown} as a file, not a directory")


def _move_into_place(staging: Path, cache_dir: Path) -> None:
    """Each unpacked top directory replaces its (artefact-free) namesake; on a failure none stays half-moved."""
    moved: list[Path] = []
    try:
        for name in COMPILED_DIRS:
            unpacked, target = staging / name, cache_dir / name
            if not unpacked.is_dir():
                continue
            if target.is_symlink() or target.is_file():
                target.unlink()
            elif target.is_dir():
                shutil.rmtree(target)
            os.replace(unpacked, target)
            moved.append(target)
    except OSError:
        for target in moved:
            shutil.rmtree(target, ignore_errors=True)
        raise


def has_compiled_artefacts(cache_dir: Path) -> bool:
    """A regular file under one of ``COMPILED_DIRS`` (as the startup script's ``find -type f``; links not followed)."""
    for name in COMPILED_DIRS:
        top = cache_dir / name
        if top.is_symlink():
            continue
        for folder, _dirs, files in os.walk(top):
            if any(stat.S_ISREG(os.lstat(os.path.join(folder, file)).st_mode) for file in files):
                return True
    return False


# ---------------------------------------------------------------- fill


def fill_compiled(
    model: str, key: str, cache_dir: Path, cache: CacheBucket | None, why_off: str = "no compile cache configured"
) -> Outcome:
    """What vLLM compiled under ``cache_dir`` published as ``model``'s entry ``key`` (CloudError: not published)."""
    if cache is None:
        log.warning("compile cache off: %s; nothing is filled", why_off)
        return Outcome("off")
    with _work_dir(cache_dir) as work:
        archive = work / "archive.tar"
        if not pack_compiled(cache_dir, archive):
            log.warning("no compiled artefacts under %s (%s): nothing to fill", cache_dir, ", ".join(COMPILED_DIRS))
            return Outcome("empty")
        digest = _sha256_of(archive)
        entry = CompileManifest(key, archive_name(model, key, digest), digest, archive.stat().st_size)
        try:
            return _publish(cache, model, key, archive, entry, work)
        except _Denied as exc:
            log.error("the compile cache may not be written by this VM (%s): run the fill as a builder", exc)
            return Outcome("denied")


def _publish(cache: CacheBucket, model: str, key: str, archive: Path, entry: CompileManifest, work: Path) -> Outcome:
    """The archive, then the manifest naming it (unless a good entry is there): filled or present."""
    wrote_archive = _ensure_object(cache, entry.archive, archive, entry.sha256, work / "stored.tar")
    found = _publish_manifest(cache, model, key, entry, work)
    if found is None or (wrote_archive and found.archive == entry.archive):
        log.info("filled %s (%d bytes, sha256 %s)", cache.where(entry.archive), entry.bytes, entry.sha256)
        return Outcome("filled", entry.bytes, entry.sha256)
    log.info("a good entry was there already: %s", cache.where(found.archive))
    return Outcome("present", found.bytes, found.sha256)


def _ensure_object(cache: CacheBucket, name: str, source: Path, sha256: str, scratch: Path) -> bool:
    """``name`` holding ``source``'s bytes: True if this VM wrote them, False if they were there already. An object
    of that name with other bytes (damaged) is replaced on its own generation."""
    generation = 0
    for _round in range(_WRITE_ROUNDS):
        if _write(cache, name, source, generation):
            return True
        stored = _check_stored(cache, name, source.stat().st_size, sha256, scratch)
        if not stored.problem:
            return False
        log.warning("%s %s: replacing it", cache.where(name), stored.problem)
        generation = stored.generation
    raise CloudError(ErrorClass.TRANSIENT, f"{cache.where(name)} kept changing while it was written: fill again")


def _publish_manifest(
    cache: CacheBucket, model: str, key: str, entry: CompileManifest, work: Path
) -> CompileManifest | None:
    """``entry``'s manifest written, None; or the good manifest found in its place. A bad one (refused, or its
    archive missing or damaged) is replaced on its own generation: a refill. ``entry``'s archive is known good."""
    name = manifest_name(model, key)
    ours = work / "manifest.json"
    ours.write_text(entry.to_json(), encoding="utf-8")
    generation = 0
    for _round in range(_WRITE_ROUNDS):
        if _write(cache, name, ours, generation):
            return None
        found = read_manifest(cache, model, key, work / "found.json")
        if found is None:
            generation = 0  # gone since (deleted): create it
            continue
        generation, manifest = found
        if isinstance(manifest, str):
            problem = manifest
        elif manifest.archive == entry.archive or not (problem := _archive_problem(cache, manifest, work)):
            return manifest  # names the archive just written or checked, or another good one
        log.warning("refilling %s: %s", cache.where(name), problem)
    raise CloudError(ErrorClass.TRANSIENT, f"{cache.where(name)} kept changing while it was written: fill again")


def _archive_problem(cache: CacheBucket, manifest: CompileManifest, work: Path) -> str:
    stored = _check_stored(cache, manifest.archive, manifest.bytes, manifest.sha256, work / "found.tar")
    return f"its archive {cache.where(manifest.archive)} {stored.problem}" if stored.problem else ""


def _write(cache: CacheBucket, name: str, path: Path, if_generation: int) -> bool:
    """``write_from`` with a 403 raised as ``_Denied``."""
    try:
        return cache.write_from(name, path, if_generation=if_generation)
    except CloudError as exc:
        if exc.code == 403:
            raise _Denied(str(exc)) from exc
        raise


def pack_compiled(cache_dir: Path, archive: Path) -> int:
    """A deterministic tar of the ``COMPILED_DIRS`` under ``cache_dir`` (sorted names, mtime 0, owner 0, fixed
    modes; links and special files left out) into ``archive``; the number of files packed (0: nothing written)."""
    names = _compiled_names(cache_dir)
    files = sum(1 for name in names if not (cache_dir / name).is_dir())
    if not files:
        return 0
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT, encoding="utf-8") as tar:
        for name in names:
            _add(tar, cache_dir / name, name)
    return files


def _compiled_names(cache_dir: Path) -> list[str]:
    """The directories and regular files under ``COMPILED_DIRS``, relative POSIX names, sorted; links not followed."""
    names: list[str] = []
    for top in COMPILED_DIRS:
        if (cache_dir / top).is_symlink() or not (cache_dir / top).is_dir():
            continue
        for folder, _dirs, files in os.walk(cache_dir / top):
            here = Path(folder)
            names.append(here.relative_to(cache_dir).as_posix())
            names += [
                (here / file).relative_to(cache_dir).as_posix()
                for file in files
                if stat.S_ISREG(os.lstat(here / file).st_mode)
            ]
    return sorted(names)


def _add(tar: tarfile.TarFile, path: Path, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    if path.is_dir():
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(info)
        return
    info.type, info.mode = tarfile.REGTYPE, 0o644
    with path.open("rb") as handle:
        info.size = os.fstat(handle.fileno()).st_size
        tar.addfile(info, handle)


# ---------------------------------------------------------------- shared


def _sha256_of(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


@contextlib.contextmanager
def _work_dir(cache_dir: Path) -> Iterator[Path]:
    """A scratch directory inside ``cache_dir`` (one file system, so moves are renames), removed afterwards."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=_WORK_PREFIX, dir=cache_dir))
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _remove_stale_work(cache_dir: Path) -> None:
    """Scratch left by a run that was killed (a preempted VM): one run at a time uses a cache directory."""
    for stale in cache_dir.glob(_WORK_PREFIX + "*") if cache_dir.is_dir() else ():
        shutil.rmtree(stale, ignore_errors=True)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="node_agent.compile_cache", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("restore", "fill"))
    parser.add_argument("--model", required=True, help="Hub model id, ORG/NAME")
    parser.add_argument("--key", required=True, help="the entry's key (shared.domain.compile_cache.compile_key)")
    parser.add_argument("--cache-dir", required=True, type=Path, help="vLLM's cache root (VLLM_CACHE_ROOT)")
    parser.add_argument("--report", required=True, type=Path, help="write the outcome line here")
    parser.add_argument("--cache", action="append", default=[], metavar="REGION=BUCKET", help="a region's cache")
    parser.add_argument("--cross-region", action="store_true", help="may read another region's cache (egress)")
    return parser


def _checked_buckets(model: str, key: str, entries: list[str]) -> dict[str, str]:
    """The ``--cache`` map, after the model and key are checked; ValueError names the bad argument."""
    check_repo_id(model)
    manifest_name(model, key)
    return cache_arguments(entries)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        buckets = _checked_buckets(args.model, args.key, args.cache)
    except ValueError as exc:
        print(f"compile cache: {exc}", file=sys.stderr)
        return 2
    _remove_stale_work(args.cache_dir)
    if args.action == "restore" and has_compiled_artefacts(args.cache_dir):
        cache, why = None, "compiled artefacts are on this disk"  # the bucket is not even opened
    else:
        cache, why = vm_cache(buckets, args.cross_region)
        log.info("compile cache: %s", why)
    if args.action == "restore":
        outcome = restore_compiled(args.model, args.key, args.cache_dir, cache, why)
    else:
        try:
            outcome = fill_compiled(args.model, args.key, args.cache_dir, cache, why)
        except (CloudError, OSError, tarfile.TarError) as exc:
            log.error("compile cache fill failed: %s", exc)
            return 1
    args.report.write_text(outcome.report_line() + "\n", encoding="utf-8")
    print(outcome.report_line())
    return 0 if args.action == "restore" or outcome.outcome in ("filled", "present") else 1


if __name__ == "__main__":
    sys.exit(main())

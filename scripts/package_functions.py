"""Assemble each Cloud Function's deployable folder: ``build/functions/<name>/``.

Cloud Functions deploy a directory and install only its ``requirements.txt``; they never run our
``setup.py`` or see the rest of the repository. So each folder gets the function's ``main.py``
(and any sibling modules), its own ``requirements.txt`` and a copy of ``shared/``, without
tests, caches or bytecode. Terraform zips the folder and names the uploaded object by the zip's
SHA-256, so a changed file redeploys the function and an unchanged tree does not.

The output is deterministic: the folder is rebuilt from scratch, files are copied in sorted order
with fixed permissions (0644) and a fixed modification time, so the same sources always give the
same bytes and the same digest. One JSON line per function is printed::

    {"function": "provision", "path": "build/functions/provision", "files": 42, "sha256": "..."}

Usage: ``python scripts/package_functions.py [--root DIR] [--out DIR] [NAME ...]`` (default: all
functions that have a main.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXED_MTIME = 315532800  # 1980-01-01T00:00:00Z, the earliest time a zip entry can carry
FILE_MODE = 0o644
DIR_MODE = 0o755

_SKIPPED_DIRS = frozenset(
    {"__pycache__", "tests", "test", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".hypothesis", ".git"}
)
_SKIPPED_SUFFIXES = (".pyc", ".pyo", ".orig", ".rej", ".swp")
_SKIPPED_NAMES = frozenset({"conftest.py", ".DS_Store", "requirements.txt"})


@dataclass(frozen=True)
class PackagedFunction:
    """One assembled folder and the digest of its contents."""

    name: str
    path: Path
    files: int
    sha256: str


def is_shipped(relative: Path) -> bool:
    """False for tests, caches, bytecode and editor debris; those never reach a function."""
    if any(part in _SKIPPED_DIRS or part.endswith(".egg-info") for part in relative.parts[:-1]):
        return False
    name = relative.name
    if name in _SKIPPED_NAMES or name.endswith(_SKIPPED_SUFFIXES):
        return False
    return not (name.startswith("test_") and name.endswith(".py")) and not name.endswith("_test.py")


def discover_functions(root: Path) -> list[str]:
    """Function folder names under ``functions/`` that have an entry point."""
    base = root / "functions"
    return sorted(p.parent.name for p in base.glob("*/main.py") if p.is_file())


def _shipped_files(source: Path) -> list[Path]:
    """Files below ``source`` (relative, sorted) that belong in a deployment."""
    found = []
    for dirpath, dirnames, filenames in os.walk(source):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIPPED_DIRS and not d.endswith(".egg-info"))
        for filename in filenames:
            relative = (Path(dirpath) / filename).relative_to(source)
            if is_shipped(relative):
                found.append(relative)
    return sorted(found, key=lambda p: p.as_posix())


def _copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(source.read_bytes())
    os.chmod(target, FILE_MODE)
    os.utime(target, (FIXED_MTIME, FIXED_MTIME))


def tree_digest(folder: Path) -> tuple[int, str]:
    """(file count, SHA-256 over every relative path and content), independent of timestamps."""
    digest = hashlib.sha256()
    count = 0
    for relative in sorted((p.relative_to(folder) for p in folder.rglob("*") if p.is_file()), key=Path.as_posix):
        data = (folder / relative).read_bytes()
        digest.update(relative.as_posix().encode("utf-8") + b"\0")
        digest.update(hashlib.sha256(data).digest())
        count += 1
    return count, digest.hexdigest()


def package_function(root: Path, name: str, out: Path) -> PackagedFunction:
    """Rebuild ``out/<name>`` from ``functions/<name>`` and ``shared/``."""
    function_dir = root / "functions" / name
    main = function_dir / "main.py"
    requirements = function_dir / "requirements.txt"
    if not main.is_file():
        raise SystemExit(f"function {name!r}: {main} is missing (every function needs a main.py entry point)")
    if not requirements.is_file():
        raise SystemExit(
            f"function {name!r}: {requirements} is missing (list the pinned packages it imports, "
            "a subset of the root requirements.txt)"
        )
    shared = root / "shared"
    if not (shared / "__init__.py").is_file():
        raise SystemExit(f"{shared}: not a package (shared/__init__.py is missing)")

    target = out / name
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)

    for relative in _shipped_files(function_dir):
        if relative.name == "__init__.py" and relative.parent == Path("."):
            continue  # the function folder is the deployment root, not a package
        _copy(function_dir / relative, target / relative)
    _copy(requirements, target / "requirements.txt")
    for relative in _shipped_files(shared):
        _copy(shared / relative, target / "shared" / relative)

    for directory in sorted((p for p in target.rglob("*") if p.is_dir()), reverse=True):
        os.chmod(directory, DIR_MODE)
        os.utime(directory, (FIXED_MTIME, FIXED_MTIME))
    files, sha256 = tree_digest(target)
    return PackagedFunction(name=name, path=target, files=files, sha256=sha256)


def package_all(root: Path, out: Path, names: Iterable[str] = ()) -> list[PackagedFunction]:
    """Package the named functions, or every function with a main.py."""
    available = discover_functions(root)
    wanted = list(names) or available
    unknown = sorted(set(wanted) - set(available))
    if unknown:
        raise SystemExit(
            f"unknown function(s) {', '.join(unknown)}: choose from {', '.join(available) or '(none found)'} "
            f"(folders under {root / 'functions'} with a main.py)"
        )
    if not wanted:
        raise SystemExit(f"no functions to package: {root / 'functions'} has no <name>/main.py")
    return [package_function(root, name, out) for name in wanted]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Assemble build/functions/<name>/ for each Cloud Function.")
    parser.add_argument("names", nargs="*", help="functions to package (default: all)")
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help="repository root (default: this checkout)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: ROOT/build/functions)")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    out = (args.out or root / "build" / "functions").resolve()
    for packaged in package_all(root, out, args.names):
        line = {
            "function": packaged.name,
            "path": str(packaged.path),
            "files": packaged.files,
            "sha256": packaged.sha256,
        }
        sys.stdout.write(json.dumps(line) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

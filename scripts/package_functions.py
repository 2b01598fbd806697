"""Assemble each Cloud Function's deployable folder: ``build/functions/<name>/``.

Cloud Functions deploy a directory and install only its ``requirements.txt``; they never run our
``setup.py`` or see the rest of the repository. So each folder gets the function's ``main.py``, its
own ``requirements.txt`` and the project modules ``main.py`` can import: its import closure within
``shared/`` (and any sibling modules of ``main.py``), plus the ``__init__.py`` of every package on the
way. The closure is found from the source, not by running it: every ``import`` and ``from ... import``
is followed wherever it appears, inside functions included (``shared/wiring.py`` builds its adapters
with imports inside methods), except under ``if TYPE_CHECKING:``. What no function imports (the VM's
node agent in ``node_agent/``, the load generator in ``loadgen/``) stays out, and so do tests, caches and bytecode. A
dynamic import by a computed name (``importlib.import_module(name)``, ``__import__(name)``) cannot be
followed, so it stops the packaging with an error naming the line; none exists in ``shared/`` today,
and one with a literal name is followed like an import statement. Only modules ship: no module of the
closure reads data files next to itself.

Terraform zips the folder and names the uploaded object by the zip's SHA-256, so a changed file
redeploys the function and an unchanged tree does not.

The output is deterministic: the folder is rebuilt from scratch, files are copied in sorted order
with fixed permissions (0644) and a fixed modification time, so the same sources always give the
same bytes and the same digest. One JSON line per function is printed::

    {"function": "provision", "path": "build/functions/provision", "files": 42, "sha256": "..."}

Usage: ``python scripts/package_functions.py [--root DIR] [--out DIR] [NAME ...]`` (default: all
functions that have a main.py).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Iterable, Iterator, Sequence
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

# The repository packages a function may ship, found under the repository root. Every other top-level
# package of the repository (localcloud, tests, mcp_client_gateway, ...) never reaches a function, so
# an import of one from the closure is an error rather than a module silently left out.
SHIPPED_PACKAGES = ("shared",)
_DYNAMIC_IMPORTERS = frozenset({"import_module", "__import__"})
_NOT_OURS = frozenset({"__future__", *sys.stdlib_module_names})


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


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _dynamic_import(node: ast.Call, path: Path) -> str | None:
    """The module a literal ``importlib.import_module("x")`` / ``__import__("x")`` names; refuse any other."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if name not in _DYNAMIC_IMPORTERS:
        return None
    first = node.args[0] if node.args else None
    if isinstance(first, ast.Constant) and isinstance(first.value, str) and not first.value.startswith("."):
        return first.value
    raise SystemExit(
        f"{path}:{node.lineno}: {name}() with a computed module name; packaging follows imports from the "
        "source and cannot tell which module this loads (use an import statement, or a literal absolute name)"
    )


def _imported_names(tree: ast.AST, module: str, is_package: bool, path: Path) -> Iterator[str]:
    """Every dotted name ``module`` imports, anywhere but under ``if TYPE_CHECKING:``.

    ``from a import b`` yields ``a`` and ``a.b`` (``b`` may be a submodule); the caller keeps the names that
    are files.
    """
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)  # the body never runs; ``else:`` does
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                if node.level - 1 >= len(package):
                    raise SystemExit(f"{path}:{node.lineno}: relative import beyond the top-level package")
                anchor = package[: len(package) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
        elif isinstance(node, ast.Call):
            dynamic = _dynamic_import(node, path)
            if dynamic is not None:
                yield dynamic
        stack.extend(ast.iter_child_nodes(node))


def _module_source(base: Path, dotted: str) -> Path | None:
    """The file that defines ``dotted`` below ``base`` (a package's ``__init__.py``), or None."""
    stem = base.joinpath(*dotted.split("."))
    if (stem / "__init__.py").is_file():
        return stem / "__init__.py"
    if stem.with_suffix(".py").is_file():
        return stem.with_suffix(".py")
    return None


def import_closure_files(root: Path, function_dir: Path) -> dict[Path, Path]:
    """The files ``function_dir/main.py`` needs: bundle-relative path -> source, ``main.py`` included.

    ``shared.*`` resolves under ``root``; any other name resolves next to ``main.py`` first (a sibling
    module) and is otherwise a third-party or standard module, which ``requirements.txt`` and the runtime
    provide. Each module brings its parent packages' ``__init__.py`` (importing ``shared.a.b`` runs
    ``shared/__init__.py`` and ``shared/a/__init__.py`` first), whose imports are followed too.
    """
    unshippable = {p.name for p in root.iterdir() if (p / "__init__.py").is_file() and p.name not in SHIPPED_PACKAGES}
    files: dict[Path, Path] = {}
    seen: set[str] = set()
    pending: list[tuple[str, str]] = [("main", "main.py")]
    while pending:
        dotted, importer = pending.pop()
        if dotted in seen:
            continue
        seen.add(dotted)
        top = dotted.split(".", 1)[0]
        base = root if top in SHIPPED_PACKAGES else function_dir
        source = _module_source(base, dotted)
        if source is None:
            if top in unshippable and _module_source(root, dotted) is not None:
                raise SystemExit(
                    f"{importer} imports {dotted}, but only {', '.join(SHIPPED_PACKAGES)} and the function's own "
                    f"modules reach a Cloud Function ({top}/ is never packaged)"
                )
            continue  # a name defined in a module (not a module itself), or a module from outside the project
        relative = source.relative_to(base)
        if dotted != "main" and not is_shipped(relative):
            raise SystemExit(f"{importer} imports {dotted} ({relative}), which is never packaged (tests, caches)")
        files[relative] = source
        if "." in dotted:
            pending.append((dotted.rsplit(".", 1)[0], dotted))
        tree = ast.parse(source.read_bytes(), filename=str(source))
        pending.extend(
            (name, relative.as_posix())
            for name in _imported_names(tree, dotted, source.name == "__init__.py", source)
            if name and name.split(".", 1)[0] not in _NOT_OURS
        )
    return dict(sorted(files.items(), key=lambda item: item[0].as_posix()))


def package_function(root: Path, name: str, out: Path) -> PackagedFunction:
    """Rebuild ``out/<name>``: ``main.py``, ``requirements.txt`` and the modules of its import closure."""
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

    for relative, source in import_closure_files(root, function_dir).items():
        _copy(source, target / relative)
    _copy(requirements, target / "requirements.txt")

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

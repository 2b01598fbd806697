"""The packaged function folders: deterministic, free of tests and caches, and importable on their own.

Each folder holds ``main.py``, ``requirements.txt`` and exactly the project modules of ``main``'s import
closure; the packaging script finds that closure with its own scanner, and a test here checks it against
``tests/support/python_imports.py`` run on the sources, then loads every shipped module from the bundle alone.

A Cloud Function gets only its folder and installs only its ``requirements.txt``. The last test here
does what the platform does: a venv with nothing but that file, then ``import main`` and every
project module ``main`` can reach (lazy imports included). The venv is cached by the hash of the
requirements (``tests/support/cached_venv.py``), so only the first run pays for pip.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cached_venv import ensure_venv, venv_bin
from tests.support.python_imports import import_closure

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "scripts" / "package_functions.py"
FUNCTIONS = ("provision", "monitor", "benchmark")
ENTRY_POINTS = {"provision": "provision", "monitor": "monitor", "benchmark": "benchmark"}

# Which import names each pinnable distribution provides (the root requirements.txt). google-api-core
# also brings the packages its own requirements install (protobuf, googleapis-common-protos, requests),
# which the root file does not pin separately.
DISTRIBUTION_MODULES: dict[str, tuple[str, ...]] = {
    "functions-framework": ("functions_framework",),
    "flask": ("flask",),
    "google-cloud-tpu": ("google.cloud.tpu",),
    "google-cloud-pubsub": ("google.cloud.pubsub",),
    "google-cloud-firestore": ("google.cloud.firestore",),
    "google-cloud-scheduler": ("google.cloud.scheduler",),
    "google-cloud-secret-manager": ("google.cloud.secretmanager",),
    "google-cloud-compute": ("google.cloud.compute",),
    "google-cloud-billing": ("google.cloud.billing",),
    "google-cloud-logging": ("google.cloud.logging",),
    "google-cloud-monitoring": ("google.cloud.monitoring_v3",),
    "grpcio": ("grpc",),
    "opentelemetry-api": ("opentelemetry.trace", "opentelemetry.context", "opentelemetry.propagate"),
    "opentelemetry-sdk": ("opentelemetry.sdk",),
    "opentelemetry-exporter-gcp-trace": ("opentelemetry.exporter.cloud_trace",),
    "google-api-core": ("google.api_core", "google.protobuf", "google.longrunning", "google.rpc", "requests"),
    "google-auth": ("google.auth", "google.oauth2"),
    "httpx": ("httpx",),
    "mcp": ("mcp",),
    "pydantic": ("pydantic",),
    "pydantic-settings": ("pydantic_settings",),
    "prometheus-client": ("prometheus_client",),
    "pyyaml": ("yaml",),
    "rich": ("rich",),
    "sniffio": ("sniffio",),
}
_NAMESPACES = {"google", "google.cloud", "opentelemetry"}


def _package(out: Path, *names: str, root: Path = REPO_ROOT) -> list[dict[str, object]]:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(root), "--out", str(out), *names],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        assert match, f"{path}: {line!r} is not pinned as name==version"
        pins[match.group(1).lower()] = match.group(2)
    return pins


def _provides(distribution: str, module: str) -> bool:
    return any(
        module == prefix or module.startswith((prefix + ".", prefix + "_"))
        for prefix in DISTRIBUTION_MODULES[distribution]
    )


def _make_root(root: Path) -> None:
    """A tiny repository: one function, a shared package, and everything that must not ship."""
    (root / "functions" / "hello").mkdir(parents=True)
    (root / "functions" / "hello" / "__init__.py").write_text("")
    (root / "functions" / "hello" / "main.py").write_text("from shared import greeting\n")
    (root / "functions" / "hello" / "requirements.txt").write_text("pydantic==2.14.4\n")
    (root / "functions" / "hello" / "test_main.py").write_text("def test_x():\n    pass\n")
    (root / "shared" / "tests").mkdir(parents=True)
    (root / "shared" / "__pycache__").mkdir()
    (root / "shared" / "__init__.py").write_text("")
    (root / "shared" / "greeting.py").write_text("WORD = 'hi'\n")
    (root / "shared" / "__pycache__" / "greeting.cpython-311.pyc").write_bytes(b"\0")
    (root / "shared" / "tests" / "test_greeting.py").write_text("")
    (root / "shared" / "conftest.py").write_text("")


def _write(root: Path, relative: str, text: str) -> None:
    (root / relative).parent.mkdir(parents=True, exist_ok=True)
    (root / relative).write_text(text)


def _files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def _run_script(root: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(root), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


class TestPackageScript:
    def test_a_function_folder_holds_main_requirements_and_shared_and_nothing_else(self, tmp_path: Path) -> None:
        root = tmp_path / "repo"
        _make_root(root)
        [packaged] = _package(tmp_path / "out", root=root)
        folder = Path(str(packaged["path"]))
        files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
        assert files == ["main.py", "requirements.txt", "shared/__init__.py", "shared/greeting.py"]
        assert packaged["function"] == "hello" and packaged["files"] == 4
        assert {oct(p.stat().st_mode & 0o777) for p in folder.rglob("*") if p.is_file()} == {"0o644"}

    def test_only_the_import_closure_ships_lazy_and_literal_dynamic_imports_included(self, tmp_path: Path) -> None:
        root = tmp_path / "repo"
        _make_root(root)
        _write(
            root,
            "shared/greeting.py",
            "from typing import TYPE_CHECKING\n"
            "import importlib\n"
            "if TYPE_CHECKING:\n    from shared import typing_only\n"
            "else:\n    from shared import at_run_time\n"
            "def later():\n    from shared.lazy.deep import VALUE\n    return VALUE\n"
            "PLUGIN = importlib.import_module('shared.plugin')\n",
        )
        for module in ("typing_only", "at_run_time", "plugin", "unused", "lazy/deep", "lazy/unused"):
            _write(root, f"shared/{module}.py", "VALUE = 1\n")
        _write(root, "shared/lazy/__init__.py", "from . import helper\n")
        _write(root, "shared/lazy/helper.py", "")
        _write(root, "localcloud/__init__.py", "")
        [packaged] = _package(tmp_path / "out", root=root)
        assert _files(Path(str(packaged["path"]))) == [
            "main.py",
            "requirements.txt",
            "shared/__init__.py",
            "shared/at_run_time.py",
            "shared/greeting.py",
            "shared/lazy/__init__.py",
            "shared/lazy/deep.py",
            "shared/lazy/helper.py",
            "shared/plugin.py",
        ]

    def test_imports_packaging_cannot_follow_or_ship_are_refused(self, tmp_path: Path) -> None:
        root = tmp_path / "repo"
        _make_root(root)
        _write(root, "shared/greeting.py", "import importlib\nNAME = 'shared.x'\nX = importlib.import_module(NAME)\n")
        result = _run_script(root, tmp_path / "o")
        assert result.returncode != 0 and "greeting.py:3: import_module() with a computed module name" in result.stderr
        _write(root, "shared/greeting.py", "def later():\n    from localcloud.sim import run\n")
        _write(root, "localcloud/__init__.py", "")
        _write(root, "localcloud/sim.py", "")
        result = _run_script(root, tmp_path / "o")
        assert (
            result.returncode != 0 and "imports localcloud.sim" in result.stderr and "never packaged" in result.stderr
        )
        _write(root, "shared/greeting.py", "from shared.tests import helpers\n")
        _write(root, "shared/tests/__init__.py", "")
        _write(root, "shared/tests/helpers.py", "")
        result = _run_script(root, tmp_path / "o")
        assert result.returncode != 0 and "imports shared.tests" in result.stderr and "never packaged" in result.stderr

    def test_the_same_sources_give_the_same_digest_and_a_change_gives_another(self, tmp_path: Path) -> None:
        root = tmp_path / "repo"
        _make_root(root)
        first = _package(tmp_path / "a", root=root)[0]
        second = _package(tmp_path / "b", root=root)[0]
        assert first["sha256"] == second["sha256"]
        (root / "shared" / "greeting.py").write_text("WORD = 'hello'\n")
        third = _package(tmp_path / "a", root=root)[0]
        assert third["sha256"] != first["sha256"]
        (root / "shared" / "__pycache__" / "other.pyc").write_bytes(b"\1")
        assert _package(tmp_path / "a", root=root)[0]["sha256"] == third["sha256"], "caches never change the digest"

    def test_a_rebuild_removes_files_that_no_longer_exist(self, tmp_path: Path) -> None:
        root = tmp_path / "repo"
        _make_root(root)
        (root / "shared" / "old.py").write_text("")
        (root / "functions" / "hello" / "main.py").write_text("from shared import greeting, old\n")
        _package(tmp_path / "out", root=root)
        assert (tmp_path / "out" / "hello" / "shared" / "old.py").is_file()
        (root / "shared" / "old.py").unlink()
        (root / "functions" / "hello" / "main.py").write_text("from shared import greeting\n")
        _package(tmp_path / "out", root=root)
        assert not (tmp_path / "out" / "hello" / "shared" / "old.py").exists()

    def test_an_unknown_function_name_is_refused_with_the_choices(self, tmp_path: Path) -> None:
        root = tmp_path / "repo"
        _make_root(root)
        result = subprocess.run(
            [sys.executable, str(SCRIPT), "--root", str(root), "--out", str(tmp_path / "o"), "nope"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode != 0 and "unknown function(s) nope: choose from hello" in result.stderr

    def test_the_repository_functions_package_deterministically(self, tmp_path: Path) -> None:
        first = {p["function"]: p for p in _package(tmp_path / "a")}
        second = {p["function"]: p for p in _package(tmp_path / "b")}
        assert set(first) == set(FUNCTIONS)
        for name in FUNCTIONS:
            folder = tmp_path / "a" / name
            assert (folder / "main.py").is_file() and (folder / "shared" / "__init__.py").is_file()
            assert not list(folder.rglob("__pycache__")) and not list(folder.rglob("test_*.py"))
            assert not (folder / "localcloud").exists() and not (folder / "tests").exists()
            assert first[name]["sha256"] == second[name]["sha256"], name


def _closure_files(folder: Path) -> set[str]:
    """The .py files (relative to ``folder``) of the project modules ``folder/main.py`` reaches."""
    files = set()
    for module in import_closure(folder).project_modules:
        stem = Path(*module.split("."))
        files.add((stem / "__init__.py").as_posix() if (folder / stem).is_dir() else f"{stem.as_posix()}.py")
    return files


@pytest.mark.parametrize("name", FUNCTIONS)
def test_each_bundle_holds_exactly_the_import_closure_of_its_main(name: str, tmp_path: Path) -> None:
    """The script's own scanner against tests/support/python_imports.py, run on the sources (main.py next to
    the whole of shared/), so a module the bundle lacks shows up here instead of being invisible in it."""
    _package(tmp_path / "build", name)
    folder = tmp_path / "build" / name
    sources = tmp_path / "sources"
    sources.mkdir()
    (sources / "main.py").write_bytes((REPO_ROOT / "functions" / name / "main.py").read_bytes())
    (sources / "shared").symlink_to(REPO_ROOT / "shared", target_is_directory=True)
    expected = _closure_files(sources)
    shipped = {p.relative_to(folder).as_posix() for p in folder.rglob("*.py")}
    assert shipped == expected, (
        f"{name}: shipped but not imported {sorted(shipped - expected)}; imported but not shipped "
        f"{sorted(expected - shipped)}"
    )
    assert set(_files(folder)) == shipped | {"requirements.txt"}
    assert "shared/wiring.py" in shipped and "shared/adapters/firestore_store.py" in shipped, "lazy imports ship"
    assert not {"node_agent/agent.py", "tests/support/stub_server.py"} & shipped, "the VM's code stays out"
    assert len(shipped) < sum(1 for _ in (REPO_ROOT / "shared").rglob("*.py")), "not the whole of shared/"


# Runs with -I (no cwd, no PYTHONPATH) in this project's venv. Its editable install would serve ``shared`` from
# the checkout, so its finder is dropped and every project module loaded must come from the bundle.
_BUNDLE_CHECK = """
import importlib, json, os, sys
bundle = os.path.realpath(sys.argv[1])
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
sys.path.insert(0, bundle)
failures = {}
for module in sys.argv[3:]:
    try:
        importlib.import_module(module)
    except Exception as exc:
        failures[module] = f"{type(exc).__name__}: {exc}"
ours = {
    name: getattr(module, "__file__", None)
    for name, module in sys.modules.items()
    if name in ("main", "shared") or name.startswith("shared.")
}
print(json.dumps({
    "failures": failures,
    "loaded": sorted(ours),
    "outside": {n: f for n, f in ours.items() if not f or not os.path.realpath(f).startswith(bundle + os.sep)},
    "entry_is_callable": callable(getattr(sys.modules.get("main"), sys.argv[2], None)),
}))
"""


@pytest.mark.parametrize("name", FUNCTIONS)
def test_every_shipped_module_loads_from_the_bundle_alone(name: str, tmp_path: Path) -> None:
    _package(tmp_path / "build", name)
    folder = tmp_path / "build" / name
    shipped = sorted(
        ".".join(p.relative_to(folder).with_suffix("").parts).removesuffix(".__init__") for p in folder.rglob("*.py")
    )
    modules = sorted(shipped, key=lambda m: (m != "main", m))
    environment = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "TPUCTL_BACKEND": "gcp",
        "TPUCTL_PROJECT": "tpuctl-import-check",
        "TPUCTL_DATA_DIR": str(tmp_path / "var"),
    }
    result = subprocess.run(
        [sys.executable, "-I", "-c", _BUNDLE_CHECK, str(folder), ENTRY_POINTS[name], *modules],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["failures"] == {}, f"{name}: shipped modules that fail to import from the bundle"
    assert report["outside"] == {}, f"{name}: project modules loaded from outside the bundle"
    assert report["loaded"] == sorted(shipped), f"{name}: importing the bundle loads exactly what it ships"
    assert report["entry_is_callable"], f"{name}: main.{ENTRY_POINTS[name]} is missing"


@pytest.mark.parametrize("name", FUNCTIONS)
def test_function_requirements_are_pinned_subsets_of_the_root_requirements(name: str) -> None:
    root_pins = _pins(REPO_ROOT / "requirements.txt")
    pins = _pins(REPO_ROOT / "functions" / name / "requirements.txt")
    assert pins, f"functions/{name}/requirements.txt is empty"
    for distribution, version in pins.items():
        assert root_pins.get(distribution) == version, (
            f"functions/{name}/requirements.txt pins {distribution}=={version}; "
            f"the root requirements.txt has {root_pins.get(distribution, 'nothing')} (keep them equal)"
        )


@pytest.mark.parametrize("name", FUNCTIONS)
def test_function_requirements_cover_every_import_and_pin_nothing_unused(name: str, tmp_path: Path) -> None:
    _package(tmp_path, name)
    closure = import_closure(tmp_path / name)
    pins = _pins(REPO_ROOT / "functions" / name / "requirements.txt")
    unknown = sorted(set(pins) - set(DISTRIBUTION_MODULES))
    assert not unknown, f"add {unknown} to DISTRIBUTION_MODULES (which import names they provide)"
    imported = sorted(m for m in closure.external_modules if m not in _NAMESPACES)
    uncovered = [m for m in imported if not any(_provides(d, m) for d in pins)]
    assert not uncovered, f"functions/{name} imports {uncovered}, but its requirements.txt pins none of them"
    unused = [d for d in pins if not any(_provides(d, m) for m in imported)]
    assert not unused, f"functions/{name}/requirements.txt pins {unused}, which {name} never imports"


_IMPORT_CHECK = """
import importlib, json, sys
failures = {}
for module in sys.argv[2:]:
    try:
        importlib.import_module(module)
    except Exception as exc:
        failures[module] = f"{type(exc).__name__}: {exc}"
from functions_framework import _function_registry
main = sys.modules.get("main")
entry = sys.argv[1]
print(json.dumps({
    "failures": failures,
    "entry_is_callable": callable(getattr(main, entry, None)),
    "signature": _function_registry.REGISTRY_MAP.get(entry),
}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("name", FUNCTIONS)
def test_each_packaged_function_imports_in_a_clean_venv_from_its_own_requirements(name: str, tmp_path: Path) -> None:
    _package(tmp_path / "build", name)
    folder = tmp_path / "build" / name
    venv = ensure_venv("fn", folder / "requirements.txt")
    modules = sorted(import_closure(folder).project_modules, key=lambda m: (m != "main", m))
    environment = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "TPUCTL_BACKEND": "gcp",
        "TPUCTL_PROJECT": "tpuctl-import-check",
        "TPUCTL_DATA_DIR": str(tmp_path / "var"),
    }
    result = subprocess.run(
        [str(venv_bin(venv, "python")), "-c", _IMPORT_CHECK, ENTRY_POINTS[name], *modules],
        cwd=folder,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["failures"] == {}, f"{name}: modules that fail to import from its requirements.txt alone"
    assert report["entry_is_callable"], f"{name}: main.{ENTRY_POINTS[name]} is missing"
    assert report["signature"] == "cloudevent", f"{name}: main.{ENTRY_POINTS[name]} must be a cloud_event function"
    assert len(modules) > 3, f"{name}: the closure found only {modules}; the scanner is broken"

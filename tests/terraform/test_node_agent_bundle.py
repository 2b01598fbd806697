"""The node-agent bundle (scripts/package_node_agent.py): our wheel builds offline, installs and imports on its own,
the bundle is the same bytes every time, and its requirements cover what the agent imports at run time.

The third-party download needs an index, so it is not run here; what it is fed (the requirements file) is checked
against a run-time import trace of the agent, and the rest of the pipeline runs on our wheel alone.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from shared.domain.startup_script import NODE_AGENT_DISTRIBUTION

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "scripts" / "package_node_agent.py"
REQUIREMENTS = REPO_ROOT / "scripts" / "node_agent_requirements.txt"
WHEEL = "tpuctl_node_agent-0.1.0-py3-none-any.whl"

# Imported when present and tolerated when absent (httpx's command-line extras), so the bundle need not carry them.
OPTIONAL_MODULES = {"click", "pygments", "rich"}
# Shipped for their executables, never imported (node_agent.forensics runs py-spy): pinned in requirements-dev.txt,
# since the controller's runtime set does not need them.
EXECUTABLE_DISTRIBUTIONS = {"py-spy"}
# The agent's alone (node_agent.tpu_telemetry: tpu-info's gRPC stubs and what they need that the root set does not
# pin): pinned in requirements-dev.txt, where the tests and the VM twin get them. grpcio is in the root set.
AGENT_ONLY_DISTRIBUTIONS = {"tpu-info", "protobuf", "immutabledict", "packaging"}


def _step(*args: str, root: Path = REPO_ROOT) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(root), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _bundle(tmp: Path, root: Path = REPO_ROOT) -> tuple[Path, str]:
    _step("wheel", "--out", str(tmp / "wheels"), root=root)
    result = _step("bundle", "--wheels", str(tmp / "wheels"), "--out", str(tmp / "bundle.tar.gz"), root=root)
    return tmp / "bundle.tar.gz", str(result["sha256"])


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            name, _, version = line.partition("==")
            assert version, f"{path.name}: {line!r} is not pinned as name==version"
            pins[name.lower()] = version
    return pins


def test_our_wheel_holds_the_agent_the_load_generator_and_shared_and_the_pinned_requirements(tmp_path: Path) -> None:
    wheel = Path(str(_step("wheel", "--out", str(tmp_path))["wheel"]))
    assert wheel.name == WHEEL
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read("tpuctl_node_agent-0.1.0.dist-info/METADATA").decode()
        record = archive.read("tpuctl_node_agent-0.1.0.dist-info/RECORD").decode()
    assert {"node_agent/agent.py", "loadgen/generator.py", "shared/__init__.py"} <= set(names)
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc") or "/tests/" in n]
    assert {n.split("/", 1)[0] for n in names} == {
        "node_agent",
        "loadgen",
        "shared",
        "tpuctl_node_agent-0.1.0.dist-info",
    }
    assert f"Name: {NODE_AGENT_DISTRIBUTION}\n" in metadata
    required = re.findall(r"^Requires-Dist: (\S+)$", metadata, re.MULTILINE)
    assert {r.partition("==")[0]: r.partition("==")[2] for r in required} == _pins(REQUIREMENTS)
    assert set(names) == {line.split(",", 1)[0] for line in record.splitlines()}, "RECORD lists every file"


def test_our_wheel_installs_offline_and_the_agent_imports_from_the_install(tmp_path: Path) -> None:
    wheel = _step("wheel", "--out", str(tmp_path / "wheels"))["wheel"]
    target = tmp_path / "lib"
    install = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--target", str(target)]
    done = subprocess.run([*install, str(wheel)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    probe = "import node_agent.agent as agent; print(agent.__file__)"
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(target), "HOME": str(tmp_path)}
    ran = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == str(target / "node_agent" / "agent.py"), "imported from the install"


def test_the_bundle_is_a_wheelhouse_with_no_times_or_owners_and_the_same_bytes_every_build(tmp_path: Path) -> None:
    first, first_sha = _bundle(tmp_path / "a")
    second, second_sha = _bundle(tmp_path / "b")
    assert first_sha == second_sha and first.read_bytes() == second.read_bytes()
    with tarfile.open(first) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == [f"wheelhouse/{WHEEL}"]
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) for m in members} == {(315532800, 0, 0, "", "", 0o644)}


def test_a_changed_source_gives_another_digest(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    for package in ("node_agent", "loadgen", "shared"):
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text("")
    (root / "pyproject.toml").write_text('[project]\nname = "tpuctl"\nversion = "9.9.9"\n')
    (root / "shared" / "agent.py").write_text("A = 1\n")
    _, before = _bundle(tmp_path / "a", root=root)
    (root / "shared" / "agent.py").write_text("A = 2\n")
    _, after = _bundle(tmp_path / "b", root=root)
    assert before != after


def test_the_bundle_refuses_wheels_without_ours_and_a_name_with_two_contents(tmp_path: Path) -> None:
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    (tmp_path / "one" / "pkg-1.0-py3-none-any.whl").write_bytes(b"a")
    (tmp_path / "two" / "pkg-1.0-py3-none-any.whl").write_bytes(b"b")
    for folders, message in (
        (["one"], f"no {NODE_AGENT_DISTRIBUTION} wheel"),
        (["one", "two"], "pkg-1.0-py3-none-any.whl appears twice with different contents"),
    ):
        args = [arg for folder in folders for arg in ("--wheels", str(tmp_path / folder))]
        done = subprocess.run(
            [sys.executable, str(SCRIPT), "bundle", *args, "--out", str(tmp_path / "b.tar.gz")],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode != 0 and message in done.stderr


def test_the_template_installs_the_distribution_the_packager_builds() -> None:
    tree = ast.parse(SCRIPT.read_text(encoding="utf-8"))
    assigned = {
        node.targets[0].id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Constant)
    }
    assert assigned["DISTRIBUTION"] == NODE_AGENT_DISTRIBUTION


def test_the_requirements_are_pinned_as_in_the_root_requirements() -> None:
    dev = _pins(REPO_ROOT / "requirements-dev.txt")
    from_dev = EXECUTABLE_DISTRIBUTIONS | AGENT_ONLY_DISTRIBUTIONS
    root = {**_pins(REPO_ROOT / "requirements.txt"), **{name: dev[name] for name in from_dev}}
    for name, version in _pins(REQUIREMENTS).items():
        assert root.get(name) == version, (
            f"node_agent_requirements.txt pins {name}=={version}, root has {root.get(name)}"
        )


_TRACE = """
import importlib.metadata as md, json, os, sys
before = set(sys.modules)
os.environ.update(TPUCTL_BACKEND="gcp", TPUCTL_PROJECT="tpuctl-trace", TPUCTL_DEPLOYMENT_ID="trace")
import node_agent.agent as agent
from shared.adapters.docker_engine import DockerEngineContainer
from loadgen.datasets import find_tokenizer_file
from shared.config import get_settings
from shared.logging import configure_logging, register_secret
from shared.wiring import Runtime
runtime = Runtime(get_settings())
runtime.clock, runtime.bus  # what main() builds before it serves
runtime.log_sink("trace", "tpuctl-vllm")  # Cloud Logging as the VM: google-auth's compute-engine credentials
import node_agent.log_shipper  # the shipping thread's own module
import opentelemetry.exporter.cloud_trace  # TPUCTL_TRACE_EXPORT=cloud-trace, as the startup script may set it
agent.NodeAgentSettings()
owners = {}
for dist in md.distributions():
    for path in dist.files or ():
        owners[str(path.locate())] = dist.metadata["Name"].lower()
loaded = {}
for name in set(sys.modules) - before:
    origin = getattr(sys.modules[name], "__file__", None)
    if origin in owners:
        loaded.setdefault(owners[origin], name)
print(json.dumps(loaded))
"""


def _closure(names: set[str]) -> set[str]:
    """Distributions ``names`` install, following installed metadata (extras and other platforms left out)."""
    from importlib import metadata

    from packaging.requirements import Requirement

    seen: set[str] = set()
    pending = [n.lower() for n in names]
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        for text in metadata.distribution(name).requires or ():
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                pending.append(requirement.name.lower())
    return {re.sub(r"[-_.]+", "-", name) for name in seen}


def test_the_requirements_cover_every_distribution_the_agent_imports_at_run_time(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path), "TPUCTL_DATA_DIR": str(tmp_path / "var")}
    done = subprocess.run(
        [sys.executable, "-c", _TRACE], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    loaded: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    assert "google-cloud-pubsub" in loaded and "httpx" in loaded, f"the trace saw too little: {sorted(loaded)}"
    shipped = _closure(set(_pins(REQUIREMENTS))) | {"tpuctl"}
    missing = {
        dist: module
        for dist, module in loaded.items()
        if re.sub(r"[-_.]+", "-", dist) not in shipped and module.split(".")[0] not in OPTIONAL_MODULES
    }
    assert not missing, f"the agent imports {missing}; pin their distributions in {REQUIREMENTS.name}"


def test_a_download_without_a_platform_is_refused_before_any_network_use(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "download", "--python-version", "3.12", "--dest", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0 and "give at least one --platform" in done.stderr
    assert list(tmp_path.iterdir()) == []

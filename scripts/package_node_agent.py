"""Build the node-agent bundle: ``build/node-agent/tpuctl-node-agent-<version>.tar.gz``, a wheelhouse for TPU VMs.

Why: the node agent (``python -m node_agent.agent``) runs on the TPU VM from the pinned vLLM image's Python,
and a VM must not depend on PyPI at boot. So everything it installs travels in one file: Terraform uploads it under
``node-agent/``, the functions get its URI and SHA-256, and the startup script fetches it, checks the digest and
installs it with ``pip install --no-index --find-links`` (see docs/deploy.md). The bundle holds ``wheelhouse/``:

* our wheel, ``tpuctl_node_agent-<version>-py3-none-any.whl``: the ``node_agent``, ``loadgen`` and ``shared``
  packages, written here with zipfile
  (fixed times and modes, sorted entries), so it builds offline and is the same bytes for the same sources;
* the wheels of ``scripts/node_agent_requirements.txt`` and their dependencies for the image's Python and
  platform, from ``pip download --only-binary=:all:``, with every dependency held at the version installed where
  this runs (the tested versions). This is the only step that needs an index; it is a separate command.

The tarball and gzip headers carry no times, owners or names, so the same wheels give the same SHA-256.

Usage (one JSON line per result)::

    python scripts/package_node_agent.py wheel --out DIR          # our wheel only (offline)
    python scripts/package_node_agent.py download --dest DIR --python-version 3.12 --platform manylinux_2_17_x86_64
    python scripts/package_node_agent.py bundle --wheels DIR [--wheels DIR ...] --out FILE
    python scripts/package_node_agent.py all --python-version 3.12 --platform ...   # what `make package` runs
"""

from __future__ import annotations

import argparse
import base64
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from collections.abc import Iterable, Sequence
from importlib import metadata
from pathlib import Path

from package_functions import FIXED_MTIME, REPO_ROOT, _shipped_files

DISTRIBUTION = "tpuctl-node-agent"  # shared.domain.startup_script.NODE_AGENT_DISTRIBUTION installs it by this name
PACKAGES = ("node_agent", "loadgen", "shared")  # the agent, the load generator it runs, the core they share
REQUIREMENTS = Path(__file__).resolve().parent / "node_agent_requirements.txt"
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
_NOT_CONSTRAINED = frozenset({"pip", "setuptools", "wheel", "tpuctl"})


def project_version(root: Path) -> str:
    """``[project] version`` of ``root/pyproject.toml``."""
    with (root / "pyproject.toml").open("rb") as handle:
        return str(tomllib.load(handle)["project"]["version"])


def requirement_lines(path: Path) -> list[str]:
    """Requirement lines of a requirements file, without comments or blanks."""
    lines = (raw.split("#", 1)[0].strip() for raw in path.read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line]


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _wheel_metadata(version: str, requirements: Iterable[str]) -> dict[str, bytes]:
    """The dist-info files (except RECORD) of our wheel."""
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {DISTRIBUTION}",
        f"Version: {version}",
        "Summary: The tpuctl node agent (python -m node_agent.agent) for TPU VMs",
        "Requires-Python: >=3.11",
        *(f"Requires-Dist: {requirement}" for requirement in requirements),
    ]
    wheel = ["Wheel-Version: 1.0", "Generator: tpuctl scripts/package_node_agent.py", "Root-Is-Purelib: true"]
    return {
        "METADATA": ("\n".join(lines) + "\n").encode(),
        "WHEEL": ("\n".join([*wheel, "Tag: py3-none-any"]) + "\n").encode(),
        "top_level.txt": "".join(f"{package}\n" for package in PACKAGES).encode(),
    }


def _write_entries(path: Path, entries: dict[str, bytes]) -> None:
    """A zip whose bytes depend only on ``entries``: sorted names, fixed time, mode and creator."""
    with zipfile.ZipFile(path, "w") as archive:
        for name in sorted(entries):
            info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
            info.external_attr = 0o644 << 16
            info.create_system = 3
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, entries[name], compresslevel=9)


def build_wheel(root: Path, out: Path, requirements: Path = REQUIREMENTS) -> Path:
    """Write our wheel (``PACKAGES`` and dist-info) into ``out``; offline, deterministic."""
    entries: dict[str, bytes] = {}
    for name in PACKAGES:
        package = root / name
        if not (package / "__init__.py").is_file():
            raise SystemExit(f"{package}: not a package ({name}/__init__.py is missing)")
        entries.update({f"{name}/{p.as_posix()}": (package / p).read_bytes() for p in _shipped_files(package)})
    version = project_version(root)
    stem = f"{DISTRIBUTION.replace('-', '_')}-{version}"
    dist_info = f"{stem}.dist-info"
    for name, data in _wheel_metadata(version, requirement_lines(requirements)).items():
        entries[f"{dist_info}/{name}"] = data
    record = [f"{name},{_record_hash(data)},{len(data)}" for name, data in sorted(entries.items())]
    entries[f"{dist_info}/RECORD"] = ("\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n").encode()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{stem}-py3-none-any.whl"
    _write_entries(path, entries)
    return path


def installed_constraints() -> list[str]:
    """``name==version`` for every distribution installed here: the bundle gets the versions the tests ran."""
    pins = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and name.lower() not in _NOT_CONSTRAINED:
            pins[name.lower()] = f"{name}=={dist.version}"
    return [pins[name] for name in sorted(pins)]


def download_wheels(dest: Path, python_version: str, platforms: Sequence[str], requirements: Path) -> list[Path]:
    """``pip download`` the third-party wheels for the target interpreter into ``dest`` (needs an index)."""
    if not platforms:
        raise SystemExit("download: give at least one --platform (e.g. manylinux_2_17_x86_64), the TPU VM image's")
    dest.mkdir(parents=True, exist_ok=True)
    constraints = dest / "constraints.txt"
    constraints.write_text("\n".join(installed_constraints()) + "\n", encoding="utf-8")
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check"]
    command += ["--only-binary=:all:", "--implementation", "cp", "--python-version", python_version]
    command += [word for platform in platforms for word in ("--platform", platform)]
    command += ["--dest", str(dest), "-r", str(requirements), "-c", str(constraints)]
    result = subprocess.run(command, check=False)
    if result.returncode != 0:
        raise SystemExit(
            f"download: pip download failed (exit {result.returncode}) for Python {python_version} on "
            f"{', '.join(platforms)}; check the index is reachable and that every pinned version has a wheel there"
        )
    return sorted(dest.glob("*.whl"))


def _collect(wheel_dirs: Iterable[Path]) -> dict[str, bytes]:
    """Wheel file name to bytes across folders; one name with two contents is refused."""
    wheels: dict[str, bytes] = {}
    for folder in wheel_dirs:
        for path in sorted(folder.glob("*.whl")):
            data = path.read_bytes()
            if wheels.get(path.name, data) != data:
                raise SystemExit(f"bundle: {path.name} appears twice with different contents; rebuild from scratch")
            wheels[path.name] = data
    if not any(name.startswith(DISTRIBUTION.replace("-", "_") + "-") for name in wheels):
        raise SystemExit(f"bundle: no {DISTRIBUTION} wheel among the wheels given; run the wheel step first")
    return wheels


def write_bundle(wheel_dirs: Iterable[Path], out: Path) -> tuple[str, list[str]]:
    """Write ``wheelhouse/*.whl`` as a tar.gz with no times, owners or names; return (sha256, wheel names)."""
    wheels = _collect(wheel_dirs)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(wheels):
            info = tarfile.TarInfo(f"wheelhouse/{name}")
            info.size, info.mtime, info.mode = len(wheels[name]), FIXED_MTIME, 0o644
            tar.addfile(info, io.BytesIO(wheels[name]))
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("wb") as handle, gzip.GzipFile(filename="", mode="wb", fileobj=handle, mtime=0) as packed:
        packed.write(raw.getvalue())
    os.utime(out, (FIXED_MTIME, FIXED_MTIME))
    return hashlib.sha256(out.read_bytes()).hexdigest(), sorted(wheels)


def _third_party_dir(out: Path, python_version: str, platforms: Sequence[str], requirements: Path) -> Path:
    """A download folder keyed by everything that decides its contents, so a change never mixes old wheels in."""
    key = json.dumps([python_version, sorted(platforms), requirement_lines(requirements), installed_constraints()])
    return out / "third-party" / f"py{python_version}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def build_all(root: Path, out: Path, python_version: str, platforms: Sequence[str]) -> dict[str, object]:
    """Our wheel, the third-party wheels (downloaded once per key), and the bundle beside them."""
    ours = out / "wheels"
    shutil.rmtree(ours, ignore_errors=True)
    build_wheel(root, ours)
    third_party = _third_party_dir(out, python_version, platforms, REQUIREMENTS)
    if not (third_party / ".complete").is_file():
        shutil.rmtree(third_party, ignore_errors=True)
        download_wheels(third_party, python_version, platforms, REQUIREMENTS)
        (third_party / ".complete").touch()
    bundle = out / f"{DISTRIBUTION}-{project_version(root)}.tar.gz"
    sha256, wheels = write_bundle([ours, third_party], bundle)
    return {"bundle": str(bundle), "sha256": sha256, "wheels": len(wheels), "python_version": python_version}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Build the node-agent wheelhouse bundle for TPU VMs.")
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help="repository root (default: this checkout)")
    steps = parser.add_subparsers(dest="step", required=True)
    wheel = steps.add_parser("wheel", help="our wheel only (offline)")
    wheel.add_argument("--out", type=Path, required=True)
    for name in ("download", "all"):
        step = steps.add_parser(name, help="third-party wheels" if name == "download" else "wheel, download, bundle")
        step.add_argument("--python-version", required=True, help="the image's Python, e.g. 3.12")
        step.add_argument("--platform", action="append", default=[], help="wheel platform tag (repeatable)")
        step.add_argument("--dest" if name == "download" else "--out", type=Path, default=None)
    bundle = steps.add_parser("bundle", help="tar.gz of the wheels in the given folders")
    bundle.add_argument("--wheels", type=Path, action="append", required=True)
    bundle.add_argument("--out", type=Path, required=True)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    root = args.root.resolve()
    if args.step == "wheel":
        line: dict[str, object] = {"wheel": str(build_wheel(root, args.out.resolve()))}
    elif args.step == "download":
        dest = (args.dest or root / "build" / "node-agent" / "third-party" / "manual").resolve()
        wheels = download_wheels(dest, args.python_version, args.platform, REQUIREMENTS)
        line = {"dest": str(dest), "wheels": len(wheels)}
    elif args.step == "bundle":
        sha256, names = write_bundle([path.resolve() for path in args.wheels], args.out.resolve())
        line = {"bundle": str(args.out.resolve()), "sha256": sha256, "wheels": len(names)}
    else:
        line = build_all(
            root, (args.out or root / "build" / "node-agent").resolve(), args.python_version, args.platform
        )
    sys.stdout.write(json.dumps(line) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

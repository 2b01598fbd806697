"""Virtual environments for tools and clean-install checks, cached by the hash of their requirements.

Some checks need a Python environment of their own: checkov conflicts with the project's pins,
and "does a packaged function import from its own requirements.txt" only means something in a
venv that has nothing else. Building one takes a minute, so each lives under
``${TPUCTL_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/tpuctl}/<name>-<sha12>`` where ``sha12`` hashes the requirement
lines: changing a pin makes a new venv, an unchanged file reuses the old one.

A venv is complete only once ``.tpuctl-complete`` exists in it (written after pip succeeds), so
an interrupted build is rebuilt instead of half-used. Run as a module to build one::

    python -m tests.support.cached_venv --name checkov --requirements tests/terraform/requirements-checkov.txt
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from localcloud.process_groups import default_cache_dir

__all__ = [
    "CHECKOV_REQUIREMENTS",
    "cache_root",
    "ensure_venv",
    "is_complete",
    "requirements_digest",
    "venv_bin",
    "venv_dir",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
CHECKOV_REQUIREMENTS = REPO_ROOT / "tests" / "terraform" / "requirements-checkov.txt"
_COMPLETE_MARKER = ".tpuctl-complete"


def cache_root() -> Path:
    """``$TPUCTL_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/tpuctl``, else ``~/.cache/tpuctl`` (as the Makefile)."""
    return default_cache_dir()


def requirements_digest(requirements: Path) -> str:
    """12 hex digits over the meaningful lines (comments and blank lines do not force a rebuild)."""
    lines = []
    for raw in requirements.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            lines.append(line)
    return hashlib.sha256("\n".join(sorted(lines)).encode("utf-8")).hexdigest()[:12]


def venv_dir(name: str, requirements: Path) -> Path:
    """Where the venv for these requirements lives (it may not exist yet)."""
    return cache_root() / f"{name}-{requirements_digest(requirements)}"


def venv_bin(venv: Path, program: str) -> Path:
    """A console script or the interpreter inside ``venv``."""
    return venv / "bin" / program


def is_complete(venv: Path) -> bool:
    """True once pip finished installing everything into ``venv``."""
    return (venv / _COMPLETE_MARKER).is_file() and venv_bin(venv, "python").exists()


def ensure_venv(name: str, requirements: Path, *, python: str | None = None, timeout_s: float = 900.0) -> Path:
    """Return a complete venv for ``requirements``, building it first if needed.

    Raises ``RuntimeError`` naming the requirements file and pip's last output lines on failure.
    """
    venv = venv_dir(name, requirements)
    if is_complete(venv):
        return venv
    venv.parent.mkdir(parents=True, exist_ok=True)
    # Two test runs may want the same venv at once: one builds, the other waits and reuses it.
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_complete(venv):
            return venv
        if venv.exists():
            shutil.rmtree(venv)
        base_python = python or _base_interpreter()
        _run([base_python, "-m", "venv", str(venv)], requirements, timeout_s)
        _run([*_pip_install(venv), "-r", str(requirements)], requirements, timeout_s)
        (venv / _COMPLETE_MARKER).write_text(requirements.read_text(encoding="utf-8"), encoding="utf-8")
    return venv


def _pip_install(venv: Path) -> list[str]:
    return [str(venv_bin(venv, "python")), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]


def _base_interpreter() -> str:
    """The interpreter this venv was made from, so the new venv inherits no site-packages."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    return str(base)


def _run(argv: list[str], requirements: Path, timeout_s: float) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-20:])
        raise RuntimeError(
            f"building a venv for {requirements} failed (exit {result.returncode}) running {argv[:4]}:\n{tail}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build (or reuse) a cached venv for a requirements file.")
    parser.add_argument("--name", required=True, help="prefix of the venv folder, e.g. checkov")
    parser.add_argument("--requirements", required=True, type=Path, help="pinned requirements file")
    args = parser.parse_args(argv)
    if not args.requirements.is_file():
        parser.error(f"--requirements: {args.requirements} does not exist (give a pinned requirements file)")
    venv = ensure_venv(args.name, args.requirements)
    print(venv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

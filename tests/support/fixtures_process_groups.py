"""Fixture ``orphan_spawner``: a real spawner process that started a ``sleep`` group through ``spawn_group``.

The test decides whether to kill the spawner (SIGKILL, as an OOM killer or ``kill -9`` would) and then checks
what reaping does; whatever happens, both processes are gone afterwards.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

SPAWNER = """
import sys, time
from pathlib import Path
from localcloud.process_groups import spawn_group
child = spawn_group(["sleep", "300"], what="test sleeper", stdout=sys.stderr, env={"PATH": "/usr/bin:/bin"},
                    ledger=Path(sys.argv[1]))
print(child.pid, flush=True)
time.sleep(300)
"""
ROOT = Path(__file__).resolve().parents[2]


def gone_or_zombie(pid: int) -> bool:
    """Exited (a zombie waits for a parent that may never reap it: it runs nothing)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


def wait_gone(pid: int, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if gone_or_zombie(pid):
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def orphan_spawner(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int, Path]]:
    """The live spawner, the pid of the group it started, and the ledger (``TPUCTL_CACHE_DIR=tmp_path/cache``'s)."""
    ledger = tmp_path / "cache" / "process-groups"
    process = subprocess.Popen(
        [sys.executable, "-c", SPAWNER, str(ledger)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert process.stdout is not None
    child = int(process.stdout.readline())
    try:
        yield process, child, ledger
    finally:
        process.kill()
        process.wait()
        process.stdout.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child, signal.SIGKILL)

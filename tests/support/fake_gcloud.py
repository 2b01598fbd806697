"""A fake ``gcloud`` on a test's PATH (``fake_gcloud_bin.py``) and a fake TPU API that answers guest attributes.

Both keep state a test reads back: the gcloud fake writes what it was run with (argv, environment, pids) and
takes its behaviour per instance from a routes file; the TPU fake holds guest attributes and the reads made.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.domain.boot_progress import GuestAttribute
from shared.domain.errors import CloudError, ErrorClass

__all__ = ["FakeGcloud", "FakeTpuGuestAttributes", "install_fake_gcloud", "process_alive", "wait_gone"]

_SOURCE = Path(__file__).with_name("fake_gcloud_bin.py")


@dataclass
class FakeGcloud:
    """The installed fake: its folder (put first on PATH) and its state files."""

    bin_dir: Path

    @property
    def path(self) -> Path:
        return self.bin_dir / "gcloud"

    def route(self, instance: str, *, forward: str | None = None, error: str | None = None, hang: bool = False) -> None:
        """What a tunnel to ``instance`` does: forward to ``host:port``, fail with ``error``, or never listen."""
        routes_file = self.bin_dir / "gcloud-routes.json"
        routes = json.loads(routes_file.read_text(encoding="utf-8")) if routes_file.exists() else {}
        routes[instance] = {"forward": forward, "error": error, "hang": hang}
        routes_file.write_text(json.dumps(routes), encoding="utf-8")

    def calls(self) -> list[dict[str, Any]]:
        """Every run so far, oldest first ([] when it never ran)."""
        calls_file = self.bin_dir / "gcloud-calls.jsonl"
        if not calls_file.exists():
            return []
        return [json.loads(line) for line in calls_file.read_text(encoding="utf-8").splitlines() if line]

    def environ(self, **extra: str) -> dict[str, str]:
        """An environment whose PATH finds this fake first (and nothing else called gcloud)."""
        base = {"PATH": f"{self.bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin", "HOME": str(self.bin_dir.parent)}
        return {**base, **extra}


def install_fake_gcloud(bin_dir: Path) -> FakeGcloud:
    """Copy the fake into ``bin_dir`` as an executable ``gcloud`` run by this interpreter."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    target = bin_dir / "gcloud"
    target.write_text(f"#!{sys.executable}\n" + _SOURCE.read_text(encoding="utf-8"), encoding="utf-8")
    target.chmod(0o755)
    assert shutil.which("gcloud", path=str(bin_dir)) == str(target)
    return FakeGcloud(bin_dir)


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting for its reaper counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A killed multi-threaded process shows its main thread as a zombie while its other threads still exit, and
    # its parent cannot reap it until they have: it is gone only when every thread is.
    states = []
    for task in Path(f"/proc/{pid}/task").glob("*/stat"):
        with contextlib.suppress(OSError, IndexError):
            states.append(task.read_text(encoding="utf-8").rsplit(")", 1)[1].split()[0])
    return any(state not in ("Z", "X") for state in states) if states else True


def wait_gone(pid: int, timeout_s: float = 5.0) -> bool:
    """Whether ``pid`` is gone within ``timeout_s`` (an orphan is reaped by init a moment after it dies)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not process_alive(pid):
            return True
        time.sleep(0.05)
    return not process_alive(pid)


@dataclass
class FakeTpuGuestAttributes:
    """The one ``TpuApi`` call the tunnel needs: guest attributes per (zone, node), and every read made."""

    attributes: dict[tuple[str, str], list[GuestAttribute]] = field(default_factory=dict)
    reads: list[tuple[str, str, str]] = field(default_factory=list)

    def set_hostname(self, zone: str, node: str, hostname: str) -> None:
        self.attributes[(zone, node)] = [
            GuestAttribute("", "hostname", hostname, worker=0),
            GuestAttribute("", "hostname", hostname.replace("-w-0", "-w-1"), worker=1),
        ]

    def guest_attributes(self, zone: str, node_id: str, query_path: str) -> Sequence[GuestAttribute]:
        self.reads.append((zone, node_id, query_path))
        if (zone, node_id) not in self.attributes:
            raise CloudError(ErrorClass.NOT_FOUND, f"node {node_id} not found")
        return list(self.attributes[(zone, node_id)])

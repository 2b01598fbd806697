"""Every process the local cloud starts leads its own process group, and a ledger remembers each group.

Why: each child (functions-framework, vLLM, a node agent, an emulator) runs in its own session so that a stop
reaches its whole tree (gunicorn's worker, vLLM's engine) and a Ctrl-C in the terminal does not race the runner's
orderly stop. The price is that a runner killed with SIGKILL leaves them all running, holding ports and memory.
So each spawn writes one ledger entry: the group's leader and the spawning process, both with their kernel
start times. The next local cloud to start reaps the groups whose spawner is gone and whose leader is still
the same process (a start time that differs means the pid was reused: that process is left alone).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

__all__ = ["ReapedGroup", "default_cache_dir", "ledger_dir", "reap_orphans", "spawn_group", "start_ticks"]


def default_cache_dir() -> Path:
    """The Makefile's rule: ``$TPUCTL_CACHE_DIR`` or ``${XDG_CACHE_HOME:-$HOME/.cache}/tpuctl``."""
    explicit = os.environ.get("TPUCTL_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tpuctl"


def ledger_dir() -> Path:
    """One ledger per user and cache, shared by every local cloud and test run on this machine."""
    return default_cache_dir() / "process-groups"


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22); None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces; the fields after it are plain.
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[19])


def spawn_group(
    argv: Sequence[str],
    *,
    what: str,
    stdout: IO[Any] | int,
    env: Mapping[str, str],
    cwd: str | Path | None = None,
    ledger: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` as the leader of a new session (stdin closed, stderr into ``stdout``) and record it."""
    process = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=subprocess.STDOUT,
        env=dict(env),
        cwd=None if cwd is None else str(cwd),
        start_new_session=True,
    )
    # An unwritable ledger costs only the reaping after a SIGKILL; the child is still ours to stop as before.
    with contextlib.suppress(OSError):
        _record(process.pid, what, ledger or ledger_dir())
    return process


def _record(pid: int, what: str, ledger: Path) -> None:
    leader_ticks, owner_ticks = start_ticks(pid), start_ticks(os.getpid())
    if leader_ticks is None or owner_ticks is None:
        return  # it already exited: nothing to reap later
    entry = {"pgid": pid, "leader_ticks": leader_ticks, "owner": os.getpid(), "owner_ticks": owner_ticks, "what": what}
    ledger.mkdir(parents=True, exist_ok=True)
    staging = ledger / f".{pid}.{os.getpid()}.tmp"
    staging.write_text(json.dumps(entry), encoding="utf-8")
    staging.replace(ledger / f"{pid}-{leader_ticks}.json")


@dataclass(frozen=True)
class ReapedGroup:
    """A group a killed spawner left running, and what it was."""

    pgid: int
    what: str
    owner: int


def reap_orphans(ledger: Path | None = None, *, grace_s: float = 5.0) -> list[ReapedGroup]:
    """Stop the groups whose spawner has died (SIGTERM, SIGKILL after ``grace_s``); forget entries that are done."""
    folder = ledger or ledger_dir()
    reaped: list[ReapedGroup] = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
            pgid, owner = int(entry["pgid"]), int(entry["owner"])
            leader_ticks, owner_ticks = int(entry["leader_ticks"]), int(entry["owner_ticks"])
        except (OSError, ValueError, KeyError, TypeError):
            path.unlink(missing_ok=True)  # unreadable: it can never prove a group is ours, so it only costs a read
            continue
        if start_ticks(owner) == owner_ticks:
            continue  # its spawner is alive and stops it itself
        if start_ticks(pgid) == leader_ticks and _leads_group(pgid):
            _stop(pgid, grace_s)
            reaped.append(ReapedGroup(pgid=pgid, what=str(entry.get("what", "?")), owner=owner))
        path.unlink(missing_ok=True)
    return reaped


def _leads_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False


def _stop(pgid: int, grace_s: float) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _group_alive(pgid):
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True

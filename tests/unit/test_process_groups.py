"""A local cloud killed with SIGKILL leaves its process groups behind; the next start reaps exactly those.

Real processes throughout (``orphan_spawner`` in ``tests/support/fixtures_process_groups.py``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from localcloud.process_groups import reap_orphans, spawn_group, start_ticks
from tests.support.fixtures_process_groups import gone_or_zombie, wait_gone


def test_a_group_whose_spawner_was_killed_is_stopped_and_forgotten(
    orphan_spawner: tuple[subprocess.Popen[str], int, Path],
) -> None:
    process, child, ledger = orphan_spawner
    process.kill()
    process.wait()
    assert not gone_or_zombie(child), "the sleeper should outlive its killed spawner (its own session)"

    reaped = reap_orphans(ledger, grace_s=1.0)

    assert [(group.pgid, group.what, group.owner) for group in reaped] == [(child, "test sleeper", process.pid)]
    assert wait_gone(child)
    assert list(ledger.glob("*.json")) == []


def test_a_group_whose_spawner_is_alive_is_left_alone(orphan_spawner: tuple[subprocess.Popen[str], int, Path]) -> None:
    _process, child, ledger = orphan_spawner

    assert reap_orphans(ledger, grace_s=1.0) == []

    assert not gone_or_zombie(child)
    assert len(list(ledger.glob("*.json"))) == 1


def test_a_reused_pid_is_never_signalled(tmp_path: Path) -> None:
    """An entry naming a live process whose start time differs (the pid was reused) only deletes the entry."""
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        ledger = tmp_path / "ledger"
        ledger.mkdir()
        ticks = start_ticks(bystander.pid)
        assert ticks is not None
        entry = {"pgid": bystander.pid, "leader_ticks": ticks - 1, "owner": 2**22 + 7, "owner_ticks": 1, "what": "x"}
        (ledger / "stale.json").write_text(json.dumps(entry))
        (ledger / "garbled.json").write_text("{not json")

        assert reap_orphans(ledger, grace_s=1.0) == []

        assert bystander.poll() is None
        assert list(ledger.glob("*.json")) == []
    finally:
        bystander.kill()
        bystander.wait()


def test_spawn_group_records_the_leader_and_its_spawner(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    process = spawn_group(["sleep", "300"], what="recorded", stdout=subprocess.DEVNULL, env={}, ledger=ledger)
    try:
        (entry_file,) = ledger.glob("*.json")
        entry = json.loads(entry_file.read_text())

        assert os.getpgid(process.pid) == process.pid
        assert entry == {
            "pgid": process.pid,
            "leader_ticks": start_ticks(process.pid),
            "owner": os.getpid(),
            "owner_ticks": start_ticks(os.getpid()),
            "what": "recorded",
        }
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def test_a_ledger_that_cannot_be_written_does_not_lose_the_child(tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the ledger folder should be")

    process = spawn_group(["sleep", "300"], what="unrecorded", stdout=subprocess.DEVNULL, env={}, ledger=blocked)
    try:
        assert process.poll() is None
        assert os.getpgid(process.pid) == process.pid
        assert blocked.read_text() == "a file where the ledger folder should be"
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()

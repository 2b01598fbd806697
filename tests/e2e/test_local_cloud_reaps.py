"""A local cloud that starts after an earlier run was killed with SIGKILL stops what that run left behind."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from localcloud.runner import LocalCloud, LocalCloudOptions
from tests.support.fixtures_process_groups import gone_or_zombie, wait_gone


def test_start_stops_the_groups_of_a_killed_run_and_says_so(
    orphan_spawner: tuple[subprocess.Popen[str], int, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    process, child, ledger = orphan_spawner
    monkeypatch.setenv("TPUCTL_CACHE_DIR", str(ledger.parent))
    process.kill()
    process.wait()
    assert not gone_or_zombie(child)

    cloud = LocalCloud(LocalCloudOptions(data_dir=tmp_path / "cloud", boot_nodes=False, time_scale=60.0))
    try:
        cloud.start()
        reaped = [(group.pgid, group.what) for group in cloud.reaped_at_start]
        log = (tmp_path / "cloud" / "logs" / "runner.jsonl").read_text()
        recorded = sorted(path.name for path in ledger.glob("*.json"))
    finally:
        report = cloud.stop()

    assert reaped == [(child, "test sleeper")]
    assert wait_gone(child)
    assert f"stopped test sleeper (process group {child}), left running by a killed run (pid {process.pid})" in log
    assert len(recorded) == 3, "the new run's three functions are in the ledger, the reaped group is not"
    assert report.survivors == ()

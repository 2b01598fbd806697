"""What only the embedded store has to prove: several processes on one file, and refusing unusable paths."""

from __future__ import annotations

import multiprocessing
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest

from shared.adapters.sqlite_store import SqliteStateStore
from shared.domain.models import DeploymentRecord, DeploymentSpec
from tests.support.state_store_workers import hammer_store

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def test_two_processes_share_one_file_without_losing_an_update_or_doubling_a_command(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    with SqliteStateStore(path) as store:
        spec = DeploymentSpec(deployment_id="gemma-a", model="tiny-llama", accelerator="v6e-1", zones=("us-east5-b",))
        store.put_deployment(
            DeploymentRecord(deployment_id="gemma-a", spec=spec, created_at=T0, updated_at=T0), expected_version=None
        )
    rounds = 25
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        created = pool.starmap(hammer_store, [(str(path), rounds), (str(path), rounds)])

    assert sum(created) == rounds
    with SqliteStateStore(path) as store:
        final = store.get_deployment("gemma-a")
        assert final is not None
        assert final.status.next_attempt == 2 * rounds
        assert final.version == 1 + 2 * rounds
        assert all(store.get_command(f"c{i}") is not None for i in range(rounds))


def test_a_second_store_on_the_same_file_sees_the_first_ones_writes(tmp_path: Path) -> None:
    with SqliteStateStore(tmp_path / "a.db") as writer, SqliteStateStore(tmp_path / "a.db") as reader:
        writer.acquire_lease("reconciler", "worker-1", 30, T0)
        lease = reader.acquire_lease("reconciler", "worker-2", 30, T0)
        assert lease is None


@pytest.mark.parametrize("path", [":memory:", "file::memory:?cache=shared"])
def test_an_in_memory_database_is_refused_with_the_fix(path: str) -> None:
    with pytest.raises(ValueError, match=r"path: .*pass a file path"):
        SqliteStateStore(path)


def test_a_closed_store_refuses_further_use(tmp_path: Path) -> None:
    store = SqliteStateStore(tmp_path / "c.db")
    store.close()
    with pytest.raises(RuntimeError, match="closed"):
        store.get_deployment("gemma-a")


def test_a_database_from_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(RuntimeError, match="schema version 99 is newer"):
        SqliteStateStore(path)

"""One contract for every ``StateStore``: the embedded SQLite store and Firestore (on the real emulator).

Each test runs once per adapter. Firestore tests carry the ``emulator`` marker and are skipped with a reason
when google-cloud-cli's emulator is not on the machine. Contention tests stay tiny: emulator transactions
lock pessimistically and are slow.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from functools import partial
from typing import Any, Protocol, TypeVar

import pytest
from google.cloud import firestore

from shared.adapters.firestore_store import FirestoreStateStore
from shared.adapters.sqlite_store import SqliteStateStore
from shared.domain.errors import ConflictError, LeaseHeld
from shared.domain.models import (
    BenchmarkRun,
    CommandRecord,
    DeploymentRecord,
    DeploymentSpec,
    DeploymentStatus,
    Lease,
    MonitorSample,
    NodeTask,
    Phase,
    RejectedMessage,
    Tier,
    ZoneMemoryEntry,
)
from shared.ports import Fence, StateStore

T0 = datetime(2026, 12, 2, 12, 0, 0, 123456, tzinfo=UTC)
R = TypeVar("R")


class ContractStore(StateStore, Protocol):
    """The port plus the maintenance call both adapters offer."""

    def purge_expired(self, now: datetime) -> int: ...


@pytest.fixture(params=["sqlite", pytest.param("firestore", marks=pytest.mark.emulator)])
def store(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[ContractStore]:
    if request.param == "sqlite":
        sqlite = SqliteStateStore(tmp_path / "state" / "tpuctl.db")
        yield sqlite
        sqlite.close()
    else:
        client: firestore.Client = request.getfixturevalue("firestore_client")
        yield FirestoreStateStore(client, prefix="contract-")


def a_deployment(
    deployment_id: str = "gemma-a", *, phase: Phase = Phase.PENDING, message: str = ""
) -> DeploymentRecord:
    spec = DeploymentSpec(
        deployment_id=deployment_id, model="gemma-4-26b-a4b", accelerator="v6e-4", zones=("us-east5-b",)
    )
    return DeploymentRecord(
        deployment_id=deployment_id,
        spec=spec,
        status=DeploymentStatus(phase=phase, message=message),
        created_at=T0,
        updated_at=T0,
    )


def a_command(command_id: str = "cmd-1", *, at: datetime = T0, expire_at: datetime | None = None) -> CommandRecord:
    return CommandRecord(
        command_id=command_id, kind="deployment.create", deployment_id="gemma-a", received_at=at, expire_at=expire_at
    )


def a_sample(
    deployment_id: str, at: datetime, *, probe: str = "ok", expire_at: datetime | None = None
) -> MonitorSample:
    return MonitorSample(
        deployment_id=deployment_id,
        taken_at=at,
        phase=Phase.SERVING,
        probe=probe,
        slis={"ttft_p50_s": 0.25},
        counters={"requests": 3},
        expire_at=expire_at,
    )


def a_run(run_id: str, deployment_id: str, at: datetime) -> BenchmarkRun:
    return BenchmarkRun(
        run_id=run_id, deployment_id=deployment_id, request={"prompts": 8}, created_at=at, updated_at=at
    )


def run_together(*calls: Callable[[], R]) -> list[R | BaseException]:
    """Run the calls on their own threads, released at the same moment; results (or errors) in call order."""
    barrier = threading.Barrier(len(calls))
    results: list[R | BaseException] = [RuntimeError("did not finish")] * len(calls)

    def worker(index: int, call: Callable[[], R]) -> None:
        barrier.wait()
        try:
            results[index] = call()
        except BaseException as exc:  # the caller inspects what each thread got
            results[index] = exc

    threads = [threading.Thread(target=worker, args=(i, call)) for i, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


class TestDeployments:
    def test_a_create_stores_version_1_and_a_duplicate_create_conflicts(self, store: ContractStore) -> None:
        stored = store.put_deployment(a_deployment(), expected_version=None)
        assert stored.version == 1
        assert store.get_deployment("gemma-a") == stored

        with pytest.raises(ConflictError, match="already exists"):
            store.put_deployment(a_deployment(message="second"), expected_version=None)
        assert store.get_deployment("gemma-a") == stored

    def test_compare_and_set_bumps_the_version_and_a_stale_version_writes_nothing(self, store: ContractStore) -> None:
        v1 = store.put_deployment(a_deployment(), expected_version=None)
        v2 = store.put_deployment(a_deployment(message="searching"), expected_version=v1.version)
        assert (v2.version, v2.status.message) == (2, "searching")

        with pytest.raises(ConflictError, match="version 2"):
            store.put_deployment(a_deployment(message="stale"), expected_version=1)
        assert store.get_deployment("gemma-a") == v2

    def test_an_update_of_a_missing_deployment_conflicts(self, store: ContractStore) -> None:
        with pytest.raises(ConflictError, match="does not exist"):
            store.put_deployment(a_deployment(), expected_version=3)
        assert store.get_deployment("gemma-a") is None

    def test_two_concurrent_writers_of_one_version_leave_one_winner(self, store: ContractStore) -> None:
        v1 = store.put_deployment(a_deployment(), expected_version=None)
        results = run_together(
            lambda: store.put_deployment(a_deployment(message="thread-a"), expected_version=v1.version),
            lambda: store.put_deployment(a_deployment(message="thread-b"), expected_version=v1.version),
        )
        winners = [r for r in results if isinstance(r, DeploymentRecord)]
        assert len(winners) == 1, results
        assert sum(isinstance(r, ConflictError) for r in results) == 1, results
        assert store.get_deployment("gemma-a") == winners[0]
        assert winners[0].version == 2

    def test_listing_hides_deleted_deployments_unless_asked(self, store: ContractStore) -> None:
        store.put_deployment(a_deployment("gemma-b"), expected_version=None)
        store.put_deployment(a_deployment("gemma-a", phase=Phase.DELETED), expected_version=None)
        assert [d.deployment_id for d in store.list_deployments()] == ["gemma-b"]
        assert [d.deployment_id for d in store.list_deployments(include_deleted=True)] == ["gemma-a", "gemma-b"]


class TestFences:
    def test_a_write_fenced_by_the_current_epoch_lands(self, store: ContractStore) -> None:
        lease = store.acquire_lease("deploy/gemma-a", "worker-1", 60, T0)
        assert lease is not None
        stored = store.put_deployment(a_deployment(), expected_version=None, fence=Fence("deploy/gemma-a", lease.epoch))
        assert store.get_deployment("gemma-a") == stored

    def test_a_write_fenced_by_an_old_epoch_is_refused_and_writes_nothing(self, store: ContractStore) -> None:
        old = store.acquire_lease("deploy/gemma-a", "worker-1", 60, T0)
        assert old is not None
        v1 = store.put_deployment(a_deployment(), expected_version=None, fence=Fence("deploy/gemma-a", old.epoch))
        new = store.acquire_lease("deploy/gemma-a", "worker-2", 60, T0 + timedelta(seconds=61))
        assert new is not None and new.epoch > old.epoch

        with pytest.raises(LeaseHeld, match=f"epoch {new.epoch}"):
            store.put_deployment(
                a_deployment(message="zombie"), expected_version=v1.version, fence=Fence("deploy/gemma-a", old.epoch)
            )
        assert store.get_deployment("gemma-a") == v1

    def test_a_fence_on_a_missing_or_released_lease_is_refused(self, store: ContractStore) -> None:
        with pytest.raises(LeaseHeld, match="does not exist"):
            store.put_deployment(a_deployment(), expected_version=None, fence=Fence("deploy/gemma-a", 1))
        lease = store.acquire_lease("deploy/gemma-a", "worker-1", 60, T0)
        assert lease is not None
        store.release_lease("deploy/gemma-a", "worker-1", lease.epoch)

        with pytest.raises(LeaseHeld, match="released"):
            store.put_deployment(a_deployment(), expected_version=None, fence=Fence("deploy/gemma-a", lease.epoch))
        assert store.get_deployment("gemma-a") is None


class TestCommandLedger:
    def test_the_same_command_recorded_twice_keeps_the_first(self, store: ContractStore) -> None:
        first = a_command()
        assert store.record_command(first) == (True, first)
        created, stored = store.record_command(a_command(at=T0 + timedelta(minutes=5)))
        assert (created, stored) == (False, first)
        assert store.get_command("cmd-1") == first

    def test_the_same_command_recorded_from_two_threads_is_created_once(self, store: ContractStore) -> None:
        for index in range(3):
            command_id = f"race-{index}"
            results = run_together(
                partial(store.record_command, a_command(command_id, at=T0)),
                partial(store.record_command, a_command(command_id, at=T0 + timedelta(seconds=1))),
            )
            outcomes = [r for r in results if isinstance(r, tuple)]
            assert len(outcomes) == 2, results
            assert sorted(created for created, _ in outcomes) == [False, True]
            winner = next(stored for created, stored in outcomes if created)
            assert all(stored == winner for _, stored in outcomes)
            assert store.get_command(command_id) == winner

    def test_finishing_a_command_sets_status_and_outcome(self, store: ContractStore) -> None:
        store.record_command(a_command())
        store.finish_command("cmd-1", "applied", "created qr gemma-a-g1-a0")
        stored = store.get_command("cmd-1")
        assert stored is not None
        assert (stored.status, stored.outcome) == ("applied", "created qr gemma-a-g1-a0")

    def test_finishing_an_unknown_or_badly_stated_command_is_refused(self, store: ContractStore) -> None:
        with pytest.raises(LookupError, match="cmd-404"):
            store.finish_command("cmd-404", "applied", "")
        store.record_command(a_command())
        with pytest.raises(ValueError, match="applied"):
            store.finish_command("cmd-1", "done", "")
        stored = store.get_command("cmd-1")
        assert stored is not None and stored.status == "accepted"

    def test_an_unknown_command_reads_as_none(self, store: ContractStore) -> None:
        assert store.get_command("never") is None


class TestLeases:
    def test_the_epoch_grows_on_every_acquisition_and_other_holders_wait_for_expiry(self, store: ContractStore) -> None:
        first = store.acquire_lease("reconciler", "worker-1", 30, T0)
        assert first == Lease(name="reconciler", holder="worker-1", epoch=1, expires_at=T0 + timedelta(seconds=30))

        assert store.acquire_lease("reconciler", "worker-2", 30, T0 + timedelta(seconds=29)) is None
        renewed = store.acquire_lease("reconciler", "worker-1", 30, T0 + timedelta(seconds=10))
        assert renewed is not None and (renewed.holder, renewed.epoch) == ("worker-1", 2)

        assert store.acquire_lease("reconciler", "worker-2", 30, T0 + timedelta(seconds=39)) is None
        taken = store.acquire_lease("reconciler", "worker-2", 30, T0 + timedelta(seconds=40))
        assert taken is not None and (taken.holder, taken.epoch) == ("worker-2", 3)

    def test_release_frees_the_lease_only_for_its_holder_and_epoch(self, store: ContractStore) -> None:
        lease = store.acquire_lease("reconciler", "worker-1", 300, T0)
        assert lease is not None
        store.release_lease("reconciler", "worker-2", lease.epoch)
        store.release_lease("reconciler", "worker-1", lease.epoch + 1)
        assert store.acquire_lease("reconciler", "worker-2", 300, T0) is None

        store.release_lease("reconciler", "worker-1", lease.epoch)
        taken = store.acquire_lease("reconciler", "worker-2", 300, T0 + timedelta(seconds=1))
        assert taken is not None and (taken.holder, taken.epoch) == ("worker-2", 2)

    def test_releasing_a_lease_that_never_existed_does_nothing(self, store: ContractStore) -> None:
        store.release_lease("nobody", "worker-1", 1)
        lease = store.acquire_lease("nobody", "worker-1", 30, T0)
        assert lease is not None and lease.epoch == 1

    def test_bad_lease_arguments_name_the_field(self, store: ContractStore) -> None:
        with pytest.raises(ValueError, match="ttl_s"):
            store.acquire_lease("reconciler", "worker-1", 0, T0)
        with pytest.raises(ValueError, match="now"):
            store.acquire_lease("reconciler", "worker-1", 30, datetime(2026, 12, 2, 12, 0))
        with pytest.raises(ValueError, match="holder"):
            store.acquire_lease("reconciler", "", 30, T0)


class TestSamples:
    def test_a_batch_lists_newest_first_per_deployment_with_since_and_limit(self, store: ContractStore) -> None:
        times = [T0 + timedelta(minutes=m) for m in range(5)]
        store.write_samples([a_sample("gemma-a", t) for t in times] + [a_sample("gemma-b", T0)])

        listed = store.list_samples("gemma-a")
        assert [s.taken_at for s in listed] == list(reversed(times))
        assert listed[0] == a_sample("gemma-a", times[-1])
        assert [s.taken_at for s in store.list_samples("gemma-a", since=times[3])] == [times[4], times[3]]
        assert [s.taken_at for s in store.list_samples("gemma-a", limit=2)] == [times[4], times[3]]
        assert [s.deployment_id for s in store.list_samples("gemma-b")] == ["gemma-b"]

    def test_rewriting_a_tick_replaces_its_sample(self, store: ContractStore) -> None:
        store.write_samples([a_sample("gemma-a", T0, probe="refused")])
        store.write_samples([a_sample("gemma-a", T0, probe="ok")])
        assert [s.probe for s in store.list_samples("gemma-a")] == ["ok"]

    def test_expired_samples_and_commands_are_purged(self, store: ContractStore) -> None:
        store.write_samples(
            [
                a_sample("gemma-a", T0, expire_at=T0 + timedelta(days=1)),
                a_sample("gemma-a", T0 + timedelta(minutes=1), expire_at=T0 + timedelta(days=3)),
                a_sample("gemma-a", T0 + timedelta(minutes=2)),
            ]
        )
        store.record_command(a_command("old", expire_at=T0 + timedelta(days=1)))
        store.record_command(a_command("new", expire_at=T0 + timedelta(days=30)))

        assert store.purge_expired(T0 + timedelta(days=2)) == 2
        assert [s.taken_at for s in store.list_samples("gemma-a")] == [
            T0 + timedelta(minutes=2),
            T0 + timedelta(minutes=1),
        ]
        assert store.get_command("old") is None
        assert store.get_command("new") is not None

    def test_an_oversized_batch_is_refused_whole(self, store: ContractStore) -> None:
        batch = [a_sample("gemma-a", T0 + timedelta(seconds=s)) for s in range(501)]
        with pytest.raises(ValueError, match="samples: at most 500"):
            store.write_samples(batch)
        assert store.list_samples("gemma-a") == []


class TestBenchmarkRuns:
    def test_runs_are_created_once_updated_and_listed_newest_first(self, store: ContractStore) -> None:
        first = a_run("run-1", "gemma-a", T0)
        assert store.create_benchmark_run(first) == (True, first)
        assert store.create_benchmark_run(a_run("run-1", "gemma-a", T0 + timedelta(hours=1))) == (False, first)
        store.create_benchmark_run(a_run("run-2", "gemma-b", T0 + timedelta(minutes=1)))
        store.create_benchmark_run(a_run("run-3", "gemma-a", T0 + timedelta(minutes=2)))

        done = first.model_copy(update={"status": "completed", "result": {"tokens_per_s": 812.5}, "updated_at": T0})
        store.update_benchmark_run(done)
        assert store.get_benchmark_run("run-1") == done
        assert store.get_benchmark_run("run-404") is None
        assert [r.run_id for r in store.list_benchmark_runs()] == ["run-3", "run-2", "run-1"]
        assert [r.run_id for r in store.list_benchmark_runs("gemma-a")] == ["run-3", "run-1"]
        assert [r.run_id for r in store.list_benchmark_runs(limit=1)] == ["run-3"]

    def test_updating_a_run_that_was_never_created_is_refused(self, store: ContractStore) -> None:
        with pytest.raises(LookupError, match="run-404"):
            store.update_benchmark_run(a_run("run-404", "gemma-a", T0))
        assert store.get_benchmark_run("run-404") is None


def a_node_task(task_id: str, deployment_id: str, at: datetime, *, action: str = "logs") -> NodeTask:
    return NodeTask.model_validate(
        {"task_id": task_id, "deployment_id": deployment_id, "action": action, "requested_at": at}
    )


class TestNodeTasks:
    def test_tasks_are_created_once_updated_and_listed_newest_first(self, store: ContractStore) -> None:
        first = a_node_task("task-1", "gemma-a", T0, action="restart")
        assert store.create_node_task(first) == (True, first)
        assert store.create_node_task(a_node_task("task-1", "gemma-a", T0 + timedelta(hours=1))) == (False, first)
        store.create_node_task(a_node_task("task-2", "gemma-b", T0 + timedelta(minutes=1)))
        store.create_node_task(a_node_task("task-3", "gemma-a", T0 + timedelta(minutes=2)))

        done = first.model_copy(
            update={"status": "completed", "finished_at": T0, "detail": "restarted", "lines": ("a", "b")}
        )
        assert store.update_node_task(done) is True
        assert store.get_node_task("task-1") == done
        assert store.get_node_task("task-404") is None
        assert [t.task_id for t in store.list_node_tasks("gemma-a")] == ["task-3", "task-1"]
        assert [t.task_id for t in store.list_node_tasks("gemma-a", limit=1)] == ["task-3"]
        assert store.list_node_tasks("gemma-z") == []

    def test_an_update_guarded_by_status_applies_only_while_the_status_holds(self, store: ContractStore) -> None:
        task = a_node_task("task-1", "gemma-a", T0)
        store.create_node_task(task)
        answered = task.model_copy(update={"status": "completed", "lines": ("line",)})
        assert store.update_node_task(answered, expected_status="dispatched") is True
        late = task.model_copy(update={"status": "failed", "detail": "late"})
        assert store.update_node_task(late, expected_status="dispatched") is False
        assert store.get_node_task("task-1") == answered

    def test_updating_a_task_that_was_never_created_is_refused(self, store: ContractStore) -> None:
        with pytest.raises(LookupError, match="task-404"):
            store.update_node_task(a_node_task("task-404", "gemma-a", T0))
        assert store.get_node_task("task-404") is None


class TestZoneMemory:
    def test_entries_are_put_replaced_listed_by_key_and_deleted(self, store: ContractStore) -> None:
        stockout = ZoneMemoryEntry(
            key="stockout/us-east5-b/v6e/spot",
            kind="cooldown",
            error_class="stockout",
            zone="us-east5-b",
            tier=Tier.SPOT,
            reason="no capacity",
            until=T0 + timedelta(minutes=30),
            updated_at=T0,
        )
        quota = ZoneMemoryEntry(
            key="quota/region/us-east5/TPUV6EPreemptiblePerProjectPerRegionForTPUAPI",
            kind="block",
            error_class="quota_region",
            region="us-east5",
            updated_at=T0,
        )
        store.put_zone_memory(stockout)
        store.put_zone_memory(quota)
        assert store.list_zone_memory() == [quota, stockout]

        again = stockout.model_copy(update={"failures": 2, "until": T0 + timedelta(hours=1)})
        store.put_zone_memory(again)
        store.delete_zone_memory(quota.key)
        store.delete_zone_memory("never/stored")
        assert store.list_zone_memory() == [again]


class TestRejections:
    def test_rejections_list_newest_first(self, store: ContractStore) -> None:
        for minute, field in enumerate(["kind", "spec.zones", "command_id"]):
            store.record_rejection(
                RejectedMessage(
                    message_id=f"m{minute}",
                    field=field,
                    reason="invalid",
                    received_at=T0 + timedelta(minutes=minute),
                    size_bytes=120,
                    source="tpuctl-commands",
                )
            )
        assert [r.field for r in store.list_rejections()] == ["command_id", "spec.zones", "kind"]
        assert [r.message_id for r in store.list_rejections(limit=2)] == ["m2", "m1"]


class TestDatetimes:
    def test_times_come_back_utc_aware_with_microseconds(self, store: ContractStore) -> None:
        plus_two = timezone(timedelta(hours=2))
        local = datetime(2026, 12, 2, 14, 0, 0, 654321, tzinfo=plus_two)
        record = a_deployment().model_copy(update={"created_at": local, "updated_at": local})
        returned = store.put_deployment(record, expected_version=None)
        stored = store.get_deployment("gemma-a")
        assert stored is not None and stored == returned

        for value in (stored.created_at, returned.created_at):
            assert value == datetime(2026, 12, 2, 12, 0, 0, 654321, tzinfo=UTC)
            assert value.utcoffset() == timedelta(0)
            assert type(value) is datetime

        store.write_samples([a_sample("gemma-a", local, expire_at=local + timedelta(days=14))])
        (sample,) = store.list_samples("gemma-a", since=local)
        assert sample.taken_at == local and sample.taken_at.utcoffset() == timedelta(0)
        assert sample.expire_at is not None and sample.expire_at.utcoffset() == timedelta(0)

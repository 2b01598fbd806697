"""The monitor service against the embedded SQLite store and local bus, probing over real HTTP with the real
probe. The endpoints replay real vLLM 0.32.0 answers; tests script load, stalls and crashes between ticks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from shared.adapters.clock import ManualClock
from shared.adapters.local_bus import LocalBus
from shared.adapters.sqlite_store import SqliteStateStore
from shared.adapters.vllm_probe import VllmProbe
from shared.domain.models import (
    BenchmarkRun,
    DeploymentRecord,
    DeploymentSpec,
    DeploymentStatus,
    Desired,
    HealthThresholds,
    MonitorSample,
    NodeState,
    Phase,
    QueuedResourceState,
    ResourceRef,
    Tier,
)
from shared.messages import ReconcileTick, decode_message, new_command_id
from shared.ports import Delivery, MetricWriter
from shared.services.monitor import Monitor, MonitorSettings
from tests.support.vllm_replay import ReplayVllm, real_metrics_text, with_values
from tests.support.vllm_server import free_loopback_port

START = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
TOPICS = {"commands": "tpuctl-commands", "events": "tpuctl-events", "ticks": "tpuctl-ticks"}
BASE = real_metrics_text()


class CountingStore(SqliteStateStore):
    """The real SQLite store, counting batched sample writes and optionally racing a writer before a put."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.sample_batches = 0
        self.race: dict[str, Phase] = {}

    def write_samples(self, samples: Any) -> None:
        self.sample_batches += 1
        super().write_samples(samples)

    def put_deployment(self, record: DeploymentRecord, *, expected_version: int | None, fence: Any = None) -> Any:
        racing_phase = self.race.pop(record.deployment_id, None)
        if racing_phase is not None:  # the reconciler wins the race
            current = self.get_deployment(record.deployment_id)
            assert current is not None
            moved = current.model_copy(update={"status": current.status.model_copy(update={"phase": racing_phase})})
            super().put_deployment(moved, expected_version=current.version)
        return super().put_deployment(record, expected_version=expected_version, fence=fence)


@dataclass
class World:
    store: CountingStore
    bus: LocalBus
    clock: ManualClock
    replay: ReplayVllm
    monitor: Monitor

    def add(
        self,
        name: str,
        *,
        phase: Phase = Phase.BOOTING,
        endpoint: str | None = None,
        desired: Desired = Desired.PRESENT,
        resources: list[ResourceRef] | None = None,
        **spec: Any,
    ) -> DeploymentRecord:
        now = self.clock.now()
        record = DeploymentRecord(
            deployment_id=name,
            spec=DeploymentSpec(
                deployment_id=name, model="tiny-llama", accelerator="v6e-1", zones=("us-east5-b",), **spec
            ),
            desired=desired,
            status=DeploymentStatus(
                phase=phase,
                phase_since=now,
                endpoint=endpoint if endpoint is not None else self.replay.base_url(name),
                resources=resources or [],
            ),
            created_at=now,
            updated_at=now,
        )
        return self.store.put_deployment(record, expected_version=None)

    def tick(self, advance_s: float = 60.0) -> Any:
        self.clock.advance(advance_s)
        return self.monitor.tick()

    def record(self, name: str) -> DeploymentRecord:
        found = self.store.get_deployment(name)
        assert found is not None
        return found

    def latest(self, name: str) -> MonitorSample:
        return self.store.list_samples(name, limit=1)[0]

    def messages(self, topic: str) -> list[Any]:
        got: list[Any] = []

        def keep(delivery: Delivery) -> None:
            got.append(decode_message(delivery.data))

        self.bus.drain(f"{topic}-probe", keep)
        return got


@contextmanager
def monitor_world(tmp_path: Path, metrics: MetricWriter | None = None) -> Iterator[World]:
    """The monitor on the embedded store and bus, probing replayed vLLM endpoints; ``metrics`` gets its SLIs."""
    clock = ManualClock(START)
    store = CountingStore(tmp_path / "state.db")
    bus = LocalBus(tmp_path / "bus.db", clock=clock)
    for logical, topic in TOPICS.items():
        bus.ensure_topic(topic)
        bus.ensure_subscription(topic, f"{logical}-probe")
    settings = MonitorSettings(
        topic_commands=TOPICS["commands"], topic_events=TOPICS["events"], topic_ticks=TOPICS["ticks"]
    )
    with ReplayVllm() as replay:
        probe = VllmProbe(timeout_s=1.0, connect_timeout_s=0.5)
        yield World(store, bus, clock, replay, Monitor(store, probe, bus, clock, settings, metrics=metrics))
    bus.close()
    store.close()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with monitor_world(tmp_path) as built:
        yield built


def test_a_booting_deployment_that_answers_becomes_serving_with_one_batched_sample_write(world: World) -> None:
    for name in ("dep-a", "dep-b", "dep-c"):
        world.add(name)
    report = world.tick()
    assert report.probed == 3
    assert report.sample_batches == 1 and world.store.sample_batches == 1
    record = world.record("dep-a")
    assert record.status.phase is Phase.SERVING
    assert record.status.serving_since == world.clock.now()
    sample = world.latest("dep-a")
    assert sample.probe == "ok"
    assert sample.expire_at == sample.taken_at + timedelta(days=14)
    assert sample.counters["counters"]["generation_tokens"] == 3248.0
    assert "vllm 0.32.0" in sample.detail
    changes = world.messages("events")
    assert sorted((m.deployment_id, m.previous, m.phase) for m in changes) == [
        (name, Phase.BOOTING, Phase.SERVING) for name in ("dep-a", "dep-b", "dep-c")
    ]


def test_load_between_ticks_shows_in_the_next_sample(world: World) -> None:
    world.add("dep-a", phase=Phase.SERVING)
    world.tick()
    world.replay.set("dep-a", metrics=with_values(BASE, generation_tokens=3248 + 1200, success_length=104 + 30))
    world.tick(advance_s=60)
    slis = world.latest("dep-a").slis
    assert slis["generation_tokens_per_s"] == pytest.approx(20.0)
    assert slis["finished_length"] == 30.0
    assert slis["interval_s"] == 60.0


def test_a_repeated_tick_changes_nothing(world: World) -> None:
    world.add("dep-a")
    world.tick()
    version = world.record("dep-a").version
    again = world.monitor.tick()  # same instant: a redelivered Scheduler tick
    assert again.probed == 0
    assert again.skipped == [("dep-a", "sampled 0 s ago")]
    assert again.sample_batches == 0
    assert world.record("dep-a").version == version
    assert len(world.store.list_samples("dep-a")) == 1


def test_only_present_serving_deployments_with_an_endpoint_are_probed(world: World) -> None:
    world.add("live", phase=Phase.SERVING)
    world.add("searching", phase=Phase.SEARCHING)
    world.add("stopping", phase=Phase.SERVING, desired=Desired.STOPPED)
    world.add("no-endpoint", phase=Phase.BOOTING, endpoint="")
    report = world.tick()
    assert [r.deployment_id for r in report.deployments] == ["live"]


def test_a_recorded_stall_is_stalled_while_health_stays_200_then_restarted_after_grace(world: World) -> None:
    world.add("dep-a", phase=Phase.SERVING, health=HealthThresholds(stall_after_s=120, heal_after_s=180))
    stuck = with_values(BASE, running=3, generation_tokens=5000, iterations=900)
    world.replay.set("dep-a", metrics=stuck)
    phases = [world.tick().deployments[0] for _ in range(3)]
    assert [p.probe for p in phases] == ["ok", "ok", "ok"]
    assert [p.phase for p in phases] == [Phase.SERVING, Phase.SERVING, Phase.STALLED]
    assert "no engine step or token for 120 s" in world.record("dep-a").status.message

    world.tick()  # 60 s into the stall: still within grace
    assert world.messages("commands") == []
    healed = world.tick(advance_s=120).deployments[0]  # 180 s into the stall
    assert healed.phase is Phase.BOOTING
    restart = world.messages("commands")
    assert [m.kind for m in restart] == ["serving.restart"]
    assert "STALLED" in restart[0].reason
    record = world.record("dep-a")
    assert (record.status.phase, record.status.serving_since) == (Phase.BOOTING, None)


def test_progress_resumes_and_the_stall_clears(world: World) -> None:
    world.add("dep-a", phase=Phase.STALLED, health=HealthThresholds(stall_after_s=60))
    world.replay.set("dep-a", metrics=with_values(BASE, running=3, generation_tokens=5000, iterations=900))
    world.tick()
    world.replay.set("dep-a", metrics=with_values(BASE, running=3, generation_tokens=5600, iterations=1100))
    assert world.tick().deployments[0].phase is Phase.SERVING


def test_a_crash_is_down_and_restarted_after_grace_with_a_stable_command_id(world: World) -> None:
    world.add("dep-a", phase=Phase.SERVING, health=HealthThresholds(heal_after_s=120))
    world.tick()
    closed = f"http://127.0.0.1:{free_loopback_port()}"
    record = world.record("dep-a")
    world.store.put_deployment(
        record.model_copy(update={"status": record.status.model_copy(update={"endpoint": closed})}),
        expected_version=record.version,
    )
    down = world.tick().deployments[0]
    assert (down.probe, down.phase) == ("refused", Phase.DOWN)
    assert world.tick().deployments[0].phase is Phase.DOWN  # 60 s: within grace
    healed = world.tick().deployments[0]  # 120 s
    assert healed.published[0] == "serving.restart"
    commands = world.messages("commands")
    assert len(commands) == 1
    events = [(m.previous, m.phase) for m in world.messages("events")]
    assert (Phase.SERVING, Phase.DOWN) in events and (Phase.DOWN, Phase.BOOTING) in events


@pytest.mark.parametrize(
    ("status", "trials", "healed"), [("running", 4, False), ("completed", 4, True), ("running", 0, True)]
)
def test_no_restart_while_a_tune_recreates_vllm_and_healing_resumes_after_it(
    world: World, status: str, trials: int, healed: bool
) -> None:
    """A tune's trials restart vLLM on purpose (issue 22): the monitor sees DOWN but leaves the engine to the tune;
    a finished tune, or a plain benchmark running, heals as usual."""
    world.add("dep-a", phase=Phase.SERVING, health=HealthThresholds(heal_after_s=120))
    world.tick()
    now = world.clock.now()
    request = {"tune_trials": trials, "slo_ttft_ms": 500.0} if trials else {}
    world.store.create_benchmark_run(
        BenchmarkRun(
            run_id=new_command_id(),
            deployment_id="dep-a",
            status=status,
            request=request,
            created_at=now,
            updated_at=now,
        )
    )
    closed = f"http://127.0.0.1:{free_loopback_port()}"
    record = world.record("dep-a")
    world.store.put_deployment(
        record.model_copy(update={"status": record.status.model_copy(update={"endpoint": closed})}),
        expected_version=record.version,
    )
    phases = [world.tick().deployments[0] for _ in range(4)]  # 240 s DOWN: twice the grace
    assert all(report.phase is Phase.DOWN for report in phases[:2])
    assert any("serving.restart" in report.published for report in phases) is healed
    assert bool([m for m in world.messages("commands") if m.kind == "serving.restart"]) is healed


def test_a_down_deployment_on_a_preempted_node_goes_to_the_provisioner_not_a_restart(world: World) -> None:
    node = ResourceRef(
        name="a-g1-a0",
        zone="us-east5-b",
        tier=Tier.SPOT,
        generation=1,
        attempt=0,
        state=QueuedResourceState.ACTIVE,
        node_state=NodeState.PREEMPTED,
    )
    world.add("dep-a", phase=Phase.SERVING, resources=[node])
    record = world.record("dep-a")
    world.store.put_deployment(
        record.model_copy(
            update={
                "status": record.status.model_copy(update={"serving_since": START, "endpoint": "http://127.0.0.1:9"})
            }
        ),
        expected_version=record.version,
    )
    world.tick()
    world.tick()
    ticks = world.messages("ticks")
    assert [(m.kind, m.purpose, m.deployment_id) for m in ticks] == [("reconcile.tick", "reconcile", "dep-a")]
    assert world.messages("commands") == []


@pytest.mark.parametrize(("on_idle", "kind"), [("stop", "deployment.stop"), ("delete", "deployment.delete")])
def test_an_idle_deployment_is_stopped_or_deleted_per_its_spec(world: World, on_idle: str, kind: str) -> None:
    world.add("dep-a", phase=Phase.SERVING, idle_minutes=5, on_idle=on_idle)
    world.tick()  # minute 1: serving starts now; no traffic from here on
    first_stop_minute = None
    for minute in range(2, 11):
        if kind in world.tick().deployments[0].published and first_stop_minute is None:
            first_stop_minute = minute
    commands = world.messages("commands")
    assert commands and {m.kind for m in commands} == {kind}
    assert len({m.command_id for m in commands}) == 1  # the same idle period always yields the same id
    # 5 idle minutes plus the slack for a coarse last_request_at (a quarter of the window), never earlier
    assert first_stop_minute == 8


def test_traffic_keeps_an_idle_timer_from_firing(world: World) -> None:
    world.add("dep-a", phase=Phase.SERVING, idle_minutes=5)
    world.tick()
    for minute in range(1, 9):
        world.replay.set("dep-a", metrics=with_values(BASE, success_length=104 + minute, prompt_tokens=1758 + minute))
        world.tick()
    assert world.messages("commands") == []
    assert world.record("dep-a").status.last_request_at is not None


def test_a_lost_race_with_the_reconciler_leaves_its_phase_alone(world: World) -> None:
    world.add("dep-a")
    world.store.race["dep-a"] = Phase.STOPPING
    report = world.tick()
    assert report.conflicts == 1
    assert world.record("dep-a").status.phase is Phase.STOPPING
    assert len(world.store.list_samples("dep-a")) == 1  # the observation is still recorded


def test_handle_runs_monitor_ticks_and_ignores_other_purposes(world: World) -> None:
    world.add("dep-a")
    world.add("dep-b")
    tick = ReconcileTick(command_id=new_command_id(), issued_at=START, purpose="monitor", deployment_id="dep-b")
    world.clock.advance(60)
    summary = world.monitor.handle(tick)
    assert summary.startswith("probed 1,")
    assert world.record("dep-a").status.phase is Phase.BOOTING
    assert world.record("dep-b").status.phase is Phase.SERVING
    other = tick.model_copy(update={"purpose": "reconcile"})
    assert world.monitor.handle(other).startswith("ignored")


def test_samples_are_json_safe_for_firestore(world: World) -> None:
    world.add("dep-a")
    world.tick()
    sample = world.latest("dep-a")
    json.dumps(sample.model_dump(mode="json"), allow_nan=False)


def test_a_phase_change_to_an_alerting_phase_is_logged_in_the_shape_the_alert_matches(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    world.add("dep-a", phase=Phase.SERVING, health=HealthThresholds(stall_after_s=120, heal_after_s=600))
    world.replay.set("dep-a", metrics=with_values(BASE, running=3, generation_tokens=5000, iterations=900))
    with caplog.at_level("INFO", logger="tpuctl.monitor"):
        for _ in range(3):
            world.tick()
    changes = [r for r in caplog.records if getattr(r, "kind", None) == "deployment.phase_changed"]
    assert [(r.levelname, r.phase, r.deployment_id) for r in changes] == [  # type: ignore[attr-defined]
        ("WARNING", "STALLED", "dep-a")
    ]

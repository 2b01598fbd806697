"""The monitor keeping the node agent's TPU telemetry: the real probe over HTTP against a replay of real vLLM
0.32.0 answers, the embedded SQLite store and local bus, a manual clock, and the node's guest attributes in a
stateful stand-in of the TPU port (what the node agent's sampler writes). A fresh reading adds ``tpu_*`` SLIs to
the sample; a stale, forged or missing one adds nothing and never stops the tick."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from shared.adapters.clock import ManualClock
from shared.adapters.local_bus import LocalBus
from shared.adapters.sqlite_store import SqliteStateStore
from shared.adapters.vllm_probe import VllmProbe
from shared.domain.boot_progress import GuestAttribute
from shared.domain.engine_facts import EngineFacts, as_record
from shared.domain.engine_facts import encode as encode_facts
from shared.domain.models import (
    DeploymentRecord,
    DeploymentSpec,
    DeploymentStatus,
    MonitorSample,
    Phase,
    QueuedResourceState,
    ResourceRef,
    Tier,
)
from shared.domain.tpu_telemetry import ChipReading, TpuTelemetry, encode
from shared.services.monitor import Monitor, MonitorSettings
from tests.support.vllm_replay import ReplayVllm

START = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
ZONE, NODE = "us-east5-b", "gemma-a-g1-a0"
GIB = 1 << 30


@dataclass
class GuestAttributesTpu:
    """The one TPU port call the monitor makes for a node: its guest attributes, as the VM wrote them."""

    values: dict[tuple[str, int], str] = field(default_factory=dict)
    reads: int = 0
    nodes_read: list[str] = field(default_factory=list)

    def guest_attributes(self, zone: str, node_id: str, query_path: str) -> Sequence[GuestAttribute]:
        assert (zone, query_path) == (ZONE, "tpuctl/")
        self.reads += 1
        self.nodes_read.append(node_id)
        return [GuestAttribute("tpuctl", key, value, worker) for (key, worker), value in self.values.items()]


@dataclass
class World:
    store: SqliteStateStore
    clock: ManualClock
    tpu: GuestAttributesTpu
    monitor: Monitor

    def sampled(self, *chips: ChipReading, age_s: float = 20.0, worker: int = 0) -> None:
        at = self.clock.now() + timedelta(seconds=60.0 - age_s)  # as of the next tick, a minute on
        self.tpu.values[("telemetry", worker)] = encode(TpuTelemetry(sampled_at=at, chips=chips))

    def tick(self) -> MonitorSample:
        self.clock.advance(60.0)
        self.monitor.tick()
        (latest, *_) = self.store.list_samples("gemma-a", since=START, limit=1)
        return latest


def serving(name: str, node_name: str, endpoint: str) -> DeploymentRecord:
    """A SERVING deployment on one ACTIVE node of its generation: the node the monitor reads telemetry from."""
    spec = DeploymentSpec(deployment_id=name, model="tiny-llama", accelerator="v6e-4", zones=(ZONE,))
    node = ResourceRef(
        name=node_name, zone=ZONE, tier=Tier.SPOT, generation=1, attempt=0, state=QueuedResourceState.ACTIVE
    )
    status = DeploymentStatus(phase=Phase.SERVING, phase_since=START, endpoint=endpoint, resources=[node])
    return DeploymentRecord(deployment_id=name, spec=spec, status=status, created_at=START, updated_at=START)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    clock = ManualClock(START)
    store = SqliteStateStore(tmp_path / "state.db")
    bus = LocalBus(tmp_path / "bus.db", clock=clock)
    for topic in ("tpuctl-commands", "tpuctl-events", "tpuctl-ticks"):
        bus.ensure_topic(topic)
    tpu = GuestAttributesTpu()
    with ReplayVllm() as replay:
        store.put_deployment(serving("gemma-a", NODE, replay.base_url("gemma-a")), expected_version=None)
        probe = VllmProbe(timeout_s=1.0, connect_timeout_s=0.5)
        monitor = Monitor(store, probe, bus, clock, MonitorSettings(telemetry_max_age_s=180.0), tpu=tpu)  # type: ignore[arg-type]
        yield World(store, clock, tpu, monitor)
    bus.close()
    store.close()


def chip(index: int, used_gib: float, duty: float | None = 50.0) -> ChipReading:
    return ChipReading(index, int(used_gib * GIB), 32 * GIB, duty, 30.0 if duty is not None else None)


def test_a_fresh_reading_of_every_chip_is_kept_in_the_sample(world: World) -> None:
    world.sampled(chip(0, 16.0, duty=40.0), chip(1, 28.8, duty=80.0))
    slis = world.tick().slis
    assert slis["tpu_hbm_used_frac_max"] == 0.9
    assert slis["tpu_hbm_used_gib"] == pytest.approx(44.8, abs=0.01)
    assert (slis["tpu_duty_cycle_pct"], slis["tpu_hbm_bandwidth_pct"]) == (60.0, 30.0)
    assert world.tpu.reads == 1  # one read of the node per tick, as for a booting node
    assert world.store.get_deployment("gemma-a").status.phase is Phase.SERVING  # type: ignore[union-attr]


def test_workers_of_a_multi_host_slice_count_as_one_node(world: World) -> None:
    world.sampled(chip(0, 8.0), worker=0)
    world.sampled(chip(0, 24.0), worker=1)
    slis = world.tick().slis
    assert slis["tpu_hbm_used_gib"] == pytest.approx(32.0) and slis["tpu_hbm_used_frac_max"] == 0.75


def test_a_stale_reading_is_left_out(world: World) -> None:
    world.sampled(chip(0, 30.0), age_s=600.0)  # the agent died ten minutes ago
    assert not [name for name in world.tick().slis if name.startswith("tpu_")]


@pytest.mark.parametrize(
    "value",
    [
        "not json",
        '{"at": "2026-12-05T12:01:00+00:00", "chips": [{"chip": 0, "hbm_used": 99, "hbm_total": 10}]}',
        '{"at": "2026-12-05T12:01:00+00:00", "chips": [{"chip": 0, "hbm_used": 1, "hbm_total": 10, "duty_pct": 900}]}',
        '{"at": "2026-12-05T12:01:00", "chips": []}',
        "[" * 100_000,
    ],
)
def test_a_forged_or_malformed_reading_adds_nothing_and_the_tick_goes_on(world: World, value: str) -> None:
    world.tpu.values[("telemetry", 0)] = value
    sample = world.tick()
    assert sample.probe == "ok" and not [name for name in sample.slis if name.startswith("tpu_")]


def test_without_a_reading_the_sample_is_as_before(world: World) -> None:
    sample = world.tick()
    assert sample.probe == "ok" and "health_latency_s" in sample.slis
    assert not [name for name in sample.slis if name.startswith("tpu_")]


def test_over_the_cap_serving_nodes_take_turns_and_each_is_read_once_per_period(tmp_path: Path) -> None:
    clock = ManualClock(START)
    store = SqliteStateStore(tmp_path / "fleet.db")
    bus = LocalBus(tmp_path / "fleet-bus.db", clock=clock)
    for topic in ("tpuctl-commands", "tpuctl-events", "tpuctl-ticks"):
        bus.ensure_topic(topic)
    tpu = GuestAttributesTpu()
    with ReplayVllm() as replay:
        for name in ("dep-a", "dep-b", "dep-c"):
            store.put_deployment(serving(name, f"{name}-node", replay.base_url(name)), expected_version=None)
        settings = MonitorSettings(telemetry_reads_per_tick=1)
        monitor = Monitor(store, VllmProbe(timeout_s=1.0), bus, clock, settings, tpu=tpu)  # type: ignore[arg-type]
        for _ in range(3):  # one period: three nodes over a cap of one
            clock.advance(60.0)
            monitor.tick()
    bus.close()
    store.close()
    assert sorted(tpu.nodes_read) == ["dep-a-node", "dep-b-node", "dep-c-node"]


def test_what_vllm_printed_at_start_up_is_kept_and_diffed_against_the_plan(world: World) -> None:
    """The agent's ``tpuctl/engine`` comes with the same read: kept on the status, and a context shorter than the
    plan's and a refused attention back end become the effective-config finding, which stands on a tick that
    reads no facts (the node's turn did not come, or the attribute is gone)."""
    facts = EngineFacts(max_model_len=256, attention_backends=("TORCH_SDPA",), refused_backends=("FLASH_ATTN",))
    world.tpu.values[("engine", 0)] = encode_facts(facts)
    world.tick()
    status = world.store.get_deployment("gemma-a").status  # type: ignore[union-attr]
    assert status.engine == as_record(facts)
    (finding,) = [text for text in status.findings if text.startswith("effective config:")]
    assert "planned a 512-token context, vLLM serves 256" in finding
    assert "could not use the FLASH_ATTN back end and runs TORCH_SDPA" in finding
    del world.tpu.values[("engine", 0)]
    world.tick()
    again = world.store.get_deployment("gemma-a").status  # type: ignore[union-attr]
    assert again.engine == as_record(facts) and finding in again.findings


def test_forged_start_up_facts_change_nothing(world: World) -> None:
    world.tpu.values[("engine", 0)] = '{"max_model_len": "512; DROP", "quantization": "\\u001b[31m"}'
    world.tick()
    status = world.store.get_deployment("gemma-a").status  # type: ignore[union-attr]
    assert status.engine is None and not [text for text in status.findings if text.startswith("effective config")]

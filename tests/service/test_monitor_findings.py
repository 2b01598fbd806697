"""The monitor's saturation warning end to end: the real probe over HTTP against a replay of real vLLM 0.32.0
answers (edited gauges), the embedded SQLite store and local bus, a manual clock; then the gateway's deployment
view and ``tpuctl status`` read what the monitor stored."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from mcp_client_gateway.cli import EXIT_OK, run
from mcp_client_gateway.core import GatewayCore, GatewayPorts
from shared.adapters.clock import ManualClock
from shared.adapters.file_secrets import FileSecretStore
from shared.adapters.local_bus import LocalBus
from shared.adapters.local_logs import JsonLinesLogReader
from shared.adapters.openai_client import OpenAiCompatibleClient
from shared.adapters.sqlite_store import SqliteStateStore
from shared.adapters.vllm_probe import VllmProbe
from shared.config import Settings
from shared.domain.models import (
    FINDING_LOG_KIND,
    DeploymentRecord,
    DeploymentSpec,
    DeploymentStatus,
    Phase,
    ServingOptions,
)
from shared.services.monitor import Monitor, MonitorSettings
from tests.support.vllm_replay import ReplayVllm, real_metrics_text, with_values

START = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
BASE = real_metrics_text()


def tight(step: int) -> str:
    """Busy and making progress (tokens and engine steps move each tick), KV 88% full: under
    ``kv_cache_usage_max`` (0.9), so the phase model still calls it SERVING."""
    return with_values(
        BASE, kv_cache_usage=0.88, running=3, generation_tokens=3248 + 500 * step, iterations=542 + 100 * step
    )


WARNING_TEXT = "saturation: headroom 12% (under 15%) for 3 sample(s); KV cache 88% full, 3/256 running"


@dataclass
class World:
    store: SqliteStateStore
    clock: ManualClock
    replay: ReplayVllm
    monitor: Monitor
    ports: GatewayPorts
    steps: int = 0

    def add(self, name: str, model: str = "tiny-llama", accelerator: str = "v6e-1", kv: str = "auto") -> None:
        now = self.clock.now()
        spec = DeploymentSpec(
            deployment_id=name,
            model=model,
            accelerator=accelerator,
            zones=("us-east5-b",),
            serving=ServingOptions(kv_cache_dtype=kv),
        )
        record = DeploymentRecord(
            deployment_id=name,
            spec=spec,
            status=DeploymentStatus(phase=Phase.SERVING, phase_since=now, endpoint=self.replay.base_url(name)),
            created_at=now,
            updated_at=now,
        )
        self.store.put_deployment(record, expected_version=None)

    def tick(self, name: str | None = None) -> None:
        """One minute on; ``name``'s server first moves on by one busy, KV-tight step."""
        if name is not None:
            self.steps += 1
            self.replay.set(name, metrics=tight(self.steps))
        self.clock.advance(60.0)
        self.monitor.tick()

    def record(self, name: str) -> DeploymentRecord:
        found = self.store.get_deployment(name)
        assert found is not None
        return found


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    clock = ManualClock(START)
    store = SqliteStateStore(tmp_path / "state.db")
    settings = Settings(backend="local", data_dir=tmp_path / "var")
    bus = LocalBus(tmp_path / "bus.db", clock=clock)
    for topic in (settings.topic_commands, settings.topic_events, settings.topic_ticks):
        bus.ensure_topic(topic)
    monitor_settings = MonitorSettings(
        topic_commands=settings.topic_commands, topic_events=settings.topic_events, topic_ticks=settings.topic_ticks
    )
    (tmp_path / "logs").mkdir()
    ports = GatewayPorts(
        settings=settings,
        store=store,
        bus=bus,
        secrets=FileSecretStore(tmp_path / "secrets"),
        clock=clock,
        logs=JsonLinesLogReader(tmp_path / "logs"),
        model_client=OpenAiCompatibleClient(),
    )
    with ReplayVllm() as replay:
        monitor = Monitor(store, VllmProbe(timeout_s=1.0, connect_timeout_s=0.5), bus, clock, monitor_settings)
        yield World(store, clock, replay, monitor, ports)
    bus.close()
    store.close()


def findings_logged(caplog: pytest.LogCaptureFixture, tag: str = "saturation") -> list[tuple[str, str, str]]:
    return [
        (r.levelname, r.deployment_id, r.finding)  # type: ignore[attr-defined]
        for r in caplog.records
        if getattr(r, "kind", None) == FINDING_LOG_KIND and getattr(r, "finding", None) == tag
    ]


def tagged(findings: list[str], tag: str = "saturation") -> list[str]:
    """The findings of one kind (the CPU stand-in also allocates far fewer KV tokens than a TPU would)."""
    return [text for text in findings if text.partition(":")[0] == tag]


def test_short_headroom_for_three_ticks_is_a_finding_logged_once_then_cleared(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    world.add("dep-a")
    with caplog.at_level(logging.INFO, logger="tpuctl.monitor"):
        world.tick("dep-a")
        world.tick("dep-a")
        assert tagged(world.record("dep-a").status.findings) == []
        world.tick("dep-a")
        saturated = world.record("dep-a")
        assert tagged(saturated.status.findings) == [WARNING_TEXT]
        assert saturated.status.phase is Phase.SERVING  # a warning before the phase model calls it DEGRADED
        assert saturated.status.slis["headroom"] == pytest.approx(0.12)
        world.tick("dep-a")
        world.tick("dep-a")
        assert world.record("dep-a").version == saturated.version  # the same finding: no record rewrite per tick
        assert findings_logged(caplog) == [("WARNING", "dep-a", "saturation")]

        world.replay.set("dep-a", metrics=with_values(BASE, kv_cache_usage=0.3, running=3))
        world.tick()
    recovered = world.record("dep-a")
    assert tagged(recovered.status.findings) == []
    assert recovered.status.slis["headroom"] == pytest.approx(0.7)
    assert any("cleared: saturation" in r.getMessage() for r in caplog.records if r.levelname == "INFO")
    assert findings_logged(caplog) == [("WARNING", "dep-a", "saturation")]


def test_every_sample_carries_the_headroom_sli(world: World) -> None:
    world.add("dep-a")
    world.replay.set("dep-a", metrics=with_values(BASE, kv_cache_usage=0.25, running=192))
    world.tick()
    (sample,) = world.store.list_samples("dep-a", limit=5)
    assert sample.slis["headroom"] == pytest.approx(0.25)  # 192 of 256 running is the larger pressure


def test_the_deployment_view_and_tpuctl_status_show_the_finding(world: World) -> None:
    world.add("dep-a")
    for _ in range(3):
        world.tick("dep-a")
    detail = GatewayCore(world.ports).get_deployment("dep-a")
    assert tagged(detail.findings) == [WARNING_TEXT]
    assert detail.slis["headroom"] == pytest.approx(0.12)
    stdout = io.StringIO()
    assert run(["status", "dep-a"], ports=world.ports, stdout=stdout, stderr=io.StringIO()) == EXIT_OK
    text = " ".join(stdout.getvalue().split())
    assert "finding" in text and "headroom 12%" in text and "KV cache 88% full" in text


FP8_TEXT = "effective config: planned fp8 KV cache, vLLM runs auto (the weights' dtype): about 2x fewer tokens"


def test_a_kv_dtype_the_plan_did_not_get_is_a_finding_kept_through_a_blind_scrape_and_cleared_when_fixed(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    world.add("dep-b", model="gemma-4-31b", accelerator="v6e-4", kv="fp8")
    with caplog.at_level(logging.INFO, logger="tpuctl.monitor"):
        world.tick()
        assert world.record("dep-b").status.findings == [FP8_TEXT]
        blind = "\n".join(line for line in BASE.splitlines() if "cache_config_info" not in line) + "\n"
        world.replay.set("dep-b", metrics=blind)
        world.tick()
        assert world.record("dep-b").status.findings == [FP8_TEXT], "a scrape without the config clears nothing"
        assert findings_logged(caplog, "effective config") == [("WARNING", "dep-b", "effective config")]
        world.replay.set("dep-b", metrics=BASE.replace('cache_dtype="auto"', 'cache_dtype="fp8_e4m3"'))
        world.tick()
    assert world.record("dep-b").status.findings == []
    assert GatewayCore(world.ports).get_deployment("dep-b").findings == []

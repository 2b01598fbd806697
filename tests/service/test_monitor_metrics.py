"""The monitor's SLIs written as Cloud Monitoring custom metrics: the real google-cloud-monitoring client
(``CloudMonitoringWriter``) against the local gRPC stand-in of ``MetricService`` (``localcloud.monitoring_api``),
which refuses what the real API refuses; the embedded default's JSON-lines file beside it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcloud.monitoring_api import MonitoringStandIn
from shared.adapters.cloud_monitoring import CloudMonitoringWriter
from shared.adapters.local_metrics import JsonLinesMetricWriter
from shared.domain.models import Phase, Tier
from shared.domain.sli_metrics import METRIC_PREFIX
from tests.service.test_monitor import BASE, World, monitor_world
from tests.support.vllm_replay import with_values
from tests.support.vllm_server import free_loopback_port

PROJECT = "tpuctl-test"


@pytest.fixture
def stand_in() -> Iterator[MonitoringStandIn]:
    server = MonitoringStandIn(PROJECT)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def cloud(tmp_path: Path, stand_in: MonitoringStandIn) -> Iterator[World]:
    with monitor_world(tmp_path, CloudMonitoringWriter(PROJECT, endpoint=stand_in.endpoint)) as world:
        yield world


def _granted(world: World, name: str) -> None:
    record = world.record(name)
    status = record.status.model_copy(update={"zone": "us-east5-b", "tier": Tier.SPOT})
    world.store.put_deployment(record.model_copy(update={"status": status}), expected_version=record.version)


def test_a_serving_deployment_s_slis_phase_and_price_reach_cloud_monitoring(
    cloud: World, stand_in: MonitoringStandIn
) -> None:
    cloud.add("dep-a", phase=Phase.SERVING)
    _granted(cloud, "dep-a")
    cloud.tick()
    cloud.replay.set("dep-a", metrics=with_values(BASE, generation_tokens=3248 + 1200, success_length=104 + 30))
    report = cloud.tick(advance_s=60)

    tokens = stand_in.series(METRIC_PREFIX + "generation_tokens_per_s")
    assert [point.value for point in tokens] == [pytest.approx(20.0)]
    assert tokens[0].at == cloud.clock.now() and tokens[0].resource_type == "global"
    assert tokens[0].labels == {
        "deployment_id": "dep-a",
        "model": "tiny-llama",
        "accelerator": "v6e-1",
        "zone": "us-east5-b",
        "tier": "spot",
    }
    assert [p.value for p in stand_in.series(METRIC_PREFIX + "serving")] == [1.0, 1.0]
    assert {p.labels["phase"] for p in stand_in.series(METRIC_PREFIX + "phase")} == {"SERVING"}
    price = stand_in.series(METRIC_PREFIX + "usd_per_hour")
    assert len(price) == 2 and 0 < price[0].value < 10, "one v6e chip at the spot list price"
    assert report.metric_failures == 0 and report.metric_points == len(
        [p for p in stand_in.points if p.at == cloud.clock.now()]
    )
    assert stand_in.refusals == []


def test_a_redelivered_tick_writes_no_second_point(cloud: World, stand_in: MonitoringStandIn) -> None:
    cloud.add("dep-a", phase=Phase.SERVING)
    cloud.tick()
    written = len(stand_in.points)
    again = cloud.monitor.tick()  # the same instant: Pub/Sub delivered the Scheduler tick twice
    assert again.metric_points == 0 and len(stand_in.points) == written > 0
    assert stand_in.refusals == [], "nothing was sent for the API to refuse as written too often"


def test_points_the_api_refuses_leave_the_tick_and_its_samples_whole(cloud: World, stand_in: MonitoringStandIn) -> None:
    cloud.add("dep-a", phase=Phase.SERVING)
    stand_in.project = "another-project"  # the API refuses every series written to a project it does not serve
    report = cloud.tick()
    assert report.metric_failures == 1 and report.metric_points == 0 and stand_in.points == []
    assert "expected projects/another-project" in stand_in.refusals[-1]
    assert report.samples_written == 1 and len(cloud.store.list_samples("dep-a")) == 1
    assert cloud.record("dep-a").status.phase is Phase.SERVING


def test_an_unreachable_monitoring_api_is_counted_not_fatal(tmp_path: Path) -> None:
    endpoint = f"127.0.0.1:{free_loopback_port()}"  # nothing listens: connections are refused
    with monitor_world(tmp_path, CloudMonitoringWriter(PROJECT, endpoint=endpoint)) as world:
        world.add("dep-a", phase=Phase.SERVING)
        report = world.tick()
        assert report.metric_failures == 1 and report.samples_written == 1
        assert world.record("dep-a").status.phase is Phase.SERVING


def test_the_embedded_default_keeps_the_points_as_json_lines(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    with monitor_world(tmp_path, JsonLinesMetricWriter(path)) as world:
        world.add("dep-a", phase=Phase.SERVING)
        report = world.tick()
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert len(lines) == report.metric_points > 0
    serving = [line for line in lines if line["metric"] == METRIC_PREFIX + "serving"]
    assert serving == [
        {
            "metric": METRIC_PREFIX + "serving",
            "labels": {"deployment_id": "dep-a", "model": "tiny-llama", "accelerator": "v6e-1", "zone": "", "tier": ""},
            "value": 1.0,
            "at": world.clock.now().isoformat(),
        }
    ]
    assert not [line for line in lines if line["metric"] == METRIC_PREFIX + "usd_per_hour"], "no grant, no price"


def test_the_json_lines_file_rolls_over_instead_of_growing_without_bound(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    with monitor_world(tmp_path, JsonLinesMetricWriter(path, max_bytes=200)) as world:
        world.add("dep-a", phase=Phase.SERVING)
        world.tick()
        first = path.read_text(encoding="utf-8")
        world.tick(advance_s=60)
    assert path.with_name("metrics.jsonl.1").read_text(encoding="utf-8") == first
    assert path.read_text(encoding="utf-8") != first

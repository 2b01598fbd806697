"""The monitor's SLIs as custom metrics: which points a sample gives, their labels, and how they are batched."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest

from shared.adapters.cloud_monitoring import MAX_SERIES_PER_REQUEST, batches
from shared.domain.errors import InvalidMessage
from shared.domain.models import DeploymentRecord, DeploymentSpec, DeploymentStatus, MonitorSample, Phase, Tier
from shared.domain.sli_metrics import (
    DEPLOYMENT_LABELS,
    METRIC_PREFIX,
    SLI_METRICS,
    MetricPoint,
    descriptor_rows,
    metric_type,
    points_for,
)

AT = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def _record(
    phase: Phase = Phase.SERVING, *, zone: str | None = "us-east5-b", tier: Tier | None = Tier.SPOT
) -> DeploymentRecord:
    spec = DeploymentSpec(deployment_id="dep-a", model="gemma-4-12b", accelerator="v6e-4", zones=("us-east5-b",))
    status = DeploymentStatus(phase=phase, phase_since=AT, zone=zone, tier=tier)
    return DeploymentRecord(deployment_id="dep-a", spec=spec, status=status, created_at=AT, updated_at=AT)


def _sample(phase: Phase = Phase.SERVING, **slis: float) -> MonitorSample:
    return MonitorSample(deployment_id="dep-a", taken_at=AT, phase=phase, slis=slis)


def _by_name(points: list[MetricPoint]) -> dict[str, MetricPoint]:
    return {point.metric_type.removeprefix(METRIC_PREFIX): point for point in points}


def test_each_sli_in_the_table_becomes_one_labelled_point_and_others_are_left_out() -> None:
    points = _by_name(points_for(_sample(ttft_p90_s=0.8, waiting=3.0, interval_s=60.0), _record()))
    assert points["ttft_p90_s"].value == 0.8 and points["queue_waiting"].value == 3.0
    assert "interval_s" not in points, "only the table's SLIs are metrics"
    assert points["ttft_p90_s"].labels == {
        "deployment_id": "dep-a",
        "model": "gemma-4-12b",
        "accelerator": "v6e-4",
        "zone": "us-east5-b",
        "tier": "spot",
    }
    assert all(point.at == AT for point in points.values())


def test_a_non_finite_value_is_never_sent() -> None:
    points = _by_name(points_for(_sample(ttft_p90_s=math.inf, itl_p90_s=math.nan, kv_cache_usage=0.5), _record()))
    assert "ttft_p90_s" not in points and "itl_p90_s" not in points and points["kv_cache_usage"].value == 0.5


def test_serving_phase_and_price_follow_the_deployment() -> None:
    serving = _by_name(points_for(_sample(), _record()))
    assert serving["serving"].value == 1.0
    assert serving["phase"].labels["phase"] == "SERVING" and serving["phase"].value == 1.0
    assert set(serving["phase"].labels) == {*DEPLOYMENT_LABELS, "phase"}
    assert serving["usd_per_hour"].value > 0, "four v6e chips at the spot list price"

    stalled = _by_name(points_for(_sample(Phase.STALLED), _record(Phase.STALLED)))
    assert stalled["serving"].value == 0.0 and stalled["phase"].labels["phase"] == "STALLED"
    assert stalled["usd_per_hour"].value == serving["usd_per_hour"].value, "a stalled slice bills all the same"


@pytest.mark.parametrize(
    ("phase", "zone", "tier"),
    [(Phase.SEARCHING, None, None), (Phase.STOPPED, "us-east5-b", Tier.SPOT), (Phase.SERVING, "mars-1-a", Tier.SPOT)],
)
def test_no_price_point_without_a_billed_slice_or_a_known_price(
    phase: Phase, zone: str | None, tier: Tier | None
) -> None:
    points = _by_name(points_for(_sample(phase), _record(phase, zone=zone, tier=tier)))
    assert "usd_per_hour" not in points
    assert points["phase"].labels["zone"] == (zone or "")


def test_only_tpuctl_s_own_metrics_have_a_type() -> None:
    assert metric_type("ttft_p90_s") == "custom.googleapis.com/tpuctl/ttft_p90_s"
    with pytest.raises(InvalidMessage, match="metric"):
        metric_type("cpu_usage")


def test_descriptors_declare_every_metric_with_at_most_ten_labels_and_a_ucum_unit() -> None:
    rows = {str(row["name"]): row for row in descriptor_rows()}
    assert {metric.name for metric in SLI_METRICS} | {"serving", "phase", "usd_per_hour"} == set(rows)
    for name, row in rows.items():
        labels = row["labels"]
        assert isinstance(labels, list) and len(labels) <= 10, name
        assert row["type"] == METRIC_PREFIX + name
    assert rows["phase"]["labels"] == [*DEPLOYMENT_LABELS, "phase"]
    assert rows["usd_per_hour"]["unit"] == "{USD}/h"


def test_requests_hold_at_most_200_series_and_never_one_series_twice() -> None:
    many = [MetricPoint(METRIC_PREFIX + "serving", {"deployment_id": f"d-{i}"}, 1.0, AT) for i in range(450)]
    sizes = [len(batch) for batch in batches(many)]
    assert sizes == [MAX_SERIES_PER_REQUEST, MAX_SERIES_PER_REQUEST, 50]
    twice = [MetricPoint(METRIC_PREFIX + "serving", {"deployment_id": "d"}, value, AT) for value in (1.0, 0.0)]
    assert [[p.value for p in batch] for batch in batches(twice)] == [[1.0], [0.0]], "order kept, one per request"

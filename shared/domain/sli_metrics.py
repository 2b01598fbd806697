"""The monitor's SLIs as Cloud Monitoring custom metrics: which, named how, labelled with what.

One table (``SLI_METRICS``) says every metric the monitor writes; Terraform's dashboard and alert policies
(``terraform/modules/monitoring``) chart and alert on these names, and a test keeps the two equal. Every metric is
a DOUBLE gauge with the same five deployment labels (Cloud Monitoring allows ten per metric and refuses a point
whose labels are not the descriptor's), except ``phase``, which adds the phase as a sixth, so a chart can stack
deployments by phase over time. Label values come from our own record (ids that matched their patterns, enums),
never from text the VM sent; they are still cut to the API's 1,024 characters.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from shared.domain.cost import UnknownPrice, estimate_cost
from shared.domain.errors import InvalidMessage
from shared.domain.models import DeploymentRecord, MonitorSample, Phase

__all__ = [
    "DEPLOYMENT_LABELS",
    "METRIC_PREFIX",
    "SLI_METRICS",
    "MetricPoint",
    "SliMetric",
    "metric_type",
    "points_for",
]

METRIC_PREFIX = "custom.googleapis.com/tpuctl/"
DEPLOYMENT_LABELS = ("deployment_id", "model", "accelerator", "zone", "tier")
_LABEL_VALUE_MAX = 1024


@dataclass(frozen=True)
class SliMetric:
    """One custom metric: its short name (after ``METRIC_PREFIX``), the sample SLI it carries, its unit (UCUM)."""

    name: str
    sli: str
    unit: str
    description: str


SLI_METRICS: tuple[SliMetric, ...] = (
    SliMetric("ttft_p50_s", "ttft_p50_s", "s", "Time to first token, median over the monitor's interval."),
    SliMetric("ttft_p90_s", "ttft_p90_s", "s", "Time to first token, 90th percentile over the interval."),
    SliMetric("ttft_p99_s", "ttft_p99_s", "s", "Time to first token, 99th percentile over the interval."),
    SliMetric("itl_p50_s", "itl_p50_s", "s", "Inter-token latency, median over the interval."),
    SliMetric("itl_p90_s", "itl_p90_s", "s", "Inter-token latency, 90th percentile over the interval."),
    SliMetric("itl_p99_s", "itl_p99_s", "s", "Inter-token latency, 99th percentile over the interval."),
    SliMetric("e2e_p90_s", "e2e_p90_s", "s", "Request latency end to end, 90th percentile over the interval."),
    SliMetric("generation_tokens_per_s", "generation_tokens_per_s", "1/s", "Output tokens per second."),
    SliMetric("prompt_tokens_per_s", "prompt_tokens_per_s", "1/s", "Prompt tokens read per second."),
    SliMetric("requests_per_s", "requests_per_s", "1/s", "Requests finished per second."),
    SliMetric("error_share", "error_share", "1", "Share of finished requests that ended in error or abort."),
    SliMetric("kv_cache_usage", "kv_cache_usage", "1", "Share of the KV cache in use."),
    SliMetric("queue_waiting", "waiting", "1", "Requests waiting for a slot."),
    SliMetric("queue_running", "running", "1", "Requests running."),
    SliMetric("headroom", "headroom", "1", "1 - the larger of KV use and running/max concurrency."),
    SliMetric("health_latency_s", "health_latency_s", "s", "Latency of vLLM's /health answer."),
    SliMetric("tpu_duty_cycle_pct", "tpu_duty_cycle_pct", "%", "TPU duty cycle, mean over chips."),
    SliMetric("tpu_hbm_used_frac_max", "tpu_hbm_used_frac_max", "1", "HBM in use, the fullest chip."),
)
# Not from the sample's SLIs: whether the deployment serves, its phase and what it costs per hour.
SERVING_METRIC = SliMetric("serving", "", "1", "1 while the deployment is SERVING, else 0.")
PHASE_METRIC = SliMetric("phase", "", "1", "1, labelled with the deployment's phase (stack by phase over time).")
COST_METRIC = SliMetric("usd_per_hour", "", "{USD}/h", "List price per hour of the deployment's slice and tier.")
ALL_METRICS: tuple[SliMetric, ...] = (*SLI_METRICS, SERVING_METRIC, PHASE_METRIC, COST_METRIC)
# A slice bills from the moment it is granted until it is gone: every phase with a node.
_BILLED_PHASES = frozenset(
    {Phase.PROVISIONING, Phase.BOOTING, Phase.COMPILING, Phase.SERVING, Phase.DEGRADED, Phase.STALLED, Phase.DOWN}
    | {Phase.STOPPING}
)


@dataclass(frozen=True)
class MetricPoint:
    """One gauge point: a full metric type, its labels, the value and when it was measured."""

    metric_type: str
    labels: Mapping[str, str]
    value: float
    at: datetime


def metric_type(name: str) -> str:
    """``custom.googleapis.com/tpuctl/<name>`` for a name in the table; anything else is a programming error."""
    if name not in {metric.name for metric in ALL_METRICS}:
        raise InvalidMessage("metric", f"{name[:60]!r} is not one of tpuctl's custom metrics", "see SLI_METRICS")
    return METRIC_PREFIX + name


def points_for(sample: MonitorSample, record: DeploymentRecord) -> list[MetricPoint]:
    """The points one monitor sample gives: each finite SLI in the table, serving, phase and the hourly price."""
    labels = _labels(record)
    at = sample.taken_at
    points = [
        MetricPoint(METRIC_PREFIX + metric.name, labels, float(sample.slis[metric.sli]), at)
        for metric in SLI_METRICS
        if metric.sli in sample.slis and math.isfinite(sample.slis[metric.sli])
    ]
    points.append(MetricPoint(METRIC_PREFIX + SERVING_METRIC.name, labels, float(sample.phase is Phase.SERVING), at))
    points.append(MetricPoint(METRIC_PREFIX + PHASE_METRIC.name, {**labels, "phase": sample.phase.value}, 1.0, at))
    hourly = _usd_per_hour(record, sample.phase)
    if hourly is not None:
        points.append(MetricPoint(METRIC_PREFIX + COST_METRIC.name, labels, hourly, at))
    return points


def _labels(record: DeploymentRecord) -> dict[str, str]:
    status = record.status
    values = {
        "deployment_id": record.deployment_id,
        "model": str(record.spec.model),
        "accelerator": str(record.spec.accelerator),
        "zone": status.zone or "",
        "tier": status.tier.value if status.tier is not None else "",
    }
    return {key: values[key][:_LABEL_VALUE_MAX] for key in DEPLOYMENT_LABELS}


def _usd_per_hour(record: DeploymentRecord, phase: Phase) -> float | None:
    """The slice's list price while it is billed; None before a zone and tier are granted or off the table."""
    status = record.status
    if phase not in _BILLED_PHASES or status.zone is None or status.tier is None:
        return None
    try:
        return round(estimate_cost(str(record.spec.accelerator), status.zone, status.tier).usd_per_hour, 4)
    except (UnknownPrice, InvalidMessage):
        return None


def descriptor_rows() -> list[dict[str, object]]:
    """Every metric as Terraform declares it (``terraform/modules/monitoring/sli_metrics.json``, rendered by
    ``scripts/render_sli_metrics.py``): type, unit, description and label keys."""
    rows: list[dict[str, object]] = []
    for metric in ALL_METRICS:
        labels = [*DEPLOYMENT_LABELS, "phase"] if metric is PHASE_METRIC else list(DEPLOYMENT_LABELS)
        rows.append(
            {
                "name": metric.name,
                "type": METRIC_PREFIX + metric.name,
                "unit": metric.unit,
                "description": metric.description,
                "labels": labels,
            }
        )
    return rows

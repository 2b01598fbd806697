"""Headroom and the saturation warning (shared.domain.saturation), over the real vLLM capture and edited copies."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from shared.adapters.vllm_probe import parse_metrics
from shared.domain.catalog import preset
from shared.domain.models import DeploymentSpec, HealthThresholds, ServingOptions
from shared.domain.saturation import HEADROOM_SLI, Saturation, max_running, measure, saturation_finding
from tests.support.vllm_replay import real_metrics_text, with_values

IDLE = real_metrics_text()
AFTER_LOAD = real_metrics_text("real_vllm_metrics_after_load.txt")


def gauges(text: str) -> Mapping[str, float]:
    return parse_metrics(text).gauges


def spec(**serving: int) -> DeploymentSpec:
    return DeploymentSpec(
        deployment_id="dep-a",
        model="tiny-llama",
        accelerator="v6e-1",
        zones=("us-east5-b",),
        serving=ServingOptions(**serving),
    )


def test_max_running_is_the_specs_max_num_seqs_else_the_presets_default() -> None:
    assert max_running(spec(max_num_seqs=64)) == 64
    assert max_running(spec()) == preset("tiny-llama").default_max_num_seqs == 256


@pytest.mark.parametrize(
    ("text", "limit", "headroom", "kv", "running", "waiting"),
    [
        pytest.param(IDLE, 256, 1.0, 0.0, 0.0, 0.0, id="real idle capture: all room"),
        pytest.param(AFTER_LOAD, 256, 1.0, 0.0, 0.0, 0.0, id="real capture after load: drained"),
        pytest.param(with_values(IDLE, kv_cache_usage=0.92, waiting=3), 256, 0.08, 0.92, 0.0, 3.0, id="KV full"),
        pytest.param(
            with_values(IDLE, kv_cache_usage=0.5, running=240), 256, 0.0625, 0.5, 240.0, 0.0, id="running near cap"
        ),
        pytest.param(with_values(IDLE, running=240), None, 1.0, 0.0, 240.0, 0.0, id="no cap: KV use only"),
        pytest.param(with_values(IDLE, kv_cache_usage=7.5), 256, 0.0, 1.0, 0.0, 0.0, id="hostile share clamped"),
        pytest.param(
            with_values(IDLE, kv_cache_usage=0.25, running=-40, waiting=-2), 256, 0.75, 0.25, None, 0.0,
            id="negative counts are missing",
        ),
        pytest.param(
            with_values(IDLE, kv_cache_usage=float("nan"), running=64), 256, 0.75, None, 64.0, 0.0,
            id="NaN share is missing",
        ),
    ],
)  # fmt: skip
def test_headroom_is_one_minus_the_larger_pressure(
    text: str, limit: int | None, headroom: float, kv: float | None, running: float | None, waiting: float
) -> None:
    room = measure(gauges(text), limit)
    assert room is not None
    assert room.headroom == pytest.approx(headroom)
    assert (room.kv_cache_usage, room.running, room.waiting) == (kv, running, waiting)


def test_no_headroom_without_either_pressure() -> None:
    assert measure({"waiting": 4.0}, 256) is None
    assert measure({"running": 4.0}, None) is None
    assert measure({"kv_cache_usage": float("inf"), "running": float("nan")}, 256) is None


THRESHOLDS = HealthThresholds()  # headroom under 15 % or requests waiting, for 3 samples in a row
SHORT = measure(gauges(with_values(IDLE, kv_cache_usage=0.92, waiting=3)), 256)
TIGHT = measure(gauges(with_values(IDLE, kv_cache_usage=0.88)), 256)  # still under kv_cache_usage_max (0.9)
QUEUED = measure(gauges(with_values(IDLE, kv_cache_usage=0.4, running=12, waiting=2)), 256)
ROOMY = measure(gauges(IDLE), 256)


@pytest.mark.parametrize(
    ("now", "history", "thresholds", "expected"),
    [
        pytest.param(
            SHORT, [{HEADROOM_SLI: 0.1}, {HEADROOM_SLI: 0.05}], THRESHOLDS,
            "saturation: headroom 8% (under 15%) for 3 sample(s); KV cache 92% full, 0/256 running, "
            "3 request(s) waiting",
            id="short of room for three samples",
        ),
        pytest.param(
            TIGHT, [{HEADROOM_SLI: 0.12}, {HEADROOM_SLI: 0.11}, {HEADROOM_SLI: 0.9}], THRESHOLDS,
            "saturation: headroom 12% (under 15%) for 3 sample(s); KV cache 88% full, 0/256 running",
            id="before the KV-saturation SLO: a warning, not a phase",
        ),
        pytest.param(
            QUEUED, [{HEADROOM_SLI: 0.6, "waiting": 1.0}, {HEADROOM_SLI: 0.7, "waiting": 5.0}], THRESHOLDS,
            "saturation: requests waiting for 3 sample(s), headroom 60%; KV cache 40% full, 12/256 running, "
            "2 request(s) waiting",
            id="requests waiting for three samples",
        ),
        pytest.param(SHORT, [{HEADROOM_SLI: 0.1}], THRESHOLDS, None, id="two samples are not enough"),
        pytest.param(
            SHORT, [{HEADROOM_SLI: 0.1}, {}, {HEADROOM_SLI: 0.1}], THRESHOLDS, None,
            id="a sample without headroom (no metrics) breaks the run",
        ),
        pytest.param(
            TIGHT, [{HEADROOM_SLI: 0.1}, {HEADROOM_SLI: 0.3}], THRESHOLDS, None, id="a roomy sample breaks the run"
        ),
        pytest.param(ROOMY, [{HEADROOM_SLI: 0.01}] * 5, THRESHOLDS, None, id="recovered now: cleared"),
        pytest.param(
            TIGHT, [], HealthThresholds(headroom_ticks=1), "saturation: headroom 12% (under 15%) for 1 sample(s); "
            "KV cache 88% full, 0/256 running", id="one tick configured",
        ),
        pytest.param(TIGHT, [{HEADROOM_SLI: 0.1}] * 2, HealthThresholds(headroom_min=0.1), None, id="lower bar"),
        pytest.param(None, [{HEADROOM_SLI: 0.0}] * 3, THRESHOLDS, None, id="no metrics this time"),
    ],
)  # fmt: skip
def test_the_warning_needs_headroom_ticks_samples_in_a_row(
    now: Saturation | None, history: list[dict[str, float]], thresholds: HealthThresholds, expected: str | None
) -> None:
    assert saturation_finding(now, history, thresholds) == expected


def test_hostile_history_values_count_as_not_short() -> None:
    hostile = [{HEADROOM_SLI: float("nan")}, {HEADROOM_SLI: -1.0}]
    assert saturation_finding(SHORT, hostile, THRESHOLDS) is None

"""The phase model: what a probe plus the history means, and when to heal."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

import pytest

from shared.domain.health import (
    EndpointCheck,
    HealthThresholds,
    HistoryPoint,
    PriorState,
    ProbeOutcome,
    ProbeResult,
    assess,
    healing_action,
    idle_for,
)
from shared.domain.metrics import IntervalStats, LatencySummary, MetricsSnapshot
from shared.domain.models import NodeState, Phase

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
T = HealthThresholds()
OK = EndpointCheck(ProbeOutcome.OK, 200, 0.01)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def snapshot(
    running: float = 0.0, generation: float = 100.0, iterations: float = 50.0, **gauges: float
) -> MetricsSnapshot:
    return MetricsSnapshot(
        counters={"generation_tokens": generation, "iterations": iterations},
        gauges={"running": running, "waiting": 0.0, "kv_cache_usage": 0.1, **gauges},
        success_by_reason={"length": 10.0},
    )


def serving(metrics: MetricsSnapshot | None = None, models: EndpointCheck = OK) -> ProbeResult:
    return ProbeResult(
        base_url="http://10.0.0.2:8000",
        health=OK,
        models=models,
        served_models=("tiny-llama",) if models.outcome is ProbeOutcome.OK else (),
        metrics=metrics if metrics is not None else snapshot(),
        metrics_check=OK,
    )


def no_answer(outcome: ProbeOutcome = ProbeOutcome.REFUSED, status: int | None = None) -> ProbeResult:
    return ProbeResult(base_url="http://10.0.0.2:8000", health=EndpointCheck(outcome, status, 0.001, outcome.value))


def interval(progress: float = 0.0, **latency: LatencySummary) -> IntervalStats:
    return IntervalStats(
        elapsed_s=60.0,
        reset=False,
        generation_tokens=progress,
        iterations=progress,
        latency=latency,
    )


def flat_history(seconds: Mapping[float, float], generation: float = 100.0) -> list[HistoryPoint]:
    """Points ``{age_s: running}`` with the same counters as now (newest first)."""
    return [
        HistoryPoint(taken_at=ago(age), answered=True, running=running, generation_tokens=generation, iterations=50.0)
        for age, running in sorted(seconds.items())
    ]


class TestNoAnswer:
    def test_refused_before_ever_serving_is_booting_and_keeps_its_start(self) -> None:
        prior = PriorState(Phase.BOOTING, phase_since=ago(600))
        result = assess(no_answer(), None, [], prior, NOW, T)
        assert result.phase is Phase.BOOTING
        assert result.since == ago(600)

    def test_the_boot_budget_ends_in_down(self) -> None:
        prior = PriorState(Phase.BOOTING, phase_since=ago(T.boot_budget_s + 1))
        assert assess(no_answer(), None, [], prior, NOW, T).phase is Phase.DOWN

    @pytest.mark.parametrize("outcome", [ProbeOutcome.REFUSED, ProbeOutcome.TIMEOUT, ProbeOutcome.ERROR])
    def test_no_answer_after_having_served_is_down(self, outcome: ProbeOutcome) -> None:
        prior = PriorState(Phase.SERVING, phase_since=ago(3600), serving_since=ago(3600))
        result = assess(no_answer(outcome), None, [], prior, NOW, T)
        assert result.phase is Phase.DOWN
        assert result.since == NOW
        assert "after having served" in result.reason

    def test_health_503_is_a_dead_engine(self) -> None:
        prior = PriorState(Phase.SERVING, phase_since=ago(60), serving_since=ago(60))
        result = assess(no_answer(ProbeOutcome.SERVER_ERROR, 503), None, [], prior, NOW, T)
        assert result.phase is Phase.DOWN
        assert "engine dead" in result.reason


class TestAnswering:
    def test_models_not_ready_is_compiling(self) -> None:
        models = EndpointCheck(ProbeOutcome.SERVER_ERROR, 503, 0.01, "/v1/models answered HTTP 503")
        result = assess(serving(models=models), None, [], PriorState(Phase.BOOTING, ago(30)), NOW, T)
        assert result.phase is Phase.COMPILING

    def test_a_rejected_api_key_is_degraded(self) -> None:
        models = EndpointCheck(ProbeOutcome.UNAUTHORIZED, 401, 0.01)
        result = assess(serving(models=models), None, [], PriorState(Phase.SERVING, ago(30)), NOW, T)
        assert result.phase is Phase.DEGRADED
        assert "api_key_rejected" in result.conditions

    def test_healthy_is_serving_and_keeps_its_since(self) -> None:
        result = assess(serving(), interval(progress=5), [], PriorState(Phase.SERVING, ago(900)), NOW, T)
        assert (result.phase, result.since) == (Phase.SERVING, ago(900))

    def test_missing_metrics_still_serve_but_say_so(self) -> None:
        result = assess(serving(metrics=MetricsSnapshot()), None, [], PriorState(Phase.BOOTING, ago(10)), NOW, T)
        assert result.phase is Phase.SERVING
        assert "metrics_missing" in result.conditions


class TestStall:
    def test_running_without_progress_for_the_window_is_stalled_though_health_is_200(self) -> None:
        history = flat_history({60: 2.0, 120: 2.0})
        result = assess(serving(snapshot(running=2)), interval(0), history, PriorState(Phase.SERVING), NOW, T)
        assert result.phase is Phase.STALLED
        assert "/health still answers 200" in result.reason

    def test_a_flat_period_shorter_than_the_window_is_not_a_stall(self) -> None:
        history = flat_history({60: 2.0})
        result = assess(serving(snapshot(running=2)), interval(0), history, PriorState(Phase.SERVING), NOW, T)
        assert result.phase is Phase.SERVING

    def test_progress_earlier_in_the_window_breaks_the_flat_run(self) -> None:
        history = [*flat_history({60: 2.0}), *flat_history({120: 2.0}, generation=90.0)]
        result = assess(serving(snapshot(running=2)), interval(0), history, PriorState(Phase.SERVING), NOW, T)
        assert result.phase is Phase.SERVING

    def test_idle_with_nothing_running_is_not_a_stall(self) -> None:
        history = flat_history({60: 0.0, 120: 0.0, 180: 0.0})
        result = assess(serving(snapshot(running=0)), interval(0), history, PriorState(Phase.SERVING), NOW, T)
        assert result.phase is Phase.SERVING

    def test_a_counter_reset_is_not_a_stall(self) -> None:
        history = flat_history({60: 2.0, 120: 2.0})
        reset = IntervalStats(elapsed_s=60.0, reset=True, generation_tokens=0.0, iterations=0.0)
        result = assess(serving(snapshot(running=2)), reset, history, PriorState(Phase.SERVING), NOW, T)
        assert result.phase is Phase.SERVING


class TestDegraded:
    def test_a_ttft_slo_breach_is_degraded(self) -> None:
        slow = LatencySummary(p50=1.0, p90=3.0, p99=5.0, mean=1.5, count=20)
        result = assess(serving(), interval(5, ttft=slow), [], PriorState(Phase.SERVING), NOW, T)
        assert result.phase is Phase.DEGRADED
        assert any(c.startswith("ttft p90 3.000 s") for c in result.conditions)

    def test_preemptions_are_degraded(self) -> None:
        stats = IntervalStats(elapsed_s=60, reset=False, generation_tokens=5, iterations=5, preemptions=3)
        result = assess(serving(), stats, [], PriorState(Phase.SERVING), NOW, T)
        assert result.phase is Phase.DEGRADED
        assert "3 preemption(s)" in result.reason

    @pytest.mark.parametrize(("held_s", "phase"), [(60.0, Phase.SERVING), (T.kv_saturated_after_s, Phase.DEGRADED)])
    def test_kv_saturation_must_last(self, held_s: float, phase: Phase) -> None:
        history = [HistoryPoint(taken_at=ago(held_s), answered=True, kv_cache_usage=0.95)]
        metrics = snapshot(running=1, kv_cache_usage=0.97)
        result = assess(serving(metrics), interval(5), history, PriorState(Phase.SERVING), NOW, T)
        assert result.phase is phase

    def test_queueing_for_the_window_is_degraded(self) -> None:
        history = [HistoryPoint(taken_at=ago(T.queued_after_s), answered=True, waiting=3)]
        metrics = snapshot(running=8, waiting=4.0)
        result = assess(serving(metrics), interval(5), history, PriorState(Phase.SERVING), NOW, T)
        assert result.phase is Phase.DEGRADED
        assert "4 request(s) queued" in result.reason

    def test_thresholds_come_from_the_spec(self) -> None:
        slow = LatencySummary(p50=1.0, p90=3.0, p99=5.0, mean=1.5, count=20)
        lenient = HealthThresholds(ttft_p90_max_s=10.0)
        result = assess(serving(), interval(5, ttft=slow), [], PriorState(Phase.SERVING), NOW, lenient)
        assert result.phase is Phase.SERVING


class TestHealing:
    @pytest.mark.parametrize(
        ("phase", "since_s", "nodes", "expected"),
        [
            (Phase.STALLED, T.heal_after_s, (), "restart"),
            (Phase.DOWN, T.heal_after_s + 1, (NodeState.READY,), "restart"),
            (Phase.DOWN, 10.0, (), None),
            (Phase.DOWN, 10.0, (NodeState.PREEMPTED,), "reprovision"),
            (Phase.DOWN, T.heal_after_s, (NodeState.TERMINATED,), "reprovision"),
            (Phase.SERVING, 9999.0, (NodeState.PREEMPTED,), None),
            (Phase.BOOTING, 9999.0, (), None),
        ],
    )
    def test_healing_action(
        self, phase: Phase, since_s: float, nodes: tuple[NodeState, ...], expected: str | None
    ) -> None:
        assert healing_action(phase, ago(since_s), NOW, T, nodes) == expected

    def test_idle_counts_from_the_last_request_or_from_serving_start(self) -> None:
        assert idle_for(ago(30), ago(600), NOW) == 30
        assert idle_for(None, ago(600), NOW) == 600
        assert idle_for(None, None, NOW) is None

    def test_thresholds_reject_nonsense_with_the_field_name(self) -> None:
        with pytest.raises(ValueError, match="kv_cache_usage_max"):
            HealthThresholds(kv_cache_usage_max=1.5)

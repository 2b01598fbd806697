"""Metric derivations: quantiles from bucket deltas, rates from counter deltas, restarts, renames, missing series."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.adapters.vllm_probe import parse_metrics
from shared.domain.metrics import (
    Histogram,
    MetricsSnapshot,
    derive_interval,
    histogram_quantile,
    is_restart,
    snapshot_from_samples,
)
from tests.support.vllm_replay import real_metrics_text

INF = math.inf
E0 = {"engine": "0", "model_name": "tiny-llama"}
E1 = {"engine": "1", "model_name": "tiny-llama"}
TTFT_BOUNDS = (0.01, 0.02, 0.04, 0.06, 0.08, 0.1, INF)


def hist_samples(
    family: str,
    bounds: tuple[float, ...],
    cumulative: tuple[float, ...],
    total: float,
    labels: Mapping[str, str] = E0,
) -> list[tuple[str, Mapping[str, str], float]]:
    out: list[tuple[str, Mapping[str, str], float]] = [
        (f"{family}_bucket", {**labels, "le": "+Inf" if math.isinf(b) else str(b)}, c)
        for b, c in zip(bounds, cumulative, strict=True)
    ]
    out += [(f"{family}_count", labels, cumulative[-1]), (f"{family}_sum", labels, total)]
    return out


def snap(
    generation: float = 0.0,
    prompt: float = 0.0,
    iterations: float = 0.0,
    length: float = 0.0,
    error: float = 0.0,
    ttft: tuple[float, ...] | None = None,
    started_at: float = 1000.0,
    extra: list[tuple[str, Mapping[str, str], float]] | None = None,
) -> MetricsSnapshot:
    samples: list[tuple[str, Mapping[str, str], float]] = [
        ("vllm:generation_tokens_total", E0, generation),
        ("vllm:prompt_tokens_total", E0, prompt),
        ("vllm:iteration_tokens_total_count", E0, iterations),
        ("vllm:request_success_total", {**E0, "finished_reason": "length"}, length),
        ("vllm:request_success_total", {**E0, "finished_reason": "error"}, error),
        ("vllm:num_requests_running", E0, 1.0),
        ("process_start_time_seconds", {}, started_at),
    ]
    if ttft is not None:
        samples += hist_samples("vllm:time_to_first_token_seconds", TTFT_BOUNDS, ttft, 0.5)
    samples += extra or []
    return snapshot_from_samples(samples)


class TestHistogramQuantile:
    @pytest.mark.parametrize(
        ("q", "cumulative", "expected"),
        [
            (0.5, (0, 10, 10, 10, 10, 10, 10), 0.015),  # all in (0.01, 0.02]: the middle of that bucket
            (0.5, (10, 10, 10, 10, 10, 10, 10), 0.005),  # the first bucket interpolates from 0
            (0.9, (0, 0, 5, 10, 10, 10, 10), 0.056),  # rank 9 of 10: 4/5 of the way through (0.04, 0.06]
            (0.99, (0, 0, 0, 0, 0, 0, 10), 0.1),  # everything above the last finite bound: that bound
            (0.5, (0, 0, 0, 0, 0, 0, 0), None),  # no observations: unknown, not zero
        ],
    )
    def test_matches_prometheus_linear_interpolation(
        self, q: float, cumulative: tuple[float, ...], expected: float | None
    ) -> None:
        result = histogram_quantile(q, TTFT_BOUNDS, cumulative)
        if expected is None:
            assert result is None
        else:
            assert result == pytest.approx(expected)

    def test_quantile_outside_zero_one_is_refused(self) -> None:
        with pytest.raises(ValueError, match=r"q: 1\.5"):
            histogram_quantile(1.5, TTFT_BOUNDS, (1, 1, 1, 1, 1, 1, 1))

    @given(
        counts=st.lists(st.integers(min_value=0, max_value=1000), min_size=7, max_size=7),
        q=st.floats(min_value=0.01, max_value=0.99),
    )
    def test_a_quantile_always_lies_within_the_finite_bounds(self, counts: list[int], q: float) -> None:
        cumulative = tuple(float(sum(counts[: i + 1])) for i in range(7))
        result = histogram_quantile(q, TTFT_BOUNDS, cumulative)
        if cumulative[-1] == 0:
            assert result is None
        else:
            assert result is not None and 0.0 <= result <= 0.1


class TestSnapshot:
    def test_engines_are_summed_and_kv_usage_takes_the_fullest_engine(self) -> None:
        snapshot = snapshot_from_samples(
            [
                ("vllm:generation_tokens_total", E0, 100.0),
                ("vllm:generation_tokens_total", E1, 50.0),
                ("vllm:num_requests_running", E0, 2.0),
                ("vllm:num_requests_running", E1, 3.0),
                ("vllm:kv_cache_usage_perc", E0, 0.2),
                ("vllm:kv_cache_usage_perc", E1, 0.7),
                *hist_samples("vllm:time_to_first_token_seconds", TTFT_BOUNDS, (1, 2, 2, 2, 2, 2, 2), 0.1),
                *hist_samples("vllm:time_to_first_token_seconds", TTFT_BOUNDS, (0, 1, 3, 3, 3, 3, 3), 0.1, E1),
            ]
        )
        assert snapshot.counters["generation_tokens"] == 150.0
        assert snapshot.gauges["running"] == 5.0
        assert snapshot.gauges["kv_cache_usage"] == 0.7
        assert snapshot.histograms["ttft"].cumulative == (1, 3, 5, 5, 5, 5, 5)
        assert snapshot.histograms["ttft"].count == 5

    def test_old_names_stand_in_only_when_the_new_ones_are_absent(self) -> None:
        old_only = snapshot_from_samples(
            [
                ("vllm:gpu_cache_usage_perc", E0, 0.4),
                ("vllm:gpu_prefix_cache_queries_total", E0, 10.0),
                *hist_samples("vllm:time_per_output_token_seconds", TTFT_BOUNDS, (1, 1, 1, 1, 1, 1, 1), 0.01),
            ]
        )
        assert old_only.gauges["kv_cache_usage"] == 0.4
        assert old_only.counters["prefix_cache_queries"] == 10.0
        assert "itl" in old_only.histograms
        assert set(old_only.legacy_names) == {
            "vllm:gpu_cache_usage_perc",
            "vllm:gpu_prefix_cache_queries_total",
            "vllm:time_per_output_token_seconds",
        }
        both = snapshot_from_samples([("vllm:gpu_cache_usage_perc", E0, 0.4), ("vllm:kv_cache_usage_perc", E0, 0.1)])
        assert both.gauges["kv_cache_usage"] == 0.1
        assert both.legacy_names == ()

    def test_a_missing_series_stays_missing_rather_than_zero(self) -> None:
        snapshot = snapshot_from_samples([("vllm:num_requests_running", E0, 0.0)])
        stats = derive_interval(snapshot, snapshot, 60.0)
        slis = stats.slis()
        assert "kv_cache_usage" not in slis
        assert "generation_tokens_per_s" not in slis
        assert slis["running"] == 0.0

    def test_without_vllm_series_the_snapshot_says_so(self) -> None:
        assert not snapshot_from_samples([("process_start_time_seconds", {}, 1.0)]).has_vllm_series

    def test_the_stored_record_round_trips_through_json(self) -> None:
        original = parse_metrics(real_metrics_text())
        restored = MetricsSnapshot.from_record(json.loads(json.dumps(original.to_record())))
        assert restored == original

    @pytest.mark.parametrize("record", [{}, {"counters": "nope"}, {"counters": {}, "histograms": {"x": {}}}])
    def test_a_record_that_is_not_a_snapshot_reads_as_none(self, record: dict[str, object]) -> None:
        assert MetricsSnapshot.from_record(record) is None


class TestDeriveInterval:
    def test_rates_come_from_counter_deltas(self) -> None:
        before = snap(generation=1000, prompt=400, iterations=100, length=10)
        after = snap(generation=1600, prompt=700, iterations=160, length=16)
        stats = derive_interval(before, after, 60.0)
        assert not stats.reset
        assert stats.generation_tokens_per_s == pytest.approx(10.0)
        assert stats.prompt_tokens_per_s == pytest.approx(5.0)
        assert stats.requests_per_s == pytest.approx(0.1)
        assert stats.finished_by_reason == {"length": 6.0, "error": 0.0}
        assert stats.progressed is True

    def test_percentiles_cover_only_the_interval_observations(self) -> None:
        before = snap(ttft=(100, 100, 100, 100, 100, 100, 100))  # 100 fast requests before
        after = snap(ttft=(100, 100, 100, 100, 110, 110, 110))  # 10 new ones in (0.06, 0.08]
        stats = derive_interval(before, after, 30.0)
        ttft = stats.latency["ttft"]
        assert ttft.count == 10
        assert ttft.p50 == pytest.approx(0.07)
        assert ttft.p99 == pytest.approx(0.0798)

    def test_a_counter_that_goes_down_is_a_restart_and_counts_from_zero(self) -> None:
        before = snap(generation=5000, length=100, iterations=900, started_at=1000.0)
        after = snap(generation=300, length=4, iterations=40, started_at=1000.0)
        stats = derive_interval(before, after, 60.0)
        assert stats.reset
        assert stats.generation_tokens_per_s == pytest.approx(5.0)
        assert stats.finished_by_reason["length"] == 4.0
        assert stats.slis()["counter_reset"] == 1.0

    def test_a_new_process_start_time_is_a_restart_even_if_counters_grew(self) -> None:
        before = snap(generation=100, started_at=1000.0)
        after = snap(generation=150, started_at=2000.0)
        assert is_restart(before, after)
        assert derive_interval(before, after, 10.0).generation_tokens_per_s == pytest.approx(15.0)

    def test_no_previous_snapshot_gives_gauges_only(self) -> None:
        stats = derive_interval(None, snap(generation=100), 60.0)
        assert stats.generation_tokens_per_s is None
        assert stats.running == 1.0
        assert stats.progressed is None

    def test_error_share_counts_error_and_abort_finishes(self) -> None:
        stats = derive_interval(snap(length=0, error=0), snap(length=9, error=1), 60.0)
        assert stats.error_share == pytest.approx(0.1)

    def test_a_changed_bucket_layout_uses_the_current_histogram_whole(self) -> None:
        before = snapshot_from_samples(hist_samples("vllm:time_to_first_token_seconds", (0.5, INF), (50, 50), 1.0))
        after = snap(ttft=(0, 4, 4, 4, 4, 4, 4), started_at=1000.0)
        stats = derive_interval(before, after, 60.0)
        assert stats.latency["ttft"].count == 4

    def test_the_real_restarted_pair_gives_non_negative_rates(self) -> None:
        earlier_server = parse_metrics(real_metrics_text("real_vllm_metrics_after_load.txt"))
        later_server = parse_metrics(real_metrics_text("real_vllm_metrics.txt"))
        stats = derive_interval(earlier_server, later_server, 120.0)
        assert stats.reset
        assert stats.requests_finished == 104.0
        assert stats.generation_tokens_per_s == pytest.approx(3248.0 / 120.0)
        assert all(value >= 0 for value in stats.slis().values())

    @given(
        before=st.lists(st.floats(min_value=0, max_value=1e9, allow_nan=False), min_size=4, max_size=4),
        after=st.lists(st.floats(min_value=0, max_value=1e9, allow_nan=False), min_size=4, max_size=4),
        elapsed=st.floats(min_value=0.001, max_value=3600),
    )
    def test_rates_are_never_negative(self, before: list[float], after: list[float], elapsed: float) -> None:
        stats = derive_interval(snap(*before), snap(*after), elapsed)
        for name, value in stats.slis().items():
            assert value >= 0, name

    def test_histogram_delta_refuses_a_different_layout(self) -> None:
        a = Histogram((0.1, INF), (1, 2), 0.3, 2)
        b = Histogram((0.2, INF), (1, 2), 0.3, 2)
        assert a.minus(b) is None
        assert a.minus(a) == Histogram((0.1, INF), (0.0, 0.0), 0.0, 0.0)

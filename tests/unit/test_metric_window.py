"""Window figures and totals from cumulative vLLM series: deltas of counters and histogram sums, resets added up.

The scrapes are the real vLLM 0.32.0 ``/metrics`` captures (tests/fixtures/vllm/) with requests observed into them
the way ``prometheus_client`` would: every bucket at or above the value, ``_sum`` and ``_count`` bumped.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest

from shared.adapters.vllm_probe import parse_metrics
from shared.domain.metric_window import (
    MetricPoint,
    counter_totals,
    duration_text,
    latency_text,
    points_from_samples,
    summary_lines,
    window_figures,
)
from shared.domain.metrics import Histogram, MetricsSnapshot, derive_interval, histogram_quantile
from shared.domain.models import MonitorSample, Phase
from tests.support.vllm_replay import real_metrics_text

T0 = datetime(2026, 12, 4, 16, 0, tzinfo=UTC)
TTFT = "vllm:time_to_first_token_seconds"
E2E = "vllm:e2e_request_latency_seconds"


def observe(text: str, family: str, value: float, times: int) -> str:
    """``times`` observations of ``value`` in one histogram family of a /metrics text."""
    pattern = re.compile(r"^(" + re.escape(family) + r"_(?:bucket|sum|count))(\{[^}]*\})? (\S+)$", re.MULTILINE)

    def bump(match: re.Match[str]) -> str:
        name, labels, old = match.group(1), match.group(2) or "", float(match.group(3))
        if name.endswith("_bucket"):
            le = re.search(r'le="([^"]+)"', labels)
            assert le is not None
            bound = math.inf if le.group(1) == "+Inf" else float(le.group(1))
            new = old + (times if value <= bound else 0)
        else:
            new = old + (value * times if name.endswith("_sum") else times)
        return f"{name}{labels} {new!r}"

    changed, found = pattern.subn(bump, text)
    assert found, f"no series of {family} in the text"
    return changed


def add(text: str, metric: str, amount: float, label: str = "") -> str:
    """Raise a counter (the series carrying ``label`` when given) by ``amount``."""
    pattern = re.compile(r"^(" + re.escape(metric) + r"(\{[^}]*\})? )(\S+)$", re.MULTILINE)

    def bump(match: re.Match[str]) -> str:
        if label and label not in (match.group(2) or ""):
            return match.group(0)
        return f"{match.group(1)}{float(match.group(3)) + amount!r}"

    changed, found = pattern.subn(bump, text)
    assert found, f"no sample {metric} in the text"
    return changed


def served(text: str, n: int, *, ttft: float, e2e: float = 0.2, reason: str = "length") -> str:
    """``n`` more requests finished with ``reason``, 10 prompt and 20 generated tokens each."""
    text = observe(observe(text, TTFT, ttft, n), E2E, e2e, n)
    text = add(text, "vllm:request_success_total", n, f'finished_reason="{reason}"')
    text = add(text, "vllm:prompt_tokens_total", 10 * n)
    return add(text, "vllm:generation_tokens_total", 20 * n)


FIRST = real_metrics_text()  # a server that has finished 104 requests
OTHER = real_metrics_text("real_vllm_metrics_after_load.txt")  # another process (a restart): 154 finished


def points(*texts: str, step_s: float = 60.0) -> list[MetricPoint]:
    return [MetricPoint(T0 + timedelta(seconds=i * step_s), parse_metrics(t)) for i, t in enumerate(texts)]


def busy_then_quiet() -> list[str]:
    """100 fast requests in the first minute, one slow request in the second."""
    busy = served(FIRST, 100, ttft=0.015)
    return [FIRST, busy, served(busy, 1, ttft=3.0)]


class TestWindowMeansComeFromSumAndCountDeltas:
    def test_the_window_mean_is_the_sum_delta_over_the_count_delta_not_the_mean_of_samples(self) -> None:
        pts = points(*busy_then_quiet())
        window = window_figures(pts)
        assert window is not None
        first, last = pts[0].snapshot.histograms["ttft"], pts[-1].snapshot.histograms["ttft"]
        expected = (last.sum - first.sum) / (last.count - first.count)
        assert window.latency["ttft"].mean_s == pytest.approx(expected)
        assert window.latency["ttft"].mean_s == pytest.approx((100 * 0.015 + 3.0) / 101)
        # What averaging the monitor's per-sample SLIs gives: each minute weighs the same, 100 requests or 1.
        per_sample = [derive_interval(a.snapshot, b.snapshot, 60.0).slis()["ttft_mean_s"] for a, b in pairwise(pts)]
        assert sum(per_sample) / len(per_sample) == pytest.approx(1.5075)
        mean = window.latency["ttft"].mean_s
        assert mean is not None and mean < 0.05

    def test_window_percentiles_come_from_the_summed_bucket_deltas(self) -> None:
        pts = points(*busy_then_quiet())
        window = window_figures(pts)
        assert window is not None
        first, last = pts[0].snapshot.histograms["ttft"], pts[-1].snapshot.histograms["ttft"]
        delta = last.minus(first)
        assert delta is not None
        p99 = window.latency["ttft"].p99_s
        assert p99 == pytest.approx(histogram_quantile(0.99, delta.bounds, delta.cumulative))
        assert p99 is not None and p99 < 0.02 + 1e-9  # 100 of 101 requests fell in (0.01, 0.02]
        per_sample_p99 = [derive_interval(a.snapshot, b.snapshot, 60.0).slis()["ttft_p99_s"] for a, b in pairwise(pts)]
        assert sum(per_sample_p99) / 2 > 2.0  # the average of per-minute p99s is dominated by one slow request

    def test_rates_divide_the_increase_by_the_time_between_the_first_and_last_sample(self) -> None:
        window = window_figures(points(*busy_then_quiet()))
        assert window is not None
        assert window.span_s == 120.0
        assert window.counts.finished == 101
        assert window.per_second(window.counts.finished) == pytest.approx(101 / 120)
        assert window.counts.prompt_tokens == 1010
        assert window.per_second(window.counts.generation_tokens) == pytest.approx(2020 / 120)


def _no_reset() -> list[str]:
    return [FIRST, served(FIRST, 10, ttft=0.03)]


def _reset_inside() -> list[str]:
    return [FIRST, served(FIRST, 10, ttft=0.03), OTHER, served(OTHER, 5, ttft=0.03)]


def _reset_first_step() -> list[str]:
    return [served(FIRST, 7, ttft=0.03), OTHER]


def _errors_and_aborts() -> list[str]:
    errored = served(FIRST, 3, ttft=0.03, reason="error")
    return [FIRST, errored, served(errored, 2, ttft=0.03, reason="abort")]


# name, samples, window finished, window errored+aborted, restarts, totals served, totals generation tokens
RESET_TABLE: list[tuple[str, Callable[[], list[str]], float, float, int, float, float]] = [
    ("one server", _no_reset, 10, 0, 0, 114, 3248 + 200),
    ("a restart inside the window", _reset_inside, 10 + 154 + 5, 0, 1, 114 + 159, 3248 + 200 + 4848 + 100),
    ("a restart on the first step", _reset_first_step, 154, 0, 1, 111 + 154, 3248 + 140 + 4848),
    ("errors and aborts are not served", _errors_and_aborts, 5, 5, 0, 104, 3248 + 100),
]


class TestCounterResets:
    @pytest.mark.parametrize(
        ("samples", "finished", "bad", "restarts", "served_total", "generation_total"),
        [row[1:] for row in RESET_TABLE],
        ids=[row[0] for row in RESET_TABLE],
    )
    def test_each_segment_counts_on_its_own_and_the_segments_add_up(
        self,
        samples: Callable[[], list[str]],
        finished: float,
        bad: float,
        restarts: int,
        served_total: float,
        generation_total: float,
    ) -> None:
        pts = points(*samples())
        window, totals = window_figures(pts), counter_totals(pts)
        assert window is not None and totals is not None
        assert window.counts.finished == finished
        assert (window.counts.errored or 0) + (window.counts.aborted or 0) == bad
        assert window.counts.served == finished - bad
        assert window.restarts == totals.restarts == restarts
        assert totals.counts.served == served_total
        assert totals.counts.generation_tokens == generation_total

    def test_the_mean_across_a_restart_adds_both_segments_sums_and_counts(self) -> None:
        texts = _reset_inside()
        pts = points(*texts)
        window = window_figures(pts)
        assert window is not None
        h = [p.snapshot.histograms["ttft"] for p in pts]
        expected = ((h[1].sum - h[0].sum) + h[3].sum) / ((h[1].count - h[0].count) + h[3].count)
        assert window.latency["ttft"].mean_s == pytest.approx(expected)
        assert window.latency["ttft"].count == 10 + 159

    def test_error_rate_is_errors_and_aborts_over_finished(self) -> None:
        window = window_figures(points(*_errors_and_aborts()))
        assert window is not None
        assert window.counts.errored == 3 and window.counts.aborted == 2
        assert window.counts.error_rate == 1.0

    def test_totals_count_from_the_oldest_servers_start(self) -> None:
        totals = counter_totals(points(*_reset_inside()))
        assert totals is not None and totals.since_server_start
        assert totals.since == datetime.fromtimestamp(parse_metrics(FIRST).started_at or 0, tz=UTC)


class TestSamplesWithoutCounters:
    def test_samples_without_the_raw_series_are_skipped_with_the_reason(self) -> None:
        def sample(minutes: int, counters: dict[str, object]) -> MonitorSample:
            return MonitorSample(
                deployment_id="gemma-a",
                taken_at=T0 + timedelta(minutes=minutes),
                phase=Phase.SERVING,
                counters=counters,
            )

        no_stats = MetricsSnapshot(http_requests=5.0, http_5xx=0.0).to_record()
        samples = [
            sample(3, parse_metrics(served(FIRST, 4, ttft=0.03)).to_record()),
            sample(0, {"prompt_tokens": 12.0}),  # an older record: no "counters" key
            sample(1, {}),  # the probe failed
            sample(2, no_stats),
            sample(4, parse_metrics(served(FIRST, 9, ttft=0.03)).to_record()),
        ]
        pts, skipped = points_from_samples(samples)
        assert [p.taken_at for p in pts] == [T0 + timedelta(minutes=3), T0 + timedelta(minutes=4)]
        assert sorted(skipped.values()) == [1, 1, 1]
        assert any("older sample format" in reason for reason in skipped)
        assert any("--disable-log-stats" in reason for reason in skipped)
        window = window_figures(pts)
        assert window is not None and window.counts.finished == 5

    def test_one_point_has_totals_but_no_window(self) -> None:
        pts = points(FIRST)
        totals = counter_totals(pts)
        assert window_figures(pts) is None
        assert totals is not None and totals.counts.served == 104 and totals.counts.prompt_tokens == 1758
        assert counter_totals([]) is None

    def test_a_missing_series_stays_unknown(self) -> None:
        bare = [
            MetricPoint(T0, MetricsSnapshot(counters={"prompt_tokens": 5.0})),
            MetricPoint(T0 + timedelta(minutes=1), MetricsSnapshot(counters={"prompt_tokens": 9.0})),
        ]
        window = window_figures(bare)
        assert window is not None
        assert window.counts.prompt_tokens == 4.0
        assert window.counts.finished is None and window.counts.error_rate is None and window.latency == {}


class TestBucketLayoutChange:
    def test_a_changed_layout_without_a_restart_keeps_the_mean_and_drops_percentiles(self) -> None:
        first, later = parse_metrics(FIRST), parse_metrics(served(FIRST, 10, ttft=0.03))
        moved = later.histograms["ttft"]
        coarse = Histogram(
            bounds=(0.5, math.inf), cumulative=(moved.count, moved.count), sum=moved.sum, count=moved.count
        )
        changed = replace(later, histograms={**later.histograms, "ttft": coarse})
        window = window_figures([MetricPoint(T0, first), MetricPoint(T0 + timedelta(minutes=1), changed)])
        assert window is not None
        assert window.latency["ttft"].mean_s == pytest.approx(0.03)
        assert window.latency["ttft"].p50_s is None
        assert window.latency["e2e"].p50_s is not None
        assert any("ttft" in note for note in window.notes)


class TestHumanUnits:
    @pytest.mark.parametrize(
        ("seconds", "text"),
        [(45, "45 s"), (57 * 60, "57 min"), (2 * 3600 + 5 * 60, "2 h 05 min"), (3 * 86400 + 4 * 3600, "3 d 04 h")],
    )
    def test_durations(self, seconds: float, text: str) -> None:
        assert duration_text(seconds) == text

    @pytest.mark.parametrize(
        ("seconds", "text"), [(0.0042, "4.2 ms"), (0.183, "183 ms"), (1.523, "1.52 s"), (None, "-")]
    )
    def test_latencies(self, seconds: float | None, text: str) -> None:
        assert latency_text(seconds) == text

    def test_the_summary_has_no_epoch_or_exponent_numbers(self) -> None:
        pts = points(*_reset_inside())
        lines = summary_lines(counter_totals(pts), window_figures(pts))
        joined = "\n".join(lines)
        assert "e+" not in joined and "1796" not in joined
        assert "Totals since 2026-12-02 " in joined and "(server start; 1 restart(s) added up)" in joined
        assert "  requests served: 273" in lines
        assert any(line.startswith("  time to first token: mean ") for line in lines)
        assert any("percentiles from bucket deltas" in line for line in lines)

"""Headline figures of a stored benchmark result, their change from the previous run, and the best run per figure.

Pinned: ``sweep_headline`` (shared by the benchmarker's comparison and the gateway) takes the peak output
throughput over the points with a finite one (``bool`` is not a number), rounds it, and reads the latencies at the
knee's level, or at the peak when there is no knee or no point at its level; it is empty when no point has a
throughput. ``headline_from_result`` reads the other shapes (top level, ``summary``, a list of points under
``points``/``levels``/``results``/``sweep``, with the level under any of its names). ``headline_change_pct`` leaves
out figures that were absent or zero before. ``best_run_per_metric`` picks max or min by ``HEADLINE_DIRECTIONS``,
whatever order the runs come in. Two bugs these tests found are fixed: no knee means the peak's latencies,
and non-finite numbers never count.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from shared.domain.benchmark_headline import (
    HEADLINE_DIRECTIONS,
    best_run_per_metric,
    headline_change_pct,
    headline_from_result,
    sweep_headline,
)

NAN = float("nan")
INF = float("inf")


def point(level: Any, throughput: Any, ttft: Any = None, **more: Any) -> dict[str, Any]:
    """One sweep point as the benchmarker stores it."""
    body: dict[str, Any] = {"level": level, "output_throughput": throughput, **more}
    if ttft is not None:
        body["median_ttft_ms"] = ttft
    return body


def same(found: Any, expected: Any) -> bool:
    """Equal, or both NaN (a knee level is reported as the result gave it)."""
    if isinstance(found, float) and isinstance(expected, float) and math.isnan(expected):
        return math.isnan(found)
    return type(found) is type(expected) and found == expected


# --- HEADLINE_DIRECTIONS --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(HEADLINE_DIRECTIONS))
def test_latencies_and_prices_are_better_low_and_throughputs_better_high(name: str) -> None:
    expected = "low" if "_ms" in name or name.startswith("usd_") else "high"
    assert HEADLINE_DIRECTIONS[name] == expected


def test_every_number_a_sweep_headline_ranks_runs_by_has_a_direction() -> None:
    headline = sweep_headline({"points": [point(1, 10.0, 5.0)], "knee": {"level": 1}})
    levels_and_flags = {"peak_at_level", "knee_level", "saturated"}
    assert set(headline) - levels_and_flags <= set(HEADLINE_DIRECTIONS)


# --- sweep_headline -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "result",
    [
        pytest.param(None, id="none"),
        pytest.param({}, id="empty"),
        pytest.param({"points": []}, id="no-points"),
        pytest.param({"points": "1,2,3"}, id="points-not-a-list"),
        pytest.param({"points": [1, "two", None, [3]]}, id="no-point-is-an-object"),
        pytest.param({"points": [{"level": 1}]}, id="no-throughput"),
        pytest.param({"points": [point(1, "100")]}, id="throughput-as-text"),
        pytest.param({"points": [point(1, True)]}, id="bool-is-not-a-number"),
        pytest.param({"points": [point(1, NAN), point(2, INF), point(3, -INF)]}, id="non-finite"),
        pytest.param({"levels": [point(1, 100.0)]}, id="other-shape"),
    ],
)
def test_sweep_headline_is_empty_without_a_finite_throughput(result: dict[str, Any] | None) -> None:
    assert sweep_headline(result) == {}


def test_sweep_headline_reads_the_peak_and_the_latencies_at_the_knee() -> None:
    result = {
        "points": [
            point(1, 100.0, 20.0, request_throughput=1.0, p99_ttft_ms=40.0, median_itl_ms=5.0, p99_itl_ms=9.0),
            point(8, 700.0, 90.0, request_throughput=7.0, p99_ttft_ms=180.0, median_itl_ms=11.0, p99_itl_ms=30.0),
            point(16, 812.345, 400.0, request_throughput=8.0, p99_ttft_ms=900.0, median_itl_ms=19.0, p99_itl_ms=60.0),
        ],
        "knee": {"level": 8, "saturated": True},
    }
    assert sweep_headline(result) == {
        "peak_output_throughput": 812.35,
        "peak_request_throughput": 8.0,
        "peak_at_level": 16,
        "knee_level": 8,
        "saturated": True,
        "median_ttft_ms_at_knee": 90.0,
        "p99_ttft_ms_at_knee": 180.0,
        "median_itl_ms_at_knee": 11.0,
        "p99_itl_ms_at_knee": 30.0,
    }


POINTS = [point(1, 100.0, 20.0), point(8, 700.0, 90.0), point(16, 800.0, 400.0)]


@pytest.mark.parametrize(
    ("knee", "ttft_at_knee", "knee_level", "saturated"),
    [
        pytest.param({"level": 8}, 90.0, 8, False, id="knee-at-a-point"),
        pytest.param({"level": 8.0}, 90.0, 8.0, False, id="knee-level-as-float"),
        pytest.param({"level": 1, "saturated": True}, 20.0, 1, True, id="knee-at-the-first-point"),
        pytest.param(None, 400.0, None, False, id="no-knee-reads-the-peak"),
        pytest.param({}, 400.0, None, False, id="empty-knee-reads-the-peak"),
        pytest.param({"level": None}, 400.0, None, False, id="knee-without-level-reads-the-peak"),
        pytest.param({"level": 4}, 400.0, 4, False, id="knee-at-no-point-reads-the-peak"),
        pytest.param({"level": NAN}, 400.0, NAN, False, id="non-finite-knee-reads-the-peak-and-is-reported-raw"),
        pytest.param(8, 400.0, None, False, id="knee-not-an-object"),
        pytest.param({"saturated": 1}, 400.0, None, True, id="saturated-without-level"),
    ],
)
def test_sweep_headline_reads_latencies_at_the_knee_else_at_the_peak(
    knee: Any, ttft_at_knee: float, knee_level: Any, saturated: bool
) -> None:
    headline = sweep_headline({"points": POINTS, "knee": knee})
    assert headline["median_ttft_ms_at_knee"] == ttft_at_knee
    assert headline["saturated"] is saturated
    assert same(headline["knee_level"], knee_level)


def test_sweep_headline_skips_points_whose_throughput_is_not_a_finite_number() -> None:
    result = {"points": [point(1, 50.0, 1.0), point(2, INF, 2.0), point(4, True, 3.0), point(8, NAN, 4.0)]}
    headline = sweep_headline(result)
    assert (headline["peak_output_throughput"], headline["peak_at_level"]) == (50.0, 1)
    assert headline["median_ttft_ms_at_knee"] == 1.0


def test_sweep_headline_takes_the_first_of_tied_peaks() -> None:
    headline = sweep_headline({"points": [point(1, 10.0), point(2, 500.0, 7.0), point(4, 500.0, 9.0)]})
    assert (headline["peak_at_level"], headline["median_ttft_ms_at_knee"]) == (2, 7.0)


@pytest.mark.parametrize("bad", [NAN, INF, True, "12", None])
def test_sweep_headline_reports_a_latency_that_is_not_a_finite_number_as_none(bad: Any) -> None:
    headline = sweep_headline({"points": [point(1, 10.0, p99_ttft_ms=bad, request_throughput=bad)]})
    assert headline["p99_ttft_ms_at_knee"] is None
    assert headline["peak_request_throughput"] is None


@pytest.mark.parametrize(("throughput", "shown"), [(1.005, 1.0), (2.675, 2.67), (123.456, 123.46), (7, 7)])
def test_sweep_headline_rounds_the_peak_to_two_places(throughput: float, shown: float) -> None:
    assert sweep_headline({"points": [point(1, throughput)]})["peak_output_throughput"] == shown


def test_sweep_headline_without_a_knee_reads_the_peak_even_if_a_point_has_no_level() -> None:
    result = {"points": [{"output_throughput": 10.0, "median_ttft_ms": 5.0}, point(8, 100.0, 50.0)]}
    assert sweep_headline(result)["median_ttft_ms_at_knee"] == 50.0


# --- headline_from_result -------------------------------------------------------------------------------------


@pytest.mark.parametrize("result", [None, {}])
def test_headline_from_result_is_empty_for_no_result(result: dict[str, Any] | None) -> None:
    assert headline_from_result(result) == {}


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        pytest.param(
            {"output_throughput": 900, "mean_ttft_ms": 12.5, "model": "gemma"},
            {"output_throughput": 900.0, "mean_ttft_ms": 12.5},
            id="top-level-figures-only",
        ),
        pytest.param(
            {"output_throughput": True, "mean_ttft_ms": "12", "p99_ttft_ms": None, "unknown_ms": 3.0},
            {},
            id="bool-text-none-and-unknown-names-are-ignored",
        ),
        pytest.param(
            {"summary": {"request_throughput": 4, "mean_itl_ms": 8.0}},
            {"request_throughput": 4.0, "mean_itl_ms": 8.0},
            id="summary-object",
        ),
        pytest.param(
            {"output_throughput": 1.0, "summary": {"output_throughput": 2.0, "mean_e2el_ms": 3.0}},
            {"output_throughput": 1.0, "mean_e2el_ms": 3.0},
            id="top-level-wins-over-summary",
        ),
        pytest.param({"summary": "fast"}, {}, id="summary-not-an-object"),
    ],
)
def test_headline_from_result_reads_the_top_level_and_the_summary(
    result: dict[str, Any], expected: dict[str, float]
) -> None:
    assert headline_from_result(result) == expected


@pytest.mark.parametrize("list_key", ["points", "levels", "results", "sweep"])
@pytest.mark.parametrize("level_key", ["level", "concurrency", "max_concurrency", "request_rate"])
def test_headline_from_result_reads_the_peak_of_any_list_with_any_level_name(list_key: str, level_key: str) -> None:
    result = {
        list_key: [
            {level_key: 1, "output_throughput": 100.0, "mean_ttft_ms": 10.0},
            {level_key: 4, "output_throughput": 300.0, "mean_ttft_ms": 30.0},
            {level_key: 8, "output_throughput": 200.0, "mean_ttft_ms": 80.0},
        ]
    }
    assert headline_from_result(result) == {
        "peak_output_throughput": 300.0,
        "peak_at_level": 4.0,
        "output_throughput": 300.0,
        "mean_ttft_ms": 30.0,
    }


def test_headline_from_result_reads_the_figures_of_points_that_keep_them_in_a_summary() -> None:
    result = {
        "results": [
            {"concurrency": 2, "summary": {"output_throughput": 50.0, "p99_itl_ms": 9.0}},
            {"concurrency": 16, "summary": {"output_throughput": 70.0, "p99_itl_ms": 40.0}},
        ]
    }
    assert headline_from_result(result) == {
        "peak_output_throughput": 70.0,
        "peak_at_level": 16.0,
        "output_throughput": 70.0,
        "p99_itl_ms": 40.0,
    }


@pytest.mark.parametrize(
    ("points", "expected"),
    [
        pytest.param(
            [{"output_throughput": 5.0}],
            {"peak_output_throughput": 5.0, "output_throughput": 5.0},
            id="no-level-no-peak-level",
        ),
        pytest.param(
            [{"level": "high", "output_throughput": 5.0}],
            {"peak_output_throughput": 5.0, "output_throughput": 5.0},
            id="level-as-text-no-peak-level",
        ),
        pytest.param(
            [{"level": 1, "output_throughput": 5.0, "mean_ttft_ms": 1.0}, {"level": 2, "output_throughput": 5.0}],
            {"peak_output_throughput": 5.0, "peak_at_level": 1.0, "output_throughput": 5.0, "mean_ttft_ms": 1.0},
            id="tie-takes-the-first",
        ),
        pytest.param(
            ["x", None, {"level": 3, "output_throughput": True}, {"level": 4, "mean_ttft_ms": 2.0}],
            {},
            id="no-point-with-a-throughput",
        ),
    ],
)
def test_headline_from_result_peak_edge_cases(points: list[Any], expected: dict[str, float]) -> None:
    assert headline_from_result({"levels": points}) == expected


def test_headline_from_result_keeps_top_level_figures_over_those_at_the_peak() -> None:
    result = {
        "mean_ttft_ms": 1.0,
        "levels": [{"level": 4, "output_throughput": 300.0, "mean_ttft_ms": 30.0, "p99_ttft_ms": 60.0}],
    }
    assert headline_from_result(result) == {
        "mean_ttft_ms": 1.0,
        "peak_output_throughput": 300.0,
        "peak_at_level": 4.0,
        "output_throughput": 300.0,
        "p99_ttft_ms": 60.0,
    }


def test_headline_from_result_ignores_a_non_finite_throughput() -> None:
    result = {"levels": [{"level": 1, "output_throughput": NAN}, {"level": 2, "output_throughput": 100.0}]}
    headline = headline_from_result(result)
    assert headline["peak_output_throughput"] == 100.0
    assert all(math.isfinite(value) for value in headline.values())


# --- headline_change_pct --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("now", "before", "expected"),
    [
        pytest.param({"a": 110.0}, {"a": 100.0}, {"a": 10.0}, id="rise"),
        pytest.param({"a": 75.0}, {"a": 100.0}, {"a": -25.0}, id="fall"),
        pytest.param({"a": 100.0}, {"a": 100.0}, {"a": 0.0}, id="no-change-is-kept"),
        pytest.param({"a": 2.0}, {"a": 3.0}, {"a": -33.33}, id="two-places"),
        pytest.param({"a": 0.0}, {"a": 8.0}, {"a": -100.0}, id="down-to-zero"),
        pytest.param({"a": 5.0}, {"a": 0.0}, {}, id="zero-before-is-left-out"),
        pytest.param({"a": 5.0}, {}, {}, id="absent-before-is-left-out"),
        pytest.param({}, {"a": 5.0}, {}, id="absent-now-is-left-out"),
        pytest.param({"a": 1.0, "b": 4.0}, {"a": 2.0, "c": 1.0}, {"a": -50.0}, id="only-shared-figures"),
        pytest.param({"a": -2.0}, {"a": -4.0}, {"a": -50.0}, id="relative-to-the-old-value-sign-included"),
    ],
)
def test_headline_change_pct(now: dict[str, float], before: dict[str, float], expected: dict[str, float]) -> None:
    assert headline_change_pct(now, before) == expected


# --- best_run_per_metric --------------------------------------------------------------------------------------


def test_best_run_per_metric_picks_max_for_throughput_and_min_for_latency() -> None:
    runs = [
        ("r1", {"output_throughput": 100.0, "mean_ttft_ms": 30.0, "p99_itl_ms": 9.0}),
        ("r2", {"output_throughput": 300.0, "mean_ttft_ms": 50.0}),
        ("r3", {"output_throughput": 200.0, "mean_ttft_ms": 10.0, "peak_at_level": 64.0}),
    ]
    assert best_run_per_metric(runs) == {"output_throughput": "r2", "mean_ttft_ms": "r3", "p99_itl_ms": "r1"}


@pytest.mark.parametrize(
    "runs",
    [
        pytest.param([], id="no-runs"),
        pytest.param([("r1", {})], id="run-without-figures"),
        pytest.param([("r1", {"peak_at_level": 8.0, "knee_level": 4.0})], id="levels-are-not-ranked"),
    ],
)
def test_best_run_per_metric_names_nothing_it_cannot_rank(runs: list[tuple[str, dict[str, float]]]) -> None:
    assert best_run_per_metric(runs) == {}


def test_best_run_per_metric_reads_a_generator_once() -> None:
    runs = ((run_id, {"median_ttft_ms": value}) for run_id, value in (("a", 3.0), ("b", 1.0)))
    assert best_run_per_metric(runs) == {"median_ttft_ms": "b"}


@pytest.mark.parametrize("metric", ["output_throughput", "mean_ttft_ms"])
def test_best_run_per_metric_breaks_ties_the_same_whatever_the_order(metric: str) -> None:
    worse = 9.0 if HEADLINE_DIRECTIONS[metric] == "low" else 0.0
    runs = [("r-old", {metric: 5.0}), ("r-new", {metric: 5.0}), ("r-worse", {metric: worse})]
    forward = best_run_per_metric(runs)[metric]
    assert forward in {"r-old", "r-new"}
    assert best_run_per_metric(list(reversed(runs)))[metric] == forward

"""The report's figures (issue 22 item 6): the Pareto front, per-level figures, and the series the charts draw."""

from __future__ import annotations

from typing import Any

import pytest

from shared.domain.bench_pareto import (
    cost_series,
    latency_series,
    pareto_front,
    pareto_points,
    run_figures,
)

PLAN = {"accelerator": "v6e-8", "chips": 8, "tier": "on_demand", "zone": "us-east5-b"}


def level(n: float, tok_s: float, tpot_ms: float, **extra: Any) -> dict[str, Any]:
    return {
        "level": n,
        "mode": "concurrency",
        "completed": 10,
        "failed": 0,
        "duration": 10.0,
        "output_throughput": tok_s,
        "request_throughput": n * 0.5,
        "p50_ttft_ms": 40.0 * n,
        "p90_ttft_ms": 60.0 * n,
        "p50_itl_ms": tpot_ms,
        "p90_itl_ms": tpot_ms * 1.5,
        "median_tpot_ms": tpot_ms,
        **extra,
    }


class TestParetoFront:
    def test_a_dominated_point_is_left_out(self) -> None:
        # (2, 2) is beaten by (3, 3) on both; (1, 5) and (5, 1) trade off against (3, 3).
        assert pareto_front([(1, 5), (2, 2), (3, 3), (5, 1)]) == [0, 2, 3]

    def test_equal_points_are_both_on_the_front_and_a_tie_on_one_axis_is_decided_by_the_other(self) -> None:
        assert pareto_front([(3, 3), (3, 3)]) == [0, 1]
        assert pareto_front([(3, 3), (3, 2)]) == [0]  # same x, lower y: dominated
        assert pareto_front([(2, 4), (3, 4)]) == [1]  # same y, lower x: dominated

    def test_no_points_no_front(self) -> None:
        assert pareto_front([]) == []
        assert pareto_points([]) == []


class TestRunFigures:
    def test_per_user_is_1000_over_tpot_and_per_chip_is_throughput_over_chips_priced_from_the_table(self) -> None:
        run = run_figures("a", PLAN, {}, {"points": [level(1, 80.0, 10.0), level(8, 400.0, 20.0)]})
        first, second = run.levels
        assert first.tok_s_per_user == pytest.approx(100.0) and second.tok_s_per_user == pytest.approx(50.0)
        assert first.tok_s_per_chip == pytest.approx(10.0) and second.tok_s_per_chip == pytest.approx(50.0)
        # on-demand v6e in us-east5 at $2.70/chip-hour x 8 = $21.60/h over 400 tok/s = $15/M
        assert second.usd_per_million == pytest.approx(15.0)
        assert first.usd_per_million == pytest.approx(75.0)
        assert run.has_slo is False and first.meets_slo is None

    def test_stored_economics_win_over_the_table(self) -> None:
        economics = {
            "price_source": "billing",
            "points": [{"level": 1, "output_tokens_per_s_per_chip": 3.0, "usd_per_million_output_tokens": 1.25}],
        }
        run = run_figures("a", PLAN, {}, {"points": [level(1, 80.0, 10.0)], "economics": economics})
        assert run.levels[0].tok_s_per_chip == 3.0 and run.levels[0].usd_per_million == 1.25
        assert run.price_source == "billing"

    def test_a_run_without_a_price_has_no_cost_but_still_its_other_figures(self) -> None:
        run = run_figures("a", {"chips": 4}, {}, {"points": [level(2, 100.0, 10.0)]})
        assert run.levels[0].usd_per_million is None and run.levels[0].tok_s_per_chip == pytest.approx(25.0)
        assert cost_series(run) == []
        assert run.price_source.startswith("unpriced")
        assert latency_series(run, "ttft_p90_ms") == [(100.0, 120.0)]

    def test_an_empty_run_has_no_levels_and_nothing_to_draw(self) -> None:
        for result in (None, {}, {"points": []}):
            run = run_figures("empty", PLAN, {}, result)
            assert run.levels == () and latency_series(run, "itl_p50_ms") == [] and cost_series(run) == []
            assert pareto_points([run]) == []

    def test_slo_compliance_is_judged_per_level_only_when_the_run_set_an_slo(self) -> None:
        points = [
            level(1, 80.0, 10.0, request_goodput=1.0),  # 10 of 10 met it
            level(4, 300.0, 15.0, request_goodput=0.5),  # 5 of 10: below 90 %
        ]
        run = run_figures("a", PLAN, {"slo_ttft_ms": 200.0}, {"points": points})
        assert run.has_slo and [lv.meets_slo for lv in run.levels] == [True, False]
        assert [ok for _, _, ok in cost_series(run)] == [True, False]

    def test_a_rate_level_that_falls_behind_fails_the_slo_even_if_its_requests_met_it(self) -> None:
        behind = level(8, 300.0, 15.0, mode="rate", request_goodput=1.0, arrival_rate=8.0, completion_rate=5.0)
        kept_up = level(2, 100.0, 10.0, mode="rate", request_goodput=1.0, arrival_rate=2.0, completion_rate=2.0)
        run = run_figures("a", PLAN, {"mode": "rate", "slo_tpot_ms": 50.0}, {"points": [kept_up, behind]})
        assert [lv.meets_slo for lv in run.levels] == [True, False]
        assert [x for x, _, _ in cost_series(run)] == [2.0, 5.0]  # the achieved rate, not the offered one


class TestParetoAcrossRuns:
    def test_the_front_spans_runs_and_levels_without_both_figures_are_not_candidates(self) -> None:
        a = run_figures("a", PLAN, {}, {"points": [level(1, 80.0, 10.0), level(8, 400.0, 20.0)]})
        # b's level 8 is beaten by a's level 8 (same speed per user, less per chip); its level 16 is the best per chip
        b = run_figures(
            "b",
            PLAN,
            {},
            {"points": [level(8, 320.0, 20.0), level(16, 640.0, 40.0), {"level": 32, "output_throughput": 700.0}]},
        )
        points = pareto_points([a, b])
        assert [(p.run, p.level, p.on_front) for p in points] == [
            ("a", 1, True),
            ("a", 8, True),
            ("b", 8, False),
            ("b", 16, True),
        ]

"""The open-loop max-rate search's decisions (issue 22, item 3): probe verdicts, the ladder, the bisection, the stop."""

from __future__ import annotations

import pytest

from shared.domain.bench_rate_search import (
    ProbeFigures,
    ProbeVerdict,
    RateSearch,
    SearchSettings,
    judge_probe,
    max_rate_at_slo,
)


def _figures(
    offered: float, achieved: float, sent: int = 20, completed: int = 20, good: int | None = 20
) -> ProbeFigures:
    return ProbeFigures(offered, achieved, sent, completed, good)


def test_a_probe_that_keeps_up_and_meets_the_slo_passes() -> None:
    verdict = judge_probe(4.0, _figures(4.1, 4.0, good=19))
    assert verdict.passed and verdict.failure == ""


def test_achieved_below_095_of_offered_is_saturation_even_when_latency_holds() -> None:
    verdict = judge_probe(8.0, _figures(8.0, 7.5))
    assert not verdict.passed and verdict.failure == "saturated"
    assert "93.8% < 95%" in verdict.reason
    assert judge_probe(8.0, _figures(8.0, 7.61)).passed  # 0.951 of the offer keeps up


def test_the_slo_breaks_when_fewer_than_the_attainment_share_meet_it() -> None:
    assert judge_probe(2.0, _figures(2.0, 2.0, good=18)).passed  # 90 % exactly
    broken = judge_probe(2.0, _figures(2.0, 2.0, good=17))
    assert broken.failure == "slo" and "17 of 20" in broken.reason
    assert judge_probe(2.0, _figures(2.0, 2.0, good=17), slo_attainment=0.85).passed


def test_without_an_slo_a_failed_request_breaks_the_probe_and_no_completion_is_saturation() -> None:
    assert judge_probe(1.0, _figures(1.0, 1.0, sent=20, completed=19, good=None)).failure == "slo"
    assert judge_probe(1.0, _figures(1.0, 0.0, sent=20, completed=0, good=None)).failure == "saturated"


def _drive(search: RateSearch, capacity: float) -> list[float]:
    """Probe until the search stops, against a server that keeps up below ``capacity`` req/s."""
    probed = []
    while (rate := search.next_rate()) is not None:
        probed.append(rate)
        search.record(ProbeVerdict(rate, rate < capacity, "" if rate < capacity else "saturated", "r"))
    return probed


def test_the_search_doubles_until_a_failure_then_bisects_the_bracket() -> None:
    search = RateSearch(SearchSettings(start_rate=1.0, refine_steps=2))
    probed = _drive(search, capacity=5.0)
    assert probed == [1.0, 2.0, 4.0, 8.0, 5.66, 4.76]
    result = search.result()
    assert result["max_rate_at_slo"] == 4.76 and result["lowest_failing_rate"] == 5.66
    assert result["stop_reason"] == "r"  # the first failing probe's reason


def test_the_search_steps_down_when_the_start_rate_already_fails() -> None:
    search = RateSearch(SearchSettings(start_rate=8.0, refine_steps=0))
    assert _drive(search, capacity=3.0) == [8.0, 4.0, 2.0]
    assert search.result()["max_rate_at_slo"] == 2.0


def test_the_search_stops_at_max_rate_and_at_the_probe_budget() -> None:
    capped = RateSearch(SearchSettings(start_rate=1.0, max_rate=5.0))
    assert _drive(capped, capacity=100.0) == [1.0, 2.0, 4.0, 5.0]
    assert "max_rate 5" in capped.stop_reason and capped.result()["max_rate_at_slo"] == 5.0
    budget = RateSearch(SearchSettings(start_rate=1.0, max_probes=3))
    assert _drive(budget, capacity=100.0) == [1.0, 2.0, 4.0]
    assert budget.stop_reason == "probe budget of 3 used"


def test_max_rate_at_slo_ignores_a_lucky_pass_above_a_failure() -> None:
    verdicts = [ProbeVerdict(1.0, True), ProbeVerdict(2.0, False, "slo"), ProbeVerdict(4.0, True)]
    assert max_rate_at_slo(verdicts) == 1.0
    assert max_rate_at_slo([ProbeVerdict(1.0, False, "saturated")]) is None


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"start_rate": 0}, "start_rate"),
        ({"start_rate": 4, "max_rate": 2}, "max_rate"),
        ({"start_rate": 1, "growth": 1}, "growth"),
        ({"start_rate": 1, "refine_steps": -1}, "refine_steps"),
        ({"start_rate": 1, "saturation_share": 1.5}, "saturation_share"),
        ({"start_rate": 1, "slo_attainment": 0}, "slo_attainment"),
    ],
)
def test_bad_settings_name_the_field(fields: dict[str, float], named: str) -> None:
    with pytest.raises(ValueError, match=f"^{named}: "):
        SearchSettings(**fields)  # type: ignore[arg-type]

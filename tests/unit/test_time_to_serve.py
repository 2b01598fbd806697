"""Command -> first token in the capacity benchmark (benchmarks/time_to_serve.py): the cache rules and a short run."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from benchmarks.capacity_search import PLANS, run_one
from benchmarks.capacity_search_results import RunResult
from benchmarks.time_to_serve import Interval, ServeTracker, account, first_token_table
from shared.domain.boot_model import CacheState, median_stages
from shared.domain.models import Tier

PLAN = PLANS["spot-preemptions"]
COLD = median_stages("gemma-4-26b-a4b", "v6e-4", CacheState.COLD).total_s
WARM = median_stages("gemma-4-26b-a4b", "v6e-4", CacheState.WARM).total_s


def _accounted(policy: str, intervals: list[Interval]) -> RunResult:
    result = RunResult(policy, PLAN.name, seed=5, time_to_active_s=intervals[0].start_s, time_to_known_s=60.0)
    result.window_s = 4 * 3600.0
    tracker = ServeTracker(lambda name, now_s: now_s, lambda zone, name: "v6e-4", intervals)
    account(result, tracker, PLAN, ["europe-west4", "us-central1", "us-east5"])
    return result


def _preempted_then_same_region() -> list[Interval]:
    return [
        Interval("a", "us-east5-b", "v6e-4", 0.0, 60.0),  # preempted during its boot: wasted
        Interval("b", "us-east5-b", "v6e-4", 120.0, 3600.0),
        Interval("c", "us-east5-b", "v6e-4", 3700.0, None),
    ]


def test_cold_boots_every_time_and_a_boot_cut_short_does_not_serve() -> None:
    result = _accounted("ours", _preempted_then_same_region())
    assert result.boots == ["cold", "cold", "cold"]
    assert result.first_token_s == pytest.approx(120.0 + COLD, rel=0.25)
    assert len(result.token_outages_s) == 1
    assert result.token_outages_s[0] == pytest.approx(100.0 + COLD, rel=0.25)  # time to ACTIVE again + re-boot


def test_the_regional_cache_warms_reboots_in_its_region_only() -> None:
    same = _accounted("ours+cache", _preempted_then_same_region())
    assert same.boots == ["cold", "cold", "warm"]  # a cut-short boot fills nothing
    assert same.token_outages_s[0] == pytest.approx(100.0 + WARM, rel=0.25)
    other = _accounted(
        "ours+cache",
        [Interval("b", "us-east5-b", "v6e-4", 0.0, 3600.0), Interval("c", "us-central1-b", "v6e-4", 3700.0, None)],
    )
    assert other.boots == ["cold", "cold"]


def test_a_primed_cache_is_warm_from_the_first_boot() -> None:
    result = _accounted("ours+cache-primed", _preempted_then_same_region())
    assert result.boots == ["warm", "warm", "warm"]
    assert result.first_token_s is not None and result.first_token_s < 120.0 + COLD / 2


def test_an_outage_never_recovered_is_censored_at_the_end_of_the_run() -> None:
    result = _accounted(
        "ours", [Interval("b", "us-east5-b", "v6e-4", 0.0, 3600.0), Interval("c", "us-east5-b", "v6e-4", 14_000.0)]
    )
    assert result.token_unrecovered == 1
    assert result.token_outages_s == [pytest.approx(60.0 + 4 * 3600.0 - 3600.0)]


def test_the_tracker_opens_and_closes_intervals_on_the_served_slice() -> None:
    tracker = ServeTracker(lambda name, now_s: now_s - 10.0, lambda zone, name: "v6e-4")
    serving = ("us-east5-b", "a", Tier.SPOT)
    for now_s, up in ((0.0, False), (15.0, True), (30.0, True), (45.0, False)):
        tracker.sample(now_s, serving if up else None, up)
    tracker.sample(60.0, ("us-central1-b", "b", Tier.SPOT), True)
    assert [(i.name, i.start_s, i.end_s) for i in tracker.intervals] == [("a", 5.0, 45.0), ("b", 50.0, None)]


@pytest.mark.slow
def test_capacity_search_reports_first_token_after_active_and_faster_with_the_cache() -> None:
    with tempfile.TemporaryDirectory() as folder:
        runs = {
            policy: [run_one(policy, PLAN, seed, Path(folder)) for seed in (1, 2, 3)]
            for policy in ("ours", "ours+cache", "ours+cache-primed")
        }
    for policy, results in runs.items():
        for result in results:
            assert result.time_to_active_s is not None and result.first_token_s is not None, policy
            assert result.first_token_s >= result.time_to_active_s + WARM / 2
    for cold, cached, primed in zip(runs["ours"], runs["ours+cache"], runs["ours+cache-primed"], strict=True):
        # The controller is the same: the boot is the only change.
        assert cold.time_to_active_s == cached.time_to_active_s == primed.time_to_active_s
        assert primed.first_token_s is not None and cached.first_token_s is not None
        assert cold.first_token_s is not None
        assert primed.first_token_s <= cached.first_token_s <= cold.first_token_s
        assert primed.first_token_s < cold.first_token_s
    table = first_token_table([(PLAN, results) for results in runs.values()])
    assert "ours+cache-primed" in table and "warm re-boot / cold boot = 0.25" in table

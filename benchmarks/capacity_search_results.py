"""What one capacity-search run measures, and how runs are summarised into the tables of docs/benchmarks.md.

Why separate from ``capacity_search.py``: the policies and the loop that drives them change for other
reasons than the measures and the report, and ``capacity_search_backends.py`` shares both. Every name
here is re-exported by ``capacity_search``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from shared.domain.models import Tier

__all__ = ["PLANS", "RunResult", "ScenarioPlan", "Summary", "markdown", "summarise", "target_table"]


@dataclass(frozen=True)
class ScenarioPlan:
    """What is asked for in a scenario and how long a run may take."""

    name: str
    tiers: tuple[Tier, ...]
    horizon_s: float
    accelerator: str = "v6e-4"
    alternatives: tuple[str, ...] = ()  # the slices ``ours+advice+step`` may widen to (shared.domain.slice_ladder)


PLANS = {
    "scarce-v6e": ScenarioPlan("scarce-v6e", (Tier.FLEX_START, Tier.SPOT, Tier.ON_DEMAND), 8 * 3600.0),
    "reference-agent-zones": ScenarioPlan("reference-agent-zones", (Tier.FLEX_START,), 4 * 3600.0),
    "spot-preemptions": ScenarioPlan("spot-preemptions", (Tier.SPOT,), 4 * 3600.0),
    "advice-accurate": ScenarioPlan("advice-accurate", (Tier.SPOT, Tier.ON_DEMAND), 4 * 3600.0),
    "advice-noisy": ScenarioPlan("advice-noisy", (Tier.SPOT, Tier.ON_DEMAND), 4 * 3600.0),
    "flex-held": ScenarioPlan("flex-held", (Tier.FLEX_START,), 4 * 3600.0),
    "step-down": ScenarioPlan("step-down", (Tier.SPOT, Tier.ON_DEMAND), 4 * 3600.0, "v6e-8", ("v6e-4",)),
}


@dataclass
class RunResult:
    policy: str
    scenario: str
    seed: int
    time_to_active_s: float | None = None
    time_to_known_s: float | None = None
    first_chips_s: float | None = None
    recoveries_s: list[float] = field(default_factory=list)
    unrecovered: int = 0
    used_chip_hours: float = 0.0
    used_usd: float = 0.0
    billed_chip_hours: float = 0.0
    billed_usd: float = 0.0
    api_calls: int = 0
    api_calls_to_active: int = 0
    orphans: int = 0
    serving_s: float = 0.0
    window_s: float = 0.0
    wall_s: float = 0.0
    # Command -> first token with the boot model (benchmarks/time_to_serve.py): boots by cache state, outages.
    first_token_s: float | None = None
    boots: list[str] = field(default_factory=list)
    token_outages_s: list[float] = field(default_factory=list)
    token_unrecovered: int = 0

    @property
    def wasted_chip_hours(self) -> float:
        return max(0.0, self.billed_chip_hours - self.used_chip_hours)

    @property
    def wasted_usd(self) -> float:
        return max(0.0, self.billed_usd - self.used_usd)


# --------------------------------------------------------------------------------------------- report


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


@dataclass
class Summary:
    policy: str
    scenario: str
    runs: int
    reached: int
    median_min: float
    p90_min: float
    wasted_chip_hours: float
    wasted_pct: float
    api_calls_to_active: float
    api_calls: float
    orphans: float
    runs_with_orphans: int
    availability: float
    notice_lag_min: float
    recoveries: int
    recovery_median_min: float
    unrecovered: int
    first_chips_median_min: float | None = None
    first_chips_p90_min: float | None = None


def summarise(results: Sequence[RunResult], plan: ScenarioPlan) -> Summary:
    times = [(r.time_to_active_s if r.time_to_active_s is not None else plan.horizon_s) / 60 for r in results]
    chips = [(r.first_chips_s if r.first_chips_s is not None else plan.horizon_s) / 60 for r in results]
    has_chips = any(r.first_chips_s is not None for r in results)
    served_usd = sum(r.used_usd for r in results)
    wasted_usd = sum(r.wasted_usd for r in results)
    windows = sum(r.window_s for r in results)
    return Summary(
        policy=results[0].policy,
        scenario=plan.name,
        runs=len(results),
        reached=sum(1 for r in results if r.time_to_active_s is not None),
        median_min=statistics.median(times),
        p90_min=_percentile(times, 0.9),
        wasted_chip_hours=statistics.mean(r.wasted_chip_hours for r in results),
        wasted_pct=100 * wasted_usd / served_usd if served_usd else float("inf"),
        api_calls_to_active=statistics.mean(r.api_calls_to_active for r in results if r.time_to_active_s is not None)
        if any(r.time_to_active_s is not None for r in results)
        else float("nan"),
        api_calls=statistics.mean(r.api_calls for r in results),
        orphans=statistics.mean(r.orphans for r in results),
        runs_with_orphans=sum(1 for r in results if r.orphans),
        availability=100 * sum(r.serving_s for r in results) / windows if windows else 0.0,
        notice_lag_min=statistics.median(
            [
                (r.time_to_known_s - r.time_to_active_s) / 60
                for r in results
                if r.time_to_known_s is not None and r.time_to_active_s is not None
            ]
            or [0.0]
        ),
        recoveries=sum(len(r.recoveries_s) for r in results),
        recovery_median_min=statistics.median([x / 60 for r in results for x in r.recoveries_s] or [float("nan")]),
        unrecovered=sum(r.unrecovered for r in results),
        first_chips_median_min=statistics.median(chips) if has_chips else None,
        first_chips_p90_min=_percentile(chips, 0.9) if has_chips else None,
    )


def markdown(summaries: Sequence[Summary]) -> str:
    horizon = {name: plan.horizon_s / 60 for name, plan in PLANS.items()}
    lines = [
        "| scenario | policy | reached ACTIVE | median min to ACTIVE | p90 min | wasted chip-h/run | wasted % of"
        " serving spend | API calls to ACTIVE | API calls/run | orphans/run (runs with any) | availability |"
        " outages: median min to ACTIVE again (n, never) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        median = ("≥" if s.median_min >= horizon[s.scenario] else "") + f"{s.median_min:.1f}"
        p90 = ("≥" if s.p90_min >= horizon[s.scenario] else "") + f"{s.p90_min:.1f}"
        outages = f"{s.recovery_median_min:.1f} ({s.recoveries}, {s.unrecovered})" if s.recoveries else "-"
        lines.append(
            f"| {s.scenario} | {s.policy} | {s.reached}/{s.runs} | {median} | {p90} | {s.wasted_chip_hours:.3f} |"
            f" {s.wasted_pct:.2f} | {s.api_calls_to_active:.0f} | {s.api_calls:.0f} |"
            f" {s.orphans:.2f} ({s.runs_with_orphans}) | {s.availability:.1f}% | {outages} |"
        )
    return "\n".join(lines)


def target_table(summaries: Sequence[Summary]) -> str:
    """Ours and the bound against the target (median at most 1/3 of the sequential one), per scenario."""
    by_key = {(s.scenario, s.policy): s for s in summaries}
    lines = [
        "| scenario | sequential median min | target (1/3) | bound median (p90) | bound: first chips granted, median"
        " (p90) | ours median (p90) | ours / sequential | bound / sequential | target reachable by any policy |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for scenario in dict.fromkeys(s.scenario for s in summaries):
        seq, bound, ours = (by_key.get((scenario, name)) for name in ("sequential", "bound", "ours"))
        if seq is None or bound is None:
            continue
        target = seq.median_min / 3
        chips = (
            f"{bound.first_chips_median_min:.1f} ({bound.first_chips_p90_min:.1f})"
            if bound.first_chips_median_min is not None and bound.first_chips_p90_min is not None
            else "-"
        )
        ours_text = f"{ours.median_min:.1f} ({ours.p90_min:.1f})" if ours else "-"
        ratio = f"{ours.median_min / seq.median_min:.2f}" if ours else "-"
        reachable = (
            "yes" if bound.median_min <= target else f"no: the bound's median is {bound.median_min / target:.1f}x it"
        )
        lines.append(
            f"| {scenario} | {seq.median_min:.1f} | {target:.1f} | {bound.median_min:.1f} ({bound.p90_min:.1f}) |"
            f" {chips} | {ours_text} | {ratio} | {bound.median_min / seq.median_min:.2f} | {reachable} |"
        )
    return "\n".join(lines)

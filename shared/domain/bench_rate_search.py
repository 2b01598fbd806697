"""The open-loop "max request rate at the SLO" search: which rate to probe next and when to stop (issue 22, item 3).

Pure: verdicts in, the next rate out. A probe is one open-loop level at an offered rate (Poisson arrivals); the
search climbs a geometric ladder (``start``, ``start x growth``, ...) until a probe fails, then bisects
(geometric mean) between the highest rate that passed and the lowest that failed for ``refine_steps`` probes.
When the very first rate already fails, it steps down by ``growth`` until one passes (or the probes run out).

A probe **fails** when either:

- **saturation**: the achieved rate is below ``saturation_share`` (0.95) of the offered rate. Offered is the rate
  the arrivals really had ((n - 1) / the span of the arrival times), achieved the rate the completions had over
  their own span, so a server that keeps up scores ~1 whatever the level's length, and one that falls behind
  spreads its completions out (the same windows ``loadgen.stats.find_knee`` compares); or
- **the SLO breaks**: fewer than ``slo_attainment`` (0.9) of the requests sent met every SLO threshold given, or
  a request failed. Goodput is what GuideLLM and ``vllm bench serve --goodput`` call it: requests meeting every
  SLO per second (``request_goodput``); attainment is those requests over all sent.

The max rate at the SLO is the highest offered rate that passed below the lowest that failed; the search says
which probe stopped it and why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "SEARCH_FIGURES",
    "ProbeFigures",
    "ProbeVerdict",
    "RateSearch",
    "SearchSettings",
    "judge_probe",
    "max_rate_at_slo",
    "point_figures",
    "rate_ladder",
    "sweep_rate_search",
]

SATURATION_SHARE = 0.95
SLO_ATTAINMENT = 0.9


SEARCH_FIGURES = (
    "offered_rate",
    "achieved_rate",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "output_goodput",
    "median_ttft_ms",
    "p90_ttft_ms",
    "mean_tpot_ms",
    "p90_itl_ms",
    "slo_attainment",
)
"""The figures every row of a search carries (as estimates over its repeats)."""


@dataclass(frozen=True, slots=True)
class SearchSettings:
    """How the search climbs and how strict a probe is. Bad values raise ``ValueError`` naming the field."""

    start_rate: float
    max_rate: float = 1000.0
    growth: float = 2.0
    refine_steps: int = 2
    max_probes: int = 12
    saturation_share: float = SATURATION_SHARE
    slo_attainment: float = SLO_ATTAINMENT

    def __post_init__(self) -> None:
        if not self.start_rate > 0:
            raise ValueError(f"start_rate: {self.start_rate} must be > 0 requests/s (the first rate probed)")
        if not self.max_rate >= self.start_rate:
            raise ValueError(f"max_rate: {self.max_rate} must be at least start_rate {self.start_rate}")
        if not self.growth > 1:
            raise ValueError(f"growth: {self.growth} must be > 1 (each rung multiplies the rate by it; try 2)")
        if not 0 <= self.refine_steps <= 10:
            raise ValueError(f"refine_steps: {self.refine_steps} must be within 0..10 (bisections after a failure)")
        if not 1 <= self.max_probes <= 64:
            raise ValueError(f"max_probes: {self.max_probes} must be within 1..64")
        if not 0 < self.saturation_share <= 1:
            raise ValueError(f"saturation_share: {self.saturation_share} must be within (0, 1] (0.95 is usual)")
        if not 0 < self.slo_attainment <= 1:
            raise ValueError(f"slo_attainment: {self.slo_attainment} must be within (0, 1] (0.9: 90 % meet it)")


@dataclass(frozen=True, slots=True)
class ProbeFigures:
    """What one probe measured (or the medians of its repeats)."""

    offered_rate: float
    """Requests/s the arrivals had."""
    achieved_rate: float
    """Requests/s the completions had."""
    sent: int
    completed: int
    good: int | None
    """Requests that met every SLO; None when no SLO was given."""


@dataclass(frozen=True, slots=True)
class ProbeVerdict:
    rate: float
    """The nominal rate probed (what the search asked for)."""
    passed: bool
    failure: Literal["", "saturated", "slo"] = ""
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"rate": self.rate, "passed": self.passed, "failure": self.failure or None, "reason": self.reason}


def judge_probe(
    rate: float,
    figures: ProbeFigures,
    *,
    saturation_share: float = SATURATION_SHARE,
    slo_attainment: float = SLO_ATTAINMENT,
) -> ProbeVerdict:
    """Saturated, SLO broken, or passed (saturation is checked first: a server behind also misses latency)."""
    if figures.sent == 0 or figures.completed == 0:
        return ProbeVerdict(rate, False, "saturated", f"{rate:g} req/s: no request completed")
    share = figures.achieved_rate / figures.offered_rate if figures.offered_rate > 0 else 0.0
    if share < saturation_share:
        return ProbeVerdict(
            rate,
            False,
            "saturated",
            f"{rate:g} req/s: achieved {figures.achieved_rate:.3g} of {figures.offered_rate:.3g} offered "
            f"({share * 100:.1f}% < {saturation_share * 100:g}%)",
        )
    failed = figures.sent - figures.completed
    if figures.good is not None:
        attainment = figures.good / figures.sent
        if attainment < slo_attainment:
            return ProbeVerdict(
                rate,
                False,
                "slo",
                f"{rate:g} req/s: {figures.good} of {figures.sent} requests met the SLO "
                f"({attainment * 100:.1f}% < {slo_attainment * 100:g}%)",
            )
    elif failed:
        return ProbeVerdict(rate, False, "slo", f"{rate:g} req/s: {failed} of {figures.sent} requests failed")
    return ProbeVerdict(rate, True, "", f"{rate:g} req/s: kept up ({share * 100:.0f}%) and met the SLO")


@dataclass
class RateSearch:
    """The search's state: feed each probe's verdict to :meth:`record`, ask :meth:`next_rate` for the next."""

    settings: SearchSettings
    verdicts: list[ProbeVerdict] = field(default_factory=list)
    refined: int = 0
    stop_reason: str = ""

    def record(self, verdict: ProbeVerdict) -> None:
        best, fail = self._bracket()
        if best is not None and fail is not None:
            self.refined += 1  # a probe inside an existing bracket is a refinement
        self.verdicts.append(verdict)

    def _bracket(self) -> tuple[float | None, float | None]:
        return _bracket(self.verdicts)

    def next_rate(self) -> float | None:
        """The next rate to probe, or None when the search is over (``stop_reason`` says why)."""
        s = self.settings
        if len(self.verdicts) >= s.max_probes:
            self.stop_reason = self.stop_reason or f"probe budget of {s.max_probes} used"
            return None
        if not self.verdicts:
            return s.start_rate
        best, fail = self._bracket()
        if fail is None:
            assert best is not None
            if best >= s.max_rate:
                self.stop_reason = f"met the SLO up to max_rate {s.max_rate:g} req/s without saturating"
                return None
            return _round(min(best * s.growth, s.max_rate))
        if best is None:  # the lowest rate probed already fails: step down
            lower = _round(fail / s.growth)
            if lower < 1e-3:
                self.stop_reason = "no rate down to 0.001 req/s met the SLO"
                return None
            return lower
        first_fail = next(v for v in self.verdicts if not v.passed)
        if self.refined >= s.refine_steps:
            self.stop_reason = first_fail.reason
            return None
        middle = _round(math.sqrt(best * fail))
        if middle <= best or middle >= fail:  # the bracket is as narrow as rounding allows
            self.stop_reason = first_fail.reason
            return None
        return middle

    def result(self) -> dict[str, Any]:
        best, fail = self._bracket()
        return {
            "max_rate_at_slo": best,
            "lowest_failing_rate": fail,
            "stop_reason": self.stop_reason,
            "probes": [verdict.as_dict() for verdict in self.verdicts],
        }


def max_rate_at_slo(verdicts: list[ProbeVerdict]) -> float | None:
    """The highest passing rate below the lowest failing one (None when none passed): a ladder's answer."""
    return _bracket(verdicts)[0]


def _bracket(verdicts: list[ProbeVerdict]) -> tuple[float | None, float | None]:
    """(highest passing rate below the lowest failing one, lowest failing rate)."""
    failing = [v.rate for v in verdicts if not v.passed]
    low_fail = min(failing) if failing else None
    passing = [v.rate for v in verdicts if v.passed and (low_fail is None or v.rate < low_fail)]
    return (max(passing) if passing else None), low_fail


def _round(rate: float) -> float:
    """Rates to 3 significant figures, so probes read cleanly and repeat exactly."""
    if rate <= 0:
        return rate
    digits = 2 - math.floor(math.log10(rate))
    return round(rate, digits)


LADDER_RUNGS = 6


def rate_ladder(
    start_rate: float, rungs: int = LADDER_RUNGS, growth: float = 2.0, max_rate: float = 10000.0
) -> list[float]:
    """The search's climb as a fixed list of rates (``start``, ``start x growth``, ...), for a sweep run on a
    node, which measures every level it is given; :func:`sweep_rate_search` applies the stop rule afterwards."""
    settings = SearchSettings(start_rate=start_rate, max_rate=max(max_rate, start_rate), growth=growth)
    rates = [settings.start_rate]
    while len(rates) < rungs and rates[-1] < settings.max_rate:
        rates.append(_round(min(rates[-1] * growth, settings.max_rate)))
    return rates


def point_figures(point: Mapping[str, Any]) -> ProbeFigures:
    """A stored rate level (``loadgen``'s point keys) as the figures a verdict reads."""
    completed, failed = int(point.get("completed") or 0), int(point.get("failed") or 0)
    level = float(point.get("level") or 0.0)
    goodput, duration = point.get("request_goodput"), float(point.get("duration") or 0.0)
    return ProbeFigures(
        offered_rate=float(point.get("arrival_rate") or level),
        achieved_rate=float(point.get("completion_rate") or point.get("request_throughput") or 0.0),
        sent=completed + failed,
        completed=completed,
        good=None if goodput is None else round(float(goodput) * duration),
    )


def sweep_rate_search(request: Mapping[str, Any], points: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The max rate at the SLO of a stored rate sweep: its levels in rising order are the ladder, judged one by one
    until the first failure (the search's stop rule; levels past it are listed as not judged). None for a
    concurrency sweep or a trace."""
    if request.get("mode") != "rate" or request.get("workload") == "trace" or not points:
        return None
    verdicts: list[ProbeVerdict] = []
    not_judged: list[float] = []
    for point in sorted(points, key=lambda p: float(p.get("level") or 0.0)):
        rate = float(point.get("level") or 0.0)
        if verdicts and not verdicts[-1].passed:
            not_judged.append(rate)
            continue
        verdicts.append(judge_probe(rate, point_figures(point)))
    best, fail = _bracket(verdicts)
    failed = next((v for v in verdicts if not v.passed), None)
    return {
        "max_rate_at_slo": best,
        "lowest_failing_rate": fail,
        "stop_reason": failed.reason
        if failed
        else f"kept up and met the SLO at every rate up to {verdicts[-1].rate:g}",
        "probes": [verdict.as_dict() for verdict in verdicts],
        "not_judged": not_judged,
    }

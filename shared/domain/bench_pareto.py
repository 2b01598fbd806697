"""What a report over several benchmark runs draws (issue 22, item 6): latency against throughput per run, the
Pareto front of tokens/s per user against tokens/s per chip, and the price per million output tokens against the
request rate (pure).

A *run* is one stored benchmark (its ``plan``, ``request`` and ``result``); a future auto-tuning trial is just
another run. Each level of a run becomes a :class:`LevelFigures`:

- ``output_tok_s``: the level's output throughput (tokens/s over all requests);
- ``tok_s_per_user``: the output tokens/s one request sees while decoding, 1000 / the median TPOT
  (falling back to the mean TPOT, then the median ITL);
- ``tok_s_per_chip``: from the controller's ``result["economics"]`` when stored, else output throughput / the
  plan's chips;
- ``usd_per_million``: USD per million output tokens from ``result["economics"]``; a result without economics is
  priced here with ``shared.domain.bench_economics`` (the dated price table) from the plan's tier and zone, and a
  plan without them stays unpriced (None);
- ``meets_slo``: None when the run set no SLO; else whether at least ``SLO_ATTAINMENT`` (90 %) of the requests
  sent met every threshold, and, for a rate level, whether the server kept up (the open-loop search's verdict,
  ``shared.domain.bench_rate_search.judge_probe``).

The Pareto front maximises both tokens/s per user and tokens/s per chip: a point is on it unless another point is
at least as good on both and better on one. Equal points do not dominate each other, so ties are all on the front.
A level missing either figure is not a candidate (it is neither on the front nor dominated).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from shared.domain.bench_economics import benchmark_economics
from shared.domain.bench_rate_search import SLO_ATTAINMENT, judge_probe, point_figures

__all__ = [
    "LevelFigures",
    "ParetoPoint",
    "RunFigures",
    "cost_series",
    "latency_series",
    "pareto_front",
    "pareto_points",
    "run_figures",
]

_SLO_KEYS = ("slo_ttft_ms", "slo_tpot_ms", "slo_e2el_ms")


@dataclass(frozen=True, slots=True)
class LevelFigures:
    """One level of one run, as the report's charts read it (None where the run did not measure it)."""

    level: float | None
    mode: str
    output_tok_s: float | None
    request_rate: float | None
    """Achieved requests/s (completions over their own span when measured, else over the level)."""
    ttft_p50_ms: float | None
    ttft_p90_ms: float | None
    itl_p50_ms: float | None
    itl_p90_ms: float | None
    tok_s_per_user: float | None
    tok_s_per_chip: float | None
    usd_per_million: float | None
    meets_slo: bool | None


@dataclass(frozen=True, slots=True)
class RunFigures:
    label: str
    levels: tuple[LevelFigures, ...]
    has_slo: bool
    price_source: str
    """Where the prices came from, or why there are none."""


@dataclass(frozen=True, slots=True)
class ParetoPoint:
    run: str
    level: float | None
    tok_s_per_user: float
    tok_s_per_chip: float
    on_front: bool


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _first(point: Mapping[str, Any], *keys: str) -> float | None:
    return next((found for key in keys if (found := _number(point.get(key))) is not None), None)


def _per_user(point: Mapping[str, Any]) -> float | None:
    per_token_ms = _first(point, "median_tpot_ms", "p50_tpot_ms", "mean_tpot_ms", "median_itl_ms", "p50_itl_ms")
    return 1000.0 / per_token_ms if per_token_ms and per_token_ms > 0 else None


def _meets_slo(point: Mapping[str, Any], mode: str) -> bool:
    figures = point_figures(point)
    if mode == "rate":
        return judge_probe(float(point.get("level") or 0.0), figures).passed
    if figures.sent == 0 or figures.good is None:
        return False
    return figures.good / figures.sent >= SLO_ATTAINMENT


def run_figures(
    label: str, plan: Mapping[str, Any], request: Mapping[str, Any], result: Mapping[str, Any] | None
) -> RunFigures:
    """Every level of one stored run (an empty run, or one without a result, has no levels)."""
    points = [p for p in (result or {}).get("points") or [] if isinstance(p, Mapping)]
    economics = (result or {}).get("economics")
    if not isinstance(economics, Mapping):
        economics = benchmark_economics(plan, request, points) if points else {}
    priced = {_number(row.get("level")): row for row in economics.get("points") or [] if isinstance(row, Mapping)}
    has_slo = any(_number(request.get(key)) is not None for key in _SLO_KEYS)
    chips = _number(plan.get("chips"))
    levels = []
    for point in points:
        mode = str(point.get("mode") or request.get("mode") or "concurrency")
        throughput = _number(point.get("output_throughput"))
        row = priced.get(_number(point.get("level")), {})
        per_chip = _number(row.get("output_tokens_per_s_per_chip"))
        if per_chip is None and throughput is not None and chips:
            per_chip = throughput / chips
        levels.append(
            LevelFigures(
                level=_number(point.get("level")),
                mode=mode,
                output_tok_s=throughput,
                request_rate=_first(point, "completion_rate", "request_throughput"),
                ttft_p50_ms=_first(point, "p50_ttft_ms", "median_ttft_ms"),
                ttft_p90_ms=_first(point, "p90_ttft_ms"),
                itl_p50_ms=_first(point, "p50_itl_ms", "median_itl_ms"),
                itl_p90_ms=_first(point, "p90_itl_ms"),
                tok_s_per_user=_per_user(point),
                tok_s_per_chip=per_chip,
                usd_per_million=_number(row.get("usd_per_million_output_tokens")),
                meets_slo=_meets_slo(point, mode) if has_slo else None,
            )
        )
    source = str(economics.get("price_source") or "unpriced: no levels")
    return RunFigures(label, tuple(levels), has_slo, source)


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices (in input order) of the points no other point dominates, both coordinates maximised."""
    front = []
    for index, (x, y) in enumerate(points):
        dominated = any(ox >= x and oy >= y and (ox > x or oy > y) for ox, oy in points)
        if not dominated:
            front.append(index)
    return front


def pareto_points(runs: Sequence[RunFigures]) -> list[ParetoPoint]:
    """Every level of every run with both tokens/s per user and per chip, each said on the front or not."""
    candidates = [
        (run.label, level.level, level.tok_s_per_user, level.tok_s_per_chip)
        for run in runs
        for level in run.levels
        if level.tok_s_per_user is not None
        and level.tok_s_per_user > 0
        and level.tok_s_per_chip is not None
        and level.tok_s_per_chip > 0
    ]
    front = set(pareto_front([(user, chip) for _, _, user, chip in candidates]))
    return [
        ParetoPoint(run, level, user, chip, index in front) for index, (run, level, user, chip) in enumerate(candidates)
    ]


Metric = Literal["ttft_p50_ms", "ttft_p90_ms", "itl_p50_ms", "itl_p90_ms"]


def latency_series(run: RunFigures, metric: Metric) -> list[tuple[float, float]]:
    """(output tok/s, latency ms) of the run's levels that have both, in rising throughput."""
    pairs = [(level.output_tok_s, getattr(level, metric)) for level in run.levels]
    return sorted((x, y) for x, y in pairs if x is not None and y is not None)


def cost_series(run: RunFigures) -> list[tuple[float, float, bool | None]]:
    """(achieved req/s, USD per million output tokens, met the SLO) of the run's priced levels, in rising rate."""
    rows = [(level.request_rate, level.usd_per_million, level.meets_slo) for level in run.levels]
    return sorted(((x, y, ok) for x, y, ok in rows if x is not None and y is not None), key=lambda row: row[0])

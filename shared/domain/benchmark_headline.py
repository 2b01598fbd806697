"""Headline figures of a stored benchmark result, their better direction, and how runs compare (pure).

A sweep as the benchmarker stores it (``points`` with a ``level`` each) is read by :func:`sweep_headline`, which the
benchmarker and the gateway share; :func:`headline_from_result` reads every other shape a result
may have: the top level, a ``summary`` object, or another list of points (``levels``, ``results``, ``sweep``,
each flat or with its own ``summary``), where the peak output throughput, its level and the other figures at
that level are taken.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Literal

__all__ = [
    "HEADLINE_DIRECTIONS",
    "best_run_per_metric",
    "headline_change_pct",
    "headline_from_result",
    "sweep_headline",
]

# Each headline figure and which way is better.
HEADLINE_DIRECTIONS: dict[str, Literal["high", "low"]] = {
    "peak_request_throughput": "high",
    "median_ttft_ms_at_knee": "low",
    "p99_ttft_ms_at_knee": "low",
    "median_itl_ms_at_knee": "low",
    "p99_itl_ms_at_knee": "low",
    "request_throughput": "high",
    "output_throughput": "high",
    "total_token_throughput": "high",
    "peak_output_throughput": "high",
    "max_output_tokens_per_s": "high",
    "request_goodput": "high",
    "mean_ttft_ms": "low",
    "median_ttft_ms": "low",
    "p99_ttft_ms": "low",
    "mean_tpot_ms": "low",
    "mean_itl_ms": "low",
    "p99_itl_ms": "low",
    "mean_e2el_ms": "low",
    # economics (``shared.domain.bench_economics``, written by the controller)
    "peak_output_tokens_per_s_per_chip": "high",
    "usd_per_million_output_tokens_at_peak": "low",
    "usd_per_million_output_tokens_at_slo": "low",
    "goodput_tokens_per_s_per_chip_at_slo": "high",
    "prefix_cache_hit_rate_at_peak": "high",
}


def _number(value: Any) -> float | None:
    """``value`` as a float when it is a finite number (``bool`` is not; NaN and infinities are not), else None."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _take(found: dict[str, float], source: Mapping[str, Any]) -> None:
    """Copy the headline figures of ``source`` that ``found`` does not have yet."""
    for key in HEADLINE_DIRECTIONS:
        value = _number(source.get(key))
        if value is not None and key not in found:
            found[key] = value


def _peak(points: list[Any]) -> tuple[float, float | None, dict[str, Any]] | None:
    """The point with the highest output throughput: (throughput, its level, its figures)."""
    best: tuple[float, float | None, dict[str, Any]] | None = None
    for point in points:
        if not isinstance(point, dict):
            continue
        nested = point.get("summary")
        figures: dict[str, Any] = nested if isinstance(nested, dict) else point
        value = _number(figures.get("output_throughput"))
        if value is not None:
            level = point.get(
                "level", point.get("concurrency", point.get("max_concurrency", point.get("request_rate")))
            )
            if best is None or value > best[0]:
                best = (value, _number(level), figures)
    return best


def headline_from_result(result: Mapping[str, Any] | None) -> dict[str, float]:
    """Headline numbers from a result that is not a benchmarker sweep, wherever the result keeps them."""
    if not result:
        return {}
    found: dict[str, float] = {}
    _take(found, result)
    summary = result.get("summary")
    if isinstance(summary, dict):
        _take(found, summary)
    for list_key in ("points", "levels", "results", "sweep"):
        points = result.get(list_key)
        if not isinstance(points, list):
            continue
        best = _peak(points)
        if best is not None:
            found["peak_output_throughput"] = best[0]
            if best[1] is not None:
                found["peak_at_level"] = best[1]
            _take(found, best[2])  # the other figures are those at the peak
        break
    return found


def headline_change_pct(now: Mapping[str, float], before: Mapping[str, float]) -> dict[str, float]:
    """The % change of each figure from ``before`` (figures absent or zero before are left out)."""
    change: dict[str, float] = {}
    for name, value in now.items():
        if before.get(name):
            change[name] = round((value - before[name]) / before[name] * 100.0, 2)
    return change


def best_run_per_metric(runs: Iterable[tuple[str, Mapping[str, float]]]) -> dict[str, str]:
    """For each headline figure, the run id (of ``(run_id, figures)``) with the best value."""
    rows = list(runs)
    best: dict[str, str] = {}
    for name, better in HEADLINE_DIRECTIONS.items():
        scored = [(metrics[name], run_id) for run_id, metrics in rows if name in metrics]
        if scored:
            pick = max(scored) if better == "high" else min(scored)
            best[name] = pick[1]
    return best


def sweep_headline(result: Mapping[str, Any] | None) -> dict[str, Any]:
    """A stored sweep's headline: peak output throughput, where it was reached, the knee, and latencies at the
    knee (or at the peak when no knee was found). Empty when no point has an output throughput."""
    raw = (result or {}).get("points")
    points = [point for point in raw if isinstance(point, dict)] if isinstance(raw, list) else []
    scored = [(value, point) for point in points if (value := _number(point.get("output_throughput"))) is not None]
    if not scored:
        return {}
    peak_value, peak = max(scored, key=lambda item: item[0])
    knee = (result or {}).get("knee") or {}
    knee_level = knee.get("level") if isinstance(knee, dict) else None
    knee_at = _number(knee_level)
    at = next((p for p in points if knee_at is not None and _number(p.get("level")) == knee_at), peak)
    return {
        "peak_output_throughput": round(peak_value, 2),
        "peak_request_throughput": _number(peak.get("request_throughput")),
        "peak_at_level": peak.get("level"),
        "knee_level": knee_level,
        "saturated": bool(knee.get("saturated")) if isinstance(knee, dict) else False,
        "median_ttft_ms_at_knee": _number(at.get("median_ttft_ms")),
        "p99_ttft_ms_at_knee": _number(at.get("p99_ttft_ms")),
        "median_itl_ms_at_knee": _number(at.get("median_itl_ms")),
        "p99_itl_ms_at_knee": _number(at.get("p99_itl_ms")),
        **_economics_at(result, peak),
    }


def _economics_at(result: Mapping[str, Any] | None, peak: Mapping[str, Any]) -> dict[str, Any]:
    """The peak level's tokens per second per chip and price per million output tokens, the cheapest price at the
    SLO with its goodput per chip, and the server's prefix-cache hit rate at the peak, where the result has them."""
    figures: dict[str, Any] = {}
    hit_rate = _number(peak.get("prefix_cache_hit_rate"))
    if hit_rate is not None:
        figures["prefix_cache_hit_rate_at_peak"] = hit_rate
    economics = (result or {}).get("economics")
    if not isinstance(economics, Mapping):
        return figures
    rows = economics.get("points")
    level = _number(peak.get("level"))
    for row in rows if isinstance(rows, list) else []:
        if isinstance(row, Mapping) and level is not None and _number(row.get("level")) == level:
            figures["peak_output_tokens_per_s_per_chip"] = _number(row.get("output_tokens_per_s_per_chip"))
            figures["usd_per_million_output_tokens_at_peak"] = _number(row.get("usd_per_million_output_tokens"))
    at_slo = economics.get("cheapest_at_slo")
    if isinstance(at_slo, Mapping):
        figures["usd_per_million_output_tokens_at_slo"] = _number(at_slo.get("usd_per_million_output_tokens_at_slo"))
        figures["goodput_tokens_per_s_per_chip_at_slo"] = _number(at_slo.get("goodput_tokens_per_s_per_chip"))
    return {key: value for key, value in figures.items() if value is not None}

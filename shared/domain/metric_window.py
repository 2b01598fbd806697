"""Window figures and running totals from the cumulative vLLM series the monitor keeps in every sample.

Why its own module: averaging each sample's percentiles and per-interval counts over a window weighs a quiet
minute like a busy one and is not a percentile of anything. The monitor already stores, with every sample, the
raw cumulative series of the scrape (``MonitorSample.counters``, a :class:`MetricsSnapshot` record): counters,
``request_success_total`` by finished reason, HTTP 5xx, and each latency histogram's buckets, ``_sum`` and
``_count``. Everything here is derived from those.

Rules:

* A window figure is the *increase* of a cumulative series from the window's first usable sample to its last,
  over ``span_s`` (the time between those two samples, not the requested window length).
* A restart (:func:`shared.domain.metrics.is_restart`: a counter fell, or the process start time changed) splits
  the samples into segments. Each segment's increase is counted on its own and the segments are added; a
  segment that began inside the span counts from zero, because its server started after the sample before it.
* Mean latency is ``delta(_sum) / delta(_count)``; percentiles come from the summed bucket deltas with
  Prometheus' ``histogram_quantile`` interpolation (:func:`shared.domain.metrics.histogram_quantile`).
* Totals are cumulative since a server started: the sum of the last value of every segment.
* A sample without the raw series (the probe failed, the server runs with ``--disable-log-stats``, or the record
  predates them) is skipped, and the reason is counted.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import pairwise

from shared.domain.metrics import QUANTILES, Histogram, MetricsSnapshot, histogram_quantile, is_restart
from shared.domain.models import MonitorSample

__all__ = [
    "LATENCY_NAMES",
    "PERCENTILE_SOURCE",
    "MetricPoint",
    "MetricTotals",
    "MetricWindow",
    "RequestCounts",
    "WindowLatency",
    "counter_totals",
    "points_from_samples",
    "summary_lines",
    "window_figures",
]

LATENCY_NAMES: Mapping[str, str] = {
    "ttft": "time to first token",
    "itl": "inter-token latency",
    "e2e": "end-to-end latency",
}
PERCENTILE_SOURCE = "bucket deltas of the vLLM histograms, interpolated as Prometheus histogram_quantile"
_BAD_REASONS = ("error", "abort")
_TOKEN_COUNTERS = ("prompt_tokens", "generation_tokens")


@dataclass(frozen=True)
class MetricPoint:
    """One usable sample: when it was taken and the cumulative series it read."""

    taken_at: datetime
    snapshot: MetricsSnapshot


@dataclass(frozen=True)
class RequestCounts:
    """Requests and tokens counted by vLLM. ``None`` means the server did not export the series."""

    finished: float | None = None
    served: float | None = None
    errored: float | None = None
    aborted: float | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    http_5xx: float | None = None

    @property
    def error_rate(self) -> float | None:
        """Share of finished requests that ended in ``error`` or ``abort``."""
        if not self.finished:
            return None
        return ((self.errored or 0.0) + (self.aborted or 0.0)) / self.finished


@dataclass(frozen=True)
class WindowLatency:
    """One latency histogram over a window: ``mean_s`` from sum and count deltas, percentiles from buckets."""

    count: float
    mean_s: float | None
    p50_s: float | None = None
    p90_s: float | None = None
    p99_s: float | None = None


@dataclass(frozen=True)
class MetricWindow:
    """What the server did between the first and last usable sample of a window."""

    start: datetime
    end: datetime
    points: int
    restarts: int
    counts: RequestCounts
    latency: Mapping[str, WindowLatency] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def span_s(self) -> float:
        return (self.end - self.start).total_seconds()

    def per_second(self, value: float | None) -> float | None:
        return None if value is None or self.span_s <= 0 else value / self.span_s


@dataclass(frozen=True)
class MetricTotals:
    """Cumulative counts since ``since``: the start of the oldest server seen (or its first sample)."""

    since: datetime
    since_server_start: bool
    points: int
    restarts: int
    counts: RequestCounts


def points_from_samples(samples: Iterable[MonitorSample]) -> tuple[list[MetricPoint], dict[str, int]]:
    """Usable points, oldest first, and how many samples were skipped for each reason."""
    points: list[MetricPoint] = []
    skipped: dict[str, int] = {}
    for sample in sorted(samples, key=lambda s: s.taken_at):
        snapshot = MetricsSnapshot.from_record(sample.counters) if sample.counters else None
        if not sample.counters:
            reason = "no /metrics read (the probe failed or the server was not up)"
        elif snapshot is None:
            reason = "recorded without the raw cumulative series (an older sample format)"
        elif not snapshot.has_vllm_series:
            reason = "no vllm:* series (the server runs with --disable-log-stats)"
        else:
            points.append(MetricPoint(sample.taken_at, snapshot))
            continue
        skipped[reason] = skipped.get(reason, 0) + 1
    return points, skipped


@dataclass
class _Walk:
    """Running sums while the points are walked in order."""

    increase: dict[str, float] = field(default_factory=dict)
    segment_ends: dict[str, float] = field(default_factory=dict)
    buckets: dict[str, Histogram] = field(default_factory=dict)
    broken_layouts: set[str] = field(default_factory=set)
    restarts: int = 0


def _series(snapshot: MetricsSnapshot) -> dict[str, float]:
    """The cumulative series a window or a total is made of, flat: ``c:`` counters, ``r:`` reasons, ``h:`` sums."""
    series = {f"c:{name}": snapshot.counters[name] for name in _TOKEN_COUNTERS if name in snapshot.counters}
    series.update({f"r:{reason}": value for reason, value in snapshot.success_by_reason.items()})
    if snapshot.http_5xx is not None:
        series["http_5xx"] = snapshot.http_5xx
    for name, hist in snapshot.histograms.items():
        series[f"h:{name}:sum"] = hist.sum
        series[f"h:{name}:count"] = hist.count
    return series


def _walk(points: Sequence[MetricPoint]) -> tuple[_Walk, dict[str, float]]:
    """Increases over the points (segments added) and the series of the last point."""
    walk = _Walk()
    before = _series(points[0].snapshot)
    for previous, current in pairwise(points):
        reset = is_restart(previous.snapshot, current.snapshot)
        now = _series(current.snapshot)
        if reset:
            walk.restarts += 1
            for name, value in before.items():
                walk.segment_ends[name] = walk.segment_ends.get(name, 0.0) + value
        for name, value in now.items():
            if reset:
                walk.increase[name] = walk.increase.get(name, 0.0) + value
            elif name in before:
                walk.increase[name] = walk.increase.get(name, 0.0) + max(0.0, value - before[name])
        _add_bucket_deltas(walk, previous.snapshot, current.snapshot, reset=reset)
        before = now
    return walk, before


def _add_bucket_deltas(walk: _Walk, previous: MetricsSnapshot, current: MetricsSnapshot, *, reset: bool) -> None:
    for name, hist in current.histograms.items():
        earlier = previous.histograms.get(name)
        if reset:
            delta: Histogram | None = hist
        elif earlier is None:
            continue
        else:
            delta = hist.minus(earlier)
        so_far = walk.buckets.get(name)
        if delta is None or (so_far is not None and so_far.bounds != delta.bounds):
            walk.broken_layouts.add(name)
        elif so_far is None:
            walk.buckets[name] = delta
        else:
            walk.buckets[name] = Histogram(
                bounds=delta.bounds,
                cumulative=tuple(a + b for a, b in zip(so_far.cumulative, delta.cumulative, strict=True)),
                sum=so_far.sum + delta.sum,
                count=so_far.count + delta.count,
            )


def _counts(series: Mapping[str, float]) -> RequestCounts:
    reasons = {name[2:]: value for name, value in series.items() if name.startswith("r:")}
    finished = sum(reasons.values()) if reasons else None
    errored = reasons.get("error", 0.0) if reasons else None
    aborted = reasons.get("abort", 0.0) if reasons else None
    served = None if finished is None else max(0.0, finished - sum(reasons.get(r, 0.0) for r in _BAD_REASONS))
    return RequestCounts(
        finished=finished,
        served=served,
        errored=errored,
        aborted=aborted,
        prompt_tokens=series.get("c:prompt_tokens"),
        generation_tokens=series.get("c:generation_tokens"),
        http_5xx=series.get("http_5xx"),
    )


def window_figures(points: Sequence[MetricPoint]) -> MetricWindow | None:
    """Figures between the first and last point (oldest first); None with fewer than two points."""
    if len(points) < 2:
        return None
    walk, _ = _walk(points)
    latency: dict[str, WindowLatency] = {}
    for name in LATENCY_NAMES:
        count = walk.increase.get(f"h:{name}:count")
        total = walk.increase.get(f"h:{name}:sum")
        if count is None or total is None:
            continue
        quantiles: list[float | None] = [None] * len(QUANTILES)
        buckets = walk.buckets.get(name)
        if buckets is not None and name not in walk.broken_layouts:
            quantiles = [histogram_quantile(q, buckets.bounds, buckets.cumulative) for q in QUANTILES]
        p50, p90, p99 = quantiles
        latency[name] = WindowLatency(
            count=count, mean_s=total / count if count > 0 else None, p50_s=p50, p90_s=p90, p99_s=p99
        )
    notes = [
        f"{name}: the bucket layout changed inside the window, so no percentiles (the mean still holds)"
        for name in sorted(walk.broken_layouts)
    ]
    return MetricWindow(
        start=points[0].taken_at,
        end=points[-1].taken_at,
        points=len(points),
        restarts=walk.restarts,
        counts=_counts(walk.increase),
        latency=latency,
        notes=tuple(notes),
    )


def counter_totals(points: Sequence[MetricPoint]) -> MetricTotals | None:
    """Cumulative counts over the points (oldest first): every segment's last value, added; None with none."""
    if not points:
        return None
    walk, last = _walk(points)
    totals = dict(walk.segment_ends)
    for name, value in last.items():
        totals[name] = totals.get(name, 0.0) + value
    started = _server_start(points[0].snapshot)
    return MetricTotals(
        since=started or points[0].taken_at,
        since_server_start=started is not None,
        points=len(points),
        restarts=walk.restarts,
        counts=_counts(totals),
    )


def _server_start(snapshot: MetricsSnapshot) -> datetime | None:
    """When the server that exported ``snapshot`` started (process start, else when its counters were created)."""
    for stamp in (snapshot.started_at, snapshot.created_at):
        if stamp is not None and math.isfinite(stamp) and stamp > 0:
            return datetime.fromtimestamp(stamp, tz=UTC)
    return None


# ---------------------------------------------------------------------------------------------- human units


def when_text(moment: datetime) -> str:
    """``2026-12-04 17:02:11 UTC``: a moment people read (never an epoch number)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def duration_text(seconds: float) -> str:
    """``45 s``, ``57 min``, ``2 h 05 min``, ``3 d 04 h``."""
    whole = round(max(seconds, 0.0))
    if whole < 120:
        return f"{whole} s"
    minutes = whole // 60
    if minutes < 120:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours:02d} h"


def latency_text(seconds: float | None) -> str:
    """``4.2 ms``, ``183 ms``, ``1.52 s``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    if seconds < 0.01:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    return f"{seconds:.2f} s"


def count_text(value: float | None) -> str:
    """``1,234,567``; ``-`` when the series is not exported."""
    return "-" if value is None else f"{value:,.0f}"


def _count_and_rate(value: float | None, window: MetricWindow, unit: str) -> str:
    rate = window.per_second(value)
    return count_text(value) if rate is None else f"{count_text(value)} ({rate:,.2f} {unit}/s)"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.2%}"


def summary_lines(totals: MetricTotals | None, window: MetricWindow | None) -> list[str]:
    """The figures in human units, one ``label: value`` line each (readable at any width)."""
    lines: list[str] = []
    if totals is not None:
        origin = "server start" if totals.since_server_start else "first sample"
        lines.append(f"Totals since {when_text(totals.since)} ({origin}; {totals.restarts} restart(s) added up)")
        lines += _count_lines(totals.counts)
    if window is None:
        return lines
    lines.append(
        f"Window {when_text(window.start)} to {when_text(window.end)} ({duration_text(window.span_s)}, "
        f"{window.points} samples, {window.restarts} restart(s))"
    )
    c = window.counts
    lines += [
        f"  requests finished: {_count_and_rate(c.finished, window, 'req')}",
        f"  requests served: {count_text(c.served)}",
        f"  errored / aborted: {count_text(c.errored)} / {count_text(c.aborted)} (error rate {_share(c.error_rate)})",
        f"  prompt tokens: {_count_and_rate(c.prompt_tokens, window, 'tok')}",
        f"  generation tokens: {_count_and_rate(c.generation_tokens, window, 'tok')}",
        f"  HTTP 5xx: {count_text(c.http_5xx)}",
    ]
    for name, figures in window.latency.items():
        percentiles = ", ".join(
            f"{label} {latency_text(value)}"
            for label, value in (("p50", figures.p50_s), ("p90", figures.p90_s), ("p99", figures.p99_s))
        )
        lines.append(
            f"  {LATENCY_NAMES[name]}: mean {latency_text(figures.mean_s)}, {percentiles} "
            f"({count_text(figures.count)} observed)"
        )
    if window.latency:
        lines.append(f"  (means from histogram sum and count deltas; percentiles from {PERCENTILE_SOURCE})")
    lines += [f"  note: {note}" for note in window.notes]
    return lines


def _count_lines(counts: RequestCounts) -> list[str]:
    return [
        f"  requests served: {count_text(counts.served)}",
        f"  errored / aborted: {count_text(counts.errored)} / {count_text(counts.aborted)}",
        f"  prompt tokens: {count_text(counts.prompt_tokens)}",
        f"  generation tokens: {count_text(counts.generation_tokens)}",
        f"  HTTP 5xx: {count_text(counts.http_5xx)}",
    ]

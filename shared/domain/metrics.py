"""vLLM metrics as pure values: one snapshot per scrape, and the SLIs of the interval between two snapshots.

Why pure: the numbers operators act on (TTFT p99, tokens/s, KV use) must be right across restarts, renamed
metrics and multi-engine servers, and that is easiest to prove with tables of inputs. The adapter parses the
Prometheus text with ``prometheus_client`` and hands the samples to :func:`snapshot_from_samples`; everything
after that lives here.

Rules (docs/reference/vllm.md §4):

* Samples are keyed by *sample* name (``vllm:prompt_tokens_total``), not family name, and summed over the
  ``engine`` and ``model_name`` labels (data parallel servers export one series per engine).
* Renamed metrics: the current name wins; the old one (``gpu_cache_usage_perc``, ``gpu_prefix_cache_*``,
  ``time_per_output_token_seconds``) is used only when the new one is absent, and that is recorded.
* A missing series stays missing (``None``), never zero.
* A counter that goes down, or a changed ``process_start_time_seconds`` / ``request_success_created``, is a
  restart: the interval then counts from zero, so rates are never negative.
* Latency percentiles come from bucket deltas with Prometheus' linear interpolation (``histogram_quantile``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "COUNTER_SAMPLES",
    "COUNT_ONLY_FAMILIES",
    "GAUGE_SAMPLES",
    "HISTOGRAM_FAMILIES",
    "QUANTILES",
    "WANTED_FAMILIES",
    "Histogram",
    "IntervalStats",
    "LatencySummary",
    "MetricsSnapshot",
    "derive_interval",
    "histogram_quantile",
    "is_restart",
    "snapshot_from_samples",
]

QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.99)

# Our short name -> sample names, newest first (a later entry is a pre-rename fallback).
COUNTER_SAMPLES: Mapping[str, tuple[str, ...]] = {
    "prompt_tokens": ("vllm:prompt_tokens_total",),
    "generation_tokens": ("vllm:generation_tokens_total",),
    "preemptions": ("vllm:num_preemptions_total",),
    "prefix_cache_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_cache_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    # Engine steps: the progress heartbeat (docs/reference/vllm.md §4.6, "Stall").
    "iterations": ("vllm:iteration_tokens_total_count",),
}
GAUGE_SAMPLES: Mapping[str, tuple[str, ...]] = {
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
}
# The SLIs the issue asks for. Queue time and TPOT are left out on purpose: each histogram costs the parser about
# 0.4 ms per scrape, queue time's 0.3 s bucket floor hides everything short, and ITL already covers decode speed.
HISTOGRAM_FAMILIES: Mapping[str, tuple[str, ...]] = {
    "ttft": ("vllm:time_to_first_token_seconds",),
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "e2e": ("vllm:e2e_request_latency_seconds",),
}
_SUCCESS = "vllm:request_success_total"
_SUCCESS_CREATED = "vllm:request_success_created"
_PROCESS_START = "process_start_time_seconds"
_HTTP_REQUESTS = "http_requests_total"
_CACHE_CONFIG = "vllm:cache_config_info"
# What vLLM says it allocated and chose (``shared.domain.effective_config`` reads them); each label's value is
# kept only when it is short and plain (untrusted text from the VM), at most these labels.
CACHE_CONFIG_LABELS = (
    "cache_dtype",
    "block_size",
    "num_gpu_blocks",
    "kv_cache_size_tokens",
    "kv_cache_max_concurrency",
    "gpu_memory_utilization",
    "enable_prefix_caching",
)
_PLAIN_LABEL = re.compile(r"[A-Za-z0-9_.+-]{1,32}")
# Gauges where one saturated engine is the news, so engines combine by max rather than sum.
_MAX_GAUGES = frozenset({"kv_cache_usage"})

_SUFFIXES = ("_total", "_created", "_bucket", "_sum", "_count")


def _family_of(sample_name: str) -> str:
    for suffix in _SUFFIXES:
        if sample_name.endswith(suffix):
            return sample_name[: -len(suffix)]
    return sample_name


COUNT_ONLY_FAMILIES: frozenset[str] = frozenset({"vllm:iteration_tokens_total"})
"""Histograms read only for their ``_count`` (engine steps): their buckets may be dropped before parsing."""

WANTED_FAMILIES: frozenset[str] = frozenset(
    {_family_of(name) for names in COUNTER_SAMPLES.values() for name in names}
    | {name for names in GAUGE_SAMPLES.values() for name in names}
    | {name for names in HISTOGRAM_FAMILIES.values() for name in names}
    | {_family_of(_SUCCESS), _family_of(_HTTP_REQUESTS), _PROCESS_START, _CACHE_CONFIG}
)
"""Family names the derivations read; the adapter may drop every other family before parsing (speed)."""


@dataclass(frozen=True)
class Histogram:
    """One histogram summed over engines: ascending upper bounds (last is +Inf) and cumulative counts."""

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]
    sum: float
    count: float

    def minus(self, earlier: Histogram) -> Histogram | None:
        """Bucket-wise delta; None when the bucket layout changed (a different server build)."""
        if earlier.bounds != self.bounds:
            return None
        return Histogram(
            bounds=self.bounds,
            cumulative=tuple(
                max(0.0, now - then) for now, then in zip(self.cumulative, earlier.cumulative, strict=True)
            ),
            sum=max(0.0, self.sum - earlier.sum),
            count=max(0.0, self.count - earlier.count),
        )

    def to_record(self) -> dict[str, Any]:
        return {
            "le": [_encode_bound(b) for b in self.bounds],
            "cum": list(self.cumulative),
            "sum": self.sum,
            "count": self.count,
        }

    @classmethod
    def from_record(cls, data: Mapping[str, Any]) -> Histogram:
        return cls(
            bounds=tuple(_decode_bound(b) for b in data["le"]),
            cumulative=tuple(float(c) for c in data["cum"]),
            sum=float(data["sum"]),
            count=float(data["count"]),
        )


def _encode_bound(bound: float) -> float | str:
    return "+Inf" if math.isinf(bound) else bound


def _decode_bound(bound: float | str) -> float:
    return math.inf if bound in ("+Inf", "Inf", "inf") else float(bound)


@dataclass(frozen=True)
class MetricsSnapshot:
    """What one ``/metrics`` scrape said, reduced to the series the controller uses.

    Counters are cumulative since the server started; ``started_at`` and ``created_at`` identify the server
    process (restart detection); ``legacy_names`` lists old metric names that had to stand in for new ones.
    """

    counters: Mapping[str, float] = field(default_factory=dict)
    success_by_reason: Mapping[str, float] = field(default_factory=dict)
    gauges: Mapping[str, float] = field(default_factory=dict)
    histograms: Mapping[str, Histogram] = field(default_factory=dict)
    http_requests: float | None = None
    http_5xx: float | None = None
    started_at: float | None = None
    created_at: float | None = None
    legacy_names: tuple[str, ...] = ()
    cache_config: Mapping[str, str] = field(default_factory=dict)

    @property
    def has_vllm_series(self) -> bool:
        """False when the server runs with ``--disable-log-stats`` (no ``vllm:*`` metrics at all)."""
        return bool(self.counters or self.gauges or self.histograms or self.success_by_reason)

    @property
    def requests_finished(self) -> float | None:
        return sum(self.success_by_reason.values()) if self.success_by_reason else None

    def to_record(self) -> dict[str, Any]:
        """A JSON-safe dict for ``MonitorSample.counters`` (the next tick derives its deltas from it)."""
        return {
            "counters": dict(self.counters),
            "success": dict(self.success_by_reason),
            "gauges": dict(self.gauges),
            "histograms": {name: hist.to_record() for name, hist in self.histograms.items()},
            "http_requests": self.http_requests,
            "http_5xx": self.http_5xx,
            "started_at": self.started_at,
            "created_at": self.created_at,
            "legacy": list(self.legacy_names),
            "cache_config": dict(self.cache_config),
        }

    @classmethod
    def from_record(cls, data: Mapping[str, Any]) -> MetricsSnapshot | None:
        """Inverse of :meth:`to_record`; None for a record that is not one (an old or empty sample)."""
        if not isinstance(data, Mapping) or "counters" not in data:
            return None
        try:
            return cls(
                counters={str(k): float(v) for k, v in data["counters"].items()},
                success_by_reason={str(k): float(v) for k, v in data.get("success", {}).items()},
                gauges={str(k): float(v) for k, v in data.get("gauges", {}).items()},
                histograms={str(k): Histogram.from_record(v) for k, v in data.get("histograms", {}).items()},
                http_requests=_opt_float(data.get("http_requests")),
                http_5xx=_opt_float(data.get("http_5xx")),
                started_at=_opt_float(data.get("started_at")),
                created_at=_opt_float(data.get("created_at")),
                legacy_names=tuple(str(n) for n in data.get("legacy", ())),
                cache_config=_plain_labels(data.get("cache_config") or {}),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return None


def _plain_labels(labels: Mapping[str, Any]) -> dict[str, str]:
    """The wanted cache-config labels whose values are short and plain; the rest (or anything odd) is left out."""
    return {
        name: str(labels[name])
        for name in CACHE_CONFIG_LABELS
        if isinstance(labels.get(name), str) and _PLAIN_LABEL.fullmatch(labels[name])
    }


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def snapshot_from_samples(samples: Iterable[tuple[str, Mapping[str, str], float]]) -> MetricsSnapshot:
    """Reduce parsed Prometheus samples ``(name, labels, value)`` to a :class:`MetricsSnapshot`."""
    wanted_scalars: dict[str, str] = {}
    for short, names in (*COUNTER_SAMPLES.items(), *GAUGE_SAMPLES.items()):
        for name in names:
            wanted_scalars[name] = short
    hist_family: dict[str, str] = {name: short for short, names in HISTOGRAM_FAMILIES.items() for name in names}
    max_combined = {name for short in _MAX_GAUGES for name in GAUGE_SAMPLES[short]}

    totals = _SampleTotals()
    for name, labels, value in samples:
        if not math.isfinite(value) and not name.endswith("_bucket"):
            continue
        special = _SPECIAL_SAMPLES.get(name)
        if name in wanted_scalars:
            totals.add_scalar(name, value, keep_max=name in max_combined)
        elif special is not None:
            special(totals, labels, value)
        elif (family := _family_of(name)) in hist_family:
            totals.add_histogram_sample(family, name, labels, value)

    legacy: list[str] = []
    counters = _pick(COUNTER_SAMPLES, totals.scalars, legacy)
    gauges = _pick(GAUGE_SAMPLES, totals.scalars, legacy)
    histograms = _histograms(totals, legacy)
    return MetricsSnapshot(
        counters=counters,
        success_by_reason=totals.success,
        gauges=gauges,
        histograms=histograms,
        http_requests=totals.http_total,
        http_5xx=totals.http_5xx,
        started_at=totals.started_at,
        created_at=min(totals.created) if totals.created else None,
        legacy_names=tuple(legacy),
        cache_config=totals.cache_config,
    )


@dataclass
class _SampleTotals:
    """Running totals while one scrape is read: the samples of every engine combined into one figure each."""

    scalars: dict[str, float] = field(default_factory=dict)  # by sample name
    success: dict[str, float] = field(default_factory=dict)  # by finished_reason
    created: list[float] = field(default_factory=list)
    buckets: dict[str, dict[float, float]] = field(default_factory=dict)  # by family, then bound
    sums: dict[str, float] = field(default_factory=dict)
    counts: dict[str, float] = field(default_factory=dict)
    http_total: float | None = None
    http_5xx: float | None = None
    started_at: float | None = None
    cache_config: dict[str, str] = field(default_factory=dict)

    def add_cache_config(self, labels: Mapping[str, str], value: float) -> None:
        """The first engine's cache configuration (engines of one server share it)."""
        if not self.cache_config:
            self.cache_config = _plain_labels(labels)

    def add_scalar(self, name: str, value: float, *, keep_max: bool) -> None:
        """Counters add up over engines; a few gauges (a usage share) take the worst engine instead."""
        if keep_max:
            self.scalars[name] = max(self.scalars.get(name, -math.inf), value)
        else:
            self.scalars[name] = self.scalars.get(name, 0.0) + value

    def add_success(self, labels: Mapping[str, str], value: float) -> None:
        reason = labels.get("finished_reason", "unknown")
        self.success[reason] = self.success.get(reason, 0.0) + value

    def add_created(self, labels: Mapping[str, str], value: float) -> None:
        self.created.append(value)

    def add_process_start(self, labels: Mapping[str, str], value: float) -> None:
        """The earliest start among the processes: a restart of any one moves it."""
        self.started_at = value if self.started_at is None else min(self.started_at, value)

    def add_http(self, labels: Mapping[str, str], value: float) -> None:
        """HTTP requests, and the 5xx among them (0 once any request was counted, None when never)."""
        self.http_total = (self.http_total or 0.0) + value
        if labels.get("status") == "5xx":
            self.http_5xx = (self.http_5xx or 0.0) + value
        elif self.http_5xx is None:
            self.http_5xx = 0.0

    def add_histogram_sample(self, family: str, name: str, labels: Mapping[str, str], value: float) -> None:
        if name.endswith("_bucket"):
            bound = _decode_bound(labels.get("le", "+Inf"))
            per_bound = self.buckets.setdefault(family, {})
            per_bound[bound] = per_bound.get(bound, 0.0) + value
        elif name.endswith("_sum"):
            self.sums[family] = self.sums.get(family, 0.0) + value
        elif name.endswith("_count"):
            self.counts[family] = self.counts.get(family, 0.0) + value


_SPECIAL_SAMPLES = {
    _SUCCESS: _SampleTotals.add_success,
    _SUCCESS_CREATED: _SampleTotals.add_created,
    _PROCESS_START: _SampleTotals.add_process_start,
    _HTTP_REQUESTS: _SampleTotals.add_http,
    _CACHE_CONFIG: _SampleTotals.add_cache_config,
}
"""Samples that are neither a wanted counter or gauge nor a histogram, each with how it is combined."""


def _histograms(totals: _SampleTotals, legacy: list[str]) -> dict[str, Histogram]:
    """One histogram per short name, from the first family name the server exposed (later ones are legacy)."""
    histograms: dict[str, Histogram] = {}
    for short, names in HISTOGRAM_FAMILIES.items():
        for position, family in enumerate(names):
            if family in totals.buckets:
                ordered = sorted(totals.buckets[family].items())
                cumulative = _monotone([count for _, count in ordered])
                histograms[short] = Histogram(
                    bounds=tuple(bound for bound, _ in ordered),
                    cumulative=tuple(cumulative),
                    sum=totals.sums.get(family, 0.0),
                    count=totals.counts.get(family, cumulative[-1] if cumulative else 0.0),
                )
                if position:
                    legacy.append(family)
                break
    return histograms


def _pick(table: Mapping[str, tuple[str, ...]], scalars: Mapping[str, float], legacy: list[str]) -> dict[str, float]:
    picked: dict[str, float] = {}
    for short, names in table.items():
        for position, name in enumerate(names):
            if name in scalars:
                picked[short] = scalars[name]
                if position:
                    legacy.append(name)
                break
    return picked


def _monotone(values: list[float]) -> list[float]:
    """Cumulative bucket counts never decrease; float noise in deltas must not make them."""
    out: list[float] = []
    running = 0.0
    for value in values:
        running = max(running, value)
        out.append(running)
    return out


def histogram_quantile(q: float, bounds: tuple[float, ...], cumulative: tuple[float, ...]) -> float | None:
    """Prometheus ``histogram_quantile``: linear interpolation inside the bucket that holds rank ``q * total``.

    Returns None with no observations. A rank in the +Inf bucket returns the highest finite bound (the
    histogram cannot say more). The first bucket interpolates from 0.
    """
    if not 0.0 < q < 1.0:
        raise ValueError(f"q: {q} must be strictly between 0 and 1")
    if not bounds or len(bounds) != len(cumulative):
        return None
    total = cumulative[-1]
    if total <= 0:
        return None
    rank = q * total
    for index, (upper, count) in enumerate(zip(bounds, cumulative, strict=True)):
        if count >= rank:
            if math.isinf(upper):
                finite = [b for b in bounds if not math.isinf(b)]
                return finite[-1] if finite else None
            lower = bounds[index - 1] if index > 0 else 0.0
            below = cumulative[index - 1] if index > 0 else 0.0
            in_bucket = count - below
            if in_bucket <= 0:
                return upper
            return lower + (upper - lower) * (rank - below) / in_bucket
    return None


@dataclass(frozen=True)
class LatencySummary:
    """Percentiles (seconds) of one latency histogram over one interval; ``count`` observations."""

    p50: float | None
    p90: float | None
    p99: float | None
    mean: float | None
    count: float

    @classmethod
    def of(cls, delta: Histogram) -> LatencySummary | None:
        if delta.count <= 0 and (not delta.cumulative or delta.cumulative[-1] <= 0):
            return None
        p50, p90, p99 = (histogram_quantile(q, delta.bounds, delta.cumulative) for q in QUANTILES)
        count = delta.count or delta.cumulative[-1]
        return cls(p50=p50, p90=p90, p99=p99, mean=(delta.sum / count) if count > 0 else None, count=count)


@dataclass(frozen=True)
class IntervalStats:
    """The SLIs of one interval between two scrapes (rates per second over ``elapsed_s``).

    ``None`` means "not measured" (the series is missing or there is no previous snapshot), never zero.
    """

    elapsed_s: float
    reset: bool
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None
    prompt_tokens_per_s: float | None = None
    generation_tokens_per_s: float | None = None
    requests_per_s: float | None = None
    requests_finished: float | None = None
    finished_by_reason: Mapping[str, float] = field(default_factory=dict)
    preemptions: float | None = None
    iterations: float | None = None
    generation_tokens: float | None = None
    prompt_tokens: float | None = None
    prefix_cache_hit_rate: float | None = None
    http_5xx: float | None = None
    latency: Mapping[str, LatencySummary] = field(default_factory=dict)

    @property
    def progressed(self) -> bool | None:
        """Did the engine make progress (steps or tokens) in the interval? None when unknown."""
        signals = [value for value in (self.iterations, self.generation_tokens) if value is not None]
        if not signals:
            return None
        return any(value > 0 for value in signals)

    @property
    def active(self) -> bool:
        """Any sign of traffic: requests in flight, queued or finished, or prompt tokens read."""
        return any(
            (value or 0.0) > 0 for value in (self.running, self.waiting, self.requests_finished, self.prompt_tokens)
        )

    @property
    def error_share(self) -> float | None:
        """Share of finished requests that ended in ``error`` or ``abort``."""
        if not self.requests_finished:
            return None
        bad = self.finished_by_reason.get("error", 0.0) + self.finished_by_reason.get("abort", 0.0)
        return bad / self.requests_finished

    def slis(self) -> dict[str, float]:
        """Flat name -> value map for ``MonitorSample.slis`` and ``DeploymentStatus.slis`` (missing = absent)."""
        out: dict[str, float] = {"interval_s": round(self.elapsed_s, 3)}
        if self.reset:
            out["counter_reset"] = 1.0
        scalars = {
            "running": self.running,
            "waiting": self.waiting,
            "kv_cache_usage": self.kv_cache_usage,
            "prompt_tokens_per_s": self.prompt_tokens_per_s,
            "generation_tokens_per_s": self.generation_tokens_per_s,
            "requests_per_s": self.requests_per_s,
            "requests_finished": self.requests_finished,
            "preemptions": self.preemptions,
            "engine_steps": self.iterations,
            "prefix_cache_hit_rate": self.prefix_cache_hit_rate,
            "http_5xx": self.http_5xx,
            "error_share": self.error_share,
        }
        out.update({name: float(value) for name, value in scalars.items() if value is not None})
        for reason, count in self.finished_by_reason.items():
            out[f"finished_{reason}"] = float(count)
        for name, summary in self.latency.items():
            for label, value in (("p50", summary.p50), ("p90", summary.p90), ("p99", summary.p99)):
                if value is not None:
                    out[f"{name}_{label}_s"] = value
            if summary.mean is not None:
                out[f"{name}_mean_s"] = summary.mean
            out[f"{name}_count"] = summary.count
        return out


def is_restart(previous: MetricsSnapshot, current: MetricsSnapshot) -> bool:
    """True when ``current`` comes from a different server process than ``previous``."""
    for before, after in ((previous.started_at, current.started_at), (previous.created_at, current.created_at)):
        if before is not None and after is not None and abs(before - after) > 1e-3:
            return True
    for name, value in current.counters.items():
        if name in previous.counters and value < previous.counters[name]:
            return True
    for reason, value in current.success_by_reason.items():
        if value < previous.success_by_reason.get(reason, 0.0):
            return True
    for name, hist in current.histograms.items():
        earlier = previous.histograms.get(name)
        if earlier is not None and hist.count < earlier.count:
            return True
    return (
        previous.http_requests is not None
        and current.http_requests is not None
        and current.http_requests < previous.http_requests
    )


def derive_interval(previous: MetricsSnapshot | None, current: MetricsSnapshot, elapsed_s: float) -> IntervalStats:
    """SLIs between two scrapes ``elapsed_s`` apart. Gauges come from ``current``; rates need ``previous``."""
    running = current.gauges.get("running")
    waiting = current.gauges.get("waiting")
    kv_cache_usage = current.gauges.get("kv_cache_usage")
    if previous is None or elapsed_s <= 0:
        return IntervalStats(
            elapsed_s=max(elapsed_s, 0.0), reset=False, running=running, waiting=waiting, kv_cache_usage=kv_cache_usage
        )
    reset = is_restart(previous, current)
    base = MetricsSnapshot() if reset else previous

    def delta(name: str) -> float | None:
        if name not in current.counters:
            return None
        if name not in base.counters and not reset:
            return None
        return max(0.0, current.counters[name] - base.counters.get(name, 0.0))

    def rate(value: float | None) -> float | None:
        return None if value is None else value / elapsed_s

    finished_by_reason: dict[str, float] = {}
    if current.success_by_reason and (reset or previous.success_by_reason):
        for reason, value in current.success_by_reason.items():
            finished_by_reason[reason] = max(0.0, value - base.success_by_reason.get(reason, 0.0))
    finished = sum(finished_by_reason.values()) if finished_by_reason else None

    latency = _latency_over(current, base, reset=reset)
    queries, hits = delta("prefix_cache_queries"), delta("prefix_cache_hits")
    http_5xx = None
    if current.http_5xx is not None and (reset or previous.http_5xx is not None):
        http_5xx = max(0.0, current.http_5xx - (base.http_5xx or 0.0))
    prompt, generation = delta("prompt_tokens"), delta("generation_tokens")
    return IntervalStats(
        elapsed_s=elapsed_s,
        reset=reset,
        prompt_tokens_per_s=rate(prompt),
        generation_tokens_per_s=rate(generation),
        requests_per_s=rate(finished),
        requests_finished=finished,
        finished_by_reason=finished_by_reason,
        preemptions=delta("preemptions"),
        iterations=delta("iterations"),
        generation_tokens=generation,
        prompt_tokens=prompt,
        prefix_cache_hit_rate=(hits / queries) if queries and hits is not None else None,
        http_5xx=http_5xx,
        latency=latency,
        running=running,
        waiting=waiting,
        kv_cache_usage=kv_cache_usage,
    )


def _latency_over(current: MetricsSnapshot, base: MetricsSnapshot, *, reset: bool) -> dict[str, LatencySummary]:
    """Percentiles of what each histogram observed since ``base`` (all of it after a restart)."""
    latency: dict[str, LatencySummary] = {}
    for name, hist in current.histograms.items():
        earlier = base.histograms.get(name)
        if earlier is None and not reset:
            continue
        delta_hist = hist if earlier is None else hist.minus(earlier)
        if delta_hist is None:
            delta_hist = hist
        summary = LatencySummary.of(delta_hist)
        if summary is not None:
            latency[name] = summary
    return latency

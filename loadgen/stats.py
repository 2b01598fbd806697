"""Benchmark metrics exactly as ``vllm bench serve`` defines them, and the knee of a sweep.

The definitions are ``docs/reference/vllm.md`` §5.

Pure: records in, numbers out. Definitions, all on the client's ``time.perf_counter()``:

- TTFT: request sent -> first chunk carrying a token (``loadgen.sse``), per successful request;
- ITL: every gap between consecutive token chunks, pooled over all successful requests;
- E2EL: request sent -> last token chunk (the usage chunk does not count);
- TPOT: per request ``(E2EL - TTFT) / (output_tokens - 1)`` when ``output_tokens > 1``, then averaged; for goodput
  a 1-token output has TPOT 0;
- output tokens: the server's ``usage.completion_tokens``; when absent, the caller's retokenized count, else the
  number of token chunks; input tokens: ``usage.prompt_tokens`` when present, else the dataset's length;
- throughput: completed / duration, Σ output / duration, (Σ input + Σ output) / duration, where duration is
  the wall time of the measured requests (warm-up excluded);
- goodput: requests meeting every SLO given (inclusive) / duration, and their output tokens / duration
  (``output_goodput``, what the cost at the SLO is priced on); None when no SLO is given;
- peaks: ``max_output_tokens_per_s`` and ``max_concurrent_requests`` from one-second buckets rebuilt from
  timestamps, as vLLM does;
- client queue time: arrival (the schedule's time) -> sent, i.e. the wait for the concurrency cap;
- mean, median, population std, and percentiles with linear interpolation (numpy's default); empty -> 0.

Keys of :func:`summarize` follow vLLM's ``--save-result`` file (``p99``, ``p99.9``), so results compare with it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "DEFAULT_PERCENTILES",
    "Knee",
    "RequestRecord",
    "SweepPoint",
    "find_knee",
    "mean",
    "percentile",
    "percentile_key",
    "population_std",
    "summarize",
]

DEFAULT_PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0)
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el", "client_queue_time", "e2el_including_client_queue")


@dataclass(slots=True)
class RequestRecord:
    """One measured request. Times are ``perf_counter`` seconds; durations are seconds."""

    index: int
    arrival: float
    """When the schedule released the request (before any wait for the concurrency cap)."""
    start: float = 0.0
    """When it was sent."""
    prompt_tokens: int = 0
    expected_output_tokens: int = 0
    success: bool = False
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    """E2EL: sent -> last token chunk."""
    output_tokens: int | None = None
    """``usage.completion_tokens`` (or a retokenized count); None when the server sent no usage."""
    token_chunks: int = 0
    error: str = ""
    """Failure cause: ``http_503``, ``timeout``, ``connect_error``, ``disconnected``, ``no_tokens``, ..."""
    detail: str = ""
    status: int | None = None
    response_id: str = ""
    """The server's id for the response (``cmpl-...``), to find the request in server logs."""
    reused_tokens: int = 0
    """Prompt tokens (as the server counts them) an earlier request of the run began with: what the prefix cache
    may serve (``loadgen.workloads``)."""

    @property
    def client_queue_time(self) -> float:
        return max(0.0, self.start - self.arrival)

    @property
    def counted_output_tokens(self) -> int:
        """What the metrics use: usage when the server sent it, else the token chunks."""
        return self.output_tokens if self.output_tokens is not None else self.token_chunks

    def as_dict(self, origin: float) -> dict[str, Any]:
        """JSON-able, times relative to ``origin`` (the run's start)."""
        return {
            "index": self.index,
            "arrival_s": round(self.arrival - origin, 6),
            "start_s": round(self.start - origin, 6),
            "success": self.success,
            "error": self.error,
            "detail": self.detail,
            "status": self.status,
            "response_id": self.response_id,
            "reused_tokens": self.reused_tokens,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "token_chunks": self.token_chunks,
            "ttft_ms": round(self.ttft * 1000, 4),
            "e2el_ms": round(self.latency * 1000, 4),
            "client_queue_ms": round(self.client_queue_time * 1000, 4),
            "itl_ms": [round(gap * 1000, 4) for gap in self.itl],
        }


def mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else 0.0


def population_std(values: Sequence[float]) -> float:
    """numpy's ``np.std`` (ddof=0)."""
    if not values:
        return 0.0
    centre = mean(values)
    return math.sqrt(math.fsum((value - centre) ** 2 for value in values) / len(values))


def percentile(values: Sequence[float], p: float, *, presorted: bool = False) -> float:
    """numpy's ``np.percentile`` with linear interpolation; 0 for no values (vLLM's ``values or 0``)."""
    if not 0 <= p <= 100:
        raise ValueError(f"percentile: {p} must be within 0..100")
    if not values:
        return 0.0
    ordered = values if presorted else sorted(values)
    rank = (len(ordered) - 1) * p / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def percentile_key(p: float) -> str:
    """``99`` -> ``p99``, ``99.9`` -> ``p99.9`` (vLLM's spelling)."""
    return f"p{int(p)}" if float(p).is_integer() else f"p{p}"


def _describe(name: str, values: list[float], percentiles: Sequence[float], into: dict[str, Any]) -> None:
    ordered = sorted(values)
    into[f"mean_{name}_ms"] = mean(ordered) * 1000
    into[f"median_{name}_ms"] = percentile(ordered, 50, presorted=True) * 1000
    into[f"std_{name}_ms"] = population_std(ordered) * 1000
    for p in percentiles:
        into[f"{percentile_key(p)}_{name}_ms"] = percentile(ordered, p, presorted=True) * 1000


def _peaks(successes: Sequence[RequestRecord]) -> tuple[float, int]:
    """vLLM's one-second buckets: token chunks per second and requests active per second."""
    if not successes:
        return 0.0, 0
    first = min(record.start for record in successes)
    last = max(record.start + record.latency for record in successes)
    buckets = math.ceil(last - first) + 1
    tokens = [0] * buckets
    active = [0] * buckets
    for record in successes:
        moment = record.start + record.ttft
        times = [moment]
        for gap in record.itl:
            moment += gap
            times.append(moment)
        for when in times:
            slot = int(when - first)
            if 0 <= slot < buckets:
                tokens[slot] += 1
        for slot in range(int(record.start - first), int(record.start + record.latency - first) + 1):
            active[slot] += 1
    return float(max(tokens)), max(active)


def summarize(
    records: Sequence[RequestRecord],
    duration_s: float,
    *,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    slo_ms: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The metrics of one measured set of requests, keyed as in vLLM's result file, plus ``failures``.

    ``slo_ms`` may hold ``ttft``, ``tpot`` and ``e2el`` (milliseconds); a request is good when it meets all given.
    """
    if duration_s <= 0:
        raise ValueError(f"duration_s: {duration_s} must be > 0 (wall time of the measured requests)")
    unknown = set(slo_ms or {}) - {"ttft", "tpot", "e2el"}
    if unknown:
        raise ValueError(f"slo_ms: unknown metric(s) {sorted(unknown)} (use ttft, tpot, e2el)")
    successes = [record for record in records if record.success]
    failures = Counter(record.error or "unknown" for record in records if not record.success)
    ttfts: list[float] = []
    tpots: list[float] = []
    all_tpots: list[float] = []
    itls: list[float] = []
    e2els: list[float] = []
    total_input = 0
    total_output = 0
    for record in successes:
        output = record.counted_output_tokens
        total_output += output
        total_input += record.prompt_tokens
        tpot = 0.0
        if output > 1:
            tpot = (record.latency - record.ttft) / (output - 1)
            tpots.append(tpot)
        all_tpots.append(tpot)
        itls.extend(record.itl)
        ttfts.append(record.ttft)
        e2els.append(record.latency)
    good: int | None = None
    good_output = 0
    if slo_ms:
        limits = {name: value / 1000 for name, value in slo_ms.items()}
        good = 0
        outputs = [record.counted_output_tokens for record in successes]
        for ttft, tpot, e2el, output in zip(ttfts, all_tpots, e2els, outputs, strict=True):
            measured = {"ttft": ttft, "tpot": tpot, "e2el": e2el}
            if all(measured[name] <= limit for name, limit in limits.items()):
                good += 1
                good_output += output
    max_tokens_per_s, max_concurrent = _peaks(successes)
    queue = [record.client_queue_time for record in successes]
    summary: dict[str, Any] = {
        "duration": duration_s,
        "completed": len(successes),
        "failed": len(records) - len(successes),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": len(successes) / duration_s,
        "request_goodput": None if good is None else good / duration_s,
        "output_goodput": None if good is None else good_output / duration_s,
        "output_throughput": total_output / duration_s,
        "total_token_throughput": (total_input + total_output) / duration_s,
        "max_output_tokens_per_s": max_tokens_per_s,
        "max_concurrent_requests": max_concurrent,
    }
    _describe("ttft", ttfts, percentiles, summary)
    _describe("tpot", tpots, percentiles, summary)
    _describe("itl", itls, percentiles, summary)
    _describe("e2el", e2els, percentiles, summary)
    _describe("client_queue_time", queue, percentiles, summary)
    _describe("e2el_including_client_queue", [q + e for q, e in zip(queue, e2els, strict=True)], percentiles, summary)
    summary["failures"] = dict(sorted(failures.items()))
    summary["arrival_rate"], summary["completion_rate"] = _rates(records, successes)
    return summary


def _rates(records: Sequence[RequestRecord], successes: Sequence[RequestRecord]) -> tuple[float | None, float | None]:
    """Requests per second over the arrival window and over the completion window (None when undefined).

    A server that keeps up finishes requests as fast as they arrive, whatever the run's length; one that falls
    behind spreads the completions out. Comparing the two is fairer than throughput over the whole run, which
    the last requests' latency drags down in short runs.
    """
    arrivals = [record.arrival for record in records]
    ends = sorted(record.start + record.latency for record in successes)
    arrival_span = max(arrivals) - min(arrivals) if len(arrivals) > 1 else 0.0
    completion_span = ends[-1] - ends[0] if len(ends) > 1 else 0.0
    arrival = (len(arrivals) - 1) / arrival_span if arrival_span > 0 else None
    completion = (len(ends) - 1) / completion_span if completion_span > 0 else None
    return arrival, completion


@dataclass(frozen=True)
class SweepPoint:
    """One load level of a sweep, reduced to what the knee needs."""

    level: float
    """Concurrency, or offered request rate (req/s)."""
    request_throughput: float
    mean_e2el_ms: float
    completed: int = 1
    failed: int = 0
    arrival_rate: float | None = None
    completion_rate: float | None = None

    def kept_up(self, share: float) -> bool:
        """Rate mode: did completions keep pace with arrivals (or, without those, throughput with the offer)?"""
        if self.arrival_rate and self.completion_rate is not None:
            return self.completion_rate >= share * self.arrival_rate and self.failed == 0
        return self.request_throughput >= share * self.level


@dataclass(frozen=True)
class Knee:
    """Where a sweep saturates."""

    level: float | None
    index: int | None
    saturated: bool
    """True when the sweep went past the knee (more load bought little or no throughput)."""
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {"level": self.level, "index": self.index, "saturated": self.saturated, "reason": self.reason}


def find_knee(
    points: Iterable[SweepPoint],
    mode: Literal["concurrency", "rate"],
    *,
    rate_kept_share: float = 0.9,
    plateau_gain: float = 0.1,
) -> Knee:
    """The saturation point of a sweep (levels in increasing order).

    Concurrency sweeps: the level with the highest power, throughput / mean latency (Kleinrock's operating
    point, where queueing starts to cost more latency than it buys throughput); saturated when the sweep's
    last step gained less than ``plateau_gain`` (10 %) throughput: more load only added latency.
    Rate sweeps: the highest offered rate at which completions kept pace with arrivals (``rate_kept_share``,
    90 %, and no failures); saturated when a higher rate fell short. Points where every request failed cannot
    be the knee.
    """
    ordered = sorted(points, key=lambda point: point.level)
    usable = [(i, p) for i, p in enumerate(ordered) if p.completed > 0 and p.request_throughput > 0]
    if not usable:
        return Knee(None, None, False, "no level completed a request")
    if mode == "rate":
        kept = [(i, p) for i, p in usable if p.kept_up(rate_kept_share)]
        if not kept:
            first = ordered[0]
            return Knee(first.level, 0, True, f"already short of the offered rate at {first.level:g} req/s")
        index, point = kept[-1]
        beyond = [p for p in ordered if p.level > point.level]
        if beyond:
            short = beyond[0]
            pace = short.completion_rate if short.completion_rate is not None else short.request_throughput
            return Knee(point.level, index, True, f"{short.level:g} req/s offered, {pace:.3g} req/s completed")
        return Knee(point.level, index, False, f"kept up with every offered rate up to {point.level:g} req/s")
    best_index, best = max(usable, key=lambda item: item[1].request_throughput / max(item[1].mean_e2el_ms, 1e-9))
    if best_index == usable[-1][0]:
        return Knee(best.level, best_index, False, "best throughput per latency at the highest level: load further")
    (_, below), (_, top) = usable[-2], usable[-1]
    gain = top.request_throughput / below.request_throughput - 1.0
    if gain < plateau_gain:
        reason = (
            f"best throughput per latency at {best.level:g}; from {below.level:g} to {top.level:g} throughput changed "
            f"{gain * 100:+.0f}% while mean latency went {below.mean_e2el_ms:.0f} -> {top.mean_e2el_ms:.0f} ms"
        )
        return Knee(best.level, best_index, True, reason)
    reason = f"best throughput per latency at {best.level:g}; the highest level still gained {gain * 100:.0f}%"
    return Knee(best.level, best_index, False, reason)

"""The canary completion: proof that a deployment the monitor calls SERVING really completes a request.

Why: ``/health`` and ``/v1/models`` answer 200 while every completion fails (a broken chat template, an
engine that errors on its first step, a proxy that refuses the route). So when a deployment has had no
traffic to prove it, the monitor sends one tiny chat completion (``canary_request``: one token, temperature 0,
a fixed prompt, the deployment's own API key) and a failed one turns SERVING into DEGRADED with the reason
"canary completion failed: ..." (never a restart: DEGRADED heals nothing by itself).

When one is due (:func:`canary_due`), first match wins:

========================================================  =====  ==================================================
situation                                                  due    why
========================================================  =====  ==================================================
interval 0                                                 no     canaries are turned off
``/health`` or ``/v1/models`` not answering with a model   no     the phase model already says why it is not serving
traffic in the interval (besides the monitor's canaries)   no     users' requests are the proof; metrics judge them
the last canary failed                                     yes    retried each idle tick, so DEGRADED rests on fresh
                                                                  evidence and clears as soon as one passes
a canary less than the interval ago                        no     the rate limit
a request less than the interval ago (the record's         no     it served lately
``last_request_at`` or a recent sample's traffic)
otherwise                                                  yes
========================================================  =====  ==================================================

The canary is itself a request in vLLM's counters, so the interval after it shows one finished request: it is
not traffic (:func:`traffic_besides_canaries`), or a canary would keep an idle deployment from ever being idle;
and its latency and status are not judged again as users' (:class:`CanaryPlan`), or a cold first token would
read as a TTFT breach.
Its facts are SLIs (``canary_at`` in epoch seconds, ``canary_latency_ms``, ``canary_ok`` 1 or 0) on the sample
of the tick that sent it and, carried forward, on the deployment record.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from shared.domain.health import Assessment, ProbeOutcome, ProbeResult
from shared.domain.metrics import IntervalStats
from shared.domain.models import DeploymentStatus, MonitorSample, Phase

__all__ = [
    "CANARY_CONDITION",
    "CANARY_MAX_TOKENS",
    "CANARY_PATH",
    "CANARY_PROMPT",
    "CANARY_SLIS",
    "CanaryCheck",
    "CanaryMemory",
    "CanaryPlan",
    "canaries_in_interval",
    "canary_due",
    "canary_request",
    "canary_slis",
    "carried_canary_slis",
    "judge_canary",
    "last_canary",
    "last_traffic_at",
    "plan_canary",
    "ready_for_canary",
    "traffic_besides_canaries",
    "with_canary",
]

CANARY_PATH = "/v1/chat/completions"
CANARY_PROMPT = "Reply with the single word OK."
CANARY_MAX_TOKENS = 1
CANARY_CONDITION = "canary_failed"
CANARY_SLIS = ("canary_at", "canary_latency_ms", "canary_ok")


def canary_request(model: str) -> dict[str, Any]:
    """The body of the canary: streamed like users' chats (with the usage chunk), one greedy token."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": CANARY_PROMPT}],
        "max_tokens": CANARY_MAX_TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


@dataclass(frozen=True)
class CanaryCheck:
    """What the canary's answer held, read but not judged (:func:`judge_canary` judges).

    ``detail`` says why on any outcome but OK, and on OK names a problem inside the stream (an error chunk, a
    chunk that is not JSON), else it is empty."""

    outcome: ProbeOutcome
    status: int | None = None
    latency_s: float = 0.0
    detail: str = ""
    choices: int = 0  # stream chunks that carried a choice
    text: str = ""  # the completion's text, bounded
    completion_tokens: int | None = None  # from the usage chunk, when there was one
    done: bool = False  # the stream ended with ``data: [DONE]``


def judge_canary(check: CanaryCheck) -> str | None:
    """None when the canary proves a completion, else why not (an error, no choice, no token, a cut stream)."""
    if check.outcome is not ProbeOutcome.OK:
        return check.detail or check.outcome.value
    if check.detail:
        return check.detail
    if check.choices == 0:
        return "the answer carried no choice"
    if not check.text and not check.completion_tokens:
        return "the completion was empty (no token generated)"
    if not check.done:
        return "the stream ended without [DONE]"
    return None


@dataclass(frozen=True)
class CanaryMemory:
    """The last canary: when it was sent and whether it passed."""

    at: datetime
    ok: bool


def last_canary(slis: Iterable[Mapping[str, float]]) -> CanaryMemory | None:
    """The newest canary named in any of these SLI maps (the record's and the recent samples')."""
    newest: CanaryMemory | None = None
    for values in slis:
        at = values.get("canary_at")
        if at is None:
            continue
        memory = CanaryMemory(datetime.fromtimestamp(at, UTC), values.get("canary_ok", 0.0) >= 1.0)
        if newest is None or memory.at > newest.at:
            newest = memory
    return newest


def canaries_in_interval(history: Sequence[MonitorSample]) -> int:
    """Canaries sent since the newest sample that carried counters (that sample's own included: its canary went
    out after its scrape), i.e. within the interval the next rates cover. ``history`` is newest first."""
    count = 0
    for sample in history:
        if "canary_at" in sample.slis:
            count += 1
        if sample.counters:
            break
    return count


def _traffic(
    running: float | None, waiting: float | None, finished: float | None, prompt: float | None, canaries: int
) -> bool:
    """Requests in flight or queued, or more finished than the canaries sent (prompt tokens count only
    without canaries: theirs are in there too)."""
    if (running or 0.0) > 0 or (waiting or 0.0) > 0:
        return True
    if canaries <= 0:
        return (finished or 0.0) > 0 or (prompt or 0.0) > 0
    return (finished or 0.0) > canaries


def traffic_besides_canaries(interval: IntervalStats | None, canaries: int) -> bool:
    """Traffic in the interval that the monitor's own canaries do not explain (None: no metrics, none seen)."""
    if interval is None:
        return False
    return _traffic(interval.running, interval.waiting, interval.requests_finished, interval.prompt_tokens, canaries)


def last_traffic_at(history: Sequence[MonitorSample]) -> datetime | None:
    """When the newest recent sample (newest first) saw traffic besides the canaries: exact where the record's
    ``last_request_at`` is written lazily."""
    for index, sample in enumerate(history):
        slis = sample.slis
        canaries = canaries_in_interval(history[index + 1 :])
        if sample.counters and _traffic(
            slis.get("running"),
            slis.get("waiting"),
            slis.get("requests_finished"),
            slis.get("prompt_tokens_per_s"),
            canaries,
        ):
            return sample.taken_at
    return None


def ready_for_canary(result: ProbeResult) -> bool:
    """``/health`` answered and ``/v1/models`` named a model: the server says it can take a completion."""
    models = result.models
    return result.answered and models is not None and models.outcome is ProbeOutcome.OK and bool(result.served_models)


def canary_due(
    *,
    ready: bool,
    traffic: bool,
    last: CanaryMemory | None,
    last_request_at: datetime | None,
    now: datetime,
    interval_s: float,
) -> bool:
    """Whether to send a canary this tick (the table in the module docstring)."""
    if interval_s <= 0 or not ready or traffic:
        return False
    if last is not None and not last.ok:
        return True
    if last is not None and (now - last.at).total_seconds() < interval_s:
        return False
    return last_request_at is None or (now - last_request_at).total_seconds() >= interval_s


@dataclass(frozen=True)
class CanaryPlan:
    """What one tick's probe says about canaries: was there traffic besides them, is one due, and the interval
    the phase is assessed on (without the canaries' own requests: a canary is judged by its answer, so its
    first-request TTFT or the 5xx of a failed one must not count again as users' latency or errors)."""

    traffic: bool
    due: bool
    assessed: IntervalStats | None


def plan_canary(
    result: ProbeResult,
    interval: IntervalStats | None,
    history: Sequence[MonitorSample],
    status: DeploymentStatus,
    now: datetime,
    interval_s: float,
) -> CanaryPlan:
    """:func:`canary_due` from a probe, its interval, the recent samples (newest first) and the stored status."""
    canaries = canaries_in_interval(history)
    traffic = traffic_besides_canaries(interval, canaries)
    last = last_canary([status.slis, *(sample.slis for sample in history)])
    requests = [at for at in (status.last_request_at, last_traffic_at(history)) if at is not None]
    due = canary_due(
        ready=ready_for_canary(result),
        traffic=traffic,
        last=last,
        last_request_at=max(requests, default=None),
        now=now,
        interval_s=interval_s,
    )
    assessed = interval
    if interval is not None and canaries and not traffic:  # every request in it was a canary
        assessed = replace(interval, latency={}, requests_finished=None, finished_by_reason={}, http_5xx=None)
    return CanaryPlan(traffic, due, assessed)


def with_canary(
    assessment: Assessment, failure: str | None, prior_phase: Phase, prior_since: datetime | None, now: datetime
) -> Assessment:
    """The assessment with a failed canary folded in: SERVING becomes DEGRADED, DEGRADED gains the reason;
    a worse phase (STALLED, DOWN, ...) stands as it is."""
    if failure is None or assessment.phase not in (Phase.SERVING, Phase.DEGRADED):
        return assessment
    reason = f"canary completion failed: {failure}"
    if assessment.phase is Phase.DEGRADED:
        return Assessment(
            Phase.DEGRADED,
            assessment.since,
            f"{reason}; {assessment.reason}",
            (CANARY_CONDITION, *assessment.conditions),
        )
    since = prior_since if prior_phase is Phase.DEGRADED and prior_since is not None else now
    return Assessment(Phase.DEGRADED, since, reason, (CANARY_CONDITION,))


def canary_slis(at: datetime, check: CanaryCheck | None, failure: str | None) -> dict[str, float]:
    """The SLIs of a canary sent at ``at`` (nothing when none was sent)."""
    if check is None:
        return {}
    return {
        "canary_at": at.timestamp(),
        "canary_latency_ms": round(check.latency_s * 1000.0, 1),
        "canary_ok": 0.0 if failure else 1.0,
    }


def carried_canary_slis(slis: Mapping[str, float]) -> dict[str, float]:
    """The canary SLIs of a stored SLI map, to carry onto the record when this tick sent no canary."""
    return {name: slis[name] for name in CANARY_SLIS if name in slis}

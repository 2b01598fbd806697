"""The phase model of a serving deployment: BOOTING, COMPILING, SERVING, DEGRADED, STALLED, DOWN.

Why it is not just ``/health``: vLLM answers ``/health`` 200 while its engine is deadlocked (vllm#39863), and
refuses connections both while starting and after a crash. So the phase comes from the probe outcome *and*
what happened before (did it ever serve? since when?) *and* the metrics history (is there token progress?).
Everything here is pure; thresholds come from ``DeploymentSpec.health`` (:class:`HealthThresholds`).

Rules, first match wins:

=====================================  =========  ============================================================
probe                                  phase      why
=====================================  =========  ============================================================
no answer, never served, within budget BOOTING    vLLM binds its port only once ready (weights, KV, compile)
no answer, never served, budget spent  DOWN       the boot failed or hangs
no answer after having served          DOWN       crashed (the server exits with its engine)
``/health`` 5xx                        DOWN       the engine is flagged dead
``/health`` 200, ``/v1/models`` 401    DEGRADED   the controller's API key is rejected
``/health`` 200, models not ready      COMPILING  answering but not serving yet
running > 0 and no engine step and     STALLED    hung engine behind a healthy ``/health``
no token for ``stall_after_s``
SLO breach, KV saturation, queueing,   DEGRADED   serving, but users feel it
preemptions, errors
otherwise                              SERVING
=====================================  =========  ============================================================

So SERVING proves no completion by itself: when no traffic did, the monitor sends a canary completion
(``shared.domain.canary``), and a failed one turns SERVING into DEGRADED after these rules.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Literal

from shared.domain.metrics import IntervalStats, MetricsSnapshot, derive_interval
from shared.domain.models import HealthThresholds, MonitorSample, NodeState, Phase

__all__ = [
    "MONITORED_PHASES",
    "Assessment",
    "EndpointCheck",
    "HealthThresholds",
    "HistoryPoint",
    "PriorState",
    "ProbeOutcome",
    "ProbeResult",
    "assess",
    "healing_action",
    "history_point",
    "idle_for",
    "interval_since",
]

MONITORED_PHASES = frozenset({Phase.BOOTING, Phase.COMPILING, Phase.SERVING, Phase.DEGRADED, Phase.STALLED, Phase.DOWN})
"""Phases the monitor owns; any other phase belongs to the reconciler and is left alone."""

_LOST_NODE_STATES = frozenset({NodeState.PREEMPTED, NodeState.TERMINATED})


class ProbeOutcome(StrEnum):
    """How one HTTP request to the server ended (``MonitorSample.probe`` stores the health outcome)."""

    OK = "ok"
    REFUSED = "refused"  # connection refused / unreachable: not listening (starting, or crashed)
    TIMEOUT = "timeout"  # connected or tried, no answer in time: hung or overloaded
    UNAUTHORIZED = "unauthorized"  # 401/403: API key missing or wrong
    SERVER_ERROR = "server_error"  # 5xx: on /health, the engine is dead
    CLIENT_ERROR = "client_error"  # other 4xx
    ERROR = "error"  # protocol error, unreadable body


@dataclass(frozen=True)
class EndpointCheck:
    """One request: its outcome, HTTP status (None without a response), latency and a short reason."""

    outcome: ProbeOutcome
    status: int | None = None
    latency_s: float = 0.0
    detail: str = ""


@dataclass(frozen=True)
class ProbeResult:
    """Everything one probe of one server learned. ``models``/``metrics_check`` are None when not asked."""

    base_url: str
    health: EndpointCheck
    models: EndpointCheck | None = None
    served_models: tuple[str, ...] = ()
    max_model_len: int | None = None
    version: str | None = None
    metrics_check: EndpointCheck | None = None
    metrics: MetricsSnapshot | None = None

    @property
    def answered(self) -> bool:
        """``/health`` answered 200."""
        return self.health.outcome is ProbeOutcome.OK

    @property
    def outcome(self) -> ProbeOutcome:
        """The outcome worth recording: health's, or the models check's when health was fine but it was not."""
        if self.answered and self.models is not None and self.models.outcome is not ProbeOutcome.OK:
            return self.models.outcome
        return self.health.outcome


@dataclass(frozen=True)
class HistoryPoint:
    """What the phase model needs from one earlier sample (newest first in a history)."""

    taken_at: datetime
    answered: bool
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None
    generation_tokens: float | None = None  # cumulative counter values
    iterations: float | None = None


@dataclass(frozen=True)
class PriorState:
    """The deployment's stored phase and clocks before this probe."""

    phase: Phase
    phase_since: datetime | None = None
    serving_since: datetime | None = None


@dataclass(frozen=True)
class Assessment:
    """The phase this probe implies, since when, and the reasons (shown to users and in events)."""

    phase: Phase
    since: datetime
    reason: str
    conditions: tuple[str, ...] = field(default_factory=tuple)


def history_point(sample: MonitorSample) -> HistoryPoint:
    """What the phase model reads from a stored sample."""
    counters = sample.counters.get("counters", {}) if sample.counters else {}
    return HistoryPoint(
        taken_at=sample.taken_at,
        answered=bool(sample.counters),
        running=sample.slis.get("running"),
        waiting=sample.slis.get("waiting"),
        kv_cache_usage=sample.slis.get("kv_cache_usage"),
        generation_tokens=counters.get("generation_tokens"),
        iterations=counters.get("iterations"),
    )


def interval_since(history: Sequence[MonitorSample], result: ProbeResult, now: datetime) -> IntervalStats | None:
    """Rates over the interval since the newest sample that carried counters (``history`` newest first); None
    when vLLM gave no metrics this time."""
    if result.metrics is None:
        return None
    for sample in history:
        previous = MetricsSnapshot.from_record(sample.counters) if sample.counters else None
        if previous is not None:
            return derive_interval(previous, result.metrics, (now - sample.taken_at).total_seconds())
    return derive_interval(None, result.metrics, 0.0)


def _held_since(now: datetime, history: Sequence[HistoryPoint], holds: Callable[[HistoryPoint], bool]) -> datetime:
    """The oldest time from which ``holds`` was true at every sample up to now (``now`` if only now)."""
    since = now
    for point in history:
        if not holds(point):
            break
        since = point.taken_at
    return since


def assess(
    result: ProbeResult,
    interval: IntervalStats | None,
    history: Sequence[HistoryPoint],
    prior: PriorState,
    now: datetime,
    thresholds: HealthThresholds,
) -> Assessment:
    """Decide the phase for one probe. ``history`` holds earlier samples, newest first."""

    def done(phase: Phase, reason: str, conditions: tuple[str, ...] = ()) -> Assessment:
        keep = phase is prior.phase and prior.phase_since is not None
        return Assessment(phase, prior.phase_since if keep and prior.phase_since else now, reason, conditions)

    health = result.health
    if health.outcome is ProbeOutcome.SERVER_ERROR:
        return done(Phase.DOWN, f"engine dead: /health answered HTTP {health.status}")
    if health.outcome is not ProbeOutcome.OK:
        what = health.detail or health.outcome.value
        if prior.serving_since is None and prior.phase is not Phase.DOWN:
            booting_since = prior.phase_since if prior.phase in (Phase.BOOTING, Phase.COMPILING) else None
            started = booting_since or now
            waited = (now - started).total_seconds()
            if waited <= thresholds.boot_budget_s:
                return Assessment(
                    Phase.BOOTING, started, f"no answer yet ({health.outcome.value}) after {waited:.0f} s"
                )
            return done(
                Phase.DOWN, f"no answer {waited:.0f} s after boot began (budget {thresholds.boot_budget_s:.0f} s)"
            )
        if prior.serving_since is None:
            return done(Phase.DOWN, f"still no answer: {what}")
        return done(Phase.DOWN, f"no answer after having served: {what}")

    models = result.models
    if models is not None and models.outcome is ProbeOutcome.UNAUTHORIZED:
        return done(Phase.DEGRADED, "the API key was rejected by /v1/models (HTTP 401)", ("api_key_rejected",))
    if models is not None and (models.outcome is not ProbeOutcome.OK or not result.served_models):
        return done(Phase.COMPILING, f"/health is up but /v1/models is not ready ({models.detail or 'no models'})")

    snapshot = result.metrics
    if snapshot is None or not snapshot.has_vllm_series:
        why = "no vllm:* metrics (started with --disable-log-stats?)" if snapshot is not None else "metrics unavailable"
        return done(Phase.SERVING, f"serving; {why}", ("metrics_missing",))

    stalled = _stall(snapshot, interval, history, now, thresholds)
    if stalled:
        return done(Phase.STALLED, stalled)

    conditions = _degradations(snapshot, interval, history, now, thresholds)
    if conditions:
        return done(Phase.DEGRADED, "degraded: " + "; ".join(conditions), conditions)
    return done(Phase.SERVING, "serving")


def _stall(
    snapshot: MetricsSnapshot,
    interval: IntervalStats | None,
    history: Sequence[HistoryPoint],
    now: datetime,
    thresholds: HealthThresholds,
) -> str:
    running = snapshot.gauges.get("running") or 0.0
    if running <= 0 or interval is None or interval.reset or interval.progressed is not False:
        return ""
    generation = snapshot.counters.get("generation_tokens")
    iterations = snapshot.counters.get("iterations")

    def flat(point: HistoryPoint) -> bool:
        return (
            point.answered
            and (point.running or 0.0) > 0
            and point.generation_tokens == generation
            and point.iterations == iterations
        )

    since = _held_since(now, history, flat)
    flat_s = (now - since).total_seconds()
    if flat_s >= thresholds.stall_after_s:
        return (
            f"stalled: {running:.0f} request(s) running but no engine step or token for {flat_s:.0f} s "
            f"(/health still answers 200)"
        )
    return ""


def _degradations(
    snapshot: MetricsSnapshot,
    interval: IntervalStats | None,
    history: Sequence[HistoryPoint],
    now: datetime,
    thresholds: HealthThresholds,
) -> tuple[str, ...]:
    found: list[str] = []
    if interval is not None:
        for name, limit in (("ttft", thresholds.ttft_p90_max_s), ("itl", thresholds.itl_p90_max_s)):
            summary = interval.latency.get(name)
            if summary is not None and summary.p90 is not None and summary.p90 > limit:
                found.append(f"{name} p90 {summary.p90:.3f} s > {limit:g} s")
        if interval.preemptions:
            found.append(f"{interval.preemptions:.0f} preemption(s): KV cache exhausted")
        share = interval.error_share
        if share is not None and share > thresholds.error_share_max:
            found.append(f"{share:.0%} of requests ended in error/abort (> {thresholds.error_share_max:.0%})")
        if interval.http_5xx:
            found.append(f"{interval.http_5xx:.0f} HTTP 5xx answer(s)")

    kv = snapshot.gauges.get("kv_cache_usage")
    if kv is not None and kv >= thresholds.kv_cache_usage_max:
        since = _held_since(
            now, history, lambda p: p.kv_cache_usage is not None and p.kv_cache_usage >= thresholds.kv_cache_usage_max
        )
        held = (now - since).total_seconds()
        if held >= thresholds.kv_saturated_after_s:
            found.append(f"KV cache {kv:.0%} full for {held:.0f} s")
    waiting = snapshot.gauges.get("waiting")
    if waiting is not None and waiting > 0:
        since = _held_since(now, history, lambda p: (p.waiting or 0.0) > 0)
        held = (now - since).total_seconds()
        if held >= thresholds.queued_after_s:
            found.append(f"{waiting:.0f} request(s) queued for {held:.0f} s")
    return tuple(found)


HealingAction = Literal["restart", "reprovision"]


def healing_action(
    phase: Phase,
    phase_since: datetime,
    now: datetime,
    thresholds: HealthThresholds,
    node_states: Sequence[NodeState | None] = (),
) -> HealingAction | None:
    """What to do about a sick deployment: hand a lost node to the provisioner at once; restart vLLM after grace."""
    if phase not in (Phase.DOWN, Phase.STALLED):
        return None
    if phase is Phase.DOWN and any(state in _LOST_NODE_STATES for state in node_states):
        return "reprovision"
    if (now - phase_since).total_seconds() >= thresholds.heal_after_s:
        return "restart"
    return None


def idle_for(last_activity: datetime | None, serving_since: datetime | None, now: datetime) -> float | None:
    """Seconds without traffic, counted from the last request (or from when serving began)."""
    reference = last_activity or serving_since
    return None if reference is None else max(0.0, (now - reference).total_seconds())

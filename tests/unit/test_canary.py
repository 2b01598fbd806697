"""The canary's pure rules (``shared.domain.canary``): when one is due, what counts as traffic besides it, how
its answer is judged, and how a failure changes the phase."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from shared.domain.canary import (
    CANARY_CONDITION,
    CanaryCheck,
    CanaryMemory,
    canaries_in_interval,
    canary_due,
    canary_request,
    canary_slis,
    carried_canary_slis,
    judge_canary,
    last_canary,
    last_traffic_at,
    plan_canary,
    ready_for_canary,
    traffic_besides_canaries,
    with_canary,
)
from shared.domain.health import Assessment, EndpointCheck, ProbeOutcome, ProbeResult
from shared.domain.metrics import IntervalStats, LatencySummary
from shared.domain.models import DeploymentStatus, MonitorSample, Phase

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
INTERVAL_S = 300.0


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


OK = EndpointCheck(ProbeOutcome.OK, 200, 0.01)
READY = ProbeResult(base_url="http://x", health=OK, models=OK, served_models=("gemma",))


@pytest.mark.parametrize(
    ("case", "ready", "traffic", "last", "last_request_s", "interval_s", "due"),
    [
        ("never sent, never used: prove the first SERVING", True, False, None, None, INTERVAL_S, True),
        ("turned off", True, False, None, None, 0.0, False),
        ("not answering /v1/models", False, False, None, None, INTERVAL_S, False),
        ("traffic in the interval is the proof", True, True, None, None, INTERVAL_S, False),
        ("traffic beats a failed canary too", True, True, CanaryMemory(ago(60), ok=False), None, INTERVAL_S, False),
        (
            "rate limit: a passed canary 299 s ago",
            True,
            False,
            CanaryMemory(ago(299), ok=True),
            None,
            INTERVAL_S,
            False,
        ),
        (
            "rate limit over: a passed canary 300 s ago",
            True,
            False,
            CanaryMemory(ago(300), ok=True),
            None,
            INTERVAL_S,
            True,
        ),
        (
            "a failed canary is retried on the next idle tick",
            True,
            False,
            CanaryMemory(ago(60), ok=False),
            None,
            INTERVAL_S,
            True,
        ),
        ("a request 120 s ago: served lately", True, False, None, 120.0, INTERVAL_S, False),
        ("idle for the interval since the last request", True, False, None, 300.0, INTERVAL_S, True),
        ("old canary, recent request", True, False, CanaryMemory(ago(900), ok=True), 60.0, INTERVAL_S, False),
    ],
)
def test_when_a_canary_is_due(
    case: str,
    ready: bool,
    traffic: bool,
    last: CanaryMemory | None,
    last_request_s: float | None,
    interval_s: float,
    due: bool,
) -> None:
    last_request_at = ago(last_request_s) if last_request_s is not None else None
    got = canary_due(
        ready=ready, traffic=traffic, last=last, last_request_at=last_request_at, now=NOW, interval_s=interval_s
    )
    assert got is due, case


@pytest.mark.parametrize(
    ("case", "interval", "canaries", "traffic"),
    [
        ("no metrics: nothing seen", None, 0, False),
        ("a quiet interval", IntervalStats(elapsed_s=60, reset=False, requests_finished=0.0), 0, False),
        ("a user's request", IntervalStats(elapsed_s=60, reset=False, requests_finished=1.0), 0, True),
        ("prompt tokens alone are traffic", IntervalStats(elapsed_s=60, reset=False, prompt_tokens=7.0), 0, True),
        (
            "the canary's own request is not traffic",
            IntervalStats(elapsed_s=60, reset=False, requests_finished=1.0, prompt_tokens=14.0),
            1,
            False,
        ),
        ("a request besides the canary", IntervalStats(elapsed_s=60, reset=False, requests_finished=2.0), 1, True),
        ("one running besides the canary", IntervalStats(elapsed_s=60, reset=False, running=1.0), 1, True),
        ("one queued besides the canary", IntervalStats(elapsed_s=60, reset=False, waiting=1.0), 1, True),
    ],
)
def test_traffic_besides_the_monitors_own_canaries(
    case: str, interval: IntervalStats | None, canaries: int, traffic: bool
) -> None:
    assert traffic_besides_canaries(interval, canaries) is traffic, case


def sample(seconds_ago: float, *, counters: bool, canary: bool) -> MonitorSample:
    taken_at = ago(seconds_ago)
    return MonitorSample(
        deployment_id="d",
        taken_at=taken_at,
        phase=Phase.SERVING,
        counters={"counters": {"generation_tokens": 1.0}} if counters else {},
        slis={"canary_at": taken_at.timestamp(), "canary_ok": 1.0} if canary else {},
    )


def test_canaries_in_the_interval_count_back_to_the_newest_sample_with_counters() -> None:
    # newest first: no metrics this time (a canary went out), then the counter sample (its canary went out after
    # its scrape, so it is inside the next interval), then an older canary that an earlier interval covered
    history = [
        sample(60, counters=False, canary=True),
        sample(120, counters=True, canary=True),
        sample(180, counters=True, canary=True),
    ]
    assert canaries_in_interval(history) == 2
    assert canaries_in_interval([sample(60, counters=True, canary=False)]) == 0
    assert canaries_in_interval([]) == 0


def served(seconds_ago: float, finished: float, *, canary: bool = False) -> MonitorSample:
    base = sample(seconds_ago, counters=True, canary=canary)
    return base.model_copy(update={"slis": {**base.slis, "requests_finished": finished}})


def test_the_last_traffic_is_read_from_the_samples_net_of_the_canaries() -> None:
    # newest first: 60 s ago one request finished, but that was the canary sent at the 120 s sample;
    # 180 s ago two finished with no canary before them: users
    history = [served(60, 1.0), served(120, 0.0, canary=True), served(180, 2.0), served(240, 0.0)]
    assert last_traffic_at(history) == ago(180)
    assert last_traffic_at([served(60, 1.0), served(120, 0.0, canary=True)]) is None
    assert last_traffic_at([served(60, 2.0), served(120, 0.0, canary=True)]) == ago(60)
    assert last_traffic_at([]) is None


def test_the_last_canary_is_the_newest_named_anywhere() -> None:
    record = {"canary_at": ago(600).timestamp(), "canary_ok": 1.0}
    newer_failed = {"canary_at": ago(60).timestamp(), "canary_ok": 0.0}
    assert last_canary([record, {}, newer_failed]) == CanaryMemory(ago(60), ok=False)
    assert last_canary([record]) == CanaryMemory(ago(600), ok=True)
    assert last_canary([{}, {"running": 1.0}]) is None


def test_plan_reads_the_rate_limit_from_the_record_and_the_canary_out_of_the_traffic() -> None:
    canaried = DeploymentStatus(phase=Phase.SERVING, slis={"canary_at": ago(120).timestamp(), "canary_ok": 1.0})
    interval = IntervalStats(elapsed_s=60, reset=False, requests_finished=1.0)
    history = [sample(60, counters=True, canary=True)]
    plan = plan_canary(READY, interval, history, canaried, NOW, INTERVAL_S)
    assert (plan.traffic, plan.due) == (False, False)
    # the newest canary rules: the sample's, 60 s ago, not the record's 120 s ago
    early = plan_canary(READY, interval, history, canaried, NOW + timedelta(seconds=239), INTERVAL_S)
    assert early.due is False
    later = plan_canary(READY, interval, history, canaried, NOW + timedelta(seconds=240), INTERVAL_S)
    assert (later.traffic, later.due) == (False, True)
    # a user's request in a recent sample holds the canary off, though the record's last_request_at is unset
    quiet = IntervalStats(elapsed_s=60, reset=False, requests_finished=0.0)
    busy = [served(60, 3.0), sample(120, counters=True, canary=False)]
    idle = [served(60, 0.0), sample(120, counters=True, canary=False)]
    assert plan_canary(READY, quiet, busy, canaried, NOW + timedelta(seconds=200), INTERVAL_S).due is False
    assert plan_canary(READY, quiet, idle, canaried, NOW + timedelta(seconds=200), INTERVAL_S).due is True


def test_the_phase_is_assessed_without_the_canaries_own_requests() -> None:
    slow = LatencySummary(count=1, p50=3.0, p90=3.0, p99=3.0, mean=3.0)
    only_canary = IntervalStats(
        elapsed_s=60,
        reset=False,
        requests_finished=1.0,
        finished_by_reason={"error": 1.0},
        http_5xx=1.0,
        latency={"ttft": slow},
        preemptions=1.0,
    )
    status = DeploymentStatus(phase=Phase.SERVING)
    history = [sample(60, counters=True, canary=True)]
    assessed = plan_canary(READY, only_canary, history, status, NOW, INTERVAL_S).assessed
    assert assessed is not None
    assert (assessed.latency, assessed.requests_finished, assessed.finished_by_reason, assessed.http_5xx) == (
        {},
        None,
        {},
        None,
    )
    assert assessed.preemptions == 1.0  # engine-wide facts stand
    users = replace(only_canary, requests_finished=3.0)  # two besides the canary: all of it is judged
    assert plan_canary(READY, users, history, status, NOW, INTERVAL_S).assessed is users
    no_canary = [sample(60, counters=True, canary=False)]
    assert plan_canary(READY, only_canary, no_canary, status, NOW, INTERVAL_S).assessed is only_canary


@pytest.mark.parametrize(
    ("case", "result", "ready"),
    [
        ("answering with a model", READY, True),
        ("health down", ProbeResult(base_url="x", health=EndpointCheck(ProbeOutcome.REFUSED)), False),
        (
            "key rejected",
            ProbeResult(base_url="x", health=OK, models=EndpointCheck(ProbeOutcome.UNAUTHORIZED, 401)),
            False,
        ),
        ("no model card", ProbeResult(base_url="x", health=OK, models=OK, served_models=()), False),
    ],
)
def test_ready_for_a_canary_needs_health_and_a_model(case: str, result: ProbeResult, ready: bool) -> None:
    assert ready_for_canary(result) is ready, case


GOOD = CanaryCheck(ProbeOutcome.OK, 200, 0.02, choices=3, text="OK", completion_tokens=1, done=True)


@pytest.mark.parametrize(
    ("case", "check", "failure"),
    [
        ("a token and [DONE]", GOOD, None),
        (
            "a token whose text is empty still counts by usage",
            CanaryCheck(ProbeOutcome.OK, 200, choices=2, completion_tokens=1, done=True),
            None,
        ),
        (
            "HTTP 500",
            CanaryCheck(ProbeOutcome.SERVER_ERROR, 500, detail="/v1/chat/completions answered HTTP 500"),
            "/v1/chat/completions answered HTTP 500",
        ),
        ("timeout without detail", CanaryCheck(ProbeOutcome.TIMEOUT), "timeout"),
        (
            "an error chunk in the stream",
            CanaryCheck(ProbeOutcome.OK, 200, detail="error in the stream: boom", choices=1, done=True),
            "error in the stream: boom",
        ),
        ("no choice", CanaryCheck(ProbeOutcome.OK, 200, done=True), "the answer carried no choice"),
        (
            "an empty choice",
            CanaryCheck(ProbeOutcome.OK, 200, choices=2, completion_tokens=0, done=True),
            "the completion was empty (no token generated)",
        ),
        (
            "cut before [DONE]",
            CanaryCheck(ProbeOutcome.OK, 200, choices=2, text="OK"),
            "the stream ended without [DONE]",
        ),
    ],
)
def test_how_a_canary_answer_is_judged(case: str, check: CanaryCheck, failure: str | None) -> None:
    assert judge_canary(check) == failure, case


def test_a_failed_canary_turns_serving_into_degraded_and_never_hides_a_worse_phase() -> None:
    serving = Assessment(Phase.SERVING, NOW, "serving; metrics unavailable", ("metrics_missing",))
    degraded = with_canary(serving, "HTTP 500", Phase.SERVING, ago(600), NOW)
    assert degraded.phase is Phase.DEGRADED
    assert degraded.reason == "canary completion failed: HTTP 500"
    assert degraded.conditions == (CANARY_CONDITION,)
    assert degraded.since == NOW

    still = with_canary(serving, "HTTP 500", Phase.DEGRADED, ago(120), NOW)
    assert still.since == ago(120)  # DEGRADED since the first failed canary, not since this one

    slow = Assessment(Phase.DEGRADED, ago(300), "degraded: ttft p90 3.000 s > 2 s", ("ttft p90 3.000 s > 2 s",))
    both = with_canary(slow, "timeout", Phase.DEGRADED, ago(300), NOW)
    assert both.reason == "canary completion failed: timeout; degraded: ttft p90 3.000 s > 2 s"
    assert both.since == ago(300) and both.conditions[0] == CANARY_CONDITION

    stalled = Assessment(Phase.STALLED, ago(200), "stalled: ...")
    assert with_canary(stalled, "timeout", Phase.STALLED, ago(200), NOW) is stalled
    assert with_canary(serving, None, Phase.SERVING, ago(600), NOW) is serving


def test_canary_slis_are_recorded_and_carried() -> None:
    assert canary_slis(NOW, None, None) == {}
    passed = canary_slis(NOW, GOOD, None)
    assert passed == {"canary_at": NOW.timestamp(), "canary_latency_ms": 20.0, "canary_ok": 1.0}
    assert canary_slis(NOW, GOOD, "boom")["canary_ok"] == 0.0
    stored = {**passed, "running": 0.0, "as_of_epoch_s": NOW.timestamp()}
    assert carried_canary_slis(stored) == passed


def test_the_canary_request_is_one_greedy_token_of_a_fixed_prompt() -> None:
    body = canary_request("gemma-3-1b-it")
    assert body["model"] == "gemma-3-1b-it"
    assert body["max_tokens"] == 1 and body["temperature"] == 0
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert canary_request("other")["messages"] == body["messages"]

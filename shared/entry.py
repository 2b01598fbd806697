"""From a Pub/Sub CloudEvent to a typed message, a handler call, and ack or retry.

Raise to retry, return to ack:

* a poison message (fails validation) is stored as ``rejected`` and acked;
* a kind that may not travel on the topic it came from (``shared.messages.routing``), or that does not match its
  ``kind`` attribute, is stored as ``rejected`` and acked: the topic is read from the push path Pub/Sub posts to,
  never from what a publisher sets, so a TPU VM publishing on the events topic cannot command anything;
* a kind this function does not handle from that topic is dropped with a log line and acked;
* a message is as old as its Pub/Sub publish time; a command older than ``max_age_s`` is dropped, and one whose
  ``issued_at`` is implausibly far from its publish time (a broken sender clock) is rejected;
* a duplicate ``command_id`` whose first delivery finished returns the stored outcome and acks; the same id on
  another kind or deployment is rejected, never taken for a duplicate;
* a duplicate whose first delivery is still in progress raises (the platform redelivers later);
* ``PermanentError`` from the handler is recorded as ``failed`` and acked;
* ``TransientError`` and anything unexpected propagate, so the platform redelivers.

Every error class is exactly one of permanent or transient (``shared.domain.errors``).

A ``benchmark.run`` published by a Scheduler job (attribute ``scheduled_job``) repeats its body on every firing,
so on the commands topic its command id is derived from the job and the minute of the publish
time. Ticks (``reconcile.tick``) skip the ledger: Scheduler publishes the same body every minute and the
reconciler is level-triggered.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from shared.domain.errors import InvalidMessage, PermanentError, TransientError
from shared.domain.models import CommandRecord, RejectedMessage
from shared.logging import deployment_logger
from shared.messages import SCHEDULED_JOB_ATTRIBUTE, decode_message, scheduled_command_id
from shared.messages.routing import Trigger
from shared.ports import Clock, StateStore
from shared.tracing import delivery_span

__all__ = [
    "EntryResult",
    "Outcome",
    "PubSubPayload",
    "handle_payload",
    "payload_from_cloud_event",
    "payload_from_push_body",
]

log = logging.getLogger("tpuctl.entry")

MAX_CLOCK_AHEAD_S = 600.0
"""How far a sender's ``issued_at`` may lie after the publish time before the sender's clock is called broken."""
MAX_CLOCK_BEHIND_S = 86_400.0
"""How far before the publish time ``issued_at`` may lie (a slow workstation clock is tolerated up to a day)."""
_PUSH_PATH = re.compile(r"projects/[^/]+/topics/[^/?]+")
_TOPIC_SOURCE = re.compile(r"^//pubsub\.googleapis\.com/projects/([^/]+)/topics/([^/]+)$")


class Outcome(StrEnum):
    """What happened to one delivery (all of these ack; retries are raised, not returned)."""

    APPLIED = "applied"
    DUPLICATE = "duplicate"
    REJECTED = "rejected"
    DROPPED = "dropped"
    FAILED = "failed"


@dataclass(frozen=True)
class EntryResult:
    outcome: Outcome
    detail: str = ""


@dataclass(frozen=True)
class PubSubPayload:
    """The parts of a Pub/Sub push the controller uses."""

    data: bytes
    message_id: str
    attributes: Mapping[str, str] = field(default_factory=dict)
    publish_time: datetime | None = None
    source: str = ""

    @property
    def topic(self) -> str:
        """The topic Pub/Sub delivered from (from the push path, ``//pubsub.googleapis.com/projects/P/topics/T``)."""
        match = _TOPIC_SOURCE.match(self.source)
        return match.group(2) if match else ""


def payload_from_cloud_event(event: Any) -> PubSubPayload:
    """Accept a functions-framework CloudEvent (structured, binary or raw push); tolerate odd shapes."""
    data = event.data if hasattr(event, "data") else {}
    message = data.get("message", {}) if isinstance(data, Mapping) else {}
    return _payload(message, str(_get(event, "source") or ""), _get(event, "id"), _get(event, "time"))


def payload_from_push_body(body: bytes, path: str) -> PubSubPayload | None:
    """A raw Pub/Sub push that functions-framework could not turn into a CloudEvent, or None if it is not one.

    An attribute-only message arrives without ``data``; functions-framework answers such a push 400 (a nack, so
    it would be redelivered until it dead-letters, unrecorded). Read here, it is recorded as rejected instead.
    """
    try:
        envelope = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if (
        not isinstance(envelope, dict)
        or not isinstance(envelope.get("message"), dict)
        or "subscription" not in envelope
    ):
        return None
    topic = _PUSH_PATH.search(path)
    return _payload(envelope["message"], f"//pubsub.googleapis.com/{topic.group(0)}" if topic else "", None, None)


def _payload(message: Any, source: str, event_id: Any, event_time: Any) -> PubSubPayload:
    if not isinstance(message, Mapping):
        message = {}
    encoded = message.get("data", "")
    try:
        body = base64.b64decode(encoded, validate=False) if isinstance(encoded, str) else b""
    except (binascii.Error, ValueError):
        body = b"\x00<undecodable base64>"
    attributes = message.get("attributes") or {}
    message_id = str(message.get("messageId") or message.get("message_id") or event_id or "")
    published = message.get("publishTime") or message.get("publish_time") or event_time
    return PubSubPayload(
        data=body,
        message_id=message_id,
        attributes={str(k): str(v) for k, v in attributes.items()} if isinstance(attributes, Mapping) else {},
        publish_time=_parse_time(published),
        source=source,
    )


def handle_payload(
    payload: PubSubPayload,
    handler: Callable[[Any], str],
    *,
    store: StateStore,
    clock: Clock,
    max_age_s: float,
    claim_s: float = 600.0,
    ledger_days: int = 30,
    accept: Mapping[str, Trigger] | None = None,
    authenticate: Callable[[Mapping[str, str], bytes, Any], None] | None = None,
) -> EntryResult:
    """Decode, check, deduplicate and dispatch one delivery. Returns on ack; raises for retry.

    ``accept`` maps each topic name that triggers the function to what it may bring (None: tests of the ledger
    alone, where every kind is handled whatever its topic). ``authenticate`` raises ``InvalidMessage`` for a
    message whose sender may not say what it says (node events sealed with another deployment's key).
    """
    now = clock.now()
    try:
        message = decode_message(payload.data)
        trigger = _trigger_for(payload, message.kind, accept)
        if authenticate is not None:
            authenticate(payload.attributes, payload.data, message)
        message = _as_fired(payload, message, trigger)
        _check_clock(payload, message)
    except InvalidMessage as exc:
        return _reject(payload, exc, store, now)

    kind = message.kind
    ids = deployment_logger(log, deployment_id=getattr(message, "deployment_id", None), command_id=message.command_id)
    if trigger is not None and kind not in trigger.handles:
        ids.info("message kind %s on %s is not handled here; acked without effect", kind, payload.topic)
        return EntryResult(Outcome.DROPPED, f"kind {kind} not handled by this function")

    is_tick = kind == "reconcile.tick"
    born = payload.publish_time or (now if is_tick else message.issued_at)  # Pub/Sub always sets a publish time
    age = (now - born).total_seconds()
    if age > max_age_s:
        ids.warning("dropped %s: published %.0f s ago, over the %.0f s limit", kind, age, max_age_s)
        return EntryResult(Outcome.DROPPED, f"{age:.0f} s old")

    if not is_tick:
        try:
            duplicate = _claim(message, store, now, claim_s, ledger_days, ids)
        except InvalidMessage as exc:
            return _reject(payload, exc, store, now)
        if duplicate is not None:
            return duplicate

    labels = {"deployment_id": str(getattr(message, "deployment_id", "") or ""), "command_id": message.command_id}
    try:
        with delivery_span(f"handle {kind}", payload.attributes, **labels):  # child of the sender's span
            detail = handler(message)
    except PermanentError as exc:
        ids.warning("permanent failure of %s: %s", kind, exc)
        if not is_tick:
            store.finish_command(message.command_id, "failed", str(exc)[:2000])
        return EntryResult(Outcome.FAILED, str(exc))
    if not is_tick:
        store.finish_command(message.command_id, "applied", (detail or "")[:2000])
    ids.info("applied %s: %s", kind, detail)
    return EntryResult(Outcome.APPLIED, detail or "")


def _trigger_for(payload: PubSubPayload, kind: str, accept: Mapping[str, Trigger] | None) -> Trigger | None:
    """The trigger that delivered the message; refuses a kind its topic may not carry or its attribute contradicts."""
    attribute = payload.attributes.get("kind")
    if attribute is not None and attribute != kind:
        raise InvalidMessage(
            "attributes.kind", f"says {attribute[:60]!r} but the body is a {kind}", "publish with message_attributes()"
        )
    if accept is None:
        return None
    topic = payload.topic
    trigger = accept.get(topic)
    if trigger is None:
        raise InvalidMessage(
            "topic",
            f"delivered from {topic or 'an unnamed topic'!r}, which does not trigger this function",
            "push to /projects/P/topics/T of one of: " + ", ".join(sorted(accept)),
        )
    if kind not in trigger.allowed:
        raise InvalidMessage(
            "kind", f"{kind} may not be published on the {trigger.topic} topic", "publish it where it belongs"
        )
    return trigger


def _as_fired(payload: PubSubPayload, message: Any, trigger: Trigger | None) -> Any:
    """A Scheduler job's ``benchmark.run`` firing: its own command id per job and minute."""
    job = payload.attributes.get(SCHEDULED_JOB_ATTRIBUTE, "")
    if not job:
        return message
    if message.kind != "benchmark.run" or (trigger is not None and trigger.topic != "commands"):
        raise InvalidMessage(
            f"attributes.{SCHEDULED_JOB_ATTRIBUTE}",
            f"is only meaningful on a benchmark.run on the commands topic, not on a {message.kind}",
            "drop the attribute",
        )
    fired = payload.publish_time
    if fired is None:
        raise InvalidMessage("publishTime", "is missing on a scheduled firing", "deliver through Pub/Sub")
    command_id = scheduled_command_id(job, fired)
    return message.model_copy(update={"command_id": command_id, "issued_at": fired})


def _check_clock(payload: PubSubPayload, message: Any) -> None:
    """``issued_at`` is the sender's claim; the publish time is Pub/Sub's. Refuse a sender whose clock is off."""
    if payload.publish_time is None or message.kind == "reconcile.tick":
        return
    skew = (message.issued_at - payload.publish_time).total_seconds()
    if skew > MAX_CLOCK_AHEAD_S or -skew > MAX_CLOCK_BEHIND_S:
        direction = "after" if skew > 0 else "before"
        raise InvalidMessage(
            "issued_at",
            f"is {abs(skew):.0f} s {direction} the publish time {payload.publish_time.isoformat()}",
            "fix the sender's clock (NTP) and publish again",
        )


def _claim(
    message: Any, store: StateStore, now: datetime, claim_s: float, ledger_days: int, ids: Any
) -> EntryResult | None:
    """Record the command in the ledger; the answer to give if this delivery must not run the handler."""
    deployment_id = getattr(message, "deployment_id", None)
    created, stored = store.record_command(
        CommandRecord(
            command_id=message.command_id,
            kind=message.kind,
            deployment_id=deployment_id,
            received_at=now,
            expire_at=now + timedelta(days=ledger_days),
        )
    )
    if created:
        return None
    if (stored.kind, stored.deployment_id) != (message.kind, deployment_id):
        owner = f"a {stored.kind} for {stored.deployment_id or 'no deployment'}"
        raise InvalidMessage("command_id", f"is already the id of {owner}", "give every command its own id")
    if stored.status != "accepted":
        ids.info("duplicate %s: first outcome %s", message.kind, stored.status)
        return EntryResult(Outcome.DUPLICATE, stored.outcome)
    if (now - stored.received_at).total_seconds() < claim_s:
        raise TransientError(f"command {message.command_id} is still being handled", retry_after_s=30)
    ids.warning("taking over command %s left unfinished since %s", message.command_id, stored.received_at)
    return None


def _reject(payload: PubSubPayload, exc: InvalidMessage, store: StateStore, now: datetime) -> EntryResult:
    """Record a message that must not be applied (and must not be redelivered): nothing else is written."""
    store.record_rejection(
        RejectedMessage(
            message_id=payload.message_id or _digest(payload.data),
            field=exc.field,
            reason=str(exc),
            received_at=now,
            size_bytes=len(payload.data),
            source=payload.source[:200],
        )
    )
    log.warning("rejected message %s: %s", payload.message_id, exc, extra={"field": exc.field})
    return EntryResult(Outcome.REJECTED, str(exc))


def _get(event: Any, key: str) -> Any:
    try:
        return event[key]
    except (KeyError, TypeError, IndexError):
        return None


def _parse_time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value if value.tzinfo else None
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else None


def _digest(data: bytes) -> str:
    return "sha256-" + hashlib.sha256(data).hexdigest()[:32]

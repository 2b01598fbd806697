"""From a Pub/Sub CloudEvent to a typed message, a handler call, and ack or retry.

Raise to retry, return to ack:

* a poison message (fails validation) is stored as ``rejected`` and acked;
* a command older than ``max_event_age_s`` is dropped with a log line and acked;
* a duplicate ``command_id`` whose first delivery finished returns the stored outcome and acks;
* a duplicate whose first delivery is still in progress raises (the platform redelivers later);
* ``PermanentError`` from the handler is recorded as ``failed`` and acked;
* ``TransientError`` and anything unexpected propagate, so the platform redelivers.

A command published by a Scheduler job (attribute ``scheduled_job``, e.g. a scheduled ``benchmark.run``) repeats
its body on every firing, so its command id is derived from the job and the minute of the publish time, and its
age is taken from the publish time.

Ticks (``reconcile.tick``) skip the ledger: Scheduler publishes the same body every minute and
the reconciler is level-triggered, so their age is taken from the Pub/Sub publish time.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from shared.domain.errors import InvalidMessage, PermanentError, TransientError
from shared.domain.models import CommandRecord, RejectedMessage
from shared.logging import deployment_logger
from shared.messages import SCHEDULED_JOB_ATTRIBUTE, decode_message, scheduled_command_id
from shared.ports import Clock, StateStore

__all__ = ["EntryResult", "Outcome", "PubSubPayload", "handle_payload", "payload_from_cloud_event"]

log = logging.getLogger("tpuctl.entry")


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


def payload_from_cloud_event(event: Any) -> PubSubPayload:
    """Accept a functions-framework CloudEvent (structured, binary or raw push); tolerate odd shapes."""
    data = event.data if hasattr(event, "data") else {}
    message = data.get("message", {}) if isinstance(data, Mapping) else {}
    if not isinstance(message, Mapping):
        message = {}
    encoded = message.get("data", "")
    try:
        body = base64.b64decode(encoded, validate=False) if isinstance(encoded, str) else b""
    except (binascii.Error, ValueError):
        body = b"\x00<undecodable base64>"
    attributes = message.get("attributes") or {}
    message_id = str(message.get("messageId") or message.get("message_id") or _get(event, "id") or "")
    published = message.get("publishTime") or message.get("publish_time") or _get(event, "time")
    return PubSubPayload(
        data=body,
        message_id=message_id,
        attributes={str(k): str(v) for k, v in attributes.items()} if isinstance(attributes, Mapping) else {},
        publish_time=_parse_time(published),
        source=str(_get(event, "source") or ""),
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
    accept: frozenset[str] | None = None,
) -> EntryResult:
    """Decode, deduplicate and dispatch one delivery. Returns on ack; raises for retry."""
    now = clock.now()
    try:
        message = decode_message(payload.data)
    except InvalidMessage as exc:
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

    kind = message.kind
    scheduled_job = payload.attributes.get(SCHEDULED_JOB_ATTRIBUTE, "")
    if scheduled_job and kind != "reconcile.tick":
        # A Scheduler job publishes the same body on every firing: each firing is its own command, named by the
        # job and the minute it fired, and as old as its publish time.
        fired = payload.publish_time or now
        message = message.model_copy(
            update={"command_id": scheduled_command_id(scheduled_job, fired), "issued_at": fired}
        )
    ids = deployment_logger(log, deployment_id=getattr(message, "deployment_id", None), command_id=message.command_id)
    if accept is not None and kind not in accept:
        ids.warning("message kind %s is not handled here; acked without effect", kind)
        return EntryResult(Outcome.DROPPED, f"kind {kind} not handled by this function")

    is_tick = kind == "reconcile.tick"
    born = (payload.publish_time or now) if is_tick else message.issued_at
    age = (now - born).total_seconds()
    if age > max_age_s:
        ids.warning("dropped %s: %.0f s old, over the %.0f s limit", kind, age, max_age_s)
        return EntryResult(Outcome.DROPPED, f"{age:.0f} s old")

    if not is_tick:
        created, stored = store.record_command(
            CommandRecord(
                command_id=message.command_id,
                kind=kind,
                deployment_id=getattr(message, "deployment_id", None),
                received_at=now,
                expire_at=now + timedelta(days=ledger_days),
            )
        )
        if not created:
            if stored.status != "accepted":
                ids.info("duplicate %s: first outcome %s", kind, stored.status)
                return EntryResult(Outcome.DUPLICATE, stored.outcome)
            if (now - stored.received_at).total_seconds() < claim_s:
                raise TransientError(f"command {message.command_id} is still being handled", retry_after_s=30)
            ids.warning("taking over command %s left unfinished since %s", message.command_id, stored.received_at)

    try:
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

"""The embedded command bus: Pub/Sub's delivery semantics on one SQLite file, for running without Google Cloud.

What it keeps from Pub/Sub, so that handlers written against it behave the same in the cloud:

- topics and subscriptions; a subscription receives every message published to its topic *after* it was
  created, narrowed by an optional attribute filter (``_pubsub_rules``); a topic without subscriptions drops
  what is published to it;
- at-least-once delivery with leases: :meth:`LocalBus.pull` leases due messages for ``ack_deadline_s``; the
  handler returning acknowledges, raising nacks with exponential backoff (``backoff_min_s`` doubling up to
  ``backoff_max_s``; a ``TransientError.retry_after_s`` hint may lengthen it); a process that dies while a handler
  runs leaves the lease to expire, and the message is delivered again, with a higher ``Delivery.attempt``;
- dead letters: after ``max_delivery_attempts`` attempts a message moves to the subscription's dead-letter
  topic, with ``CloudPubSubDeadLetterSource*`` attributes as Pub/Sub sets them plus ``tpuctl_dead_letter_reason``
  (``handler_failed`` or ``ack_deadline_exceeded``) and, when a handler raised, ``tpuctl_dead_letter_error``;
- ordering keys: a message is not delivered while an earlier one with the same key is leased or backing off.

Every change is one SQLite transaction (WAL, ``synchronous=FULL``, a busy timeout), committed before the call
returns, so several threads and processes may share one file. Deadlines and backoff read the injected clock's
wall time (``Clock.now``): processes share wall time, and tests move a ``ManualClock`` instead of sleeping.
"""

from __future__ import annotations

import json
import logging
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType

from shared.adapters._pubsub_rules import (
    MAX_ATTRIBUTE_VALUE_BYTES,
    AttributeFilter,
    check_max_delivery_attempts,
    check_message,
    check_resource_name,
    parse_filter,
)
from shared.adapters.clock import SystemClock
from shared.domain.errors import PermanentError, TransientError
from shared.logging import redact
from shared.ports import Clock, Delivery, Handler, MissingSubscription
from shared.tracing import with_trace_context

__all__ = ["DEAD_LETTER_ERROR", "DEAD_LETTER_REASON", "LocalBus"]

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
DEAD_LETTER_REASON = "tpuctl_dead_letter_reason"
DEAD_LETTER_ERROR = "tpuctl_dead_letter_error"
DEAD_LETTER_SOURCE_MESSAGE_ID = "tpuctl_dead_letter_source_message_id"
_WAIT_SLICE_S = 0.05  # how often a waiting pull looks again for work another process published
_MAX_PULL_MESSAGES = 1000

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS bus_topics (
        name TEXT PRIMARY KEY,
        created_at REAL NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS bus_subscriptions (
        name TEXT PRIMARY KEY,
        topic TEXT NOT NULL REFERENCES bus_topics(name),
        filter TEXT NOT NULL,
        dead_letter_topic TEXT REFERENCES bus_topics(name),
        max_delivery_attempts INTEGER NOT NULL,
        created_at REAL NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS bus_messages (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        topic TEXT NOT NULL,
        data BLOB NOT NULL,
        attributes TEXT NOT NULL,
        ordering_key TEXT NOT NULL,
        publish_time REAL NOT NULL)""",
    # One row per message still owed to a subscription. visible_at: when it may be leased next (publish time,
    # end of a backoff, or end of the current lease). lease_token is set while a consumer holds it.
    """CREATE TABLE IF NOT EXISTS bus_deliveries (
        subscription TEXT NOT NULL,
        message_seq INTEGER NOT NULL,
        ordering_key TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        visible_at REAL NOT NULL,
        lease_token TEXT,
        last_error TEXT,
        PRIMARY KEY (subscription, message_seq)) WITHOUT ROWID""",
    "CREATE INDEX IF NOT EXISTS bus_deliveries_due ON bus_deliveries(subscription, visible_at)",
    "CREATE INDEX IF NOT EXISTS bus_deliveries_key ON bus_deliveries(subscription, ordering_key, message_seq)",
    "CREATE INDEX IF NOT EXISTS bus_deliveries_message ON bus_deliveries(message_seq)",
    "CREATE TABLE IF NOT EXISTS bus_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
)

# Due deliveries in publish order; a keyed one only when no earlier message of its key is leased or backing off.
_DUE_DELIVERIES = """
SELECT d.message_seq, d.attempt, m.data, m.attributes, m.ordering_key, m.publish_time
FROM bus_deliveries AS d JOIN bus_messages AS m ON m.seq = d.message_seq
WHERE d.subscription = :subscription AND d.visible_at <= :now
  AND (d.ordering_key = '' OR NOT EXISTS (
        SELECT 1 FROM bus_deliveries AS e
        WHERE e.subscription = d.subscription AND e.ordering_key = d.ordering_key
          AND e.message_seq < d.message_seq AND e.visible_at > :now))
ORDER BY d.message_seq
LIMIT :limit
"""

_ANY_DUE = "SELECT 1 FROM bus_deliveries WHERE subscription = ? AND visible_at <= ? LIMIT 1"


@dataclass(frozen=True)
class _Subscription:
    name: str
    topic: str
    filter: str
    dead_letter_topic: str | None
    max_delivery_attempts: int


@dataclass(frozen=True)
class _Lease:
    delivery: Delivery
    seq: int
    token: str


@dataclass(frozen=True)
class _PullOutcome:
    delivered: int  # handler calls
    acked: int


class LocalBus:
    """A durable ``CommandBus`` in one SQLite file (see the module docstring for the semantics)."""

    def __init__(
        self,
        path: str | Path,
        *,
        ack_deadline_s: float = 30.0,
        backoff_min_s: float = 0.5,
        backoff_max_s: float = 60.0,
        clock: Clock | None = None,
        busy_timeout_s: float = 10.0,
    ) -> None:
        if ack_deadline_s <= 0:
            raise ValueError(f"ack_deadline_s: {ack_deadline_s!r} must be positive (seconds a lease lasts)")
        if backoff_min_s < 0 or backoff_max_s < backoff_min_s:
            raise ValueError(
                f"backoff_min_s/backoff_max_s: {backoff_min_s!r}/{backoff_max_s!r} "
                "(need 0 <= backoff_min_s <= backoff_max_s)"
            )
        if busy_timeout_s <= 0:
            raise ValueError(f"busy_timeout_s: {busy_timeout_s!r} must be positive")
        self.path = Path(path)
        self.ack_deadline_s = float(ack_deadline_s)
        self.backoff_min_s = float(backoff_min_s)
        self.backoff_max_s = float(backoff_max_s)
        self._clock: Clock = clock or SystemClock()
        self._lock = threading.RLock()
        self._published = threading.Condition()
        self._filters: dict[str, AttributeFilter | None] = {}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn: sqlite3.Connection | None = sqlite3.connect(
            str(self.path), timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        try:
            self._conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            self._conn.execute("PRAGMA journal_mode = WAL")
            self._conn.execute("PRAGMA synchronous = FULL")
            self._conn.execute("PRAGMA foreign_keys = ON")
            self._create_schema()
        except BaseException:
            self.close()
            raise

    # --- lifecycle ---------------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the database; leases held by this instance expire and are delivered again elsewhere."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> LocalBus:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    # --- CommandBus ----------------------------------------------------------------------------------------

    def ensure_topic(self, topic: str) -> None:
        check_resource_name("topic", topic)
        with self._write() as db:
            db.execute("INSERT OR IGNORE INTO bus_topics(name, created_at) VALUES (?, ?)", (topic, self._now()))

    def ensure_subscription(
        self,
        topic: str,
        subscription: str,
        *,
        filter: str | None = None,
        dead_letter_topic: str | None = None,
        max_delivery_attempts: int = 5,
    ) -> None:
        """Create the subscription if absent. Its topic and filter are fixed once created (as in Pub/Sub);
        the dead-letter topic and attempt limit are updated to the values given."""
        check_resource_name("topic", topic)
        check_resource_name("subscription", subscription)
        parsed = parse_filter(filter)
        check_max_delivery_attempts(max_delivery_attempts)
        if dead_letter_topic is not None:
            check_resource_name("dead_letter_topic", dead_letter_topic)
            if dead_letter_topic == topic:
                raise ValueError(
                    f"dead_letter_topic: {dead_letter_topic!r} is the subscription's own topic (use a separate topic)"
                )
        filter_text = parsed.text if parsed else ""
        with self._write() as db:
            self._require_topic(db, topic, "topic")
            if dead_letter_topic is not None:
                self._require_topic(db, dead_letter_topic, "dead_letter_topic")
            existing = self._find_subscription(db, subscription)
            if existing is None:
                db.execute(
                    "INSERT INTO bus_subscriptions(name, topic, filter, dead_letter_topic, max_delivery_attempts,"
                    " created_at) VALUES (?, ?, ?, ?, ?, ?)",
                    (subscription, topic, filter_text, dead_letter_topic, max_delivery_attempts, self._now()),
                )
                return
            if existing.topic != topic or existing.filter != filter_text:
                raise PermanentError(
                    f"subscription {subscription!r} already exists on topic {existing.topic!r} with filter "
                    f"{existing.filter!r}; its topic and filter cannot change (use another subscription name)"
                )
            db.execute(
                "UPDATE bus_subscriptions SET dead_letter_topic = ?, max_delivery_attempts = ? WHERE name = ?",
                (dead_letter_topic, max_delivery_attempts, subscription),
            )

    def delete_subscription(self, subscription: str) -> bool:
        """Delete the subscription and what it still owed (as Pub/Sub drops a deleted subscription's backlog);
        returns whether it existed."""
        check_resource_name("subscription", subscription)
        with self._write() as db:
            if self._find_subscription(db, subscription) is None:
                return False
            owed = [
                int(row[0])
                for row in db.execute(
                    "SELECT message_seq FROM bus_deliveries WHERE subscription = ?", (subscription,)
                ).fetchall()
            ]
            db.execute("DELETE FROM bus_deliveries WHERE subscription = ?", (subscription,))
            db.execute("DELETE FROM bus_subscriptions WHERE name = ?", (subscription,))
            for seq in owed:
                self._forget_if_delivered(db, seq)
        return True

    def publish(
        self, topic: str, data: bytes, attributes: Mapping[str, str], *, ordering_key: str | None = None
    ) -> str:
        """Store the message and fan it out to the topic's subscriptions in one committed transaction."""
        check_resource_name("topic", topic)
        attributes = with_trace_context(attributes)
        check_message(data, attributes, ordering_key)
        with self._write() as db:
            seq = self._insert_message(db, topic, bytes(data), dict(attributes), ordering_key or "", self._now())
        with self._published:
            self._published.notify_all()
        return str(seq)

    def pull(self, subscription: str, handler: Handler, *, max_messages: int = 10, timeout_s: float = 1.0) -> int:
        """Lease up to ``max_messages`` due messages (waiting up to ``timeout_s`` of real time for the first),
        hand them to ``handler`` in publish order, ack on return, nack on raise. Returns how many were acked.

        A ``BaseException`` from the handler (``SystemExit``, ``KeyboardInterrupt``) is treated as a crash: it
        propagates, and the message being handled stays leased until its deadline, then is delivered again.
        """
        return self._pull(subscription, handler, max_messages=max_messages, timeout_s=timeout_s).acked

    # --- local runner ------------------------------------------------------------------------------------

    def drain(self, subscription: str, handler: Handler, max_rounds: int = 100) -> int:
        """Deliver until nothing is due (messages backing off wait for the clock). Returns how many were acked."""
        acked = 0
        for _ in range(max_rounds):
            outcome = self._pull(subscription, handler, max_messages=100, timeout_s=0.0)
            acked += outcome.acked
            if outcome.delivered == 0:
                return acked
        log.warning(
            "drain stopped after %d rounds with messages still due",
            max_rounds,
            extra={"subscription": subscription, "backlog": self.backlog(subscription)},
        )
        return acked

    def serve(
        self,
        subscription: str,
        handler: Handler,
        *,
        stop_event: threading.Event,
        poll_interval_s: float = 0.2,
        max_messages: int = 10,
    ) -> threading.Thread:
        """Push-style delivery for the local cloud: a started daemon thread that pulls until ``stop_event`` is
        set, idling ``poll_interval_s`` when nothing is due. Set the event and ``join()`` the thread to stop.

        Handler errors are nacks as in :meth:`pull`; a ``BaseException`` from the handler ends the thread like a
        crash (the message comes back after its ack deadline)."""
        if poll_interval_s <= 0:
            raise ValueError(f"poll_interval_s: {poll_interval_s!r} must be positive")
        with self._read() as db:
            self._get_subscription(db, subscription)
        thread = threading.Thread(
            target=self._serve_loop,
            args=(subscription, handler, stop_event, poll_interval_s, max_messages),
            name=f"local-bus:{subscription}",
            daemon=True,
        )
        thread.start()
        return thread

    def backlog(self, subscription: str) -> int:
        """Messages the subscription still owes: due, leased or backing off."""
        with self._read() as db:
            self._get_subscription(db, subscription)
            row = db.execute("SELECT COUNT(*) FROM bus_deliveries WHERE subscription = ?", (subscription,)).fetchone()
        return int(row[0])

    # --- delivery ------------------------------------------------------------------------------------------

    def _serve_loop(
        self,
        subscription: str,
        handler: Handler,
        stop_event: threading.Event,
        poll_interval_s: float,
        max_messages: int,
    ) -> None:
        while not stop_event.is_set():
            try:
                outcome = self._pull(subscription, handler, max_messages=max_messages, timeout_s=0.0)
            except Exception:  # the store, not the handler (its errors are nacks): log and keep serving
                if self._conn is None:
                    return  # closed under us: nothing more to serve
                log.exception("local bus delivery failed", extra={"subscription": subscription})
                stop_event.wait(poll_interval_s)
                continue
            if outcome.delivered == 0:
                stop_event.wait(poll_interval_s)

    def _pull(self, subscription: str, handler: Handler, *, max_messages: int, timeout_s: float) -> _PullOutcome:
        check_resource_name("subscription", subscription)
        if isinstance(max_messages, bool) or not 1 <= max_messages <= _MAX_PULL_MESSAGES:
            raise ValueError(f"max_messages: {max_messages!r} (use 1 to {_MAX_PULL_MESSAGES})")
        if timeout_s < 0:
            raise ValueError(f"timeout_s: {timeout_s!r} must not be negative")
        give_up_at = time.monotonic() + timeout_s
        while True:
            leases = self._lease(subscription, max_messages)
            remaining = give_up_at - time.monotonic()
            if leases or remaining <= 0:
                break
            with self._published:
                self._published.wait(min(remaining, _WAIT_SLICE_S))
        return self._deliver(leases, handler)

    def _deliver(self, leases: list[_Lease], handler: Handler) -> _PullOutcome:
        failed_keys: set[str] = set()
        delivered = acked = 0
        for index, lease in enumerate(leases):
            key = lease.delivery.ordering_key
            if key and key in failed_keys:
                self._release(lease)  # an earlier message of this key failed: keep the order
                continue
            delivered += 1
            try:
                handler(lease.delivery)
            except Exception as exc:
                self._nack(lease, exc)
                if key:
                    failed_keys.add(key)
                continue
            except BaseException:
                self._release_quietly(leases[index + 1 :])  # never handed out; the current one stays leased
                raise
            if self._ack(lease):
                acked += 1
        return _PullOutcome(delivered, acked)

    def _lease(self, subscription: str, max_messages: int) -> list[_Lease]:
        now = self._now()
        with self._read() as db:  # idle pollers look without taking the write lock
            self._get_subscription(db, subscription)
            if db.execute(_ANY_DUE, (subscription, now)).fetchone() is None:
                return []
        token = secrets.token_hex(8)
        with self._write() as db:
            sub = self._get_subscription(db, subscription)
            self._dead_letter_exhausted(db, sub, now)
            rows = db.execute(
                _DUE_DELIVERIES, {"subscription": subscription, "now": now, "limit": max_messages}
            ).fetchall()
            leases = []
            for seq, attempt, data, attributes, ordering_key, publish_time in rows:
                db.execute(
                    "UPDATE bus_deliveries SET attempt = attempt + 1, visible_at = ?, lease_token = ?"
                    " WHERE subscription = ? AND message_seq = ?",
                    (now + self.ack_deadline_s, token, subscription, seq),
                )
                delivery = Delivery(
                    message_id=str(seq),
                    data=bytes(data),
                    attributes=json.loads(attributes),
                    attempt=attempt + 1,
                    subscription=subscription,
                    ordering_key=ordering_key,
                    publish_time=datetime.fromtimestamp(publish_time, UTC),
                )
                leases.append(_Lease(delivery, seq, token))
        return leases

    def _dead_letter_exhausted(self, db: sqlite3.Connection, sub: _Subscription, now: float) -> None:
        """Due messages that already used every attempt (their last lease expired) go to the dead-letter topic."""
        if sub.dead_letter_topic is None:
            return
        rows = db.execute(
            "SELECT message_seq, attempt, lease_token FROM bus_deliveries"
            " WHERE subscription = ? AND visible_at <= ? AND attempt >= ?",
            (sub.name, now, sub.max_delivery_attempts),
        ).fetchall()
        for seq, attempt, lease_token in rows:
            reason = "ack_deadline_exceeded" if lease_token is not None else "handler_failed"
            self._dead_letter(db, sub, sub.dead_letter_topic, seq, attempt, reason, "", now)

    def _ack(self, lease: _Lease) -> bool:
        with self._write() as db:
            deleted = db.execute(
                "DELETE FROM bus_deliveries WHERE subscription = ? AND message_seq = ? AND lease_token = ?",
                (lease.delivery.subscription, lease.seq, lease.token),
            ).rowcount
            if deleted:
                self._forget_if_delivered(db, lease.seq)
        if not deleted:
            log.warning(
                "ack after the lease was lost: the message will be delivered again",
                extra=self._log_fields(lease.delivery),
            )
        return bool(deleted)

    def _nack(self, lease: _Lease, exc: Exception) -> None:
        error = _describe(exc)
        now = self._now()
        delivery = lease.delivery
        with self._write() as db:
            row = db.execute(
                "SELECT attempt FROM bus_deliveries WHERE subscription = ? AND message_seq = ? AND lease_token = ?",
                (delivery.subscription, lease.seq, lease.token),
            ).fetchone()
            if row is None:
                log.warning("nack after the lease was lost: %s", error, extra=self._log_fields(delivery))
                return
            attempt = int(row[0])
            sub = self._get_subscription(db, delivery.subscription)
            if sub.dead_letter_topic is not None and attempt >= sub.max_delivery_attempts:
                self._dead_letter(db, sub, sub.dead_letter_topic, lease.seq, attempt, "handler_failed", error, now)
                return
            delay = self._backoff(attempt, exc)
            db.execute(
                "UPDATE bus_deliveries SET visible_at = ?, lease_token = NULL, last_error = ?"
                " WHERE subscription = ? AND message_seq = ?",
                (now + delay, error, delivery.subscription, lease.seq),
            )
        log.warning(
            "handler failed, retrying in %.1f s: %s", delay, error, extra=self._log_fields(delivery, retry_in_s=delay)
        )

    def _release(self, lease: _Lease) -> None:
        """Give back a leased message that was never handed to the handler, as if it had not been leased."""
        with self._write() as db:
            db.execute(
                "UPDATE bus_deliveries SET attempt = attempt - 1, visible_at = ?, lease_token = NULL"
                " WHERE subscription = ? AND message_seq = ? AND lease_token = ?",
                (self._now(), lease.delivery.subscription, lease.seq, lease.token),
            )

    def _release_quietly(self, leases: list[_Lease]) -> None:
        for lease in leases:
            try:
                self._release(lease)
            except (sqlite3.Error, PermanentError):
                return  # they will come back when their lease expires

    def _backoff(self, attempt: int, exc: Exception) -> float:
        delay = min(self.backoff_max_s, self.backoff_min_s * 2.0 ** max(0, attempt - 1))
        if isinstance(exc, TransientError) and exc.retry_after_s is not None:
            delay = max(delay, min(float(exc.retry_after_s), self.backoff_max_s))
        return delay

    def _dead_letter(
        self,
        db: sqlite3.Connection,
        sub: _Subscription,
        dead_letter_topic: str,
        seq: int,
        attempt: int,
        reason: str,
        error: str,
        now: float,
    ) -> None:
        data, attributes, ordering_key, publish_time = db.execute(
            "SELECT data, attributes, ordering_key, publish_time FROM bus_messages WHERE seq = ?", (seq,)
        ).fetchone()
        dead_attributes = dict(json.loads(attributes))
        dead_attributes.update(
            {
                "CloudPubSubDeadLetterSourceDeliveryCount": str(attempt),
                "CloudPubSubDeadLetterSourceSubscription": sub.name,
                "CloudPubSubDeadLetterSourceTopicPublishTime": datetime.fromtimestamp(publish_time, UTC).isoformat(),
                DEAD_LETTER_REASON: reason,
                DEAD_LETTER_SOURCE_MESSAGE_ID: str(seq),
            }
        )
        if error:
            dead_attributes[DEAD_LETTER_ERROR] = _truncate_utf8(error, MAX_ATTRIBUTE_VALUE_BYTES)
        db.execute("DELETE FROM bus_deliveries WHERE subscription = ? AND message_seq = ?", (sub.name, seq))
        new_seq = self._insert_message(db, dead_letter_topic, bytes(data), dead_attributes, ordering_key, now)
        self._forget_if_delivered(db, seq)
        log.warning(
            "message dead-lettered to %s after %d attempts (%s)",
            dead_letter_topic,
            attempt,
            reason,
            extra={"subscription": sub.name, "message_id": str(seq), "dead_letter_message_id": str(new_seq)},
        )

    # --- storage -------------------------------------------------------------------------------------------

    def _insert_message(
        self,
        db: sqlite3.Connection,
        topic: str,
        data: bytes,
        attributes: dict[str, str],
        ordering_key: str,
        now: float,
    ) -> int:
        self._require_topic(db, topic, "topic")
        cursor = db.execute(
            "INSERT INTO bus_messages(topic, data, attributes, ordering_key, publish_time) VALUES (?, ?, ?, ?, ?)",
            (topic, data, json.dumps(attributes, sort_keys=True), ordering_key, now),
        )
        seq = int(cursor.lastrowid or 0)
        fan_out = 0
        for name, filter_text in db.execute(
            "SELECT name, filter FROM bus_subscriptions WHERE topic = ?", (topic,)
        ).fetchall():
            parsed = self._parsed_filter(filter_text)
            if parsed is None or parsed.matches(attributes):
                db.execute(
                    "INSERT INTO bus_deliveries(subscription, message_seq, ordering_key, attempt, visible_at)"
                    " VALUES (?, ?, ?, 0, ?)",
                    (name, seq, ordering_key, now),
                )
                fan_out += 1
        if fan_out == 0:  # as in Pub/Sub, a message no subscription wants is dropped
            db.execute("DELETE FROM bus_messages WHERE seq = ?", (seq,))
            log.debug("no subscription takes the message", extra={"topic": topic, "message_id": str(seq)})
        return seq

    @staticmethod
    def _forget_if_delivered(db: sqlite3.Connection, seq: int) -> None:
        db.execute(
            "DELETE FROM bus_messages WHERE seq = ?"
            " AND NOT EXISTS (SELECT 1 FROM bus_deliveries WHERE message_seq = ?)",
            (seq, seq),
        )

    def _parsed_filter(self, text: str) -> AttributeFilter | None:
        if text not in self._filters:
            self._filters[text] = parse_filter(text)
        return self._filters[text]

    @staticmethod
    def _require_topic(db: sqlite3.Connection, topic: str, field: str) -> None:
        if db.execute("SELECT 1 FROM bus_topics WHERE name = ?", (topic,)).fetchone() is None:
            raise PermanentError(f"{field}: topic {topic!r} does not exist (create it with ensure_topic first)")

    @staticmethod
    def _find_subscription(db: sqlite3.Connection, name: str) -> _Subscription | None:
        row = db.execute(
            "SELECT name, topic, filter, dead_letter_topic, max_delivery_attempts FROM bus_subscriptions"
            " WHERE name = ?",
            (name,),
        ).fetchone()
        return _Subscription(*row) if row else None

    def _get_subscription(self, db: sqlite3.Connection, name: str) -> _Subscription:
        found = self._find_subscription(db, name)
        if found is None:
            raise MissingSubscription(
                f"subscription: {name!r} does not exist (create it with ensure_subscription first)"
            )
        return found

    def _create_schema(self) -> None:
        with self._write() as db:
            for statement in _SCHEMA:
                db.execute(statement)
            row = db.execute("SELECT value FROM bus_meta WHERE key = 'schema_version'").fetchone()
            if row is None:
                db.execute("INSERT INTO bus_meta(key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            elif int(row[0]) > SCHEMA_VERSION:
                raise PermanentError(
                    f"{self.path}: local bus schema version {row[0]} is newer than this code's "
                    f"{SCHEMA_VERSION} (upgrade tpuctl or use another data_dir)"
                )

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One immediate (write-locked) transaction, committed on success and rolled back on any exception."""
        with self._lock:
            db = self._connection()
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            yield self._connection()

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise PermanentError(f"local bus {self.path} is closed")
        return self._conn

    def _now(self) -> float:
        return self._clock.now().timestamp()

    @staticmethod
    def _log_fields(delivery: Delivery, **more: object) -> dict[str, object]:
        return {
            "subscription": delivery.subscription,
            "message_id": delivery.message_id,
            "attempt": delivery.attempt,
            "ordering_key": delivery.ordering_key,
            **more,
        }


def _describe(exc: BaseException) -> str:
    """``Type: message`` with registered secrets redacted, short enough for an attribute."""
    return redact(f"{type(exc).__name__}: {exc}")[:2000]


def _truncate_utf8(text: str, max_bytes: int) -> str:
    return text.encode()[:max_bytes].decode(errors="ignore")

"""``SqliteStateStore``: the embedded default ``StateStore``, one SQLite file shared by threads and processes.

Why it is safe to share: WAL journal (readers never block the writer), a busy timeout (writers queue instead of
failing), and ``BEGIN IMMEDIATE`` around every read-modify-write, so the compare-and-set, the fence check and
the write happen under one write lock. Each thread (and each process after a fork) gets its own connection.

Records are stored as the JSON of their pydantic models (same shape as the Firestore documents), next to a
few indexed columns used for lookups and ordering; times in those columns are integer microseconds (UTC).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from pydantic import BaseModel

from shared.adapters._leases import fence_violation, next_lease, released
from shared.adapters._store_documents import (
    check_aware,
    check_command_status,
    check_limit,
    check_samples,
    micros,
    next_deployment_version,
    to_document,
)
from shared.domain.errors import LeaseHeld, TransientError
from shared.domain.models import (
    BenchmarkRun,
    CommandRecord,
    DeploymentRecord,
    Lease,
    MonitorSample,
    NodeTask,
    Phase,
    RejectedMessage,
    ZoneMemoryEntry,
)
from shared.ports import Fence

__all__ = ["SqliteStateStore"]

ModelT = TypeVar("ModelT", bound=BaseModel)

_SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS deployments (
    deployment_id TEXT PRIMARY KEY,
    version INTEGER NOT NULL,
    phase TEXT NOT NULL,
    body TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS commands (
    command_id TEXT PRIMARY KEY,
    expire_at_us INTEGER,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS commands_expire ON commands (expire_at_us) WHERE expire_at_us IS NOT NULL;
CREATE TABLE IF NOT EXISTS rejected (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    received_at_us INTEGER NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS rejected_received ON rejected (received_at_us);
CREATE TABLE IF NOT EXISTS leases (
    name TEXT PRIMARY KEY,
    body TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS samples (
    deployment_id TEXT NOT NULL,
    taken_at_us INTEGER NOT NULL,
    expire_at_us INTEGER,
    body TEXT NOT NULL,
    PRIMARY KEY (deployment_id, taken_at_us)
);
CREATE INDEX IF NOT EXISTS samples_expire ON samples (expire_at_us) WHERE expire_at_us IS NOT NULL;
CREATE TABLE IF NOT EXISTS benchmark_runs (
    run_id TEXT PRIMARY KEY,
    deployment_id TEXT NOT NULL,
    created_at_us INTEGER NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS benchmark_runs_deployment ON benchmark_runs (deployment_id, created_at_us);
CREATE TABLE IF NOT EXISTS node_tasks (
    task_id TEXT PRIMARY KEY,
    deployment_id TEXT NOT NULL,
    requested_at_us INTEGER NOT NULL,
    status TEXT NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS node_tasks_deployment ON node_tasks (deployment_id, requested_at_us);
CREATE TABLE IF NOT EXISTS zone_memory (
    key TEXT PRIMARY KEY,
    body TEXT NOT NULL
);
"""


def _json_default(value: object) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"cannot store a {type(value).__name__} in a record; use JSON-compatible values")


def _dumps(model: BaseModel) -> str:
    return json.dumps(to_document(model), default=_json_default, separators=(",", ":"), sort_keys=True)


def _loads(model_type: type[ModelT], body: str) -> ModelT:
    return model_type.model_validate_json(body)


class SqliteStateStore:
    """The ``StateStore`` port on one SQLite file (created with its folder if missing)."""

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 30.0) -> None:
        if str(path) == ":memory:" or str(path).startswith("file::memory:"):
            raise ValueError("path: an in-memory database cannot be shared between threads; pass a file path")
        if busy_timeout_s <= 0:
            raise ValueError(f"busy_timeout_s: must be positive (got {busy_timeout_s})")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._busy_timeout_ms = int(busy_timeout_s * 1000)
        self._local = threading.local()
        # (owning thread, process id, connection): lets close() reach every thread's connection and lets a new
        # connection close those of threads that have ended.
        self._connections: list[tuple[threading.Thread, int, sqlite3.Connection]] = []
        self._connections_lock = threading.Lock()
        self._closed = False
        self._create_schema()

    # Connections and transactions

    def _connection(self) -> sqlite3.Connection:
        """This thread's connection; a forked child opens its own rather than sharing the parent's."""
        if self._closed:
            raise RuntimeError("SqliteStateStore is closed")
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None and getattr(self._local, "pid", None) == os.getpid():
            return conn
        # check_same_thread=False only so close() and the pruning below may close it; one thread uses it.
        conn = sqlite3.connect(
            self.path, timeout=self._busy_timeout_ms / 1000, isolation_level=None, check_same_thread=False
        )
        conn.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")  # the command ledger and deployments must survive a crash
        conn.execute("PRAGMA foreign_keys = ON")
        pid = os.getpid()
        self._local.conn = conn
        self._local.pid = pid
        with self._connections_lock:
            kept: list[tuple[threading.Thread, int, sqlite3.Connection]] = []
            for thread, owner_pid, other in self._connections:
                if owner_pid != pid:
                    continue  # inherited across fork: the parent still owns it, so just forget it here
                if thread.is_alive():
                    kept.append((thread, owner_pid, other))
                else:
                    other.close()
            kept.append((threading.current_thread(), pid, conn))
            self._connections = kept
        return conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken up front (``BEGIN IMMEDIATE``) so read-then-write cannot interleave."""
        with _mapped_errors():
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with _mapped_errors():
            yield self._connection()

    def _create_schema(self) -> None:
        with self._write() as conn:
            (version,) = conn.execute("PRAGMA user_version").fetchone()
            if version > _SCHEMA_VERSION:
                raise RuntimeError(
                    f"{self.path}: schema version {version} is newer than this code ({_SCHEMA_VERSION}); upgrade tpuctl"
                )
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")

    def close(self) -> None:
        """Close every connection this store opened (all threads)."""
        self._closed = True
        with self._connections_lock:
            connections, self._connections = self._connections, []
        pid = os.getpid()
        for _thread, owner_pid, conn in connections:
            if owner_pid == pid:
                conn.close()

    def __enter__(self) -> SqliteStateStore:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # Deployments

    def get_deployment(self, deployment_id: str) -> DeploymentRecord | None:
        with self._read() as conn:
            row = conn.execute("SELECT body FROM deployments WHERE deployment_id = ?", (deployment_id,)).fetchone()
        return _loads(DeploymentRecord, row[0]) if row else None

    def list_deployments(self, *, include_deleted: bool = False) -> list[DeploymentRecord]:
        query = "SELECT body FROM deployments"
        params: tuple[Any, ...] = ()
        if not include_deleted:
            query += " WHERE phase != ?"
            params = (Phase.DELETED.value,)
        with self._read() as conn:
            rows = conn.execute(query + " ORDER BY deployment_id", params).fetchall()
        return [_loads(DeploymentRecord, body) for (body,) in rows]

    def put_deployment(
        self, record: DeploymentRecord, *, expected_version: int | None, fence: Fence | None = None
    ) -> DeploymentRecord:
        """Create (``expected_version=None``) or compare-and-set replace; the store assigns ``version``."""
        with self._write() as conn:
            if fence is not None:
                _check_fence(conn, fence)
            row = conn.execute(
                "SELECT version FROM deployments WHERE deployment_id = ?", (record.deployment_id,)
            ).fetchone()
            current = row[0] if row else None
            stored = next_deployment_version(record, expected_version=expected_version, current=current)
            conn.execute(
                "INSERT OR REPLACE INTO deployments (deployment_id, version, phase, body) VALUES (?, ?, ?, ?)",
                (stored.deployment_id, stored.version, stored.status.phase.value, _dumps(stored)),
            )
        return stored

    # Command ledger

    def record_command(self, record: CommandRecord) -> tuple[bool, CommandRecord]:
        """Create-if-absent: ``(True, record)`` the first time, ``(False, first record)`` for a duplicate."""
        with self._write() as conn:
            cursor = conn.execute(
                "INSERT OR IGNORE INTO commands (command_id, expire_at_us, body) VALUES (?, ?, ?)",
                (record.command_id, _optional_micros(record.expire_at), _dumps(record)),
            )
            created = cursor.rowcount == 1
            (body,) = conn.execute("SELECT body FROM commands WHERE command_id = ?", (record.command_id,)).fetchone()
        return created, _loads(CommandRecord, body)

    def finish_command(self, command_id: str, status: str, outcome: str) -> None:
        """Set the final status and outcome of a recorded command; LookupError if it was never recorded."""
        checked = check_command_status(status)
        with self._write() as conn:
            row = conn.execute("SELECT body FROM commands WHERE command_id = ?", (command_id,)).fetchone()
            if row is None:
                raise LookupError(f"command_id {command_id!r}: no such command; record_command it first")
            updated = _loads(CommandRecord, row[0]).model_copy(update={"status": checked, "outcome": outcome})
            conn.execute("UPDATE commands SET body = ? WHERE command_id = ?", (_dumps(updated), command_id))

    def get_command(self, command_id: str) -> CommandRecord | None:
        with self._read() as conn:
            row = conn.execute("SELECT body FROM commands WHERE command_id = ?", (command_id,)).fetchone()
        return _loads(CommandRecord, row[0]) if row else None

    def record_rejection(self, rejected: RejectedMessage) -> None:
        with self._write() as conn:
            conn.execute(
                "INSERT INTO rejected (received_at_us, body) VALUES (?, ?)",
                (micros(rejected.received_at), _dumps(rejected)),
            )

    def list_rejections(self, limit: int = 100) -> list[RejectedMessage]:
        """Newest first."""
        with self._read() as conn:
            rows = conn.execute(
                "SELECT body FROM rejected ORDER BY received_at_us DESC, seq DESC LIMIT ?", (check_limit(limit),)
            ).fetchall()
        return [_loads(RejectedMessage, body) for (body,) in rows]

    # Leases

    def acquire_lease(self, name: str, holder: str, ttl_s: float, now: datetime) -> Lease | None:
        """Take the lease if free, expired (at ``now``) or already ours; the epoch grows on every acquisition."""
        next_lease(None, name, holder, ttl_s, now)  # validate the arguments before taking the write lock
        with self._write() as conn:
            row = conn.execute("SELECT body FROM leases WHERE name = ?", (name,)).fetchone()
            lease = next_lease(_loads(Lease, row[0]) if row else None, name, holder, ttl_s, now)
            if lease is None:
                return None
            conn.execute("INSERT OR REPLACE INTO leases (name, body) VALUES (?, ?)", (name, _dumps(lease)))
        return lease

    def release_lease(self, name: str, holder: str, epoch: int) -> None:
        """Give the lease up if ``holder`` still has it at ``epoch``; otherwise do nothing (it already moved on)."""
        with self._write() as conn:
            row = conn.execute("SELECT body FROM leases WHERE name = ?", (name,)).fetchone()
            if row is None:
                return
            after = released(_loads(Lease, row[0]), holder, epoch)
            if after is not None:
                conn.execute("UPDATE leases SET body = ? WHERE name = ?", (_dumps(after), name))

    # Monitor samples

    def write_samples(self, samples: Sequence[MonitorSample]) -> None:
        """All samples in one transaction. A sample is keyed by (deployment, taken_at): a rewrite replaces it."""
        check_samples(len(samples))
        if not samples:
            return
        rows = [(s.deployment_id, micros(s.taken_at), _optional_micros(s.expire_at), _dumps(s)) for s in samples]
        with self._write() as conn:
            conn.executemany(
                "INSERT OR REPLACE INTO samples (deployment_id, taken_at_us, expire_at_us, body) VALUES (?, ?, ?, ?)",
                rows,
            )

    def list_samples(
        self, deployment_id: str, *, since: datetime | None = None, limit: int = 100
    ) -> list[MonitorSample]:
        """Newest first; ``since`` keeps samples taken at or after it."""
        query = "SELECT body FROM samples WHERE deployment_id = ?"
        params: list[Any] = [deployment_id]
        if since is not None:
            query += " AND taken_at_us >= ?"
            params.append(micros(check_aware("since", since)))
        params.append(check_limit(limit))
        with self._read() as conn:
            rows = conn.execute(query + " ORDER BY taken_at_us DESC LIMIT ?", params).fetchall()
        return [_loads(MonitorSample, body) for (body,) in rows]

    def purge_expired(self, now: datetime) -> int:
        """Delete samples and command-ledger entries whose ``expire_at`` is before ``now``; returns how many.

        Firestore does this itself with a TTL policy on ``expire_at``; the embedded store needs a caller.
        """
        cutoff = micros(check_aware("now", now))
        with self._write() as conn:
            samples = conn.execute("DELETE FROM samples WHERE expire_at_us < ?", (cutoff,)).rowcount
            commands = conn.execute("DELETE FROM commands WHERE expire_at_us < ?", (cutoff,)).rowcount
        return int(samples + commands)

    # Benchmark runs

    def create_benchmark_run(self, run: BenchmarkRun) -> tuple[bool, BenchmarkRun]:
        """Create-if-absent, like the command ledger: a redelivered request does not start a second run."""
        with self._write() as conn:
            cursor = conn.execute(
                "INSERT OR IGNORE INTO benchmark_runs (run_id, deployment_id, created_at_us, body) VALUES (?, ?, ?, ?)",
                (run.run_id, run.deployment_id, micros(run.created_at), _dumps(run)),
            )
            created = cursor.rowcount == 1
            (body,) = conn.execute("SELECT body FROM benchmark_runs WHERE run_id = ?", (run.run_id,)).fetchone()
        return created, _loads(BenchmarkRun, body)

    def update_benchmark_run(self, run: BenchmarkRun) -> None:
        """Replace a stored run; LookupError if it was never created."""
        with self._write() as conn:
            cursor = conn.execute(
                "UPDATE benchmark_runs SET deployment_id = ?, created_at_us = ?, body = ? WHERE run_id = ?",
                (run.deployment_id, micros(run.created_at), _dumps(run), run.run_id),
            )
            if cursor.rowcount == 0:
                raise LookupError(f"run_id {run.run_id!r}: no such benchmark run; create_benchmark_run it first")

    def get_benchmark_run(self, run_id: str) -> BenchmarkRun | None:
        with self._read() as conn:
            row = conn.execute("SELECT body FROM benchmark_runs WHERE run_id = ?", (run_id,)).fetchone()
        return _loads(BenchmarkRun, row[0]) if row else None

    def list_benchmark_runs(self, deployment_id: str | None = None, limit: int = 100) -> list[BenchmarkRun]:
        """Newest first, optionally for one deployment."""
        with self._read() as conn:
            rows = conn.execute(
                "SELECT body FROM benchmark_runs WHERE (? IS NULL OR deployment_id = ?) "
                "ORDER BY created_at_us DESC, run_id DESC LIMIT ?",
                (deployment_id, deployment_id, check_limit(limit)),
            ).fetchall()
        return [_loads(BenchmarkRun, body) for (body,) in rows]

    # Node tasks

    def create_node_task(self, task: NodeTask) -> tuple[bool, NodeTask]:
        """Create-if-absent on ``task_id``: a redelivered request does not act twice."""
        with self._write() as conn:
            cursor = conn.execute(
                "INSERT OR IGNORE INTO node_tasks (task_id, deployment_id, requested_at_us, status, body) "
                "VALUES (?, ?, ?, ?, ?)",
                (task.task_id, task.deployment_id, micros(task.requested_at), task.status, _dumps(task)),
            )
            created = cursor.rowcount == 1
            (body,) = conn.execute("SELECT body FROM node_tasks WHERE task_id = ?", (task.task_id,)).fetchone()
        return created, _loads(NodeTask, body)

    def update_node_task(self, task: NodeTask, *, expected_status: str | None = None) -> bool:
        """Replace a stored task (only while its status is ``expected_status``, when given)."""
        with self._write() as conn:
            row = conn.execute("SELECT status FROM node_tasks WHERE task_id = ?", (task.task_id,)).fetchone()
            if row is None:
                raise LookupError(f"task_id {task.task_id!r}: no such node task; create_node_task it first")
            if expected_status is not None and row[0] != expected_status:
                return False
            conn.execute(
                "UPDATE node_tasks SET deployment_id = ?, requested_at_us = ?, status = ?, body = ? WHERE task_id = ?",
                (task.deployment_id, micros(task.requested_at), task.status, _dumps(task), task.task_id),
            )
        return True

    def get_node_task(self, task_id: str) -> NodeTask | None:
        with self._read() as conn:
            row = conn.execute("SELECT body FROM node_tasks WHERE task_id = ?", (task_id,)).fetchone()
        return _loads(NodeTask, row[0]) if row else None

    def list_node_tasks(self, deployment_id: str, limit: int = 20) -> list[NodeTask]:
        """Newest ``requested_at`` first."""
        with self._read() as conn:
            rows = conn.execute(
                "SELECT body FROM node_tasks WHERE deployment_id = ? ORDER BY requested_at_us DESC, task_id DESC "
                "LIMIT ?",
                (deployment_id, check_limit(limit)),
            ).fetchall()
        return [_loads(NodeTask, body) for (body,) in rows]

    # Zone memory

    def list_zone_memory(self) -> list[ZoneMemoryEntry]:
        with self._read() as conn:
            rows = conn.execute("SELECT body FROM zone_memory ORDER BY key").fetchall()
        return [_loads(ZoneMemoryEntry, body) for (body,) in rows]

    def put_zone_memory(self, entry: ZoneMemoryEntry) -> None:
        with self._write() as conn:
            conn.execute("INSERT OR REPLACE INTO zone_memory (key, body) VALUES (?, ?)", (entry.key, _dumps(entry)))

    def delete_zone_memory(self, key: str) -> None:
        with self._write() as conn:
            conn.execute("DELETE FROM zone_memory WHERE key = ?", (key,))


def _check_fence(conn: sqlite3.Connection, fence: Fence) -> None:
    row = conn.execute("SELECT body FROM leases WHERE name = ?", (fence.lease_name,)).fetchone()
    lease = _loads(Lease, row[0]) if row else None
    if problem := fence_violation(fence, lease):
        raise LeaseHeld(problem)


def _optional_micros(value: datetime | None) -> int | None:
    return micros(value) if value is not None else None


@contextmanager
def _mapped_errors() -> Iterator[None]:
    """A locked database after the busy timeout is worth retrying later; other SQLite errors are bugs."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        text = str(exc).lower()
        if "locked" in text or "busy" in text:
            raise TransientError(f"state store busy: {exc}; try again", retry_after_s=1.0) from exc
        raise

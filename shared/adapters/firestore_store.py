"""``FirestoreStateStore``: the ``StateStore`` port on Cloud Firestore (google-cloud-firestore).

Collections (each name can carry a ``prefix`` so tests and environments can share one database):
``deployments``, ``commands``, ``leases``, ``samples``, ``benchmark_runs``, ``node_tasks``, ``zone_memory``,
``rejected``.
Documents are the pydantic records as native maps; datetimes are Firestore timestamps, so the TTL policies on
``samples.expire_at`` and ``commands.expire_at`` (terraform) can expire them.

Concurrency: compare-and-set, fences and leases run in one ``@firestore.transactional`` read-modify-write with
``max_attempts`` raised to 30 (production retries optimistic conflicts; the emulator locks pessimistically and
times locks out, docs/reference/gcp-local.md §3.1). Each retry first waits a jittered, growing pause: the client
retries at once, so two writers aborted together by the emulator would otherwise retry in lockstep and keep
aborting each other until both run out of attempts. Create-if-absent uses ``document.create()`` (fails with
AlreadyExists).

Errors: a transaction that keeps losing becomes ``ConflictError``; unavailable, deadline, internal and
rate-limit answers become ``TransientError``; both are retried by the caller's message redelivery.

Queries that need composite indexes in production: ``samples (deployment_id ASC, taken_at DESC)`` and
``benchmark_runs (deployment_id ASC, created_at DESC)`` and ``node_tasks (deployment_id ASC, requested_at DESC)``.
The emulator does not enforce them.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import quote

from google.api_core import exceptions as gexc
from google.cloud import firestore
from pydantic import BaseModel

from shared.adapters._leases import fence_violation, next_lease, released
from shared.adapters._store_documents import (
    MAX_SAMPLES_PER_WRITE,
    as_stored,
    check_aware,
    check_command_status,
    check_limit,
    check_samples,
    from_document,
    micros,
    next_deployment_version,
    to_document,
)
from shared.domain.errors import ConflictError, LeaseHeld, TransientError
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

__all__ = ["COLLECTIONS", "TRANSACTION_MAX_ATTEMPTS", "FirestoreStateStore", "mapped_firestore_errors"]

ModelT = TypeVar("ModelT", bound=BaseModel)

COLLECTIONS = (
    "deployments",
    "commands",
    "leases",
    "samples",
    "benchmark_runs",
    "node_tasks",
    "zone_memory",
    "rejected",
)
TRANSACTION_MAX_ATTEMPTS = 30
RETRY_PAUSE_BASE_S = 0.05
RETRY_PAUSE_MAX_S = 2.0
ResultT = TypeVar("ResultT")


# Answers that say "not now" rather than "never": the message is redelivered and the write tried again.
_TRANSIENT = (
    gexc.ServiceUnavailable,
    gexc.DeadlineExceeded,
    gexc.InternalServerError,
    gexc.TooManyRequests,
    gexc.GatewayTimeout,
    gexc.RetryError,
)


@contextmanager
def mapped_firestore_errors(what: str) -> Iterator[None]:
    """Rewrite google.api_core errors from one store operation (``what``) into the controller's error tree."""
    try:
        yield
    except gexc.Conflict as exc:  # Aborted (lost transaction) and AlreadyExists (lost create race)
        raise ConflictError(f"{what}: lost a concurrent write ({exc.message}); re-read and try again") from exc
    except _TRANSIENT as exc:
        raise TransientError(f"{what}: Firestore unavailable ({exc}); try again later", retry_after_s=5.0) from exc
    except ValueError as exc:
        # firestore.transactional wraps the last Aborted in ValueError once max_attempts is spent.
        if isinstance(exc.__cause__, gexc.Aborted):
            raise ConflictError(f"{what}: transaction kept losing to concurrent writers ({exc}); try again") from exc
        raise


def _document_id(field: str, value: str) -> str:
    """A Firestore document id for ``value``: '/' and reserved forms escaped, so any key maps to one document."""
    if not value:
        raise ValueError(f"{field}: must not be empty")
    encoded = quote(value, safe="")
    if encoded in {".", ".."} or (encoded.startswith("__") and encoded.endswith("__")):
        encoded = "".join(f"%{byte:02X}" for byte in value.encode())
    return encoded


def _snapshot_model(model_type: type[ModelT], snapshot: Any) -> ModelT | None:
    data = snapshot.to_dict() if snapshot.exists else None
    return from_document(model_type, data) if data is not None else None


class FirestoreStateStore:
    """The ``StateStore`` port on a Firestore ``Client``; collection names start with ``prefix``."""

    def __init__(self, client: firestore.Client, prefix: str = "") -> None:
        if "/" in prefix:
            raise ValueError(f"prefix: must not contain '/' (got {prefix!r}); use e.g. 'test-1234-'")
        self._client = client
        self.prefix = prefix

    def _collection(self, name: str) -> firestore.CollectionReference:
        return self._client.collection(f"{self.prefix}{name}")

    def _in_transaction(self, what: str, body: Callable[[firestore.Transaction], ResultT]) -> ResultT:
        """Run ``body`` as one read-modify-write, retried with jittered backoff; errors mapped for ``what``."""
        attempts = 0

        @firestore.transactional
        def attempt(transaction: firestore.Transaction) -> ResultT:
            nonlocal attempts
            if attempts:  # before any read, so no lock is held while waiting
                time.sleep(random.uniform(0, min(RETRY_PAUSE_MAX_S, RETRY_PAUSE_BASE_S * 2**attempts)))
            attempts += 1
            return body(transaction)

        with mapped_firestore_errors(what):
            result: ResultT = attempt(self._client.transaction(max_attempts=TRANSACTION_MAX_ATTEMPTS))
        return result

    # Deployments

    def get_deployment(self, deployment_id: str) -> DeploymentRecord | None:
        ref = self._collection("deployments").document(_document_id("deployment_id", deployment_id))
        with mapped_firestore_errors("get_deployment"):
            return _snapshot_model(DeploymentRecord, ref.get())

    def list_deployments(self, *, include_deleted: bool = False) -> list[DeploymentRecord]:
        with mapped_firestore_errors("list_deployments"):
            snapshots = list(self._collection("deployments").order_by("deployment_id").stream())
        records = [from_document(DeploymentRecord, snapshot.to_dict() or {}) for snapshot in snapshots]
        return [r for r in records if include_deleted or r.status.phase is not Phase.DELETED]

    def put_deployment(
        self, record: DeploymentRecord, *, expected_version: int | None, fence: Fence | None = None
    ) -> DeploymentRecord:
        """Create (``expected_version=None``) or compare-and-set replace; fence checked in the same transaction."""
        ref = self._collection("deployments").document(_document_id("deployment_id", record.deployment_id))
        lease_ref = (
            self._collection("leases").document(_document_id("fence.lease_name", fence.lease_name)) if fence else None
        )

        def write(transaction: firestore.Transaction) -> DeploymentRecord:
            if fence is not None and lease_ref is not None:
                lease = _snapshot_model(Lease, lease_ref.get(transaction=transaction))
                if problem := fence_violation(fence, lease):
                    raise LeaseHeld(problem)
            snapshot = ref.get(transaction=transaction)
            current: int | None = snapshot.get("version") if snapshot.exists else None
            stored = next_deployment_version(record, expected_version=expected_version, current=current)
            transaction.set(ref, to_document(stored))
            return stored

        return self._in_transaction("put_deployment", write)

    # Command ledger

    def record_command(self, record: CommandRecord) -> tuple[bool, CommandRecord]:
        """Create-if-absent: ``(True, record)`` the first time, ``(False, first record)`` for a duplicate."""
        ref = self._collection("commands").document(_document_id("command_id", record.command_id))
        with mapped_firestore_errors("record_command"):
            try:
                ref.create(to_document(record))
            except gexc.AlreadyExists:
                stored = _snapshot_model(CommandRecord, ref.get())
                if stored is None:  # created, then purged in between: still a duplicate
                    return False, as_stored(record)
                return False, stored
        return True, as_stored(record)

    def finish_command(self, command_id: str, status: str, outcome: str) -> None:
        """Set the final status and outcome of a recorded command; LookupError if it was never recorded."""
        checked = check_command_status(status)
        ref = self._collection("commands").document(_document_id("command_id", command_id))
        with mapped_firestore_errors("finish_command"):
            try:
                ref.update({"status": checked, "outcome": outcome})
            except gexc.NotFound as exc:
                raise LookupError(f"command_id {command_id!r}: no such command; record_command it first") from exc

    def get_command(self, command_id: str) -> CommandRecord | None:
        ref = self._collection("commands").document(_document_id("command_id", command_id))
        with mapped_firestore_errors("get_command"):
            return _snapshot_model(CommandRecord, ref.get())

    def record_rejection(self, rejected: RejectedMessage) -> None:
        with mapped_firestore_errors("record_rejection"):
            self._collection("rejected").document().create(to_document(rejected))

    def list_rejections(self, limit: int = 100) -> list[RejectedMessage]:
        """Newest first."""
        query = (
            self._collection("rejected")
            .order_by("received_at", direction=firestore.Query.DESCENDING)
            .limit(check_limit(limit))
        )
        with mapped_firestore_errors("list_rejections"):
            return [from_document(RejectedMessage, s.to_dict() or {}) for s in query.stream()]

    # Leases

    def acquire_lease(self, name: str, holder: str, ttl_s: float, now: datetime) -> Lease | None:
        """Take the lease if free, expired (at ``now``) or already ours; the epoch grows on every acquisition."""
        next_lease(None, name, holder, ttl_s, now)  # validate the arguments before starting a transaction
        ref = self._collection("leases").document(_document_id("name", name))

        def acquire(transaction: firestore.Transaction) -> Lease | None:
            lease = next_lease(_snapshot_model(Lease, ref.get(transaction=transaction)), name, holder, ttl_s, now)
            if lease is not None:
                transaction.set(ref, to_document(lease))
            return lease

        return self._in_transaction("acquire_lease", acquire)

    def release_lease(self, name: str, holder: str, epoch: int) -> None:
        """Give the lease up if ``holder`` still has it at ``epoch``; otherwise do nothing (it already moved on)."""
        ref = self._collection("leases").document(_document_id("name", name))

        def release(transaction: firestore.Transaction) -> None:
            current = _snapshot_model(Lease, ref.get(transaction=transaction))
            after = released(current, holder, epoch) if current is not None else None
            if after is not None:
                transaction.set(ref, to_document(after))

        self._in_transaction("release_lease", release)

    # Monitor samples

    def write_samples(self, samples: Sequence[MonitorSample]) -> None:
        """All samples in one batched write. A sample is keyed by (deployment, taken_at): a rewrite replaces it."""
        check_samples(len(samples))
        if not samples:
            return
        batch = self._client.batch()
        for sample in samples:
            doc_id = _document_id("deployment_id", f"{sample.deployment_id}@{micros(sample.taken_at)}")
            batch.set(self._collection("samples").document(doc_id), to_document(sample))
        with mapped_firestore_errors("write_samples"):
            batch.commit()

    def list_samples(
        self, deployment_id: str, *, since: datetime | None = None, limit: int = 100
    ) -> list[MonitorSample]:
        """Newest first; ``since`` keeps samples taken at or after it."""
        query = self._collection("samples").where(filter=firestore.FieldFilter("deployment_id", "==", deployment_id))
        if since is not None:
            query = query.where(filter=firestore.FieldFilter("taken_at", ">=", check_aware("since", since)))
        query = query.order_by("taken_at", direction=firestore.Query.DESCENDING).limit(check_limit(limit))
        with mapped_firestore_errors("list_samples"):
            return [from_document(MonitorSample, s.to_dict() or {}) for s in query.stream()]

    def purge_expired(self, now: datetime) -> int:
        """Delete samples and command-ledger entries whose ``expire_at`` is before ``now``; returns how many.

        Production has TTL policies for this; the emulator has none, and an operator may want it done now.
        """
        check_aware("now", now)
        deleted = 0
        with mapped_firestore_errors("purge_expired"):
            for name in ("samples", "commands"):
                query = self._collection(name).where(filter=firestore.FieldFilter("expire_at", "<", now))
                while True:
                    refs = [s.reference for s in query.limit(MAX_SAMPLES_PER_WRITE).stream()]
                    if not refs:
                        break
                    batch = self._client.batch()
                    for ref in refs:
                        batch.delete(ref)
                    batch.commit()
                    deleted += len(refs)
        return deleted

    # Benchmark runs

    def create_benchmark_run(self, run: BenchmarkRun) -> tuple[bool, BenchmarkRun]:
        """Create-if-absent, like the command ledger: a redelivered request does not start a second run."""
        ref = self._collection("benchmark_runs").document(_document_id("run_id", run.run_id))
        with mapped_firestore_errors("create_benchmark_run"):
            try:
                ref.create(to_document(run))
            except gexc.AlreadyExists:
                return False, _snapshot_model(BenchmarkRun, ref.get()) or as_stored(run)
        return True, as_stored(run)

    def update_benchmark_run(self, run: BenchmarkRun) -> None:
        """Replace a stored run; LookupError if it was never created."""
        ref = self._collection("benchmark_runs").document(_document_id("run_id", run.run_id))
        with mapped_firestore_errors("update_benchmark_run"):
            try:
                # Every top-level field is given, so this replaces the document, but only if it exists.
                ref.update(to_document(run))
            except gexc.NotFound as exc:
                raise LookupError(
                    f"run_id {run.run_id!r}: no such benchmark run; create_benchmark_run it first"
                ) from exc

    def get_benchmark_run(self, run_id: str) -> BenchmarkRun | None:
        ref = self._collection("benchmark_runs").document(_document_id("run_id", run_id))
        with mapped_firestore_errors("get_benchmark_run"):
            return _snapshot_model(BenchmarkRun, ref.get())

    def list_benchmark_runs(self, deployment_id: str | None = None, limit: int = 100) -> list[BenchmarkRun]:
        """Newest first, optionally for one deployment."""
        query: Any = self._collection("benchmark_runs")
        if deployment_id is not None:
            query = query.where(filter=firestore.FieldFilter("deployment_id", "==", deployment_id))
        query = query.order_by("created_at", direction=firestore.Query.DESCENDING).limit(check_limit(limit))
        with mapped_firestore_errors("list_benchmark_runs"):
            return [from_document(BenchmarkRun, s.to_dict() or {}) for s in query.stream()]

    # Node tasks

    def create_node_task(self, task: NodeTask) -> tuple[bool, NodeTask]:
        """Create-if-absent on ``task_id``: a redelivered request does not act twice."""
        ref = self._collection("node_tasks").document(_document_id("task_id", task.task_id))
        with mapped_firestore_errors("create_node_task"):
            try:
                ref.create(to_document(task))
            except gexc.AlreadyExists:
                return False, _snapshot_model(NodeTask, ref.get()) or as_stored(task)
        return True, as_stored(task)

    def update_node_task(self, task: NodeTask, *, expected_status: str | None = None) -> bool:
        """Replace a stored task (only while its status is ``expected_status``, when given), in one transaction."""
        ref = self._collection("node_tasks").document(_document_id("task_id", task.task_id))

        def update(transaction: firestore.Transaction) -> bool:
            snapshot = ref.get(transaction=transaction)
            if not snapshot.exists:
                raise LookupError(f"task_id {task.task_id!r}: no such node task; create_node_task it first")
            if expected_status is not None and snapshot.get("status") != expected_status:
                return False
            transaction.set(ref, to_document(task))
            return True

        return self._in_transaction("update_node_task", update)

    def get_node_task(self, task_id: str) -> NodeTask | None:
        ref = self._collection("node_tasks").document(_document_id("task_id", task_id))
        with mapped_firestore_errors("get_node_task"):
            return _snapshot_model(NodeTask, ref.get())

    def list_node_tasks(self, deployment_id: str, limit: int = 20) -> list[NodeTask]:
        """Newest ``requested_at`` first."""
        query = (
            self._collection("node_tasks")
            .where(filter=firestore.FieldFilter("deployment_id", "==", deployment_id))
            .order_by("requested_at", direction=firestore.Query.DESCENDING)
            .limit(check_limit(limit))
        )
        with mapped_firestore_errors("list_node_tasks"):
            return [from_document(NodeTask, s.to_dict() or {}) for s in query.stream()]

    # Zone memory

    def list_zone_memory(self) -> list[ZoneMemoryEntry]:
        with mapped_firestore_errors("list_zone_memory"):
            snapshots = list(self._collection("zone_memory").stream())
        entries = [from_document(ZoneMemoryEntry, s.to_dict() or {}) for s in snapshots]
        return sorted(entries, key=lambda entry: entry.key)

    def put_zone_memory(self, entry: ZoneMemoryEntry) -> None:
        ref = self._collection("zone_memory").document(_document_id("key", entry.key))
        with mapped_firestore_errors("put_zone_memory"):
            ref.set(to_document(entry))

    def delete_zone_memory(self, key: str) -> None:
        ref = self._collection("zone_memory").document(_document_id("key", key))
        with mapped_firestore_errors("delete_zone_memory"):
            ref.delete()

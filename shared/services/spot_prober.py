"""Runs the spot probe (``shared.domain.spot_probe``) for one deployment inside the provisioner's reconcile.

The provisioner calls :meth:`SpotProber.run` under the deployment's lease, with the same provider list as its plan:
before the plan to read answers (look at, never wait on, the probes' create operations), so a verdict shapes the
plan at once, and after it to send new probes. Each pass plans, stores the memory lessons, writes the status
(fenced, through the provisioner's writer) *before* any call, then deletes answered probes and sends new ones;
a create refused at once is answered in the same pass. Probes spend the project's create tokens like any create,
and a bucket of their own caps them per tick over all deployments.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime

from shared.domain.cloud import ObservedResource, ProvisionRequest
from shared.domain.errors import CloudError, ErrorClass
from shared.domain.models import DeploymentRecord, DeploymentStatus, ZoneMemoryEntry
from shared.domain.planner_actions import OperationOutcome
from shared.domain.ratelimit import BucketState, TokenBucket
from shared.domain.spot_probe import ProbePlan, ProbePolicy, is_probe, plan_probes
from shared.domain.zone_memory import CloudFailure, MemoryPolicy
from shared.ports import Clock, StateStore, TpuApi

__all__ = ["SpotProber", "StatusWriter"]

log = logging.getLogger("tpuctl.spot_probe")

StatusWriter = Callable[[DeploymentRecord, DeploymentStatus], DeploymentRecord]
"""Writes a deployment's new status (compare-and-set under the reconcile's fence) and returns the stored record."""


class SpotProber:
    """Probes for one provisioner: its global bucket lives as long as the provisioner does."""

    def __init__(
        self,
        store: StateStore,
        tpu: TpuApi,
        clock: Clock,
        policy: ProbePolicy,
        *,
        runtime_version: str,
        memory_policy: MemoryPolicy | None = None,
        log_limit: int = 60,
    ) -> None:
        self._store = store
        self._tpu = tpu
        self._clock = clock
        self.policy = policy
        self._runtime_version = runtime_version
        self._memory_policy = memory_policy or MemoryPolicy()
        self._log_limit = log_limit
        self._bucket = TokenBucket.per_minute(policy.per_tick, burst=policy.per_tick)
        self._bucket_state: BucketState | None = None

    def run(
        self,
        record: DeploymentRecord,
        observed: Sequence[ObservedResource],
        memory: dict[str, ZoneMemoryEntry],
        write: StatusWriter,
        create_tokens: Callable[[], int],
        take_token: Callable[[], bool],
        *,
        send: bool,
    ) -> DeploymentRecord:
        """One probe pass for ``record``; returns the record as stored. Before the planner (``send`` False) it reads
        the answers, so a verdict shapes this reconcile's plan; after it (``send`` True) it sends new probes."""
        now = self._clock.now()
        mine = [o for o in observed if o.owned_by == record.deployment_id and is_probe(o)]
        outcomes = {} if send else self._poll(record)
        allowance = min(self._available(now), create_tokens()) if send else 0
        plan = self._plan(record, mine, outcomes, memory, now, allowance)
        record = write(record, plan.status)
        for delete in plan.deletes:
            try:
                self._tpu.delete(delete.zone, delete.name, force=True, request_id=delete.request_id)
            except CloudError as exc:
                if exc.error_class is not ErrorClass.NOT_FOUND:
                    log.warning("delete of spot probe %s failed (%s); the next pass repeats it", delete.name, exc)
        confirmed: dict[str, str | None] = {}
        answered: dict[str, OperationOutcome] = {}
        for request in plan.creates:
            if not (self._take(now) and take_token()):
                answered[request.resource_id] = _failed(CloudFailure(ErrorClass.RATE_LIMIT, "no create token left"))
                continue
            self._send(record, request, confirmed, answered)
        if confirmed:
            record = write(record, _confirm(record.status, confirmed))
        if answered:  # answered at once: the verdict and its lessons in the same pass
            record = write(record, self._plan(record, mine, answered, memory, now, 0).status)
        return record

    def _plan(
        self,
        record: DeploymentRecord,
        mine: Sequence[ObservedResource],
        outcomes: dict[str, OperationOutcome],
        memory: dict[str, ZoneMemoryEntry],
        now: datetime,
        allowance: int,
    ) -> ProbePlan:
        plan = plan_probes(
            record,
            mine,
            outcomes,
            memory,
            now,
            self.policy,
            allowance=allowance,
            runtime_version=self._runtime_version,
            memory_policy=self._memory_policy,
            log_limit=self._log_limit,
        )
        for entry in plan.remember:
            self._store.put_zone_memory(entry)
            memory[entry.key] = entry
        for key in plan.forget:
            self._store.delete_zone_memory(key)
            memory.pop(key, None)
        return plan

    def _poll(self, record: DeploymentRecord) -> dict[str, OperationOutcome]:
        """The finished create operations of unanswered probes (a lookup that fails leaves it for next time)."""
        outcomes: dict[str, OperationOutcome] = {}
        for probe in record.status.probes:
            if probe.verdict is not None or not probe.operation:
                continue
            try:
                op = self._tpu.get_operation(probe.operation)
            except CloudError:
                continue
            if op.done:
                failure = CloudFailure.from_operation(op) if op.error_class is not None else None
                outcomes[probe.name] = _failed(failure)
        return outcomes

    def _send(
        self,
        record: DeploymentRecord,
        request: ProvisionRequest,
        confirmed: dict[str, str | None],
        answered: dict[str, OperationOutcome],
    ) -> None:
        try:
            op = self._tpu.create(request)
        except CloudError as exc:
            if exc.error_class is ErrorClass.ALREADY_EXISTS and self._ours(record, request):
                confirmed[request.resource_id] = None  # our own earlier create (a crash after the call)
            else:
                answered[request.resource_id] = _failed(CloudFailure.from_error(exc))
            return
        if op.done:
            failure = CloudFailure.from_operation(op) if op.error_class is not None else None
            answered[request.resource_id] = _failed(failure)
        confirmed[request.resource_id] = None if op.done else op.name

    def _ours(self, record: DeploymentRecord, request: ProvisionRequest) -> bool:
        try:
            existing = self._tpu.get(request.zone, request.resource_id)
        except CloudError:
            return False
        return existing is not None and existing.owned_by == record.deployment_id and is_probe(existing)

    def _available(self, now: datetime) -> int:
        if self._bucket_state is None:
            self._bucket_state = self._bucket.full(now)
        return self._bucket.available(self._bucket_state, now)

    def _take(self, now: datetime) -> bool:
        granted, self._bucket_state = self._bucket.take(self._bucket_state or self._bucket.full(now), now)
        return granted


def _failed(failure: CloudFailure | None) -> OperationOutcome:
    return OperationOutcome(done=True, failure=failure)


def _confirm(status: DeploymentStatus, confirmed: dict[str, str | None]) -> DeploymentStatus:
    """Mark the sent probes confirmed, with their operation names."""
    probes = [
        p.model_copy(update={"confirmed": True, "operation": confirmed[p.name]}) if p.name in confirmed else p
        for p in status.probes
    ]
    return status.model_copy(update={"probes": probes})

"""The provisioner: deployment commands write desired state; reconcile runs the pure planner's actions.

``Provisioner(...).handle(message) -> str`` is the one entry for ``functions/provision``: commands
(``deployment.create/update/delete/stop/start``) and ``reconcile.tick``. Raise to retry, return to
ack (``shared.entry`` maps the error families).

How one reconcile stays safe without ever waiting:

1. take the deployment's lease; its epoch fences every state write;
2. observe: one provider list by label, plus the stored operation names of pending creates;
3. ``plan()``; store its zone-memory lessons; write the new status (compare-and-set, fenced) *before*
   any API call, so a crash after the call leaves an expectation the next tick adopts or repeats;
4. call the API (deterministic ids and request ids, ALREADY_EXISTS for our own id is success), record
   operation names, and if a create was refused synchronously plan again at once (failover in the
   same invocation); never poll an operation to completion.

Ticks reconcile every deployment that still needs work, run the janitor, and pause the Scheduler tick
job when nothing is live; every deployment command resumes it (record written first, then resume, so
a pause that races a create is always undone).

Node channels (``NodeChannels``): a deployment's node agents read their tasks from its own subscription,
which the provisioner opens (idempotently) before every TPU create of the deployment, granting the VMs'
account subscriber on it alone. A create whose channel cannot be opened is not sent: it stays an expectation
and goes again on the next tick. The channel is closed when the deployment reaches DELETED (deleted, or torn
down by TTL or budget); until the close succeeds the deployment stays DELETING with the reason in its message,
so the ticks keep retrying it and no subscription outlives its deployment.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from shared.domain.capacity_advice import AdviceScores
from shared.domain.cloud import ObservedResource, ProvisionRequest
from shared.domain.errors import (
    CloudError,
    ConflictError,
    ControllerError,
    ErrorClass,
    InvalidMessage,
    LeaseHeld,
    PermanentError,
    StaleGeneration,
    TransientError,
)
from shared.domain.models import (
    DeploymentRecord,
    DeploymentSpec,
    DeploymentStatus,
    Desired,
    Phase,
    QueuedResourceState,
    Tier,
    ZoneMemoryEntry,
)
from shared.domain.planner import (
    CreateQueuedResource,
    DeleteResource,
    ForgetZone,
    OperationOutcome,
    RememberZone,
    WriteStatus,
    needs_ticks,
    plan,
)
from shared.domain.prices import price_per_chip_hour
from shared.domain.ratelimit import BucketState
from shared.domain.slice_ladder import advice_slice, scripts_per_slice
from shared.domain.spec_change import needs_new_generation
from shared.domain.status_merge import merge_status
from shared.domain.zone_memory import CloudFailure, PriceFn, prune
from shared.messages import (
    Command,
    CreateDeployment,
    DeleteDeployment,
    ReconcileTick,
    StartDeployment,
    StopDeployment,
    UpdateDeployment,
)
from shared.ports import (
    CalendarReservations,
    CapacityAdvice,
    Clock,
    Fence,
    NodeChannels,
    SchedulerApi,
    StateStore,
    TpuApi,
)
from shared.services.benchmarker import delete_benchmark_jobs
from shared.services.calendar_booker import CalendarBooker
from shared.services.deployment_trace import deployment_work, with_command_trace
from shared.services.janitor import Janitor, JanitorReport
from shared.services.provisioner_types import TICK_JOB_NAME, ProvisionerSettings, ReconcileResult, reconcile_tick_job
from shared.services.spot_prober import SpotProber
from shared.tracing import node_trace_metadata

__all__ = ["TICK_JOB_NAME", "Provisioner", "ProvisionerSettings", "ReconcileResult", "reconcile_tick_job"]

log = logging.getLogger("tpuctl.provisioner")


class Provisioner:
    """Commands and ticks for TPU capacity, executed through ports; never sleeps or waits on an operation."""

    def __init__(
        self,
        store: StateStore,
        tpu: TpuApi,
        clock: Clock,
        *,
        scheduler: SchedulerApi | None = None,
        settings: ProvisionerSettings | None = None,
        startup_script: Callable[[DeploymentSpec], str] | None = None,
        price: PriceFn = price_per_chip_hour,
        channels: NodeChannels | None = None,
        node_metadata: Callable[[str], Mapping[str, str]] | None = None,
        advice: CapacityAdvice | None = None,
        calendar: CalendarReservations | None = None,
    ) -> None:
        self._store = store
        self._advice = advice
        self._tpu = tpu
        self._clock = clock
        self._scheduler = scheduler
        self._channels = channels
        self._node_metadata = node_metadata
        self._settings = settings or ProvisionerSettings()
        self._startup_script = startup_script or (lambda _spec: "")
        self._price = price
        self._bucket_state: BucketState | None = None
        self._pending_patches: dict[str, dict[str, Any]] = {}
        probe, planner = self._settings.probe, self._settings.planner
        self._janitor = Janitor(tpu, grace_s=self._settings.janitor_grace_s, price=price, probe=probe)
        self._booker = CalendarBooker(calendar, clock)
        self._prober = None
        if probe is not None:
            self._prober = SpotProber(
                store,
                tpu,
                clock,
                probe,
                runtime_version=planner.runtime_version,
                memory_policy=planner.memory,
                log_limit=planner.attempt_log_limit,
            )
        self.last_janitor_report: JanitorReport | None = None

    # ------------------------------------------------------------------------------------------ entry

    def handle(self, message: Command) -> str:
        """Apply one decoded message; returns a one-line outcome. Raises TransientError to be retried."""
        match message:
            case CreateDeployment():
                return self.create(message)
            case UpdateDeployment():
                return self.update(message)
            case DeleteDeployment():
                return self.delete(message)
            case StopDeployment():
                return self.stop(message)
            case StartDeployment():
                return self.start(message)
            case ReconcileTick():
                return self.tick(message)
            case _:
                kind = getattr(message, "kind", None)
                raise InvalidMessage(
                    "kind", f"{kind!r} is not handled by the provisioner", "send it to its own function"
                )

    # --------------------------------------------------------------------------------------- commands

    def create(self, message: CreateDeployment) -> str:
        """Store a new deployment (generation 1), or a new generation of a deleted one; then nudge."""
        spec: DeploymentSpec = message.spec
        deployment_id = message.deployment_id
        if spec.prewarm and not self._settings.builder_service_account:
            raise PermanentError(
                "prewarm: no builder service account here; set TPUCTL_BUILDER_SERVICE_ACCOUNT to Terraform's output "
                "tpu_builder_service_account (only that account may write the compile cache)"
            )

        def change(existing: DeploymentRecord | None, now: datetime) -> DeploymentRecord | None:
            if existing is None:
                return DeploymentRecord(
                    deployment_id=deployment_id,
                    spec=spec,
                    status=DeploymentStatus(phase=Phase.PENDING, phase_since=now),
                    created_at=now,
                    updated_at=now,
                )
            if existing.status.phase is Phase.DELETED and not existing.status.resources:
                return DeploymentRecord(
                    deployment_id=deployment_id,
                    spec=spec,
                    generation=existing.generation + 1,
                    status=DeploymentStatus(phase=Phase.PENDING, phase_since=now),
                    version=existing.version,
                    created_at=now,
                    updated_at=now,
                )
            if existing.desired is Desired.ABSENT:
                raise PermanentError(
                    f"deployment {deployment_id!r} is being deleted; create it again once its phase is DELETED"
                )
            if existing.spec != spec:
                raise PermanentError(
                    f"deployment {deployment_id!r} already exists with another spec; send deployment.update instead"
                )
            if existing.desired is Desired.STOPPED:
                raise PermanentError(f"deployment {deployment_id!r} exists and is stopped; send deployment.start")
            return None

        record, changed = self._change_record(deployment_id, change)
        head = f"created {deployment_id} generation {record.generation}" if changed else f"{deployment_id} exists"
        return self._after_command(deployment_id, head)

    def update(self, message: UpdateDeployment) -> str:
        """A new spec is a new generation: the old slice keeps serving until the new one does. A change of when it
        ends or how it is judged alone (``shared.domain.spec_change``) applies to the running generation."""
        spec: DeploymentSpec = message.spec
        deployment_id = message.deployment_id
        if spec.prewarm and not self._settings.builder_service_account:
            raise PermanentError(
                "prewarm: no builder service account here; set TPUCTL_BUILDER_SERVICE_ACCOUNT to Terraform's output "
                "tpu_builder_service_account (only that account may write the compile cache)"
            )
        expected = message.expected_generation
        in_place = False

        def change(existing: DeploymentRecord | None, now: datetime) -> DeploymentRecord | None:
            nonlocal in_place
            current = self._require(existing, deployment_id)
            _check_generation(current, expected)
            if current.desired is Desired.ABSENT:
                raise PermanentError(f"deployment {deployment_id!r} is being deleted; it cannot be updated")
            if current.spec == spec:
                return None
            in_place = not needs_new_generation(current.spec, spec)
            generation = current.generation if in_place else current.generation + 1
            return current.model_copy(update={"spec": spec, "generation": generation, "updated_at": now})

        record, changed = self._change_record(deployment_id, change)
        if not changed:
            head = f"{deployment_id} unchanged"
        elif in_place:
            head = f"updated {deployment_id} in place (generation {record.generation}: the slice is kept)"
        else:
            head = f"updated {deployment_id} to generation {record.generation}"
        return self._after_command(deployment_id, head)

    def delete(self, message: DeleteDeployment) -> str:
        """Desired absent: every resource is force-deleted and verified gone by the following ticks."""
        deployment_id = message.deployment_id
        expected = message.expected_generation
        if self._store.get_deployment(deployment_id) is None:
            return f"{deployment_id} does not exist; nothing to delete"

        def change(existing: DeploymentRecord | None, now: datetime) -> DeploymentRecord | None:
            if existing is None:
                raise PermanentError(f"deployment {deployment_id!r} does not exist; nothing to delete")
            _check_generation(existing, expected)
            if existing.desired is Desired.ABSENT:
                return None
            return existing.model_copy(update={"desired": Desired.ABSENT, "updated_at": now})

        _, changed = self._change_record(deployment_id, change)
        if self._scheduler is not None:  # scheduled benchmarks must not outlive their deployment
            delete_benchmark_jobs(self._scheduler, deployment_id)
        return self._after_command(deployment_id, f"deleting {deployment_id}" if changed else "already deleting")

    def stop(self, message: StopDeployment) -> str:
        """Release the TPU, keep the record; a later start provisions again."""
        return self._set_desired(message.deployment_id, Desired.STOPPED, "stopping")

    def start(self, message: StartDeployment) -> str:
        """Bring a stopped deployment back."""
        return self._set_desired(message.deployment_id, Desired.PRESENT, "starting")

    def _set_desired(self, deployment_id: str, desired: Desired, verb: str) -> str:
        def change(existing: DeploymentRecord | None, now: datetime) -> DeploymentRecord | None:
            current = self._require(existing, deployment_id)
            if current.desired is Desired.ABSENT:
                raise PermanentError(f"deployment {deployment_id!r} is being deleted; it cannot be {verb}")
            if current.desired is desired:
                return None
            return current.model_copy(update={"desired": desired, "updated_at": now})

        _, changed = self._change_record(deployment_id, change)
        return self._after_command(
            deployment_id, f"{verb} {deployment_id}" if changed else f"{deployment_id} unchanged"
        )

    def _require(self, existing: DeploymentRecord | None, deployment_id: str) -> DeploymentRecord:
        if existing is None or (existing.status.phase is Phase.DELETED and existing.desired is Desired.ABSENT):
            raise PermanentError(f"deployment {deployment_id!r} does not exist; send deployment.create first")
        return existing

    def _change_record(
        self, deployment_id: str, change: Callable[[DeploymentRecord | None, datetime], DeploymentRecord | None]
    ) -> tuple[DeploymentRecord, bool]:
        """Read, change, compare-and-set; a lost race re-reads and re-applies (spec writes hold no lease)."""
        for _ in range(self._settings.write_retries):
            existing = self._store.get_deployment(deployment_id)
            updated = with_command_trace(change(existing, self._clock.now()))  # later ticks join its trace
            if updated is None:
                assert existing is not None
                return existing, False
            expected = None if existing is None else existing.version
            try:
                return self._store.put_deployment(updated, expected_version=expected), True
            except ConflictError:
                continue
        raise ConflictError(f"deployment {deployment_id!r} kept changing while the command was applied")

    def _after_command(self, deployment_id: str, head: str) -> str:
        self._ensure_ticking()
        return f"{head}; {self._nudge(deployment_id)}"

    def _nudge(self, deployment_id: str) -> str:
        """Reconcile now if we can; the tick picks it up otherwise (the command is already stored)."""
        try:
            return self.reconcile(deployment_id).summary()
        except LeaseHeld:
            return "reconcile deferred: another reconciler holds the lease"
        except (TransientError, CloudError) as exc:
            if isinstance(exc, CloudError) and not exc.transient:
                raise
            return f"reconcile deferred to the next tick: {exc}"

    # ------------------------------------------------------------------------------------------ ticks

    def tick(self, message: ReconcileTick) -> str:
        """Reconcile every deployment that needs work, sweep orphans, and pause ticks when nothing is live."""
        purpose = message.purpose
        if purpose == "monitor":
            return "monitor ticks are handled by functions/monitor"
        only = message.deployment_id
        started = self._clock.monotonic()
        try:
            observed = self._tpu.list("-")
        except CloudError as exc:
            if exc.transient:
                return f"tick skipped: listing TPU resources failed ({exc.error_class.value}); next tick retries"
            raise
        self._prune_memory()
        results: list[str] = []
        if purpose == "reconcile":
            for record in self._store.list_deployments():
                if only is not None and record.deployment_id != only:
                    continue
                if not needs_ticks(record):
                    continue
                if self._clock.monotonic() - started > self._settings.tick_budget_s:
                    results.append("tick budget used up; the rest waits for the next tick")
                    break
                with deployment_work(record, "reconcile"):  # in the command's trace while its work is under way
                    results.append(self._reconcile_quietly(record.deployment_id, observed))
        records = {r.deployment_id: r for r in self._store.list_deployments(include_deleted=True)}
        janitor = self._janitor.sweep(observed, records, self._clock.now())
        self.last_janitor_report = janitor
        results.append(janitor.summary())
        zones = {zone for record in records.values() for zone in record.spec.zones}
        results += [f"released orphaned calendar booking {name}" for name in self._booker.sweep(records, zones)]
        if only is None:
            results.append(self._maybe_pause(janitor))
        return "; ".join(r for r in results if r)

    def _reconcile_quietly(self, deployment_id: str, observed: Sequence[ObservedResource]) -> str:
        try:
            return self.reconcile(deployment_id, observed=observed).summary()
        except LeaseHeld:
            return f"{deployment_id}: skipped (lease held)"
        except ConflictError as exc:
            return f"{deployment_id}: conflict ({exc}); next tick"
        except CloudError as exc:
            if not exc.transient:
                raise
            return f"{deployment_id}: deferred ({exc.error_class.value})"
        except TransientError as exc:
            return f"{deployment_id}: deferred ({exc})"

    # ------------------------------------------------------------------------------- tick job control

    def _ensure_ticking(self) -> None:
        """Make sure the tick job exists and runs; called after every command's write."""
        job = self._settings.tick_job
        if self._scheduler is None or job is None:
            return
        current = self._scheduler.get_job(job.name)
        if current is None:
            self._scheduler.upsert_job(job)
        elif current.paused:
            self._scheduler.resume_job(job.name)
            log.info("resumed the tick job %s", job.name)

    def _maybe_pause(self, janitor: JanitorReport) -> str:
        """Pause the tick job when no deployment needs it; re-check after pausing so a racing create wins."""
        job = self._settings.tick_job
        if self._scheduler is None or job is None:
            return ""
        if janitor.pending or janitor.errors or self._any_live():
            return ""
        current = self._scheduler.get_job(job.name)
        if current is None or current.paused:
            return ""
        self._scheduler.pause_job(job.name)
        if self._any_live():
            self._scheduler.resume_job(job.name)
            return "tick job kept running: a deployment appeared while pausing"
        log.info("paused the tick job %s: nothing is live", job.name)
        return "tick job paused: nothing is live"

    def _any_live(self) -> bool:
        return any(needs_ticks(record) for record in self._store.list_deployments())

    # -------------------------------------------------------------------------------------- reconcile

    def reconcile(self, deployment_id: str, *, observed: Sequence[ObservedResource] | None = None) -> ReconcileResult:
        """One level-triggered pass for one deployment under its lease. Raises LeaseHeld when busy."""
        now = self._clock.now()
        lease_name = f"deployment/{deployment_id}"
        lease = self._store.acquire_lease(lease_name, self._settings.holder, self._settings.lease_ttl_s, now)
        if lease is None:
            raise LeaseHeld(f"deployment {deployment_id!r} is being reconciled elsewhere")
        fence = Fence(lease_name, lease.epoch)
        try:
            return self._reconcile_locked(deployment_id, fence, observed)
        finally:
            try:
                self._store.release_lease(lease_name, self._settings.holder, lease.epoch)
            except TransientError:
                log.warning("could not release lease %s; it expires on its own", lease_name)

    def _reconcile_locked(
        self, deployment_id: str, fence: Fence, observed: Sequence[ObservedResource] | None
    ) -> ReconcileResult:
        result = ReconcileResult(deployment_id)
        record = self._store.get_deployment(deployment_id)
        if record is None:
            result.skipped = "no such deployment"
            return result
        if observed is None:
            observed = self._tpu.list("-")
        mine = [o for o in observed if o.owned_by == deployment_id]
        memory = {entry.key: entry for entry in self._store.list_zone_memory()}
        outcomes = self._poll_operations(record)
        scripts = scripts_per_slice(record.spec, self._startup_script)  # one per allowed slice, its own TP
        advice = self._advice_for(record)
        record = self._probe(record, observed, memory, fence, send=False)
        write = lambda current, status: self._write_status(current, status, fence)  # noqa: E731
        record, searching = self._booker.searchable(self._booker.run(record, write), write)
        if searching is None:  # it waits for its calendar window, or lost it (shared.services.calendar_booker)
            result.phase, result.message = record.status.phase, record.status.message
            return result
        for round_number in range(self._settings.max_rounds + 1):
            now = self._clock.now()
            last = round_number == self._settings.max_rounds  # only learns from the refusals, creates nothing
            actions = plan(
                record.model_copy(update={"spec": searching}),
                mine,
                memory,
                now,
                outcomes=outcomes,
                create_tokens=0 if last else self._tokens(now),
                reissue=round_number == 0,
                startup_script=scripts[record.spec.accelerator],
                startup_scripts=scripts,
                price=self._price,
                policy=self._settings.planner,
                advice=advice,
            )
            for action in actions:
                if isinstance(action, RememberZone):
                    self._store.put_zone_memory(action.entry)
                    memory[action.entry.key] = action.entry
                elif isinstance(action, ForgetZone):
                    self._store.delete_zone_memory(action.key)
                    memory.pop(action.key, None)
            status = next(a.status for a in actions if isinstance(a, WriteStatus))
            status = self._close_channel_when_gone(record, status)
            record = self._write_status(record, status, fence)
            refused = self._execute(record, actions, result)
            record = self._write_status(record, self._confirm_creates(record.status, now), fence)
            if not refused:
                break
            outcomes = refused
            deleted = set(result.deleted)  # the next plan must not send these deletes again
            mine = [
                o.model_copy(update={"state": QueuedResourceState.DELETING}) if o.name in deleted else o for o in mine
            ]
        record = self._probe(record, observed, memory, fence, send=True)
        result.phase = record.status.phase
        result.message = record.status.message
        return result

    def _probe(
        self,
        record: DeploymentRecord,
        observed: Sequence[ObservedResource],
        memory: dict[str, ZoneMemoryEntry],
        fence: Fence,
        *,
        send: bool,
    ) -> DeploymentRecord:
        """Spot probes (shared.services.spot_prober): answers read before the plan, new probes sent after it."""
        if self._prober is None:
            return record
        write = lambda current, status: self._write_status(current, status, fence)  # noqa: E731
        tokens, take = lambda: self._tokens(self._clock.now()), lambda: self._take_token(self._clock.now())
        return self._prober.run(record, observed, memory, write, tokens, take, send=send)

    def _advice_for(self, record: DeploymentRecord) -> AdviceScores:
        """Capacity advice for each allowed tier while the search may create; {} when serving or without a source."""
        searching = record.status.phase in (Phase.PENDING, Phase.SEARCHING, Phase.PROVISIONING)
        if self._advice is None or record.desired is not Desired.PRESENT or not searching:
            return {}
        spec, now = record.spec, self._clock.now()
        accelerator = advice_slice(spec, record.status.search_since, now, self._settings.planner.step)  # a step-down's
        scores: dict[tuple[str, Tier], float] = {}
        for tier in spec.tiers:
            for zone, score in self._advice.obtainability(accelerator, tier, spec.zones).items():
                scores[(zone, tier)] = score
        return scores

    def _poll_operations(self, record: DeploymentRecord) -> dict[str, OperationOutcome]:
        """Look at (never wait on) the stored create operations; a 503 just leaves the op for next time."""
        outcomes: dict[str, OperationOutcome] = {}
        for ref in record.status.resources:
            if not ref.operation:
                continue
            try:
                op = self._tpu.get_operation(ref.operation)
            except CloudError as exc:
                if exc.error_class is ErrorClass.NOT_FOUND:
                    outcomes[ref.name] = OperationOutcome(done=True)
                continue
            if not op.done:
                continue
            failure = None
            if op.error_class is not None:
                failure = CloudFailure.from_operation(op)
            outcomes[ref.name] = OperationOutcome(done=True, failure=failure)
        return outcomes

    def _tokens(self, now: datetime) -> int:
        bucket = self._settings.create_bucket
        if self._bucket_state is None:
            self._bucket_state = bucket.full(now)
        return bucket.available(self._bucket_state, now)

    def _take_token(self, now: datetime) -> bool:
        bucket = self._settings.create_bucket
        state = self._bucket_state or bucket.full(now)
        granted, self._bucket_state = bucket.take(state, now)
        return granted

    def _execute(
        self, record: DeploymentRecord, actions: Sequence[object], result: ReconcileResult
    ) -> dict[str, OperationOutcome]:
        """Make the API calls; returns synchronous refusals worth re-planning for right away."""
        refused: dict[str, OperationOutcome] = {}
        self._pending_patches = {}
        channel_open: bool | None = None  # opened once, before the first create of this round
        for action in actions:
            if isinstance(action, DeleteResource):
                self._delete(action, result)
            elif isinstance(action, CreateQueuedResource):
                if channel_open is None:
                    channel_open = self._open_channel(record.deployment_id, result)
                if not channel_open:
                    continue  # stays an unconfirmed expectation; the next tick opens the channel and sends it
                outcome = self._create(record, action, result)
                if outcome is not None:
                    refused[action.request.resource_id] = outcome
        return refused

    # ----------------------------------------------------------------------------------- node channels

    def _open_channel(self, deployment_id: str, result: ReconcileResult) -> bool:
        """Open the deployment's node channel before a node of it is created; False holds the create back."""
        if self._channels is None:
            return True
        try:
            self._channels.open(deployment_id)
        except ControllerError as exc:
            if isinstance(exc, CloudError):
                kind, transient = exc.error_class.value, exc.transient
            else:
                kind, transient = type(exc).__name__, isinstance(exc, TransientError)
            result.failures.append(f"node-channel:{kind}")
            log.log(
                logging.INFO if transient else logging.ERROR,
                "node channel of %s not opened (%s); its create waits for the next tick",
                deployment_id,
                exc,
            )
            return False
        return True

    def _close_channel_when_gone(self, record: DeploymentRecord, status: DeploymentStatus) -> DeploymentStatus:
        """On the way to DELETED, close the node channel first; while that fails, stay DELETING and say why."""
        if self._channels is None or status.phase is not Phase.DELETED or record.status.phase is Phase.DELETED:
            return status
        try:
            self._channels.close(record.deployment_id)
        except ControllerError as exc:
            log.warning("node channel of %s not closed (%s); the next tick tries again", record.deployment_id, exc)
            since = record.status.phase_since if record.status.phase is Phase.DELETING else status.phase_since
            return status.model_copy(
                update={
                    "phase": Phase.DELETING,
                    "phase_since": since,
                    "message": f"{status.message}; waiting to close the node channel: {str(exc)[:300]}",
                }
            )
        return status

    def _delete(self, action: DeleteResource, result: ReconcileResult) -> None:
        try:
            self._tpu.delete(action.zone, action.name, force=action.force, request_id=action.request_id)
        except CloudError as exc:
            if exc.error_class is not ErrorClass.NOT_FOUND:
                log.warning("delete of %s/%s failed (%s); next tick retries", action.zone, action.name, exc)
                return
        result.deleted.append(action.name)

    def _create(
        self, record: DeploymentRecord, action: CreateQueuedResource, result: ReconcileResult
    ) -> OperationOutcome | None:
        request = action.request
        now = self._clock.now()
        if not self._take_token(now):
            return None  # stays an unconfirmed expectation; re-sent when tokens come back
        try:
            request = self._with_node_metadata(record, request)
        except ControllerError as exc:  # the event key could not be made: the create waits for the next tick
            log.warning("node metadata of %s not made (%s); its create waits for the next tick", request.node_id, exc)
            result.failures.append(f"node-metadata:{type(exc).__name__}")
            return None
        try:
            op = self._tpu.create(request)
        except CloudError as exc:
            return self._create_refused(record, action, exc, result)
        if op.done and op.error_class is not None:
            result.failures.append(f"{request.resource_id}:{op.error_class.value}")
            return OperationOutcome(
                done=True,
                failure=CloudFailure.from_operation(op),
            )
        self._pending_patches[request.resource_id] = {
            "state": QueuedResourceState.CREATING,
            "operation": None if op.done else op.name,
        }
        result.created.append(request.resource_id)
        return None

    def _with_node_metadata(self, record: DeploymentRecord, request: ProvisionRequest) -> ProvisionRequest:
        """The request with its node metadata made at send time (the event key; this pass's span, the boot's parent),
        run as the builder account when it is a prewarm (the only account that may write the compile cache)."""
        deployment_id = record.deployment_id
        made = {**(self._node_metadata(deployment_id) if self._node_metadata else {}), **node_trace_metadata()}
        update: dict[str, Any] = {"metadata": {**request.metadata, **made}}
        if record.spec.prewarm:
            update["service_account"] = self._settings.builder_service_account
        return request.model_copy(update=update)

    def _create_refused(
        self, record: DeploymentRecord, action: CreateQueuedResource, exc: CloudError, result: ReconcileResult
    ) -> OperationOutcome | None:
        request = action.request
        if exc.error_class is ErrorClass.ALREADY_EXISTS:
            existing = self._get_quietly(request.zone, request.resource_id)
            if existing is not None and existing.owned_by == record.deployment_id:
                self._pending_patches[request.resource_id] = {"state": QueuedResourceState.CREATING}
                result.created.append(request.resource_id)
                return None  # our own earlier create: success
            failure = CloudFailure(ErrorClass.ALREADY_EXISTS, "the name is taken by a resource that is not ours")
            result.failures.append(f"{request.resource_id}:name_taken")
            return OperationOutcome(done=True, failure=failure)
        if exc.error_class is ErrorClass.RATE_LIMIT:
            bucket = self._settings.create_bucket
            now = self._clock.now()
            self._bucket_state = bucket.drain(
                self._bucket_state or bucket.full(now), now, hold_s=self._settings.rate_limit_hold_s
            )
        if exc.error_class is ErrorClass.TRANSIENT:
            log.info("create of %s hit %s; the same request goes again next tick", request.resource_id, exc)
            return None
        result.failures.append(f"{request.resource_id}:{exc.error_class.value}")
        return OperationOutcome(done=True, failure=CloudFailure.from_error(exc))

    def _get_quietly(self, zone: str, name: str) -> ObservedResource | None:
        try:
            return self._tpu.get(zone, name)
        except CloudError:
            return None

    def _confirm_creates(self, status: DeploymentStatus, now: datetime) -> DeploymentStatus:
        """Fold create results (operation names, confirmed creates) into the status."""
        patches = self._pending_patches
        if not patches:
            return status
        updated = status.model_copy(deep=True)
        for ref in updated.resources:
            patch = patches.get(ref.name)
            if patch is None:
                continue
            if ref.state is QueuedResourceState.UNKNOWN:
                ref.state = patch["state"]
                ref.state_since = now
            if "operation" in patch:
                ref.operation = patch["operation"]
        self._pending_patches = {}
        return updated

    def _write_status(self, record: DeploymentRecord, status: DeploymentStatus, fence: Fence) -> DeploymentRecord:
        """Compare-and-set the status under the fence; a command's concurrent write is merged, not lost."""
        if status == record.status:
            return record
        base = record.status
        candidate = record
        for _ in range(self._settings.write_retries):
            merged = merge_status(base, status, candidate.status)
            try:
                return self._store.put_deployment(
                    candidate.model_copy(update={"status": merged, "updated_at": self._clock.now()}),
                    expected_version=candidate.version,
                    fence=fence,
                )
            except ConflictError:
                fresh = self._store.get_deployment(record.deployment_id)
                if fresh is None:
                    raise
                candidate = fresh
        raise ConflictError(f"deployment {record.deployment_id!r}: status write kept losing races")

    # ----------------------------------------------------------------------------------- zone memory

    def _prune_memory(self) -> None:
        memory = {entry.key: entry for entry in self._store.list_zone_memory()}
        for key in prune(memory, self._clock.now(), self._settings.planner.memory):
            self._store.delete_zone_memory(key)

    def zone_memory(self) -> list[ZoneMemoryEntry]:
        """What the search has learned (for status views)."""
        return self._store.list_zone_memory()


def _check_generation(record: DeploymentRecord, expected: int | None) -> None:
    if expected is not None and expected != record.generation:
        raise StaleGeneration(
            f"deployment {record.deployment_id!r} is at generation {record.generation}, the command expected "
            f"{expected}; re-read the deployment and send the command again"
        )

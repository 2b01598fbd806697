"""Reads: the deployment list, one deployment's dashboard, and where a command is (``get_operation``)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any, Literal

from mcp_client_gateway import bounds
from mcp_client_gateway.boot_views import BootStagesView
from mcp_client_gateway.capabilities.checks import PHASES, optional
from mcp_client_gateway.capabilities.common import (
    CommandPublisher,
    GatewayPorts,
    NodeTaskReader,
    Records,
    hourly_usd,
    pricing,
    slice_chips,
)
from mcp_client_gateway.capabilities.views import node_task_view, sample_view
from mcp_client_gateway.log_hygiene import clean_text
from mcp_client_gateway.models import (
    AttemptView,
    BootView,
    DeploymentDetail,
    DeploymentList,
    DeploymentSummary,
    NodeView,
    OperationView,
    ResourceView,
)
from shared.domain import deployment_progress
from shared.domain.boot_progress import stage_text
from shared.domain.boot_stages import stages_text
from shared.domain.engine_facts import as_record, describe, facts_from
from shared.domain.models import (
    BootProgress,
    BootStages,
    DeploymentRecord,
    DeploymentSpec,
    Desired,
    NodeTask,
    Phase,
    Tier,
)
from shared.domain.prewarm import builder_finished

__all__ = ["Operations", "deployment_stage"]

_MAX_ATTEMPTS_SHOWN = 20
_MAX_FINDINGS_SHOWN = 10
_NODE_TASK_KINDS = {"restart": "serving.restart", "logs": "serving.logs", "debug": "serving.debug"}
_TARGET_PHASES: dict[str, frozenset[Phase]] = {
    "deployment.create": frozenset({Phase.SERVING}),
    "deployment.update": frozenset({Phase.SERVING}),
    "deployment.start": frozenset({Phase.SERVING}),
    "serving.restart": frozenset({Phase.SERVING}),
    "deployment.stop": frozenset({Phase.STOPPED}),
    "deployment.delete": frozenset({Phase.DELETED}),
}


def _clean(text: str, limit: int) -> str:
    return clean_text(text, limit)[0]


def deployment_stage(record: DeploymentRecord, now: datetime) -> str:
    """A one-line progress text for a deployment's phase (what a person wants to read while waiting)."""
    return deployment_progress.deployment_stage(record, now, clean=_clean)


class Operations:
    """Deployments and commands as the state store has them (read-only)."""

    def __init__(
        self, ports: GatewayPorts, records: Records, publisher: CommandPublisher, node_tasks: NodeTaskReader
    ) -> None:
        self.ports = ports
        self.records = records
        self.publisher = publisher
        self.node_tasks = node_tasks

    def list_deployments(
        self, *, include_deleted: bool = False, phase: str | None = None, offset: int = 0, limit: int = 20
    ) -> DeploymentList:
        """Deployments newest first, with the resources the controller last observed."""
        include_deleted = bounds.flag("include_deleted", include_deleted)
        phase = optional(bounds.choice, "phase", phase, PHASES)
        offset = bounds.integer("offset", offset, bounds.LIST_OFFSET)
        limit = bounds.integer("limit", limit, bounds.LIST_LIMIT)
        records = self.ports.store.list_deployments(include_deleted=include_deleted)
        if phase is not None:
            records = [r for r in records if r.status.phase.value == phase]
        records.sort(key=lambda r: r.created_at, reverse=True)
        page = records[offset : offset + limit]
        following = offset + limit if offset + limit < len(records) else None
        return DeploymentList(deployments=[_summary(r) for r in page], total=len(records), next_offset=following)

    def get_deployment(self, deployment_id: str) -> DeploymentDetail:
        """The status dashboard of one deployment."""
        record = self.records.get(deployment_id, include_deleted=True)
        samples = self.ports.store.list_samples(deployment_id, limit=1)
        status = record.status
        spec = record.spec
        attempts = status.attempts[-_MAX_ATTEMPTS_SHOWN:]
        node_resource = next((r for r in reversed(status.resources) if r.node_state is not None), None)
        system = self._node_system(record)
        prices = pricing(self.ports) if status.zone and status.tier else None  # read only for a priced slice
        engine = facts_from(status.engine)  # checked again: the record is the VM's word
        return DeploymentDetail(
            deployment_id=record.deployment_id,
            model=spec.model,
            accelerator=spec.accelerator,
            alternative_accelerators=list(spec.alternative_accelerators),
            granted_accelerator=status.accelerator,
            zones=list(spec.zones),
            tiers=[t.value for t in spec.tiers],
            desired=record.desired.value,
            generation=record.generation,
            observed_generation=status.observed_generation,
            phase=status.phase.value,
            phase_since=status.phase_since,
            serving_since=status.serving_since,
            message=clean_text(status.message)[0],
            zone=status.zone,
            tier=status.tier.value if status.tier else None,
            endpoint=status.endpoint,
            resources=[_resource(r, spec) for r in status.resources],
            attempts=[
                AttemptView(at=a.at, zone=a.zone, tier=a.tier.value, outcome=a.outcome, detail=clean_text(a.detail)[0])
                for a in attempts
            ],
            attempts_total=len(status.attempts),
            slis=dict(status.slis),
            findings=[clean_text(finding, limit=500)[0] for finding in status.findings[:_MAX_FINDINGS_SHOWN]],
            engine=as_record(engine) if engine else None,
            engine_summary=describe(engine) if engine else None,
            latest_sample=sample_view(samples[0]) if samples else None,
            spend_usd=round(status.spend_usd, 4),
            hourly_usd=hourly_usd(record, prices) if prices else None,
            price_source=prices.label if prices else None,
            budget_usd=spec.budget_usd,
            ttl_hours=spec.ttl_hours,
            node=NodeView(
                name=node_resource.name if node_resource else None,
                zone=node_resource.zone if node_resource else None,
                state=node_resource.node_state.value if node_resource and node_resource.node_state else None,
                accelerator=(node_resource.accelerator if node_resource else None) or spec.accelerator,
                chips=slice_chips((node_resource.accelerator if node_resource else None) or spec.accelerator),
                system=system,
            ),
            boot=_boot_view(status.boot),
            node_tasks=[node_task_view(task) for task in self.node_tasks.of(record.deployment_id)],
            created_at=record.created_at,
            updated_at=record.updated_at,
        )

    def get_operation(self, command_id: str) -> OperationView:
        """Where a command is: on the bus, in the ledger, and the phase of its deployment."""
        command_id = bounds.command_id(command_id)
        ledger = self.ports.store.get_command(command_id)
        published = self.publisher.published(command_id)
        fallback_kind, fallback_deployment = "benchmark.run", None
        if ledger is None and published is None:
            run = self.ports.store.get_benchmark_run(command_id)
            found = self.node_tasks.get(command_id) if run is None else None
            if found is not None:  # a node task sent by another gateway or the monitor, and its ledger expired
                fallback_kind, fallback_deployment = _NODE_TASK_KINDS[found.action], found.deployment_id
            elif run is None:
                return OperationView(
                    command_id=command_id,
                    status="unknown",
                    done=False,
                    stage="No record of this command yet (another gateway may have sent it, or the controller has "
                    "not picked it up).",
                    next_step="Check tpu_status(deployment_id=ID) for the deployment's phase.",
                )
        kind = ledger.kind if ledger else published.kind if published else fallback_kind
        deployment_id = (
            (ledger.deployment_id if ledger else None)
            or (published.deployment_id if published else None)
            or fallback_deployment
        )
        record = self.ports.store.get_deployment(deployment_id) if deployment_id else None
        now = self.ports.clock.now()
        since = ledger.received_at if ledger else published.at if published else None
        status: Literal["published", "accepted", "applied", "rejected", "failed", "unknown"] = (
            ledger.status if ledger else "published"
        )
        view = OperationView(
            command_id=command_id,
            kind=kind,
            deployment_id=deployment_id,
            status=status,
            outcome=clean_text(ledger.outcome)[0] if ledger else "",
            done=False,
            stage="",
            phase=record.status.phase.value if record else None,
            elapsed_s=round((now - since).total_seconds(), 1) if since else None,
        )
        if kind == "benchmark.run":
            return self._benchmark_operation(view)
        if kind in _NODE_TASK_KINDS.values():
            return self._node_task_operation(view)
        if status in ("rejected", "failed"):
            view.done = True
            view.stage = f"The controller {status} the command: {view.outcome or 'no reason recorded'}"
            return view
        if status == "published":
            view.stage = "Queued: waiting for the controller to pick the command up"
            view.next_step = "Poll again in a few seconds."
            return view
        targets = _TARGET_PHASES.get(kind, frozenset())
        ended = _ended_under(kind, record, status)
        if ended is not None:
            view.done = True
            view.superseded = not ended.startswith(("Deleted", _PREWARMED))
            view.stage = ended
            if view.superseded:
                view.next_step = (
                    f"See {_status(deployment_id)} for what is left; create or start it again if you want it."
                )
            return view
        if record is None:
            view.stage = "Accepted: the deployment record is not written yet"
            return view
        view.stage = deployment_stage(record, now)
        phase = record.status.phase
        view.done = status == "applied" and (phase in targets or phase is Phase.FAILED)
        if not view.done:
            view.next_step = "Poll again; capacity search and model load take minutes."
        elif phase is Phase.SERVING:
            view.next_step = "Query it with tpu_query or benchmark it with tpu_benchmark."
        return view

    def _benchmark_operation(self, view: OperationView) -> OperationView:
        """A benchmark (or tune) run: done once the node reported it, or the controller refused it."""
        run = self.ports.store.get_benchmark_run(view.command_id)
        view.benchmark_status = run.status if run else None
        refused = view.status in ("rejected", "failed")
        view.done = refused or (run is not None and run.status in ("completed", "failed"))
        view.stage = f"Benchmark {run.status}" if run else "Benchmark queued"
        view.next_step = (
            f"Read the result with tpu_observe(show='benchmarks', command_id='{view.command_id}')."
            if view.done
            else "Poll again in a minute."
        )
        return view

    def _node_task_operation(self, view: OperationView) -> OperationView:
        """Progress of serving.restart / serving.logs / serving.debug: the node task and the node agent's answer."""
        task = self.node_tasks.get(view.command_id)
        if task is None:
            if view.status in ("rejected", "failed"):
                view.done = True
                view.stage = f"The controller {view.status} the command: {view.outcome or 'no reason recorded'}"
            elif view.status == "published":
                view.stage = "Queued: waiting for the controller to pick the command up"
                view.next_step = "Poll again in a few seconds."
            else:
                view.stage = "Accepted: being dispatched to the node agent"
                view.next_step = "Poll again in a few seconds."
            return view
        view.node_task = node_task_view(task)
        view.done = task.finished
        detail = clean_text(task.detail, limit=300)[0]
        if task.status == "dispatched":
            view.stage = "Dispatched to the node agent; waiting for its answer"
            view.next_step = "Poll again in a few seconds."
        elif task.status == "failed":
            view.stage = f"failed: {detail or 'no reason recorded'}"
            view.next_step = f"See {_status(view.deployment_id)} for the node's state."
        elif task.action == "restart":
            finished = task.finished_at.isoformat() if task.finished_at else "an unknown time"
            view.stage = f"completed: restarted at {finished}" + (f" ({detail})" if detail else "")
            view.next_step = (
                f"vLLM loads the model again; serving resumes when {_status(view.deployment_id)} shows SERVING."
            )
            if task.bundle:
                view.next_step += f" The engine's state before the restart: {_read_bundle(task)}."
        elif task.action == "debug":
            kept = "a debug bundle kept" if task.bundle else "no debug bundle kept"
            view.stage = f"completed: {kept}" + (f" ({detail})" if detail else "")
            view.next_step = f"Read it with {_read_bundle(task)}." if task.bundle else ""
        else:
            view.stage = f"completed: {len(task.lines)} log line(s)" + (f" ({detail})" if detail else "")
            view.next_step = (
                f"Read them with tpu_control(action='log_tail', deployment_id='{task.deployment_id}', "
                f"task_id='{task.task_id}')."
            )
        return view

    def _node_system(self, record: DeploymentRecord) -> dict[str, Any] | None:
        """What the node agent reported about its machine: the boot record
        (kept on the deployment's status from ``node.booted``), else the node summary of the latest benchmark."""
        if record.status.node_system:
            return dict(record.status.node_system)
        runs = self.ports.store.list_benchmark_runs(record.deployment_id, limit=20)
        for run in sorted(runs, key=lambda r: r.updated_at, reverse=True):
            node = (run.result or {}).get("node")
            if isinstance(node, dict) and node:
                return {str(k): v for k, v in node.items() if isinstance(v, str | int | float | bool) or v is None}
        return None


def _read_bundle(task: NodeTask) -> str:
    return f"tpu_observe(show='debug_bundle', deployment_id='{task.deployment_id}', command_id='{task.task_id}')"


def _status(deployment_id: str | None) -> str:
    """``tpu_status(deployment_id='a')``, or with the placeholder ``ID`` when the deployment is not known."""
    return f"tpu_status(deployment_id='{deployment_id}')" if deployment_id else "tpu_status(deployment_id=ID)"


def _verb(kind: str) -> str:
    return kind.rsplit(".", 1)[-1]


_PREWARMED = "Prewarmed"  # how a prewarm's create ends: done, not superseded by its own delete


def _ended_under(kind: str, record: DeploymentRecord | None, status: str) -> str | None:
    """Why a command can no longer reach its target phase: the deployment is being (or was) deleted, by a delete
    or by its TTL or budget, under a pending create, update, start or stop; or stopped under a create or start;
    or, the command applied, its record is gone. ``None`` while the command may still finish."""
    if record is None:
        if status != "applied":
            return None
        if kind == "deployment.delete":
            return "Deleted"
        return f"Superseded: the deployment no longer exists, so this {_verb(kind)} cannot finish"
    if kind == "deployment.create" and builder_finished(record):
        return f"{_PREWARMED}: the compile cache is filled for this plan and slice, and the builder is deleted"
    if kind not in _TARGET_PHASES or kind == "deployment.delete":
        return None
    phase = record.status.phase
    if phase in _TARGET_PHASES[kind]:
        return None
    verb = _verb(kind)
    if phase in (Phase.DELETING, Phase.DELETED) or record.desired is Desired.ABSENT:
        reason = _teardown_reason(record)
        done = "was deleted" if phase is Phase.DELETED else "is being deleted"
        return f"Superseded: the deployment {done} ({reason}) before this {verb} finished"
    if record.desired is Desired.STOPPED and Phase.SERVING in _TARGET_PHASES[kind]:
        state = "was stopped" if phase is Phase.STOPPED else "is being stopped"
        return f"Superseded: the deployment {state} (stop requested) before this {verb} finished"
    return None


def _teardown_reason(record: DeploymentRecord) -> str:
    """The controller's reason for a teardown (``ttl of 2 h reached``, ``budget of $5.00 reached``, ``delete
    requested``): the head of its status message, as the planner writes it."""
    status = record.status
    if status.phase in (Phase.DELETING, Phase.DELETED):
        head = re.split(r"[:;]", status.message, maxsplit=1)[0].strip()
        if head:
            return _clean(head, 160)
    return "delete requested" if record.desired is Desired.ABSENT else "torn down"


def _resource(ref: Any, spec: DeploymentSpec) -> ResourceView:
    """A resource with its terms: the reservation it draws on, the queued request's valid-until while it waits
    (``created_at`` + the spec's ``valid_until_minutes``, as sent) and what a spot probe found holds it, and a
    flex-start slice's run-cap expiry (``active_at`` + ``max_run_hours``: the provider deletes it then)."""
    waiting = ref.created_at is not None and ref.active_at is None
    flex = ref.tier is Tier.FLEX_START and ref.active_at is not None
    return ResourceView(
        reservation=spec.reservation_name if ref.tier is Tier.RESERVATION else None,
        valid_until=ref.created_at + timedelta(minutes=spec.valid_until_minutes) if waiting else None,
        run_ends_at=ref.active_at + timedelta(hours=spec.max_run_hours) if flex else None,
        name=ref.name,
        zone=ref.zone,
        tier=ref.tier.value,
        accelerator=ref.accelerator or spec.accelerator,
        state=ref.state.value,
        node_state=ref.node_state.value if ref.node_state else None,
        endpoint=ref.endpoint,
        created_at=ref.created_at,
        active_at=ref.active_at,
        waiting_on=ref.probe if waiting and ref.probe in ("capacity", "quota") else None,
    )


def _summary(record: DeploymentRecord) -> DeploymentSummary:
    status = record.status
    return DeploymentSummary(
        deployment_id=record.deployment_id,
        model=record.spec.model,
        accelerator=record.spec.accelerator,
        phase=status.phase.value,
        desired=record.desired.value,
        zone=status.zone,
        tier=status.tier.value if status.tier else None,
        endpoint=status.endpoint,
        generation=record.generation,
        spend_usd=round(status.spend_usd, 4),
        updated_at=record.updated_at,
        resources=[_resource(r, record.spec) for r in status.resources],
    )


def _boot_view(boot: BootProgress | None) -> BootView | None:
    if boot is None:
        return None
    return BootView(
        node=boot.node,
        stage=boot.stage,
        text=clean_text(stage_text(boot), limit=360)[0],
        detail=clean_text(boot.detail, limit=300)[0],
        stage_since=boot.stage_since,
        seen_at=boot.seen_at,
        stages=_stages_view(boot.stages),
    )


def _stages_view(stages: BootStages | None) -> BootStagesView | None:
    if stages is None:
        return None
    return BootStagesView(
        seconds=dict(stages.seconds),
        weights_source=stages.weights_source,
        weights_bytes=stages.weights_bytes,
        compile_cache=stages.compile_cache,
        compile_restore=stages.compile_restore,
        compile_fill=stages.compile_fill,
        text=stages_text(stages),
    )

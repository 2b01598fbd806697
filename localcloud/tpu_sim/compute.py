"""The Compute Engine subset of the simulated world: TPU VMs as instances (``ct6e-standard-*t``).

Why here and not a second simulator: flex-start, spot and standard TPU VMs through Compute Engine draw on
the same physical chips as queued resources, so instances run on the world's shared kernel
(:mod:`~localcloud.tpu_sim.kernel`): its virtual clock, capacity pools (``zone, family, pool``), RNG and
billing meter. One scenario can then offer a zone through either API, and the invariants (no orphans, one
ACTIVE per deployment) span both. The world composes this engine with the TPU API on one kernel; the engine
knows only the kernel.

What it models (docs/reference/gcp-local.md §5.x, docs/reference/reference-agent.md §11):

- ``instances.insert`` with ``scheduling.provisioningModel`` FLEX_START / SPOT / STANDARD /
  RESERVATION_BOUND, ``maxRunDuration`` with ``instanceTerminationAction`` (DELETE or STOP),
  ``params.requestValidForDuration`` (flex-start only), ``onHostMaintenance`` (TERMINATE is required for
  TPU machine types), labels, metadata, disks and service accounts kept as sent;
- synchronous refusals in Compute Engine's envelope (``errors[].reason``): unknown zone, unknown machine
  type in the zone, invalid fields, duplicate names (409), location policy (403), create rate (429);
- zonal operations (PENDING/RUNNING/DONE) whose ``error.errors[].code`` carries
  ZONE_RESOURCE_POOL_EXHAUSTED[_WITH_DETAILS], QUOTA_EXCEEDED (with ``quotaInfo``) and
  UNSUPPORTED_OPERATION (a provisioning model the zone does not offer for the machine type);
- status PENDING (flex-start waiting for chips; a request short of quota also just waits, as observed),
  PROVISIONING -> STAGING -> RUNNING, STOPPING -> gone (DELETE) or TERMINATED (STOP);
- max-run termination, spot preemption (zone hazard or admin), and the regional quotas of §11.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from typing import Any

from localcloud.tpu_sim.advice import booked_reservations
from localcloud.tpu_sim.compute_render import (
    ComputeOperation,
    SimInstance,
    instance_url,
    render_instance,
    render_machine,
    render_op,
    zone_url,
)
from localcloud.tpu_sim.compute_validation import (
    MACHINE_TYPES,
    ComputeApiError,
    InsertRequest,
    check_project,
    machine_type_of,
    offered_accelerators,
    offered_models,
    parse_insert,
    quota_error,
    zone_spec,
)
from localcloud.tpu_sim.kernel import LABEL_DEPLOYMENT, CreateRate, PoolKey, SimKernel, SimNode, leftover_entry
from localcloud.tpu_sim.scenario import ComputeQuotaSpec

__all__ = [
    "MACHINE_TYPES",
    "ComputeApiError",
    "ComputeEngine",
    "SimInstance",
    "machine_type_of",
]

LIVE_STATUSES = ("PENDING", "PROVISIONING", "STAGING", "RUNNING")
_FILTER = re.compile(r'^\s*labels\.([a-z][-_a-z0-9]*)\s*(=|!=|:)\s*"?([-_a-z0-9]*)"?\s*$')
_TIER_OF_MODEL = {
    "STANDARD": "on_demand",
    "SPOT": "spot",
    "FLEX_START": "flex_start",
    "RESERVATION_BOUND": "reservation",
}
_SCENARIO_MODEL = {
    "STANDARD": "standard",
    "SPOT": "spot",
    "FLEX_START": "flex_start",
    "RESERVATION_BOUND": "reservation",
}


class ComputeEngine:
    """Instances, zonal operations and machine types of one project, on the world's :class:`SimKernel`.

    Every public method runs inside the kernel's transaction (lock held, virtual time caught up), so
    it is as thread-safe and deterministic as the TPU API half.
    """

    def __init__(self, kernel: SimKernel) -> None:
        self.kernel = kernel
        self.scenario = kernel.scenario
        self.project = kernel.scenario.project
        self._instances: dict[tuple[str, str], SimInstance] = {}
        self._ops: dict[str, ComputeOperation] = {}
        self._waiting: dict[PoolKey, list[SimInstance]] = {}
        self._request_ids: dict[str, tuple[str, float]] = {}
        self._create_rate = CreateRate()
        self._op_numbers = itertools.count(1)
        self._quota: dict[tuple[str, str, str], ComputeQuotaSpec] = {
            (q.metric, q.family, q.region): q for q in kernel.scenario.compute_quotas
        }

    # ------------------------------------------------------------------ operations and status

    def _new_op(self, zone: str, operation_type: str, target: str, target_id: int) -> ComputeOperation:
        kernel = self.kernel
        millis = int(kernel.now_s * 1000)
        suffix = f"{kernel.rng.getrandbits(32):08x}-{kernel.rng.getrandbits(48):012x}"
        name = f"operation-{millis}-{suffix}"
        op = ComputeOperation(
            name=name,
            zone=zone,
            operation_type=operation_type,
            target=target,
            target_id=target_id,
            created_at=kernel.now_s,
            numeric_id=7_000_000_000_000 + next(self._op_numbers) * 104729,
        )
        self._ops[f"{zone}/{name}"] = op
        return op

    def _start_op(self, op: ComputeOperation | None) -> None:
        if op is not None and op.status == "PENDING":
            op.status = "RUNNING"
            op.started_at = self.kernel.now_s

    def _finish_op(self, op_key: str | None, error: dict[str, Any] | None = None, http_status: int = 400) -> None:
        op = self._ops.get(op_key or "")
        if op is None or op.status == "DONE":
            return
        self._start_op(op)
        op.status = "DONE"
        op.progress = 100
        op.end_at = self.kernel.now_s
        if error is not None:
            op.error = [error]
            op.http_status = http_status

    def _op_key(self, op: ComputeOperation) -> str:
        return f"{op.zone}/{op.name}"

    def _set_status(self, instance: SimInstance, status: str, message: str = "") -> None:
        kernel = self.kernel
        if instance.state == "RUNNING" and status != "RUNNING":
            kernel.bill(instance, preempted=message == "Instance was preempted.")
            instance.stopped_at = kernel.now_s
        instance.state = status
        instance.state_since = kernel.now_s
        instance.status_message = message
        instance.epoch += 1
        if status == "RUNNING":
            instance.ready_since = kernel.now_s
            instance.started_at = kernel.now_s
            if instance.first_ready_at is None:
                instance.first_ready_at = kernel.now_s
        kernel.log(f"instance.{status.lower()}", instance.zone, instance.node_id, instance.provisioning_model)

    # ------------------------------------------------------------------ quota and rate

    def _quota_usage(self, metric: str, family: str, region: str) -> int:
        return sum(
            item.chips
            for item in self._instances.values()
            if item.quota_metric == metric
            and item.family == family
            and item.zone.rsplit("-", 1)[0] == region
            and item.state != "TERMINATED"
        )

    def _quota_headroom(self, metric: str, family: str, region: str, chips: int) -> ComputeQuotaSpec | None:
        """None when ``chips`` more fit under the limit (or there is no limit); else the exceeded limit."""
        limit = self._quota.get((metric, family, region))
        if limit is None or self._quota_usage(metric, family, region) + chips <= limit.limit:
            return None
        return limit

    def _check_rate(self) -> None:
        limit = self.scenario.limits.creates_per_minute
        if limit is not None and not self._create_rate.admit(self.kernel.now_s, limit):
            raise ComputeApiError(
                429,
                "Quota exceeded for quota metric 'Write requests' and limit 'Write requests per minute per region' "
                "of service 'compute.googleapis.com'.",
                reason="rateLimitExceeded",
            )

    # ------------------------------------------------------------------ insert

    def insert(self, project: str, zone: str, body: Any, *, request_id: str | None = None) -> dict[str, Any]:
        """POST …/zones/{zone}/instances: sync checks, then a RUNNING zonal operation (never done at once)."""
        kernel = self.kernel
        with self.kernel.transaction():
            check_project(self.scenario, project)
            if request_id:
                seen = self._request_ids.get(request_id)
                if seen is not None and kernel.now_s - seen[1] <= self.scenario.limits.idempotency_window_s:
                    op = self._ops.get(seen[0])
                    if op is not None:
                        return render_op(self.project, op)
            return self._insert(zone, body, request_id)

    def _insert(self, zone: str, body: Any, request_id: str | None) -> dict[str, Any]:
        kernel = self.kernel
        request = parse_insert(self.scenario, zone, body, booked_reservations(kernel, zone))
        name, model = request.name, request.model
        if (zone, name) in self._instances:
            raise ComputeApiError(
                409,
                f"The resource 'projects/{self.project}/zones/{zone}/instances/{name}' already exists",
                reason="alreadyExists",
            )
        self._check_rate()
        instance = self._new_instance(zone, body, request)
        op = self._new_op(zone, "insert", f"{zone_url(self.project, zone)}/instances/{name}", instance.numeric_id)
        if request_id:
            self._request_ids[request_id] = (self._op_key(op), kernel.now_s)
        if _SCENARIO_MODEL[model] not in offered_models(request.spec):
            error = {
                "code": "UNSUPPORTED_OPERATION",
                "message": f"The provisioning model '{model}' is not supported for machine type '{request.machine}' "
                f"in zone '{zone}'.",
            }
            kernel.after(kernel.timing(zone, "flex_refusal_s"), self._finish_op, self._op_key(op), error, 400)
            kernel.log("instance.unsupported", zone, name, model)
            return render_op(self.project, op)
        if model in ("SPOT", "STANDARD", "RESERVATION_BOUND") and not self._take_quota(instance, op):
            return render_op(self.project, op)
        self._instances[(zone, name)] = instance
        instance.insert_op = self._op_key(op)
        kernel.log("instance.provisioning", zone, name, f"{request.machine} {model}")
        kernel.after(kernel.timing(zone, "accept_s"), self._on_accepted, instance, instance.epoch, request.valid_for)
        return render_op(self.project, op)

    def _new_instance(self, zone: str, body: dict[str, Any], request: InsertRequest) -> SimInstance:
        kernel = self.kernel
        number = kernel.next_node_number()
        return SimInstance(
            zone=zone,
            node_id=request.name,
            accelerator=request.accelerator,
            family=request.family,
            chips=request.chips,
            runtime_version="",
            pool=request.pool,
            tier=_TIER_OF_MODEL[request.model],
            body=body,
            created_at=kernel.now_s,
            numeric_id=5_000_000_000_000 + number * 7919,
            ip_address=f"10.{128 + kernel.zone_index(zone) % 120}.{(number >> 8) & 255}.{number & 255}",
            api_version="compute/v1",
            state="PROVISIONING",
            state_since=kernel.now_s,
            machine_type=request.machine,
            provisioning_model=request.model,
            termination_action=request.action,
            max_run_s=request.max_run,
            reservation=request.reservation,
        )

    def _take_quota(self, instance: SimInstance, op: ComputeOperation) -> bool:
        """A non-flex instance holds regional quota from the start; over the limit, its operation fails (403)."""
        kernel = self.kernel
        model, zone = instance.provisioning_model, instance.zone
        metric = "preemptible" if model == "SPOT" else "family"
        region = zone.rsplit("-", 1)[0]
        reserved = model == "RESERVATION_BOUND"
        exceeded = None if reserved else self._quota_headroom(metric, instance.family, region, instance.chips)
        if exceeded is not None:
            kernel.after(kernel.timing(zone, "accept_s"), self._finish_op, self._op_key(op), quota_error(exceeded), 403)
            kernel.log("instance.quota", zone, instance.node_id, f"{metric} limit {exceeded.limit}")
            return False
        instance.quota_metric = None if reserved else metric
        return True

    def _current(self, instance: SimInstance, epoch: int | None = None) -> bool:
        if self._instances.get((instance.zone, instance.node_id)) is not instance:
            return False
        return epoch is None or instance.epoch == epoch

    def _on_accepted(self, instance: SimInstance, epoch: int, valid_for: float | None) -> None:
        if not self._current(instance, epoch) or instance.state != "PROVISIONING":
            return
        kernel = self.kernel
        self._start_op(self._ops.get(instance.insert_op))
        if instance.provisioning_model == "FLEX_START":
            self._set_status(instance, "PENDING")
            if valid_for is not None:
                instance.valid_until = kernel.now_s + valid_for
                kernel.schedule(instance.valid_until, self._on_valid_for_expired, instance, instance.epoch)
            key = (instance.zone, instance.family, instance.pool)
            self._waiting.setdefault(key, []).append(instance)
            kernel.mark_dirty(key)
            return
        kernel.after(kernel.timing(instance.zone, "capacity_check_s"), self._on_capacity_check, instance, epoch)

    def _on_capacity_check(self, instance: SimInstance, epoch: int) -> None:
        if not self._current(instance, epoch) or instance.state != "PROVISIONING":
            return
        pool = self.kernel.pool(instance.zone, instance.family, instance.pool)
        if pool.free >= instance.chips:
            self._grant(instance, pool)
            return
        error = self._stockout_error(instance)
        self._finish_op(instance.insert_op, error, 503)
        del self._instances[(instance.zone, instance.node_id)]
        self.kernel.log("instance.stockout", instance.zone, instance.node_id, error["code"])

    def _stockout_error(self, instance: SimInstance) -> dict[str, Any]:
        zone = instance.zone
        where = f"projects/{self.scenario.project}/zones/{zone}"
        if self.scenario.zones[zone].compute.stockout_error == "pool_with_details":
            return {
                "code": "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
                "message": f"The zone '{where}' does not have enough resources available to fulfill the request. "
                f"'(resource type:compute)'.",
            }
        return {
            "code": "ZONE_RESOURCE_POOL_EXHAUSTED",
            "message": f"The zone '{where}' does not have enough resources available to fulfill the request.  "
            "Try a different zone, or try again later.",
        }

    def _grant(self, instance: SimInstance, pool: Any) -> None:
        """Chips found: hold them, STAGING (the insert operation is done), then RUNNING after the boot."""
        kernel = self.kernel
        pool.used += instance.chips
        instance.holds_chips = True
        self._set_status(instance, "STAGING")
        self._finish_op(instance.insert_op)
        kernel.after(kernel.timing(instance.zone, "boot_s"), self._on_boot, instance, instance.epoch)

    def _on_valid_for_expired(self, instance: SimInstance, epoch: int) -> None:
        if not self._current(instance, epoch) or instance.state != "PENDING":
            return
        error = {
            "code": "ZONE_RESOURCE_POOL_EXHAUSTED",
            "message": f"The zone 'projects/{self.scenario.project}/zones/{instance.zone}' did not have enough "
            "resources available to fulfill the request within its requestValidForDuration.",
        }
        self._finish_op(instance.insert_op, error, 503)
        del self._instances[(instance.zone, instance.node_id)]
        instance.epoch += 1
        self.kernel.log("instance.expired", instance.zone, instance.node_id, "request valid-for duration passed")

    def match(self, key: tuple[str, str, str]) -> None:
        """Grant waiting flex-start instances of one pool, oldest first, while chips and quota allow."""
        queue = self._waiting.get(key)
        if not queue:
            return
        pool = self.kernel.pool(*key)
        remaining: list[SimInstance] = []
        for instance in queue:
            if not self._current(instance) or instance.state != "PENDING":
                continue
            if pool.free < instance.chips:
                remaining.append(instance)
                continue
            region = instance.zone.rsplit("-", 1)[0]
            metric = next(
                (
                    name
                    for name in ("preemptible", "family")
                    if self._quota_headroom(name, instance.family, region, instance.chips) is None
                ),
                None,
            )
            # short of quota: it just keeps waiting, like a stockout (docs/reference/reference-agent.md §11)
            if metric is None:
                remaining.append(instance)
                continue
            instance.quota_metric = metric
            self._grant(instance, pool)
        self._waiting[key] = remaining

    def _on_boot(self, instance: SimInstance, epoch: int) -> None:
        if not self._current(instance, epoch) or instance.state != "STAGING":
            return
        kernel = self.kernel
        self._set_status(instance, "RUNNING")
        kernel.notify("ready", instance)
        if instance.max_run_s:
            instance.termination_time = kernel.now_s + instance.max_run_s
            kernel.schedule(instance.termination_time, self._on_max_run, instance, instance.epoch)
        if instance.provisioning_model == "SPOT":
            self._schedule_preemption(instance)

    def _schedule_preemption(self, instance: SimInstance) -> None:
        delay = self.kernel.preemption_delay(self.scenario.zones[instance.zone].preemption)
        if delay is not None:
            self.kernel.schedule(self.kernel.now_s + delay, self._on_hazard, instance, instance.epoch)

    def _on_hazard(self, instance: SimInstance, epoch: int) -> None:
        if self._current(instance, epoch) and instance.state == "RUNNING":
            self._preempt(instance)

    def _on_max_run(self, instance: SimInstance, epoch: int) -> None:
        if self._current(instance, epoch) and instance.state == "RUNNING":
            self._terminate(instance, "Instance reached its max run duration.", "max_run")

    def _preempt(self, instance: SimInstance) -> None:
        self.kernel.notify("preempted", instance)
        self._record_system_event(instance, "compute.instances.preempted")
        self._terminate(instance, "Instance was preempted.", "preempted")

    def _record_system_event(self, instance: SimInstance, operation_type: str) -> None:
        op = self._new_op(instance.zone, operation_type, instance_url(self.project, instance), instance.numeric_id)
        self._finish_op(self._op_key(op))

    def _terminate(self, instance: SimInstance, message: str, why: str) -> None:
        """The service ends the VM: STOPPING, chips back now, then gone (DELETE) or TERMINATED (STOP)."""
        kernel = self.kernel
        self._set_status(instance, "STOPPING", message)
        self._release(instance)
        delete = instance.termination_action == "DELETE"
        kernel.log(f"instance.{why}", instance.zone, instance.node_id, "delete" if delete else "stop")
        kernel.after(kernel.timing(instance.zone, "delete_s"), self._on_terminated, instance, instance.epoch, delete)

    def _on_terminated(self, instance: SimInstance, epoch: int, delete: bool) -> None:
        if not self._current(instance, epoch) or instance.state != "STOPPING":
            return
        if delete:
            self._remove(instance)
            return
        self._set_status(instance, "TERMINATED", instance.status_message)
        self.kernel.notify("stopped", instance)

    def _release(self, instance: SimInstance) -> None:
        self.kernel.release_chips(instance)

    def _remove(self, instance: SimInstance) -> None:
        kernel = self.kernel
        self._release(instance)
        if instance.state == "RUNNING":
            kernel.bill(instance, preempted=False)
        del self._instances[(instance.zone, instance.node_id)]
        instance.epoch += 1
        region = instance.zone.rsplit("-", 1)[0]
        for key in self._waiting:  # its regional quota is free: waiting flex-start requests look again
            if key[0].rsplit("-", 1)[0] == region and key[1] == instance.family:
                kernel.mark_dirty(key)
        kernel.log("instance.gone", instance.zone, instance.node_id, "")
        kernel.notify("deleted", instance)
        self._finish_op(instance.delete_op)

    # ------------------------------------------------------------------ get, list, delete, stop, start

    def _require(self, zone: str, name: str) -> SimInstance:
        instance = self._instances.get((zone, name))
        if instance is None:
            raise ComputeApiError(
                404,
                f"The resource 'projects/{self.scenario.project}/zones/{zone}/instances/{name}' was not found",
                reason="notFound",
            )
        return instance

    def get(self, project: str, zone: str, name: str) -> dict[str, Any]:
        with self.kernel.transaction():
            check_project(self.scenario, project)
            zone_spec(self.scenario, zone)
            return render_instance(self.project, self._require(zone, name))

    def list_instances(self, project: str, zone: str, filter_text: str = "") -> list[dict[str, Any]]:
        with self.kernel.transaction():
            check_project(self.scenario, project)
            zone_spec(self.scenario, zone)
            match = self._filter(filter_text)
            items = sorted((i for i in self._instances.values() if i.zone == zone), key=lambda i: i.node_id)
            return [render_instance(self.project, i) for i in items if match(i)]

    def aggregated(self, project: str, filter_text: str = "") -> dict[str, dict[str, Any]]:
        """``aggregated/instances``: ``{"zones/Z": {"instances": [...]}}``; zones with none carry a warning."""
        with self.kernel.transaction():
            check_project(self.scenario, project)
            match = self._filter(filter_text)
            out: dict[str, dict[str, Any]] = {}
            for zone, spec in sorted(self.scenario.zones.items()):
                if spec.forbidden:
                    continue
                items = sorted(
                    (i for i in self._instances.values() if i.zone == zone and match(i)), key=lambda i: i.node_id
                )
                if items:
                    out[f"zones/{zone}"] = {"instances": [render_instance(self.project, i) for i in items]}
                else:
                    out[f"zones/{zone}"] = {
                        "warning": {
                            "code": "NO_RESULTS_ON_PAGE",
                            "message": "There are no results for scope 'zones/" + zone + "' on this page.",
                            "data": [{"key": "scope", "value": f"zones/{zone}"}],
                        }
                    }
            return out

    def _filter(self, text: str) -> Callable[[SimInstance], bool]:
        """The one filter shape the adapter sends: ``labels.KEY = "VALUE"`` (also ``!=`` and ``:*``)."""
        if not text.strip():
            return lambda _instance: True
        match = _FILTER.match(text)
        if match is None:
            raise ComputeApiError(
                400,
                f"Invalid value for field 'filter': '{text}'. The simulator understands labels.KEY = \"VALUE\".",
                reason="invalid",
            )
        key, operator, value = match.groups()

        def keep(instance: SimInstance) -> bool:
            labels = instance.labels
            if operator == ":":
                return key in labels
            return (labels.get(key) == value) is (operator == "=")

        return keep

    def delete(self, project: str, zone: str, name: str, *, request_id: str | None = None) -> dict[str, Any]:
        """DELETE …/instances/{name}: STOPPING, then gone; a waiting flex-start request is cancelled for good."""
        kernel = self.kernel
        with self.kernel.transaction():
            check_project(self.scenario, project)
            if request_id:
                seen = self._request_ids.get(request_id)
                if seen is not None and seen[0] in self._ops:
                    return render_op(self.project, self._ops[seen[0]])
            zone_spec(self.scenario, zone, permission="compute.instances.delete")
            instance = self._require(zone, name)
            if instance.delete_op and instance.delete_op in self._ops:
                return render_op(self.project, self._ops[instance.delete_op])
            op = self._new_op(zone, "delete", instance_url(self.project, instance), instance.numeric_id)
            self._start_op(op)
            if request_id:
                self._request_ids[request_id] = (self._op_key(op), kernel.now_s)
            instance.delete_op = self._op_key(op)
            if instance.state in ("PROVISIONING", "PENDING", "STAGING"):
                self._finish_op(
                    instance.insert_op,
                    {"code": "ABORTED", "message": f"The instance '{name}' was deleted before it started."},
                    409,
                )
            if instance.state in ("PROVISIONING", "PENDING"):
                self._remove(instance)
                return render_op(self.project, op)
            if instance.state != "STOPPING":
                self._set_status(instance, "STOPPING", "Instance is being deleted.")
                self._release(instance)
            instance.epoch += 1  # a pending max-run or preemption end must not turn it TERMINATED instead
            kernel.after(kernel.timing(zone, "delete_s"), self._on_deleted, instance, instance.epoch)
            return render_op(self.project, op)

    def _on_deleted(self, instance: SimInstance, epoch: int) -> None:
        if self._current(instance, epoch):
            self._remove(instance)

    def stop(self, project: str, zone: str, name: str) -> dict[str, Any]:
        """POST …/stop: RUNNING -> STOPPING -> TERMINATED; the chips go back to the pool."""
        kernel = self.kernel
        with self.kernel.transaction():
            check_project(self.scenario, project)
            zone_spec(self.scenario, zone)
            instance = self._require(zone, name)
            if instance.state != "RUNNING":
                raise ComputeApiError(
                    400,
                    f"The instance '{name}' is not RUNNING (it is {instance.state}); only a running instance stops.",
                    reason="resourceNotReady",
                )
            op = self._new_op(zone, "stop", instance_url(self.project, instance), instance.numeric_id)
            self._start_op(op)
            self._set_status(instance, "STOPPING", "Instance is being stopped.")
            self._release(instance)
            kernel.after(self.scenario.timings.stop_s, self._on_stopped, instance, instance.epoch, self._op_key(op))
            return render_op(self.project, op)

    def _on_stopped(self, instance: SimInstance, epoch: int, op_key: str) -> None:
        if self._current(instance, epoch) and instance.state == "STOPPING":
            self._set_status(instance, "TERMINATED", "Instance was stopped.")
            self.kernel.notify("stopped", instance)
        self._finish_op(op_key)

    def start(self, project: str, zone: str, name: str) -> dict[str, Any]:
        """POST …/start: a TERMINATED instance needs chips again; none -> the operation fails with a stockout."""
        kernel = self.kernel
        with self.kernel.transaction():
            check_project(self.scenario, project)
            zone_spec(self.scenario, zone)
            instance = self._require(zone, name)
            if instance.state != "TERMINATED":
                raise ComputeApiError(
                    400,
                    f"The instance '{name}' is {instance.state}; only a TERMINATED instance starts.",
                    reason="resourceNotReady",
                )
            op = self._new_op(zone, "start", instance_url(self.project, instance), instance.numeric_id)
            self._start_op(op)
            pool = kernel.pool(instance.zone, instance.family, instance.pool)
            if pool.free < instance.chips:
                self._finish_op(self._op_key(op), self._stockout_error(instance), 503)
                return render_op(self.project, op)
            pool.used += instance.chips
            instance.holds_chips = True
            self._set_status(instance, "STAGING")
            self._finish_op(self._op_key(op))
            kernel.after(kernel.timing(zone, "boot_s"), self._on_boot, instance, instance.epoch)
            return render_op(self.project, op)

    def guest_attributes(
        self, project: str, zone: str, name: str, query_path: str = "", variable_key: str = ""
    ) -> dict[str, Any]:
        """GET …/instances/{name}/getGuestAttributes: ``queryPath`` (``NS/``) or ``variableKey`` (``NS/KEY``). Like
        Compute Engine, a path or key with nothing written yet is a 404, as is a missing instance."""
        with self.kernel.transaction():
            check_project(self.scenario, project)
            zone_spec(self.scenario, zone, permission="compute.instances.getGuestAttributes")
            instance = self._require(zone, name)
            wanted = variable_key or query_path
            namespace, _, key = wanted.strip("/").partition("/")
            found = sorted(
                (ns, item, value)
                for (ns, item), value in instance.guest_attributes.items()
                if (not namespace or ns == namespace) and (not key or item == key)
            )
        if not found or (variable_key and not key):
            raise ComputeApiError(
                404,
                f"The resource '{instance_url(self.project, instance)}/guestAttributes/{wanted}' was not found",
                reason="notFound",
            )
        body: dict[str, Any] = {"kind": "compute#guestAttributes", "selfLink": instance_url(self.project, instance)}
        if variable_key:
            return {**body, "variableKey": variable_key, "variableValue": found[0][2]}
        items = [{"namespace": ns, "key": item, "value": value} for ns, item, value in found]
        return {**body, "queryPath": query_path, "queryValue": {"items": items}}

    # ------------------------------------------------------------------ operations and machine types

    def get_operation(self, project: str, zone: str, name: str) -> dict[str, Any]:
        with self.kernel.transaction():
            check_project(self.scenario, project)
            op = self._ops.get(f"{zone}/{name}")
            if op is None:
                raise ComputeApiError(
                    404,
                    f"The resource 'projects/{project}/zones/{zone}/operations/{name}' was not found",
                    reason="notFound",
                )
            return render_op(self.project, op)

    def list_operations(self, project: str, zone: str) -> list[dict[str, Any]]:
        with self.kernel.transaction():
            check_project(self.scenario, project)
            zone_spec(self.scenario, zone)
            return [render_op(self.project, op) for op in self._ops.values() if op.zone == zone]

    def machine_types(self, project: str, zone: str) -> list[dict[str, Any]]:
        with self.kernel.transaction():
            check_project(self.scenario, project)
            spec = zone_spec(self.scenario, zone)
            return [
                render_machine(self.project, zone, acc) for acc in offered_accelerators(spec) if acc in MACHINE_TYPES
            ]

    def machine_type(self, project: str, zone: str, name: str) -> dict[str, Any]:
        for item in self.machine_types(project, zone):
            if item["name"] == name:
                return item
        raise ComputeApiError(
            404,
            f"The resource 'projects/{project}/zones/{zone}/machineTypes/{name}' was not found",
            reason="notFound",
        )

    # ------------------------------------------------------------------ admin

    def preempt(self, zone: str, name: str) -> list[str]:
        """Preempt one SPOT instance now (the admin call); returns the name when it was RUNNING."""
        with self.kernel.transaction():
            instance = self._instances.get((zone, name))
            if instance is None:
                raise KeyError(f"instance: {zone}/{name} does not exist")
            if instance.state != "RUNNING":
                return []
            self._preempt(instance)
            return [name]

    def status(self, zone: str, name: str) -> str | None:
        """The instance's status, or None when it does not exist."""
        with self.kernel.transaction():
            instance = self._instances.get((zone, name))
            return instance.state if instance else None

    def instance(self, zone: str, name: str) -> dict[str, Any] | None:
        """The instance as the API renders it, or None."""
        with self.kernel.transaction():
            instance = self._instances.get((zone, name))
            return render_instance(self.project, instance) if instance else None

    # ------------------------------------------------------------------ world hooks (lock held by the caller)

    def node(self, zone: str, name: str) -> SimNode | None:
        """The instance as a node (the local node runtime attaches a real vLLM endpoint to it)."""
        return self._instances.get((zone, name))

    def billable(self) -> list[SimNode]:
        """Instances billing right now (RUNNING)."""
        return [item for item in self._instances.values() if item.ready_since is not None]

    def add_invariants(
        self,
        resources: list[tuple[str, str, str, dict[str, str]]],
        leftovers: list[dict[str, Any]],
        active: dict[str, list[str]],
        max_leftover_s: float,
    ) -> None:
        """Fold instances into the world's invariants: orphans, TERMINATED leftovers, ACTIVE per deployment."""
        now = self.kernel.now_s
        for instance in sorted(self._instances.values(), key=lambda i: (i.zone, i.node_id)):
            if instance.delete_op is None:
                resources.append(("instance", instance.zone, instance.node_id, instance.labels))
            if instance.state == "TERMINATED":
                leftovers.append(
                    leftover_entry(
                        "instance",
                        instance.zone,
                        instance.node_id,
                        instance.state,
                        now - instance.state_since,
                        max_leftover_s,
                    )
                )
            owner = instance.labels.get(LABEL_DEPLOYMENT)
            if owner and instance.state == "RUNNING":
                active.setdefault(owner, []).append(f"{instance.zone}/instances/{instance.node_id}")

    def state(self) -> dict[str, Any]:
        """Instances and Compute Engine quota usage, for ``/_sim/state``."""
        quota = [
            {
                "metric": spec.metric,
                "family": spec.family,
                "region": spec.region,
                "limit": spec.limit,
                "usage": self._quota_usage(spec.metric, spec.family, spec.region),
            }
            for spec in self.scenario.compute_quotas
        ]
        instances = [
            {**render_instance(self.project, i), "sim": {"tier": i.tier, "pool": i.pool, "billed_s": i.billed_s}}
            for i in sorted(self._instances.values(), key=lambda i: (i.zone, i.node_id))
        ]
        return {"instances": instances, "quota": quota, "operations": len(self._ops)}

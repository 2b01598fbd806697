"""The Compute Engine subset of the simulated world: TPU VMs as instances (``ct6e-standard-*t``).

Why here and not a second simulator: flex-start, spot and standard TPU VMs through Compute Engine draw on
the same physical chips as queued resources, so instances share the world's virtual clock, capacity
pools (``zone, family, pool``), preemption hazards and billing meter. One scenario can then offer a zone
through either API, and the invariants (no orphans, one ACTIVE per deployment) span both.

What it models (gcp-local.md §5.x, reference-agent.md §11):

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
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from localcloud.tpu_sim.scenario import ComputeQuotaSpec, ZoneSpec
from localcloud.tpu_sim.wire import SimApiError, format_time, parse_duration
from localcloud.tpu_sim.world import SimNode, World

__all__ = [
    "MACHINE_TYPES",
    "ComputeApiError",
    "ComputeEngine",
    "SimInstance",
    "machine_type_of",
]

COMPUTE = "https://www.googleapis.com/compute/v1"
LABEL_DEPLOYMENT = "tpuctl-deployment"
INSTANCE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
LABEL_KEY = re.compile(r"^[a-z][-_a-z0-9]{0,62}$")
LABEL_VALUE = re.compile(r"^[-_a-z0-9]{0,63}$")
PROVISIONING_MODELS = ("STANDARD", "SPOT", "FLEX_START", "RESERVATION_BOUND")
TERMINATION_ACTIONS = ("DELETE", "STOP")
LIVE_STATUSES = ("PENDING", "PROVISIONING", "STAGING", "RUNNING")
_FILTER = re.compile(r'^\s*labels\.([a-z][-_a-z0-9]*)\s*(=|!=|:)\s*"?([-_a-z0-9]*)"?\s*$')

# Slice type -> (machine type, chips): Google's published TPU VM machine types.
MACHINE_TYPES: dict[str, tuple[str, int]] = {
    "v6e-1": ("ct6e-standard-1t", 1),
    "v6e-4": ("ct6e-standard-4t", 4),
    "v6e-8": ("ct6e-standard-8t", 8),
    "v5litepod-1": ("ct5lp-hightpu-1t", 1),
    "v5litepod-4": ("ct5lp-hightpu-4t", 4),
    "v5litepod-8": ("ct5lp-hightpu-8t", 8),
    "v5p-8": ("ct5p-hightpu-4t", 4),
}
_BY_MACHINE = {machine: (accelerator, chips) for accelerator, (machine, chips) in MACHINE_TYPES.items()}
_TPU_FAMILY = {"v6e": "CT6E", "v5litepod": "CT5LP", "v5p": "CT5P"}
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


def machine_type_of(accelerator: str) -> str | None:
    """``v6e-4`` -> ``ct6e-standard-4t``; None for a slice Compute Engine does not sell as one VM."""
    found = MACHINE_TYPES.get(accelerator)
    return found[0] if found else None


class ComputeApiError(SimApiError):
    """A synchronous Compute Engine error: Google's envelope plus the ``errors[]`` list Compute adds."""

    def __init__(self, http_status: int, message: str, *, reason: str, status: str | None = None) -> None:
        super().__init__(http_status, message, status=status)
        self.reason = reason

    def envelope(self) -> dict[str, Any]:
        body = super().envelope()
        body["error"]["errors"] = [{"message": self.message, "domain": "global", "reason": self.reason}]
        return body


@dataclass
class ComputeOperation:
    name: str
    zone: str
    operation_type: str
    target: str
    target_id: int
    created_at: float
    numeric_id: int
    status: str = "PENDING"
    progress: int = 0
    started_at: float | None = None
    end_at: float | None = None
    error: list[dict[str, Any]] | None = None
    http_status: int | None = None


@dataclass
class SimInstance(SimNode):
    """A TPU VM created through Compute Engine: a node (billing, listeners) plus the instance's own fields."""

    machine_type: str = ""
    provisioning_model: str = "STANDARD"
    termination_action: str = ""
    max_run_s: float | None = None
    valid_until: float | None = None
    insert_op: str = ""
    reservation: str | None = None
    quota_metric: str | None = None  # preemptible | family, once the instance holds quota
    status_message: str = ""
    started_at: float | None = None
    stopped_at: float | None = None


class ComputeEngine:
    """Instances, zonal operations and machine types of one project, inside a :class:`World`.

    Every public method runs inside the world's transaction (lock held, virtual time caught up), so
    it is as thread-safe and deterministic as the TPU API half.
    """

    def __init__(self, world: World) -> None:
        self._world = world
        self._instances: dict[tuple[str, str], SimInstance] = {}
        self._ops: dict[str, ComputeOperation] = {}
        self._waiting: dict[tuple[str, str, str], list[SimInstance]] = {}
        self._request_ids: dict[str, tuple[str, float]] = {}
        self._create_times: deque[float] = deque()
        self._op_numbers = itertools.count(1)
        self._quota: dict[tuple[str, str, str], ComputeQuotaSpec] = {
            (q.metric, q.family, q.region): q for q in world.scenario.compute_quotas
        }

    # ------------------------------------------------------------------ helpers

    @property
    def _scenario(self) -> Any:
        return self._world.scenario

    def _zone_url(self, zone: str) -> str:
        return f"{COMPUTE}/projects/{self._scenario.project}/zones/{zone}"

    def _instance_url(self, instance: SimInstance) -> str:
        return f"{self._zone_url(instance.zone)}/instances/{instance.node_id}"

    def _check_project(self, project: str) -> None:
        if project != self._scenario.project:
            raise ComputeApiError(
                403,
                f"Required 'compute.instances.list' permission for 'projects/{project}' (the simulator serves project "
                f"'{self._scenario.project}')",
                reason="forbidden",
            )

    def _zone_spec(self, zone: str, *, permission: str = "compute.instances.list") -> ZoneSpec:
        spec = self._scenario.zones.get(zone)
        served = spec is not None and (spec.compute.served if spec.compute.served is not None else spec.served)
        if spec is not None and spec.forbidden:
            raise ComputeApiError(
                403,
                f"Location {zone} violates constraint constraints/gcp.resourceLocations on the resource "
                f"projects/{self._scenario.project}/zones/{zone}: required '{permission}' permission is denied "
                "by the organization policy",
                reason="forbidden",
            )
        if spec is None or not served:
            raise ComputeApiError(400, f"Invalid value for field 'zone': '{zone}'. Unknown zone.", reason="invalid")
        return spec

    def _offered(self, spec: ZoneSpec) -> tuple[str, ...]:
        return spec.compute.accelerators if spec.compute.accelerators is not None else spec.accelerators

    def _models(self, spec: ZoneSpec) -> tuple[str, ...]:
        models = spec.compute.provisioning_models
        return models if models is not None else spec.provisioning_models

    def _new_op(self, zone: str, operation_type: str, target: str, target_id: int) -> ComputeOperation:
        world = self._world
        millis = int(world._now * 1000)
        suffix = f"{world._rng.getrandbits(32):08x}-{world._rng.getrandbits(48):012x}"
        name = f"operation-{millis}-{suffix}"
        op = ComputeOperation(
            name=name,
            zone=zone,
            operation_type=operation_type,
            target=target,
            target_id=target_id,
            created_at=world._now,
            numeric_id=7_000_000_000_000 + next(self._op_numbers) * 104729,
        )
        self._ops[f"{zone}/{name}"] = op
        return op

    def _start_op(self, op: ComputeOperation | None) -> None:
        if op is not None and op.status == "PENDING":
            op.status = "RUNNING"
            op.started_at = self._world._now

    def _finish_op(self, op_key: str | None, error: dict[str, Any] | None = None, http_status: int = 400) -> None:
        op = self._ops.get(op_key or "")
        if op is None or op.status == "DONE":
            return
        self._start_op(op)
        op.status = "DONE"
        op.progress = 100
        op.end_at = self._world._now
        if error is not None:
            op.error = [error]
            op.http_status = http_status

    def _op_key(self, op: ComputeOperation) -> str:
        return f"{op.zone}/{op.name}"

    def _set_status(self, instance: SimInstance, status: str, message: str = "") -> None:
        world = self._world
        if instance.state == "RUNNING" and status != "RUNNING":
            world._bill(instance, preempted=message == "Instance was preempted.")
            instance.stopped_at = world._now
        instance.state = status
        instance.state_since = world._now
        instance.status_message = message
        instance.epoch += 1
        if status == "RUNNING":
            instance.ready_since = world._now
            instance.started_at = world._now
            if instance.first_ready_at is None:
                instance.first_ready_at = world._now
        world._log(f"instance.{status.lower()}", instance.zone, instance.node_id, instance.provisioning_model)

    def _check_labels(self, labels: Any) -> dict[str, str]:
        if labels is None:
            return {}
        if not isinstance(labels, dict) or len(labels) > 64:
            raise ComputeApiError(400, "Invalid value for field 'resource.labels': at most 64 labels", reason="invalid")
        for key, value in labels.items():
            if not isinstance(key, str) or not LABEL_KEY.match(key):
                raise ComputeApiError(
                    400, f"Invalid value for field 'resource.labels': label key {key!r} is invalid", reason="invalid"
                )
            if not isinstance(value, str) or not LABEL_VALUE.match(value):
                raise ComputeApiError(
                    400, f"Invalid value for field 'resource.labels': value {value!r} of {key!r}", reason="invalid"
                )
        return labels

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

    def _quota_error(self, limit: ComputeQuotaSpec) -> dict[str, Any]:
        tpu_family = _TPU_FAMILY.get(limit.family, limit.family.upper())
        if limit.metric == "preemptible":
            metric = f"PREEMPTIBLE_TPU_{limit.family.upper()}"
            limit_name = f"PREEMPTIBLE-TPU-{limit.family.upper()}-per-project-region"
            dimensions = {"region": limit.region}
        else:
            metric = "TPUS_PER_TPU_FAMILY"
            limit_name = "TPUS-PER-TPU-FAMILY-per-project-region"
            dimensions = {"region": limit.region, "tpu_family": tpu_family}
        return {
            "code": "QUOTA_EXCEEDED",
            "message": f"Quota '{metric}' exceeded.  Limit: {float(limit.limit)} in region {limit.region}.",
            "errorDetails": [
                {
                    "quotaInfo": {
                        "metricName": f"compute.googleapis.com/{metric.lower()}",
                        "limitName": limit_name,
                        "dimensions": dimensions,
                        "limit": float(limit.limit),
                    }
                }
            ],
        }

    def _check_rate(self) -> None:
        limit = self._scenario.limits.creates_per_minute
        if limit is None:
            return
        now = self._world._now
        window = self._create_times
        while window and window[0] <= now - 60.0:
            window.popleft()
        if len(window) >= limit:
            raise ComputeApiError(
                429,
                "Quota exceeded for quota metric 'Write requests' and limit 'Write requests per minute per region' "
                "of service 'compute.googleapis.com'.",
                reason="rateLimitExceeded",
            )
        window.append(now)

    # ------------------------------------------------------------------ insert

    def insert(self, project: str, zone: str, body: Any, *, request_id: str | None = None) -> dict[str, Any]:
        """POST …/zones/{zone}/instances: sync checks, then a RUNNING zonal operation (never done at once)."""
        world = self._world
        with world._transaction():
            self._check_project(project)
            if request_id:
                seen = self._request_ids.get(request_id)
                if seen is not None and world._now - seen[1] <= self._scenario.limits.idempotency_window_s:
                    op = self._ops.get(seen[0])
                    if op is not None:
                        return self._render_op(op)
            return self._insert(zone, body, request_id)

    def _insert(self, zone: str, body: Any, request_id: str | None) -> dict[str, Any]:
        world = self._world
        if not isinstance(body, dict):
            raise ComputeApiError(400, "Invalid JSON payload: the body must be an Instance", reason="invalid")
        name = body.get("name")
        if not isinstance(name, str) or not INSTANCE_NAME.match(name):
            raise ComputeApiError(
                400,
                f"Invalid value for field 'resource.name': '{name}'. Must be a match of regex "
                "'(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'",
                reason="invalid",
            )
        spec = self._zone_spec(zone, permission="compute.instances.create")
        self._check_labels(body.get("labels"))
        machine = str(body.get("machineType") or "").rsplit("/", 1)[-1]
        known = _BY_MACHINE.get(machine)
        if not machine or known is None or known[0] not in self._offered(spec):
            raise ComputeApiError(
                400,
                f"Invalid value for field 'resource.machineType': 'zones/{zone}/machineTypes/{machine}'. "
                f"Machine type with name '{machine}' does not exist in zone '{zone}'.",
                reason="invalid",
            )
        accelerator, chips = known
        family = accelerator.rsplit("-", 1)[0]
        scheduling = body.get("scheduling") or {}
        if not isinstance(scheduling, dict):
            raise ComputeApiError(400, "Invalid value for field 'resource.scheduling'", reason="invalid")
        model = str(scheduling.get("provisioningModel") or ("SPOT" if scheduling.get("preemptible") else "STANDARD"))
        if model not in PROVISIONING_MODELS:
            raise ComputeApiError(
                400,
                f"Invalid value for field 'resource.scheduling.provisioningModel': '{model}'. "
                f"Use one of {', '.join(PROVISIONING_MODELS)}.",
                reason="invalid",
            )
        if str(scheduling.get("onHostMaintenance") or "MIGRATE") != "TERMINATE":
            raise ComputeApiError(
                400,
                "Invalid value for field 'resource.scheduling.onHostMaintenance': instances with TPUs cannot live "
                "migrate; set it to TERMINATE.",
                reason="invalid",
            )
        action = str(scheduling.get("instanceTerminationAction") or "")
        if action and action not in TERMINATION_ACTIONS:
            raise ComputeApiError(
                400,
                f"Invalid value for field 'resource.scheduling.instanceTerminationAction': '{action}'",
                reason="invalid",
            )
        max_run: float | None = None
        if scheduling.get("maxRunDuration") is not None:
            max_run = parse_duration(scheduling["maxRunDuration"], "resource.scheduling.maxRunDuration")
            if not 30 <= max_run <= self._scenario.limits.max_run_s:
                raise ComputeApiError(
                    400,
                    f"Invalid value for field 'resource.scheduling.maxRunDuration': {max_run:.0f}s. It must be "
                    f"between 30s and {self._scenario.limits.max_run_s:.0f}s.",
                    reason="invalid",
                )
        params = body.get("params") or {}
        valid_for: float | None = None
        if isinstance(params, dict) and params.get("requestValidForDuration") is not None:
            valid_for = parse_duration(params["requestValidForDuration"], "resource.params.requestValidForDuration")
        if model == "FLEX_START":
            if max_run is None or action != "DELETE":
                raise ComputeApiError(
                    400,
                    "Invalid value for field 'resource.scheduling': FLEX_START instances need maxRunDuration and "
                    "instanceTerminationAction=DELETE.",
                    reason="invalid",
                )
        elif valid_for is not None:
            raise ComputeApiError(
                400,
                "Invalid value for field 'resource.params.requestValidForDuration': only FLEX_START instances wait "
                "for capacity.",
                reason="invalid",
            )
        if max_run is not None and not action:
            raise ComputeApiError(
                400,
                "Invalid value for field 'resource.scheduling.instanceTerminationAction': required with "
                "maxRunDuration (DELETE or STOP).",
                reason="invalid",
            )
        reservation: str | None = None
        pool = {"STANDARD": "on_demand", "SPOT": "spot", "FLEX_START": "flex_start"}.get(model, "")
        if model == "RESERVATION_BOUND":
            affinity = body.get("reservationAffinity") or {}
            values = affinity.get("values") if isinstance(affinity, dict) else None
            if affinity.get("consumeReservationType") != "SPECIFIC_RESERVATION" or not values:
                raise ComputeApiError(
                    400,
                    "Invalid value for field 'resource.reservationAffinity': RESERVATION_BOUND needs "
                    "consumeReservationType=SPECIFIC_RESERVATION and the reservation name in values.",
                    reason="invalid",
                )
            reservation = str(values[0]).rsplit("/", 1)[-1]
            if reservation not in spec.reservations:
                raise ComputeApiError(
                    404,
                    f"The resource 'projects/{self._scenario.project}/zones/{zone}/reservations/{reservation}' "
                    "was not found",
                    reason="notFound",
                )
            pool = f"reservation:{reservation}"
        if (zone, name) in self._instances:
            raise ComputeApiError(
                409,
                f"The resource 'projects/{self._scenario.project}/zones/{zone}/instances/{name}' already exists",
                reason="alreadyExists",
            )
        self._check_rate()

        number = next(world._node_numbers)
        instance = SimInstance(
            zone=zone,
            node_id=name,
            accelerator=accelerator,
            family=family,
            chips=chips,
            runtime_version="",
            pool=pool,
            tier=_TIER_OF_MODEL[model],
            body=body,
            created_at=world._now,
            numeric_id=5_000_000_000_000 + number * 7919,
            ip_address=f"10.{128 + world._zone_index.get(zone, 0) % 120}.{(number >> 8) & 255}.{number & 255}",
            api_version="compute/v1",
            state="PROVISIONING",
            state_since=world._now,
            machine_type=machine,
            provisioning_model=model,
            termination_action=action,
            max_run_s=max_run,
            reservation=reservation,
        )
        op = self._new_op(zone, "insert", f"{self._zone_url(zone)}/instances/{name}", instance.numeric_id)
        if request_id:
            self._request_ids[request_id] = (self._op_key(op), world._now)
        if _SCENARIO_MODEL[model] not in self._models(spec):
            error = {
                "code": "UNSUPPORTED_OPERATION",
                "message": f"The provisioning model '{model}' is not supported for machine type '{machine}' in "
                f"zone '{zone}'.",
            }
            world._after(world._timing(zone, "flex_refusal_s"), self._finish_op, self._op_key(op), error, 400)
            world._log("instance.unsupported", zone, name, model)
            return self._render_op(op)
        if model in ("SPOT", "STANDARD", "RESERVATION_BOUND"):
            metric = "preemptible" if model == "SPOT" else "family"
            region = zone.rsplit("-", 1)[0]
            exceeded = None if model == "RESERVATION_BOUND" else self._quota_headroom(metric, family, region, chips)
            if exceeded is not None:
                world._after(
                    world._timing(zone, "accept_s"), self._finish_op, self._op_key(op), self._quota_error(exceeded), 403
                )
                world._log("instance.quota", zone, name, f"{metric} limit {exceeded.limit}")
                return self._render_op(op)
            instance.quota_metric = None if model == "RESERVATION_BOUND" else metric
        self._instances[(zone, name)] = instance
        instance.insert_op = self._op_key(op)
        world._log("instance.provisioning", zone, name, f"{machine} {model}")
        world._after(world._timing(zone, "accept_s"), self._on_accepted, instance, instance.epoch, valid_for)
        return self._render_op(op)

    def _current(self, instance: SimInstance, epoch: int | None = None) -> bool:
        if self._instances.get((instance.zone, instance.node_id)) is not instance:
            return False
        return epoch is None or instance.epoch == epoch

    def _on_accepted(self, instance: SimInstance, epoch: int, valid_for: float | None) -> None:
        if not self._current(instance, epoch) or instance.state != "PROVISIONING":
            return
        world = self._world
        self._start_op(self._ops.get(instance.insert_op))
        if instance.provisioning_model == "FLEX_START":
            self._set_status(instance, "PENDING")
            if valid_for is not None:
                instance.valid_until = world._now + valid_for
                world._schedule(instance.valid_until, self._on_valid_for_expired, instance, instance.epoch)
            key = (instance.zone, instance.family, instance.pool)
            self._waiting.setdefault(key, []).append(instance)
            world._dirty.add(key)
            return
        world._after(world._timing(instance.zone, "capacity_check_s"), self._on_capacity_check, instance, epoch)

    def _on_capacity_check(self, instance: SimInstance, epoch: int) -> None:
        if not self._current(instance, epoch) or instance.state != "PROVISIONING":
            return
        pool = self._world._pool(instance.zone, instance.family, instance.pool)
        if pool.free >= instance.chips:
            self._grant(instance, pool)
            return
        error = self._stockout_error(instance)
        self._finish_op(instance.insert_op, error, 503)
        del self._instances[(instance.zone, instance.node_id)]
        self._world._log("instance.stockout", instance.zone, instance.node_id, error["code"])

    def _stockout_error(self, instance: SimInstance) -> dict[str, Any]:
        zone = instance.zone
        where = f"projects/{self._scenario.project}/zones/{zone}"
        if self._scenario.zones[zone].compute.stockout_error == "pool_with_details":
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
        world = self._world
        pool.used += instance.chips
        instance.holds_chips = True
        self._set_status(instance, "STAGING")
        self._finish_op(instance.insert_op)
        world._after(world._timing(instance.zone, "boot_s"), self._on_boot, instance, instance.epoch)

    def _on_valid_for_expired(self, instance: SimInstance, epoch: int) -> None:
        if not self._current(instance, epoch) or instance.state != "PENDING":
            return
        error = {
            "code": "ZONE_RESOURCE_POOL_EXHAUSTED",
            "message": f"The zone 'projects/{self._scenario.project}/zones/{instance.zone}' did not have enough "
            "resources available to fulfill the request within its requestValidForDuration.",
        }
        self._finish_op(instance.insert_op, error, 503)
        del self._instances[(instance.zone, instance.node_id)]
        instance.epoch += 1
        self._world._log("instance.expired", instance.zone, instance.node_id, "request valid-for duration passed")

    def match(self, key: tuple[str, str, str]) -> None:
        """Grant waiting flex-start instances of one pool, oldest first, while chips and quota allow."""
        queue = self._waiting.get(key)
        if not queue:
            return
        pool = self._world._pool(*key)
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
            if metric is None:  # short of quota: it just keeps waiting, like a stockout (reference-agent.md §11)
                remaining.append(instance)
                continue
            instance.quota_metric = metric
            self._grant(instance, pool)
        self._waiting[key] = remaining

    def _on_boot(self, instance: SimInstance, epoch: int) -> None:
        if not self._current(instance, epoch) or instance.state != "STAGING":
            return
        world = self._world
        self._set_status(instance, "RUNNING")
        world._notify("ready", instance)
        if instance.max_run_s:
            instance.termination_time = world._now + instance.max_run_s
            world._schedule(instance.termination_time, self._on_max_run, instance, instance.epoch)
        if instance.provisioning_model == "SPOT":
            self._schedule_preemption(instance, self._scenario.zones[instance.zone])

    def _schedule_preemption(self, instance: SimInstance, zone: ZoneSpec) -> None:
        spec = zone.preemption
        rng = self._world._rng
        delay: float | None = None
        if spec.early_window_s > 0 and (spec.early_hazard_per_hour + spec.hazard_per_hour) > 0:
            early = rng.expovariate((spec.early_hazard_per_hour + spec.hazard_per_hour) / 3600.0)
            if early < spec.early_window_s:
                delay = early
        if delay is None and spec.hazard_per_hour > 0:
            delay = spec.early_window_s + rng.expovariate(spec.hazard_per_hour / 3600.0)
        if delay is not None:
            self._world._schedule(self._world._now + delay, self._on_hazard, instance, instance.epoch)

    def _on_hazard(self, instance: SimInstance, epoch: int) -> None:
        if self._current(instance, epoch) and instance.state == "RUNNING":
            self._preempt(instance)

    def _on_max_run(self, instance: SimInstance, epoch: int) -> None:
        if self._current(instance, epoch) and instance.state == "RUNNING":
            self._terminate(instance, "Instance reached its max run duration.", "max_run")

    def _preempt(self, instance: SimInstance) -> None:
        self._world._notify("preempted", instance)
        self._record_system_event(instance, "compute.instances.preempted")
        self._terminate(instance, "Instance was preempted.", "preempted")

    def _record_system_event(self, instance: SimInstance, operation_type: str) -> None:
        op = self._new_op(instance.zone, operation_type, self._instance_url(instance), instance.numeric_id)
        self._finish_op(self._op_key(op))

    def _terminate(self, instance: SimInstance, message: str, why: str) -> None:
        """The service ends the VM: STOPPING, chips back now, then gone (DELETE) or TERMINATED (STOP)."""
        world = self._world
        self._set_status(instance, "STOPPING", message)
        self._release(instance)
        delete = instance.termination_action == "DELETE"
        world._log(f"instance.{why}", instance.zone, instance.node_id, "delete" if delete else "stop")
        world._after(world._timing(instance.zone, "delete_s"), self._on_terminated, instance, instance.epoch, delete)

    def _on_terminated(self, instance: SimInstance, epoch: int, delete: bool) -> None:
        if not self._current(instance, epoch) or instance.state != "STOPPING":
            return
        if delete:
            self._remove(instance)
            return
        self._set_status(instance, "TERMINATED", instance.status_message)
        self._world._notify("stopped", instance)

    def _release(self, instance: SimInstance) -> None:
        self._world._release_chips(instance)

    def _remove(self, instance: SimInstance) -> None:
        world = self._world
        self._release(instance)
        if instance.state == "RUNNING":
            world._bill(instance, preempted=False)
        del self._instances[(instance.zone, instance.node_id)]
        instance.epoch += 1
        region = instance.zone.rsplit("-", 1)[0]
        for key in self._waiting:  # its regional quota is free: waiting flex-start requests look again
            if key[0].rsplit("-", 1)[0] == region and key[1] == instance.family:
                world._dirty.add(key)
        world._log("instance.gone", instance.zone, instance.node_id, "")
        world._notify("deleted", instance)
        self._finish_op(instance.delete_op)

    # ------------------------------------------------------------------ get, list, delete, stop, start

    def _require(self, zone: str, name: str) -> SimInstance:
        instance = self._instances.get((zone, name))
        if instance is None:
            raise ComputeApiError(
                404,
                f"The resource 'projects/{self._scenario.project}/zones/{zone}/instances/{name}' was not found",
                reason="notFound",
            )
        return instance

    def get(self, project: str, zone: str, name: str) -> dict[str, Any]:
        with self._world._transaction():
            self._check_project(project)
            self._zone_spec(zone)
            return self._render(self._require(zone, name))

    def list_instances(self, project: str, zone: str, filter_text: str = "") -> list[dict[str, Any]]:
        with self._world._transaction():
            self._check_project(project)
            self._zone_spec(zone)
            match = self._filter(filter_text)
            items = sorted((i for i in self._instances.values() if i.zone == zone), key=lambda i: i.node_id)
            return [self._render(i) for i in items if match(i)]

    def aggregated(self, project: str, filter_text: str = "") -> dict[str, dict[str, Any]]:
        """``aggregated/instances``: ``{"zones/Z": {"instances": [...]}}``; zones with none carry a warning."""
        with self._world._transaction():
            self._check_project(project)
            match = self._filter(filter_text)
            out: dict[str, dict[str, Any]] = {}
            for zone, spec in sorted(self._scenario.zones.items()):
                if spec.forbidden:
                    continue
                items = sorted(
                    (i for i in self._instances.values() if i.zone == zone and match(i)), key=lambda i: i.node_id
                )
                if items:
                    out[f"zones/{zone}"] = {"instances": [self._render(i) for i in items]}
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
        world = self._world
        with world._transaction():
            self._check_project(project)
            if request_id:
                seen = self._request_ids.get(request_id)
                if seen is not None and seen[0] in self._ops:
                    return self._render_op(self._ops[seen[0]])
            self._zone_spec(zone, permission="compute.instances.delete")
            instance = self._require(zone, name)
            if instance.delete_op and instance.delete_op in self._ops:
                return self._render_op(self._ops[instance.delete_op])
            op = self._new_op(zone, "delete", self._instance_url(instance), instance.numeric_id)
            self._start_op(op)
            if request_id:
                self._request_ids[request_id] = (self._op_key(op), world._now)
            instance.delete_op = self._op_key(op)
            if instance.state in ("PROVISIONING", "PENDING", "STAGING"):
                self._finish_op(
                    instance.insert_op,
                    {"code": "ABORTED", "message": f"The instance '{name}' was deleted before it started."},
                    409,
                )
            if instance.state in ("PROVISIONING", "PENDING"):
                self._remove(instance)
                return self._render_op(op)
            if instance.state != "STOPPING":
                self._set_status(instance, "STOPPING", "Instance is being deleted.")
                self._release(instance)
            instance.epoch += 1  # a pending max-run or preemption end must not turn it TERMINATED instead
            world._after(world._timing(zone, "delete_s"), self._on_deleted, instance, instance.epoch)
            return self._render_op(op)

    def _on_deleted(self, instance: SimInstance, epoch: int) -> None:
        if self._current(instance, epoch):
            self._remove(instance)

    def stop(self, project: str, zone: str, name: str) -> dict[str, Any]:
        """POST …/stop: RUNNING -> STOPPING -> TERMINATED; the chips go back to the pool."""
        world = self._world
        with world._transaction():
            self._check_project(project)
            self._zone_spec(zone)
            instance = self._require(zone, name)
            if instance.state != "RUNNING":
                raise ComputeApiError(
                    400,
                    f"The instance '{name}' is not RUNNING (it is {instance.state}); only a running instance stops.",
                    reason="resourceNotReady",
                )
            op = self._new_op(zone, "stop", self._instance_url(instance), instance.numeric_id)
            self._start_op(op)
            self._set_status(instance, "STOPPING", "Instance is being stopped.")
            self._release(instance)
            world._after(self._scenario.timings.stop_s, self._on_stopped, instance, instance.epoch, self._op_key(op))
            return self._render_op(op)

    def _on_stopped(self, instance: SimInstance, epoch: int, op_key: str) -> None:
        if self._current(instance, epoch) and instance.state == "STOPPING":
            self._set_status(instance, "TERMINATED", "Instance was stopped.")
            self._world._notify("stopped", instance)
        self._finish_op(op_key)

    def start(self, project: str, zone: str, name: str) -> dict[str, Any]:
        """POST …/start: a TERMINATED instance needs chips again; none -> the operation fails with a stockout."""
        world = self._world
        with world._transaction():
            self._check_project(project)
            self._zone_spec(zone)
            instance = self._require(zone, name)
            if instance.state != "TERMINATED":
                raise ComputeApiError(
                    400,
                    f"The instance '{name}' is {instance.state}; only a TERMINATED instance starts.",
                    reason="resourceNotReady",
                )
            op = self._new_op(zone, "start", self._instance_url(instance), instance.numeric_id)
            self._start_op(op)
            pool = world._pool(instance.zone, instance.family, instance.pool)
            if pool.free < instance.chips:
                self._finish_op(self._op_key(op), self._stockout_error(instance), 503)
                return self._render_op(op)
            pool.used += instance.chips
            instance.holds_chips = True
            self._set_status(instance, "STAGING")
            self._finish_op(self._op_key(op))
            world._after(world._timing(zone, "boot_s"), self._on_boot, instance, instance.epoch)
            return self._render_op(op)

    def guest_attributes(
        self, project: str, zone: str, name: str, query_path: str = "", variable_key: str = ""
    ) -> dict[str, Any]:
        """GET …/instances/{name}/getGuestAttributes: ``queryPath`` (``NS/``) or ``variableKey`` (``NS/KEY``). Like
        Compute Engine, a path or key with nothing written yet is a 404, as is a missing instance."""
        with self._world._transaction():
            self._check_project(project)
            self._zone_spec(zone, permission="compute.instances.getGuestAttributes")
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
                f"The resource '{self._instance_url(instance)}/guestAttributes/{wanted}' was not found",
                reason="notFound",
            )
        body: dict[str, Any] = {"kind": "compute#guestAttributes", "selfLink": self._instance_url(instance)}
        if variable_key:
            return {**body, "variableKey": variable_key, "variableValue": found[0][2]}
        items = [{"namespace": ns, "key": item, "value": value} for ns, item, value in found]
        return {**body, "queryPath": query_path, "queryValue": {"items": items}}

    # ------------------------------------------------------------------ operations and machine types

    def get_operation(self, project: str, zone: str, name: str) -> dict[str, Any]:
        with self._world._transaction():
            self._check_project(project)
            op = self._ops.get(f"{zone}/{name}")
            if op is None:
                raise ComputeApiError(
                    404,
                    f"The resource 'projects/{project}/zones/{zone}/operations/{name}' was not found",
                    reason="notFound",
                )
            return self._render_op(op)

    def list_operations(self, project: str, zone: str) -> list[dict[str, Any]]:
        with self._world._transaction():
            self._check_project(project)
            self._zone_spec(zone)
            return [self._render_op(op) for op in self._ops.values() if op.zone == zone]

    def machine_types(self, project: str, zone: str) -> list[dict[str, Any]]:
        with self._world._transaction():
            self._check_project(project)
            spec = self._zone_spec(zone)
            return [self._render_machine(zone, acc) for acc in self._offered(spec) if acc in MACHINE_TYPES]

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
        with self._world._transaction():
            instance = self._instances.get((zone, name))
            if instance is None:
                raise KeyError(f"instance: {zone}/{name} does not exist")
            if instance.state != "RUNNING":
                return []
            self._preempt(instance)
            return [name]

    def status(self, zone: str, name: str) -> str | None:
        """The instance's status, or None when it does not exist."""
        with self._world._transaction():
            instance = self._instances.get((zone, name))
            return instance.state if instance else None

    def instance(self, zone: str, name: str) -> dict[str, Any] | None:
        """The instance as the API renders it, or None."""
        with self._world._transaction():
            instance = self._instances.get((zone, name))
            return self._render(instance) if instance else None

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
        now = self._world._now
        for instance in sorted(self._instances.values(), key=lambda i: (i.zone, i.node_id)):
            if instance.delete_op is None:
                resources.append(("instance", instance.zone, instance.node_id, instance.labels))
            if instance.state == "TERMINATED":
                leftovers.append(
                    self._world._leftover(
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
            for spec in self._scenario.compute_quotas
        ]
        instances = [
            {**self._render(i), "sim": {"tier": i.tier, "pool": i.pool, "billed_s": i.billed_s}}
            for i in sorted(self._instances.values(), key=lambda i: (i.zone, i.node_id))
        ]
        return {"instances": instances, "quota": quota, "operations": len(self._ops)}

    # ------------------------------------------------------------------ rendering

    def _resource_url(self, path: str) -> str:
        """A network or subnetwork as Compute Engine echoes it: a full URL, project filled in when absent."""
        if path.startswith("https://"):
            return path
        if not path.startswith("projects/"):
            path = f"projects/{self._scenario.project}/{path}"
        return f"{COMPUTE}/{path}"

    def _render(self, instance: SimInstance) -> dict[str, Any]:
        body = instance.body
        kept: dict[str, Any] = {
            key: body[key]
            for key in ("description", "labels", "metadata", "disks", "serviceAccounts", "reservationAffinity", "tags")
            if key in body
        }
        scheduling = dict(body.get("scheduling") or {})
        if instance.termination_time is not None:
            scheduling["terminationTime"] = format_time(instance.termination_time)
        sent = (body.get("networkInterfaces") or [{}])[0]
        interface: dict[str, Any] = {
            "name": "nic0",
            "network": self._resource_url(sent.get("network") or "global/networks/default"),
            "networkIP": instance.ip_address,
        }
        if sent.get("subnetwork"):
            interface["subnetwork"] = self._resource_url(sent["subnetwork"])
        wants_external_ip = bool(sent.get("accessConfigs")) or "networkInterfaces" not in body
        if wants_external_ip and instance.state in ("STAGING", "RUNNING", "STOPPING"):
            interface["accessConfigs"] = [
                {"name": "External NAT", "type": "ONE_TO_ONE_NAT", "natIP": instance.ip_address}
            ]
        metadata = kept.get("metadata")
        if instance.port not in (8470, 0):
            # The node agent publishes where vLLM listens (the local runtime binds a loopback port).
            items = [item for item in (metadata or {}).get("items", []) if item.get("key") != "tpuctl-endpoint"]
            items.append({"key": "tpuctl-endpoint", "value": f"{instance.ip_address}:{instance.port}"})
            kept["metadata"] = {**(metadata or {}), "items": items}
        rendered: dict[str, Any] = {
            "kind": "compute#instance",
            "id": str(instance.numeric_id),
            "name": instance.node_id,
            "zone": self._zone_url(instance.zone),
            "selfLink": self._instance_url(instance),
            "machineType": f"{self._zone_url(instance.zone)}/machineTypes/{instance.machine_type}",
            "status": instance.state,
            "creationTimestamp": format_time(instance.created_at),
            "scheduling": scheduling,
            "networkInterfaces": [interface],
            **kept,
        }
        if instance.status_message:
            rendered["statusMessage"] = instance.status_message
        if instance.started_at is not None:
            rendered["lastStartTimestamp"] = format_time(instance.started_at)
        if instance.stopped_at is not None:
            rendered["lastStopTimestamp"] = format_time(instance.stopped_at)
        return rendered

    def _render_op(self, op: ComputeOperation) -> dict[str, Any]:
        project = self._scenario.project
        body: dict[str, Any] = {
            "kind": "compute#operation",
            "id": str(op.numeric_id),
            "name": op.name,
            "zone": self._zone_url(op.zone),
            "operationType": op.operation_type,
            "targetLink": op.target,
            "targetId": str(op.target_id),
            "status": op.status,
            "user": f"tpuctl@{project}.iam.gserviceaccount.com",
            "progress": op.progress,
            "insertTime": format_time(op.created_at),
            "selfLink": f"{self._zone_url(op.zone)}/operations/{op.name}",
        }
        if op.started_at is not None:
            body["startTime"] = format_time(op.started_at)
        if op.end_at is not None:
            body["endTime"] = format_time(op.end_at)
        if op.error:
            body["error"] = {"errors": op.error}
            body["httpErrorStatusCode"] = op.http_status or 400
            body["httpErrorMessage"] = {403: "FORBIDDEN", 409: "CONFLICT", 503: "SERVICE UNAVAILABLE"}.get(
                op.http_status or 400, "BAD REQUEST"
            )
        return body

    def _render_machine(self, zone: str, accelerator: str) -> dict[str, Any]:
        machine, chips = MACHINE_TYPES[accelerator]
        family = accelerator.rsplit("-", 1)[0]
        return {
            "kind": "compute#machineType",
            "id": str(zlib.crc32(machine.encode())),
            "name": machine,
            "description": f"{chips} {family} TPU chip(s)",
            "guestCpus": 44 * chips if chips < 8 else 180,
            "memoryMb": 176_128 * chips if chips < 8 else 1_441_792,
            "zone": zone,
            "selfLink": f"{self._zone_url(zone)}/machineTypes/{machine}",
            "accelerators": [{"guestAcceleratorType": f"tpu-{family}-slice", "guestAcceleratorCount": chips}],
        }

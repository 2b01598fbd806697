"""Request validation of the simulated Compute Engine: synchronous refusals in Compute's envelope, and the
TPU machine types it sells.

Pure functions of the scenario and the request; the checks that need the engine's instances (duplicate
names, the create rate, quota) stay with :class:`~localcloud.tpu_sim.compute.ComputeEngine`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from localcloud.tpu_sim.scenario import ComputeQuotaSpec, Scenario, ZoneSpec
from localcloud.tpu_sim.wire import SimApiError, parse_duration

__all__ = [
    "MACHINE_TYPES",
    "ComputeApiError",
    "InsertRequest",
    "check_labels",
    "check_project",
    "machine_type_of",
    "offered_accelerators",
    "offered_models",
    "parse_insert",
    "quota_error",
    "zone_spec",
]

INSTANCE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
LABEL_KEY = re.compile(r"^[a-z][-_a-z0-9]{0,62}$")
LABEL_VALUE = re.compile(r"^[-_a-z0-9]{0,63}$")
PROVISIONING_MODELS = ("STANDARD", "SPOT", "FLEX_START", "RESERVATION_BOUND")
TERMINATION_ACTIONS = ("DELETE", "STOP")

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
_POOL_OF_MODEL = {"STANDARD": "on_demand", "SPOT": "spot", "FLEX_START": "flex_start"}


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


def _invalid(message: str) -> ComputeApiError:
    return ComputeApiError(400, message, reason="invalid")


def check_project(scenario: Scenario, project: str) -> None:
    if project != scenario.project:
        raise ComputeApiError(
            403,
            f"Required 'compute.instances.list' permission for 'projects/{project}' (the simulator serves project "
            f"'{scenario.project}')",
            reason="forbidden",
        )


def zone_spec(scenario: Scenario, zone: str, *, permission: str = "compute.instances.list") -> ZoneSpec:
    """The zone, when Compute Engine serves it there; 403 for a forbidden location, 400 for an unknown one."""
    spec = scenario.zones.get(zone)
    served = spec is not None and (spec.compute.served if spec.compute.served is not None else spec.served)
    if spec is not None and spec.forbidden:
        raise ComputeApiError(
            403,
            f"Location {zone} violates constraint constraints/gcp.resourceLocations on the resource "
            f"projects/{scenario.project}/zones/{zone}: required '{permission}' permission is denied "
            "by the organization policy",
            reason="forbidden",
        )
    if spec is None or not served:
        raise _invalid(f"Invalid value for field 'zone': '{zone}'. Unknown zone.")
    return spec


def offered_accelerators(spec: ZoneSpec) -> tuple[str, ...]:
    return spec.compute.accelerators if spec.compute.accelerators is not None else spec.accelerators


def offered_models(spec: ZoneSpec) -> tuple[str, ...]:
    models = spec.compute.provisioning_models
    return models if models is not None else spec.provisioning_models


def check_labels(labels: Any) -> dict[str, str]:
    if labels is None:
        return {}
    if not isinstance(labels, dict) or len(labels) > 64:
        raise _invalid("Invalid value for field 'resource.labels': at most 64 labels")
    for key, value in labels.items():
        if not isinstance(key, str) or not LABEL_KEY.match(key):
            raise _invalid(f"Invalid value for field 'resource.labels': label key {key!r} is invalid")
        if not isinstance(value, str) or not LABEL_VALUE.match(value):
            raise _invalid(f"Invalid value for field 'resource.labels': value {value!r} of {key!r}")
    return labels


@dataclass(frozen=True)
class InsertRequest:
    """A valid ``instances.insert`` body, as the engine needs it."""

    name: str
    spec: ZoneSpec
    machine: str
    accelerator: str
    family: str
    chips: int
    model: str
    action: str
    max_run: float | None
    valid_for: float | None
    pool: str
    reservation: str | None


def parse_insert(scenario: Scenario, zone: str, body: Any, booked: frozenset[str] = frozenset()) -> InsertRequest:
    """Every check of an insert that needs only the scenario, in Compute Engine's order; ``booked`` are the zone's
    reservations future reservations created (consumable as if the scenario declared them)."""
    if not isinstance(body, dict):
        raise _invalid("Invalid JSON payload: the body must be an Instance")
    name = body.get("name")
    if not isinstance(name, str) or not INSTANCE_NAME.match(name):
        raise _invalid(
            f"Invalid value for field 'resource.name': '{name}'. Must be a match of regex "
            "'(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'"
        )
    spec = zone_spec(scenario, zone, permission="compute.instances.create")
    check_labels(body.get("labels"))
    machine = str(body.get("machineType") or "").rsplit("/", 1)[-1]
    known = _BY_MACHINE.get(machine)
    if not machine or known is None or known[0] not in offered_accelerators(spec):
        raise _invalid(
            f"Invalid value for field 'resource.machineType': 'zones/{zone}/machineTypes/{machine}'. "
            f"Machine type with name '{machine}' does not exist in zone '{zone}'."
        )
    accelerator, chips = known
    model, action, max_run, valid_for = _parse_scheduling(scenario, body)
    reservation: str | None = None
    pool = _POOL_OF_MODEL.get(model, "")
    if model == "RESERVATION_BOUND":
        reservation = _parse_reservation(scenario, zone, (*spec.reservations, *booked), body)
        pool = f"reservation:{reservation}"
    family = accelerator.rsplit("-", 1)[0]
    return InsertRequest(
        name, spec, machine, accelerator, family, chips, model, action, max_run, valid_for, pool, reservation
    )


def _parse_scheduling(scenario: Scenario, body: dict[str, Any]) -> tuple[str, str, float | None, float | None]:
    """-> (provisioning model, termination action, max run seconds, request valid-for seconds)."""
    scheduling = body.get("scheduling") or {}
    if not isinstance(scheduling, dict):
        raise _invalid("Invalid value for field 'resource.scheduling'")
    model = str(scheduling.get("provisioningModel") or ("SPOT" if scheduling.get("preemptible") else "STANDARD"))
    if model not in PROVISIONING_MODELS:
        raise _invalid(
            f"Invalid value for field 'resource.scheduling.provisioningModel': '{model}'. "
            f"Use one of {', '.join(PROVISIONING_MODELS)}."
        )
    if str(scheduling.get("onHostMaintenance") or "MIGRATE") != "TERMINATE":
        raise _invalid(
            "Invalid value for field 'resource.scheduling.onHostMaintenance': instances with TPUs cannot live "
            "migrate; set it to TERMINATE."
        )
    action = str(scheduling.get("instanceTerminationAction") or "")
    if action and action not in TERMINATION_ACTIONS:
        raise _invalid(f"Invalid value for field 'resource.scheduling.instanceTerminationAction': '{action}'")
    max_run: float | None = None
    if scheduling.get("maxRunDuration") is not None:
        max_run = parse_duration(scheduling["maxRunDuration"], "resource.scheduling.maxRunDuration")
        if not 30 <= max_run <= scenario.limits.max_run_s:
            raise _invalid(
                f"Invalid value for field 'resource.scheduling.maxRunDuration': {max_run:.0f}s. It must be "
                f"between 30s and {scenario.limits.max_run_s:.0f}s."
            )
    params = body.get("params") or {}
    valid_for: float | None = None
    if isinstance(params, dict) and params.get("requestValidForDuration") is not None:
        valid_for = parse_duration(params["requestValidForDuration"], "resource.params.requestValidForDuration")
    _check_termination(model, action, max_run, valid_for)
    return model, action, max_run, valid_for


def _check_termination(model: str, action: str, max_run: float | None, valid_for: float | None) -> None:
    if model == "FLEX_START":
        if max_run is None or action != "DELETE":
            raise _invalid(
                "Invalid value for field 'resource.scheduling': FLEX_START instances need maxRunDuration and "
                "instanceTerminationAction=DELETE."
            )
    elif valid_for is not None:
        raise _invalid(
            "Invalid value for field 'resource.params.requestValidForDuration': only FLEX_START instances wait "
            "for capacity."
        )
    if max_run is not None and not action:
        raise _invalid(
            "Invalid value for field 'resource.scheduling.instanceTerminationAction': required with "
            "maxRunDuration (DELETE or STOP)."
        )


def _parse_reservation(scenario: Scenario, zone: str, known: tuple[str, ...], body: dict[str, Any]) -> str:
    affinity = body.get("reservationAffinity") or {}
    values = affinity.get("values") if isinstance(affinity, dict) else None
    if affinity.get("consumeReservationType") != "SPECIFIC_RESERVATION" or not values:
        raise _invalid(
            "Invalid value for field 'resource.reservationAffinity': RESERVATION_BOUND needs "
            "consumeReservationType=SPECIFIC_RESERVATION and the reservation name in values."
        )
    reservation = str(values[0]).rsplit("/", 1)[-1]
    if reservation not in known:
        raise ComputeApiError(
            404,
            f"The resource 'projects/{scenario.project}/zones/{zone}/reservations/{reservation}' was not found",
            reason="notFound",
        )
    return reservation


def quota_error(limit: ComputeQuotaSpec) -> dict[str, Any]:
    """The operation error of an insert over a regional TPU quota (``QUOTA_EXCEEDED`` with ``quotaInfo``)."""
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

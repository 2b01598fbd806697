"""Request validation of the simulated TPU API: the synchronous refusals (``SimApiError``) in Google's wording.

Pure functions of the scenario and the request; checks that need the world's resources (duplicates,
quota usage, the create rate) stay with the simulation and only build their errors here. Functions that
may append an ``[EID: …]`` tag take ``eid``, called only when the error is raised, so the RNG is consumed
exactly as before.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from localcloud.tpu_sim.scenario import Scenario, ZoneSpec
from localcloud.tpu_sim.wire import ACCELERATOR_CONFIG_TYPES, SimApiError, parse_duration, parse_enum, parse_time

__all__ = [
    "NODE_ID",
    "RESOURCE_ID",
    "QrRequest",
    "check_accelerator",
    "check_labels",
    "check_project",
    "check_provisioning",
    "check_served",
    "check_zone",
    "error_info",
    "parse_accelerator",
    "parse_node_tier",
    "parse_qr_request",
    "parse_queueing",
    "parse_tier",
    "queued_limit_error",
    "quota_error",
    "rate_limit_error",
]

RESOURCE_ID = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
NODE_ID = re.compile(r"^[A-Za-z0-9_.~+%-]+$")
LABEL_KEY = re.compile(r"^[a-z][-_a-z0-9]{0,62}$")
LABEL_VALUE = re.compile(r"^[-_a-z0-9]{0,63}$")
PROVISIONING_MODELS = ("PROVISIONING_MODEL_UNSPECIFIED", "STANDARD", "SPOT", "RESERVATION_BOUND", "FLEX_START")
ALPHA_ONLY_FIELDS = ("provisioningModel", "runDuration", "bestEffort")
TIMING_KEYS = ("validUntilDuration", "validUntilTime", "validAfterDuration", "validAfterTime", "validInterval")

# (node specs as (node id, node body), accelerator, family, chips per node, runtime version)
QrRequest = tuple[list[tuple[str, dict[str, Any]]], str, str, int, str]


def error_info(reason: str, metadata: dict[str, str]) -> dict[str, Any]:
    return {
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": reason,
        "domain": "googleapis.com",
        "metadata": metadata,
    }


def check_project(scenario: Scenario, project: str) -> None:
    if project != scenario.project:
        raise SimApiError(
            403,
            f"Permission denied on resource project {project} (the simulator serves project "
            f"'{scenario.project}'; start it with --project {project} or point the client at that project)",
            details=[error_info("CONSUMER_INVALID", {"consumer": f"projects/{project}"})],
        )


def check_zone(scenario: Scenario, zone: str, *, for_list: bool = False) -> ZoneSpec:
    spec = scenario.zones.get(zone)
    if spec is None or spec.forbidden:
        info = error_info(
            "LOCATION_POLICY_VIOLATED",
            {
                "consumer": f"projects/{scenario.project}",
                "location": zone,
                "service": "tpu.googleapis.com",
            },
        )
        message = (
            f"Permission denied on 'locations/{zone}' (or it may not exist)."
            if spec is not None or for_list
            else f"Location {zone} is not found or access is unauthorized."
        )
        raise SimApiError(403, message, details=[info])
    return spec


def check_served(zone: str, spec: ZoneSpec, eid: Callable[[], str]) -> None:
    if not spec.served:
        raise SimApiError(
            400, f'Cloud TPU received a bad request. The requested zone "{zone}" is not supported. {eid()}'
        )


def check_accelerator(zone: str, spec: ZoneSpec, accelerator: str, runtime: str, eid: Callable[[], str]) -> None:
    if accelerator not in spec.accelerators:
        raise SimApiError(
            400,
            "Cloud TPU received a bad request. The requested accelerator configuration for accelerator type, "
            f'"{accelerator}", could not be found in the zonal accelerator configurations for "{zone}".; '
            f"the accelerator {accelerator} was not found in zone {zone} {eid()}",
        )
    if runtime not in spec.runtime_versions:
        raise SimApiError(
            400,
            f'Cloud TPU received a bad request. Runtime version "{runtime}" is unknown in zone {zone} '
            f"(known: {', '.join(spec.runtime_versions)}) {eid()}",
        )


def check_labels(labels: Any, where: str) -> dict[str, str]:
    if labels is None:
        return {}
    if not isinstance(labels, dict) or len(labels) > 64:
        raise SimApiError(400, f"Invalid value at '{where}': labels must be a map of at most 64 entries")
    for key, value in labels.items():
        if not isinstance(key, str) or not LABEL_KEY.match(key):
            raise SimApiError(400, f"Invalid label key {key!r} at '{where}': use lowercase letters, digits, - or _")
        if not isinstance(value, str) or not LABEL_VALUE.match(value):
            raise SimApiError(400, f"Invalid label value {value!r} for key {key!r} at '{where}'")
    return labels


def parse_accelerator(node: dict[str, Any], where: str) -> tuple[str, str, int]:
    """-> (accelerator type, family, chips) from ``acceleratorType`` or ``acceleratorConfig``."""
    accelerator = node.get("acceleratorType")
    if not accelerator and isinstance(node.get("acceleratorConfig"), dict):
        config = node["acceleratorConfig"]
        kind = parse_enum(config.get("type", 0), ACCELERATOR_CONFIG_TYPES, f"{where}.acceleratorConfig.type")
        family = {"V5LITE_POD": "v5litepod"}.get(kind, kind.lower())
        dims = [int(part) for part in str(config.get("topology", "1x1")).split("x") if part.isdigit()]
        chips = math.prod(dims) if dims else 1
        accelerator = f"{family}-{chips}"
    if not isinstance(accelerator, str) or "-" not in accelerator:
        raise SimApiError(400, f"Invalid value at '{where}.acceleratorType': expected e.g. \"v6e-4\"")
    family, _, size = accelerator.rpartition("-")
    if not size.isdigit():
        raise SimApiError(400, f"Invalid value at '{where}.acceleratorType' ({accelerator!r}): expected e.g. v6e-4")
    return accelerator, family, int(size)


def parse_qr_request(qr_id: str | None, body: Any, parent: str, api_version: str) -> QrRequest:
    """The id, the body's shape and its node specs (one accelerator type for all); -> :data:`QrRequest`."""
    if not isinstance(qr_id, str) or not RESOURCE_ID.match(qr_id):
        raise SimApiError(
            400,
            f"Invalid value for queuedResourceId ({qr_id!r}): use 1-63 lowercase letters, digits or hyphens, "
            "starting with a letter",
        )
    if not isinstance(body, dict):
        raise SimApiError(400, "Invalid JSON payload: the body must be a QueuedResource object")
    if api_version == "v2":
        for key in ALPHA_ONLY_FIELDS:
            if key in body:
                raise SimApiError(
                    400,
                    f"Invalid JSON payload received. Unknown name \"{key}\" at 'queued_resource': Cannot find "
                    "field. (it exists in v2alpha1 only)",
                )
    tpu = body.get("tpu")
    specs = tpu.get("nodeSpec") if isinstance(tpu, dict) else None
    if not isinstance(specs, list) or not specs:
        raise SimApiError(
            400, "Invalid value at 'queued_resource.tpu.node_spec': must be a non-empty array of NodeSpec"
        )
    node_specs: list[tuple[str, dict[str, Any]]] = []
    accelerators: set[tuple[str, str, int]] = set()
    runtime = ""
    for index, spec in enumerate(specs):
        accelerator, runtime = _parse_node_spec(
            qr_id, spec, f"queued_resource.tpu.node_spec[{index}]", parent, node_specs
        )
        accelerators.add(accelerator)
    if len(accelerators) != 1:
        raise SimApiError(400, "Invalid value at 'queued_resource.tpu.node_spec': all nodes must share one type")
    accelerator_type, family, chips = accelerators.pop()
    return node_specs, accelerator_type, family, chips, runtime


def _parse_node_spec(
    qr_id: str, spec: Any, where: str, parent: str, node_specs: list[tuple[str, dict[str, Any]]]
) -> tuple[tuple[str, str, int], str]:
    """One NodeSpec: appends its nodes to ``node_specs``; -> (its accelerator, its runtime version)."""
    if not isinstance(spec, dict) or not isinstance(spec.get("node"), dict):
        raise SimApiError(400, f"Invalid value at '{where}.node': required")
    if spec.get("parent") != parent:
        raise SimApiError(400, f"Invalid value at '{where}.parent' ({spec.get('parent')!r}): must be {parent!r}")
    node = spec["node"]
    check_labels(node.get("labels"), f"{where}.node.labels")
    runtime = str(node.get("runtimeVersion") or "")
    if not runtime:
        raise SimApiError(400, f"Invalid value at '{where}.node.runtime_version': required")
    accelerator = parse_accelerator(node, f"{where}.node")
    multi = spec.get("multisliceParams") or spec.get("multiNodeParams")
    if isinstance(multi, dict):
        count = int(multi.get("nodeCount", 0))
        if count < 2:
            raise SimApiError(400, f"Invalid value at '{where}.multislice_params.node_count': must be > 1")
        prefix = str(multi.get("nodeIdPrefix") or qr_id)
        node_specs.extend((f"{prefix}-{n}", node) for n in range(count))
    else:
        node_id = spec.get("nodeId")
        if not isinstance(node_id, str) or not NODE_ID.match(node_id):
            raise SimApiError(400, f"Invalid value at '{where}.node_id' ({node_id!r}): required, [A-Za-z0-9_.~+%-]")
        node_specs.append((node_id, node))
    return accelerator, runtime


def parse_tier(
    scenario: Scenario, zone: str, body: dict[str, Any], api_version: str
) -> tuple[str, str, str, float | None]:
    """-> (tier, pool, provisioning model, max run seconds)."""
    present = [key for key in ("spot", "guaranteed", "bestEffort") if key in body and body[key] is not None]
    if len(present) > 1:
        raise SimApiError(400, f"Invalid QueuedResource: at most one tier may be set, got {', '.join(present)}")
    model_name = "PROVISIONING_MODEL_UNSPECIFIED"
    if "provisioningModel" in body:
        model_name = parse_enum(body["provisioningModel"], PROVISIONING_MODELS, "queued_resource.provisioning_model")
    reservation = body.get("reservationName")
    guaranteed_body = body.get("guaranteed")
    guaranteed: dict[str, Any] = guaranteed_body if isinstance(guaranteed_body, dict) else {}
    if model_name == "FLEX_START":
        if present:
            raise SimApiError(400, f"Invalid QueuedResource: FLEX_START cannot be combined with {present[0]}")
        return "flex_start", "flex_start", "flex_start", _parse_max_run(scenario, body)
    if model_name == "SPOT" or "spot" in present or "bestEffort" in present:
        return "spot", "spot", "spot", None
    if reservation or model_name == "RESERVATION_BOUND" or guaranteed.get("reserved"):
        name = str(reservation or "").rsplit("/", 1)[-1]
        if not name:
            reservations = scenario.zones.get(zone, ZoneSpec()).reservations
            name = reservations[0] if reservations else ""
        return "reservation", f"reservation:{name}", "reservation", None
    return "on_demand", "on_demand", "standard", None


def _parse_max_run(scenario: Scenario, body: dict[str, Any]) -> float:
    run = body.get("runDuration") or {}
    if "maxRunDuration" not in run:
        raise SimApiError(400, "Invalid value at 'queued_resource.run_duration.max_run_duration': required")
    max_run = parse_duration(run["maxRunDuration"], "queued_resource.run_duration.max_run_duration")
    if not 0 < max_run <= scenario.limits.max_run_s:
        raise SimApiError(
            400,
            f"Invalid value at 'queued_resource.run_duration.max_run_duration' ({max_run:.0f}s): must be "
            f"between 1s and {scenario.limits.max_run_s:.0f}s (7 days)",
        )
    return max_run


def parse_queueing(policy: Any, now: float) -> tuple[float | None, float | None]:
    """-> (valid after, valid until) as epoch seconds from a QueueingPolicy."""
    if not policy:
        return None, None
    if not isinstance(policy, dict):
        raise SimApiError(400, "Invalid value at 'queued_resource.queueing_policy': expected an object")
    keys = [key for key in TIMING_KEYS if key in policy]
    if len(keys) > 1:
        raise SimApiError(
            400, f"Invalid QueueingPolicy: at most one timing constraint may be set, got {', '.join(keys)}"
        )
    if not keys:
        return None, None
    key = keys[0]
    value = policy[key]
    where = f"queued_resource.queueing_policy.{key}"
    if key == "validUntilDuration":
        return None, now + parse_duration(value, where)
    if key == "validUntilTime":
        return None, parse_time(value, where)
    if key == "validAfterDuration":
        return now + parse_duration(value, where), None
    if key == "validAfterTime":
        return parse_time(value, where), None
    interval = value if isinstance(value, dict) else {}
    start = parse_time(interval["startTime"], f"{where}.startTime") if "startTime" in interval else None
    end = parse_time(interval["endTime"], f"{where}.endTime") if "endTime" in interval else None
    return start, end


def check_provisioning(
    zone: str,
    spec: ZoneSpec,
    model: str,
    accelerator: str,
    pool: str,
    body: dict[str, Any],
    booked: frozenset[str] = frozenset(),
) -> bool:
    """The zone offers the model and the reservation (declared, or one of ``booked``: created by a future
    reservation); -> True when a flex-start refusal comes as an operation."""
    flex_refused = model == "flex_start" and "flex_start" not in spec.provisioning_models
    if model not in spec.provisioning_models and not (flex_refused and spec.flex_refusal == "operation"):
        raise SimApiError(
            400,
            f'{model.upper()} provisioning model is not supported for accelerator type "{accelerator}" in '
            f'location "{zone}"',
        )
    if pool.startswith("reservation:") and pool.split(":", 1)[1] not in (*spec.reservations, *booked):
        raise SimApiError(
            400, f"Cloud TPU received a bad request. Reservation {body.get('reservationName')!r} was not found"
        )
    return flex_refused


def parse_node_tier(
    scheduling: dict[str, Any], spec: ZoneSpec, booked: frozenset[str] = frozenset()
) -> tuple[str, str]:
    """A node's ``schedulingConfig`` -> (tier, pool); ``reserved`` takes the zone's first reservation, declared
    first, then those future reservations created (``booked``)."""
    if scheduling.get("spot") or scheduling.get("preemptible"):
        return "spot", "spot"
    if scheduling.get("reserved"):
        known = (*spec.reservations, *sorted(booked))
        return "reservation", f"reservation:{known[0] if known else ''}"
    return "on_demand", "on_demand"


def quota_error(project: str, exceeded: list[tuple[str, int, str, str]]) -> SimApiError:
    """429 for (quota id, limit, scope, location) limits a create would pass."""
    ids = ",".join(item[0] for item in exceeded)
    limits = ",".join(str(item[1]) for item in exceeded)
    where = ",".join(f"{item[2]} {item[3]}" for item in exceeded)
    message = f"Quota limit '{ids}' has been exceeded. Limit: {limits} in {where}."
    violations = [
        {
            "subject": f"projects/{project}",
            "description": f"Quota '{qid}' exhausted. Limit {limit} in {scope} {location}",
        }
        for qid, limit, scope, location in exceeded
    ]
    first = exceeded[0]
    return SimApiError(
        429,
        message,
        details=[
            {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": violations},
            error_info(
                "QUOTA_EXCEEDED",
                {"quota_limit": first[0], "quota_location": first[3], "quota_limit_value": str(first[1])},
            ),
        ],
    )


def rate_limit_error(limit: int) -> SimApiError:
    return SimApiError(
        429,
        "Quota exceeded for quota metric 'Create requests' and limit 'Create requests per minute per project': "
        "Maximum number of CreateNode requests per minute",
        details=[
            error_info(
                "RATE_LIMIT_EXCEEDED",
                {"quota_metric": "tpu.googleapis.com/qps/create", "quota_limit_value": str(limit)},
            )
        ],
    )


def queued_limit_error(project: str, zone: str, limit: int) -> SimApiError:
    qid = "TPUQueuedResourcesPerProjectPerZoneForTPUAPI"
    return SimApiError(
        429,
        f"Quota limit '{qid}' has been exceeded. Limit: {limit} in zone {zone}.",
        details=[
            {
                "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                "violations": [{"subject": f"projects/{project}", "description": qid}],
            }
        ],
    )

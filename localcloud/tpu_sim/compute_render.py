"""Rendering of the simulated Compute Engine's resources to the JSON Compute sends: instances, zonal
operations and machine types; with the instance and operation records themselves.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

from localcloud.tpu_sim.compute_validation import MACHINE_TYPES
from localcloud.tpu_sim.kernel import TPU_PORT, SimNode
from localcloud.tpu_sim.wire import format_time

__all__ = [
    "COMPUTE",
    "ComputeOperation",
    "SimInstance",
    "instance_url",
    "render_instance",
    "render_machine",
    "render_op",
    "zone_url",
]

COMPUTE = "https://www.googleapis.com/compute/v1"
_INSTANCE_FIELDS_KEPT = ("description", "labels", "metadata", "disks", "serviceAccounts", "reservationAffinity", "tags")
_HTTP_ERROR_MESSAGES = {403: "FORBIDDEN", 409: "CONFLICT", 503: "SERVICE UNAVAILABLE"}


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


def zone_url(project: str, zone: str) -> str:
    return f"{COMPUTE}/projects/{project}/zones/{zone}"


def instance_url(project: str, instance: SimInstance) -> str:
    return f"{zone_url(project, instance.zone)}/instances/{instance.node_id}"


def _resource_url(project: str, path: str) -> str:
    """A network or subnetwork as Compute Engine echoes it: a full URL, project filled in when absent."""
    if path.startswith("https://"):
        return path
    if not path.startswith("projects/"):
        path = f"projects/{project}/{path}"
    return f"{COMPUTE}/{path}"


def _network_interface(project: str, instance: SimInstance) -> dict[str, Any]:
    body = instance.body
    sent = (body.get("networkInterfaces") or [{}])[0]
    interface: dict[str, Any] = {
        "name": "nic0",
        "network": _resource_url(project, sent.get("network") or "global/networks/default"),
        "networkIP": instance.ip_address,
    }
    if sent.get("subnetwork"):
        interface["subnetwork"] = _resource_url(project, sent["subnetwork"])
    wants_external_ip = bool(sent.get("accessConfigs")) or "networkInterfaces" not in body
    if wants_external_ip and instance.state in ("STAGING", "RUNNING", "STOPPING"):
        interface["accessConfigs"] = [{"name": "External NAT", "type": "ONE_TO_ONE_NAT", "natIP": instance.ip_address}]
    return interface


def render_instance(project: str, instance: SimInstance) -> dict[str, Any]:
    body = instance.body
    kept: dict[str, Any] = {key: body[key] for key in _INSTANCE_FIELDS_KEPT if key in body}
    scheduling = dict(body.get("scheduling") or {})
    if instance.termination_time is not None:
        scheduling["terminationTime"] = format_time(instance.termination_time)
    interface = _network_interface(project, instance)
    metadata = kept.get("metadata")
    if instance.port not in (TPU_PORT, 0):
        # The node agent publishes where vLLM listens (the local runtime binds a loopback port).
        items = [item for item in (metadata or {}).get("items", []) if item.get("key") != "tpuctl-endpoint"]
        items.append({"key": "tpuctl-endpoint", "value": f"{instance.ip_address}:{instance.port}"})
        kept["metadata"] = {**(metadata or {}), "items": items}
    zone = zone_url(project, instance.zone)
    rendered: dict[str, Any] = {
        "kind": "compute#instance",
        "id": str(instance.numeric_id),
        "name": instance.node_id,
        "zone": zone,
        "selfLink": instance_url(project, instance),
        "machineType": f"{zone}/machineTypes/{instance.machine_type}",
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


def render_op(project: str, op: ComputeOperation) -> dict[str, Any]:
    zone = zone_url(project, op.zone)
    body: dict[str, Any] = {
        "kind": "compute#operation",
        "id": str(op.numeric_id),
        "name": op.name,
        "zone": zone,
        "operationType": op.operation_type,
        "targetLink": op.target,
        "targetId": str(op.target_id),
        "status": op.status,
        "user": f"tpuctl@{project}.iam.gserviceaccount.com",
        "progress": op.progress,
        "insertTime": format_time(op.created_at),
        "selfLink": f"{zone}/operations/{op.name}",
    }
    if op.started_at is not None:
        body["startTime"] = format_time(op.started_at)
    if op.end_at is not None:
        body["endTime"] = format_time(op.end_at)
    if op.error:
        body["error"] = {"errors": op.error}
        body["httpErrorStatusCode"] = op.http_status or 400
        body["httpErrorMessage"] = _HTTP_ERROR_MESSAGES.get(op.http_status or 400, "BAD REQUEST")
    return body


def render_machine(project: str, zone: str, accelerator: str) -> dict[str, Any]:
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
        "selfLink": f"{zone_url(project, zone)}/machineTypes/{machine}",
        "accelerators": [{"guestAcceleratorType": f"tpu-{family}-slice", "guestAcceleratorCount": chips}],
    }

"""Rendering of the simulated TPU API's resources to the JSON Google sends: operations, queued resources, nodes.

Also the resource records themselves (queued resources and operations; nodes are the kernel's
:class:`~localcloud.tpu_sim.kernel.SimNode`), since a record and its rendering change together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from localcloud.tpu_sim.kernel import SimNode
from localcloud.tpu_sim.wire import config_type_of, format_duration, format_time, topology_of

__all__ = [
    "EMPTY",
    "SimOperation",
    "SimQueuedResource",
    "node_name",
    "parent_of",
    "qr_name",
    "render_node",
    "render_op",
    "render_qr",
    "with_type",
]

EMPTY = {"@type": "type.googleapis.com/google.protobuf.Empty"}
_NODE_FIELDS_KEPT = ("description", "networkConfig", "serviceAccount", "labels", "metadata", "tags", "dataDisks")
_STATES_WITH_ENDPOINT = ("READY", "STOPPING", "STOPPED", "STARTING", "PREEMPTED", "DELETING")


@dataclass
class SimQueuedResource:
    zone: str
    qr_id: str
    body: dict[str, Any]
    node_specs: list[tuple[str, dict[str, Any]]]
    accelerator: str
    family: str
    chips_per_node: int
    pool: str
    tier: str
    api_version: str
    created_at: float
    order: int
    state: str = "CREATING"
    state_since: float = 0.0
    initiator: str = ""
    failed_error: dict[str, Any] | None = None
    valid_after: float | None = None
    valid_until: float | None = None
    max_run_s: float | None = None
    termination_time: float | None = None
    cycling: bool = False
    create_op: str = ""
    delete_op: str | None = None
    node_ids: list[str] = field(default_factory=list)
    epoch: int = 0

    @property
    def chips(self) -> int:
        return self.chips_per_node * len(self.node_specs)

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.node_specs[0][1].get("labels") or {}) if self.node_specs else {}


@dataclass
class SimOperation:
    name: str
    zone: str
    verb: str
    target: str
    api_version: str
    created_at: float
    done: bool = False
    end_at: float | None = None
    error: dict[str, Any] | None = None
    response: dict[str, Any] | None = None
    cancel_requested: bool = False


def parent_of(project: str, zone: str) -> str:
    return f"projects/{project}/locations/{zone}"


def qr_name(project: str, qr: SimQueuedResource) -> str:
    return f"{parent_of(project, qr.zone)}/queuedResources/{qr.qr_id}"


def node_name(project: str, node: SimNode) -> str:
    return f"{parent_of(project, node.zone)}/nodes/{node.node_id}"


def with_type(kind: str, version: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"@type": f"type.googleapis.com/google.cloud.tpu.{version}.{kind}", **body}


def render_op(op: SimOperation) -> dict[str, Any]:
    version = op.api_version
    metadata: dict[str, Any] = {
        "@type": f"type.googleapis.com/google.cloud.tpu.{version}.OperationMetadata",
        "createTime": format_time(op.created_at),
        "target": op.target,
        "verb": op.verb,
        "cancelRequested": op.cancel_requested,
        "apiVersion": version,
    }
    if op.end_at is not None:
        metadata["endTime"] = format_time(op.end_at)
    body: dict[str, Any] = {"name": op.name, "metadata": metadata, "done": op.done}
    if op.done and op.error is not None:
        body["error"] = op.error
    elif op.done:
        body["response"] = op.response or dict(EMPTY)
    return body


def render_qr(project: str, qr: SimQueuedResource) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": qr_name(project, qr),
        "createTime": format_time(qr.created_at),
        "tpu": {"nodeSpec": [dict(spec) for spec in qr.body["tpu"]["nodeSpec"]]},
    }
    for key in ("spot", "guaranteed", "bestEffort", "reservationName"):
        if key in qr.body and qr.body[key] is not None:
            body[key] = qr.body[key]
    if qr.tier == "flex_start":
        body["provisioningModel"] = "FLEX_START"
        run: dict[str, Any] = {"maxRunDuration": format_duration(qr.max_run_s or 0)}
        if qr.termination_time is not None:
            run["terminationTime"] = format_time(qr.termination_time)
        body["runDuration"] = run
    policy: dict[str, Any] = {}
    if qr.valid_until is not None:
        policy["validUntilTime"] = format_time(qr.valid_until)
    if qr.valid_after is not None:
        policy["validAfterTime"] = format_time(qr.valid_after)
    if policy:
        body["queueingPolicy"] = policy
    state: dict[str, Any] = {"state": qr.state}
    if qr.initiator:
        state["stateInitiator"] = qr.initiator
    if qr.state == "FAILED" and qr.failed_error is not None:
        state["failedData"] = {"error": qr.failed_error}
    body["state"] = state
    return body


def render_node(project: str, node: SimNode) -> dict[str, Any]:
    family = node.family
    body: dict[str, Any] = {key: value for key, value in node.body.items() if key in _NODE_FIELDS_KEPT}
    scheduling = dict(node.body.get("schedulingConfig") or {})
    if node.termination_time is not None:
        scheduling["terminationTimestamp"] = format_time(node.termination_time)
    if scheduling:
        body["schedulingConfig"] = scheduling
    body.update(
        {
            "name": node_name(project, node),
            "acceleratorType": node.accelerator,
            "acceleratorConfig": {"type": config_type_of(family), "topology": topology_of(node.chips)},
            "runtimeVersion": node.runtime_version,
            "state": node.state,
            "createTime": format_time(node.created_at),
            "id": str(node.numeric_id),
            "apiVersion": "V2" if node.api_version == "v2" else "V2_ALPHA1",
        }
    )
    if node.state in _STATES_WITH_ENDPOINT:
        body["networkEndpoints"] = [{"ipAddress": node.ip_address, "port": node.port}]
    if node.state == "READY":
        body["health"] = "HEALTHY"
    if node.qr_id:
        body["queuedResource"] = f"{parent_of(project, node.zone)}/queuedResources/{node.qr_id}"
    return body

"""The real TPU adapter with the simulator called in-process: no sockets, same normalisation and errors.

Why: the chaos suite (hundreds of seeded runs) and the capacity-search benchmark (thousands) would spend
their time in loopback HTTP. :class:`InProcessTpuApi` *is* :class:`~shared.adapters.gcp_tpu.GcpTpuApi`,
keeping its request building, state tables and error classification, but its google-cloud-tpu client is
replaced by :class:`_WorldClient`, which hands the same JSON the wire would carry straight to the
:class:`~localcloud.tpu_sim.World`. Injected faults (``world.inject_fault``) apply as they would over
HTTP. ``calls`` counts API calls by endpoint name (the benchmark reports them).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from google.cloud import tpu_v2
from google.longrunning import operations_pb2
from google.protobuf import json_format

from localcloud.tpu_sim.wire import HTTP_STATUS_NAMES, SimApiError
from localcloud.tpu_sim.world import World
from shared.adapters.gcp_tpu import GcpTpuApi, classify_tpu_error
from shared.domain.errors import CloudError

__all__ = ["InProcessTpuApi"]

_LOCATION = re.compile(r"^projects/(?P<project>[^/]+)/locations/(?P<zone>[^/]+)")
_REST = re.compile(
    r"^(?P<version>v2|v2alpha1)/projects/(?P<project>[^/]+)/locations/(?P<zone>[^/]+)/"
    r"(?P<collection>queuedResources|operations)(?:/(?P<id>[^/:]+))?$"
)
_FAULT_MESSAGES = {
    429: "Quota exceeded for quota metric 'Create requests' and limit 'Create requests per minute per project': "
    "Maximum number of CreateNode requests per minute",
    500: "Internal error encountered.",
    503: "The service is currently unavailable.",
    504: "The request timed out.",
}


def _split(name: str) -> tuple[str, str, str]:
    """``projects/P/locations/Z/<kind>/ID`` -> (P, Z, ID)."""
    match = _LOCATION.match(name)
    if match is None:
        raise CloudError(
            classify_tpu_error("INVALID_ARGUMENT", f"bad resource name {name!r}", surfaced="sync").error_class,
            f"bad resource name {name!r}",
        )
    return match["project"], match["zone"], name.rsplit("/", 1)[-1]


class _Answer:
    """What ``create_queued_resource`` & co. return in the real client: something with ``.operation``."""

    def __init__(self, operation: operations_pb2.Operation) -> None:
        self.operation = operation


class _Transport:
    def close(self) -> None:
        return None


class _WorldClient:
    """The subset of ``tpu_v2.TpuClient`` that ``GcpTpuApi`` calls, answered by the world in-process."""

    def __init__(self, world: World, calls: Counter[str]) -> None:
        self._world = world
        self._calls = calls
        self.transport = _Transport()

    def _call(self, endpoint: str, action: Callable[[], Any]) -> Any:
        self._calls[endpoint] += 1
        fault = self._world.take_fault(endpoint)
        try:
            if fault is not None:
                message = fault.message or _FAULT_MESSAGES.get(fault.status, f"HTTP {fault.status}")
                raise SimApiError(fault.status, message, status=HTTP_STATUS_NAMES.get(fault.status, "UNKNOWN"))
            return action()
        except SimApiError as exc:
            raise classify_tpu_error(
                exc.status, exc.message, exc.details, surfaced="sync", code=exc.http_status
            ) from exc

    @staticmethod
    def _operation(body: Mapping[str, Any]) -> operations_pb2.Operation:
        return json_format.ParseDict(body, operations_pb2.Operation(), ignore_unknown_fields=True)

    @staticmethod
    def _queued(body: Mapping[str, Any]) -> tpu_v2.QueuedResource:
        return tpu_v2.QueuedResource.from_json(json.dumps(body), ignore_unknown_fields=True)

    @staticmethod
    def _node(body: Mapping[str, Any]) -> tpu_v2.Node:
        return tpu_v2.Node.from_json(json.dumps(body), ignore_unknown_fields=True)

    def create_queued_resource(self, *, request: tpu_v2.CreateQueuedResourceRequest, **_: Any) -> _Answer:
        project, zone, _id = _split(request.parent + "/x")
        body = json.loads(tpu_v2.QueuedResource.to_json(request.queued_resource, use_integers_for_enums=False))
        answer = self._call(
            "create_queued_resource",
            lambda: self._world.create_queued_resource(
                project, zone, request.queued_resource_id, body, request_id=request.request_id or None
            ),
        )
        return _Answer(self._operation(answer))

    def create_node(self, *, request: tpu_v2.CreateNodeRequest, **_: Any) -> _Answer:
        project, zone, _id = _split(request.parent + "/x")
        body = json.loads(tpu_v2.Node.to_json(request.node, use_integers_for_enums=False))
        answer = self._call("create_node", lambda: self._world.create_node(project, zone, request.node_id, body))
        return _Answer(self._operation(answer))

    def get_operation(self, *, request: Mapping[str, str], **_: Any) -> operations_pb2.Operation:
        project, zone, op_id = _split(request["name"])
        return self._operation(self._call("get_operation", lambda: self._world.get_operation(project, zone, op_id)))

    def get_queued_resource(self, *, name: str, **_: Any) -> tpu_v2.QueuedResource:
        project, zone, qr_id = _split(name)
        body = self._call("get_queued_resource", lambda: self._world.get_queued_resource(project, zone, qr_id))
        return self._queued(body)

    def get_node(self, *, name: str, **_: Any) -> tpu_v2.Node:
        project, zone, node_id = _split(name)
        return self._node(self._call("get_node", lambda: self._world.get_node(project, zone, node_id)))

    def list_queued_resources(self, *, parent: str, **_: Any) -> list[tpu_v2.QueuedResource]:
        project, zone, _id = _split(parent + "/x")
        items, _unreachable = self._call(
            "list_queued_resources", lambda: self._world.list_queued_resources(project, zone)
        )
        return [self._queued(item) for item in items]

    def list_nodes(self, *, parent: str, **_: Any) -> list[tpu_v2.Node]:
        project, zone, _id = _split(parent + "/x")
        items, _unreachable = self._call("list_nodes", lambda: self._world.list_nodes(project, zone))
        return [self._node(item) for item in items]

    def delete_queued_resource(self, *, request: tpu_v2.DeleteQueuedResourceRequest, **_: Any) -> _Answer:
        project, zone, qr_id = _split(request.name)
        answer = self._call(
            "delete_queued_resource",
            lambda: self._world.delete_queued_resource(
                project, zone, qr_id, force=request.force, request_id=request.request_id or None
            ),
        )
        return _Answer(self._operation(answer))

    def delete_node(self, *, name: str, **_: Any) -> _Answer:
        project, zone, node_id = _split(name)
        return _Answer(
            self._operation(self._call("delete_node", lambda: self._world.delete_node(project, zone, node_id)))
        )

    def stop_node(self, *, request: tpu_v2.StopNodeRequest, **_: Any) -> _Answer:
        project, zone, node_id = _split(request.name)
        return _Answer(self._operation(self._call("stop_node", lambda: self._world.stop_node(project, zone, node_id))))

    def start_node(self, *, request: tpu_v2.StartNodeRequest, **_: Any) -> _Answer:
        project, zone, node_id = _split(request.name)
        return _Answer(
            self._operation(self._call("start_node", lambda: self._world.start_node(project, zone, node_id)))
        )

    def get_guest_attributes(
        self, *, request: tpu_v2.GetGuestAttributesRequest, **_: Any
    ) -> tpu_v2.GetGuestAttributesResponse:
        project, zone, node_id = _split(request.name)
        body = {"queryPath": request.query_path, "workerIds": list(request.worker_ids)}
        answer = self._call(
            "get_guest_attributes", lambda: self._world.get_guest_attributes(project, zone, node_id, body)
        )
        return tpu_v2.GetGuestAttributesResponse.from_json(json.dumps(answer), ignore_unknown_fields=True)

    def rest(self, method: str, path: str, params: Mapping[str, str] | None, body: Any) -> Any:
        """The adapter's plain-REST calls (flex-start via v2alpha1, odd operations) routed to the world."""
        match = _REST.match(path)
        if match is None:
            raise CloudError(
                classify_tpu_error(
                    "NOT_FOUND", f"no in-process route for {method} {path}", surfaced="sync"
                ).error_class,
                f"no in-process route for {method} {path}",
            )
        project, zone, version, item = match["project"], match["zone"], match["version"], match["id"]
        query = dict(params or {})
        if match["collection"] == "operations" and item and method == "GET":
            return self._call("get_operation", lambda: self._world.get_operation(project, zone, item))
        if method == "POST" and item is None:
            return self._call(
                "create_queued_resource",
                lambda: self._world.create_queued_resource(
                    project,
                    zone,
                    query.get("queuedResourceId"),
                    body,
                    request_id=query.get("requestId"),
                    api_version=version,
                ),
            )
        if method == "GET" and item is None:
            items, _unreachable = self._call(
                "list_queued_resources", lambda: self._world.list_queued_resources(project, zone)
            )
            return {"queuedResources": items}
        if method == "GET":
            return self._call("get_queued_resource", lambda: self._world.get_queued_resource(project, zone, item))
        raise CloudError(
            classify_tpu_error("INVALID_ARGUMENT", f"unsupported {method} {path}", surfaced="sync").error_class,
            f"unsupported {method} {path}",
        )


class InProcessTpuApi(GcpTpuApi):
    """``GcpTpuApi`` wired to a simulator world in the same process."""

    def __init__(self, world: World, *, project: str | None = None) -> None:
        super().__init__(project or world.scenario.project, endpoint="http://in-process.invalid")
        self.world = world
        self.calls: Counter[str] = Counter()
        self._world_client = _WorldClient(world, self.calls)

    @property
    def client(self) -> tpu_v2.TpuClient:
        return self._world_client  # type: ignore[return-value]

    def _rest(self, method: str, path: str, *, params: Mapping[str, str] | None = None, body: Any = None) -> Any:
        return self._world_client.rest(method, path, params, body)

    @property
    def total_calls(self) -> int:
        return sum(self.calls.values())

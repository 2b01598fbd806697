"""The REST surface of the simulated TPU API (v2 and v2alpha1): queued resources, nodes, operations, catalogue.

:class:`TpuApi` is a mixin for the world: each method opens a kernel transaction (lock held, virtual
time caught up), validates the request (:mod:`~localcloud.tpu_sim.tpu_validation`) in the order Google
checks it, then hands the change to :class:`~localcloud.tpu_sim.tpu_lifecycle.TpuResources` and answers
in Google's JSON (:mod:`~localcloud.tpu_sim.tpu_render`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from localcloud.tpu_sim.advice import booked_reservations
from localcloud.tpu_sim.kernel import SimKernel, SimNode
from localcloud.tpu_sim.scenario import Scenario
from localcloud.tpu_sim.tpu_lifecycle import TpuResources
from localcloud.tpu_sim.tpu_render import (
    SimQueuedResource,
    node_name,
    qr_name,
    render_op,
    with_type,
)
from localcloud.tpu_sim.tpu_validation import (
    RESOURCE_ID,
    check_accelerator,
    check_labels,
    check_project,
    check_provisioning,
    check_served,
    check_zone,
    parse_accelerator,
    parse_node_tier,
    parse_qr_request,
    parse_queueing,
    parse_tier,
)
from localcloud.tpu_sim.wire import SimApiError, config_type_of, topology_of

__all__ = ["TpuApi"]

_UPDATABLE_NODE_FIELDS = {"labels", "metadata", "description", "tags"}


def _qr_sort_key(qr: SimQueuedResource) -> tuple[str, str, float]:
    return qr.zone, qr.qr_id, qr.created_at


def _node_sort_key(node: SimNode) -> tuple[str, str, float]:
    return node.zone, node.node_id, node.created_at


class TpuApi:
    """The TPU API's REST methods over ``kernel`` and ``tpu``, which the composing world provides."""

    scenario: Scenario
    kernel: SimKernel
    tpu: TpuResources

    # ------------------------------------------------------------------ queued resources

    def create_queued_resource(
        self,
        project: str,
        zone: str,
        qr_id: str | None,
        body: dict[str, Any],
        *,
        request_id: str | None = None,
        api_version: str = "v2",
    ) -> dict[str, Any]:
        """POST …/queuedResources: sync checks in the §9 order, then an unfinished create operation."""
        with self.kernel.transaction():
            check_project(self.scenario, project)
            replay = self.tpu.replay_request(project, request_id)
            if replay is not None:
                return replay
            return self._create_qr(zone, qr_id, body, request_id, api_version)

    def _create_qr(
        self, zone: str, qr_id: str | None, body: dict[str, Any], request_id: str | None, api_version: str
    ) -> dict[str, Any]:
        tpu, kernel = self.tpu, self.kernel
        parent = tpu.parent(zone)
        node_specs, accelerator, family, chips, runtime = parse_qr_request(qr_id, body, parent, api_version)
        assert qr_id is not None  # parse_qr_request refused anything else
        tier, pool, model, max_run = parse_tier(self.scenario, zone, body, api_version)
        valid_after, valid_until = parse_queueing(body.get("queueingPolicy"), kernel.now_s)

        spec = check_zone(self.scenario, zone)
        check_served(zone, spec, kernel.eid)
        check_accelerator(zone, spec, accelerator, runtime, kernel.eid)
        if (zone, qr_id) in tpu.qrs:
            raise SimApiError(409, f"Resource '{parent}/queuedResources/{qr_id}' already exists")
        for node_id, _ in node_specs:
            if (zone, node_id) in tpu.nodes:
                raise SimApiError(409, f"Resource '{parent}/nodes/{node_id}' already exists")
        flex_refused = check_provisioning(zone, spec, model, accelerator, pool, body, booked_reservations(kernel, zone))
        tpu.check_quota(zone, family, tier, chips * len(node_specs))
        tpu.check_queued_limit(zone)
        tpu.check_rate()

        qr = SimQueuedResource(
            zone=zone,
            qr_id=qr_id,
            body=body,
            node_specs=node_specs,
            accelerator=accelerator,
            family=family,
            chips_per_node=chips,
            pool=pool,
            tier=tier,
            api_version=api_version,
            created_at=kernel.now_s,
            order=tpu.next_order(),
            state_since=kernel.now_s,
            valid_after=valid_after,
            valid_until=valid_until,
            max_run_s=max_run,
        )
        return render_op(tpu.add_qr(qr, flex_refused=flex_refused, request_id=request_id))

    def get_queued_resource(self, project: str, zone: str, qr_id: str) -> dict[str, Any]:
        with self.kernel.transaction():
            check_project(self.scenario, project)
            check_zone(self.scenario, zone)
            return self.tpu.render_qr(self._require_qr(zone, qr_id))

    def _require_qr(self, zone: str, qr_id: str) -> SimQueuedResource:
        qr = self.tpu.qrs.get((zone, qr_id))
        if qr is None:
            raise SimApiError(404, f"Resource '{self.tpu.parent(zone)}/queuedResources/{qr_id}' was not found")
        return qr

    def list_queued_resources(self, project: str, zone: str) -> tuple[list[dict[str, Any]], list[str]]:
        """-> (queued resources, unreachable zones); ``zone`` may be ``-``."""
        with self.kernel.transaction():
            check_project(self.scenario, project)
            zones, unreachable = self._list_zones(zone)
            items = [qr for qr in self.tpu.qrs.values() if qr.zone in zones]
            return self._lagged("qr", items, zones, _qr_sort_key, self.tpu.render_qr), unreachable

    def _list_zones(self, zone: str) -> tuple[set[str], list[str]]:
        if zone == "-":
            served = {name for name, spec in self.scenario.zones.items() if not spec.forbidden}
            unreachable = sorted(name for name in served if self.scenario.zones[name].unreachable)
            return served - set(unreachable), unreachable
        check_zone(self.scenario, zone, for_list=True)
        return {zone}, []

    def _lagged(
        self,
        kind: str,
        items: Iterable[Any],
        zones: set[str],
        key: Callable[[Any], tuple[str, str, float]],
        render: Callable[[Any], dict[str, Any]],
    ) -> list[dict[str, Any]]:
        """A list as Google's eventually consistent list answers: ``list_lag_s`` late for new and gone items."""
        lag = self.scenario.limits.list_lag_s
        now = self.kernel.now_s
        out: list[tuple[str, str, dict[str, Any]]] = []
        for item in items:
            zone, name, created = key(item)
            if lag and now - created < lag:
                continue
            out.append((zone, name, render(item)))
        if lag:
            for (tomb_kind, zone, name), (gone_at, body) in self.tpu.tombstones.items():
                if tomb_kind == kind and zone in zones and now - gone_at < lag:
                    out.append((zone, name, body))
        out.sort(key=lambda entry: (entry[0], entry[1]))
        return [body for _, _, body in out]

    def delete_queued_resource(
        self, project: str, zone: str, qr_id: str, *, force: bool = False, request_id: str | None = None
    ) -> dict[str, Any]:
        """DELETE …/queuedResources/{id}: the §9 force rules; nodes first, then the queued resource."""
        with self.kernel.transaction():
            check_project(self.scenario, project)
            replay = self.tpu.replay_request(project, request_id)
            if replay is not None:
                return replay
            check_zone(self.scenario, zone)
            return self._delete_qr(self._require_qr(zone, qr_id), force, project, request_id)

    def _delete_qr(self, qr: SimQueuedResource, force: bool, project: str, request_id: str | None) -> dict[str, Any]:
        tpu = self.tpu
        if qr.state == "DELETING" and qr.delete_op:
            return render_op(tpu.ops[qr.delete_op])
        nodes = tpu.qr_nodes(qr)
        allowed_states = {"ACCEPTED", "FAILED", "SUSPENDED"}
        if self.scenario.limits.delete_waiting_without_force:
            allowed_states.add("WAITING_FOR_RESOURCES")
        nodes_gone = not nodes and qr.state != "WAITING_FOR_RESOURCES"
        if not force and not nodes_gone and qr.state not in allowed_states:
            raise SimApiError(
                400,
                f"Cannot delete queued resource '{qr_name(tpu.project, qr)}' in state {qr.state} without force"
                f"{': it still has nodes' if nodes else ''}. Delete its nodes first or retry with force=true.",
                status="FAILED_PRECONDITION",
            )
        op = tpu.new_operation(qr.zone, "delete", qr_name(tpu.project, qr), "v2")
        tpu.remember_request(project, request_id, op)
        if qr.state == "CREATING":
            tpu.finish_op(
                qr.create_op,
                error={"code": 10, "message": "The queued resource was deleted before it was accepted"},
            )
        tpu.set_qr_state(qr, "DELETING", "USER")
        qr.delete_op = op.name
        for node in nodes:
            tpu.begin_node_delete(node)
        if not nodes:
            tpu.delete_qr_when_empty(qr)
        return render_op(op)

    def reset_queued_resource(self, project: str, zone: str, qr_id: str) -> dict[str, Any]:
        """POST …:reset: drop the nodes and queue the request again (allowed when ACTIVE, SUSPENDED or FAILED)."""
        with self.kernel.transaction():
            check_project(self.scenario, project)
            check_zone(self.scenario, zone)
            tpu = self.tpu
            qr = self._require_qr(zone, qr_id)
            if qr.state not in ("ACTIVE", "SUSPENDED", "FAILED"):
                raise SimApiError(
                    400,
                    f"Cannot reset queued resource '{qr_name(tpu.project, qr)}' in state {qr.state}",
                    status="FAILED_PRECONDITION",
                )
            tpu.requeue(qr)
            op = tpu.new_operation(zone, "reset", qr_name(tpu.project, qr), "v2")
            tpu.finish_op(op.name, response=with_type("QueuedResource", "v2", tpu.render_qr(qr)))
            return render_op(op)

    # ------------------------------------------------------------------ nodes

    def create_node(
        self,
        project: str,
        zone: str,
        node_id: str | None,
        body: dict[str, Any],
        *,
        request_id: str | None = None,
        api_version: str = "v2",
    ) -> dict[str, Any]:
        """POST …/nodes: sync checks, then CREATING; a capacity check later either boots it or fails code 8/13/9."""
        with self.kernel.transaction():
            check_project(self.scenario, project)
            replay = self.tpu.replay_request(project, request_id)
            if replay is not None:
                return replay
            return self._create_node(zone, node_id, body, request_id, api_version)

    def _create_node(
        self, zone: str, node_id: str | None, body: dict[str, Any], request_id: str | None, api_version: str
    ) -> dict[str, Any]:
        tpu, kernel = self.tpu, self.kernel
        if not isinstance(node_id, str) or not RESOURCE_ID.match(node_id):
            raise SimApiError(400, f"Invalid value for nodeId ({node_id!r}): use 1-63 lowercase letters, digits, -")
        if not isinstance(body, dict):
            raise SimApiError(400, "Invalid JSON payload: the body must be a Node object")
        check_labels(body.get("labels"), "node.labels")
        runtime = str(body.get("runtimeVersion") or "")
        if not runtime:
            raise SimApiError(400, "Invalid value at 'node.runtime_version': required")
        accelerator, family, chips = parse_accelerator(body, "node")
        scheduling = body.get("schedulingConfig") or {}
        spec = check_zone(self.scenario, zone)
        check_served(zone, spec, kernel.eid)
        check_accelerator(zone, spec, accelerator, runtime, kernel.eid)
        if (zone, node_id) in tpu.nodes:
            raise SimApiError(409, f"Resource '{tpu.parent(zone)}/nodes/{node_id}' already exists")
        tier, pool = parse_node_tier(scheduling, spec, booked_reservations(kernel, zone))
        tpu.check_quota(zone, family, tier, chips)
        tpu.check_rate()
        node = tpu.make_node(zone, node_id, body, accelerator, family, chips, api_version)
        node.tier, node.pool = tier, pool
        op = tpu.new_operation(zone, "create", node_name(tpu.project, node), api_version)
        tpu.remember_request(self.scenario.project, request_id, op)
        tpu.add_node(node, op)
        return render_op(op)

    def get_node(self, project: str, zone: str, node_id: str) -> dict[str, Any]:
        with self.kernel.transaction():
            check_project(self.scenario, project)
            check_zone(self.scenario, zone)
            return self.tpu.render_node(self._require_node(zone, node_id))

    def _require_node(self, zone: str, node_id: str) -> SimNode:
        node = self.tpu.nodes.get((zone, node_id))
        if node is None:
            raise SimApiError(404, f"Resource '{self.tpu.parent(zone)}/nodes/{node_id}' was not found")
        return node

    def list_nodes(self, project: str, zone: str) -> tuple[list[dict[str, Any]], list[str]]:
        with self.kernel.transaction():
            check_project(self.scenario, project)
            zones, unreachable = self._list_zones(zone)
            items = [node for node in self.tpu.nodes.values() if node.zone in zones]
            return self._lagged("node", items, zones, _node_sort_key, self.tpu.render_node), unreachable

    def delete_node(self, project: str, zone: str, node_id: str, *, request_id: str | None = None) -> dict[str, Any]:
        """DELETE …/nodes/{id}; deleting a queued resource's node suspends that queued resource (USER)."""
        with self.kernel.transaction():
            check_project(self.scenario, project)
            tpu = self.tpu
            replay = tpu.replay_request(project, request_id)
            if replay is not None:
                return replay
            check_zone(self.scenario, zone)
            node = self._require_node(zone, node_id)
            if node.state == "DELETING" and node.delete_op:
                return render_op(tpu.ops[node.delete_op])
            op = tpu.new_operation(zone, "delete", node_name(tpu.project, node), "v2")
            tpu.remember_request(project, request_id, op)
            qr = tpu.qrs.get((zone, node.qr_id or ""))
            tpu.begin_node_delete(node, op.name)
            if qr is not None and qr.state in ("ACTIVE", "PROVISIONING"):
                tpu.set_qr_state(qr, "SUSPENDING", "USER")
            return render_op(op)

    def stop_node(self, project: str, zone: str, node_id: str) -> dict[str, Any]:
        return self._stop_start(project, zone, node_id, stop=True)

    def start_node(self, project: str, zone: str, node_id: str) -> dict[str, Any]:
        return self._stop_start(project, zone, node_id, stop=False)

    def _stop_start(self, project: str, zone: str, node_id: str, *, stop: bool) -> dict[str, Any]:
        with self.kernel.transaction():
            check_project(self.scenario, project)
            check_zone(self.scenario, zone)
            node = self._require_node(zone, node_id)
            verb = "stop" if stop else "start"
            expected = "READY" if stop else "STOPPED"
            if node.state != expected:
                raise SimApiError(
                    400,
                    f"Cloud TPU received a bad request. {verb} is not supported while in state {node.state}",
                    status="FAILED_PRECONDITION",
                )
            op = self.tpu.new_operation(zone, verb, node_name(self.tpu.project, node), node.api_version)
            self.tpu.stop_start(node, op, stop=stop)
            return render_op(op)

    def update_node(
        self, project: str, zone: str, node_id: str, body: dict[str, Any], update_mask: str
    ) -> dict[str, Any]:
        """PATCH …/nodes/{id}: labels, metadata, description or tags; refused on a PREEMPTED node (LRO code 3)."""
        with self.kernel.transaction():
            check_project(self.scenario, project)
            check_zone(self.scenario, zone)
            tpu = self.tpu
            node = self._require_node(zone, node_id)
            fields = [item.strip() for item in update_mask.split(",") if item.strip()]
            unknown = [item for item in fields if item not in _UPDATABLE_NODE_FIELDS]
            if not fields or unknown:
                raise SimApiError(
                    400,
                    f"Invalid update_mask {update_mask!r}: use a comma list of "
                    f"{', '.join(sorted(_UPDATABLE_NODE_FIELDS))}",
                )
            op = tpu.new_operation(zone, "update", node_name(tpu.project, node), node.api_version)
            if node.state == "PREEMPTED":
                tpu.finish_op(
                    op.name,
                    error={
                        "code": 3,
                        "message": "Cloud TPU received a bad request. update is not supported while in state PREEMPTED",
                    },
                )
                return render_op(op)
            if "labels" in fields:
                check_labels(body.get("labels"), "node.labels")
            for item in fields:
                node.body[item] = body.get(item)
            tpu.finish_op(op.name, response=with_type("Node", node.api_version, tpu.render_node(node)))
            return render_op(op)

    # ------------------------------------------------------------------ operations and catalogue

    def _operation_name(self, zone: str, op_id: str) -> str:
        return f"{self.tpu.parent(zone)}/operations/{op_id}"

    def get_operation(self, project: str, zone: str, op_id: str) -> dict[str, Any]:
        with self.kernel.transaction():
            check_project(self.scenario, project)
            op = self.tpu.ops.get(self._operation_name(zone, op_id))
            if op is None:
                raise SimApiError(404, f"Operation '{self._operation_name(zone, op_id)}' was not found")
            return render_op(op)

    def list_operations(self, project: str, zone: str) -> list[dict[str, Any]]:
        with self.kernel.transaction():
            check_project(self.scenario, project)
            zones, _ = self._list_zones(zone)
            return [render_op(op) for op in self.tpu.ops.values() if op.zone in zones]

    def cancel_operation(self, project: str, zone: str, op_id: str) -> None:
        with self.kernel.transaction():
            check_project(self.scenario, project)
            op = self.tpu.ops.get(self._operation_name(zone, op_id))
            if op is None:
                raise SimApiError(404, f"Operation '{self._operation_name(zone, op_id)}' was not found")
            op.cancel_requested = True

    def delete_operation(self, project: str, zone: str, op_id: str) -> None:
        with self.kernel.transaction():
            check_project(self.scenario, project)
            if self.tpu.ops.pop(self._operation_name(zone, op_id), None) is None:
                raise SimApiError(404, f"Operation '{self._operation_name(zone, op_id)}' was not found")

    def accelerator_types(self, project: str, zone: str) -> list[dict[str, Any]]:
        with self.kernel.transaction():
            check_project(self.scenario, project)
            spec = check_zone(self.scenario, zone)
            out = []
            for accelerator in spec.accelerators if spec.served else ():
                family, _, size = accelerator.rpartition("-")
                out.append(
                    {
                        "name": f"{self.tpu.parent(zone)}/acceleratorTypes/{accelerator}",
                        "type": accelerator,
                        "acceleratorConfigs": [{"type": config_type_of(family), "topology": topology_of(int(size))}],
                    }
                )
            return out

    def runtime_versions(self, project: str, zone: str) -> list[dict[str, Any]]:
        with self.kernel.transaction():
            check_project(self.scenario, project)
            spec = check_zone(self.scenario, zone)
            return [
                {"name": f"{self.tpu.parent(zone)}/runtimeVersions/{version}", "version": version}
                for version in (spec.runtime_versions if spec.served else ())
            ]

    def locations(self, project: str) -> list[dict[str, Any]]:
        with self.kernel.transaction():
            check_project(self.scenario, project)
            return [
                {"name": self.tpu.parent(zone), "locationId": zone, "displayName": zone}
                for zone, spec in sorted(self.scenario.zones.items())
                if not spec.forbidden
            ]

    def location(self, project: str, zone: str) -> dict[str, Any]:
        with self.kernel.transaction():
            check_project(self.scenario, project)
            check_zone(self.scenario, zone)
            return {"name": self.tpu.parent(zone), "locationId": zone, "displayName": zone}

"""The TPU API half of the simulated world: queued resources, nodes and operations, and their lifecycles.

:class:`TpuResources` holds the resources and runs their state machines on the shared
:class:`~localcloud.tpu_sim.kernel.SimKernel` (events, pools, meter, listeners). The REST surface that
creates, lists and deletes them is :class:`~localcloud.tpu_sim.tpu_api.TpuApi`; every method here runs
with the kernel's lock held, inside a transaction.

Event handlers (``_on_*``) carry the resource's ``epoch`` from when they were scheduled: a resource that
changed state, or was removed and created again under the same name, ignores stale events.
"""

from __future__ import annotations

import itertools
from typing import Any

from localcloud.tpu_sim.kernel import CreateRate, Pool, PoolKey, SimKernel, SimNode
from localcloud.tpu_sim.tpu_render import (
    EMPTY,
    SimOperation,
    SimQueuedResource,
    parent_of,
    render_node,
    render_op,
    render_qr,
    with_type,
)
from localcloud.tpu_sim.tpu_validation import queued_limit_error, quota_error, rate_limit_error
from localcloud.tpu_sim.wire import quota_id

__all__ = ["QR_LIVE_WAITING", "TpuResources"]

QR_LIVE_WAITING = ("CREATING", "ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING")
_QUOTA_LEAK_STATES = ("ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING", "FAILED", "SUSPENDED")


class TpuResources:
    """Queued resources, nodes and operations of the TPU API, on one kernel."""

    def __init__(self, kernel: SimKernel) -> None:
        self.kernel = kernel
        self.scenario = kernel.scenario
        self.project = kernel.scenario.project
        self.qrs: dict[tuple[str, str], SimQueuedResource] = {}
        self.nodes: dict[tuple[str, str], SimNode] = {}
        self.ops: dict[str, SimOperation] = {}
        self.request_ids: dict[tuple[str, str], tuple[str, float]] = {}
        self.tombstones: dict[tuple[str, str, str], tuple[float, dict[str, Any]]] = {}
        self._waiting: dict[PoolKey, list[SimQueuedResource]] = {}
        self._create_rate = CreateRate()
        self._order = itertools.count()
        self.quota_limits = {(q.id, q.location): q.limit for q in kernel.scenario.quotas}

    # ------------------------------------------------------------------ naming, rendering, operations

    def parent(self, zone: str) -> str:
        return parent_of(self.project, zone)

    def render_qr(self, qr: SimQueuedResource) -> dict[str, Any]:
        return render_qr(self.project, qr)

    def render_node(self, node: SimNode) -> dict[str, Any]:
        return render_node(self.project, node)

    def new_operation(self, zone: str, verb: str, target: str, api_version: str) -> SimOperation:
        kernel = self.kernel
        millis = int(kernel.now_s * 1000)
        rng = kernel.rng
        suffix = f"{rng.getrandbits(52):013x}-{rng.getrandbits(32):08x}-{rng.getrandbits(32):08x}"
        name = f"{self.parent(zone)}/operations/operation-{millis}-{suffix}"
        op = SimOperation(
            name=name, zone=zone, verb=verb, target=target, api_version=api_version, created_at=kernel.now_s
        )
        self.ops[name] = op
        return op

    def finish_op(
        self, op_name: str | None, *, response: dict[str, Any] | None = None, error: dict[str, Any] | None = None
    ) -> None:
        op = self.ops.get(op_name or "")
        if op is None or op.done:
            return
        op.done = True
        op.end_at = self.kernel.now_s
        op.error = error
        op.response = response if error is None else None

    def _finish_node_ops(self, node: SimNode) -> None:
        """The node's pending operations succeed, answering with the node as it is now."""
        for op_name in node.pending_ops:
            self.finish_op(op_name, response=with_type("Node", node.api_version, self.render_node(node)))
        node.pending_ops.clear()

    def set_qr_state(self, qr: SimQueuedResource, state: str, initiator: str = "") -> None:
        qr.state = state
        qr.state_since = self.kernel.now_s
        qr.initiator = initiator
        qr.epoch += 1
        self.kernel.log(f"qr.{state.lower()}", qr.zone, qr.qr_id, initiator)

    def set_node_state(self, node: SimNode, state: str) -> None:
        now = self.kernel.now_s
        if node.state == "READY" and state != "READY":
            self.kernel.bill(node, preempted=state == "PREEMPTED")
        node.state = state
        node.state_since = now
        node.epoch += 1
        if state == "READY":
            node.ready_since = now
            if node.first_ready_at is None:
                node.first_ready_at = now
        self.kernel.log(f"node.{state.lower()}", node.zone, node.node_id, node.qr_id or "")

    def is_current(self, qr: SimQueuedResource, epoch: int | None = None) -> bool:
        if self.qrs.get((qr.zone, qr.qr_id)) is not qr:
            return False
        return epoch is None or qr.epoch == epoch

    def _node_is_current(self, node: SimNode, epoch: int) -> bool:
        return self.nodes.get((node.zone, node.node_id)) is node and node.epoch == epoch

    def qr_nodes(self, qr: SimQueuedResource) -> list[SimNode]:
        nodes = (self.nodes.get((qr.zone, node_id)) for node_id in qr.node_ids)
        return [node for node in nodes if node is not None and node.qr_id == qr.qr_id]

    # ------------------------------------------------------------------ matching waiting queued resources

    def match(self, key: PoolKey) -> None:
        """Start provisioning waiting queued resources of one pool, oldest first, while chips allow."""
        queue = self._waiting.get(key)
        if not queue:
            return
        pool = self.kernel.pool(*key)
        remaining: list[SimQueuedResource] = []
        for qr in queue:
            if self.qrs.get((qr.zone, qr.qr_id)) is not qr or qr.state != "WAITING_FOR_RESOURCES":
                continue
            ready = qr.valid_after is None or qr.valid_after <= self.kernel.now_s
            if ready and pool.free >= qr.chips:
                self._start_provisioning(qr, pool)
            else:
                remaining.append(qr)
        self._waiting[key] = remaining

    # ------------------------------------------------------------------ queued resources: creation

    def next_order(self) -> int:
        """Creation order of queued resources (their ``order``)."""
        return next(self._order)

    def add_qr(self, qr: SimQueuedResource, *, flex_refused: bool, request_id: str | None) -> SimOperation:
        """Store a validated queued resource (CREATING) and schedule its acceptance or flex-start refusal."""
        kernel = self.kernel
        zone = qr.zone
        self.qrs[(zone, qr.qr_id)] = qr
        self.tombstones.pop(("qr", zone, qr.qr_id), None)
        op = self.new_operation(zone, "create", f"{self.parent(zone)}/queuedResources/{qr.qr_id}", qr.api_version)
        qr.create_op = op.name
        self.remember_request(self.project, request_id, op)
        kernel.log("qr.creating", zone, qr.qr_id, f"{qr.accelerator} {qr.tier}")
        if flex_refused:
            kernel.after(kernel.timing(zone, "flex_refusal_s"), self._on_flex_refused, qr, qr.epoch)
        else:
            kernel.after(kernel.timing(zone, "accept_s"), self._on_qr_accept, qr, qr.epoch)
        if qr.valid_until is not None:
            kernel.schedule(qr.valid_until, self._on_valid_until, qr)
        return op

    def _on_qr_accept(self, qr: SimQueuedResource, epoch: int) -> None:
        if not self.is_current(qr, epoch) or qr.state != "CREATING":
            return
        self.set_qr_state(qr, "ACCEPTED")
        self.finish_op(qr.create_op, response=with_type("QueuedResource", qr.api_version, self.render_qr(qr)))
        self.kernel.after(self.kernel.timing(qr.zone, "wait_s"), self.on_qr_waiting, qr, qr.epoch)

    def _on_flex_refused(self, qr: SimQueuedResource, epoch: int) -> None:
        if not self.is_current(qr, epoch) or qr.state != "CREATING":
            return
        error = {
            "code": 3,
            "message": f'FLEX_START provisioning model is not supported for accelerator type "{qr.accelerator}" '
            f'in location "{qr.zone}"',
        }
        self.finish_op(qr.create_op, error=error)
        if self.scenario.limits.flex_refusal_lingers:
            qr.failed_error = error
            self.set_qr_state(qr, "FAILED")
        else:
            self._remove_qr(qr)

    def on_qr_waiting(self, qr: SimQueuedResource, epoch: int) -> None:
        if not self.is_current(qr, epoch) or qr.state != "ACCEPTED":
            return
        self.set_qr_state(qr, "WAITING_FOR_RESOURCES")
        key = (qr.zone, qr.family, qr.pool)
        self._waiting.setdefault(key, []).append(qr)
        if qr.valid_after is not None and qr.valid_after > self.kernel.now_s:
            # Not mark_dirty: the mark goes to today's dirty set, as it always did (see SimKernel.dirty_marker).
            self.kernel.schedule(qr.valid_after, self.kernel.dirty_marker(), key)
        else:
            self.kernel.mark_dirty(key)

    # ------------------------------------------------------------------ queued resources: provisioning

    def _start_provisioning(self, qr: SimQueuedResource, pool: Pool) -> None:
        kernel = self.kernel
        self.set_qr_state(qr, "PROVISIONING")
        cycling = self.scenario.zones[qr.zone].cycling
        if cycling.probability > 0 and kernel.rng.random() < cycling.probability:
            qr.cycling = True
            kernel.log("qr.cycling", qr.zone, qr.qr_id, "provisioning will not complete")
            self._create_qr_nodes(qr, hold_chips=False)
            kernel.schedule(kernel.now_s + cycling.flicker_s, self._on_flicker, qr, qr.epoch)
            if cycling.fail_after_s is not None:
                kernel.schedule(kernel.now_s + cycling.fail_after_s, self._on_cycling_fail, qr, qr.epoch)
            return
        pool.used += qr.chips
        for node in self._create_qr_nodes(qr, hold_chips=True):
            kernel.after(kernel.timing(qr.zone, "boot_s"), self._on_node_boot, node, node.epoch)

    def _create_qr_nodes(self, qr: SimQueuedResource, *, hold_chips: bool) -> list[SimNode]:
        nodes = []
        for node_id, body in qr.node_specs:
            node = self.make_node(qr.zone, node_id, body, qr.accelerator, qr.family, qr.chips_per_node, qr.api_version)
            node.pool, node.tier, node.qr_id, node.holds_chips = qr.pool, qr.tier, qr.qr_id, hold_chips
            self.nodes[(qr.zone, node_id)] = node
            self.tombstones.pop(("node", qr.zone, node_id), None)
            nodes.append(node)
        qr.node_ids = [node_id for node_id, _ in qr.node_specs]
        return nodes

    def make_node(
        self, zone: str, node_id: str, body: dict[str, Any], accelerator: str, family: str, chips: int, version: str
    ) -> SimNode:
        kernel = self.kernel
        number = kernel.next_node_number()
        zone_octet = kernel.zone_index(zone) % 250
        ip = f"10.{zone_octet}.{(number >> 8) & 255}.{number & 255}"
        node = SimNode(
            zone=zone,
            node_id=node_id,
            accelerator=accelerator,
            family=family,
            chips=chips,
            runtime_version=str(body.get("runtimeVersion", "")),
            pool="on_demand",
            tier="on_demand",
            body=body,
            created_at=kernel.now_s,
            numeric_id=1_000_000_000_000 + number * 7919,
            ip_address=ip,
            api_version=version,
            state_since=kernel.now_s,
        )
        kernel.log("node.creating", zone, node_id, "")
        return node

    def _on_flicker(self, qr: SimQueuedResource, epoch: int) -> None:
        if not self.is_current(qr, epoch) or qr.state != "PROVISIONING":
            return
        present = [self.nodes.get((qr.zone, node_id)) for node_id in qr.node_ids]
        if any(node is not None for node in present):
            for node in present:
                if node is not None:
                    self.nodes.pop((node.zone, node.node_id), None)
                    self.kernel.log("node.vanished", node.zone, node.node_id, qr.qr_id)
        else:
            self._create_qr_nodes(qr, hold_chips=False)
        cycling = self.scenario.zones[qr.zone].cycling
        self.kernel.schedule(self.kernel.now_s + cycling.flicker_s, self._on_flicker, qr, epoch)

    def _on_cycling_fail(self, qr: SimQueuedResource, epoch: int) -> None:
        if not self.is_current(qr, epoch) or qr.state != "PROVISIONING":
            return
        error = {
            "code": 8,
            "message": f'Provisioning did not complete: there is no more capacity in the zone "{qr.zone}" '
            f"{self.kernel.eid()}",
        }
        self._fail_qr(qr, error)

    def _on_valid_until(self, qr: SimQueuedResource) -> None:
        if not self.is_current(qr) or qr.state not in QR_LIVE_WAITING:
            return
        spec = self.scenario.valid_until_error
        self._fail_qr(qr, {"code": spec.code, "message": spec.message.replace("{zone}", qr.zone)})

    def _fail_qr(self, qr: SimQueuedResource, error: dict[str, Any]) -> None:
        qr.failed_error = error
        if qr.state == "CREATING":
            self.finish_op(qr.create_op, error=error)
        self.set_qr_state(qr, "FAILED")
        for node in self.qr_nodes(qr):
            self.begin_node_delete(node)

    # ------------------------------------------------------------------ nodes: boot, capacity, preemption

    def _on_node_boot(self, node: SimNode, epoch: int) -> None:
        if not self._node_is_current(node, epoch) or node.state != "CREATING":
            return
        self.set_node_state(node, "READY")
        self.kernel.notify("ready", node)
        if node.tier == "spot":
            self.schedule_preemption(node)
        self._finish_node_ops(node)
        qr = self.qrs.get((node.zone, node.qr_id or ""))
        if qr is None or qr.state != "PROVISIONING":
            return
        nodes = self.qr_nodes(qr)
        if len(nodes) == len(qr.node_specs) and all(item.state == "READY" for item in nodes):
            self.set_qr_state(qr, "ACTIVE")
            if qr.tier == "flex_start" and qr.max_run_s:
                qr.termination_time = self.kernel.now_s + qr.max_run_s
                for item in nodes:
                    item.termination_time = qr.termination_time
                self.kernel.schedule(qr.termination_time, self._on_flex_end, qr, qr.epoch)

    def add_node(self, node: SimNode, op: SimOperation) -> None:
        """Store a validated standalone node (CREATING); a capacity check later boots it or fails it."""
        kernel = self.kernel
        self.nodes[(node.zone, node.node_id)] = node
        self.tombstones.pop(("node", node.zone, node.node_id), None)
        node.pending_ops.append(op.name)
        kernel.after(kernel.timing(node.zone, "capacity_check_s"), self._on_node_capacity_check, node, node.epoch)

    def _on_node_capacity_check(self, node: SimNode, epoch: int) -> None:
        if not self._node_is_current(node, epoch) or node.state != "CREATING":
            return
        kernel = self.kernel
        pool = kernel.pool(node.zone, node.family, node.pool)
        if pool.free >= node.chips:
            pool.used += node.chips
            node.holds_chips = True
            kernel.after(kernel.timing(node.zone, "boot_s"), self._on_node_boot, node, node.epoch)
            return
        error = self._stockout_error(node)
        for op_name in node.pending_ops:
            self.finish_op(op_name, error=error)
        node.pending_ops.clear()
        del self.nodes[(node.zone, node.node_id)]
        kernel.log("node.stockout", node.zone, node.node_id, error["message"][:80])

    def _stockout_error(self, node: SimNode) -> dict[str, Any]:
        variant = self.scenario.zones[node.zone].stockout_error
        if variant == "internal":
            return {"code": 13, "message": "an internal error has occurred"}
        if variant == "reservation":
            return {
                "code": 9,
                "message": "Insufficient reserved capacity. Contact customer support to increase your reservation. "
                + self.kernel.eid(),
            }
        return {
            "code": 8,
            "message": f'There is no more capacity in the zone "{node.zone}"; you can try in another zone where '
            f"Cloud TPU Nodes are offered (see https://cloud.google.com/tpu/docs/regions) {self.kernel.eid()}",
        }

    def schedule_preemption(self, node: SimNode) -> None:
        delay = self.kernel.preemption_delay(self.scenario.zones[node.zone].preemption)
        if delay is not None:
            self.kernel.schedule(self.kernel.now_s + delay, self._on_hazard, node, node.epoch)

    def _on_hazard(self, node: SimNode, epoch: int) -> None:
        if self._node_is_current(node, epoch) and node.state == "READY":
            self.preempt_node(node)

    def _on_flex_end(self, qr: SimQueuedResource, epoch: int) -> None:
        if not self.is_current(qr, epoch) or qr.state != "ACTIVE":
            return
        self.set_qr_state(qr, "SUSPENDING", "SERVICE")
        nodes = self.qr_nodes(qr)
        for node in nodes:
            self.begin_node_delete(node)
        if not nodes:
            self.set_qr_state(qr, "SUSPENDED", "SERVICE")

    def preempt_node(self, node: SimNode) -> None:
        self.set_node_state(node, "PREEMPTED")
        self.kernel.release_chips(node)
        self.kernel.notify("preempted", node)
        for op_name in node.pending_ops:
            op = self.ops.get(op_name)
            verb = op.verb if op else "update"
            self.finish_op(
                op_name,
                error={
                    "code": 3,
                    "message": f"Cloud TPU received a bad request. {verb} is not supported while in state PREEMPTED",
                },
            )
        node.pending_ops.clear()
        qr = self.qrs.get((node.zone, node.qr_id or ""))
        if qr is not None and self.scenario.limits.preempt_suspends_qr and qr.state in ("ACTIVE", "PROVISIONING"):
            self.set_qr_state(qr, "SUSPENDING", "SERVICE")
            self.kernel.after(self.scenario.timings.suspend_s, self._on_qr_suspended, qr, qr.epoch)

    def _on_qr_suspended(self, qr: SimQueuedResource, epoch: int) -> None:
        if self.is_current(qr, epoch) and qr.state == "SUSPENDING":
            self.set_qr_state(qr, "SUSPENDED", qr.initiator or "SERVICE")

    # ------------------------------------------------------------------ nodes: stop and start

    def stop_start(self, node: SimNode, op: SimOperation, *, stop: bool) -> None:
        """STOPPING or STARTING now; STOPPED or READY after the scenario's stop or start time."""
        self.set_node_state(node, "STOPPING" if stop else "STARTING")
        node.pending_ops.append(op.name)
        span = self.scenario.timings.stop_s if stop else self.scenario.timings.start_s
        self.kernel.after(span, self._on_stop_start_done, node, node.epoch, stop)

    def _on_stop_start_done(self, node: SimNode, epoch: int, stop: bool) -> None:
        if not self._node_is_current(node, epoch):
            return
        self.set_node_state(node, "STOPPED" if stop else "READY")
        self.kernel.notify("stopped" if stop else "started", node)
        if not stop and node.tier == "spot":
            self.schedule_preemption(node)
        self._finish_node_ops(node)

    # ------------------------------------------------------------------ deletion

    def begin_node_delete(self, node: SimNode, op_name: str | None = None) -> None:
        if node.state == "DELETING":
            return
        self.set_node_state(node, "DELETING")
        node.delete_op = op_name
        for pending in node.pending_ops:
            self.finish_op(pending, error={"code": 10, "message": "The node was deleted before the operation finished"})
        node.pending_ops.clear()
        self.kernel.after(self.kernel.timing(node.zone, "delete_s"), self._on_node_gone, node, node.epoch)

    def _on_node_gone(self, node: SimNode, epoch: int) -> None:
        if not self._node_is_current(node, epoch):
            return
        kernel = self.kernel
        kernel.release_chips(node)
        if self.scenario.limits.list_lag_s:  # lists may still show it for a while
            self.tombstones[("node", node.zone, node.node_id)] = (kernel.now_s, self.render_node(node))
        del self.nodes[(node.zone, node.node_id)]
        kernel.log("node.gone", node.zone, node.node_id, node.qr_id or "")
        kernel.notify("deleted", node)
        self.finish_op(node.delete_op, response=dict(EMPTY))
        qr = self.qrs.get((node.zone, node.qr_id or ""))
        if qr is None or self.qr_nodes(qr):
            return
        if qr.state == "DELETING":
            self._remove_qr(qr)
        elif qr.state == "SUSPENDING":
            self.set_qr_state(qr, "SUSPENDED", qr.initiator or "SERVICE")

    def _remove_qr(self, qr: SimQueuedResource) -> None:
        if self.scenario.limits.list_lag_s:  # lists may still show it for a while
            self.tombstones[("qr", qr.zone, qr.qr_id)] = (self.kernel.now_s, self.render_qr(qr))
        del self.qrs[(qr.zone, qr.qr_id)]
        qr.epoch += 1
        self.kernel.log("qr.gone", qr.zone, qr.qr_id, "")
        self.finish_op(qr.delete_op, response=dict(EMPTY))

    def delete_qr_when_empty(self, qr: SimQueuedResource) -> None:
        """A queued resource without nodes goes after the accept time."""
        self.kernel.after(self.kernel.timing(qr.zone, "accept_s"), self._on_qr_delete_finished, qr, qr.epoch)

    def _on_qr_delete_finished(self, qr: SimQueuedResource, epoch: int) -> None:
        if self.is_current(qr, epoch) and qr.state == "DELETING" and not self.qr_nodes(qr):
            self._remove_qr(qr)

    def requeue(self, qr: SimQueuedResource) -> None:
        """Reset: drop the queued resource's nodes and queue it again (ACCEPTED, then waiting)."""
        kernel = self.kernel
        for node in self.qr_nodes(qr):
            kernel.release_chips(node)
            if node.state == "READY":
                kernel.bill(node, preempted=False)
            self.nodes.pop((qr.zone, node.node_id), None)
            kernel.notify("deleted", node)
        qr.failed_error = None
        qr.termination_time = None
        qr.cycling = False
        self.set_qr_state(qr, "ACCEPTED")
        kernel.after(kernel.timing(qr.zone, "wait_s"), self.on_qr_waiting, qr, qr.epoch)

    # ------------------------------------------------------------------ quota, rate and idempotency

    def check_quota(self, zone: str, family: str, tier: str, chips: int) -> None:
        if tier == "reservation":
            return
        preemptible = tier == "spot" or (tier == "flex_start" and self.scenario.limits.flex_quota == "preemptible")
        region = zone.rsplit("-", 1)[0]
        exceeded: list[tuple[str, int, str, str]] = []
        for scope, location in (("Region", region), ("Zone", zone)):
            qid = quota_id(family, preemptible=preemptible, scope=scope)
            limit = self.quota_limits.get((qid, location))
            if limit is None:
                continue
            if self.quota_usage(family, preemptible, location) + chips > limit:
                exceeded.append((qid, limit, scope.lower(), location))
        if exceeded:
            raise quota_error(self.project, exceeded)

    def _counts_preemptible(self, tier: str) -> bool | None:
        if tier == "reservation":
            return None
        return tier == "spot" or (tier == "flex_start" and self.scenario.limits.flex_quota == "preemptible")

    def quota_usage(self, family: str, preemptible: bool, location: str) -> int:
        leak = self.scenario.limits.quota_leak
        used = 0
        counted_qrs: set[tuple[str, str]] = set()
        for node in self.nodes.values():
            if node.family != family or self._counts_preemptible(node.tier) is not preemptible:
                continue
            if not (node.zone == location or node.zone.rsplit("-", 1)[0] == location):
                continue
            if node.state == "PREEMPTED" and not leak:
                continue
            used += node.chips
            if node.qr_id:
                counted_qrs.add((node.zone, node.qr_id))
        if leak:
            for key, qr in self.qrs.items():
                if key in counted_qrs or qr.family != family or self._counts_preemptible(qr.tier) is not preemptible:
                    continue
                if not (qr.zone == location or qr.zone.rsplit("-", 1)[0] == location):
                    continue
                if qr.state in _QUOTA_LEAK_STATES:
                    used += qr.chips
        return used

    def check_rate(self) -> None:
        limit = self.scenario.limits.creates_per_minute
        if limit is not None and not self._create_rate.admit(self.kernel.now_s, limit):
            raise rate_limit_error(limit)

    def check_queued_limit(self, zone: str) -> None:
        limit = self.scenario.limits.queued_per_zone
        if limit is None:
            return
        queued = sum(1 for qr in self.qrs.values() if qr.zone == zone and qr.state != "DELETING")
        if queued >= limit:
            raise queued_limit_error(self.project, zone, limit)

    def replay_request(self, project: str, request_id: str | None) -> dict[str, Any] | None:
        """The operation a repeated ``requestId`` already started (within the idempotency window), rendered."""
        if not request_id:
            return None
        seen = self.request_ids.get((project, request_id))
        if seen is None:
            return None
        op_name, at = seen
        if self.kernel.now_s - at > self.scenario.limits.idempotency_window_s or op_name not in self.ops:
            return None
        self.kernel.log("request.replayed", self.ops[op_name].zone, op_name, request_id)
        return render_op(self.ops[op_name])

    def remember_request(self, project: str, request_id: str | None, op: SimOperation) -> None:
        if request_id:
            self.request_ids[(project, request_id)] = (op.name, self.kernel.now_s)

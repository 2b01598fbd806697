"""The simulated world: zones, capacity pools, quotas, queued resources, nodes, instances, operations and a meter.

:class:`World` composes the parts on one :class:`~localcloud.tpu_sim.kernel.SimKernel` (virtual clock,
event heap, seeded RNG, lock, pools, meter, listeners): the TPU API simulation
(:class:`~localcloud.tpu_sim.tpu_lifecycle.TpuResources`, served by the
:class:`~localcloud.tpu_sim.tpu_api.TpuApi` methods) and the Compute Engine simulation
(:class:`~localcloud.tpu_sim.compute.ComputeEngine`, ``world.compute``). Neither simulation knows the
other; this module wires them and answers the admin questions that span both (preempt, invariants,
billing, state, guest attributes, node endpoints).

Time is virtual and event driven, and all randomness comes from one seeded RNG consumed in event order,
so a scenario replays identically for the same calls (see :mod:`~localcloud.tpu_sim.kernel`).

Thread safety: one lock guards the world; node listeners are called after the lock is released, so a
listener may call back into the world.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from localcloud.tpu_sim.advice import calendar_bookings
from localcloud.tpu_sim.compute import ComputeEngine
from localcloud.tpu_sim.kernel import LABEL_DEPLOYMENT, NodeEvent, SimKernel, SimNode, leftover_entry
from localcloud.tpu_sim.scenario import FaultSpec, Scenario, load_scenario
from localcloud.tpu_sim.tpu_api import TpuApi
from localcloud.tpu_sim.tpu_lifecycle import TpuResources
from localcloud.tpu_sim.tpu_validation import check_project, check_zone
from localcloud.tpu_sim.wire import family_of_quota, format_time

__all__ = ["NodeEvent", "World", "WorldClock"]

LEFTOVER_QR_STATES = ("FAILED", "SUSPENDED")
_PREEMPTIBLE_NODE_STATES = ("READY", "CREATING", "STARTING", "STOPPING", "REPAIRING")


class WorldClock:
    """The world's virtual time read in-process, as a ``shared.ports.Clock`` (``SimulatorClock`` reads it over HTTP)."""

    def __init__(self, world: World) -> None:
        self._world = world

    def now(self) -> datetime:
        return self._world.now()

    def monotonic(self) -> float:
        return self._world.elapsed_s()


@dataclass
class _Fault:
    spec: FaultSpec
    remaining: int


_GUEST_NAME = re.compile(r"[A-Za-z0-9_-]{1,128}")


def _check_guest_name(field: str, value: str) -> None:
    """Namespaces and keys are one path segment each; kept to the letters, digits, ``-`` and ``_`` Google's own
    agents and the startup script use, so a path trick never becomes a name."""
    if not _GUEST_NAME.fullmatch(value):
        raise ValueError(f"{field}: {value!r} is not a guest attribute name (1-128 of A-Z a-z 0-9 - _)")


def _guest_items(node: SimNode, query_path: str) -> list[tuple[str, str, str]]:
    namespace, _, key = query_path.strip("/").partition("/")
    return sorted(
        (ns, name, value)
        for (ns, name), value in node.guest_attributes.items()
        if (not namespace or ns == namespace) and (not key or name == key)
    )


class World(TpuApi):
    """A simulated Cloud TPU project. Build one from a scenario name, path, mapping or ``Scenario``."""

    def __init__(self, scenario: Scenario | str | dict[str, Any], *, time_scale: float = 0.0, seed: int | None = None):
        self.scenario = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
        if time_scale < 0:
            raise ValueError("time_scale: must be >= 0 (0 = time moves only on advance())")
        self.seed = self.scenario.seed if seed is None else seed
        self.clock = WorldClock(self)
        self.kernel = SimKernel(self.scenario, time_scale=time_scale, seed=self.seed)
        self._compose()

    @property
    def time_scale(self) -> float:
        """Virtual seconds per wall second (0: time moves only on ``advance()``)."""
        return self.kernel.time_scale

    @time_scale.setter
    def time_scale(self, value: float) -> None:
        self.kernel.time_scale = value

    def _compose(self) -> None:
        """Both simulations on the (fresh) kernel; for each changed pool, waiting flex-start instances get the
        first turn, then queued resources."""
        self.tpu = TpuResources(self.kernel)
        self.compute = ComputeEngine(self.kernel)  # TPU VMs through Compute Engine, same pools and meter
        self.kernel.set_matchers(self.compute.match, self.tpu.match)
        self._faults = [_Fault(spec, spec.times) for spec in self.scenario.faults]

    def reset(self) -> None:
        """Back to the scenario's start: same seed, no resources, the clock at the start time."""
        with self.kernel.lock:
            self.kernel.restart()
            self._compose()
            self.kernel.log("reset", "", "", "world reset to the scenario start")

    def add_node_listener(self, listener: Callable[[NodeEvent], None]) -> None:
        """Call ``listener`` (outside the world lock) when a node turns READY, is preempted, stopped or deleted."""
        self.kernel.add_listener(listener)

    def remove_node_listener(self, listener: Callable[[NodeEvent], None]) -> None:
        self.kernel.remove_listener(listener)

    # ------------------------------------------------------------------ time

    def now(self) -> datetime:
        """The virtual time, UTC-aware."""
        with self.kernel.transaction():
            return self.kernel.now_datetime()

    def elapsed_s(self) -> float:
        """Virtual seconds since the scenario start."""
        with self.kernel.transaction():
            return self.kernel.now_s - self.kernel.start_s

    def advance(self, seconds: float) -> datetime:
        """Move virtual time forward by ``seconds``, running every event that falls due; returns the new now."""
        if seconds < 0 or math.isnan(seconds):
            raise ValueError("seconds: must be a number >= 0 (time only moves forward)")
        with self.kernel.transaction():
            self.kernel.advance_by(seconds)
            return self.kernel.now_datetime()

    def sync(self) -> None:
        """Catch up with the wall clock when a time scale is set (a no-op otherwise)."""
        with self.kernel.transaction():
            pass

    # ------------------------------------------------------------------ admin and test helpers

    def set_capacity(self, zone: str, pool: str, chips: int, *, family: str = "v6e") -> None:
        """Set a pool's supply now (later timeline steps still apply)."""
        if zone not in self.scenario.zones:
            raise ValueError(f"zone: {zone!r} is not in the scenario (known: {', '.join(sorted(self.scenario.zones))})")
        if pool not in ("on_demand", "spot", "flex_start") and not pool.startswith("reservation:"):
            raise ValueError("pool: use on_demand, spot, flex_start or reservation:<name>")
        if chips < 0:
            raise ValueError("chips: must be >= 0")
        with self.kernel.transaction():
            self.kernel.set_pool_total((zone, family, pool), chips)

    def preempt(
        self, zone: str, *, node: str | None = None, queued_resource: str | None = None, instance: str | None = None
    ) -> list[str]:
        """Preempt one node, every node of a queued resource (also while PROVISIONING), or one Compute Engine
        instance; returns the names hit."""
        if instance is not None:
            return self.compute.preempt(zone, instance)
        with self.kernel.transaction():
            tpu = self.tpu
            if queued_resource is not None:
                qr = tpu.qrs.get((zone, queued_resource))
                if qr is None:
                    raise KeyError(f"queued_resource: {zone}/{queued_resource} does not exist")
                targets = tpu.qr_nodes(qr)
            elif node is not None:
                found = tpu.nodes.get((zone, node))
                if found is None:
                    raise KeyError(f"node: {zone}/{node} does not exist")
                targets = [found]
            else:
                raise ValueError("preempt: name a node or a queued_resource")
            hit = []
            for target in targets:
                if target.state in _PREEMPTIBLE_NODE_STATES:
                    tpu.preempt_node(target)
                    hit.append(target.node_id)
            return hit

    def set_node_endpoint(self, zone: str, node_id: str, ip_address: str, port: int) -> dict[str, Any]:
        """Point a node's networkEndpoints at a real server (the node runtime attaches vLLM here)."""
        if not 0 < port < 65536:
            raise ValueError("port: must be 1-65535")
        with self.kernel.transaction():
            node = self._vm(zone, node_id)
            node.ip_address = ip_address
            node.port = port
            self.kernel.log("node.endpoint", zone, node_id, f"{ip_address}:{port}")
            return self.tpu.render_node(node)

    # ------------------------------------------------------------------ guest attributes

    def _vm(self, zone: str, node_id: str) -> SimNode:
        """A TPU API node or a Compute Engine instance by name; KeyError when neither exists."""
        node = self.tpu.nodes.get((zone, node_id)) or self.compute.node(zone, node_id)
        if node is None:
            raise KeyError(f"node: {zone}/{node_id} does not exist")
        return node

    def put_guest_attribute(self, zone: str, node_id: str, namespace: str, key: str, value: str) -> None:
        """What the VM's metadata server does on ``PUT guest-attributes/NS/KEY``. Attributes belong to the VM: they
        go with the node when it is deleted and are kept across a stop and start, as nothing in Google's documents
        says they are cleared (so a new boot first sees the last boot's values: readers must cope)."""
        _check_guest_name("namespace", namespace)
        _check_guest_name("key", key)
        with self.kernel.transaction():
            self._vm(zone, node_id).guest_attributes[(namespace, key)] = str(value)

    def delete_guest_attribute(self, zone: str, node_id: str, namespace: str, key: str) -> None:
        """``DELETE guest-attributes/NS/KEY``: gone (no error when it was not there); KeyError for an unknown node."""
        with self.kernel.transaction():
            self._vm(zone, node_id).guest_attributes.pop((namespace, key), None)

    def guest_attributes(self, zone: str, node_id: str, query_path: str = "") -> list[tuple[str, str, str]]:
        """(namespace, key, value) under ``query_path`` (``""`` or ``/``: all, ``NS/``: a namespace, ``NS/KEY``:
        one key), sorted; KeyError for an unknown node."""
        with self.kernel.transaction():
            return _guest_items(self._vm(zone, node_id), query_path)

    def get_guest_attributes(self, project: str, zone: str, node_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """``POST …/nodes/N:getGuestAttributes`` as the TPU API answers: an entry per worker asked for that has
        something under ``queryPath`` (a simulated node has worker 0 only), in worker order; the v2
        ``GuestAttributes`` message carries no worker id."""
        query_path = str(body.get("queryPath") or "")
        workers = [str(worker) for worker in body.get("workerIds") or []]
        with self.kernel.transaction():
            check_project(self.scenario, project)
            check_zone(self.scenario, zone)
            found = _guest_items(self._require_node(zone, node_id), query_path)
        if (workers and "0" not in workers) or not found:
            return {"guestAttributes": []}
        items = [{"namespace": ns, "key": key, "value": value} for ns, key, value in found]
        return {"guestAttributes": [{"queryPath": query_path, "queryValue": {"items": items}}]}

    # ------------------------------------------------------------------ faults

    def inject_fault(self, spec: FaultSpec | dict[str, Any]) -> None:
        """Answer the next ``times`` calls of ``endpoint`` (e.g. get_operation, or ``*``) with an error."""
        fault = spec if isinstance(spec, FaultSpec) else FaultSpec.model_validate(spec)
        with self.kernel.lock:
            self._faults.append(_Fault(fault, fault.times))

    def clear_faults(self) -> None:
        with self.kernel.lock:
            self._faults.clear()

    def take_fault(self, endpoint: str) -> FaultSpec | None:
        """The fault to apply to this call, if any (consumes one of its ``times``)."""
        with self.kernel.lock:
            for fault in self._faults:
                if fault.remaining > 0 and fault.spec.endpoint in (endpoint, "*"):
                    fault.remaining -= 1
                    return fault.spec
            return None

    def faults(self) -> list[dict[str, Any]]:
        with self.kernel.lock:
            return [{**fault.spec.model_dump(), "remaining": fault.remaining} for fault in self._faults]

    # ------------------------------------------------------------------ queries

    def qr_state(self, zone: str, qr_id: str) -> str | None:
        """The queued resource's state, or None when it does not exist."""
        with self.kernel.transaction():
            qr = self.tpu.qrs.get((zone, qr_id))
            return qr.state if qr else None

    def node_state(self, zone: str, node_id: str) -> str | None:
        """The node's state, or None when it does not exist."""
        with self.kernel.transaction():
            node = self.tpu.nodes.get((zone, node_id))
            return node.state if node else None

    def queued_resource(self, zone: str, qr_id: str) -> dict[str, Any] | None:
        """The queued resource as the API would render it, or None."""
        with self.kernel.transaction():
            qr = self.tpu.qrs.get((zone, qr_id))
            return self.tpu.render_qr(qr) if qr else None

    def node(self, zone: str, node_id: str) -> dict[str, Any] | None:
        """The node as the API would render it, or None."""
        with self.kernel.transaction():
            node = self.tpu.nodes.get((zone, node_id))
            return self.tpu.render_node(node) if node else None

    def pool(self, zone: str, pool: str, family: str = "v6e") -> dict[str, int]:
        """``{total, used, free}`` chips of one pool."""
        with self.kernel.transaction():
            found = self.kernel.pool(zone, family, pool)
            return {"total": found.total, "used": found.used, "free": found.free}

    def events(self, since: int = 0) -> list[dict[str, Any]]:
        """The event log (newest last), from sequence number ``since`` on."""
        with self.kernel.lock:
            return [event for event in self.kernel.log_entries() if event["seq"] > since]

    # ------------------------------------------------------------------ billing, invariants and state

    def billing(self) -> dict[str, Any]:
        """Chip-hours and USD by tier and by deployment, including nodes READY right now."""
        with self.kernel.transaction():
            return self._billing_locked()

    def _billing_locked(self) -> dict[str, Any]:
        return self.kernel.billing([*self.tpu.nodes.values(), *self.compute.billable()])

    def invariants(
        self, live_deployments: Iterable[str] | None = None, *, max_leftover_s: float = 600.0
    ) -> dict[str, Any]:
        """Orphans, leftovers (FAILED/SUSPENDED queued resources, PREEMPTED nodes), billing, duplicate ACTIVE.

        ``live_deployments``: the deployment ids the caller still has; a resource labelled with any other
        id is an orphan. None means "only unlabelled resources are orphans".
        """
        live = set(live_deployments) if live_deployments is not None else None
        with self.kernel.transaction():
            tpu = self.tpu
            resources: list[tuple[str, str, str, dict[str, str]]] = [
                ("queued_resource", qr.zone, qr.qr_id, qr.labels) for qr in tpu.qrs.values() if qr.state != "DELETING"
            ]
            resources += [
                ("node", node.zone, node.node_id, node.labels)
                for node in tpu.nodes.values()
                if node.qr_id is None and node.state != "DELETING"
            ]
            instance_leftovers: list[dict[str, Any]] = []
            instance_active: dict[str, list[str]] = {}
            self.compute.add_invariants(resources, instance_leftovers, instance_active, max_leftover_s)
            resources += calendar_bookings(self.kernel)
            orphans = _orphans(resources, live)
            leftovers = [*self._tpu_leftovers(max_leftover_s), *instance_leftovers]
            duplicates = self._duplicate_active(instance_active)
            stale = [item for item in leftovers if item["too_old"]]
            return {
                "time": format_time(self.kernel.now_s),
                "orphans": orphans,
                "leftovers": leftovers,
                "duplicate_active": duplicates,
                "billing": self._billing_locked(),
                "ok": not orphans and not stale and not duplicates,
            }

    def _tpu_leftovers(self, max_leftover_s: float) -> list[dict[str, Any]]:
        now = self.kernel.now_s
        leftovers = []
        for qr in sorted(self.tpu.qrs.values(), key=lambda item: (item.zone, item.qr_id)):
            if qr.state in LEFTOVER_QR_STATES:
                age = now - qr.state_since
                leftovers.append(leftover_entry("queued_resource", qr.zone, qr.qr_id, qr.state, age, max_leftover_s))
        for node in sorted(self.tpu.nodes.values(), key=lambda item: (item.zone, item.node_id)):
            if node.state == "PREEMPTED":
                age = now - node.state_since
                leftovers.append(leftover_entry("node", node.zone, node.node_id, node.state, age, max_leftover_s))
        return leftovers

    def _duplicate_active(self, instance_active: dict[str, list[str]]) -> dict[str, list[str]]:
        """Deployments with more than one ACTIVE queued resource, READY standalone node or RUNNING instance."""
        active: dict[str, list[str]] = {owner: list(names) for owner, names in instance_active.items()}
        for qr in self.tpu.qrs.values():
            owner = qr.labels.get(LABEL_DEPLOYMENT)
            if owner and qr.state == "ACTIVE":
                active.setdefault(owner, []).append(f"{qr.zone}/{qr.qr_id}")
        for node in self.tpu.nodes.values():
            owner = node.labels.get(LABEL_DEPLOYMENT)
            if owner and node.qr_id is None and node.state == "READY":
                active.setdefault(owner, []).append(f"{node.zone}/{node.node_id}")
        return {owner: sorted(names) for owner, names in sorted(active.items()) if len(names) > 1}

    def state(self, *, events: int = 200) -> dict[str, Any]:
        """Everything: resources, pools, quota usage, billing and the last ``events`` log entries."""
        with self.kernel.transaction():
            tpu, kernel = self.tpu, self.kernel
            quota = []
            for (qid, location), limit in sorted(tpu.quota_limits.items()):
                family, preemptible = family_of_quota(qid)
                usage = tpu.quota_usage(family, preemptible, location)
                quota.append({"id": qid, "location": location, "limit": limit, "usage": usage})
            return {
                "project": self.scenario.project,
                "scenario": self.scenario.name,
                "time": format_time(kernel.now_s),
                "elapsed_s": kernel.now_s - kernel.start_s,
                "time_scale": self.time_scale,
                "queued_resources": [
                    {**tpu.render_qr(qr), "sim": {"tier": qr.tier, "pool": qr.pool, "cycling": qr.cycling}}
                    for qr in sorted(tpu.qrs.values(), key=lambda item: (item.zone, item.qr_id))
                ],
                "nodes": [
                    {**tpu.render_node(node), "sim": {"tier": node.tier, "billed_s": node.billed_s}}
                    for node in sorted(tpu.nodes.values(), key=lambda item: (item.zone, item.node_id))
                ],
                "pools": [
                    {"zone": zone, "family": family, "pool": pool, "total": item.total, "used": item.used}
                    for (zone, family, pool), item in sorted(kernel.pools.items())
                ],
                "quota": quota,
                "compute": self.compute.state(),
                "billing": self._billing_locked(),
                "operations": len(tpu.ops),
                "pending_events": kernel.pending_events(),
                "events_run": kernel.events_run,
                "events": kernel.log_entries()[-events:] if events else [],
            }


def _orphans(resources: list[tuple[str, str, str, dict[str, str]]], live: set[str] | None) -> list[dict[str, Any]]:
    """Resources without a deployment label, or labelled with a deployment not in ``live``."""
    orphans = []
    for kind, zone, name, labels in sorted(resources):
        owner = labels.get(LABEL_DEPLOYMENT)
        if owner is None:
            orphans.append({"kind": kind, "zone": zone, "name": name, "reason": "no tpuctl-deployment label"})
        elif live is not None and owner not in live:
            orphans.append({"kind": kind, "zone": zone, "name": name, "reason": f"deployment {owner!r} is gone"})
    return orphans

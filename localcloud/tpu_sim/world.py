"""The simulated world: zones, capacity pools, quotas, queued resources, nodes, operations and a billing meter.

Time is virtual. It moves only when ``advance()`` is called, or, with ``time_scale > 0``, with the wall
clock multiplied by the scale. Work is event driven: every future happening (an operation finishing, a
node booting, capacity arriving, a spot preemption) is an entry in one heap, so advancing 24 hours costs
one step per event rather than one per second. Matching waiting queued resources to free chips runs
only for pools whose supply or demand changed. All randomness comes from one seeded RNG, consumed in
event order, so a scenario replays identically for the same calls.

Thread safety: one lock guards the world; node listeners are called after the lock is released, so a
listener may call back into the world.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import random
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from localcloud.tpu_sim.scenario import FaultSpec, Scenario, ZoneSpec, load_scenario
from localcloud.tpu_sim.wire import (
    ACCELERATOR_CONFIG_TYPES,
    SimApiError,
    config_type_of,
    family_of_quota,
    format_duration,
    format_time,
    parse_duration,
    parse_enum,
    parse_time,
    quota_id,
    topology_of,
)

if TYPE_CHECKING:
    from localcloud.tpu_sim.compute import ComputeEngine

__all__ = ["NodeEvent", "SimClock", "World"]

_log = logging.getLogger(__name__)

LABEL_DEPLOYMENT = "tpuctl-deployment"
RESOURCE_ID = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
NODE_ID = re.compile(r"^[A-Za-z0-9_.~+%-]+$")
LABEL_KEY = re.compile(r"^[a-z][-_a-z0-9]{0,62}$")
LABEL_VALUE = re.compile(r"^[-_a-z0-9]{0,63}$")
PROVISIONING_MODELS = ("PROVISIONING_MODEL_UNSPECIFIED", "STANDARD", "SPOT", "RESERVATION_BOUND", "FLEX_START")
WORKLOAD_TYPES = ("WORKLOAD_TYPE_UNSPECIFIED", "THROUGHPUT_OPTIMIZED", "AVAILABILITY_OPTIMIZED")
ALPHA_ONLY_FIELDS = ("provisioningModel", "runDuration", "bestEffort")
TIMING_KEYS = ("validUntilDuration", "validUntilTime", "validAfterDuration", "validAfterTime", "validInterval")
QR_LIVE_WAITING = ("CREATING", "ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING")
LEFTOVER_QR_STATES = ("FAILED", "SUSPENDED")
TPU_PORT = 8470


class SimClock:
    """The world's virtual time as a ``shared.ports.Clock`` (``now()`` UTC-aware, ``monotonic()`` seconds)."""

    def __init__(self, world: World) -> None:
        self._world = world

    def now(self) -> datetime:
        return self._world.now()

    def monotonic(self) -> float:
        return self._world.elapsed_s()


@dataclass(frozen=True)
class NodeEvent:
    """What a node listener hears: ``kind`` is ready, preempted, stopped, started or deleted."""

    kind: str
    zone: str
    node_id: str
    queued_resource: str | None
    accelerator: str
    labels: dict[str, str]
    metadata: dict[str, str]
    ip_address: str
    port: int


@dataclass
class Pool:
    """Chips in one (zone, family, pool): ``total`` supplied, ``used`` by nodes holding chips."""

    total: int = 0
    used: int = 0

    @property
    def free(self) -> int:
        return max(0, self.total - self.used)


@dataclass
class SimNode:
    zone: str
    node_id: str
    accelerator: str
    family: str
    chips: int
    runtime_version: str
    pool: str
    tier: str
    body: dict[str, Any]
    created_at: float
    numeric_id: int
    ip_address: str
    api_version: str
    state: str = "CREATING"
    state_since: float = 0.0
    qr_id: str | None = None
    holds_chips: bool = False
    ready_since: float | None = None
    first_ready_at: float | None = None
    billed_s: float = 0.0
    port: int = TPU_PORT
    termination_time: float | None = None
    epoch: int = 0
    pending_ops: list[str] = field(default_factory=list)
    delete_op: str | None = None
    # (namespace, key) -> value written by the VM. Per VM: gone with the node, kept across stop and start.
    guest_attributes: dict[tuple[str, str], str] = field(default_factory=dict)

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.body.get("labels") or {})

    @property
    def metadata(self) -> dict[str, str]:
        return dict(self.body.get("metadata") or {})


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


@dataclass
class _Fault:
    spec: FaultSpec
    remaining: int


@dataclass(order=True)
class _Event:
    at: float
    seq: int
    action: Callable[..., None] = field(compare=False)
    args: tuple[Any, ...] = field(compare=False, default=())


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


def _node_sort_key(node: SimNode) -> tuple[str, str, float]:
    return node.zone, node.node_id, node.created_at


class World:
    """A simulated Cloud TPU project. Build one from a scenario name, path, mapping or ``Scenario``."""

    def __init__(self, scenario: Scenario | str | dict[str, Any], *, time_scale: float = 0.0, seed: int | None = None):
        self.scenario = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
        if time_scale < 0:
            raise ValueError("time_scale: must be >= 0 (0 = time moves only on advance())")
        self.time_scale = time_scale
        self.seed = self.scenario.seed if seed is None else seed
        self.clock = SimClock(self)
        self._lock = threading.Lock()
        self._listeners: list[Callable[[NodeEvent], None]] = []
        self._pending_events: list[NodeEvent] = []
        self._build()

    # ------------------------------------------------------------------ construction and time

    def _build(self) -> None:
        scenario = self.scenario
        self._rng = random.Random(self.seed)
        self._start = scenario.start_time.timestamp()
        self._now = self._start
        self._manual_offset = 0.0
        self._wall_anchor = time.monotonic()
        self._heap: list[_Event] = []
        self._seq = itertools.count()
        self._events_run = 0
        self._qrs: dict[tuple[str, str], SimQueuedResource] = {}
        self._nodes: dict[tuple[str, str], SimNode] = {}
        self._ops: dict[str, SimOperation] = {}
        self._request_ids: dict[tuple[str, str], tuple[str, float]] = {}
        self._tombstones: dict[tuple[str, str, str], tuple[float, dict[str, Any]]] = {}
        self._pools: dict[tuple[str, str, str], Pool] = {}
        self._waiting: dict[tuple[str, str, str], list[SimQueuedResource]] = {}
        self._dirty: set[tuple[str, str, str]] = set()
        self._create_times: deque[float] = deque()
        self._faults: list[_Fault] = [_Fault(spec, spec.times) for spec in scenario.faults]
        self._events: deque[dict[str, Any]] = deque(maxlen=5000)
        self._event_seq = itertools.count(1)
        self._order = itertools.count()
        self._node_numbers = itertools.count(1)
        self._chip_s_by_tier: dict[str, float] = {}
        self._usd_by_tier: dict[str, float] = {}
        self._usd_by_deployment: dict[str, float] = {}
        self._quota_limits = {(q.id, q.location): q.limit for q in scenario.quotas}
        self._zone_index = {zone: index for index, zone in enumerate(sorted(scenario.zones))}
        for zone, spec in sorted(scenario.zones.items()):
            for family, pools in sorted(spec.capacity.items()):
                for pool_name, pool_spec in sorted(pools.items()):
                    key = (zone, family, pool_name)
                    self._pools[key] = Pool(total=pool_spec.chips)
                    for step in pool_spec.timeline:
                        self._schedule(self._start + step.at_s, self._on_capacity_step, key, step.chips)
                    if pool_spec.poisson is not None:
                        self._schedule_poisson(key)
        from localcloud.tpu_sim.compute import ComputeEngine  # imports this module: loaded on first build

        self.compute: ComputeEngine = ComputeEngine(self)  # TPU VMs through Compute Engine, same pools and meter

    def reset(self) -> None:
        """Back to the scenario's start: same seed, no resources, the clock at the start time."""
        with self._lock:
            self._build()
            self._log("reset", "", "", "world reset to the scenario start")

    def add_node_listener(self, listener: Callable[[NodeEvent], None]) -> None:
        """Call ``listener`` (outside the world lock) when a node turns READY, is preempted, stopped or deleted."""
        with self._lock:
            self._listeners.append(listener)

    def remove_node_listener(self, listener: Callable[[NodeEvent], None]) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """Hold the lock, catch up with virtual time, then (lock released) tell the listeners what happened."""
        pending: list[NodeEvent] = []
        listeners: list[Callable[[NodeEvent], None]] = []
        try:
            with self._lock:
                try:
                    self._catch_up()
                    yield
                finally:
                    pending, self._pending_events = self._pending_events, []
                    listeners = list(self._listeners)
        finally:
            for event in pending:
                for listener in listeners:
                    try:
                        listener(event)
                    except Exception:
                        _log.exception("node listener failed on %s %s/%s", event.kind, event.zone, event.node_id)

    def now(self) -> datetime:
        """The virtual time, UTC-aware."""
        with self._transaction():
            return datetime.fromtimestamp(self._now, UTC)

    def elapsed_s(self) -> float:
        """Virtual seconds since the scenario start."""
        with self._transaction():
            return self._now - self._start

    def advance(self, seconds: float) -> datetime:
        """Move virtual time forward by ``seconds``, running every event that falls due; returns the new now."""
        if seconds < 0 or math.isnan(seconds):
            raise ValueError("seconds: must be a number >= 0 (time only moves forward)")
        with self._transaction():
            self._manual_offset += seconds
            self._run_until(self._target_now())
            return datetime.fromtimestamp(self._now, UTC)

    def sync(self) -> None:
        """Catch up with the wall clock when a time scale is set (a no-op otherwise)."""
        with self._transaction():
            pass

    def _target_now(self) -> float:
        scaled = (time.monotonic() - self._wall_anchor) * self.time_scale if self.time_scale else 0.0
        return self._start + self._manual_offset + scaled

    def _catch_up(self) -> None:
        target = self._target_now()
        if target > self._now or self._dirty:
            self._run_until(max(target, self._now))

    def _run_until(self, target: float) -> None:
        heap = self._heap
        while True:
            if self._dirty:
                self._match()
            if not heap or heap[0].at > target:
                break
            event = heapq.heappop(heap)
            self._now = max(self._now, event.at)
            self._events_run += 1
            event.action(*event.args)
        self._now = max(self._now, target)

    def _schedule(self, at: float, action: Callable[..., None], *args: Any) -> None:
        heapq.heappush(self._heap, _Event(max(at, self._now), next(self._seq), action, args))

    def _after(self, span: tuple[float, float], action: Callable[..., None], *args: Any) -> None:
        low, high = span
        self._schedule(self._now + (low if high <= low else self._rng.uniform(low, high)), action, *args)

    def _timing(self, zone: str, name: str) -> tuple[float, float]:
        override = getattr(self.scenario.zones[zone].timings, name, None) if zone in self.scenario.zones else None
        return override if override is not None else getattr(self.scenario.timings, name)

    # ------------------------------------------------------------------ logging, ids, rendering helpers

    def _log(self, kind: str, zone: str, resource: str, detail: str) -> None:
        self._events.append(
            {
                "seq": next(self._event_seq),
                "time": format_time(self._now),
                "kind": kind,
                "zone": zone,
                "resource": resource,
                "detail": detail,
            }
        )

    def _eid(self) -> str:
        return f"[EID: 0x{self._rng.getrandbits(64):016x}]"

    def _parent(self, zone: str) -> str:
        return f"projects/{self.scenario.project}/locations/{zone}"

    def _qr_name(self, qr: SimQueuedResource) -> str:
        return f"{self._parent(qr.zone)}/queuedResources/{qr.qr_id}"

    def _node_name(self, node: SimNode) -> str:
        return f"{self._parent(node.zone)}/nodes/{node.node_id}"

    def _new_operation(self, zone: str, verb: str, target: str, api_version: str) -> SimOperation:
        millis = int(self._now * 1000)
        suffix = f"{self._rng.getrandbits(52):013x}-{self._rng.getrandbits(32):08x}-{self._rng.getrandbits(32):08x}"
        name = f"{self._parent(zone)}/operations/operation-{millis}-{suffix}"
        op = SimOperation(name=name, zone=zone, verb=verb, target=target, api_version=api_version, created_at=self._now)
        self._ops[name] = op
        return op

    def _finish_op(
        self, op_name: str | None, *, response: dict[str, Any] | None = None, error: dict[str, Any] | None = None
    ) -> None:
        op = self._ops.get(op_name or "")
        if op is None or op.done:
            return
        op.done = True
        op.end_at = self._now
        op.error = error
        op.response = response if error is None else None

    def _render_op(self, op: SimOperation) -> dict[str, Any]:
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
            body["response"] = op.response or {"@type": "type.googleapis.com/google.protobuf.Empty"}
        return body

    def _with_type(self, kind: str, version: str, body: dict[str, Any]) -> dict[str, Any]:
        return {"@type": f"type.googleapis.com/google.cloud.tpu.{version}.{kind}", **body}

    def _set_qr_state(self, qr: SimQueuedResource, state: str, initiator: str = "") -> None:
        qr.state = state
        qr.state_since = self._now
        qr.initiator = initiator
        qr.epoch += 1
        self._log(f"qr.{state.lower()}", qr.zone, qr.qr_id, initiator)

    def _set_node_state(self, node: SimNode, state: str) -> None:
        if node.state == "READY" and state != "READY":
            self._bill(node, preempted=state == "PREEMPTED")
        node.state = state
        node.state_since = self._now
        node.epoch += 1
        if state == "READY":
            node.ready_since = self._now
            if node.first_ready_at is None:
                node.first_ready_at = self._now
        self._log(f"node.{state.lower()}", node.zone, node.node_id, node.qr_id or "")

    def _notify(self, kind: str, node: SimNode) -> None:
        self._pending_events.append(
            NodeEvent(
                kind=kind,
                zone=node.zone,
                node_id=node.node_id,
                queued_resource=node.qr_id,
                accelerator=node.accelerator,
                labels=node.labels,
                metadata=node.metadata,
                ip_address=node.ip_address,
                port=node.port,
            )
        )

    # ------------------------------------------------------------------ capacity

    def _pool(self, zone: str, family: str, pool: str) -> Pool:
        key = (zone, family, pool)
        if key not in self._pools:
            self._pools[key] = Pool()
        return self._pools[key]

    def _on_capacity_step(self, key: tuple[str, str, str], chips: int) -> None:
        pool = self._pool(*key)
        pool.total = chips
        self._dirty.add(key)
        self._log("capacity", key[0], f"{key[1]}/{key[2]}", f"total={chips}")

    def _schedule_poisson(self, key: tuple[str, str, str]) -> None:
        spec = self.scenario.zones[key[0]].capacity[key[1]][key[2]].poisson
        assert spec is not None
        gap = self._rng.expovariate(spec.rate_per_hour / 3600.0)
        self._schedule(self._now + gap, self._on_poisson_arrival, key)

    def _on_poisson_arrival(self, key: tuple[str, str, str]) -> None:
        spec = self.scenario.zones[key[0]].capacity[key[1]][key[2]].poisson
        assert spec is not None
        pool = self._pool(*key)
        pool.total += spec.chips
        self._dirty.add(key)
        self._schedule(
            self._now + self._rng.expovariate(1.0 / spec.hold_s), self._on_poisson_departure, key, spec.chips
        )
        self._schedule_poisson(key)

    def _on_poisson_departure(self, key: tuple[str, str, str], chips: int) -> None:
        pool = self._pool(*key)
        pool.total = max(0, pool.total - chips)

    def _release_chips(self, node: SimNode) -> None:
        if node.holds_chips:
            node.holds_chips = False
            key = (node.zone, node.family, node.pool)
            pool = self._pool(*key)
            pool.used = max(0, pool.used - node.chips)
            self._dirty.add(key)

    def _match(self) -> None:
        dirty, self._dirty = sorted(self._dirty), set()
        for key in dirty:
            self.compute.match(key)  # waiting flex-start instances (queued resources had the earlier turn)
            queue = self._waiting.get(key)
            if not queue:
                continue
            pool = self._pool(*key)
            remaining: list[SimQueuedResource] = []
            for qr in queue:
                if self._qrs.get((qr.zone, qr.qr_id)) is not qr or qr.state != "WAITING_FOR_RESOURCES":
                    continue
                ready = qr.valid_after is None or qr.valid_after <= self._now
                if ready and pool.free >= qr.chips:
                    self._start_provisioning(qr, pool)
                else:
                    remaining.append(qr)
            self._waiting[key] = remaining

    # ------------------------------------------------------------------ queued resources: lifecycle

    def _on_qr_accept(self, qr: SimQueuedResource, epoch: int) -> None:
        if not self._is_current(qr, epoch) or qr.state != "CREATING":
            return
        self._set_qr_state(qr, "ACCEPTED")
        self._finish_op(qr.create_op, response=self._with_type("QueuedResource", qr.api_version, self._render_qr(qr)))
        self._after(self._timing(qr.zone, "wait_s"), self._on_qr_waiting, qr, qr.epoch)

    def _on_flex_refused(self, qr: SimQueuedResource, epoch: int) -> None:
        if not self._is_current(qr, epoch) or qr.state != "CREATING":
            return
        error = {
            "code": 3,
            "message": f'FLEX_START provisioning model is not supported for accelerator type "{qr.accelerator}" '
            f'in location "{qr.zone}"',
        }
        self._finish_op(qr.create_op, error=error)
        if self.scenario.limits.flex_refusal_lingers:
            qr.failed_error = error
            self._set_qr_state(qr, "FAILED")
        else:
            self._remove_qr(qr)

    def _on_qr_waiting(self, qr: SimQueuedResource, epoch: int) -> None:
        if not self._is_current(qr, epoch) or qr.state != "ACCEPTED":
            return
        self._set_qr_state(qr, "WAITING_FOR_RESOURCES")
        key = (qr.zone, qr.family, qr.pool)
        self._waiting.setdefault(key, []).append(qr)
        if qr.valid_after is not None and qr.valid_after > self._now:
            self._schedule(qr.valid_after, self._dirty.add, key)
        else:
            self._dirty.add(key)

    def _is_current(self, qr: SimQueuedResource, epoch: int | None = None) -> bool:
        if self._qrs.get((qr.zone, qr.qr_id)) is not qr:
            return False
        return epoch is None or qr.epoch == epoch

    def _start_provisioning(self, qr: SimQueuedResource, pool: Pool) -> None:
        self._set_qr_state(qr, "PROVISIONING")
        cycling = self.scenario.zones[qr.zone].cycling
        if cycling.probability > 0 and self._rng.random() < cycling.probability:
            qr.cycling = True
            self._log("qr.cycling", qr.zone, qr.qr_id, "provisioning will not complete")
            self._create_qr_nodes(qr, hold_chips=False)
            self._schedule(self._now + cycling.flicker_s, self._on_flicker, qr, qr.epoch)
            if cycling.fail_after_s is not None:
                self._schedule(self._now + cycling.fail_after_s, self._on_cycling_fail, qr, qr.epoch)
            return
        pool.used += qr.chips
        for node in self._create_qr_nodes(qr, hold_chips=True):
            self._after(self._timing(qr.zone, "boot_s"), self._on_node_boot, node, node.epoch)

    def _create_qr_nodes(self, qr: SimQueuedResource, *, hold_chips: bool) -> list[SimNode]:
        nodes = []
        for node_id, body in qr.node_specs:
            node = self._make_node(qr.zone, node_id, body, qr.accelerator, qr.family, qr.chips_per_node, qr.api_version)
            node.pool, node.tier, node.qr_id, node.holds_chips = qr.pool, qr.tier, qr.qr_id, hold_chips
            self._nodes[(qr.zone, node_id)] = node
            self._tombstones.pop(("node", qr.zone, node_id), None)
            nodes.append(node)
        qr.node_ids = [node_id for node_id, _ in qr.node_specs]
        return nodes

    def _make_node(
        self, zone: str, node_id: str, body: dict[str, Any], accelerator: str, family: str, chips: int, version: str
    ) -> SimNode:
        number = next(self._node_numbers)
        zone_octet = self._zone_index.get(zone, 0) % 250
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
            created_at=self._now,
            numeric_id=1_000_000_000_000 + number * 7919,
            ip_address=ip,
            api_version=version,
            state_since=self._now,
        )
        self._log("node.creating", zone, node_id, "")
        return node

    def _on_flicker(self, qr: SimQueuedResource, epoch: int) -> None:
        if not self._is_current(qr, epoch) or qr.state != "PROVISIONING":
            return
        present = [self._nodes.get((qr.zone, node_id)) for node_id in qr.node_ids]
        if any(node is not None for node in present):
            for node in present:
                if node is not None:
                    self._nodes.pop((node.zone, node.node_id), None)
                    self._log("node.vanished", node.zone, node.node_id, qr.qr_id)
        else:
            self._create_qr_nodes(qr, hold_chips=False)
        cycling = self.scenario.zones[qr.zone].cycling
        self._schedule(self._now + cycling.flicker_s, self._on_flicker, qr, epoch)

    def _on_cycling_fail(self, qr: SimQueuedResource, epoch: int) -> None:
        if not self._is_current(qr, epoch) or qr.state != "PROVISIONING":
            return
        error = {
            "code": 8,
            "message": f'Provisioning did not complete: there is no more capacity in the zone "{qr.zone}" '
            f"{self._eid()}",
        }
        self._fail_qr(qr, error)

    def _on_valid_until(self, qr: SimQueuedResource) -> None:
        if not self._is_current(qr) or qr.state not in QR_LIVE_WAITING:
            return
        spec = self.scenario.valid_until_error
        self._fail_qr(qr, {"code": spec.code, "message": spec.message.replace("{zone}", qr.zone)})

    def _fail_qr(self, qr: SimQueuedResource, error: dict[str, Any]) -> None:
        qr.failed_error = error
        if qr.state == "CREATING":
            self._finish_op(qr.create_op, error=error)
        self._set_qr_state(qr, "FAILED")
        for node in self._qr_nodes(qr):
            self._begin_node_delete(node)

    def _qr_nodes(self, qr: SimQueuedResource) -> list[SimNode]:
        nodes = (self._nodes.get((qr.zone, node_id)) for node_id in qr.node_ids)
        return [node for node in nodes if node is not None and node.qr_id == qr.qr_id]

    def _on_node_boot(self, node: SimNode, epoch: int) -> None:
        if self._nodes.get((node.zone, node.node_id)) is not node or node.epoch != epoch or node.state != "CREATING":
            return
        self._set_node_state(node, "READY")
        self._notify("ready", node)
        zone = self.scenario.zones[node.zone]
        if node.tier == "spot":
            self._schedule_preemption(node, zone)
        for op_name in node.pending_ops:
            self._finish_op(op_name, response=self._with_type("Node", node.api_version, self._render_node(node)))
        node.pending_ops.clear()
        qr = self._qrs.get((node.zone, node.qr_id or ""))
        if qr is None or qr.state != "PROVISIONING":
            return
        nodes = self._qr_nodes(qr)
        if len(nodes) == len(qr.node_specs) and all(item.state == "READY" for item in nodes):
            self._set_qr_state(qr, "ACTIVE")
            if qr.tier == "flex_start" and qr.max_run_s:
                qr.termination_time = self._now + qr.max_run_s
                for item in nodes:
                    item.termination_time = qr.termination_time
                self._schedule(qr.termination_time, self._on_flex_end, qr, qr.epoch)

    def _schedule_preemption(self, node: SimNode, zone: ZoneSpec) -> None:
        spec = zone.preemption
        delay: float | None = None
        if spec.early_window_s > 0 and (spec.early_hazard_per_hour + spec.hazard_per_hour) > 0:
            early = self._rng.expovariate((spec.early_hazard_per_hour + spec.hazard_per_hour) / 3600.0)
            if early < spec.early_window_s:
                delay = early
        if delay is None and spec.hazard_per_hour > 0:
            delay = spec.early_window_s + self._rng.expovariate(spec.hazard_per_hour / 3600.0)
        if delay is not None:
            self._schedule(self._now + delay, self._on_hazard, node, node.epoch)

    def _on_hazard(self, node: SimNode, epoch: int) -> None:
        if self._nodes.get((node.zone, node.node_id)) is node and node.epoch == epoch and node.state == "READY":
            self._preempt_node(node)

    def _on_flex_end(self, qr: SimQueuedResource, epoch: int) -> None:
        if not self._is_current(qr, epoch) or qr.state != "ACTIVE":
            return
        self._set_qr_state(qr, "SUSPENDING", "SERVICE")
        nodes = self._qr_nodes(qr)
        for node in nodes:
            self._begin_node_delete(node)
        if not nodes:
            self._set_qr_state(qr, "SUSPENDED", "SERVICE")

    def _preempt_node(self, node: SimNode) -> None:
        self._set_node_state(node, "PREEMPTED")
        self._release_chips(node)
        self._notify("preempted", node)
        for op_name in node.pending_ops:
            op = self._ops.get(op_name)
            verb = op.verb if op else "update"
            self._finish_op(
                op_name,
                error={
                    "code": 3,
                    "message": f"Cloud TPU received a bad request. {verb} is not supported while in state PREEMPTED",
                },
            )
        node.pending_ops.clear()
        qr = self._qrs.get((node.zone, node.qr_id or ""))
        if qr is not None and self.scenario.limits.preempt_suspends_qr and qr.state in ("ACTIVE", "PROVISIONING"):
            self._set_qr_state(qr, "SUSPENDING", "SERVICE")
            self._after(self.scenario.timings.suspend_s, self._on_qr_suspended, qr, qr.epoch)

    def _on_qr_suspended(self, qr: SimQueuedResource, epoch: int) -> None:
        if self._is_current(qr, epoch) and qr.state == "SUSPENDING":
            self._set_qr_state(qr, "SUSPENDED", qr.initiator or "SERVICE")

    def _begin_node_delete(self, node: SimNode, op_name: str | None = None) -> None:
        if node.state == "DELETING":
            return
        self._set_node_state(node, "DELETING")
        node.delete_op = op_name
        for pending in node.pending_ops:
            self._finish_op(
                pending, error={"code": 10, "message": "The node was deleted before the operation finished"}
            )
        node.pending_ops.clear()
        self._after(self._timing(node.zone, "delete_s"), self._on_node_gone, node, node.epoch)

    def _on_node_gone(self, node: SimNode, epoch: int) -> None:
        if self._nodes.get((node.zone, node.node_id)) is not node or node.epoch != epoch:
            return
        self._release_chips(node)
        if self.scenario.limits.list_lag_s:  # lists may still show it for a while
            self._tombstones[("node", node.zone, node.node_id)] = (self._now, self._render_node(node))
        del self._nodes[(node.zone, node.node_id)]
        self._log("node.gone", node.zone, node.node_id, node.qr_id or "")
        self._notify("deleted", node)
        self._finish_op(node.delete_op, response={"@type": "type.googleapis.com/google.protobuf.Empty"})
        qr = self._qrs.get((node.zone, node.qr_id or ""))
        if qr is None or self._qr_nodes(qr):
            return
        if qr.state == "DELETING":
            self._remove_qr(qr)
        elif qr.state == "SUSPENDING":
            self._set_qr_state(qr, "SUSPENDED", qr.initiator or "SERVICE")

    def _remove_qr(self, qr: SimQueuedResource) -> None:
        if self.scenario.limits.list_lag_s:  # lists may still show it for a while
            self._tombstones[("qr", qr.zone, qr.qr_id)] = (self._now, self._render_qr(qr))
        del self._qrs[(qr.zone, qr.qr_id)]
        qr.epoch += 1
        self._log("qr.gone", qr.zone, qr.qr_id, "")
        self._finish_op(qr.delete_op, response={"@type": "type.googleapis.com/google.protobuf.Empty"})

    def _on_qr_delete_finished(self, qr: SimQueuedResource, epoch: int) -> None:
        if self._is_current(qr, epoch) and qr.state == "DELETING" and not self._qr_nodes(qr):
            self._remove_qr(qr)

    # ------------------------------------------------------------------ request checks

    def _check_project(self, project: str) -> None:
        if project != self.scenario.project:
            raise SimApiError(
                403,
                f"Permission denied on resource project {project} (the simulator serves project "
                f"'{self.scenario.project}'; start it with --project {project} or point the client at that project)",
                details=[self._error_info("CONSUMER_INVALID", {"consumer": f"projects/{project}"})],
            )

    def _check_zone(self, zone: str, *, for_list: bool = False) -> ZoneSpec:
        spec = self.scenario.zones.get(zone)
        if spec is None or spec.forbidden:
            info = self._error_info(
                "LOCATION_POLICY_VIOLATED",
                {
                    "consumer": f"projects/{self.scenario.project}",
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

    def _error_info(self, reason: str, metadata: dict[str, str]) -> dict[str, Any]:
        return {
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": reason,
            "domain": "googleapis.com",
            "metadata": metadata,
        }

    def _check_served(self, zone: str, spec: ZoneSpec) -> None:
        if not spec.served:
            raise SimApiError(
                400, f'Cloud TPU received a bad request. The requested zone "{zone}" is not supported. {self._eid()}'
            )

    def _check_accelerator(self, zone: str, spec: ZoneSpec, accelerator: str, runtime: str) -> None:
        if accelerator not in spec.accelerators:
            raise SimApiError(
                400,
                "Cloud TPU received a bad request. The requested accelerator configuration for accelerator type, "
                f'"{accelerator}", could not be found in the zonal accelerator configurations for "{zone}".; '
                f"the accelerator {accelerator} was not found in zone {zone} {self._eid()}",
            )
        if runtime not in spec.runtime_versions:
            raise SimApiError(
                400,
                f'Cloud TPU received a bad request. Runtime version "{runtime}" is unknown in zone {zone} '
                f"(known: {', '.join(spec.runtime_versions)}) {self._eid()}",
            )

    def _check_labels(self, labels: Any, where: str) -> dict[str, str]:
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

    def _parse_accelerator(self, node: dict[str, Any], where: str) -> tuple[str, str, int]:
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

    def _check_quota(self, zone: str, family: str, tier: str, chips: int) -> None:
        if tier == "reservation":
            return
        preemptible = tier == "spot" or (tier == "flex_start" and self.scenario.limits.flex_quota == "preemptible")
        region = zone.rsplit("-", 1)[0]
        exceeded: list[tuple[str, int, str, str]] = []
        for scope, location in (("Region", region), ("Zone", zone)):
            qid = quota_id(family, preemptible=preemptible, scope=scope)
            limit = self._quota_limits.get((qid, location))
            if limit is None:
                continue
            if self._quota_usage(family, preemptible, location) + chips > limit:
                exceeded.append((qid, limit, scope.lower(), location))
        if not exceeded:
            return
        ids = ",".join(item[0] for item in exceeded)
        limits = ",".join(str(item[1]) for item in exceeded)
        where = ",".join(f"{item[2]} {item[3]}" for item in exceeded)
        message = f"Quota limit '{ids}' has been exceeded. Limit: {limits} in {where}."
        violations = [
            {
                "subject": f"projects/{self.scenario.project}",
                "description": f"Quota '{qid}' exhausted. Limit {limit} in {scope} {location}",
            }
            for qid, limit, scope, location in exceeded
        ]
        first = exceeded[0]
        raise SimApiError(
            429,
            message,
            details=[
                {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": violations},
                self._error_info(
                    "QUOTA_EXCEEDED",
                    {"quota_limit": first[0], "quota_location": first[3], "quota_limit_value": str(first[1])},
                ),
            ],
        )

    def _counts_preemptible(self, tier: str) -> bool | None:
        if tier == "reservation":
            return None
        return tier == "spot" or (tier == "flex_start" and self.scenario.limits.flex_quota == "preemptible")

    def _quota_usage(self, family: str, preemptible: bool, location: str) -> int:
        leak = self.scenario.limits.quota_leak
        used = 0
        counted_qrs: set[tuple[str, str]] = set()
        for node in self._nodes.values():
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
            for key, qr in self._qrs.items():
                if key in counted_qrs or qr.family != family or self._counts_preemptible(qr.tier) is not preemptible:
                    continue
                if not (qr.zone == location or qr.zone.rsplit("-", 1)[0] == location):
                    continue
                if qr.state in ("ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING", "FAILED", "SUSPENDED"):
                    used += qr.chips
        return used

    def _check_rate(self) -> None:
        limit = self.scenario.limits.creates_per_minute
        if limit is None:
            return
        window = self._create_times
        while window and window[0] <= self._now - 60.0:
            window.popleft()
        if len(window) >= limit:
            raise SimApiError(
                429,
                "Quota exceeded for quota metric 'Create requests' and limit 'Create requests per minute per project': "
                "Maximum number of CreateNode requests per minute",
                details=[
                    self._error_info(
                        "RATE_LIMIT_EXCEEDED",
                        {"quota_metric": "tpu.googleapis.com/qps/create", "quota_limit_value": str(limit)},
                    )
                ],
            )
        window.append(self._now)

    def _check_queued_limit(self, zone: str) -> None:
        limit = self.scenario.limits.queued_per_zone
        if limit is None:
            return
        queued = sum(1 for qr in self._qrs.values() if qr.zone == zone and qr.state != "DELETING")
        if queued >= limit:
            qid = "TPUQueuedResourcesPerProjectPerZoneForTPUAPI"
            raise SimApiError(
                429,
                f"Quota limit '{qid}' has been exceeded. Limit: {limit} in zone {zone}.",
                details=[
                    {
                        "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                        "violations": [{"subject": f"projects/{self.scenario.project}", "description": qid}],
                    }
                ],
            )

    def _replay_request(self, project: str, request_id: str | None) -> dict[str, Any] | None:
        if not request_id:
            return None
        seen = self._request_ids.get((project, request_id))
        if seen is None:
            return None
        op_name, at = seen
        if self._now - at > self.scenario.limits.idempotency_window_s or op_name not in self._ops:
            return None
        self._log("request.replayed", self._ops[op_name].zone, op_name, request_id)
        return self._render_op(self._ops[op_name])

    def _remember_request(self, project: str, request_id: str | None, op: SimOperation) -> None:
        if request_id:
            self._request_ids[(project, request_id)] = (op.name, self._now)

    # ------------------------------------------------------------------ public API: queued resources

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
        with self._transaction():
            self._check_project(project)
            replay = self._replay_request(project, request_id)
            if replay is not None:
                return replay
            return self._create_qr(zone, qr_id, body, request_id, api_version)

    def _create_qr(
        self, zone: str, qr_id: str | None, body: dict[str, Any], request_id: str | None, api_version: str
    ) -> dict[str, Any]:
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
        parent = self._parent(zone)
        node_specs: list[tuple[str, dict[str, Any]]] = []
        accelerators: set[tuple[str, str, int]] = set()
        runtime = ""
        for index, spec in enumerate(specs):
            where = f"queued_resource.tpu.node_spec[{index}]"
            if not isinstance(spec, dict) or not isinstance(spec.get("node"), dict):
                raise SimApiError(400, f"Invalid value at '{where}.node': required")
            if spec.get("parent") != parent:
                raise SimApiError(
                    400, f"Invalid value at '{where}.parent' ({spec.get('parent')!r}): must be {parent!r}"
                )
            node = spec["node"]
            self._check_labels(node.get("labels"), f"{where}.node.labels")
            runtime = str(node.get("runtimeVersion") or "")
            if not runtime:
                raise SimApiError(400, f"Invalid value at '{where}.node.runtime_version': required")
            accelerators.add(self._parse_accelerator(node, f"{where}.node"))
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
                    raise SimApiError(
                        400, f"Invalid value at '{where}.node_id' ({node_id!r}): required, [A-Za-z0-9_.~+%-]"
                    )
                node_specs.append((node_id, node))
        if len(accelerators) != 1:
            raise SimApiError(400, "Invalid value at 'queued_resource.tpu.node_spec': all nodes must share one type")
        accelerator, family, chips = accelerators.pop()
        tier, pool, model, max_run = self._parse_tier(zone, body, api_version)
        valid_after, valid_until = self._parse_queueing(body.get("queueingPolicy"))

        spec = self._check_zone(zone)
        self._check_served(zone, spec)
        self._check_accelerator(zone, spec, accelerator, runtime)
        if (zone, qr_id) in self._qrs:
            raise SimApiError(409, f"Resource '{parent}/queuedResources/{qr_id}' already exists")
        for node_id, _ in node_specs:
            if (zone, node_id) in self._nodes:
                raise SimApiError(409, f"Resource '{parent}/nodes/{node_id}' already exists")
        flex_refused = model == "flex_start" and "flex_start" not in spec.provisioning_models
        if model not in spec.provisioning_models and not (flex_refused and spec.flex_refusal == "operation"):
            raise SimApiError(
                400,
                f'{model.upper()} provisioning model is not supported for accelerator type "{accelerator}" in '
                f'location "{zone}"',
            )
        if pool.startswith("reservation:") and pool.split(":", 1)[1] not in spec.reservations:
            raise SimApiError(
                400, f"Cloud TPU received a bad request. Reservation {body.get('reservationName')!r} was not found"
            )
        self._check_quota(zone, family, tier, chips * len(node_specs))
        self._check_queued_limit(zone)
        self._check_rate()

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
            created_at=self._now,
            order=next(self._order),
            state_since=self._now,
            valid_after=valid_after,
            valid_until=valid_until,
            max_run_s=max_run,
        )
        self._qrs[(zone, qr_id)] = qr
        self._tombstones.pop(("qr", zone, qr_id), None)
        op = self._new_operation(zone, "create", self._qr_name(qr), api_version)
        qr.create_op = op.name
        self._remember_request(self.scenario.project, request_id, op)
        self._log("qr.creating", zone, qr_id, f"{accelerator} {tier}")
        if flex_refused:
            self._after(self._timing(zone, "flex_refusal_s"), self._on_flex_refused, qr, qr.epoch)
        else:
            self._after(self._timing(zone, "accept_s"), self._on_qr_accept, qr, qr.epoch)
        if valid_until is not None:
            self._schedule(valid_until, self._on_valid_until, qr)
        return self._render_op(op)

    def _parse_tier(self, zone: str, body: dict[str, Any], api_version: str) -> tuple[str, str, str, float | None]:
        """-> (tier, pool, provisioning model, max run seconds)."""
        present = [key for key in ("spot", "guaranteed", "bestEffort") if key in body and body[key] is not None]
        if len(present) > 1:
            raise SimApiError(400, f"Invalid QueuedResource: at most one tier may be set, got {', '.join(present)}")
        model_name = "PROVISIONING_MODEL_UNSPECIFIED"
        if "provisioningModel" in body:
            model_name = parse_enum(
                body["provisioningModel"], PROVISIONING_MODELS, "queued_resource.provisioning_model"
            )
        reservation = body.get("reservationName")
        guaranteed_body = body.get("guaranteed")
        guaranteed: dict[str, Any] = guaranteed_body if isinstance(guaranteed_body, dict) else {}
        max_run: float | None = None
        if model_name == "FLEX_START":
            if present:
                raise SimApiError(400, f"Invalid QueuedResource: FLEX_START cannot be combined with {present[0]}")
            run = body.get("runDuration") or {}
            if "maxRunDuration" not in run:
                raise SimApiError(400, "Invalid value at 'queued_resource.run_duration.max_run_duration': required")
            max_run = parse_duration(run["maxRunDuration"], "queued_resource.run_duration.max_run_duration")
            if not 0 < max_run <= self.scenario.limits.max_run_s:
                raise SimApiError(
                    400,
                    f"Invalid value at 'queued_resource.run_duration.max_run_duration' ({max_run:.0f}s): must be "
                    f"between 1s and {self.scenario.limits.max_run_s:.0f}s (7 days)",
                )
            return "flex_start", "flex_start", "flex_start", max_run
        if model_name == "SPOT" or "spot" in present or "bestEffort" in present:
            return "spot", "spot", "spot", None
        if reservation or model_name == "RESERVATION_BOUND" or guaranteed.get("reserved"):
            name = str(reservation or "").rsplit("/", 1)[-1]
            if not name:
                reservations = self.scenario.zones.get(zone, ZoneSpec()).reservations
                name = reservations[0] if reservations else ""
            return "reservation", f"reservation:{name}", "reservation", None
        return "on_demand", "on_demand", "standard", None

    def _parse_queueing(self, policy: Any) -> tuple[float | None, float | None]:
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
            return None, self._now + parse_duration(value, where)
        if key == "validUntilTime":
            return None, parse_time(value, where)
        if key == "validAfterDuration":
            return self._now + parse_duration(value, where), None
        if key == "validAfterTime":
            return parse_time(value, where), None
        interval = value if isinstance(value, dict) else {}
        start = parse_time(interval["startTime"], f"{where}.startTime") if "startTime" in interval else None
        end = parse_time(interval["endTime"], f"{where}.endTime") if "endTime" in interval else None
        return start, end

    def get_queued_resource(self, project: str, zone: str, qr_id: str) -> dict[str, Any]:
        with self._transaction():
            self._check_project(project)
            self._check_zone(zone)
            qr = self._qrs.get((zone, qr_id))
            if qr is None:
                raise SimApiError(404, f"Resource '{self._parent(zone)}/queuedResources/{qr_id}' was not found")
            return self._render_qr(qr)

    def list_queued_resources(self, project: str, zone: str) -> tuple[list[dict[str, Any]], list[str]]:
        """-> (queued resources, unreachable zones); ``zone`` may be ``-``."""
        with self._transaction():
            self._check_project(project)
            zones, unreachable = self._list_zones(zone)
            items = [qr for qr in self._qrs.values() if qr.zone in zones]
            rendered = self._lagged("qr", items, zones, lambda qr: (qr.zone, qr.qr_id, qr.created_at), self._render_qr)
            return rendered, unreachable

    def _list_zones(self, zone: str) -> tuple[set[str], list[str]]:
        if zone == "-":
            served = {name for name, spec in self.scenario.zones.items() if not spec.forbidden}
            unreachable = sorted(name for name in served if self.scenario.zones[name].unreachable)
            return served - set(unreachable), unreachable
        self._check_zone(zone, for_list=True)
        return {zone}, []

    def _lagged(
        self,
        kind: str,
        items: Iterable[Any],
        zones: set[str],
        key: Callable[[Any], tuple[str, str, float]],
        render: Callable[[Any], dict[str, Any]],
    ) -> list[dict[str, Any]]:
        lag = self.scenario.limits.list_lag_s
        out: list[tuple[str, str, dict[str, Any]]] = []
        for item in items:
            zone, name, created = key(item)
            if lag and self._now - created < lag:
                continue
            out.append((zone, name, render(item)))
        if lag:
            for (tomb_kind, zone, name), (gone_at, body) in self._tombstones.items():
                if tomb_kind == kind and zone in zones and self._now - gone_at < lag:
                    out.append((zone, name, body))
        out.sort(key=lambda entry: (entry[0], entry[1]))
        return [body for _, _, body in out]

    def delete_queued_resource(
        self, project: str, zone: str, qr_id: str, *, force: bool = False, request_id: str | None = None
    ) -> dict[str, Any]:
        """DELETE …/queuedResources/{id}: the §9 force rules; nodes first, then the queued resource."""
        with self._transaction():
            self._check_project(project)
            replay = self._replay_request(project, request_id)
            if replay is not None:
                return replay
            self._check_zone(zone)
            qr = self._qrs.get((zone, qr_id))
            if qr is None:
                raise SimApiError(404, f"Resource '{self._parent(zone)}/queuedResources/{qr_id}' was not found")
            if qr.state == "DELETING" and qr.delete_op:
                return self._render_op(self._ops[qr.delete_op])
            nodes = self._qr_nodes(qr)
            allowed_states = {"ACCEPTED", "FAILED", "SUSPENDED"}
            if self.scenario.limits.delete_waiting_without_force:
                allowed_states.add("WAITING_FOR_RESOURCES")
            nodes_gone = not nodes and qr.state != "WAITING_FOR_RESOURCES"
            if not force and not nodes_gone and qr.state not in allowed_states:
                raise SimApiError(
                    400,
                    f"Cannot delete queued resource '{self._qr_name(qr)}' in state {qr.state} without force"
                    f"{': it still has nodes' if nodes else ''}. Delete its nodes first or retry with force=true.",
                    status="FAILED_PRECONDITION",
                )
            op = self._new_operation(zone, "delete", self._qr_name(qr), "v2")
            self._remember_request(project, request_id, op)
            if qr.state == "CREATING":
                self._finish_op(
                    qr.create_op,
                    error={"code": 10, "message": "The queued resource was deleted before it was accepted"},
                )
            self._set_qr_state(qr, "DELETING", "USER")
            qr.delete_op = op.name
            for node in nodes:
                self._begin_node_delete(node)
            if not nodes:
                self._after(self._timing(zone, "accept_s"), self._on_qr_delete_finished, qr, qr.epoch)
            return self._render_op(op)

    def reset_queued_resource(self, project: str, zone: str, qr_id: str) -> dict[str, Any]:
        """POST …:reset: drop the nodes and queue the request again (allowed when ACTIVE, SUSPENDED or FAILED)."""
        with self._transaction():
            self._check_project(project)
            self._check_zone(zone)
            qr = self._qrs.get((zone, qr_id))
            if qr is None:
                raise SimApiError(404, f"Resource '{self._parent(zone)}/queuedResources/{qr_id}' was not found")
            if qr.state not in ("ACTIVE", "SUSPENDED", "FAILED"):
                raise SimApiError(
                    400,
                    f"Cannot reset queued resource '{self._qr_name(qr)}' in state {qr.state}",
                    status="FAILED_PRECONDITION",
                )
            for node in self._qr_nodes(qr):
                self._release_chips(node)
                if node.state == "READY":
                    self._bill(node, preempted=False)
                self._nodes.pop((zone, node.node_id), None)
                self._notify("deleted", node)
            qr.failed_error = None
            qr.termination_time = None
            qr.cycling = False
            self._set_qr_state(qr, "ACCEPTED")
            self._after(self._timing(zone, "wait_s"), self._on_qr_waiting, qr, qr.epoch)
            op = self._new_operation(zone, "reset", self._qr_name(qr), "v2")
            self._finish_op(op.name, response=self._with_type("QueuedResource", "v2", self._render_qr(qr)))
            return self._render_op(op)

    # ------------------------------------------------------------------ public API: nodes

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
        with self._transaction():
            self._check_project(project)
            replay = self._replay_request(project, request_id)
            if replay is not None:
                return replay
            if not isinstance(node_id, str) or not RESOURCE_ID.match(node_id):
                raise SimApiError(400, f"Invalid value for nodeId ({node_id!r}): use 1-63 lowercase letters, digits, -")
            if not isinstance(body, dict):
                raise SimApiError(400, "Invalid JSON payload: the body must be a Node object")
            self._check_labels(body.get("labels"), "node.labels")
            runtime = str(body.get("runtimeVersion") or "")
            if not runtime:
                raise SimApiError(400, "Invalid value at 'node.runtime_version': required")
            accelerator, family, chips = self._parse_accelerator(body, "node")
            scheduling = body.get("schedulingConfig") or {}
            spec = self._check_zone(zone)
            self._check_served(zone, spec)
            self._check_accelerator(zone, spec, accelerator, runtime)
            if (zone, node_id) in self._nodes:
                raise SimApiError(409, f"Resource '{self._parent(zone)}/nodes/{node_id}' already exists")
            if scheduling.get("spot") or scheduling.get("preemptible"):
                tier, pool = "spot", "spot"
            elif scheduling.get("reserved"):
                tier, pool = "reservation", f"reservation:{spec.reservations[0] if spec.reservations else ''}"
            else:
                tier, pool = "on_demand", "on_demand"
            self._check_quota(zone, family, tier, chips)
            self._check_rate()
            node = self._make_node(zone, node_id, body, accelerator, family, chips, api_version)
            node.tier, node.pool = tier, pool
            self._nodes[(zone, node_id)] = node
            self._tombstones.pop(("node", zone, node_id), None)
            op = self._new_operation(zone, "create", self._node_name(node), api_version)
            node.pending_ops.append(op.name)
            self._remember_request(project, request_id, op)
            self._after(self._timing(zone, "capacity_check_s"), self._on_node_capacity_check, node, node.epoch)
            return self._render_op(op)

    def _on_node_capacity_check(self, node: SimNode, epoch: int) -> None:
        if self._nodes.get((node.zone, node.node_id)) is not node or node.epoch != epoch or node.state != "CREATING":
            return
        pool = self._pool(node.zone, node.family, node.pool)
        if pool.free >= node.chips:
            pool.used += node.chips
            node.holds_chips = True
            self._after(self._timing(node.zone, "boot_s"), self._on_node_boot, node, node.epoch)
            return
        variant = self.scenario.zones[node.zone].stockout_error
        error: dict[str, Any]
        if variant == "internal":
            error = {"code": 13, "message": "an internal error has occurred"}
        elif variant == "reservation":
            error = {
                "code": 9,
                "message": "Insufficient reserved capacity. Contact customer support to increase your reservation. "
                + self._eid(),
            }
        else:
            error = {
                "code": 8,
                "message": f'There is no more capacity in the zone "{node.zone}"; you can try in another zone where '
                f"Cloud TPU Nodes are offered (see https://cloud.google.com/tpu/docs/regions) {self._eid()}",
            }
        for op_name in node.pending_ops:
            self._finish_op(op_name, error=error)
        node.pending_ops.clear()
        del self._nodes[(node.zone, node.node_id)]
        self._log("node.stockout", node.zone, node.node_id, error["message"][:80])

    def get_node(self, project: str, zone: str, node_id: str) -> dict[str, Any]:
        with self._transaction():
            self._check_project(project)
            self._check_zone(zone)
            return self._render_node(self._require_node(zone, node_id))

    def _require_node(self, zone: str, node_id: str) -> SimNode:
        node = self._nodes.get((zone, node_id))
        if node is None:
            raise SimApiError(404, f"Resource '{self._parent(zone)}/nodes/{node_id}' was not found")
        return node

    def list_nodes(self, project: str, zone: str) -> tuple[list[dict[str, Any]], list[str]]:
        with self._transaction():
            self._check_project(project)
            zones, unreachable = self._list_zones(zone)
            items = [node for node in self._nodes.values() if node.zone in zones]
            return self._lagged("node", items, zones, _node_sort_key, self._render_node), unreachable

    def delete_node(self, project: str, zone: str, node_id: str, *, request_id: str | None = None) -> dict[str, Any]:
        """DELETE …/nodes/{id}; deleting a queued resource's node suspends that queued resource (USER)."""
        with self._transaction():
            self._check_project(project)
            replay = self._replay_request(project, request_id)
            if replay is not None:
                return replay
            self._check_zone(zone)
            node = self._require_node(zone, node_id)
            if node.state == "DELETING" and node.delete_op:
                return self._render_op(self._ops[node.delete_op])
            op = self._new_operation(zone, "delete", self._node_name(node), "v2")
            self._remember_request(project, request_id, op)
            qr = self._qrs.get((zone, node.qr_id or ""))
            self._begin_node_delete(node, op.name)
            if qr is not None and qr.state in ("ACTIVE", "PROVISIONING"):
                self._set_qr_state(qr, "SUSPENDING", "USER")
            return self._render_op(op)

    def stop_node(self, project: str, zone: str, node_id: str) -> dict[str, Any]:
        return self._stop_start(project, zone, node_id, stop=True)

    def start_node(self, project: str, zone: str, node_id: str) -> dict[str, Any]:
        return self._stop_start(project, zone, node_id, stop=False)

    def _stop_start(self, project: str, zone: str, node_id: str, *, stop: bool) -> dict[str, Any]:
        with self._transaction():
            self._check_project(project)
            self._check_zone(zone)
            node = self._require_node(zone, node_id)
            verb = "stop" if stop else "start"
            expected = "READY" if stop else "STOPPED"
            if node.state != expected:
                raise SimApiError(
                    400,
                    f"Cloud TPU received a bad request. {verb} is not supported while in state {node.state}",
                    status="FAILED_PRECONDITION",
                )
            self._set_node_state(node, "STOPPING" if stop else "STARTING")
            op = self._new_operation(zone, verb, self._node_name(node), node.api_version)
            node.pending_ops.append(op.name)
            span = self.scenario.timings.stop_s if stop else self.scenario.timings.start_s
            self._after(span, self._on_stop_start_done, node, node.epoch, stop)
            return self._render_op(op)

    def _on_stop_start_done(self, node: SimNode, epoch: int, stop: bool) -> None:
        if self._nodes.get((node.zone, node.node_id)) is not node or node.epoch != epoch:
            return
        self._set_node_state(node, "STOPPED" if stop else "READY")
        self._notify("stopped" if stop else "started", node)
        if not stop and node.tier == "spot":
            self._schedule_preemption(node, self.scenario.zones[node.zone])
        for op_name in node.pending_ops:
            self._finish_op(op_name, response=self._with_type("Node", node.api_version, self._render_node(node)))
        node.pending_ops.clear()

    def update_node(
        self, project: str, zone: str, node_id: str, body: dict[str, Any], update_mask: str
    ) -> dict[str, Any]:
        """PATCH …/nodes/{id}: labels, metadata, description or tags; refused on a PREEMPTED node (LRO code 3)."""
        with self._transaction():
            self._check_project(project)
            self._check_zone(zone)
            node = self._require_node(zone, node_id)
            fields = [item.strip() for item in update_mask.split(",") if item.strip()]
            allowed = {"labels", "metadata", "description", "tags"}
            unknown = [item for item in fields if item not in allowed]
            if not fields or unknown:
                raise SimApiError(
                    400, f"Invalid update_mask {update_mask!r}: use a comma list of {', '.join(sorted(allowed))}"
                )
            op = self._new_operation(zone, "update", self._node_name(node), node.api_version)
            if node.state == "PREEMPTED":
                self._finish_op(
                    op.name,
                    error={
                        "code": 3,
                        "message": "Cloud TPU received a bad request. update is not supported while in state PREEMPTED",
                    },
                )
                return self._render_op(op)
            if "labels" in fields:
                self._check_labels(body.get("labels"), "node.labels")
            for item in fields:
                node.body[item] = body.get(item)
            self._finish_op(op.name, response=self._with_type("Node", node.api_version, self._render_node(node)))
            return self._render_op(op)

    # ------------------------------------------------------------------ public API: operations and catalogue

    def get_operation(self, project: str, zone: str, op_id: str) -> dict[str, Any]:
        with self._transaction():
            self._check_project(project)
            op = self._ops.get(f"{self._parent(zone)}/operations/{op_id}")
            if op is None:
                raise SimApiError(404, f"Operation '{self._parent(zone)}/operations/{op_id}' was not found")
            return self._render_op(op)

    def list_operations(self, project: str, zone: str) -> list[dict[str, Any]]:
        with self._transaction():
            self._check_project(project)
            zones, _ = self._list_zones(zone)
            return [self._render_op(op) for op in self._ops.values() if op.zone in zones]

    def cancel_operation(self, project: str, zone: str, op_id: str) -> None:
        with self._transaction():
            self._check_project(project)
            op = self._ops.get(f"{self._parent(zone)}/operations/{op_id}")
            if op is None:
                raise SimApiError(404, f"Operation '{self._parent(zone)}/operations/{op_id}' was not found")
            op.cancel_requested = True

    def delete_operation(self, project: str, zone: str, op_id: str) -> None:
        with self._transaction():
            self._check_project(project)
            if self._ops.pop(f"{self._parent(zone)}/operations/{op_id}", None) is None:
                raise SimApiError(404, f"Operation '{self._parent(zone)}/operations/{op_id}' was not found")

    def accelerator_types(self, project: str, zone: str) -> list[dict[str, Any]]:
        with self._transaction():
            self._check_project(project)
            spec = self._check_zone(zone)
            out = []
            for accelerator in spec.accelerators if spec.served else ():
                family, _, size = accelerator.rpartition("-")
                out.append(
                    {
                        "name": f"{self._parent(zone)}/acceleratorTypes/{accelerator}",
                        "type": accelerator,
                        "acceleratorConfigs": [{"type": config_type_of(family), "topology": topology_of(int(size))}],
                    }
                )
            return out

    def runtime_versions(self, project: str, zone: str) -> list[dict[str, Any]]:
        with self._transaction():
            self._check_project(project)
            spec = self._check_zone(zone)
            return [
                {"name": f"{self._parent(zone)}/runtimeVersions/{version}", "version": version}
                for version in (spec.runtime_versions if spec.served else ())
            ]

    def locations(self, project: str) -> list[dict[str, Any]]:
        with self._transaction():
            self._check_project(project)
            return [
                {"name": self._parent(zone), "locationId": zone, "displayName": zone}
                for zone, spec in sorted(self.scenario.zones.items())
                if not spec.forbidden
            ]

    def location(self, project: str, zone: str) -> dict[str, Any]:
        with self._transaction():
            self._check_project(project)
            self._check_zone(zone)
            return {"name": self._parent(zone), "locationId": zone, "displayName": zone}

    # ------------------------------------------------------------------ rendering

    def _render_qr(self, qr: SimQueuedResource) -> dict[str, Any]:
        body: dict[str, Any] = {
            "name": self._qr_name(qr),
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

    def _render_node(self, node: SimNode) -> dict[str, Any]:
        family = node.family
        body: dict[str, Any] = {
            key: value
            for key, value in node.body.items()
            if key in ("description", "networkConfig", "serviceAccount", "labels", "metadata", "tags", "dataDisks")
        }
        scheduling = dict(node.body.get("schedulingConfig") or {})
        if node.termination_time is not None:
            scheduling["terminationTimestamp"] = format_time(node.termination_time)
        if scheduling:
            body["schedulingConfig"] = scheduling
        body.update(
            {
                "name": self._node_name(node),
                "acceleratorType": node.accelerator,
                "acceleratorConfig": {"type": config_type_of(family), "topology": topology_of(node.chips)},
                "runtimeVersion": node.runtime_version,
                "state": node.state,
                "createTime": format_time(node.created_at),
                "id": str(node.numeric_id),
                "apiVersion": "V2" if node.api_version == "v2" else "V2_ALPHA1",
            }
        )
        if node.state in ("READY", "STOPPING", "STOPPED", "STARTING", "PREEMPTED", "DELETING"):
            body["networkEndpoints"] = [{"ipAddress": node.ip_address, "port": node.port}]
        if node.state == "READY":
            body["health"] = "HEALTHY"
        if node.qr_id:
            body["queuedResource"] = f"{self._parent(node.zone)}/queuedResources/{node.qr_id}"
        return body

    # ------------------------------------------------------------------ admin and test helpers

    def set_capacity(self, zone: str, pool: str, chips: int, *, family: str = "v6e") -> None:
        """Set a pool's supply now (later timeline steps still apply)."""
        if zone not in self.scenario.zones:
            raise ValueError(f"zone: {zone!r} is not in the scenario (known: {', '.join(sorted(self.scenario.zones))})")
        if pool not in ("on_demand", "spot", "flex_start") and not pool.startswith("reservation:"):
            raise ValueError("pool: use on_demand, spot, flex_start or reservation:<name>")
        if chips < 0:
            raise ValueError("chips: must be >= 0")
        with self._transaction():
            self._on_capacity_step((zone, family, pool), chips)

    def preempt(
        self, zone: str, *, node: str | None = None, queued_resource: str | None = None, instance: str | None = None
    ) -> list[str]:
        """Preempt one node, every node of a queued resource (also while PROVISIONING), or one Compute Engine
        instance; returns the names hit."""
        if instance is not None:
            return self.compute.preempt(zone, instance)
        with self._transaction():
            if queued_resource is not None:
                qr = self._qrs.get((zone, queued_resource))
                if qr is None:
                    raise KeyError(f"queued_resource: {zone}/{queued_resource} does not exist")
                targets = self._qr_nodes(qr)
            elif node is not None:
                found = self._nodes.get((zone, node))
                if found is None:
                    raise KeyError(f"node: {zone}/{node} does not exist")
                targets = [found]
            else:
                raise ValueError("preempt: name a node or a queued_resource")
            hit = []
            for target in targets:
                if target.state in ("READY", "CREATING", "STARTING", "STOPPING", "REPAIRING"):
                    self._preempt_node(target)
                    hit.append(target.node_id)
            return hit

    def set_node_endpoint(self, zone: str, node_id: str, ip_address: str, port: int) -> dict[str, Any]:
        """Point a node's networkEndpoints at a real server (the node runtime attaches vLLM here)."""
        if not 0 < port < 65536:
            raise ValueError("port: must be 1-65535")
        with self._transaction():
            node = self._nodes.get((zone, node_id)) or self.compute.node(zone, node_id)
            if node is None:
                raise KeyError(f"node: {zone}/{node_id} does not exist")
            node.ip_address = ip_address
            node.port = port
            self._log("node.endpoint", zone, node_id, f"{ip_address}:{port}")
            return self._render_node(node)

    # ------------------------------------------------------------------ guest attributes

    def _vm(self, zone: str, node_id: str) -> SimNode:
        """A TPU API node or a Compute Engine instance by name; KeyError when neither exists."""
        node = self._nodes.get((zone, node_id)) or self.compute.node(zone, node_id)
        if node is None:
            raise KeyError(f"node: {zone}/{node_id} does not exist")
        return node

    def put_guest_attribute(self, zone: str, node_id: str, namespace: str, key: str, value: str) -> None:
        """What the VM's metadata server does on ``PUT guest-attributes/NS/KEY``. Attributes belong to the VM: they
        go with the node when it is deleted and are kept across a stop and start, as nothing in Google's documents
        says they are cleared (so a new boot first sees the last boot's values: readers must cope)."""
        _check_guest_name("namespace", namespace)
        _check_guest_name("key", key)
        with self._transaction():
            self._vm(zone, node_id).guest_attributes[(namespace, key)] = str(value)

    def delete_guest_attribute(self, zone: str, node_id: str, namespace: str, key: str) -> None:
        """``DELETE guest-attributes/NS/KEY``: gone (no error when it was not there); KeyError for an unknown node."""
        with self._transaction():
            self._vm(zone, node_id).guest_attributes.pop((namespace, key), None)

    def guest_attributes(self, zone: str, node_id: str, query_path: str = "") -> list[tuple[str, str, str]]:
        """(namespace, key, value) under ``query_path`` (``""`` or ``/``: all, ``NS/``: a namespace, ``NS/KEY``:
        one key), sorted; KeyError for an unknown node."""
        with self._transaction():
            return _guest_items(self._vm(zone, node_id), query_path)

    def get_guest_attributes(self, project: str, zone: str, node_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """``POST …/nodes/N:getGuestAttributes`` as the TPU API answers: an entry per worker asked for that has
        something under ``queryPath`` (a simulated node has worker 0 only), in worker order; the v2
        ``GuestAttributes`` message carries no worker id."""
        query_path = str(body.get("queryPath") or "")
        workers = [str(worker) for worker in body.get("workerIds") or []]
        with self._transaction():
            self._check_project(project)
            self._check_zone(zone)
            found = _guest_items(self._require_node(zone, node_id), query_path)
        if (workers and "0" not in workers) or not found:
            return {"guestAttributes": []}
        items = [{"namespace": ns, "key": key, "value": value} for ns, key, value in found]
        return {"guestAttributes": [{"queryPath": query_path, "queryValue": {"items": items}}]}

    def inject_fault(self, spec: FaultSpec | dict[str, Any]) -> None:
        """Answer the next ``times`` calls of ``endpoint`` (e.g. get_operation, or ``*``) with an error."""
        fault = spec if isinstance(spec, FaultSpec) else FaultSpec.model_validate(spec)
        with self._lock:
            self._faults.append(_Fault(fault, fault.times))

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def take_fault(self, endpoint: str) -> FaultSpec | None:
        """The fault to apply to this call, if any (consumes one of its ``times``)."""
        with self._lock:
            for fault in self._faults:
                if fault.remaining > 0 and fault.spec.endpoint in (endpoint, "*"):
                    fault.remaining -= 1
                    return fault.spec
            return None

    def faults(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{**fault.spec.model_dump(), "remaining": fault.remaining} for fault in self._faults]

    def qr_state(self, zone: str, qr_id: str) -> str | None:
        """The queued resource's state, or None when it does not exist."""
        with self._transaction():
            qr = self._qrs.get((zone, qr_id))
            return qr.state if qr else None

    def node_state(self, zone: str, node_id: str) -> str | None:
        """The node's state, or None when it does not exist."""
        with self._transaction():
            node = self._nodes.get((zone, node_id))
            return node.state if node else None

    def queued_resource(self, zone: str, qr_id: str) -> dict[str, Any] | None:
        """The queued resource as the API would render it, or None."""
        with self._transaction():
            qr = self._qrs.get((zone, qr_id))
            return self._render_qr(qr) if qr else None

    def node(self, zone: str, node_id: str) -> dict[str, Any] | None:
        """The node as the API would render it, or None."""
        with self._transaction():
            node = self._nodes.get((zone, node_id))
            return self._render_node(node) if node else None

    def pool(self, zone: str, pool: str, family: str = "v6e") -> dict[str, int]:
        """``{total, used, free}`` chips of one pool."""
        with self._transaction():
            found = self._pool(zone, family, pool)
            return {"total": found.total, "used": found.used, "free": found.free}

    def events(self, since: int = 0) -> list[dict[str, Any]]:
        """The event log (newest last), from sequence number ``since`` on."""
        with self._lock:
            return [event for event in self._events if event["seq"] > since]

    # ------------------------------------------------------------------ billing and invariants

    def _bill(self, node: SimNode, *, preempted: bool) -> None:
        """Close a READY span; a preemption within the free window refunds the node's whole bill."""
        if node.ready_since is None:
            return
        span = self._now - node.ready_since
        node.ready_since = None
        free_window = self.scenario.limits.free_preemption_s
        if preempted and node.first_ready_at is not None and self._now - node.first_ready_at < free_window:
            self._charge(node, -node.billed_s)
            node.billed_s = 0.0
            return
        node.billed_s += span
        self._charge(node, span)

    def _charge(self, node: SimNode, seconds: float) -> None:
        price = self.scenario.price(node.zone.rsplit("-", 1)[0], node.tier, node.family)
        usd = seconds * node.chips / 3600.0 * price
        owner = node.labels.get(LABEL_DEPLOYMENT, "")
        self._chip_s_by_tier[node.tier] = self._chip_s_by_tier.get(node.tier, 0.0) + seconds * node.chips
        self._usd_by_tier[node.tier] = self._usd_by_tier.get(node.tier, 0.0) + usd
        self._usd_by_deployment[owner] = self._usd_by_deployment.get(owner, 0.0) + usd

    def billing(self) -> dict[str, Any]:
        """Chip-hours and USD by tier and by deployment, including nodes READY right now."""
        with self._transaction():
            return self._billing_locked()

    def _billing_locked(self) -> dict[str, Any]:
        chip_s = dict(self._chip_s_by_tier)
        usd_tier = dict(self._usd_by_tier)
        usd_owner = dict(self._usd_by_deployment)
        for node in [*self._nodes.values(), *self.compute.billable()]:
            if node.ready_since is None:
                continue
            span = self._now - node.ready_since
            usd = span * node.chips / 3600.0 * self.scenario.price(node.zone.rsplit("-", 1)[0], node.tier, node.family)
            owner = node.labels.get(LABEL_DEPLOYMENT, "")
            chip_s[node.tier] = chip_s.get(node.tier, 0.0) + span * node.chips
            usd_tier[node.tier] = usd_tier.get(node.tier, 0.0) + usd
            usd_owner[owner] = usd_owner.get(owner, 0.0) + usd
        return {
            "by_tier": {
                tier: {"chip_hours": round(seconds / 3600.0, 6), "usd": round(usd_tier.get(tier, 0.0), 6)}
                for tier, seconds in sorted(chip_s.items())
            },
            "by_deployment": {owner or "(unlabelled)": round(usd, 6) for owner, usd in sorted(usd_owner.items())},
            "total_chip_hours": round(sum(chip_s.values()) / 3600.0, 6),
            "total_usd": round(sum(usd_tier.values()), 6),
        }

    def invariants(
        self, live_deployments: Iterable[str] | None = None, *, max_leftover_s: float = 600.0
    ) -> dict[str, Any]:
        """Orphans, leftovers (FAILED/SUSPENDED queued resources, PREEMPTED nodes), billing, duplicate ACTIVE.

        ``live_deployments``: the deployment ids the caller still has; a resource labelled with any other
        id is an orphan. None means "only unlabelled resources are orphans".
        """
        live = set(live_deployments) if live_deployments is not None else None
        with self._transaction():
            orphans = []
            resources: list[tuple[str, str, str, dict[str, str]]] = [
                ("queued_resource", qr.zone, qr.qr_id, qr.labels) for qr in self._qrs.values() if qr.state != "DELETING"
            ]
            resources += [
                ("node", node.zone, node.node_id, node.labels)
                for node in self._nodes.values()
                if node.qr_id is None and node.state != "DELETING"
            ]
            instance_leftovers: list[dict[str, Any]] = []
            instance_active: dict[str, list[str]] = {}
            self.compute.add_invariants(resources, instance_leftovers, instance_active, max_leftover_s)
            for kind, zone, name, labels in sorted(resources):
                owner = labels.get(LABEL_DEPLOYMENT)
                if owner is None:
                    orphans.append({"kind": kind, "zone": zone, "name": name, "reason": "no tpuctl-deployment label"})
                elif live is not None and owner not in live:
                    orphans.append(
                        {"kind": kind, "zone": zone, "name": name, "reason": f"deployment {owner!r} is gone"}
                    )
            leftovers = []
            for qr in sorted(self._qrs.values(), key=lambda item: (item.zone, item.qr_id)):
                if qr.state in LEFTOVER_QR_STATES:
                    age = self._now - qr.state_since
                    leftovers.append(
                        self._leftover("queued_resource", qr.zone, qr.qr_id, qr.state, age, max_leftover_s)
                    )
            for node in sorted(self._nodes.values(), key=lambda item: (item.zone, item.node_id)):
                if node.state == "PREEMPTED":
                    age = self._now - node.state_since
                    leftovers.append(self._leftover("node", node.zone, node.node_id, node.state, age, max_leftover_s))
            leftovers += instance_leftovers
            active: dict[str, list[str]] = {owner: list(names) for owner, names in instance_active.items()}
            for qr in self._qrs.values():
                owner = qr.labels.get(LABEL_DEPLOYMENT)
                if owner and qr.state == "ACTIVE":
                    active.setdefault(owner, []).append(f"{qr.zone}/{qr.qr_id}")
            for node in self._nodes.values():
                owner = node.labels.get(LABEL_DEPLOYMENT)
                if owner and node.qr_id is None and node.state == "READY":
                    active.setdefault(owner, []).append(f"{node.zone}/{node.node_id}")
            duplicates = {owner: sorted(names) for owner, names in sorted(active.items()) if len(names) > 1}
            stale = [item for item in leftovers if item["too_old"]]
            return {
                "time": format_time(self._now),
                "orphans": orphans,
                "leftovers": leftovers,
                "duplicate_active": duplicates,
                "billing": self._billing_locked(),
                "ok": not orphans and not stale and not duplicates,
            }

    def _leftover(self, kind: str, zone: str, name: str, state: str, age: float, limit: float) -> dict[str, Any]:
        return {
            "kind": kind,
            "zone": zone,
            "name": name,
            "state": state,
            "age_s": round(age, 3),
            "too_old": age > limit,
        }

    def state(self, *, events: int = 200) -> dict[str, Any]:
        """Everything: resources, pools, quota usage, billing and the last ``events`` log entries."""
        with self._transaction():
            quota = []
            for (qid, location), limit in sorted(self._quota_limits.items()):
                family, preemptible = family_of_quota(qid)
                usage = self._quota_usage(family, preemptible, location)
                quota.append({"id": qid, "location": location, "limit": limit, "usage": usage})
            return {
                "project": self.scenario.project,
                "scenario": self.scenario.name,
                "time": format_time(self._now),
                "elapsed_s": self._now - self._start,
                "time_scale": self.time_scale,
                "queued_resources": [
                    {**self._render_qr(qr), "sim": {"tier": qr.tier, "pool": qr.pool, "cycling": qr.cycling}}
                    for qr in sorted(self._qrs.values(), key=lambda item: (item.zone, item.qr_id))
                ],
                "nodes": [
                    {**self._render_node(node), "sim": {"tier": node.tier, "billed_s": node.billed_s}}
                    for node in sorted(self._nodes.values(), key=lambda item: (item.zone, item.node_id))
                ],
                "pools": [
                    {"zone": zone, "family": family, "pool": pool, "total": item.total, "used": item.used}
                    for (zone, family, pool), item in sorted(self._pools.items())
                ],
                "quota": quota,
                "compute": self.compute.state(),
                "billing": self._billing_locked(),
                "operations": len(self._ops),
                "pending_events": len(self._heap),
                "events_run": self._events_run,
                "events": list(self._events)[-events:] if events else [],
            }

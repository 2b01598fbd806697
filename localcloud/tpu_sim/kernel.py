"""The shared kernel of the simulated world: virtual clock, event heap, RNG, transactions, capacity pools,
billing meter, event log and node listeners.

Both simulations of one world, the TPU API (queued resources and nodes) and Compute Engine (TPU VM
instances), run on one kernel, because they draw on the same physical chips: one clock, one pool per
(zone, family, pool), one meter and one seeded RNG consumed in event order, so a scenario replays
identically for the same calls whichever API the calls go through.

Time is virtual. It moves only when ``advance()`` is called, or, with ``time_scale > 0``, with the wall
clock multiplied by the scale. Work is event driven: every future happening (an operation finishing, a
node booting, capacity arriving, a spot preemption) is an entry in one heap, so advancing 24 hours costs
one step per event rather than one per second. Matching waiting requests to free chips runs only for
pools whose supply or demand changed (the dirty set), through the matchers the composer registers.

Thread safety: one lock guards the world; node listeners are called after the lock is released, so a
listener may call back into the world.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from localcloud.tpu_sim.scenario import PreemptionSpec, Scenario
from localcloud.tpu_sim.wire import format_time

__all__ = [
    "LABEL_DEPLOYMENT",
    "TPU_PORT",
    "NodeEvent",
    "NodeListener",
    "Pool",
    "PoolKey",
    "SimKernel",
    "SimNode",
    "leftover_entry",
]

_log = logging.getLogger("localcloud.tpu_sim.world")  # the name listener failures were always logged under

LABEL_DEPLOYMENT = "tpuctl-deployment"
TPU_PORT = 8470

PoolKey = tuple[str, str, str]  # (zone, family, pool)


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


NodeListener = Callable[[NodeEvent], None]


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


@dataclass(order=True)
class _Event:
    at: float
    seq: int
    action: Callable[..., None] = field(compare=False)
    args: tuple[Any, ...] = field(compare=False, default=())


def leftover_entry(kind: str, zone: str, name: str, state: str, age: float, limit: float) -> dict[str, Any]:
    """One ``leftovers`` entry of the invariants report."""
    return {
        "kind": kind,
        "zone": zone,
        "name": name,
        "state": state,
        "age_s": round(age, 3),
        "too_old": age > limit,
    }


@dataclass
class CreateRate:
    """Creates in the last rolling minute, for an API's ``creates_per_minute`` limit (each API keeps its own and
    refuses in its own words)."""

    times: deque[float] = field(default_factory=deque)

    def admit(self, now_s: float, limit: int) -> bool:
        """True (and counted) when one more create fits under ``limit``."""
        while self.times and self.times[0] <= now_s - 60.0:
            self.times.popleft()
        if len(self.times) >= limit:
            return False
        self.times.append(now_s)
        return True


class SimKernel:
    """Clock, heap, RNG, lock, pools, meter and log of one world; ``restart()`` puts it back at the start.

    The lock, the listeners and the node events not yet delivered outlive a restart (as the world's did).
    """

    def __init__(self, scenario: Scenario, *, time_scale: float, seed: int) -> None:
        self.scenario = scenario
        self.time_scale = time_scale
        self.seed = seed
        self.lock = threading.Lock()
        self._listeners: list[NodeListener] = []
        self._pending_events: list[NodeEvent] = []
        self._matchers: tuple[Callable[[PoolKey], None], ...] = ()
        self.restart()

    def restart(self) -> None:
        """Back to the scenario's start: same seed, empty pools refilled, the clock at the start time."""
        scenario = self.scenario
        self.rng = random.Random(self.seed)
        self.start_s = scenario.start_time.timestamp()
        self.now_s = self.start_s
        self._manual_offset = 0.0
        self._wall_anchor = time.monotonic()
        self._heap: list[_Event] = []
        self._seq = itertools.count()
        self.events_run = 0
        self.pools: dict[PoolKey, Pool] = {}
        self._dirty: set[PoolKey] = set()
        self._log: deque[dict[str, Any]] = deque(maxlen=5000)
        self._log_seq = itertools.count(1)
        self._node_numbers = itertools.count(1)
        self._chip_s_by_tier: dict[str, float] = {}
        self._usd_by_tier: dict[str, float] = {}
        self._usd_by_deployment: dict[str, float] = {}
        self._zone_index = {zone: index for index, zone in enumerate(sorted(scenario.zones))}
        for zone, spec in sorted(scenario.zones.items()):
            for family, pools in sorted(spec.capacity.items()):
                for pool_name, pool_spec in sorted(pools.items()):
                    key = (zone, family, pool_name)
                    self.pools[key] = Pool(total=pool_spec.chips)
                    for step in pool_spec.timeline:
                        self.schedule(self.start_s + step.at_s, self.set_pool_total, key, step.chips)
                    if pool_spec.poisson is not None:
                        self._schedule_poisson(key)

    def set_matchers(self, *matchers: Callable[[PoolKey], None]) -> None:
        """Who grants waiting requests when a pool changes, in turn for each changed pool."""
        self._matchers = matchers

    # ------------------------------------------------------------------ listeners and transactions

    def add_listener(self, listener: NodeListener) -> None:
        with self.lock:
            self._listeners.append(listener)

    def remove_listener(self, listener: NodeListener) -> None:
        with self.lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Hold the lock, catch up with virtual time, then (lock released) tell the listeners what happened."""
        pending: list[NodeEvent] = []
        listeners: list[NodeListener] = []
        try:
            with self.lock:
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

    def notify(self, kind: str, node: SimNode) -> None:
        """Queue a node event for the listeners (delivered when the transaction ends)."""
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

    # ------------------------------------------------------------------ time and the event heap

    def now_datetime(self) -> datetime:
        return datetime.fromtimestamp(self.now_s, UTC)

    def advance_by(self, seconds: float) -> None:
        """Move the manual offset on and run every event due (lock held by the caller)."""
        self._manual_offset += seconds
        self._run_until(self._target_now())

    def _target_now(self) -> float:
        scaled = (time.monotonic() - self._wall_anchor) * self.time_scale if self.time_scale else 0.0
        return self.start_s + self._manual_offset + scaled

    def _catch_up(self) -> None:
        target = self._target_now()
        if target > self.now_s or self._dirty:
            self._run_until(max(target, self.now_s))

    def _run_until(self, target: float) -> None:
        heap = self._heap
        while True:
            if self._dirty:
                self._match()
            if not heap or heap[0].at > target:
                break
            event = heapq.heappop(heap)
            self.now_s = max(self.now_s, event.at)
            self.events_run += 1
            event.action(*event.args)
        self.now_s = max(self.now_s, target)

    def pending_events(self) -> int:
        return len(self._heap)

    def schedule(self, at: float, action: Callable[..., None], *args: Any) -> None:
        heapq.heappush(self._heap, _Event(max(at, self.now_s), next(self._seq), action, args))

    def after(self, span: tuple[float, float], action: Callable[..., None], *args: Any) -> None:
        """Schedule ``action`` a uniform draw from ``span`` from now (exactly ``low`` when the span is empty)."""
        low, high = span
        self.schedule(self.now_s + (low if high <= low else self.rng.uniform(low, high)), action, *args)

    def timing(self, zone: str, name: str) -> tuple[float, float]:
        """A timing span of the scenario, the zone's override first."""
        zones = self.scenario.zones
        override = getattr(zones[zone].timings, name, None) if zone in zones else None
        return override if override is not None else getattr(self.scenario.timings, name)

    def preemption_delay(self, spec: PreemptionSpec) -> float | None:
        """Seconds until a spot VM that just turned ready is preempted by the zone's hazard, or None (never)."""
        delay: float | None = None
        if spec.early_window_s > 0 and (spec.early_hazard_per_hour + spec.hazard_per_hour) > 0:
            early = self.rng.expovariate((spec.early_hazard_per_hour + spec.hazard_per_hour) / 3600.0)
            if early < spec.early_window_s:
                delay = early
        if delay is None and spec.hazard_per_hour > 0:
            delay = spec.early_window_s + self.rng.expovariate(spec.hazard_per_hour / 3600.0)
        return delay

    # ------------------------------------------------------------------ log and ids

    def log(self, kind: str, zone: str, resource: str, detail: str) -> None:
        self._log.append(
            {
                "seq": next(self._log_seq),
                "time": format_time(self.now_s),
                "kind": kind,
                "zone": zone,
                "resource": resource,
                "detail": detail,
            }
        )

    def log_entries(self) -> list[dict[str, Any]]:
        return list(self._log)

    def eid(self) -> str:
        """The ``[EID: 0x…]`` tag Google appends to some errors (consumes the RNG)."""
        return f"[EID: 0x{self.rng.getrandbits(64):016x}]"

    def next_node_number(self) -> int:
        """Numbers nodes and instances alike, so their ids and addresses never collide."""
        return next(self._node_numbers)

    def zone_index(self, zone: str) -> int:
        return self._zone_index.get(zone, 0)

    # ------------------------------------------------------------------ capacity

    def pool(self, zone: str, family: str, pool: str) -> Pool:
        key = (zone, family, pool)
        if key not in self.pools:
            self.pools[key] = Pool()
        return self.pools[key]

    def mark_dirty(self, key: PoolKey) -> None:
        """The pool's supply or demand changed: match its waiting requests at the next step."""
        self._dirty.add(key)

    def dirty_marker(self) -> Callable[[PoolKey], None]:
        """``add`` of the dirty set as it is now, for an event that marks a pool later.

        Kept exactly as the simulator always scheduled it: a match replaces the dirty set, so when one runs
        before the event fires, the mark lands in the discarded set and the pool is not matched then. Replays
        depend on it; calling :meth:`mark_dirty` from the event instead would change what scenarios do.
        """
        return self._dirty.add

    def set_pool_total(self, key: PoolKey, chips: int) -> None:
        pool = self.pool(*key)
        pool.total = chips
        self._dirty.add(key)
        self.log("capacity", key[0], f"{key[1]}/{key[2]}", f"total={chips}")

    def _schedule_poisson(self, key: PoolKey) -> None:
        spec = self.scenario.zones[key[0]].capacity[key[1]][key[2]].poisson
        assert spec is not None
        gap = self.rng.expovariate(spec.rate_per_hour / 3600.0)
        self.schedule(self.now_s + gap, self._on_poisson_arrival, key)

    def _on_poisson_arrival(self, key: PoolKey) -> None:
        spec = self.scenario.zones[key[0]].capacity[key[1]][key[2]].poisson
        assert spec is not None
        pool = self.pool(*key)
        pool.total += spec.chips
        self._dirty.add(key)
        self.schedule(self.now_s + self.rng.expovariate(1.0 / spec.hold_s), self._on_poisson_departure, key, spec.chips)
        self._schedule_poisson(key)

    def _on_poisson_departure(self, key: PoolKey, chips: int) -> None:
        pool = self.pool(*key)
        pool.total = max(0, pool.total - chips)

    def release_chips(self, node: SimNode) -> None:
        if node.holds_chips:
            node.holds_chips = False
            key = (node.zone, node.family, node.pool)
            pool = self.pool(*key)
            pool.used = max(0, pool.used - node.chips)
            self._dirty.add(key)

    def _match(self) -> None:
        dirty, self._dirty = sorted(self._dirty), set()
        for key in dirty:
            for matcher in self._matchers:
                matcher(key)

    # ------------------------------------------------------------------ billing

    def bill(self, node: SimNode, *, preempted: bool) -> None:
        """Close a READY span; a preemption within the free window refunds the node's whole bill."""
        if node.ready_since is None:
            return
        span = self.now_s - node.ready_since
        node.ready_since = None
        free_window = self.scenario.limits.free_preemption_s
        if preempted and node.first_ready_at is not None and self.now_s - node.first_ready_at < free_window:
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

    def billing(self, live: list[SimNode]) -> dict[str, Any]:
        """Chip-hours and USD by tier and by deployment: what was charged plus ``live`` nodes' open spans."""
        chip_s = dict(self._chip_s_by_tier)
        usd_tier = dict(self._usd_by_tier)
        usd_owner = dict(self._usd_by_deployment)
        for node in live:
            if node.ready_since is None:
                continue
            span = self.now_s - node.ready_since
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

"""Capacity-search benchmark: our provisioner against two baselines on the same seeded TPU worlds.

Policies (all three drive the simulator through the same ``TpuApi`` adapter, in-process):

* ``ours``: the real ``Provisioner`` (SQLite store, one-minute reconcile ticks, hedge 2, zone memory,
  5-minute capacity checks after which up to 16 requests stay parked); variants ``ours-no-check`` (every
  request waits its full valid-until), ``ours-hedge4`` (hedge 4), ``ours-no-park`` (the earlier
  defaults: 10-minute checks, a checked request is force-deleted and its pair asked again later) and
  ``ours-check10`` (parking with the earlier 10-minute first check).
* ``ours+cache``, ``ours+cache-primed``: ``ours`` whose boots use a regional weights and compile cache (issue 20,
  item 4): filled by the run's first completed boot in a region, or filled in every region before the command.
  The controller is the same; only command -> first token differs (``benchmarks/time_to_serve.py``).
* ``ours+advice``: ``ours`` with Compute Engine's capacity advice (issue 21, item 2), read from the simulator
  in-process; only on ``advice-accurate`` and ``advice-noisy`` is the advice anything but noise-free live pools.
* ``ours+probe``, ``ours+advice+probe``: the same with the spot probe of waiting flex-start requests (issue 21,
  item 4; ``ProbePolicy`` defaults). Probe nodes count as orphans when left behind, and their billing as waste.
* ``ours+advice+step``: ``ours+advice`` whose spec may step down to the plan's alternative slices (issue 21, item 5;
  ``shared.domain.slice_ladder``); only the ``step-down`` plan (a v6e-8, or a v6e-4) has any. Serving spend counts the
  chips of the slice served.
* ``sequential``: the reference agent's ``find_tpu`` (docs/reference/reference-agent.md §3): candidate zones in
  alphabetical order, one request at a time, wait for the create operation, poll every 15 s, give up
  after 3 min (10 min once PROVISIONING was seen) and delete *without* force (result ignored), never
  retry a zone in the run, stop at the first ACTIVE. It asks for the scenario's tiers (each zone, then
  each tier) instead of its hard-coded flex-start, so every policy asks for the same capacity. It has
  no recovery: a preempted slice stays down.
* ``skypilot``: SkyPilot-style failover (docs/reference/tpu-api.md §10): (zone, tier) pairs cheapest first, one at a
  time; a refusal blocks the zone for the round; a request not ACTIVE within 300 s is abandoned without
  being deleted (its queued-resource path never deletes); when every pair was tried, a new round after
  30 s. After a preemption it relaunches elsewhere (EAGER_NEXT_REGION), leaving the SUSPENDED request.
* ``bound``: not a product policy but the lower bound on time to ACTIVE for any API-respecting client:
  a request waiting in every allowed (zone, tier) pair from t=0, re-created at once when one fails, no
  rate limit or cost counted against it. Its "first chips granted" is the clairvoyant figure: the first
  moment any allowed pair had chips for the slice (time to ACTIVE adds the provider's 1-5 min boot).

The advice plans ``advice-accurate`` and ``advice-noisy`` run one world (``benchmarks/scenarios/advice-accurate.yaml``)
with advice always right and live, or 60 % right and 15 minutes stale (the shipped ``advice-noisy``'s noise).
``flex-held`` (``benchmarks/scenarios/flex-held.yaml``) is a flex-start wait held by quota, not capacity, in the region
the price order asks first, for the spot probe.

Scenarios are the simulator's shipped ``scarce-v6e``, ``reference-agent-zones`` and ``spot-preemptions``,
each run with a per-run seed (timings, Poisson capacity, preemptions) and capacity timelines jittered
x0.5-1.5. A run lasts until the first ACTIVE plus a 3 h serving window, or the scenario's horizon.

Measured per run: virtual time until the policy holds an ACTIVE slice (censored at the horizon),
chip-hours billed for capacity that was not the serving slice, API calls, orphans left at the end
(labelled resources other than the serving slice; for ours after a janitor tick) and availability.
Every run also reports command -> first token: ACTIVE plus the boot model's stages for the granted slice
(``shared.domain.boot_model``, gemma-4-26b-a4b), and the outage after a preemption including the re-boot.

Usage::

    .venv/bin/python benchmarks/capacity_search.py --runs 200            # all scenarios; ours, baselines, bound
    .venv/bin/python benchmarks/capacity_search.py --runs 20 --scenario reference-agent-zones
"""

from __future__ import annotations

import argparse
import copy
import logging
import random
import sys
import tempfile
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.capacity_search_results import (
    PLANS,
    RunResult,
    ScenarioPlan,
    Summary,
    markdown,
    summarise,
    target_table,
)
from benchmarks.time_to_serve import CACHE_POLICIES, ServeTracker, account, first_token_table, world_slice
from localcloud.in_process_tpu import InProcessTpuApi
from localcloud.tpu_sim import World, load_scenario
from localcloud.tpu_sim.advice import capacity_advice
from shared.adapters.compute_advice import PROVISIONING_MODELS
from shared.adapters.sqlite_store import SqliteStateStore
from shared.domain.backends import machine_type_of
from shared.domain.cloud import LABEL_DEPLOYMENT, ProvisionRequest
from shared.domain.errors import CloudError, ErrorClass
from shared.domain.models import DeploymentSpec, NodeState, QueuedResourceState, Tier, region_of
from shared.domain.planner import PlannerPolicy
from shared.domain.spot_probe import ProbePolicy
from shared.domain.zone_memory import estimated_price
from shared.messages import CreateDeployment, ReconcileTick
from shared.ports import CapacityAdvice
from shared.services.provisioner import Provisioner, ProvisionerSettings

DEPLOYMENT = "bench"
ACCELERATOR = "v6e-4"
CHIPS = 4
SERVE_S = 3 * 3600.0
SAMPLE_S = 15.0
POLICIES = (
    "ours",
    "ours+cache",
    "ours+cache-primed",
    "ours+advice",
    "ours+probe",
    "ours+advice+probe",
    "ours+advice+step",
    "ours-no-check",
    "ours-hedge4",
    "ours-no-park",
    "ours-check10",
    "sequential",
    "skypilot",
    "bound",
)
ADVICE_WORLD = Path(__file__).resolve().parent / "scenarios" / "advice-accurate.yaml"
# Scenario -> (scenario file, the advice noise it runs with): both advice plans search the same world.
ADVICE_WORLDS: dict[str, tuple[Path, dict[str, float]]] = {
    "advice-accurate": (ADVICE_WORLD, {"accuracy": 1.0, "staleness_minutes": 0.0}),
    "advice-noisy": (ADVICE_WORLD, {"accuracy": 0.6, "staleness_minutes": 15.0}),  # the shipped advice-noisy's
}
# Worlds of the benchmark's own (benchmarks/scenarios/), by plan name.
BENCH_WORLDS = {
    name: Path(__file__).resolve().parent / "scenarios" / f"{name}.yaml" for name in ("flex-held", "step-down")
}
QR = QueuedResourceState
_DEAD = (QR.FAILED, QR.SUSPENDING, QR.SUSPENDED)
_DEAD_NODES = (NodeState.PREEMPTED, NodeState.TERMINATED)


# ---------------------------------------------------------------------------------------------- worlds


def seeded_world(plan: ScenarioPlan, seed: int, *, source: Any = None) -> World:
    """The shipped scenario (or ``source``, a scenario file) with this run's seed and timelines jittered x0.5-1.5."""
    advice_world = ADVICE_WORLDS.get(plan.name)
    if source is None and advice_world is not None:
        source = advice_world[0]
    source = BENCH_WORLDS.get(plan.name) if source is None else source
    data = load_scenario(source if source is not None else plan.name).model_dump(mode="json")
    if advice_world is not None:
        data["advice"] = dict(advice_world[1])
    rng = random.Random(seed * 1_000_003 + len(plan.name))
    for zone in data["zones"].values():
        for pools in zone.get("capacity", {}).values():
            for pool in pools.values():
                for step in pool.get("timeline", []):
                    step["at_s"] = round(step["at_s"] * rng.uniform(0.5, 1.5), 1)
    data["seed"] = seed
    data["faults"] = []
    return World(copy.deepcopy(data))


def _spec(plan: ScenarioPlan, world: World) -> DeploymentSpec:
    return DeploymentSpec(
        deployment_id=DEPLOYMENT,
        model="gemma-4-26b-a4b",
        accelerator=plan.accelerator,
        zones=tuple(sorted(world.scenario.zones))[:32],
        tiers=plan.tiers,
    )


def _request(name: str, zone: str, tier: Tier, accelerator: str = ACCELERATOR) -> ProvisionRequest:
    return ProvisionRequest(
        resource_id=name,
        node_id=name,
        zone=zone,
        accelerator=accelerator,
        tier=tier,
        request_id=str(uuid.uuid4()),
        labels={LABEL_DEPLOYMENT: DEPLOYMENT},  # for the orphan count only; baselines never look at labels
        valid_until_s=4 * 3600,
        max_run_s=4 * 3600 if tier is Tier.FLEX_START else None,
    )


# -------------------------------------------------------------------------------------------- policies


class Policy(ABC):
    """One capacity-search policy: ``step(now_s)`` when due; ``serving()`` names the slice it serves from."""

    name = ""

    def __init__(self, plan: ScenarioPlan, world: World, tpu: InProcessTpuApi) -> None:
        self.plan = plan
        self.world = world
        self.tpu = tpu
        self.spec = _spec(plan, world)
        self.next_s = 0.0

    @abstractmethod
    def step(self, now_s: float) -> None:
        """Implemented by each policy."""

    @abstractmethod
    def serving(self) -> tuple[str, str, Tier] | None:
        """Implemented by each policy."""

    def tracked(self) -> set[str]:
        """Names of the requests the policy still knows about (everything else left in the world is an orphan)."""
        serving = self.serving()
        return {serving[1]} if serving else set()

    def finish(self) -> None:  # noqa: B027 - a hook most policies leave empty
        """End of the run (ours: one more janitor tick)."""


class Ours(Policy):
    name = "ours"

    def __init__(
        self,
        plan: ScenarioPlan,
        world: World,
        tpu: InProcessTpuApi,
        folder: Path,
        planner: PlannerPolicy | None = None,
        *,
        hedge: int | None = None,
        advice: CapacityAdvice | None = None,
        probe: ProbePolicy | None = None,
        step: bool = False,
    ) -> None:
        super().__init__(plan, world, tpu)
        if hedge is not None:
            self.spec = self.spec.model_copy(update={"hedge": hedge})
        if step:  # step-down and step-across: the plan's alternative slices (shared.domain.slice_ladder)
            self.spec = self.spec.model_copy(update={"alternative_accelerators": plan.alternatives})
        self.store = SqliteStateStore(folder / f"{uuid.uuid4().hex}.db")
        settings = ProvisionerSettings(holder="bench", planner=planner or PlannerPolicy(), probe=probe)
        self.provisioner = Provisioner(self.store, tpu, world.clock, settings=settings, advice=advice)
        self.created = False
        self._serving: tuple[str, str, Tier] | None = None
        self._tracked: set[str] = set()

    def _envelope(self) -> dict[str, Any]:
        return {"command_id": str(uuid.uuid4()), "issued_at": self.world.clock.now()}

    def step(self, now_s: float) -> None:
        if not self.created:
            self.provisioner.handle(CreateDeployment(deployment_id=DEPLOYMENT, spec=self.spec, **self._envelope()))
            self.created = True
        else:
            self.provisioner.handle(ReconcileTick(**self._envelope()))
        self.next_s = now_s + 60.0
        self._serving = self._read_serving()

    def serving(self) -> tuple[str, str, Tier] | None:
        return self._serving

    def _read_serving(self) -> tuple[str, str, Tier] | None:
        """The slice the controller serves from, as its record says (what a user would be told)."""
        record = self.store.get_deployment(DEPLOYMENT)
        if record is None:
            return None
        for ref in record.status.resources:
            if (
                ref.generation == record.generation
                and ref.state is QR.ACTIVE
                and ref.delete_requested_at is None
                and ref.zone == record.status.zone
            ):
                return ref.zone, ref.name, ref.tier
        return None

    def finish(self) -> None:
        self.provisioner.handle(ReconcileTick(**self._envelope()))  # the janitor's tick
        self._serving = self._read_serving()
        record = self.store.get_deployment(DEPLOYMENT)
        self._tracked = {ref.name for ref in record.status.resources} if record else set()
        self.store.close()

    def tracked(self) -> set[str]:
        return self._tracked


class Sequential(Policy):
    """docs/reference/reference-agent.md §3, step by step."""

    name = "sequential"

    def __init__(self, plan: ScenarioPlan, world: World, tpu: InProcessTpuApi) -> None:
        super().__init__(plan, world, tpu)
        self.queue = [(zone, tier) for zone in sorted(self.spec.zones) for tier in plan.tiers]
        self.current: tuple[str, str, Tier] | None = None
        self.started_s = 0.0
        self.operation: str | None = None
        self.saw_provisioning = False
        self.active: tuple[str, str, Tier] | None = None
        self.done = False
        self.attempt = 0

    def step(self, now_s: float) -> None:
        if self.done:
            self.next_s = float("inf")
            return
        if self.current is None:
            self._next_zone(now_s)
            return
        zone, name, _tier = self.current
        if self.operation is not None:  # gcloud waits for the create operation before it polls
            op = self._quietly(lambda: self.tpu.get_operation(self.operation or ""))
            if op is None or not op.done:
                self.next_s = now_s + 5.0
                return
            self.operation = None
            if op.error_class is not None:
                self._give_up(now_s, delete=False)
                return
        observed = self._quietly(lambda: self.tpu.get(zone, name))
        state = observed.state if observed is not None else None
        if state is QR.ACTIVE:
            self.active = self.current
            self.done = True
            self.next_s = float("inf")
            return
        if state in (QR.FAILED, QR.SUSPENDED):
            self._give_up(now_s, delete=False)
            return
        if state is QR.PROVISIONING:
            self.saw_provisioning = True
        limit = 600.0 if self.saw_provisioning else 180.0
        if now_s - self.started_s >= limit:
            self._give_up(now_s, delete=True)
            return
        self.next_s = now_s + 15.0

    def _next_zone(self, now_s: float) -> None:
        while self.queue:
            zone, tier = self.queue.pop(0)
            name = f"bench-seq-{self.attempt}"
            self.attempt += 1
            try:
                op = self.tpu.create(_request(name, zone, tier))
            except CloudError:
                continue  # marked "No" forever; the next zone right away
            self.current = (zone, name, tier)
            self.started_s = now_s
            self.saw_provisioning = False
            self.operation = op.name if not op.done else None
            self.next_s = now_s + 5.0
            return
        self.done = True
        self.next_s = float("inf")

    def _give_up(self, now_s: float, *, delete: bool) -> None:
        if delete and self.current is not None:
            zone, name, _tier = self.current
            self._quietly(lambda: self.tpu.delete(zone, name, force=False))  # no --force, result ignored
        self.current = None
        self._next_zone(now_s)

    def _quietly(self, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except CloudError:
            return None

    def serving(self) -> tuple[str, str, Tier] | None:
        return self.active


class SkyPilot(Policy):
    """One zone at a time, cheapest first, new round every 30 s, abandoned requests never deleted."""

    name = "skypilot"

    def __init__(self, plan: ScenarioPlan, world: World, tpu: InProcessTpuApi) -> None:
        super().__init__(plan, world, tpu)
        pairs = [(zone, tier) for zone in self.spec.zones for tier in plan.tiers]
        self.pairs = sorted(pairs, key=lambda p: (self._price(*p), p[0].rsplit("-", 1)[0], p[0], p[1].value))
        self.round: list[tuple[str, Tier]] = []
        self.blocked_zones: set[str] = set()
        self.blocked_regions: set[str] = set()
        self.current: tuple[str, str, Tier] | None = None
        self.started_s = 0.0
        self.active: tuple[str, str, Tier] | None = None
        self.attempt = 0

    def _price(self, zone: str, tier: Tier) -> float:
        return estimated_price(zone, tier, ACCELERATOR)[0]

    def step(self, now_s: float) -> None:
        if self.active is not None:
            zone, name, _tier = self.active
            observed = self._quietly(lambda: self.tpu.get(zone, name))
            if (
                observed is not None
                and observed.state is QR.ACTIVE
                and observed.node_state is not None
                and (observed.node_state.value == "READY")
            ):
                self.next_s = now_s + 60.0
                return
            # Preempted: recover in another region (EAGER_NEXT_REGION); the old request is left behind.
            self.blocked_regions = {zone.rsplit("-", 1)[0]}
            self.active = None
            self.round = []
        if self.current is not None:
            zone, name, _tier = self.current
            observed = self._quietly(lambda: self.tpu.get(zone, name))
            state = observed.state if observed is not None else None
            if state is QR.ACTIVE:
                self.active, self.current = self.current, None
                self.next_s = now_s + 60.0
                return
            if state in (QR.FAILED, QR.SUSPENDED) or (observed is not None and observed.error_class is not None):
                self.blocked_zones.add(zone)
                self.current = None
            elif now_s - self.started_s >= 300.0:
                self.current = None  # abandoned, not deleted
            else:
                self.next_s = now_s + 10.0
                return
        self._launch(now_s)

    def _launch(self, now_s: float) -> None:
        if not self.round:
            self.round = [
                pair
                for pair in self.pairs
                if pair[0] not in self.blocked_zones and pair[0].rsplit("-", 1)[0] not in self.blocked_regions
            ]
            if not self.round:
                self.blocked_zones.clear()
                self.blocked_regions.clear()
                self.next_s = now_s + 30.0  # retry_until_up: a new round every 30 s
                return
        while self.round:
            zone, tier = self.round.pop(0)
            if zone in self.blocked_zones:
                continue
            name = f"bench-sky-{self.attempt}"
            self.attempt += 1
            try:
                self.tpu.create(_request(name, zone, tier))
            except CloudError:
                self.blocked_zones.add(zone)
                continue
            self.current = (zone, name, tier)
            self.started_s = now_s
            self.next_s = now_s + 10.0
            return
        self.blocked_zones.clear()
        self.blocked_regions.clear()
        self.next_s = now_s + 30.0

    def _quietly(self, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except CloudError:
            return None

    def serving(self) -> tuple[str, str, Tier] | None:
        return self.active

    def tracked(self) -> set[str]:
        return {item[1] for item in (self.active, self.current) if item is not None}


class Bound(Policy):
    """A lower bound, not a product policy: a request waits in EVERY allowed (zone, tier) pair from t=0.

    The best an API-respecting client can do in the same world: the provider hands chips to a waiting
    request the moment they appear (FIFO), so with one queued everywhere the first grant is the first
    moment any allowed pair has chips for the slice, and time to ACTIVE is that plus the provider's boot.
    A request that fails or is preempted is re-created at once (5 s polling); no rate limit of its own,
    no capacity check, no cost counted against it. Refusals other than "unsupported" are retried.
    """

    name = "bound"

    def __init__(self, plan: ScenarioPlan, world: World, tpu: InProcessTpuApi) -> None:
        super().__init__(plan, world, tpu)
        self.pairs = [(zone, tier) for zone in self.spec.zones for tier in plan.tiers]
        self.live: dict[tuple[str, Tier], str] = {}
        self.active: tuple[str, str, Tier] | None = None
        self.attempt = 0
        self.first_chips_s: float | None = None

    def step(self, now_s: float) -> None:
        self.next_s = now_s + (SAMPLE_S if self.active is not None else 5.0)  # a serving bound only watches
        try:
            observed = {o.name: o for o in self.tpu.list("-")}
        except CloudError:
            return
        if self.active is not None:
            seen = observed.get(self.active[1])
            if seen is not None and seen.state is QR.ACTIVE and seen.node_state in (None, NodeState.READY):
                return
            self._delete(self.active[0], self.active[1])  # preempted: search everywhere again
            self.live.pop((self.active[0], self.active[2]), None)
            self.active = None
        for (zone, tier), name in list(self.live.items()):
            seen = observed.get(name)
            state = seen.state if seen is not None else None
            if state in (QR.PROVISIONING, QR.ACTIVE) and self.first_chips_s is None:
                self.first_chips_s = became_active_s(self.world, name, now_s, ("qr.provisioning",))
            if state is QR.ACTIVE and (seen is None or seen.node_state in (None, NodeState.READY)):
                self.active = (zone, name, tier)
            elif seen is None or state in _DEAD or (seen.node_state in _DEAD_NODES):
                if seen is not None:
                    self._delete(zone, name)
                del self.live[(zone, tier)]
                if seen is not None and seen.error_class is ErrorClass.UNSUPPORTED:
                    self.pairs.remove((zone, tier))
        if self.active is not None:
            for (zone, tier), name in list(self.live.items()):
                if name != self.active[1]:
                    self._delete(zone, name)
                    del self.live[(zone, tier)]
            return
        self._queue_everywhere()

    def _queue_everywhere(self) -> None:
        """A request in every allowed pair that has none; a pair the provider calls unsupported is dropped."""
        for zone, tier in list(self.pairs):
            if (zone, tier) in self.live:
                continue
            name = f"bench-bound-{self.attempt}"
            self.attempt += 1
            try:
                self.tpu.create(_request(name, zone, tier, self.spec.accelerator))
            except CloudError as exc:
                if exc.error_class is ErrorClass.UNSUPPORTED:
                    self.pairs.remove((zone, tier))
                continue
            self.live[(zone, tier)] = name

    def _delete(self, zone: str, name: str) -> None:
        try:
            self.tpu.delete(zone, name, force=True)
        except CloudError:
            return

    def serving(self) -> tuple[str, str, Tier] | None:
        return self.active

    def tracked(self) -> set[str]:
        return set(self.live.values())


# ------------------------------------------------------------------------------------------------ runs


def became_active_s(world: World, name: str, now_s: float, kinds: tuple[str, ...] = ("qr.active",)) -> float:
    """When the provider turned the slice ACTIVE (the policy may notice later), in seconds from the start."""
    start = world.scenario.start_time.timestamp()
    times = [e["time"] for e in world.events() if e["kind"] in kinds and e["resource"] == name]
    if not times:
        return now_s
    return datetime.fromisoformat(times[-1].replace("Z", "+00:00")).timestamp() - start


class CountsCalls(Protocol):
    """An adapter that counts the API calls it made (``InProcessTpuApi``, the back-end benchmark's ``PinnedTpu``)."""

    @property
    def total_calls(self) -> int: ...


def drive(
    policy: Policy,
    world: World,
    tpu: CountsCalls,
    result: RunResult,
    *,
    is_up: Callable[[str, str], bool],
    active_kinds: tuple[str, ...] = ("qr.active",),
    orphan_kinds: tuple[str, ...] = ("queued_resource",),
    after_step: Callable[[], None] = lambda: None,
    on_first_serving: Callable[[str, str], None] = lambda zone, name: None,
    chips: Callable[[str, str], int] = lambda zone, name: CHIPS,
    on_sample: Callable[[float, tuple[str, str, Tier] | None, bool], None] = lambda now_s, serving, up: None,
) -> None:
    """Run ``policy`` in ``world`` until it has served ``SERVE_S`` (or the horizon passes) and fill ``result``.

    The back-end benchmark reuses this with its own ``is_up``, event kinds, orphan kinds and hooks.
    """
    plan = policy.plan
    now_s = 0.0
    end_s = plan.horizon_s
    window_start: float | None = None
    down_since: float | None = None
    while now_s < end_s:
        if policy.next_s <= now_s:
            policy.step(now_s)
            after_step()
        serving = policy.serving()
        up = serving is not None and is_up(serving[0], serving[1])
        on_sample(now_s, serving, up)
        if serving is not None and result.time_to_active_s is None:
            result.time_to_active_s = became_active_s(world, serving[1], now_s, active_kinds)
            result.time_to_known_s = now_s
            result.api_calls_to_active = tpu.total_calls
            window_start = now_s
            end_s = now_s + SERVE_S
            on_first_serving(serving[0], serving[1])
        if window_start is not None:
            if not up and down_since is None:
                down_since = now_s
            elif up and down_since is not None:
                result.recoveries_s.append(now_s - down_since)
                down_since = None
        wake = min(policy.next_s, now_s + SAMPLE_S, end_s)
        dt = max(wake - now_s, 1e-6)
        if up and serving is not None:
            zone, name, tier = serving
            held = chips(zone, name)  # the slice served: the plan's, or a step-down's smaller one
            result.used_chip_hours += held * dt / 3600
            result.used_usd += held * dt / 3600 * world.scenario.price(zone.rsplit("-", 1)[0], tier.value)
            result.serving_s += dt
        world.advance(dt)
        now_s += dt
    if down_since is not None:
        result.recoveries_s.append(end_s - down_since)
        result.unrecovered += 1
    _close_books(policy, world, tpu, result, orphan_kinds)
    result.window_s = (end_s - window_start) if window_start is not None else 0.0


def _close_books(
    policy: Policy, world: World, tpu: CountsCalls, result: RunResult, orphan_kinds: tuple[str, ...]
) -> None:
    """After the run: let the policy clean up, then read the bill, the call count and what was left behind."""
    policy.finish()
    billing = world.billing()
    result.billed_chip_hours = billing["total_chip_hours"]
    result.billed_usd = billing["total_usd"]
    result.api_calls = tpu.total_calls
    tracked = policy.tracked()
    invariants = world.invariants(live_deployments=[])
    result.orphans = sum(
        1 for item in invariants["orphans"] if item["kind"] in orphan_kinds and item["name"] not in tracked
    )


class InProcessAdvice:
    """``CapacityAdvice`` read from the simulator in-process (the wire adapter's request, without HTTP): the
    benchmark runs thousands of ticks, and tests/adapters/test_compute_advice.py covers the wire."""

    def __init__(self, world: World) -> None:
        self.world = world

    def obtainability(self, accelerator: str, tier: Tier, zones: Sequence[str]) -> dict[str, float]:
        model, machine = PROVISIONING_MODELS.get(tier), machine_type_of(accelerator)
        if model is None or machine is None:
            return {}
        scores: dict[str, float] = {}
        for region in sorted({region_of(zone) for zone in zones}):
            body = {
                "instanceProperties": {"scheduling": {"provisioningModel": model}},
                "instanceFlexibilityPolicy": {"instanceSelections": {"slice": {"machineTypes": [machine]}}},
                "distributionPolicy": {"zones": [{"zone": f"zones/{z}"} for z in zones if region_of(z) == region]},
            }
            answer = capacity_advice(self.world.kernel, self.world.scenario.project, region, body)
            for item in answer["recommendations"]:
                scores[item["shards"][0]["zone"].rsplit("/", 1)[-1]] = item["scores"]["obtainability"]
        return scores


def run_one(policy_name: str, plan: ScenarioPlan, seed: int, folder: Path) -> RunResult:
    started = time.perf_counter()
    world = seeded_world(plan, seed)
    tpu = InProcessTpuApi(world)
    policy: Policy
    if policy_name in ("ours", *CACHE_POLICIES):  # the cache changes the boot only (benchmarks/time_to_serve.py)
        policy = Ours(plan, world, tpu, folder)
    elif policy_name == "ours+advice":
        policy = Ours(plan, world, tpu, folder, advice=InProcessAdvice(world))
    elif policy_name in ("ours+probe", "ours+advice+probe"):
        advice = InProcessAdvice(world) if "advice" in policy_name else None
        policy = Ours(plan, world, tpu, folder, advice=advice, probe=ProbePolicy())
    elif policy_name == "ours+advice+step":
        policy = Ours(plan, world, tpu, folder, advice=InProcessAdvice(world), step=True)
    elif policy_name == "ours-no-check":
        policy = Ours(plan, world, tpu, folder, PlannerPolicy(capacity_check_minutes=None))
    elif policy_name == "ours-hedge4":
        policy = Ours(plan, world, tpu, folder, hedge=4)
    elif policy_name == "ours-check10":  # parking with the earlier 10-minute first check
        policy = Ours(plan, world, tpu, folder, PlannerPolicy(capacity_check_minutes=10.0))
    elif policy_name == "ours-no-park":  # the defaults before parking: 10-minute checks, checked requests deleted
        policy = Ours(plan, world, tpu, folder, PlannerPolicy(capacity_check_minutes=10.0, park_after_check=0))
    elif policy_name == "sequential":
        policy = Sequential(plan, world, tpu)
    elif policy_name == "bound":
        policy = Bound(plan, world, tpu)
    else:
        policy = SkyPilot(plan, world, tpu)
    result = RunResult(policy_name, plan.name, seed)
    up = lambda zone, name: world.qr_state(zone, name) == "ACTIVE"  # noqa: E731
    tracker = ServeTracker(
        lambda name, now_s: became_active_s(world, name, now_s), world_slice(world, plan.accelerator)
    )
    drive(
        policy,
        world,
        tpu,
        result,
        is_up=up,
        orphan_kinds=("queued_resource", "node"),
        chips=world_chips(world),
        on_sample=tracker.sample,
    )
    account(result, tracker, plan, sorted({region_of(zone) for zone in world.scenario.zones}))
    if isinstance(policy, Bound):
        result.first_chips_s = policy.first_chips_s
    result.wall_s = time.perf_counter() - started
    return result


def world_chips(world: World) -> Callable[[str, str], int]:
    """Chips of a served queued resource as the simulator holds it (its slice, not the plan's: a step-down)."""

    def chips(zone: str, name: str) -> int:
        with world.kernel.transaction():
            qr = world.tpu.qrs.get((zone, name))
            return int(qr.chips) if qr is not None else CHIPS

    return chips


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--runs", type=int, default=200, help="seeded runs per scenario and policy (default 200)")
    parser.add_argument("--scenario", choices=sorted(PLANS), action="append", help="limit to these scenarios")
    parser.add_argument(
        "--policy", choices=POLICIES, action="append", help="default: ours, sequential, skypilot, bound"
    )
    parser.add_argument("--first-seed", type=int, default=1)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs: must be at least 1")
    logging.disable(logging.WARNING)
    scenarios = args.scenario or list(PLANS)
    policies = args.policy or ["ours", "sequential", "skypilot", "bound"]
    shm = Path("/dev/shm")  # noqa: S108 - a private mkdtemp folder in tmpfs: SQLite fsyncs every write
    summaries: list[Summary] = []
    groups: list[tuple[ScenarioPlan, list[RunResult]]] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else None, prefix="tpuctl-bench-") as folder:
        for scenario in scenarios:
            plan = PLANS[scenario]
            for policy in policies:
                seeds = range(args.first_seed, args.first_seed + args.runs)
                results = [run_one(policy, plan, seed, Path(folder)) for seed in seeds]
                summary = summarise(results, plan)
                groups.append((plan, results))
                summaries.append(summary)
                print(
                    f"{scenario:>22} {policy:>10}: median {summary.median_min:6.1f} min, p90 {summary.p90_min:6.1f},"
                    f" reached {summary.reached}/{summary.runs}, waste {summary.wasted_pct:.2f}%,"
                    f" orphans {summary.orphans:.2f}, {sum(r.wall_s for r in results):.1f} s wall",
                    file=sys.stderr,
                )
    print(markdown(summaries))
    if any(s.policy == "bound" for s in summaries):
        print()
        print(target_table(summaries))
    by_key = {(s.scenario, s.policy): s for s in summaries}
    for scenario in scenarios:
        ours, seq = by_key.get((scenario, "ours")), by_key.get((scenario, "sequential"))
        if ours and seq:
            print(f"\n{scenario}: ours/sequential median time to ACTIVE = {ours.median_min / seq.median_min:.2f}")
    print("\nCommand -> first token (benchmarks/time_to_serve.py, a model calibrated to published boot figures):\n")
    print(first_token_table(groups))
    print(f"\ntotal wall time {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

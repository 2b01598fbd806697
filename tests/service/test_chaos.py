"""Chaos: hundreds of seeded runs of commands and ticks against a hostile simulated TPU API.

Each run mixes duplicate and out-of-order command deliveries (through the real entry path and command
ledger), crashes between an API call and the state write, injected 429/503 answers, spot preemptions
(hazard and on demand) and two reconcilers at once (one interleaved inside the other's API calls, and
one that stalls past its lease). Then the faults stop, the system settles, one more janitor tick runs,
and every run must show: at most one ACTIVE queued resource per deployment, zero orphans, no stale
FAILED/SUSPENDED leftover, and records that match the simulator.

The seeded runs call the simulator in-process (``WorldTpuApi``: the real adapter's normalisation and
error mapping, without sockets) to stay fast; a few seeds also run over HTTP with the real
google-cloud-tpu client. Stores live in /dev/shm when it exists (SQLite fsyncs every write).
"""

from __future__ import annotations

import contextlib
import random
import tempfile
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from localcloud.tpu_sim import World
from localcloud.world_tpu import WorldTpuApi
from shared.adapters.sqlite_store import SqliteStateStore
from shared.domain.cloud import ObservedResource, OperationStatus, ProvisionRequest
from shared.domain.errors import ConflictError
from shared.domain.models import DeploymentSpec, Desired, Phase, QueuedResourceState, Tier
from shared.entry import PubSubPayload, handle_payload
from shared.messages import (
    CreateDeployment,
    DeleteDeployment,
    ReconcileTick,
    StartDeployment,
    StopDeployment,
    UpdateDeployment,
    encode_message,
)
from shared.ports import TpuApi
from shared.services.provisioner import Provisioner, ProvisionerSettings
from tests.support.fixtures_tpu_sim import TpuSimFactory

RUNS = 300
HTTP_SEEDS = (1001, 1002, 1003)
ZONES = ("us-central1-b", "us-east1-d", "europe-west4-a", "us-east5-b")
STEP_S = 120
CHAOS_STEPS = 16
SETTLE_STEPS = 14


class Crash(Exception):
    """The function instance died: the API call happened, nothing after it did."""


@dataclass
class ChaosKnobs:
    crash: float
    interleave: float
    stall: float
    enabled: bool = True


class ChaoticTpu:
    """Wraps the adapter: crashes after calls, lets a second reconciler run inside a call, stalls past leases."""

    def __init__(self, inner: TpuApi, rng: random.Random, knobs: ChaosKnobs, world: World) -> None:
        self.inner = inner
        self.rng = rng
        self.knobs = knobs
        self.world = world
        self.interleave: Callable[[], None] | None = None
        self.busy = False
        self.crashed = 0
        self.interleaved = 0
        self.stalled = 0

    def _around(self, call: Callable[[], Any]) -> Any:
        if self.knobs.enabled and not self.busy:
            self.busy = True
            try:
                if self.interleave is not None and self.rng.random() < self.knobs.interleave:
                    self.interleaved += 1
                    self.interleave()  # a second reconciler runs while this one is mid-flight
                if self.rng.random() < self.knobs.stall:
                    self.stalled += 1
                    self.world.advance(150)  # paused past the 120 s lease: the next write must be fenced
            finally:
                self.busy = False
        result = call()
        if self.knobs.enabled and self.rng.random() < self.knobs.crash:
            self.crashed += 1
            raise Crash("died after the API call, before the state write")
        return result

    def create(self, request: ProvisionRequest) -> OperationStatus:
        return self._around(lambda: self.inner.create(request))

    def delete(
        self, zone: str, resource_id: str, *, force: bool, request_id: str | None = None
    ) -> OperationStatus | None:
        return self._around(lambda: self.inner.delete(zone, resource_id, force=force, request_id=request_id))

    def list(self, zone: str = "-") -> list[ObservedResource]:
        return self.inner.list(zone)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _world(seed: int, rng: random.Random) -> dict[str, Any]:
    zones: dict[str, Any] = {}
    for zone in ZONES:
        arrival = rng.choice([0, 0, 300, 900, 1800, None])
        spot: dict[str, Any] = {"chips": 8 if arrival == 0 else 0}
        if arrival:
            spot["timeline"] = [{"at_s": arrival, "chips": 8}]
        zones[zone] = {
            "capacity": {"v6e": {"spot": spot, "on_demand": rng.choice([0, 4, 8])}},
            "preemption": {"hazard_per_hour": rng.choice([0.0, 0.0, 1.0, 3.0])},
        }
    return {"name": f"chaos-{seed}", "seed": seed, "zones": zones}


def _spec(deployment_id: str, rng: random.Random) -> DeploymentSpec:
    zones = tuple(rng.sample(ZONES, rng.randint(2, 4)))
    tiers = tuple(rng.sample([Tier.SPOT, Tier.ON_DEMAND], rng.randint(1, 2)))
    return DeploymentSpec(
        deployment_id=deployment_id,
        model="gemma-4-e4b",
        accelerator="v6e-4",
        zones=zones,
        tiers=tiers,
        hedge=rng.randint(1, 2),
        valid_until_minutes=rng.choice([5, 10, 240]),
    )


def _commands(rng: random.Random, now: Any) -> list[Any]:
    """What users asked for, in the order they asked; delivery will duplicate and reorder it."""

    def envelope() -> dict[str, Any]:
        return {"command_id": str(uuid.UUID(int=rng.getrandbits(128), version=4)), "issued_at": now}

    messages: list[Any] = []
    for name in ("alpha", "beta"):
        messages.append(CreateDeployment(deployment_id=name, spec=_spec(name, rng), **envelope()))
    if rng.random() < 0.5:
        messages.append(
            UpdateDeployment(deployment_id="alpha", spec=_spec("alpha", rng), expected_generation=1, **envelope())
        )
    if rng.random() < 0.4:
        messages.append(DeleteDeployment(deployment_id="beta", **envelope()))
    if rng.random() < 0.3:
        messages.append(StopDeployment(deployment_id="alpha", **envelope()))
        messages.append(StartDeployment(deployment_id="alpha", **envelope()))
    return messages


def _deliveries(messages: list[Any], rng: random.Random) -> list[PubSubPayload]:
    payloads = [PubSubPayload(data=encode_message(m), message_id=f"m{i}") for i, m in enumerate(messages)]
    delivered = list(payloads)
    for payload in payloads:
        if rng.random() < 0.4:
            delivered.insert(rng.randint(0, len(delivered)), payload)  # a duplicate, anywhere
    for index in range(len(delivered) - 1):
        if rng.random() < 0.35:
            delivered[index], delivered[index + 1] = delivered[index + 1], delivered[index]  # out of order
    return delivered


@dataclass
class RunReport:
    seed: int
    problems: list[str] = field(default_factory=list)
    crashes: int = 0
    ticks: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)


def chaos_run(seed: int, world: World, tpu: TpuApi, store_path: Path) -> RunReport:
    rng = random.Random(seed)
    report = RunReport(seed)
    store = SqliteStateStore(store_path)
    knobs = ChaosKnobs(
        crash=rng.choice([0.0, 0.1, 0.25]), interleave=rng.choice([0.0, 0.2]), stall=rng.choice([0.0, 0.0, 0.05])
    )
    chaotic = ChaoticTpu(tpu, rng, knobs, world)
    clock = world.clock
    first = Provisioner(store, chaotic, clock, settings=ProvisionerSettings(holder="r1"))
    second = Provisioner(store, chaotic, clock, settings=ProvisionerSettings(holder="r2"))

    def tick(provisioner: Provisioner) -> None:
        try:
            provisioner.handle(ReconcileTick(command_id=str(uuid.uuid4()), issued_at=clock.now()))
        except Crash:
            report.outcomes["tick_crashed"] += 1
        report.ticks += 1

    chaotic.interleave = lambda: tick(second)
    queue = _deliveries(_commands(rng, clock.now()), rng)
    try:
        for step in range(CHAOS_STEPS):
            for _ in range(rng.choice([0, 1, 1, 2])):
                if not queue:
                    break
                payload = queue.pop(0)
                try:
                    result = handle_payload(payload, first.handle, store=store, clock=clock, max_age_s=1e9, claim_s=120)
                    report.outcomes[result.outcome.value] += 1
                except Exception:  # a crash or a transient error: Pub/Sub redelivers it later
                    report.outcomes["redelivered"] += 1
                    queue.insert(min(len(queue), rng.randint(1, 3)), payload)
            if rng.random() < 0.1:
                _fault(world, rng)
            if rng.random() < 0.05:
                _preempt_something(world, rng)
            world.advance(STEP_S)
            tick(first if step % 3 else second)
            if rng.random() < 0.5:
                _monitor(store)
        # Settle: faults and crashes stop, late redeliveries arrive, ticks run.
        knobs.enabled = False
        world.clear_faults()
        for payload in queue:
            handle_payload(payload, first.handle, store=store, clock=clock, max_age_s=1e9, claim_s=120)
        for step in range(SETTLE_STEPS):
            world.advance(STEP_S if step < SETTLE_STEPS - 4 else 600)
            tick(first)
            _monitor(store)
        world.advance(STEP_S)
        tick(first)  # the janitor's last word
        report.problems = _check(world, store)
        report.crashes = chaotic.crashed
        report.outcomes.update(interleaved=chaotic.interleaved, stalled=chaotic.stalled)
    finally:
        store.close()
    return report


def _monitor(store: SqliteStateStore) -> None:
    """What functions/monitor does once vLLM answers on a new slice: BOOTING becomes SERVING."""
    for record in store.list_deployments():
        if record.status.phase is Phase.BOOTING:
            status = record.status.model_copy(update={"phase": Phase.SERVING})
            with contextlib.suppress(ConflictError):
                store.put_deployment(record.model_copy(update={"status": status}), expected_version=record.version)


def _fault(world: World, rng: random.Random) -> None:
    endpoint = rng.choice(
        ["create_queued_resource", "get_operation", "list_queued_resources", "delete_queued_resource", "list_nodes"]
    )
    status = 429 if endpoint == "create_queued_resource" and rng.random() < 0.5 else 503
    world.inject_fault({"endpoint": endpoint, "status": status, "times": rng.randint(1, 3)})


def _preempt_something(world: World, rng: random.Random) -> None:
    active = [
        (q["name"].split("/")[3], q["name"].rsplit("/", 1)[1])
        for q in world.state(events=0)["queued_resources"]
        if q["state"]["state"] == "ACTIVE" and "spot" in q
    ]
    if active:
        zone, name = rng.choice(active)
        world.preempt(zone, queued_resource=name)


def _labelled(world: World) -> dict[str, dict[str, str]]:
    """deployment -> {queued resource name: state} for every labelled queued resource not being deleted."""
    found: dict[str, dict[str, str]] = {}
    for item in world.state(events=0)["queued_resources"]:
        labels = item.get("tpu", {}).get("nodeSpec", [{}])[0].get("node", {}).get("labels", {})
        owner = labels.get("tpuctl-deployment")
        state = item["state"]["state"]
        if owner and state != "DELETING":
            found.setdefault(owner, {})[item["name"].rsplit("/", 1)[-1]] = state
    return found


def _check(world: World, store: SqliteStateStore) -> list[str]:
    problems: list[str] = []
    records = {r.deployment_id: r for r in store.list_deployments(include_deleted=True)}
    live = [d for d, r in records.items() if r.status.phase is not Phase.DELETED]
    invariants = world.invariants(live_deployments=live)
    if invariants["orphans"]:
        problems.append(f"orphans: {invariants['orphans']}")
    if invariants["duplicate_active"]:
        problems.append(f"more than one ACTIVE: {invariants['duplicate_active']}")
    stale = [item for item in invariants["leftovers"] if item["too_old"]]
    if stale:
        problems.append(f"stale leftovers: {stale}")
    labelled = _labelled(world)
    for deployment_id, record in records.items():
        in_world = labelled.get(deployment_id, {})
        refs = {ref.name: ref for ref in record.status.resources}
        untracked = set(in_world) - set(refs)
        if untracked:
            problems.append(f"{deployment_id}: resources the record does not know: {sorted(untracked)}")
        for name, ref in refs.items():
            believed_active = ref.state is QueuedResourceState.ACTIVE and ref.delete_requested_at is None
            if believed_active and in_world.get(name) != "ACTIVE":
                problems.append(f"{deployment_id}: record says {name} ACTIVE, world says {in_world.get(name)}")
        if record.desired is Desired.ABSENT and record.status.phase is not Phase.DELETED:
            problems.append(f"{deployment_id}: deleted long ago but phase {record.status.phase.value}")
        if record.desired is Desired.STOPPED and (record.status.phase is not Phase.STOPPED or in_world):
            problems.append(f"{deployment_id}: stopped long ago but phase {record.status.phase.value}, {in_world}")
        if record.status.phase is Phase.DELETED and in_world:
            problems.append(f"{deployment_id}: DELETED but the world still has {in_world}")
    return problems


@pytest.fixture
def fast_dir(tmp_path: Path) -> Iterator[Path]:
    shm = Path("/dev/shm")
    if shm.is_dir():
        with tempfile.TemporaryDirectory(dir=shm, prefix="tpuctl-chaos-") as folder:
            yield Path(folder)
    else:
        yield tmp_path


def test_hundreds_of_chaotic_runs_settle_safely(fast_dir: Path) -> None:
    failures: list[str] = []
    crashes = 0
    seen: Counter[str] = Counter()
    for seed in range(RUNS):
        world = World(_world(seed, random.Random(seed * 7919)))
        report = chaos_run(seed, world, WorldTpuApi(world), fast_dir / f"run-{seed}.db")
        crashes += report.crashes
        seen.update(report.outcomes)
        failures += [f"seed {seed}: {problem}" for problem in report.problems]
    assert failures == []
    # The chaos did bite: deaths after API calls, duplicates, redeliveries, stale commands, interleaved
    # and stalled reconcilers all happened many times.
    assert crashes > RUNS / 2
    for what in ("duplicate", "redelivered", "failed", "interleaved", "stalled", "tick_crashed"):
        assert seen[what] > 10, (what, seen)


def test_chaos_through_the_real_client_over_http(tpu_sim_factory: TpuSimFactory, fast_dir: Path) -> None:
    for seed in HTTP_SEEDS:
        sim = tpu_sim_factory(_world(seed, random.Random(seed * 7919)))
        report = chaos_run(seed, sim.world, sim.api, fast_dir / f"http-{seed}.db")
        assert report.problems == [], report.problems
        assert report.ticks >= CHAOS_STEPS + SETTLE_STEPS

"""Chaos on the second back end: Compute Engine TPU VMs alone, and mixed with queued resources.

Same targets as the TPU API chaos suite (tests/service/test_chaos.py): hundreds of seeded runs with
duplicate and out-of-order command deliveries (through the real entry path and command ledger), crashes
between an API call and the state write, injected 429/503 answers on both APIs, spot preemptions of
instances and queued resources, and two reconcilers at once. After the faults stop and the system
settles, every run must show zero orphans, at most one ACTIVE slice per deployment *across both APIs*, no
stale leftover, and records that match the simulated world.

Worlds: ``compute`` runs put every deployment on Compute Engine; ``mixed`` runs offer some zones only
through Compute Engine, some only through the TPU API and some through both, with deployments on
``compute-engine``, ``tpu-api`` or ``any``. The seeded runs call the simulator in-process through the real
clients (``WorldTpuApi``, ``WorldComputeTpu``: no sockets); a few seeds also run over HTTP.
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
from localcloud.world_compute import WorldComputeTpu
from localcloud.world_tpu import WorldTpuApi
from shared.adapters.multi_backend_tpu import MultiBackendTpu
from shared.adapters.sqlite_store import SqliteStateStore
from shared.domain.cloud import ObservedResource, OperationStatus, ProvisionRequest
from shared.domain.errors import ConflictError
from shared.domain.models import Backend, DeploymentSpec, Desired, Phase, QueuedResourceState, Tier
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
from tests.support.fixtures_compute_sim import ComputeSimFactory

COMPUTE_RUNS = 150
MIXED_RUNS = 150
HTTP_SEEDS = (2001, 2002)
BOTH = ("us-east5-b", "us-central1-b")
COMPUTE_ONLY = ("asia-northeast1-a",)
TPU_ONLY = ("europe-west4-a",)
ZONES = BOTH + COMPUTE_ONLY + TPU_ONLY
STEP_S = 120
CHAOS_STEPS = 16
SETTLE_STEPS = 14
COMPUTE_FAULTS = (
    "compute.instances.insert",
    "compute.zoneOperations.get",
    "compute.instances.aggregatedList",
    "compute.instances.delete",
)
TPU_FAULTS = ("create_queued_resource", "get_operation", "list_queued_resources", "delete_queued_resource")


class Crash(Exception):
    """The function instance died: the API call happened, nothing after it did."""


@dataclass
class Knobs:
    crash: float
    interleave: float
    stall: float
    enabled: bool = True


class ChaoticTpu:
    """Wraps the multi-back-end adapter: dies after calls, runs a second reconciler inside one, stalls."""

    def __init__(self, inner: TpuApi, rng: random.Random, knobs: Knobs, world: World) -> None:
        self.inner = inner
        self.rng = rng
        self.knobs = knobs
        self.world = world
        self.interleave: Callable[[], None] | None = None
        self.busy = False
        self.counts: Counter[str] = Counter()

    def _around(self, call: Callable[[], Any]) -> Any:
        if self.knobs.enabled and not self.busy:
            self.busy = True
            try:
                if self.interleave is not None and self.rng.random() < self.knobs.interleave:
                    self.counts["interleaved"] += 1
                    self.interleave()
                if self.rng.random() < self.knobs.stall:
                    self.counts["stalled"] += 1
                    self.world.advance(150)  # past the 120 s lease: the next write must be fenced
            finally:
                self.busy = False
        result = call()
        if self.knobs.enabled and self.rng.random() < self.knobs.crash:
            self.counts["crashed"] += 1
            raise Crash("died after the API call, before the state write")
        return result

    def create(self, request: ProvisionRequest) -> OperationStatus:
        self.counts[f"create:{request.backend.value}"] += 1
        return self._around(lambda: self.inner.create(request))  # type: ignore[no-any-return]

    def delete(
        self, zone: str, resource_id: str, *, force: bool, request_id: str | None = None
    ) -> OperationStatus | None:
        return self._around(  # type: ignore[no-any-return]
            lambda: self.inner.delete(zone, resource_id, force=force, request_id=request_id)
        )

    def list(self, zone: str = "-") -> list[ObservedResource]:
        return self.inner.list(zone)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def world_of(seed: int, mixed: bool) -> dict[str, Any]:
    rng = random.Random(seed * 7919)
    zones: dict[str, Any] = {}
    for zone in ZONES if mixed else BOTH + COMPUTE_ONLY:
        arrival = rng.choice([0, 0, 300, 900, 1800, None])
        spot: dict[str, Any] = {"chips": 8 if arrival == 0 else 0}
        if arrival:
            spot["timeline"] = [{"at_s": arrival, "chips": 8}]
        spec: dict[str, Any] = {
            "capacity": {"v6e": {"spot": spot, "on_demand": rng.choice([0, 4, 8]), "flex_start": rng.choice([0, 4])}},
            "preemption": {"hazard_per_hour": rng.choice([0.0, 0.0, 1.0, 3.0])},
        }
        if zone in COMPUTE_ONLY:
            spec["served"] = False  # the TPU API refuses the zone; Compute Engine serves it
            spec["compute"] = {"served": True}
        if zone in TPU_ONLY:
            spec["compute"] = {"served": False}
        zones[zone] = spec
    quotas = [{"metric": "preemptible", "region": "us-central1", "limit": rng.choice([0, 4, 64])}]
    return {"name": f"ce-chaos-{seed}", "seed": seed, "zones": zones, "compute_quotas": quotas}


def spec_of(name: str, rng: random.Random, mixed: bool) -> DeploymentSpec:
    zones = ZONES if mixed else BOTH + COMPUTE_ONLY
    backends = [Backend.COMPUTE_ENGINE, Backend.ANY, Backend.TPU_API] if mixed else [Backend.COMPUTE_ENGINE]
    return DeploymentSpec(
        deployment_id=name,
        model="gemma-4-e4b",
        accelerator="v6e-4",
        zones=tuple(rng.sample(zones, rng.randint(2, len(zones)))),
        tiers=tuple(rng.sample([Tier.SPOT, Tier.ON_DEMAND, Tier.FLEX_START], rng.randint(1, 3))),
        backend=rng.choice(backends),
        hedge=rng.randint(1, 2),
        valid_until_minutes=rng.choice([5, 10, 240]),
        max_run_hours=rng.choice([0.5, 4.0]),
    )


def commands_of(rng: random.Random, now: Any, mixed: bool) -> list[Any]:
    def envelope() -> dict[str, Any]:
        return {"command_id": str(uuid.UUID(int=rng.getrandbits(128), version=4)), "issued_at": now}

    messages: list[Any] = [
        CreateDeployment(deployment_id=name, spec=spec_of(name, rng, mixed), **envelope()) for name in ("alpha", "beta")
    ]
    if rng.random() < 0.5:
        update = spec_of("alpha", rng, mixed)
        messages.append(UpdateDeployment(deployment_id="alpha", spec=update, expected_generation=1, **envelope()))
    if rng.random() < 0.4:
        messages.append(DeleteDeployment(deployment_id="beta", **envelope()))
    if rng.random() < 0.3:
        messages.append(StopDeployment(deployment_id="alpha", **envelope()))
        messages.append(StartDeployment(deployment_id="alpha", **envelope()))
    payloads = [PubSubPayload(data=encode_message(m), message_id=f"m{i}") for i, m in enumerate(messages)]
    delivered = list(payloads)
    for payload in payloads:
        if rng.random() < 0.4:
            delivered.insert(rng.randint(0, len(delivered)), payload)
    for index in range(len(delivered) - 1):
        if rng.random() < 0.35:
            delivered[index], delivered[index + 1] = delivered[index + 1], delivered[index]
    return delivered


@dataclass
class RunReport:
    seed: int
    problems: list[str] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)


def chaos_run(seed: int, world: World, tpu: TpuApi, store_path: Path, *, mixed: bool) -> RunReport:
    rng = random.Random(seed)
    report = RunReport(seed)
    store = SqliteStateStore(store_path)
    knobs = Knobs(
        crash=rng.choice([0.0, 0.1, 0.25]), interleave=rng.choice([0.0, 0.2]), stall=rng.choice([0.0, 0.0, 0.05])
    )
    chaotic = ChaoticTpu(tpu, rng, knobs, world)
    clock = world.clock
    first = Provisioner(store, chaotic, clock, settings=ProvisionerSettings(holder="r1"))  # type: ignore[arg-type]
    second = Provisioner(store, chaotic, clock, settings=ProvisionerSettings(holder="r2"))  # type: ignore[arg-type]

    def tick(provisioner: Provisioner) -> None:
        try:
            provisioner.handle(ReconcileTick(command_id=str(uuid.uuid4()), issued_at=clock.now()))
        except Crash:
            report.counts["tick_crashed"] += 1

    chaotic.interleave = lambda: tick(second)
    queue = commands_of(rng, clock.now(), mixed)
    try:
        for step in range(CHAOS_STEPS):
            for _ in range(rng.choice([0, 1, 1, 2])):
                if not queue:
                    break
                payload = queue.pop(0)
                try:
                    result = handle_payload(payload, first.handle, store=store, clock=clock, max_age_s=1e9, claim_s=120)
                    report.counts[result.outcome.value] += 1
                except Exception:  # a crash or a transient error: Pub/Sub redelivers it later
                    report.counts["redelivered"] += 1
                    queue.insert(min(len(queue), rng.randint(1, 3)), payload)
            if rng.random() < 0.15:
                endpoint = rng.choice(COMPUTE_FAULTS + (TPU_FAULTS if mixed else ()))
                status = 429 if ("insert" in endpoint or "create" in endpoint) and rng.random() < 0.5 else 503
                world.inject_fault({"endpoint": endpoint, "status": status, "times": rng.randint(1, 3)})
                report.counts["faults"] += 1
            if rng.random() < 0.08:
                report.counts["preempted"] += preempt_something(world, rng)
            world.advance(STEP_S)
            tick(first if step % 3 else second)
            if rng.random() < 0.5:
                serve(store)
        knobs.enabled = False
        world.clear_faults()
        for payload in queue:
            handle_payload(payload, first.handle, store=store, clock=clock, max_age_s=1e9, claim_s=120)
        for step in range(SETTLE_STEPS):
            world.advance(STEP_S if step < SETTLE_STEPS - 4 else 600)
            tick(first)
            serve(store)
        world.advance(STEP_S)
        tick(first)  # the janitor's last word
        report.problems = check(world, store)
        report.counts.update(chaotic.counts)
        report.counts.update(f"won:{r.status.backend.value}" for r in store.list_deployments() if r.status.backend)
    finally:
        store.close()
    return report


def serve(store: SqliteStateStore) -> None:
    """What functions/monitor does once vLLM answers on a new slice: BOOTING becomes SERVING."""
    for record in store.list_deployments():
        if record.status.phase is Phase.BOOTING:
            status = record.status.model_copy(update={"phase": Phase.SERVING})
            with contextlib.suppress(ConflictError):
                store.put_deployment(record.model_copy(update={"status": status}), expected_version=record.version)


def preempt_something(world: World, rng: random.Random) -> int:
    state = world.state(events=0)
    running = [
        ("instance", item["zone"].rsplit("/", 1)[-1], item["name"])
        for item in state["compute"]["instances"]
        if item["status"] == "RUNNING" and item["scheduling"].get("provisioningModel") == "SPOT"
    ]
    running += [
        ("qr", item["name"].split("/")[3], item["name"].rsplit("/", 1)[-1])
        for item in state["queued_resources"]
        if item["state"]["state"] == "ACTIVE" and "spot" in item
    ]
    if not running:
        return 0
    kind, zone, name = rng.choice(running)
    if kind == "instance":
        world.preempt(zone, instance=name)
    else:
        world.preempt(zone, queued_resource=name)
    return 1


def labelled(world: World) -> dict[str, dict[str, str]]:
    """deployment -> {resource name: state in domain terms} for every labelled resource not being deleted."""
    found: dict[str, dict[str, str]] = {}
    state = world.state(events=0)
    for item in state["queued_resources"]:
        labels = item.get("tpu", {}).get("nodeSpec", [{}])[0].get("node", {}).get("labels", {})
        owner = labels.get("tpuctl-deployment")
        if owner and item["state"]["state"] != "DELETING":
            found.setdefault(owner, {})[item["name"].rsplit("/", 1)[-1]] = item["state"]["state"]
    for item in state["compute"]["instances"]:
        owner = item.get("labels", {}).get("tpuctl-deployment")
        deleting = item.get("statusMessage") == "Instance is being deleted."
        if owner and not deleting:
            found.setdefault(owner, {})[item["name"]] = "ACTIVE" if item["status"] == "RUNNING" else item["status"]
    return found


def check(world: World, store: SqliteStateStore) -> list[str]:
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
    in_world_all = labelled(world)
    for deployment_id, record in records.items():
        in_world = in_world_all.get(deployment_id, {})
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
        with tempfile.TemporaryDirectory(dir=shm, prefix="tpuctl-ce-chaos-") as folder:
            yield Path(folder)
    else:
        yield tmp_path


def in_process(world: World) -> MultiBackendTpu:
    return MultiBackendTpu({Backend.COMPUTE_ENGINE: WorldComputeTpu(world), Backend.TPU_API: WorldTpuApi(world)})


@pytest.mark.parametrize(("mixed", "runs"), [(False, COMPUTE_RUNS), (True, MIXED_RUNS)], ids=["compute", "mixed"])
def test_hundreds_of_chaotic_runs_settle_safely(fast_dir: Path, mixed: bool, runs: int) -> None:
    failures: list[str] = []
    seen: Counter[str] = Counter()
    for seed in range(runs):
        world = World(world_of(seed, mixed))
        tpu = in_process(world)
        try:
            report = chaos_run(seed, world, tpu, fast_dir / f"run-{seed}.db", mixed=mixed)
        finally:
            tpu.close()
        seen.update(report.counts)
        failures += [f"seed {seed}: {problem}" for problem in report.problems]
    assert failures == []
    # The chaos did bite, on the back end under test.
    for what in ("crashed", "duplicate", "redelivered", "interleaved", "stalled", "tick_crashed", "faults"):
        assert seen[what] > 10, (what, seen)
    assert seen["create:compute-engine"] > runs
    assert seen["won:compute-engine"] > runs / 4
    if mixed:
        assert seen["create:tpu-api"] > runs / 2
        assert seen["won:tpu-api"] > runs / 10


def test_chaos_through_the_real_clients_over_http(compute_sim_factory: ComputeSimFactory, fast_dir: Path) -> None:
    for seed in HTTP_SEEDS:
        sim = compute_sim_factory(world_of(seed, True))
        report = chaos_run(seed, sim.world, sim.multi, fast_dir / f"http-{seed}.db", mixed=True)
        assert report.problems == [], report.problems
        assert report.counts["create:compute-engine"] + report.counts["create:tpu-api"] > 0

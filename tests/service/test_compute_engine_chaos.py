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
clients (``InProcessTpuApi``, ``InProcessComputeTpu``: no sockets); a few seeds also run over HTTP.
"""

from __future__ import annotations

import random
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localcloud.in_process_compute import InProcessComputeTpu
from localcloud.in_process_tpu import InProcessTpuApi
from localcloud.tpu_sim import World
from shared.adapters.multi_backend_tpu import MultiBackendTpu
from shared.domain.models import Backend, DeploymentSpec, Tier
from shared.messages import (
    CreateDeployment,
    DeleteDeployment,
    StartDeployment,
    StopDeployment,
    UpdateDeployment,
)
from shared.ports import TpuApi
from tests.support.chaos import RunReport, chaos_run, deliveries, fast_folder
from tests.support.fixtures_compute_sim import ComputeSimFactory

COMPUTE_RUNS = 150
MIXED_RUNS = 150
HTTP_SEEDS = (2001, 2002)
BOTH = ("us-east5-b", "us-central1-b")
COMPUTE_ONLY = ("asia-northeast1-a",)
TPU_ONLY = ("europe-west4-a",)
ZONES = BOTH + COMPUTE_ONLY + TPU_ONLY
COMPUTE_FAULTS = (
    "compute.instances.insert",
    "compute.zoneOperations.get",
    "compute.instances.aggregatedList",
    "compute.instances.delete",
)
TPU_FAULTS = ("create_queued_resource", "get_operation", "list_queued_resources", "delete_queued_resource")


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
    return deliveries(messages, rng)


def disturb(world: World, rng: random.Random, counts: Counter[str], *, mixed: bool) -> None:
    """Now and then an injected 429/503 on either API, more rarely a spot preemption of either kind."""
    if rng.random() < 0.15:
        endpoint = rng.choice(COMPUTE_FAULTS + (TPU_FAULTS if mixed else ()))
        status = 429 if ("insert" in endpoint or "create" in endpoint) and rng.random() < 0.5 else 503
        world.inject_fault({"endpoint": endpoint, "status": status, "times": rng.randint(1, 3)})
        counts["faults"] += 1
    if rng.random() < 0.08:
        counts["preempted"] += preempt_something(world, rng)


def run_seed(seed: int, world: World, tpu: TpuApi, store_path: Path, *, mixed: bool) -> RunReport:
    return chaos_run(
        seed,
        world,
        tpu,
        store_path,
        commands=lambda rng, now: commands_of(rng, now, mixed),
        disturb=lambda world, rng, counts: disturb(world, rng, counts, mixed=mixed),
        labelled=labelled,
    )


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


@pytest.fixture
def fast_dir(tmp_path: Path) -> Iterator[Path]:
    with fast_folder(tmp_path, "tpuctl-ce-chaos-") as folder:
        yield folder


def in_process(world: World) -> MultiBackendTpu:
    return MultiBackendTpu(
        {Backend.COMPUTE_ENGINE: InProcessComputeTpu(world), Backend.TPU_API: InProcessTpuApi(world)}
    )


@pytest.mark.parametrize(("mixed", "runs"), [(False, COMPUTE_RUNS), (True, MIXED_RUNS)], ids=["compute", "mixed"])
def test_hundreds_of_chaotic_runs_settle_safely(fast_dir: Path, mixed: bool, runs: int) -> None:
    failures: list[str] = []
    seen: Counter[str] = Counter()
    for seed in range(runs):
        world = World(world_of(seed, mixed))
        tpu = in_process(world)
        try:
            report = run_seed(seed, world, tpu, fast_dir / f"run-{seed}.db", mixed=mixed)
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
        report = run_seed(seed, sim.world, sim.multi, fast_dir / f"http-{seed}.db", mixed=True)
        assert report.problems == [], report.problems
        assert report.counts["create:compute-engine"] + report.counts["create:tpu-api"] > 0

"""Chaos: hundreds of seeded runs of commands and ticks against a hostile simulated TPU API.

Each run mixes duplicate and out-of-order command deliveries (through the real entry path and command
ledger), crashes between an API call and the state write, injected 429/503 answers, spot preemptions
(hazard and on demand) and two reconcilers at once (one interleaved inside the other's API calls, and
one that stalls past its lease). Then the faults stop, the system settles, one more janitor tick runs,
and every run must show: at most one ACTIVE queued resource per deployment, zero orphans, no stale
FAILED/SUSPENDED leftover, and records that match the simulator.

The seeded runs call the simulator in-process (``InProcessTpuApi``: the real adapter's normalisation and
error mapping, without sockets) to stay fast; a few seeds also run over HTTP with the real
google-cloud-tpu client. Stores live in /dev/shm when it exists (SQLite fsyncs every write).
"""

from __future__ import annotations

import random
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localcloud.in_process_tpu import InProcessTpuApi
from localcloud.tpu_sim import World
from shared.domain.models import DeploymentSpec, Tier
from shared.entry import PubSubPayload
from shared.messages import (
    CreateDeployment,
    DeleteDeployment,
    StartDeployment,
    StopDeployment,
    UpdateDeployment,
)
from shared.ports import TpuApi
from tests.support.chaos import CHAOS_STEPS, SETTLE_STEPS, RunReport, chaos_run, deliveries, fast_folder
from tests.support.fixtures_tpu_sim import TpuSimFactory

RUNS = 300
HTTP_SEEDS = (1001, 1002, 1003)
ZONES = ("us-central1-b", "us-east1-d", "europe-west4-a", "us-east5-b")


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


def _deliveries(rng: random.Random, now: Any) -> list[PubSubPayload]:
    return deliveries(_commands(rng, now), rng)


def _disturb(world: World, rng: random.Random, counts: Counter[str]) -> None:
    """Now and then an injected 429/503 on the TPU API, more rarely a spot preemption."""
    if rng.random() < 0.1:
        _fault(world, rng)
    if rng.random() < 0.05:
        _preempt_something(world, rng)


def _chaos_run(seed: int, world: World, tpu: TpuApi, store_path: Path) -> RunReport:
    return chaos_run(seed, world, tpu, store_path, commands=_deliveries, disturb=_disturb, labelled=_labelled)


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


@pytest.fixture
def fast_dir(tmp_path: Path) -> Iterator[Path]:
    with fast_folder(tmp_path, "tpuctl-chaos-") as folder:
        yield folder


def test_hundreds_of_chaotic_runs_settle_safely(fast_dir: Path) -> None:
    failures: list[str] = []
    crashes = 0
    seen: Counter[str] = Counter()
    for seed in range(RUNS):
        world = World(_world(seed, random.Random(seed * 7919)))
        report = _chaos_run(seed, world, InProcessTpuApi(world), fast_dir / f"run-{seed}.db")
        crashes += report.counts["crashed"]
        seen.update(report.counts)
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
        report = _chaos_run(seed, sim.world, sim.api, fast_dir / f"http-{seed}.db")
        assert report.problems == [], report.problems
        assert report.ticks >= CHAOS_STEPS + SETTLE_STEPS

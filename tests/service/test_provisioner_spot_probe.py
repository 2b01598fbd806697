"""The spot probe in the provisioner, on the simulator through the real TPU adapter: a waiting flex-start request is
probed with a spot create that never queues; a grant means the wait is held by quota (the request is parked and the
search widens to another region at once), a stockout means it is held by capacity (zone memory handles it). Probes
are rate-limited, recorded next to the attempts, never adopted, and never left behind (issue 21, item 4)."""

from __future__ import annotations

import dataclasses
import itertools
import random
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from localcloud.in_process_tpu import InProcessTpuApi
from localcloud.tpu_sim import World
from shared.domain.attempts import Step
from shared.domain.cloud import LABEL_PROBE, OperationStatus, ProvisionRequest
from shared.domain.models import AttemptLog, Backend, DeploymentSpec, Phase, Tier
from shared.domain.spot_probe import ProbePolicy
from shared.entry import PubSubPayload
from shared.messages import CreateDeployment, DeleteDeployment
from shared.ports import TpuApi
from shared.services.provisioner import ProvisionerSettings
from tests.support.chaos import Crash, chaos_run, deliveries, fast_folder
from tests.support.fixtures_compute_sim import ComputeSimFactory
from tests.support.fixtures_provisioner import HarnessFactory, world
from tests.support.provisioner_harness import Harness, make_spec

FIRST, SECOND = "us-east5-b", "europe-west4-a"  # the search's order for flex-start (cheapest first)
PROBING = ProvisionerSettings(holder="test-provisioner", probe=ProbePolicy())


def _zone(flex: int, spot: int) -> dict[str, Any]:
    return {"capacity": {"v6e": {"flex_start": flex, "spot": spot}}}


def _flex_spec(deployment_id: str = "gemma", zones: tuple[str, ...] = (FIRST, SECOND)) -> DeploymentSpec:
    return make_spec(deployment_id, zones=zones, tiers=(Tier.FLEX_START,))


def _steps(h: Harness, deployment_id: str = "gemma") -> list[AttemptLog]:
    return [a for a in h.record(deployment_id).status.attempts if str(a.outcome).startswith("probe_")]


def _probe_nodes(h: Harness) -> dict[str, str]:
    """name -> state of every node in the world that carries the probe label."""
    return {
        node["name"].rsplit("/", 1)[-1]: node["state"]
        for node in h.world.state(events=0)["nodes"]
        if LABEL_PROBE in node.get("labels", {})
    }


def _requested(h: Harness) -> list[tuple[str, float]]:
    """(zone, minutes after the first request) of every request the search sent."""
    asks = [a for a in h.record().status.attempts if a.outcome == Step.REQUESTED]
    return [(a.zone, (a.at - asks[0].at).total_seconds() / 60) for a in asks]


def test_a_granted_probe_finds_the_wait_quota_bound_and_the_search_widens_at_once(
    harness_factory: HarnessFactory,
) -> None:
    h = harness_factory(world({FIRST: _zone(flex=0, spot=8), SECOND: _zone(flex=4, spot=0)}), settings=PROBING)
    h.create(_flex_spec())
    h.run_until_phase(Phase.BOOTING, minutes=30)
    record = h.record()
    assert [a.outcome for a in _steps(h)] == [Step.PROBE_SENT, Step.PROBE_QUOTA]
    assert _steps(h)[1].zone == FIRST and "held by quota" in _steps(h)[1].detail
    first = next(r for r in record.status.resources if r.zone == FIRST)
    assert first.probe == "quota"
    # Widened to the other region before the 5-minute capacity check of the first request was over.
    assert [zone for zone, _ in _requested(h)] == [FIRST, SECOND]
    assert _requested(h)[1][1] < 5
    assert record.status.zone == SECOND
    memory = h.memory()
    assert memory["quotabound/us-east5/v6e/flex_start"].error_class == "quota_bound"
    assert "stockout/us-east5-b/v6e/flex_start" not in memory  # parked for quota, not learned as a stockout
    h.run(5)
    assert _probe_nodes(h) == {} and h.record().status.probes == []
    assert _spot_chip_hours(h) == 0.0  # deleted once past its capacity check, before it booted and billed
    h.assert_invariants()


def test_a_probe_that_stocks_out_leaves_the_wait_to_its_capacity_check(harness_factory: HarnessFactory) -> None:
    h = harness_factory(world({FIRST: _zone(flex=0, spot=0), SECOND: _zone(flex=4, spot=0)}), settings=PROBING)
    h.create(_flex_spec())
    h.run_until_phase(Phase.BOOTING, minutes=30)
    assert [a.outcome for a in _steps(h)] == [Step.PROBE_SENT, Step.PROBE_CAPACITY]
    assert next(r for r in h.record().status.resources if r.zone == FIRST).probe == "capacity"
    assert _requested(h)[1][1] >= 5  # the capacity check ran its course, as without a probe
    assert "stockout/us-east5-b/v6e/spot" not in h.memory()  # one sample: the spot pair keeps its rank
    assert not any(key.startswith("quotabound/") for key in h.memory())
    assert _spot_chip_hours(h) == 0.0  # a failed probe costs nothing
    h.run(3)
    assert _probe_nodes(h) == {} and h.record().status.probes == []
    h.assert_invariants()


def _spot_chip_hours(h: Harness) -> float:
    """Chip-hours the world billed for spot: only a probe asks for spot in these flex-start searches."""
    return float(h.world.billing()["by_tier"].get("spot", {}).get("chip_hours", 0.0))


def test_without_a_probe_policy_nothing_is_probed(harness_factory: HarnessFactory) -> None:
    h = harness_factory(world({FIRST: _zone(flex=0, spot=8), SECOND: _zone(flex=4, spot=0)}))
    h.create(_flex_spec())
    h.run_until_phase(Phase.BOOTING, minutes=30)
    assert _steps(h) == [] and _probe_nodes(h) == {}
    assert _requested(h)[1][1] >= 5


def test_one_probe_per_zone_across_deployments_and_per_tick_over_all(harness_factory: HarnessFactory) -> None:
    third = "us-central1-b"
    scene = world({FIRST: _zone(flex=0, spot=0), SECOND: _zone(flex=0, spot=0), third: _zone(flex=0, spot=0)})
    one_a_tick = dataclasses.replace(PROBING, probe=ProbePolicy(per_tick=1))
    h = harness_factory(scene, settings=one_a_tick)
    for name in ("alpha", "beta"):
        h.create(_flex_spec(name, zones=(FIRST,)))
    h.create(_flex_spec("gamma", zones=(third,)))
    h.run(12)
    sent = {name: [a for a in _steps(h, name) if a.outcome == Step.PROBE_SENT] for name in ("alpha", "beta", "gamma")}
    assert len(sent["alpha"]) + len(sent["beta"]) == 1  # one probe in FIRST within its 15-minute zone interval
    assert len(sent["gamma"]) == 1
    times = sorted(a.at for attempts in sent.values() for a in attempts)
    assert times[1] - times[0] >= timedelta(seconds=60)  # one probe a tick over every deployment


def test_one_probe_per_waiting_request_and_one_in_flight_per_deployment(harness_factory: HarnessFactory) -> None:
    third = "us-central1-b"
    scene = world({FIRST: _zone(flex=0, spot=0), SECOND: _zone(flex=0, spot=0), third: _zone(flex=0, spot=0)})
    h = harness_factory(scene, settings=PROBING)
    spec = make_spec(zones=(FIRST, SECOND, third), tiers=(Tier.FLEX_START,), hedge=3)
    h.create(spec)
    h.run(2)
    assert [a.outcome for a in _steps(h)] == [Step.PROBE_SENT, Step.PROBE_CAPACITY]  # three wait; one probed
    h.run(30)
    probed = [a.zone for a in _steps(h) if a.outcome == Step.PROBE_SENT]
    assert len(probed) == len(set(probed)) == 3  # then the others, each once, the deployment's interval apart
    sent = [a.at for a in _steps(h) if a.outcome == Step.PROBE_SENT]
    interval = timedelta(seconds=ProbePolicy().deployment_interval_s)
    assert all(later - earlier >= interval for earlier, later in itertools.pairwise(sent))


def test_duplicate_commands_and_repeated_reconciles_send_one_probe(harness_factory: HarnessFactory) -> None:
    h = harness_factory(world({FIRST: _zone(flex=0, spot=8), SECOND: _zone(flex=0, spot=0)}), settings=PROBING)
    spec = _flex_spec(zones=(FIRST,))
    command = CreateDeployment(deployment_id="gemma", spec=spec, command_id=str(uuid.uuid4()), issued_at=h.clock.now())
    for _ in range(2):
        h.provisioner.handle(command)
    h.world.advance(150)
    for _ in range(3):  # the same instant: ticks and nudges that repeat must not repeat the probe
        h.tick()
        h.provisioner.reconcile("gemma")
    assert len([a for a in _steps(h) if a.outcome == Step.PROBE_SENT]) == 1
    assert list(_probe_nodes(h)) == [h.record().status.probes[0].name]
    h.run(10)
    assert _probe_nodes(h) == {} and h.record().status.probes == []
    assert h.record().status.phase is Phase.SEARCHING  # the probe's chips were never taken as the slice
    h.assert_invariants()


class CrashAfterProbe:
    """The TPU port, except that the function dies right after the first probe create reached the provider."""

    def __init__(self, inner: TpuApi) -> None:
        self.inner = inner
        self.crashed = False

    def create(self, request: ProvisionRequest) -> OperationStatus:
        status = self.inner.create(request)
        if not request.queued and not self.crashed:
            self.crashed = True
            raise Crash("died after the probe create")
        return status

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_crash_after_the_probe_create_and_a_delete_leave_no_probe_behind(harness_factory: HarnessFactory) -> None:
    h = harness_factory(world({FIRST: _zone(flex=0, spot=8), SECOND: _zone(flex=0, spot=0)}), settings=PROBING)
    crashing = CrashAfterProbe(h.tpu)
    h.provisioner = h.another(tpu=crashing)  # type: ignore[arg-type]
    h.create(_flex_spec(zones=(FIRST,)))
    h.world.advance(150)
    with pytest.raises(Crash):
        h.tick()
    assert crashing.crashed and len(_probe_nodes(h)) == 1
    assert h.record().status.probes[0].confirmed is False  # recorded before the call, never confirmed
    h.provisioner = h.another()
    h.run(1)
    h.delete()
    h.run(6)
    assert h.record().status.phase is Phase.DELETED
    assert _probe_nodes(h) == {}
    assert h.world.invariants(live_deployments=[])["orphans"] == []


def test_the_janitor_deletes_a_probe_node_no_status_holds(harness_factory: HarnessFactory) -> None:
    h = harness_factory(world({FIRST: _zone(flex=0, spot=8)}), settings=PROBING)
    h.create(_flex_spec(zones=(FIRST,)))
    stray = ProvisionRequest(
        resource_id="gemma-g9-a9-p",
        node_id="gemma-g9-a9-p",
        zone=FIRST,
        accelerator="v6e-4",
        tier=Tier.SPOT,
        request_id=str(uuid.uuid4()),
        labels={"tpuctl-deployment": "gemma", LABEL_PROBE: "gemma-g9-a9", "managed-by": "tpuctl"},
        queued=False,
    )
    h.tpu.create(stray)
    h.run(4)
    assert "gemma-g9-a9-p" not in _probe_nodes(h)
    assert any("janitor: removed" in tick for tick in h.ticks)


# ---------------------------------------------------------------------------------------------- chaos

ZONES = ("us-central1-b", "europe-west4-a", "us-east5-b")


def _chaos_world(seed: int, rng: random.Random) -> dict[str, Any]:
    zones = {
        zone: {
            "capacity": {
                "v6e": {
                    "flex_start": {"chips": 0, "timeline": [{"at_s": rng.choice([600, 1800, 3600]), "chips": 4}]},
                    "spot": rng.choice([0, 4, 8]),
                }
            }
        }
        for zone in ZONES
    }
    return {"name": f"probe-chaos-{seed}", "seed": seed, "zones": zones}


def _chaos_commands(rng: random.Random, now: Any) -> list[PubSubPayload]:
    def envelope() -> dict[str, Any]:
        return {"command_id": str(uuid.UUID(int=rng.getrandbits(128), version=4)), "issued_at": now}

    messages: list[Any] = []
    for name in ("alpha", "beta"):
        spec = make_spec(name, zones=tuple(rng.sample(ZONES, 2)), tiers=(Tier.FLEX_START,), hedge=rng.randint(1, 2))
        messages.append(CreateDeployment(deployment_id=name, spec=spec, **envelope()))
    if rng.random() < 0.5:
        messages.append(DeleteDeployment(deployment_id="beta", **envelope()))
    return deliveries(messages, rng)


def _no_disturbance(world: World, rng: random.Random, counts: Counter[str]) -> None:
    if rng.random() < 0.1:
        world.inject_fault({"endpoint": "create_node", "status": rng.choice([429, 503]), "times": 1})


def _labelled_with_probes(world: World) -> dict[str, dict[str, str]]:
    """deployment -> {name: state} of its queued resources and probe nodes that are not going away."""
    found: dict[str, dict[str, str]] = {}
    state = world.state(events=0)
    for item in state["queued_resources"]:
        labels = item.get("tpu", {}).get("nodeSpec", [{}])[0].get("node", {}).get("labels", {})
        if labels.get("tpuctl-deployment") and item["state"]["state"] != "DELETING":
            found.setdefault(labels["tpuctl-deployment"], {})[item["name"].rsplit("/", 1)[-1]] = item["state"]["state"]
    for node in state["nodes"]:
        labels = node.get("labels", {})
        if LABEL_PROBE in labels and node["state"] != "DELETING":
            found.setdefault(labels["tpuctl-deployment"], {})[node["name"].rsplit("/", 1)[-1]] = node["state"]
    return found


@pytest.fixture
def fast_dir(tmp_path: Path) -> Iterator[Path]:
    with fast_folder(tmp_path, "tpuctl-probe-chaos-") as folder:
        yield folder


def test_chaotic_runs_with_probes_settle_with_no_probe_left(fast_dir: Path) -> None:
    failures: list[str] = []
    seen: Counter[str] = Counter()
    probes = 0
    for seed in range(24):
        world_ = World(_chaos_world(seed, random.Random(seed * 104729)))
        report = chaos_run(
            seed,
            world_,
            InProcessTpuApi(world_),
            fast_dir / f"run-{seed}.db",
            commands=_chaos_commands,
            disturb=_no_disturbance,
            labelled=_labelled_with_probes,
            settings=PROBING,
        )
        seen.update(report.counts)
        probes += sum(1 for e in world_.events() if e["kind"] == "node.creating")
        failures += [f"seed {seed}: {problem}" for problem in report.problems]
    assert failures == []
    assert probes > 10  # probes were sent, and crashed around, many times
    assert seen["crashed"] > 10 and seen["duplicate"] > 10


def test_on_compute_engine_the_probe_is_a_spot_vm_deleted_once_granted(
    compute_sim_factory: ComputeSimFactory, tmp_path: Path
) -> None:
    """The same rules on the other back end: a flex-start VM request waits, a spot VM insert answers for it."""
    sim = compute_sim_factory(world({FIRST: _zone(flex=0, spot=8), SECOND: _zone(flex=4, spot=0)}))
    h = Harness(sim.world, sim.multi, tmp_path / "compute.db", settings=PROBING)
    try:
        h.create(_flex_spec().model_copy(update={"backend": Backend.COMPUTE_ENGINE}))
        h.run_until_phase(Phase.BOOTING, minutes=30)
        assert [a.outcome for a in _steps(h)] == [Step.PROBE_SENT, Step.PROBE_QUOTA]
        assert h.record().status.zone == SECOND and _requested(h)[1][1] < 5
        h.run(5)
        kinds = [e["kind"] for e in sim.world.events() if e["resource"] == "gemma-g1-a0-p"]
        assert kinds[0] == "instance.provisioning" and kinds[-1] == "instance.gone"  # a spot VM, then gone
        assert "instance.running" not in kinds  # deleted before it ran, so it never billed
        assert h.record().status.probes == []
        assert sim.world.invariants(live_deployments=["gemma"])["orphans"] == []
    finally:
        h.close()

"""Capacity search per provisioning back end: the TPU API, Compute Engine, or both (issue 11).

The policies are those of ``benchmarks/capacity_search.py`` (ours, the reference agent's sequential
search, SkyPilot-style failover), run on the same seeded worlds, but each may be pinned to a back end:

* ``--backend tpu-api``: queued resources, as in ``capacity_search.py``;
* ``--backend compute-engine``: TPU VMs as Compute Engine instances (flex-start, spot, standard);
* ``--backend any``: ours only: the planner ranks (zone, tier, back end) and may use both.

Scenarios: the shipped ``scarce-v6e`` and ``spot-preemptions`` (every zone offered through both APIs,
so a back end changes only the API, not the capacity) and ``mixed-backends``
(``benchmarks/scenarios/mixed-backends.yaml``: zones offered only through Compute Engine, only through
the TPU API, or both). All calls go through the real adapters in-process (``InProcessTpuApi`` and
``InProcessComputeTpu``, the real google-cloud clients without sockets) behind ``MultiBackendTpu``.

Measured per run, as in ``capacity_search.py``: virtual minutes to an ACTIVE slice, chip-hours billed
but not served, API calls, orphans, availability; plus the most slices ACTIVE at once for the
deployment (the hedge may overlap by one tick) and whether more than one was still ACTIVE at the end.

Usage::

    .venv/bin/python benchmarks/capacity_search_backends.py --runs 200
    .venv/bin/python benchmarks/capacity_search_backends.py --runs 20 --scenario mixed-backends --backend any
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from capacity_search import (
    DEPLOYMENT,
    PLANS,
    Ours,
    Policy,
    RunResult,
    ScenarioPlan,
    Sequential,
    SkyPilot,
    Summary,
    drive,
    markdown,
    seeded_world,
    summarise,
)

from localcloud.in_process_compute import InProcessComputeTpu
from localcloud.in_process_tpu import InProcessTpuApi
from localcloud.tpu_sim import World
from shared.adapters.multi_backend_tpu import MultiBackendTpu
from shared.domain.boot_progress import GuestAttribute
from shared.domain.cloud import ObservedResource, OperationStatus, ProvisionRequest
from shared.domain.models import Backend, Tier

MIXED = Path(__file__).resolve().parent / "scenarios" / "mixed-backends.yaml"
SCENARIOS: dict[str, ScenarioPlan] = {
    "scarce-v6e": PLANS["scarce-v6e"],
    "spot-preemptions": PLANS["spot-preemptions"],
    "mixed-backends": ScenarioPlan("mixed-backends", (Tier.FLEX_START, Tier.SPOT), 4 * 3600.0),
}
COMBINATIONS = (
    ("ours", Backend.TPU_API),
    ("ours", Backend.COMPUTE_ENGINE),
    ("ours", Backend.ANY),
    ("sequential", Backend.TPU_API),
    ("sequential", Backend.COMPUTE_ENGINE),
    ("skypilot", Backend.TPU_API),
    ("skypilot", Backend.COMPUTE_ENGINE),
)
CHIPS = 4


class PinnedTpu:
    """Both adapters behind one router; creates go to ``backend`` unless the request names one (ours)."""

    def __init__(self, world: World, backend: Backend) -> None:
        self.tpu_api = InProcessTpuApi(world)
        self.compute = InProcessComputeTpu(world)
        self.router = MultiBackendTpu({Backend.TPU_API: self.tpu_api, Backend.COMPUTE_ENGINE: self.compute})
        self.backend = backend

    @property
    def total_calls(self) -> int:
        return self.tpu_api.total_calls + sum(self.compute.calls.values())

    def create(self, request: ProvisionRequest) -> OperationStatus:
        if self.backend is not Backend.ANY and request.backend is not self.backend:
            request = request.model_copy(update={"backend": self.backend})
        return self.router.create(request)

    def get_operation(self, name: str) -> OperationStatus:
        return self.router.get_operation(name)

    def get(self, zone: str, resource_id: str) -> ObservedResource | None:
        return self.router.get(zone, resource_id)

    def list(self, zone: str = "-") -> list[ObservedResource]:
        return self.router.list(zone)

    def delete(
        self, zone: str, resource_id: str, *, force: bool, request_id: str | None = None
    ) -> OperationStatus | None:
        return self.router.delete(zone, resource_id, force=force, request_id=request_id)

    def stop_node(self, zone: str, node_id: str) -> OperationStatus:
        return self.router.stop_node(zone, node_id)

    def start_node(self, zone: str, node_id: str) -> OperationStatus:
        return self.router.start_node(zone, node_id)

    def guest_attributes(self, zone: str, node_id: str, query_path: str) -> Sequence[GuestAttribute]:
        return self.router.guest_attributes(zone, node_id, query_path)

    def close(self) -> None:
        self.router.close()


def _is_up(world: World, zone: str, name: str) -> bool:
    return world.qr_state(zone, name) == "ACTIVE" or world.compute.status(zone, name) == "RUNNING"


def _active_count(world: World) -> int:
    """How many slices of the deployment are ACTIVE at once, when more than one (else 0)."""
    report = world.invariants(live_deployments=[DEPLOYMENT])
    return max((len(names) for names in report["duplicate_active"].values()), default=0)


@dataclass
class BackendRun:
    result: RunResult
    backend: Backend
    won: str = ""
    most_active: int = 0
    ended_with_two: bool = False


def run_one(policy_name: str, backend: Backend, plan: ScenarioPlan, seed: int, folder: Path) -> BackendRun:
    started = time.perf_counter()
    world = seeded_world(plan, seed, source=MIXED if plan.name == "mixed-backends" else None)
    tpu = PinnedTpu(world, backend)
    policy: Policy
    if policy_name == "ours":
        policy = Ours(plan, world, tpu, folder)
        policy.spec = policy.spec.model_copy(update={"backend": backend})
    elif policy_name == "sequential":
        policy = Sequential(plan, world, tpu)
    else:
        policy = SkyPilot(plan, world, tpu)
    run = BackendRun(RunResult(f"{policy_name}/{backend.value}", plan.name, seed), backend)

    def note_active() -> None:
        run.most_active = max(run.most_active, _active_count(world))

    def note_winner(zone: str, name: str) -> None:
        run.won = "compute-engine" if world.compute.status(zone, name) else "tpu-api"

    drive(
        policy,
        world,
        tpu,
        run.result,
        is_up=lambda zone, name: _is_up(world, zone, name),
        active_kinds=("qr.active", "instance.running"),
        orphan_kinds=("queued_resource", "instance"),
        after_step=note_active,
        on_first_serving=note_winner,
    )
    run.ended_with_two = _active_count(world) > 1
    run.result.wall_s = time.perf_counter() - started
    tpu.close()
    return run


def _extra(runs: Sequence[BackendRun]) -> str:
    won = {name: sum(1 for r in runs if r.won == name) for name in ("tpu-api", "compute-engine")}
    ever_two = sum(1 for r in runs if r.most_active > 1)
    served = [r.result for r in runs if r.result.used_chip_hours > 0]
    usd = sum(r.used_usd for r in served) / max(1e-9, sum(r.used_chip_hours for r in served))
    two_at_end = sum(1 for r in runs if r.ended_with_two)
    return (
        f"won via tpu-api {won['tpu-api']}, compute-engine {won['compute-engine']}; "
        f"serving slice ${usd:.3f}/chip-h on average; "
        f"runs with >1 slice ACTIVE at a policy step {ever_two}, at the end {two_at_end}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--runs", type=int, default=200, help="seeded runs per scenario and combination")
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), action="append", help="limit to these scenarios")
    parser.add_argument(
        "--backend", choices=[b.value for b in Backend], action="append", help="limit to these back ends"
    )
    parser.add_argument("--policy", choices=["ours", "sequential", "skypilot"], action="append")
    parser.add_argument("--first-seed", type=int, default=1)
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs: must be at least 1")
    logging.disable(logging.WARNING)
    scenarios = args.scenario or list(SCENARIOS)
    combos = [
        (policy, backend)
        for policy, backend in COMBINATIONS
        if (not args.backend or backend.value in args.backend) and (not args.policy or policy in args.policy)
    ]
    shm = Path("/dev/shm")  # noqa: S108 - a private mkdtemp folder in tmpfs: SQLite fsyncs every write
    summaries: list[Summary] = []
    notes: list[str] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else None, prefix="tpuctl-bench-be-") as folder:
        for scenario in scenarios:
            plan = SCENARIOS[scenario]
            for policy, backend in combos:
                seeds = range(args.first_seed, args.first_seed + args.runs)
                runs = [run_one(policy, backend, plan, seed, Path(folder)) for seed in seeds]
                summary = summarise([r.result for r in runs], plan)
                summaries.append(summary)
                line = f"{scenario} {policy}/{backend.value}: {_extra(runs)}"
                notes.append(line)
                print(
                    f"{line}; median {summary.median_min:.1f} min, orphans {summary.orphans:.2f}, "
                    f"{sum(r.result.wall_s for r in runs):.1f} s wall",
                    file=sys.stderr,
                )
    PLANS.update({name: plan for name, plan in SCENARIOS.items() if name not in PLANS})
    print(markdown(summaries))
    print()
    for line in notes:
        print(f"- {line}")
    print(f"\ntotal wall time {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

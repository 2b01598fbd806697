"""Fixtures for the simulator's Compute Engine half: one world served over HTTP, three adapters on it.

``compute_sim_factory(scenario)`` starts a :class:`~localcloud.tpu_sim.World` (a shipped scenario name or a
mapping) and its server, and returns a :class:`ComputeSimHandle` with

- ``ce``: :class:`~shared.adapters.compute_engine_tpu.ComputeEngineTpu` (the real google-cloud-compute client),
- ``tpu``: :class:`~shared.adapters.gcp_tpu.GcpTpuApi` on the same world (the same chips, clock and meter),
- ``multi``: :class:`~shared.adapters.multi_backend_tpu.MultiBackendTpu` over both.

``lab_world(**zones)`` is a scenario with fixed timings (every range collapsed to one value), so a test
knows exactly when a state changes: ``LAB`` holds those seconds. Everything is stopped when the test ends.
This module holds no asserts (PYTEST_DONT_REWRITE).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from localcloud.tpu_sim import SimServer, World
from shared.adapters.compute_engine_tpu import ComputeEngineTpu
from shared.adapters.gcp_tpu import GcpTpuApi
from shared.adapters.multi_backend_tpu import MultiBackendTpu
from shared.domain.models import Backend


@dataclass(frozen=True)
class LabTimings:
    accept_s: float = 2.0
    wait_s: float = 1.0
    capacity_check_s: float = 10.0
    boot_s: float = 60.0
    delete_s: float = 30.0
    flex_refusal_s: float = 10.0
    stop_s: float = 20.0

    @property
    def staged_at(self) -> float:
        """Seconds after an insert when a spot/standard instance with chips is STAGING."""
        return self.accept_s + self.capacity_check_s

    @property
    def running_at(self) -> float:
        return self.staged_at + self.boot_s


LAB = LabTimings()


def lab_world(zones: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A scenario mapping with the fixed ``LAB`` timings."""
    timings = {name: [value, value] for name, value in vars(LAB).items()}
    return {
        "name": extra.pop("name", "compute-lab"),
        "seed": extra.pop("seed", 3),
        "zones": zones,
        "timings": {**timings, "suspend_s": [5, 5], "start_s": [30, 30]},
        **extra,
    }


@dataclass
class ComputeSimHandle:
    world: World
    server: SimServer
    base_url: str
    project: str
    ce: ComputeEngineTpu
    tpu: GcpTpuApi
    multi: MultiBackendTpu

    def advance(self, seconds: float) -> None:
        self.world.advance(seconds)


ComputeSimFactory = Callable[..., ComputeSimHandle]


@pytest.fixture
def compute_sim_factory() -> Iterator[ComputeSimFactory]:
    started: list[ComputeSimHandle] = []

    def start(scenario: str | dict[str, Any]) -> ComputeSimHandle:
        world = World(scenario)
        server = SimServer(world)
        base_url = server.start()
        project = world.scenario.project
        ce = ComputeEngineTpu(project, endpoint=base_url)
        tpu = GcpTpuApi(project, endpoint=base_url)
        multi = MultiBackendTpu({Backend.COMPUTE_ENGINE: ce, Backend.TPU_API: tpu})
        handle = ComputeSimHandle(world, server, base_url, project, ce, tpu, multi)
        started.append(handle)
        return handle

    yield start
    for handle in started:
        handle.multi.close()
        handle.server.stop()

"""Fixtures for provisioner service tests: a harness on the TPU simulator through the real adapter.

``harness_factory(scenario, settings=..., scheduler=...)`` starts a simulator (HTTP, the real
google-cloud-tpu client in ``GcpTpuApi``) and returns a :class:`~tests.support.provisioner_harness.Harness`;
``scenario`` is a shipped name or a mapping (see :func:`world`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.ports import SchedulerApi
from shared.services.provisioner import ProvisionerSettings
from tests.support.fixtures_tpu_sim import TpuSimFactory
from tests.support.provisioner_harness import Harness

HarnessFactory = Callable[..., Harness]


def world(zones: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A scenario mapping: ``zones`` as the simulator's ZoneSpec dicts, everything else passed through."""
    return {"name": extra.pop("name", "provisioner-test"), "seed": extra.pop("seed", 1), "zones": zones, **extra}


def spot(chips: int | dict[str, Any], **zone: Any) -> dict[str, Any]:
    """A zone whose v6e spot pool holds ``chips`` (an int, or a PoolSpec dict with a timeline)."""
    return {"capacity": {"v6e": {"spot": chips}}, **zone}


@pytest.fixture
def harness_factory(tpu_sim_factory: TpuSimFactory, tmp_path: Path) -> Iterator[HarnessFactory]:
    made: list[Harness] = []

    def make(
        scenario: str | dict[str, Any],
        *,
        settings: ProvisionerSettings | None = None,
        scheduler: SchedulerApi | None = None,
    ) -> Harness:
        sim = tpu_sim_factory(scenario)
        harness = Harness(
            sim.world, sim.api, tmp_path / f"state-{len(made)}.db", scheduler=scheduler, settings=settings
        )
        made.append(harness)
        return harness

    yield make
    for harness in made:
        harness.close()

"""Fixtures for the local TPU API simulator, shared by every test folder.

``tpu_sim`` starts a :class:`~localcloud.tpu_sim.World` and its HTTP server on a free loopback port and
yields a :class:`TpuSimHandle`:

- ``world``: the simulated project (``advance(seconds)``, ``qr_state()``, ``set_capacity()``, ``preempt()``,
  ``inject_fault()``, ``invariants()``, ``add_node_listener()``, ``clock`` …),
- ``server`` / ``base_url`` (``http://127.0.0.1:PORT``) / ``project``,
- ``api``: a :class:`~shared.adapters.gcp_tpu.GcpTpuApi` pointed at it (the real google-cloud-tpu client).

The scenario defaults to ``scarce-v6e``; pick another with indirect parametrisation::

    @pytest.mark.parametrize("tpu_sim", ["quota-bound"], indirect=True)
    def test_something(tpu_sim): ...

or pass a scenario mapping for a made-up world: ``indirect=True`` with a ``dict`` parameter.
``tpu_sim_factory(scenario, time_scale=0)`` starts extra worlds inside one test. Every server is stopped
when the test ends. Virtual time moves only when the test calls ``world.advance()``.

Other fixture modules may import ``TpuSimHandle``/``TpuSimFactory`` from here; this module holds no
asserts, so it opts out of assertion rewriting (PYTEST_DONT_REWRITE) and importing it early is harmless.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from localcloud.tpu_sim import SimServer, World
from shared.adapters.gcp_tpu import GcpTpuApi

DEFAULT_SCENARIO = "scarce-v6e"


@dataclass
class TpuSimHandle:
    """A running simulator with an adapter pointed at it."""

    world: World
    server: SimServer
    base_url: str
    project: str
    api: GcpTpuApi

    def advance(self, seconds: float) -> None:
        """Shorthand for ``world.advance``."""
        self.world.advance(seconds)


TpuSimFactory = Callable[..., TpuSimHandle]


@pytest.fixture
def tpu_sim_factory() -> Iterator[TpuSimFactory]:
    """Start simulators on demand: ``tpu_sim_factory("spot-preemptions", time_scale=0)``."""
    started: list[TpuSimHandle] = []

    def start(scenario: str | dict[str, Any] = DEFAULT_SCENARIO, *, time_scale: float = 0.0) -> TpuSimHandle:
        world = World(scenario, time_scale=time_scale)
        server = SimServer(world)
        base_url = server.start()
        api = GcpTpuApi(world.scenario.project, endpoint=base_url)
        handle = TpuSimHandle(world=world, server=server, base_url=base_url, project=world.scenario.project, api=api)
        started.append(handle)
        return handle

    yield start
    for handle in started:
        handle.api.close()
        handle.server.stop()


@pytest.fixture
def tpu_sim(request: pytest.FixtureRequest, tpu_sim_factory: TpuSimFactory) -> TpuSimHandle:
    """A running simulator (scenario from indirect parametrisation, default ``scarce-v6e``)."""
    scenario = getattr(request, "param", DEFAULT_SCENARIO)
    return tpu_sim_factory(scenario)

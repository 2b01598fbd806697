"""Step-down (issue 21, item 5) on the simulator through the real TPU adapter: no pool holds a v6e-8, four-chip
pools hold a v6e-4; the search widens to the v6e-4 after its step time, and the node boots that slice's config."""

from __future__ import annotations

from shared.domain.models import DeploymentSpec, Phase
from shared.domain.serving_plan import ServingEnvironment, build_serving_plan
from shared.services.provisioner import Provisioner
from tests.support.fixtures_provisioner import HarnessFactory, spot, world
from tests.support.provisioner_harness import Harness, make_spec

FOUR_CHIPS_ONLY = world({"us-east5-b": spot(4), "europe-west4-a": spot(4)})
ENV = ServingEnvironment(project="demo-proj")


def _render(spec: DeploymentSpec) -> str:
    plan = build_serving_plan(spec, ENV)
    return f"#!/bin/bash\n# {plan.slice.name} tensor-parallel {plan.engine.tensor_parallel}\n"


def _with_scripts(h: Harness) -> Harness:
    h.provisioner = Provisioner(h.store, h.tpu, h.clock, settings=h.settings, startup_script=_render)
    return h


def _node_scripts(h: Harness) -> list[str]:
    found = []
    for resource in h.record().status.resources:
        node = h.world.node(resource.zone, resource.name)
        if node is not None:
            found.append(str((node.get("metadata") or {}).get("startup-script", "")))
    return found


def test_the_search_steps_down_and_the_node_serves_the_smaller_slice(harness_factory: HarnessFactory) -> None:
    h = _with_scripts(harness_factory(FOUR_CHIPS_ONLY))
    h.create(make_spec(accelerator="v6e-8", alternative_accelerators=("v6e-4",)))
    h.run_until_phase(Phase.BOOTING, minutes=40)
    status = h.record().status
    assert status.phase is Phase.BOOTING
    assert status.accelerator == "v6e-4"
    stepped = [a for a in status.attempts if "step-down to v6e-4" in a.detail]
    assert stepped and stepped[0].outcome == "requested"
    assert _node_scripts(h) == ["#!/bin/bash\n# v6e-4 tensor-parallel 4\n"]


def test_without_an_alternative_the_search_keeps_waiting_for_the_big_slice(harness_factory: HarnessFactory) -> None:
    h = _with_scripts(harness_factory(FOUR_CHIPS_ONLY))
    h.create(make_spec(accelerator="v6e-8"))
    h.run(40)
    status = h.record().status
    assert status.phase in (Phase.SEARCHING, Phase.PROVISIONING)
    assert status.accelerator is None
    assert all("step-down" not in a.detail for a in status.attempts)

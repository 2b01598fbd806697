"""Step-down and step-across (issue 21, item 5): the slice ladder's rules and the planner widening to it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from shared.domain.cloud import LABEL_DEPLOYMENT, LABEL_GENERATION, ObservedResource
from shared.domain.errors import InvalidMessage
from shared.domain.models import (
    DeploymentRecord,
    DeploymentSpec,
    DeploymentStatus,
    QueuedResourceState,
    Tier,
    ZoneMemoryEntry,
)
from shared.domain.planner import CreateQueuedResource, DeleteResource, RememberZone, WriteStatus, plan
from shared.domain.serving_plan import ServingEnvironment, build_serving_plan
from shared.domain.slice_ladder import (
    StepPolicy,
    advice_slice,
    allowed_slices,
    check_alternatives,
    scripts_per_slice,
    served_spec,
    spec_for_slice,
    step_reason,
)

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
ZONES = ("us-central1-b", "us-east1-d", "europe-west4-a")
QR = QueuedResourceState
ENV = ServingEnvironment(project="demo-proj")


def make_spec(**overrides: Any) -> DeploymentSpec:
    values: dict[str, Any] = {
        "deployment_id": "gemma",
        "model": "gemma-4-26b-a4b",
        "accelerator": "v6e-8",
        "alternative_accelerators": ("v6e-4",),
        "zones": ZONES,
        "tiers": (Tier.SPOT,),
    }
    values.update(overrides)
    return DeploymentSpec(**values)


class TestLadder:
    def test_the_first_slice_only_until_the_step_time_then_the_next(self) -> None:
        spec = make_spec()
        policy = StepPolicy(step_after_minutes=10)
        assert allowed_slices(spec, None, NOW, policy) == ["v6e-8"]
        assert allowed_slices(spec, NOW, NOW + timedelta(minutes=9.9), policy) == ["v6e-8"]
        assert allowed_slices(spec, NOW, NOW + timedelta(minutes=10), policy) == ["v6e-8", "v6e-4"]
        assert advice_slice(spec, NOW, NOW + timedelta(minutes=10), policy) == "v6e-4"

    def test_without_alternatives_nothing_widens(self) -> None:
        spec = make_spec(alternative_accelerators=())
        assert allowed_slices(spec, NOW, NOW + timedelta(hours=5), StepPolicy()) == ["v6e-8"]

    def test_a_slice_listed_twice_or_as_the_accelerator_is_refused(self) -> None:
        with pytest.raises(ValidationError, match="alternative_accelerators"):
            make_spec(alternative_accelerators=("v6e-8",))
        with pytest.raises(ValidationError, match="alternative_accelerators"):
            make_spec(alternative_accelerators=("v6e-4", "v6e-4"))

    def test_the_reason_names_the_kind_of_step_and_the_wait(self) -> None:
        spec = make_spec()
        assert step_reason(spec, "v6e-8", NOW, NOW) == ""
        assert step_reason(spec, "v6e-4", NOW, NOW + timedelta(minutes=12)) == (
            "step-down to v6e-4: no v6e-8 after 12 min of searching"
        )


class TestFit:
    def test_an_alternative_that_fits_at_the_chosen_context_passes(self) -> None:
        check_alternatives(make_spec(), ENV)  # gemma-4-26b-a4b fits a v6e-4 and a v6e-8 at its default context

    def test_an_alternative_that_does_not_fit_is_refused_by_field_with_a_fix(self) -> None:
        spec = make_spec(accelerator="v6e-4", alternative_accelerators=("v6e-1",))
        assert not build_serving_plan(spec_for_slice(spec, "v6e-1"), ENV).fits  # the serving plan's own verdict
        with pytest.raises(InvalidMessage) as caught:
            check_alternatives(spec, ENV)
        assert caught.value.field == "alternative_accelerators[0]"
        assert "does not fit v6e-1" in caught.value.problem
        assert "drop v6e-1" in caught.value.fix

    def test_another_family_is_refused(self) -> None:
        spec = make_spec(accelerator="v6e-8", alternative_accelerators=("v5litepod-8",))
        with pytest.raises(InvalidMessage) as caught:
            check_alternatives(spec, ENV)
        assert caught.value.field == "alternative_accelerators[0]"

    def test_each_slice_gets_its_own_serving_config(self) -> None:
        spec = make_spec()
        scripts = scripts_per_slice(spec, lambda s: str(build_serving_plan(s, ENV).engine.tensor_parallel))
        assert scripts == {"v6e-8": "8", "v6e-4": "4"}


# ------------------------------------------------------------------------------------------- the planner


def observe(request: Any, state: QueuedResourceState) -> ObservedResource:
    return ObservedResource(
        name=request.resource_id,
        zone=request.zone,
        state=state,
        tier=request.tier,
        accelerator=request.accelerator,
        labels={LABEL_DEPLOYMENT: "gemma", LABEL_GENERATION: "1"},
        endpoint="10.0.0.9:8000" if state is QR.ACTIVE else None,
        created_at=NOW,
    )


class World:
    """The provider as the planner sees it: every create waits for chips until told otherwise."""

    def __init__(self, spec: DeploymentSpec) -> None:
        self.record = DeploymentRecord(
            deployment_id="gemma", spec=spec, status=DeploymentStatus(), created_at=NOW, updated_at=NOW
        )
        self.observed: dict[str, ObservedResource] = {}
        self.requests: list[Any] = []
        self.memory: dict[str, ZoneMemoryEntry] = {}

    def tick(self, now: datetime) -> list[Any]:
        scripts = {"v6e-8": "tp=8", "v6e-4": "tp=4"}
        actions = plan(self.record, list(self.observed.values()), self.memory, now, startup_scripts=scripts)
        status = next(a.status for a in actions if isinstance(a, WriteStatus))
        self.record = self.record.model_copy(update={"status": status})
        for action in actions:
            if isinstance(action, CreateQueuedResource):
                self.requests.append(action.request)
                self.observed[action.request.resource_id] = observe(action.request, QR.WAITING)
            elif isinstance(action, DeleteResource):
                self.observed.pop(action.name, None)
            elif isinstance(action, RememberZone):
                self.memory[action.entry.key] = action.entry
        return actions


class TestPlannerStepsDown:
    def test_the_search_widens_to_the_smaller_slice_and_serves_it(self) -> None:
        world = World(make_spec())
        minute = 0
        while minute < 10:
            world.tick(NOW + timedelta(minutes=minute))
            minute += 1
        assert {r.accelerator for r in world.requests} == {"v6e-8"}
        assert {r.startup_script for r in world.requests} == {"tp=8"}
        world.tick(NOW + timedelta(minutes=10))
        smaller = [r for r in world.requests if r.accelerator == "v6e-4"]
        assert smaller, "after 10 min the search asks for the alternative slice"
        assert {r.startup_script for r in smaller} == {"tp=4"}  # the serving config follows the slice
        stepped = [a for a in world.record.status.attempts if "step-down to v6e-4" in a.detail]
        assert stepped
        refs = {ref.name: ref for ref in world.record.status.resources}
        assert refs[smaller[0].resource_id].accelerator == "v6e-4"
        assert any(ref.accelerator is None and ref.state is QR.WAITING for ref in refs.values())  # v6e-8 kept queued

        world.observed[smaller[0].resource_id] = observe(smaller[0], QR.ACTIVE)
        world.tick(NOW + timedelta(minutes=11))
        status = world.record.status
        assert status.accelerator == "v6e-4"
        assert "on v6e-4" in status.message
        assert status.search_since is None
        assert all(name == smaller[0].resource_id for name in world.observed)  # every other request deleted

    def test_a_repeated_tick_changes_nothing(self) -> None:
        world = World(make_spec())
        for minute in range(11):
            world.tick(NOW + timedelta(minutes=minute))
        before = world.record.status
        creates = [a for a in world.tick(NOW + timedelta(minutes=10)) if isinstance(a, CreateQueuedResource)]
        assert creates == []
        assert world.record.status.search_since == before.search_since
        assert [r.name for r in world.record.status.resources] == [r.name for r in before.resources]

    def test_spend_is_priced_at_the_granted_slice(self) -> None:
        world = World(make_spec())
        for minute in range(11):
            world.tick(NOW + timedelta(minutes=minute))
        smaller = next(r for r in world.requests if r.accelerator == "v6e-4")
        world.observed[smaller.resource_id] = observe(smaller, QR.ACTIVE)
        world.tick(NOW + timedelta(minutes=11))
        world.tick(NOW + timedelta(minutes=71))
        hourly_v6e4 = world.record.status.spend_usd
        assert hourly_v6e4 > 0
        eight = World(make_spec(alternative_accelerators=()))
        eight.tick(NOW)
        first = eight.requests[0]
        eight.observed = {first.resource_id: observe(first, QR.ACTIVE)}
        eight.tick(NOW + timedelta(minutes=1))
        eight.tick(NOW + timedelta(minutes=61))
        assert eight.record.status.spend_usd == pytest.approx(2 * hourly_v6e4, rel=0.05)


class TestServedSpec:
    def test_the_monitor_and_benchmarks_judge_the_slice_granted(self) -> None:
        record = World(make_spec()).record
        assert served_spec(record).accelerator == "v6e-8"
        stepped = record.model_copy(update={"status": DeploymentStatus(accelerator="v6e-4")})
        spec = served_spec(stepped)
        assert spec.accelerator == "v6e-4"
        assert build_serving_plan(spec, ENV).engine.tensor_parallel == 4


def test_an_adopted_request_keeps_the_alternative_slice_it_was_made_for() -> None:
    world = World(make_spec())
    lost = ObservedResource(
        name="gemma-g1-a7",
        zone="us-east1-d",
        state=QR.WAITING,
        tier=Tier.SPOT,
        accelerator="v6e-4",
        labels={LABEL_DEPLOYMENT: "gemma", LABEL_GENERATION: "1"},
        created_at=NOW,
    )
    world.observed[lost.name] = lost
    world.tick(NOW)
    adopted = next(r for r in world.record.status.resources if r.name == lost.name)
    assert adopted.accelerator == "v6e-4"

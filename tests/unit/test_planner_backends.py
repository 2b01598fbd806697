"""The planner with a back-end choice: tpu-api, compute-engine or any (issue 11), as pure tables."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from shared.domain.backends import learn_for_backend
from shared.domain.cloud import LABEL_DEPLOYMENT, LABEL_GENERATION, ObservedResource
from shared.domain.errors import ErrorClass
from shared.domain.models import (
    Backend,
    DeploymentRecord,
    DeploymentSpec,
    DeploymentStatus,
    NodeState,
    Phase,
    QueuedResourceState,
    ResourceRef,
    Tier,
    ZoneMemoryEntry,
)
from shared.domain.planner import (
    Action,
    CreateQueuedResource,
    DeleteResource,
    OperationOutcome,
    RememberZone,
    WriteStatus,
    plan,
    resource_name,
)
from shared.domain.zone_memory import CloudFailure

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
QR = QueuedResourceState


def record(resources: list[ResourceRef] | None = None, *, generation: int = 1, **spec: Any) -> DeploymentRecord:
    values: dict[str, Any] = {
        "deployment_id": "gemma",
        "model": "gemma-4-26b-a4b",
        "accelerator": "v6e-4",
        "zones": ("us-east5-b", "us-east5-a"),
        "tiers": (Tier.SPOT,),
        **spec,
    }
    return DeploymentRecord(
        deployment_id="gemma",
        spec=DeploymentSpec(**values),
        generation=generation,
        status=DeploymentStatus(phase=Phase.SEARCHING, resources=resources or []),
        created_at=NOW - timedelta(hours=1),
        updated_at=NOW - timedelta(hours=1),
    )


def ref(
    attempt: int, zone: str, backend: Backend, state: QueuedResourceState = QR.UNKNOWN, **extra: Any
) -> ResourceRef:
    return ResourceRef(
        name=resource_name("gemma", extra.pop("generation", 1), attempt),
        zone=zone,
        tier=Tier.SPOT,
        backend=backend,
        generation=extra.pop("gen", 1),
        attempt=attempt,
        state=state,
        created_at=NOW - timedelta(minutes=5),
        state_since=NOW - timedelta(minutes=5),
        **extra,
    )


def observed(resource: ResourceRef, state: QueuedResourceState) -> ObservedResource:
    return ObservedResource(
        name=resource.name,
        zone=resource.zone,
        backend=resource.backend,
        kind="instance" if resource.backend is Backend.COMPUTE_ENGINE else "queued_resource",
        state=state,
        tier=resource.tier,
        accelerator="v6e-4",
        labels={LABEL_DEPLOYMENT: "gemma", LABEL_GENERATION: str(resource.generation)},
        node_state=NodeState.READY if state is QR.ACTIVE else None,
        endpoint="10.0.0.1" if state is QR.ACTIVE else None,
    )


def creates(actions: list[Action]) -> list[CreateQueuedResource]:
    return [a for a in actions if isinstance(a, CreateQueuedResource)]


def status_of(actions: list[Action]) -> DeploymentStatus:
    return next(a.status for a in actions if isinstance(a, WriteStatus))


def test_a_compute_engine_spec_asks_compute_engine() -> None:
    actions = plan(record(backend=Backend.COMPUTE_ENGINE), [], {}, NOW)
    assert [(c.request.zone, c.request.backend) for c in creates(actions)] == [
        ("us-east5-b", Backend.COMPUTE_ENGINE),
        ("us-east5-a", Backend.COMPUTE_ENGINE),
    ]
    refs = status_of(actions).resources
    assert {r.backend for r in refs} == {Backend.COMPUTE_ENGINE}
    assert status_of(actions).attempts[0].detail.endswith("via compute-engine")


def test_any_hedges_across_zones_with_the_back_end_that_waits_for_chips() -> None:
    spot = plan(record(backend=Backend.ANY), [], {}, NOW)
    assert [(c.request.zone, c.request.backend) for c in creates(spot)] == [
        ("us-east5-b", Backend.TPU_API),
        ("us-east5-a", Backend.TPU_API),
    ]
    flex = plan(record(backend=Backend.ANY, tiers=(Tier.FLEX_START,)), [], {}, NOW)
    assert [(c.request.zone, c.request.backend) for c in creates(flex)] == [
        ("us-east5-b", Backend.COMPUTE_ENGINE),
        ("us-east5-a", Backend.COMPUTE_ENGINE),
    ]


def test_flex_start_leaves_compute_engine_only_when_both_of_its_quota_pools_are_blocked() -> None:
    pending = ref(0, "us-east5-b", Backend.COMPUTE_ENGINE, QR.CREATING, operation="op")
    pending = pending.model_copy(update={"tier": Tier.FLEX_START})
    failure = CloudFailure(
        ErrorClass.QUOTA_REGION,
        "Quota 'TPUS_PER_TPU_FAMILY' exceeded.  Limit: 0.0 in region us-east5.",
        quota_id="TPUS-PER-TPU-FAMILY-per-project-region",
        location="us-east5",
        surfaced="operation",
    )
    earlier = learn_for_backend(
        CloudFailure(ErrorClass.QUOTA_REGION, "spot refused", quota_id="PREEMPTIBLE-TPU-V6E-per-project-region"),
        backend=Backend.COMPUTE_ENGINE,
        zone="us-east5-b",
        tier=Tier.SPOT,
        accelerator="v6e-4",
        memory={},
        now=NOW,
    )
    assert earlier is not None
    only_family_left = {earlier.key: earlier}
    again = plan(
        record([pending], backend=Backend.ANY, hedge=1, tiers=(Tier.FLEX_START,)),
        [],
        {},
        NOW,
        outcomes={pending.name: OperationOutcome(done=True, failure=failure)},
    )
    assert [c.request.backend for c in creates(again)] == [Backend.COMPUTE_ENGINE]  # the preemptible pool may fit
    actions = plan(
        record([pending], backend=Backend.ANY, hedge=1, tiers=(Tier.FLEX_START,)),
        [],
        only_family_left,
        NOW,
        outcomes={pending.name: OperationOutcome(done=True, failure=failure)},
    )
    lessons = [a.entry for a in actions if isinstance(a, RememberZone)]
    assert [entry.key for entry in lessons] == ["quota/region/us-east5/ce-tpus-per-tpu-family-ct6e"]
    assert [(c.request.zone, c.request.backend) for c in creates(actions)] == [("us-east5-b", Backend.TPU_API)]


def test_a_tpu_api_spec_is_untouched_by_compute_engine_lessons() -> None:
    memory = {
        "unsupported@compute-engine/zone/us-east5-b": ZoneMemoryEntry(
            key="unsupported@compute-engine/zone/us-east5-b",
            kind="unsupported",
            error_class="unsupported",
            zone="us-east5-b",
            until=NOW + timedelta(days=7),
            updated_at=NOW,
        )
    }
    tpu = plan(record(), [], memory, NOW)
    assert [c.request.zone for c in creates(tpu)] == ["us-east5-b", "us-east5-a"]
    compute = plan(record(backend=Backend.COMPUTE_ENGINE), [], memory, NOW)
    assert [c.request.zone for c in creates(compute)] == ["us-east5-a"]


def test_the_winner_says_which_back_end_it_came_through() -> None:
    won = ref(0, "us-east5-b", Backend.COMPUTE_ENGINE, QR.PROVISIONING)
    actions = plan(record([won], backend=Backend.ANY), [observed(won, QR.ACTIVE)], {}, NOW)
    status = status_of(actions)
    assert status.backend is Backend.COMPUTE_ENGINE
    assert "via compute-engine" in status.message


def test_two_active_slices_of_an_older_generation_keep_only_one_serving() -> None:
    first = ref(0, "us-east5-b", Backend.COMPUTE_ENGINE, QR.ACTIVE, active_at=NOW - timedelta(minutes=2))
    second = ref(1, "us-east5-a", Backend.COMPUTE_ENGINE, QR.ACTIVE, active_at=NOW - timedelta(minutes=2))
    actions = plan(
        record([first, second], generation=2, backend=Backend.COMPUTE_ENGINE),
        [observed(first, QR.ACTIVE), observed(second, QR.ACTIVE)],
        {},
        NOW,
    )
    deleted = [a.name for a in actions if isinstance(a, DeleteResource)]
    assert deleted == [second.name]
    reasons = [a.detail for a in status_of(actions).attempts if a.outcome == "deleting"]
    assert reasons == [f"a second ACTIVE slice of generation 1; {first.name} serves"]

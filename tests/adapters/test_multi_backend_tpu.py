"""MultiBackendTpu over the real TPU API and Compute Engine adapters, both talking to one simulated world.

The world's chips, clock and billing meter are shared, so these tests also show that one scenario offers a
zone through either API and that the invariants (one ACTIVE per deployment, no orphans) span both.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from shared.adapters.multi_backend_tpu import MultiBackendTpu
from shared.domain.cloud import LABEL_DEPLOYMENT, ProvisionRequest
from shared.domain.errors import CloudError, ErrorClass
from shared.domain.models import Backend, QueuedResourceState, Tier
from tests.support.fixtures_compute_sim import LAB, ComputeSimFactory, ComputeSimHandle, lab_world

ZONE = "us-east5-b"


def request(resource_id: str, backend: Backend, tier: Tier = Tier.SPOT, owner: str = "dep-a") -> ProvisionRequest:
    return ProvisionRequest(
        resource_id=resource_id,
        node_id=resource_id,
        zone=ZONE,
        accelerator="v6e-4",
        tier=tier,
        request_id=str(uuid.uuid5(uuid.NAMESPACE_URL, resource_id)),
        labels={LABEL_DEPLOYMENT: owner},
        backend=backend,
    )


@pytest.fixture
def sim(compute_sim_factory: ComputeSimFactory) -> ComputeSimHandle:
    return compute_sim_factory(lab_world({ZONE: {"capacity": {"v6e": {"spot": 8}}}}))


def test_creates_go_to_the_back_end_the_request_names(sim: ComputeSimHandle) -> None:
    vm = sim.multi.create(request("dep-a-g1-a0", Backend.COMPUTE_ENGINE))
    qr = sim.multi.create(request("dep-b-g1-a0", Backend.TPU_API, owner="dep-b"))
    assert "/zones/" in vm.name
    assert "/locations/" in qr.name
    sim.advance(400)
    assert sim.multi.get_operation(vm.name).done is True
    assert sim.multi.get_operation(qr.name).done is True
    by_name = {item.name: item for item in sim.multi.list()}
    assert by_name["dep-a-g1-a0"].backend is Backend.COMPUTE_ENGINE
    assert by_name["dep-b-g1-a0"].backend is Backend.TPU_API
    assert {item.state for item in by_name.values()} == {QueuedResourceState.ACTIVE}
    assert sim.world.pool(ZONE, "spot")["used"] == 8  # one pool of chips behind both APIs


def test_the_chips_one_api_holds_are_gone_for_the_other(sim: ComputeSimHandle) -> None:
    sim.multi.create(request("dep-a-g1-a0", Backend.TPU_API))
    sim.multi.create(request("dep-a-g1-a1", Backend.TPU_API))
    sim.advance(400)
    op = sim.multi.create(request("dep-c-g1-a0", Backend.COMPUTE_ENGINE, owner="dep-c"))
    sim.advance(LAB.staged_at + 1)
    assert sim.multi.get_operation(op.name).error_class is ErrorClass.STOCKOUT


def test_delete_and_get_find_the_resource_in_whichever_back_end_holds_it(sim: ComputeSimHandle) -> None:
    sim.multi.create(request("dep-a-g1-a0", Backend.COMPUTE_ENGINE))
    fresh = MultiBackendTpu({Backend.TPU_API: sim.tpu, Backend.COMPUTE_ENGINE: sim.ce})  # knows nothing yet
    seen = fresh.get(ZONE, "dep-a-g1-a0")
    assert seen is not None
    assert seen.backend is Backend.COMPUTE_ENGINE
    assert fresh.delete(ZONE, "dep-a-g1-a0", force=True, request_id=str(uuid.uuid4())) is not None
    sim.advance(LAB.delete_s + 1)
    assert fresh.get(ZONE, "dep-a-g1-a0") is None
    assert fresh.delete(ZONE, "dep-a-g1-a0", force=True) is None


def test_two_active_slices_of_one_deployment_across_apis_break_the_invariant(sim: ComputeSimHandle) -> None:
    sim.multi.create(request("dep-a-g1-a0", Backend.COMPUTE_ENGINE))
    sim.multi.create(request("dep-a-g1-a1", Backend.TPU_API))
    sim.advance(400)
    report: dict[str, Any] = sim.world.invariants(["dep-a"])
    assert report["ok"] is False
    assert len(report["duplicate_active"]["dep-a"]) == 2
    assert report["billing"]["by_deployment"]["dep-a"] > 0


def test_any_is_not_a_back_end_a_request_may_name(sim: ComputeSimHandle) -> None:
    with pytest.raises(CloudError) as caught:
        sim.multi.create(request("dep-a-g1-a0", Backend.ANY))
    assert caught.value.error_class is ErrorClass.INVALID
    only_tpu = MultiBackendTpu({Backend.TPU_API: sim.tpu})
    with pytest.raises(CloudError) as missing:
        only_tpu.create(request("dep-a-g1-a0", Backend.COMPUTE_ENGINE))
    assert "not configured" in str(missing.value)
    with pytest.raises(ValueError, match="backends"):
        MultiBackendTpu({})


def test_a_failing_back_end_fails_the_whole_list(sim: ComputeSimHandle) -> None:
    sim.multi.create(request("dep-a-g1-a0", Backend.COMPUTE_ENGINE))
    sim.world.inject_fault({"endpoint": "compute.instances.aggregatedList", "status": 503})
    with pytest.raises(CloudError) as caught:
        sim.multi.list()
    assert caught.value.error_class is ErrorClass.TRANSIENT
    assert [item.name for item in sim.multi.list()] == ["dep-a-g1-a0"]

"""ComputeEngineTpu with the real google-cloud-compute REST client against the simulator's Compute Engine half.

Covers the TpuApi verbs, every instance status the adapter maps (PENDING, PROVISIONING, STAGING, RUNNING,
STOPPING, TERMINATED, gone) and every error class, each classified once by the adapter the way the TPU API
adapter classifies its own.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from shared.adapters.compute_engine_tpu import ComputeEngineTpu, classify_compute_error
from shared.domain.cloud import LABEL_DEPLOYMENT, LABEL_MANAGED_BY, ProvisionRequest
from shared.domain.errors import CloudError, ErrorClass
from shared.domain.models import Backend, NodeState, QueuedResourceState, Tier
from tests.support.fixtures_compute_sim import LAB, ComputeSimFactory, ComputeSimHandle, lab_world

ZONE = "us-east5-b"


def request(
    resource_id: str = "dep-a-g1-a0", zone: str = ZONE, tier: Tier = Tier.SPOT, **extra: Any
) -> ProvisionRequest:
    fields: dict[str, Any] = {
        "resource_id": resource_id,
        "node_id": resource_id,
        "zone": zone,
        "accelerator": "v6e-4",
        "tier": tier,
        "request_id": str(uuid.uuid5(uuid.NAMESPACE_DNS, resource_id)),
        "labels": {LABEL_DEPLOYMENT: "dep-a"},
        "startup_script": "#!/bin/bash\necho serving",
        "backend": Backend.COMPUTE_ENGINE,
    }
    if tier is Tier.FLEX_START:
        fields["max_run_s"] = 3600
        fields["valid_until_s"] = 1800
    fields.update(extra)
    return ProvisionRequest(**fields)


def zone(**pools: Any) -> dict[str, Any]:
    return {"capacity": {"v6e": pools}, "reservations": ["res-a"]}


@pytest.fixture
def lab(compute_sim_factory: ComputeSimFactory) -> ComputeSimHandle:
    return compute_sim_factory(
        lab_world(
            {
                ZONE: zone(spot=8, on_demand=4, flex_start=0, **{"reservation:res-a": 4}),
                "us-east5-a": zone(spot=0, on_demand=0),
                "us-central1-b": {"provisioning_models": ["standard", "spot"], **zone(spot=4)},
                "asia-east1-a": {"accelerators": ["v6e-1"]},
                "asia-northeast1-a": {"served": False, "compute": {"served": False}},
                "europe-west4-b": {"forbidden": True},
                "southamerica-west1-a": {"compute": {"stockout_error": "pool_with_details"}, **zone(spot=0)},
            },
            compute_quotas=[
                {"metric": "preemptible", "region": "us-central1", "limit": 0},
                {"metric": "family", "region": "us-central1", "limit": 0},
            ],
        )
    )


def raised(call: Any, *args: Any, **kwargs: Any) -> CloudError:
    with pytest.raises(CloudError) as caught:
        call(*args, **kwargs)
    return caught.value


class TestCreate:
    def test_the_instance_carries_every_field_the_tpu_vm_needs(self, lab: ComputeSimHandle) -> None:
        lab.ce.create(request(tier=Tier.FLEX_START))
        body = lab.world.compute.instance(ZONE, "dep-a-g1-a0")
        assert body is not None
        assert body["machineType"].endswith("/machineTypes/ct6e-standard-4t")
        scheduling = body["scheduling"]
        assert scheduling["provisioningModel"] == "FLEX_START"
        assert scheduling["maxRunDuration"]["seconds"] == "3600"
        assert scheduling["instanceTerminationAction"] == "DELETE"
        assert scheduling["onHostMaintenance"] == "TERMINATE"
        disk = body["disks"][0]
        assert disk["boot"] is True
        assert disk["initializeParams"]["diskSizeGb"] == "200"
        assert disk["initializeParams"]["sourceImage"].endswith("family/ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e")
        assert body["serviceAccounts"][0]["scopes"] == ["https://www.googleapis.com/auth/cloud-platform"]
        assert body["metadata"]["items"] == [
            {"key": "startup-script", "value": "#!/bin/bash\necho serving"},
            {"key": "enable-guest-attributes", "value": "TRUE"},  # the script reports boot progress there
        ]
        assert body["labels"] == {LABEL_MANAGED_BY: "tpuctl", LABEL_DEPLOYMENT: "dep-a"}

    def test_flex_start_sends_its_request_valid_for_duration(self, lab: ComputeSimHandle) -> None:
        instance = lab.ce.instance_for(request(tier=Tier.FLEX_START, valid_until_s=7200))
        assert instance.params.request_valid_for_duration.seconds == 7200
        assert lab.ce.instance_for(request(tier=Tier.SPOT)).params.request_valid_for_duration.seconds == 0

    def test_standard_and_reservation_bound_pick_their_provisioning_model(self, lab: ComputeSimHandle) -> None:
        standard = lab.ce.instance_for(request(tier=Tier.ON_DEMAND))
        assert standard.scheduling.provisioning_model == "STANDARD"
        reserved = lab.ce.instance_for(request(tier=Tier.RESERVATION, reservation_name="res-a"))
        assert reserved.scheduling.provisioning_model == "RESERVATION_BOUND"
        assert list(reserved.reservation_affinity.values) == ["res-a"]

    def test_flex_start_without_a_max_run_is_refused_before_any_call(self, lab: ComputeSimHandle) -> None:
        error = raised(lab.ce.create, request(tier=Tier.FLEX_START, max_run_s=None))
        assert error.error_class is ErrorClass.INVALID
        assert "max_run_s" in str(error)

    def test_a_repeated_request_id_returns_the_same_operation(self, lab: ComputeSimHandle) -> None:
        first = lab.ce.create(request())
        lab.advance(1)
        second = lab.ce.create(request())
        assert first.name == second.name
        assert first.name.startswith(f"projects/demo-proj/zones/{ZONE}/operations/operation-")


class TestStates:
    def test_spot_goes_provisioning_staging_running_then_deleted(self, lab: ComputeSimHandle) -> None:
        op = lab.ce.create(request())
        assert op.done is False
        seen = lab.ce.get(ZONE, "dep-a-g1-a0")
        assert seen is not None
        assert (seen.state, seen.node_state, seen.backend, seen.kind) == (
            QueuedResourceState.PROVISIONING,
            NodeState.CREATING,
            Backend.COMPUTE_ENGINE,
            "instance",
        )
        lab.advance(LAB.staged_at + 1)
        assert lab.world.compute.status(ZONE, "dep-a-g1-a0") == "STAGING"
        assert lab.ce.get_operation(op.name).done is True
        lab.advance(LAB.boot_s)
        seen = lab.ce.get(ZONE, "dep-a-g1-a0")
        assert seen is not None
        assert (seen.state, seen.node_state, seen.tier) == (QueuedResourceState.ACTIVE, NodeState.READY, Tier.SPOT)
        assert seen.accelerator == "v6e-4"
        assert seen.endpoint is not None
        assert seen.owned_by == "dep-a"
        delete = lab.ce.delete(ZONE, "dep-a-g1-a0", force=False, request_id=str(uuid.uuid4()))
        assert delete is not None
        assert delete.done is False
        lab.advance(LAB.delete_s + 1)
        assert lab.ce.get_operation(delete.name).done is True
        assert lab.ce.get(ZONE, "dep-a-g1-a0") is None
        assert lab.ce.delete(ZONE, "dep-a-g1-a0", force=True) is None

    def test_flex_start_waits_pending_until_chips_come(self, lab: ComputeSimHandle) -> None:
        lab.ce.create(request(tier=Tier.FLEX_START))
        lab.advance(LAB.accept_s + 1)
        seen = lab.ce.get(ZONE, "dep-a-g1-a0")
        assert seen is not None
        assert seen.state is QueuedResourceState.WAITING
        lab.advance(600)
        assert lab.world.compute.status(ZONE, "dep-a-g1-a0") == "PENDING"
        lab.world.set_capacity(ZONE, "flex_start", 4)
        lab.advance(LAB.boot_s + 1)
        seen = lab.ce.get(ZONE, "dep-a-g1-a0")
        assert seen is not None
        assert (seen.state, seen.tier) == (QueuedResourceState.ACTIVE, Tier.FLEX_START)
        assert seen.termination_at is not None

    def test_flex_start_run_end_is_a_normal_end_not_a_preemption(self, lab: ComputeSimHandle) -> None:
        lab.world.set_capacity(ZONE, "flex_start", 4)
        lab.ce.create(request(tier=Tier.FLEX_START, max_run_s=600))
        lab.advance(LAB.accept_s + LAB.boot_s + 601)
        seen = lab.ce.get(ZONE, "dep-a-g1-a0")
        assert seen is not None
        assert (seen.state, seen.state_initiator, seen.node_state) == (
            QueuedResourceState.SUSPENDING,
            "SERVICE",
            NodeState.STOPPING,
        )
        lab.advance(LAB.delete_s + 1)
        assert lab.ce.get(ZONE, "dep-a-g1-a0") is None  # instanceTerminationAction=DELETE
        assert lab.world.pool(ZONE, "flex_start")["used"] == 0

    def test_flex_start_request_expires_with_a_stockout_and_leaves_nothing(self, lab: ComputeSimHandle) -> None:
        op = lab.ce.create(request(tier=Tier.FLEX_START, valid_until_s=300))
        lab.advance(LAB.accept_s + 301)
        status = lab.ce.get_operation(op.name)
        assert (status.done, status.error_class) == (True, ErrorClass.STOCKOUT)
        assert lab.ce.get(ZONE, "dep-a-g1-a0") is None

    def test_spot_preemption_shows_as_suspending_preempted_then_gone(self, lab: ComputeSimHandle) -> None:
        lab.ce.create(request())
        lab.advance(LAB.running_at + 120)
        assert lab.world.preempt(ZONE, instance="dep-a-g1-a0") == ["dep-a-g1-a0"]
        seen = lab.ce.get(ZONE, "dep-a-g1-a0")
        assert seen is not None
        assert (seen.state, seen.node_state, seen.state_initiator) == (
            QueuedResourceState.SUSPENDING,
            NodeState.PREEMPTED,
            "SERVICE",
        )
        lab.advance(LAB.delete_s + 1)
        assert lab.ce.list(ZONE) == []

    def test_standard_stop_gives_terminated_and_start_brings_it_back(self, lab: ComputeSimHandle) -> None:
        lab.ce.create(request(tier=Tier.ON_DEMAND))
        lab.advance(LAB.running_at + 1)
        stop = lab.ce.stop_node(ZONE, "dep-a-g1-a0")
        lab.advance(LAB.stop_s + 1)
        assert lab.ce.get_operation(stop.name).done is True
        seen = lab.ce.get(ZONE, "dep-a-g1-a0")
        assert seen is not None
        assert (seen.state, seen.node_state, seen.endpoint) == (
            QueuedResourceState.SUSPENDED,
            NodeState.TERMINATED,
            None,
        )
        lab.ce.start_node(ZONE, "dep-a-g1-a0")
        lab.advance(LAB.boot_s + 1)
        seen = lab.ce.get(ZONE, "dep-a-g1-a0")
        assert seen is not None
        assert seen.state is QueuedResourceState.ACTIVE

    def test_list_covers_every_zone_in_one_call_and_only_our_instances(self, lab: ComputeSimHandle) -> None:
        lab.ce.create(request("dep-a-g1-a0"))
        lab.ce.create(request("dep-a-g1-a1", zone="us-east5-a", tier=Tier.ON_DEMAND))
        lab.world.compute.insert(
            "demo-proj",
            ZONE,
            {
                "name": "someone-else",
                "machineType": f"zones/{ZONE}/machineTypes/ct6e-standard-1t",
                "scheduling": {"onHostMaintenance": "TERMINATE"},
            },
        )
        names = [(item.zone, item.name) for item in lab.ce.list()]
        assert names == [("us-east5-a", "dep-a-g1-a1"), (ZONE, "dep-a-g1-a0")]


class TestErrors:
    def test_zone_resource_pool_exhausted_is_a_stockout_on_the_operation(self, lab: ComputeSimHandle) -> None:
        op = lab.ce.create(request(zone="us-east5-a"))
        lab.advance(LAB.staged_at + 1)
        status = lab.ce.get_operation(op.name)
        assert (status.error_class, status.error_code) == (ErrorClass.STOCKOUT, 503)
        assert "does not have enough resources" in status.error_message
        assert lab.ce.get("us-east5-a", "dep-a-g1-a0") is None

    def test_the_with_details_variant_is_a_stockout_too(self, lab: ComputeSimHandle) -> None:
        op = lab.ce.create(request(zone="southamerica-west1-a"))
        lab.advance(LAB.staged_at + 1)
        assert lab.ce.get_operation(op.name).error_class is ErrorClass.STOCKOUT

    @pytest.mark.parametrize(
        ("tier", "quota_id"),
        [
            (Tier.SPOT, "PREEMPTIBLE-TPU-V6E-per-project-region"),
            (Tier.ON_DEMAND, "TPUS-PER-TPU-FAMILY-per-project-region"),
        ],
    )
    def test_regional_quota_names_the_pool_and_the_region(
        self, lab: ComputeSimHandle, tier: Tier, quota_id: str
    ) -> None:
        op = lab.ce.create(request(zone="us-central1-b", tier=tier))
        lab.advance(LAB.accept_s + 1)
        status = lab.ce.get_operation(op.name)
        assert status.error_class is ErrorClass.QUOTA_REGION
        error = classify_compute_error("QUOTA_EXCEEDED", status.error_message, surfaced="operation")
        assert (error.location, error.quota_id) == ("us-central1", quota_id)
        assert lab.ce.get("us-central1-b", "dep-a-g1-a0") is None

    def test_a_provisioning_model_the_zone_lacks_is_unsupported_on_the_operation(self, lab: ComputeSimHandle) -> None:
        op = lab.ce.create(request(zone="us-central1-b", tier=Tier.FLEX_START))
        lab.advance(LAB.flex_refusal_s + 1)
        status = lab.ce.get_operation(op.name)
        assert status.error_class is ErrorClass.UNSUPPORTED
        assert "provisioning model 'FLEX_START' is not supported" in status.error_message

    def test_machine_type_missing_in_the_zone_is_unsupported_at_once(self, lab: ComputeSimHandle) -> None:
        error = raised(lab.ce.create, request(zone="asia-east1-a"))
        assert (error.error_class, error.surfaced, error.code) == (ErrorClass.UNSUPPORTED, "sync", 400)
        assert "ct6e-standard-4t" in error.message

    def test_a_zone_compute_engine_does_not_serve_is_unsupported(self, lab: ComputeSimHandle) -> None:
        error = raised(lab.ce.create, request(zone="asia-northeast1-a"))
        assert error.error_class is ErrorClass.UNSUPPORTED
        assert "Unknown zone" in error.message

    def test_a_location_policy_refusal_is_permission(self, lab: ComputeSimHandle) -> None:
        error = raised(lab.ce.create, request(zone="europe-west4-b"))
        assert (error.error_class, error.code, error.location) == (ErrorClass.PERMISSION, 403, "europe-west4-b")

    def test_our_own_name_twice_is_already_exists(self, lab: ComputeSimHandle) -> None:
        lab.ce.create(request())
        error = raised(lab.ce.create, request(request_id=str(uuid.uuid4())))
        assert (error.error_class, error.code) == (ErrorClass.ALREADY_EXISTS, 409)

    def test_a_missing_reservation_is_invalid(self, lab: ComputeSimHandle) -> None:
        error = raised(lab.ce.create, request(tier=Tier.RESERVATION, reservation_name="nope"))
        assert error.error_class is ErrorClass.INVALID

    def test_create_rate_limit_is_rate_limit(self, lab: ComputeSimHandle) -> None:
        lab.world.inject_fault({"endpoint": "compute.instances.insert", "status": 429})
        error = raised(lab.ce.create, request())
        assert (error.error_class, error.transient) == (ErrorClass.RATE_LIMIT, True)

    @pytest.mark.parametrize("status", [500, 503])
    def test_server_errors_are_transient(self, lab: ComputeSimHandle, status: int) -> None:
        op = lab.ce.create(request())
        lab.world.inject_fault({"endpoint": "compute.zoneOperations.get", "status": status})
        error = raised(lab.ce.get_operation, op.name)
        assert error.error_class is ErrorClass.TRANSIENT
        assert lab.ce.get_operation(op.name).name == op.name

    def test_stopping_an_instance_that_is_not_running_is_a_failed_precondition(self, lab: ComputeSimHandle) -> None:
        lab.ce.create(request())
        error = raised(lab.ce.stop_node, ZONE, "dep-a-g1-a0")
        assert error.error_class is ErrorClass.FAILED_PRECONDITION

    def test_unknown_names_are_not_found(self, lab: ComputeSimHandle) -> None:
        assert lab.ce.get(ZONE, "nobody") is None
        error = raised(lab.ce.get_operation, f"projects/demo-proj/zones/{ZONE}/operations/operation-0")
        assert error.error_class is ErrorClass.NOT_FOUND
        assert raised(lab.ce.get_operation, "operations/x").error_class is ErrorClass.INVALID

    def test_an_unreachable_endpoint_is_transient(self) -> None:
        api = ComputeEngineTpu("demo-proj", endpoint="http://127.0.0.1:9", timeout_s=2)
        try:
            assert raised(api.list).error_class is ErrorClass.TRANSIENT
        finally:
            api.close()

    def test_deleting_a_request_before_it_starts_aborts_its_insert_harmlessly(self, lab: ComputeSimHandle) -> None:
        op = lab.ce.create(request(tier=Tier.FLEX_START))
        lab.advance(LAB.accept_s + 1)
        lab.ce.delete(ZONE, "dep-a-g1-a0", force=True)
        status = lab.ce.get_operation(op.name)
        assert status.error_class is ErrorClass.TRANSIENT  # cancelling a hedge teaches nothing about the zone
        lab.world.set_capacity(ZONE, "flex_start", 8)
        lab.advance(3600)
        assert lab.ce.get(ZONE, "dep-a-g1-a0") is None  # a cancelled request is never fulfilled later


CLASSIFICATION = [
    (
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "The zone 'projects/p/zones/us-east5-b' does not have enough…",
        "operation",
        503,
        "insert",
        ErrorClass.STOCKOUT,
    ),
    (
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        "…'(resource type:compute)'.",
        "operation",
        503,
        "insert",
        ErrorClass.STOCKOUT,
    ),
    ("INTERNAL_ERROR", "Internal error.", "operation", 500, "insert", ErrorClass.STOCKOUT),
    ("INTERNAL_ERROR", "Internal error.", "operation", 500, "delete", ErrorClass.TRANSIENT),
    (
        "QUOTA_EXCEEDED",
        "Quota 'PREEMPTIBLE_TPU_V6E' exceeded.  Limit: 0.0 in region us-east5.",
        "operation",
        403,
        "insert",
        ErrorClass.QUOTA_REGION,
    ),
    (
        "quotaExceeded",
        "Quota 'TPUS_PER_TPU_FAMILY' exceeded.  Limit: 4.0 in region us-east5.",
        "sync",
        403,
        None,
        ErrorClass.QUOTA_REGION,
    ),
    ("rateLimitExceeded", "Rate Limit Exceeded", "sync", 403, None, ErrorClass.RATE_LIMIT),
    (
        "RESOURCE_OPERATION_RATE_EXCEEDED",
        "Operation rate exceeded for resource",
        "operation",
        429,
        "insert",
        ErrorClass.RATE_LIMIT,
    ),
    (
        "UNSUPPORTED_OPERATION",
        "The provisioning model 'FLEX_START' is not supported for machine type",
        "operation",
        400,
        "insert",
        ErrorClass.UNSUPPORTED,
    ),
    ("invalid", "Invalid value for field 'zone': 'x-y1-z'. Unknown zone.", "sync", 400, None, ErrorClass.UNSUPPORTED),
    (
        "forbidden",
        "Required 'compute.instances.create' permission for 'projects/p'",
        "sync",
        403,
        None,
        ErrorClass.PERMISSION,
    ),
    ("", "Request had invalid authentication credentials.", "sync", 401, None, ErrorClass.PERMISSION),
    (
        "notFound",
        "The resource 'projects/p/zones/z/instances/x' was not found",
        "sync",
        404,
        None,
        ErrorClass.NOT_FOUND,
    ),
    (
        "RESOURCE_NOT_FOUND",
        "The resource 'projects/p/zones/z/reservations/r' was not found",
        "operation",
        404,
        "insert",
        ErrorClass.INVALID,
    ),
    ("alreadyExists", "The resource … already exists", "sync", 409, None, ErrorClass.ALREADY_EXISTS),
    ("ABORTED", "The instance was deleted before it started.", "operation", 409, "insert", ErrorClass.TRANSIENT),
    ("resourceNotReady", "The resource is not ready", "sync", 400, None, ErrorClass.FAILED_PRECONDITION),
    ("conditionNotMet", "Precondition failed", "sync", 412, None, ErrorClass.FAILED_PRECONDITION),
    ("backendError", "Backend Error", "sync", 503, None, ErrorClass.TRANSIENT),
    ("invalid", "Invalid value for field 'resource.name'", "sync", 400, None, ErrorClass.INVALID),
    ("SOMETHING_NEW", "never seen before", "operation", None, "insert", ErrorClass.UNKNOWN),
]


@pytest.mark.parametrize(("code", "message", "surfaced", "status", "verb", "expected"), CLASSIFICATION)
def test_every_compute_error_shape_maps_to_its_class(
    code: str, message: str, surfaced: str, status: int | None, verb: str | None, expected: ErrorClass
) -> None:
    error = classify_compute_error(code, message, surfaced=surfaced, http_status=status, verb=verb)
    assert error.error_class is expected
    assert error.surfaced == surfaced


def test_every_error_class_the_planner_acts_on_is_reachable_from_compute_engine() -> None:
    reached = {row[-1] for row in CLASSIFICATION}
    assert reached == set(ErrorClass) - {ErrorClass.QUOTA_ZONE}  # Compute Engine TPU quotas are regional

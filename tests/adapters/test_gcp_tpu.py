"""GcpTpuApi with the real google-cloud-tpu REST client against the local simulator.

Covers the TpuApi verbs (create, poll the operation, get, list, delete with and without force, stop/start)
and every error class the simulator produces, classified once by the adapter.
"""

from __future__ import annotations

from typing import Any

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import tpu_v2

from shared.adapters.gcp_tpu import GcpTpuApi
from shared.domain.cloud import LABEL_DEPLOYMENT, ProvisionRequest
from shared.domain.errors import CloudError, ErrorClass
from shared.domain.models import NodeState, QueuedResourceState, Tier
from tests.sim.bodies import ACTIVE_AT, DELETE_S, FLEX_REFUSAL_S, QUEUED_AT, SUSPEND_S, lab_scenario
from tests.support.fixtures_tpu_sim import TpuSimFactory, TpuSimHandle

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
        "request_id": f"req-{resource_id}",
        "labels": {LABEL_DEPLOYMENT: "dep-a"},
        "startup_script": "#!/bin/bash\necho serving",
    }
    if tier is Tier.FLEX_START:
        fields["max_run_s"] = 3600
    fields.update(extra)
    return ProvisionRequest(**fields)


@pytest.fixture
def lab(tpu_sim_factory: TpuSimFactory) -> TpuSimHandle:
    return tpu_sim_factory(lab_scenario())


def raised(call: Any, *args: Any, **kwargs: Any) -> CloudError:
    with pytest.raises(CloudError) as caught:
        call(*args, **kwargs)
    return caught.value


class TestVerbs:
    def test_create_then_poll_the_operation_to_done(self, lab: TpuSimHandle) -> None:
        op = lab.api.create(request())
        assert op.done is False
        assert op.name.startswith(f"projects/demo-proj/locations/{ZONE}/operations/operation-")
        lab.advance(QUEUED_AT)
        polled = lab.api.get_operation(op.name)
        assert (polled.done, polled.error_class) == (True, None)

    def test_create_sends_the_deterministic_id_labels_tier_queueing_policy_and_startup_script(
        self, lab: TpuSimHandle
    ) -> None:
        lab.api.create(request(valid_until_s=1800))
        sent = lab.world.queued_resource(ZONE, "dep-a-g1-a0")
        assert sent is not None
        node = sent["tpu"]["nodeSpec"][0]
        assert node["nodeId"] == "dep-a-g1-a0"
        assert node["node"]["labels"] == {"managed-by": "tpuctl", LABEL_DEPLOYMENT: "dep-a"}
        assert node["node"]["metadata"] == {"startup-script": "#!/bin/bash\necho serving"}
        assert sent["spot"] == {}
        assert sent["queueingPolicy"] == {"validUntilTime": "2026-12-02T12:30:00.000Z"}

    @pytest.mark.parametrize(
        ("tier", "pool"),
        [
            (Tier.SPOT, "spot"),
            (Tier.ON_DEMAND, "on_demand"),
            (Tier.RESERVATION, "reservation:res-a"),
            (Tier.FLEX_START, "flex_start"),
        ],
    )
    def test_each_tier_lands_in_its_pool_and_reads_back(self, lab: TpuSimHandle, tier: Tier, pool: str) -> None:
        lab.api.create(request(tier=tier, reservation_name="res-a" if tier is Tier.RESERVATION else None))
        lab.advance(ACTIVE_AT)
        assert lab.world.pool(ZONE, pool)["used"] == 4
        observed = lab.api.get(ZONE, "dep-a-g1-a0")
        assert observed is not None
        assert (observed.tier, observed.state, observed.node_state) == (
            tier,
            QueuedResourceState.ACTIVE,
            NodeState.READY,
        )

    def test_get_folds_in_the_node(self, lab: TpuSimHandle) -> None:
        lab.api.create(request())
        lab.advance(ACTIVE_AT)
        observed = lab.api.get(ZONE, "dep-a-g1-a0")
        assert observed is not None
        assert observed.kind == "queued_resource"
        assert observed.owned_by == "dep-a"
        assert observed.accelerator == "v6e-4"
        assert observed.node_id == "dep-a-g1-a0"
        assert observed.endpoint is not None and observed.endpoint.startswith("http://10.")
        assert observed.endpoint.endswith(":8000")  # vLLM's port, not the TPU runtime's 8470
        assert observed.created_at is not None and observed.created_at.isoformat() == "2026-12-02T12:00:00+00:00"

    def test_get_of_nothing_is_none(self, lab: TpuSimHandle) -> None:
        assert lab.api.get(ZONE, "ghost") is None

    def test_list_across_all_zones_shows_queued_resources_and_bare_nodes(self, lab: TpuSimHandle) -> None:
        lab.api.create(request("dep-a-g1-a0"))
        lab.api.create(request("dep-a-g1-a1", zone="asia-east1-c"))
        _raw_client(lab).create_node(
            parent=f"projects/demo-proj/locations/{ZONE}",
            node_id="bare-node",
            node=tpu_v2.Node(accelerator_type="v6e-1", runtime_version="v2-alpha-tpuv6e", labels={"team": "x"}),
        )
        lab.advance(ACTIVE_AT + 10)
        seen = {(item.kind, item.zone, item.name): item for item in lab.api.list()}
        assert set(seen) == {
            ("queued_resource", ZONE, "dep-a-g1-a0"),
            ("queued_resource", "asia-east1-c", "dep-a-g1-a1"),
            ("node", ZONE, "bare-node"),
        }
        bare = seen[("node", ZONE, "bare-node")]
        assert (bare.state, bare.node_state, bare.tier, bare.owned_by) == (
            QueuedResourceState.ACTIVE,
            NodeState.READY,
            Tier.ON_DEMAND,
            None,
        )
        assert [item.name for item in lab.api.list("asia-east1-c")] == ["dep-a-g1-a1"]

    def test_delete_with_force_removes_everything_and_a_second_delete_is_none(self, lab: TpuSimHandle) -> None:
        lab.api.create(request())
        lab.advance(ACTIVE_AT)
        op = lab.api.delete(ZONE, "dep-a-g1-a0", force=True, request_id="del-1")
        assert op is not None and op.done is False
        lab.advance(DELETE_S)
        assert lab.api.get_operation(op.name).done is True
        assert lab.api.get(ZONE, "dep-a-g1-a0") is None
        assert lab.api.delete(ZONE, "dep-a-g1-a0", force=True) is None

    def test_delete_without_force_of_an_active_one_is_a_failed_precondition(self, lab: TpuSimHandle) -> None:
        lab.api.create(request())
        lab.advance(ACTIVE_AT)
        error = raised(lab.api.delete, ZONE, "dep-a-g1-a0", force=False)
        assert error.error_class is ErrorClass.FAILED_PRECONDITION
        assert error.surfaced == "sync"

    def test_delete_reaches_a_bare_node_of_that_id(self, lab: TpuSimHandle) -> None:
        _raw_client(lab).create_node(
            parent=f"projects/demo-proj/locations/{ZONE}",
            node_id="bare-node",
            node=tpu_v2.Node(accelerator_type="v6e-1", runtime_version="v2-alpha-tpuv6e"),
        )
        lab.advance(200)
        op = lab.api.delete(ZONE, "bare-node", force=False)
        assert op is not None
        lab.advance(DELETE_S)
        assert lab.world.node_state(ZONE, "bare-node") is None

    def test_stop_and_start_a_node(self, lab: TpuSimHandle) -> None:
        _raw_client(lab).create_node(
            parent=f"projects/demo-proj/locations/{ZONE}",
            node_id="bare-node",
            node=tpu_v2.Node(accelerator_type="v6e-1", runtime_version="v2-alpha-tpuv6e"),
        )
        lab.advance(200)
        stop = lab.api.stop_node(ZONE, "bare-node")
        lab.advance(20)
        assert lab.api.get_operation(stop.name).done is True
        assert lab.world.node_state(ZONE, "bare-node") == "STOPPED"
        lab.api.start_node(ZONE, "bare-node")
        lab.advance(30)
        assert lab.world.node_state(ZONE, "bare-node") == "READY"

    def test_a_repeated_request_id_returns_the_first_operation(self, lab: TpuSimHandle) -> None:
        first = lab.api.create(request())
        assert lab.api.create(request()).name == first.name

    def test_an_attached_node_endpoint_reads_back_as_a_url_with_its_port(self, lab: TpuSimHandle) -> None:
        lab.api.create(request())
        lab.advance(ACTIVE_AT)
        lab.world.set_node_endpoint(ZONE, "dep-a-g1-a0", "127.0.0.1", 18000)
        observed = lab.api.get(ZONE, "dep-a-g1-a0")
        assert observed is not None and observed.endpoint == "http://127.0.0.1:18000"


class TestFlexStartAndPreemption:
    def test_flex_start_goes_through_v2alpha1_and_shows_its_termination_time(self, lab: TpuSimHandle) -> None:
        op = lab.api.create(request(tier=Tier.FLEX_START, max_run_s=3600))
        lab.advance(ACTIVE_AT)
        assert lab.api.get_operation(op.name).done is True
        observed = lab.api.get(ZONE, "dep-a-g1-a0")
        assert observed is not None
        assert observed.tier is Tier.FLEX_START
        assert observed.termination_at is not None
        assert observed.termination_at.isoformat() == "2026-12-02T13:01:45+00:00"
        listed = {item.name: item for item in lab.api.list()}
        assert listed["dep-a-g1-a0"].termination_at == observed.termination_at

    def test_the_end_of_a_flex_start_run_is_suspended_by_the_service(self, lab: TpuSimHandle) -> None:
        lab.api.create(request(tier=Tier.FLEX_START, max_run_s=3600))
        lab.advance(ACTIVE_AT + 3600 + DELETE_S)
        observed = lab.api.get(ZONE, "dep-a-g1-a0")
        assert observed is not None
        assert (observed.state, observed.state_initiator, observed.node_state) == (
            QueuedResourceState.SUSPENDED,
            "SERVICE",
            None,
        )

    def test_flex_start_without_a_run_cap_is_refused_before_any_call(self, lab: TpuSimHandle) -> None:
        error = raised(lab.api.create, request(tier=Tier.FLEX_START, max_run_s=None))
        assert error.error_class is ErrorClass.INVALID
        assert "max_run_s" in error.message

    def test_a_preempted_spot_slice_reads_as_suspended_with_a_preempted_node(self, lab: TpuSimHandle) -> None:
        lab.api.create(request())
        lab.advance(ACTIVE_AT)
        lab.world.preempt(ZONE, node="dep-a-g1-a0")
        lab.advance(SUSPEND_S)
        observed = lab.api.get(ZONE, "dep-a-g1-a0")
        assert observed is not None
        assert (observed.state, observed.state_initiator, observed.node_state) == (
            QueuedResourceState.SUSPENDED,
            "SERVICE",
            NodeState.PREEMPTED,
        )


class TestErrorClasses:
    def test_stockout_arrives_on_the_operation(self, lab: TpuSimHandle) -> None:
        op = _raw_client(lab).create_node(
            parent="projects/demo-proj/locations/us-east5-a",
            node_id="starved",
            node=tpu_v2.Node(accelerator_type="v6e-4", runtime_version="v2-alpha-tpuv6e"),
        )
        lab.advance(10)
        polled = lab.api.get_operation(op.operation.name)
        assert (polled.done, polled.error_class, polled.error_code) == (True, ErrorClass.STOCKOUT, 8)
        assert 'no more capacity in the zone "us-east5-a"' in polled.error_message

    def test_a_queued_resource_past_valid_until_is_failed_as_a_stockout(self, lab: TpuSimHandle) -> None:
        lab.api.create(request(zone="us-east5-a", valid_until_s=600))
        lab.advance(600)
        observed = lab.api.get("us-east5-a", "dep-a-g1-a0")
        assert observed is not None
        assert (observed.state, observed.error_class) == (QueuedResourceState.FAILED, ErrorClass.STOCKOUT)

    @pytest.mark.parametrize(
        ("zone", "error_class", "quota_id", "location"),
        [
            (ZONE, ErrorClass.QUOTA_REGION, "TPUV6EPreemptiblePerProjectPerRegionForTPUAPI", "us-east5"),
            ("us-central1-b", ErrorClass.QUOTA_ZONE, "TPUV6EPreemptiblePerProjectPerZoneForTPUAPI", "us-central1-b"),
        ],
    )
    def test_quota_is_a_synchronous_429_with_id_and_scope(
        self, tpu_sim_factory: TpuSimFactory, zone: str, error_class: ErrorClass, quota_id: str, location: str
    ) -> None:
        sim = tpu_sim_factory("quota-bound")
        error = raised(sim.api.create, request(zone=zone))
        assert (error.error_class, error.quota_id, error.location, error.code, error.surfaced) == (
            error_class,
            quota_id,
            location,
            429,
            "sync",
        )
        assert sim.world.qr_state(zone, "dep-a-g1-a0") is None

    @pytest.mark.parametrize(
        ("zone", "text"),
        [
            ("asia-northeast1-a", 'The requested zone "asia-northeast1-a" is not supported.'),
            ("asia-east1-a", "the accelerator v6e-4 was not found in zone asia-east1-a"),
        ],
    )
    def test_unsupported_zone_or_accelerator_is_a_sync_400(self, lab: TpuSimHandle, zone: str, text: str) -> None:
        error = raised(lab.api.create, request(zone=zone))
        assert (error.error_class, error.code, error.location) == (ErrorClass.UNSUPPORTED, 400, zone)
        assert text in error.message

    def test_a_refused_flex_start_is_unsupported_on_the_operation_with_code_3(self, lab: TpuSimHandle) -> None:
        op = lab.api.create(request(zone="asia-east1-c", tier=Tier.FLEX_START))
        assert op.done is False
        lab.advance(FLEX_REFUSAL_S)
        polled = lab.api.get_operation(op.name)
        assert (polled.error_class, polled.error_code) == (ErrorClass.UNSUPPORTED, 3)
        assert polled.error_message.startswith("FLEX_START provisioning model is not supported")

    @pytest.mark.parametrize("zone", ["us-central2-b", "us-east1-d"])
    def test_a_forbidden_or_unknown_location_is_permission(self, lab: TpuSimHandle, zone: str) -> None:
        error = raised(lab.api.create, request(zone=zone))
        assert (error.error_class, error.code, error.location) == (ErrorClass.PERMISSION, 403, zone)
        assert not error.transient

    def test_the_create_rate_limit_is_rate_limit(self, tpu_sim_factory: TpuSimFactory) -> None:
        sim = tpu_sim_factory(lab_scenario(limits={"creates_per_minute": 2}))
        sim.api.create(request("dep-a-g1-a0"))
        sim.api.create(request("dep-a-g1-a1"))
        error = raised(sim.api.create, request("dep-a-g1-a2"))
        assert (error.error_class, error.transient) == (ErrorClass.RATE_LIMIT, True)

    def test_an_injected_429_is_rate_limit(self, lab: TpuSimHandle) -> None:
        lab.world.inject_fault({"endpoint": "list_queued_resources", "status": 429, "times": 1})
        assert raised(lab.api.list).error_class is ErrorClass.RATE_LIMIT
        assert lab.api.list() == []

    @pytest.mark.parametrize("status", [500, 503, 504])
    def test_injected_5xx_on_get_operation_are_transient_and_then_it_works(
        self, lab: TpuSimHandle, status: int
    ) -> None:
        op = lab.api.create(request())
        lab.world.inject_fault({"endpoint": "get_operation", "status": status, "times": 1})
        error = raised(lab.api.get_operation, op.name)
        assert (error.error_class, error.transient, error.code) == (ErrorClass.TRANSIENT, True, status)
        assert lab.api.get_operation(op.name).name == op.name

    def test_a_transient_503_on_get_is_transient(self, lab: TpuSimHandle) -> None:
        lab.world.inject_fault({"endpoint": "get_queued_resource", "status": 503, "times": 1})
        assert raised(lab.api.get, ZONE, "anything").error_class is ErrorClass.TRANSIENT

    def test_the_same_id_with_another_request_id_is_already_exists(self, lab: TpuSimHandle) -> None:
        lab.api.create(request())
        error = raised(lab.api.create, request(request_id="another"))
        assert (error.error_class, error.code) == (ErrorClass.ALREADY_EXISTS, 409)

    def test_a_bad_request_the_simulator_rejects_is_invalid(self, lab: TpuSimHandle) -> None:
        error = raised(lab.api.create, request(runtime_version="no-such-runtime"))
        assert error.error_class is ErrorClass.INVALID

    def test_an_unreachable_endpoint_is_transient(self) -> None:
        api = GcpTpuApi("demo-proj", endpoint="http://127.0.0.1:9", timeout_s=2)
        assert raised(api.list).error_class is ErrorClass.TRANSIENT
        assert raised(api.create, request(tier=Tier.FLEX_START)).error_class is ErrorClass.TRANSIENT

    def test_reservation_tier_needs_a_reservation_name(self, lab: TpuSimHandle) -> None:
        error = raised(lab.api.create, request(tier=Tier.RESERVATION))
        assert (error.error_class, "reservation_name" in error.message) == (ErrorClass.INVALID, True)


class TestConstruction:
    def test_bad_arguments_name_the_field(self) -> None:
        with pytest.raises(ValueError, match="project"):
            GcpTpuApi("")
        with pytest.raises(ValueError, match="transport"):
            GcpTpuApi("demo-proj", transport="carrier-pigeon")
        with pytest.raises(ValueError, match="REST only"):
            GcpTpuApi("demo-proj", endpoint="http://127.0.0.1:1", transport="grpc")


def _raw_client(sim: TpuSimHandle) -> tpu_v2.TpuClient:
    return tpu_v2.TpuClient(
        transport="rest", credentials=AnonymousCredentials(), client_options={"api_endpoint": sim.base_url}
    )

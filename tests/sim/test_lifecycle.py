"""Every state transition of docs/reference/tpu-api.md §3.4 / §9, driven through the world's API with fixed timings."""

from __future__ import annotations

import pytest

from localcloud.tpu_sim import NodeEvent, World
from localcloud.tpu_sim.wire import SimApiError
from tests.sim.bodies import (
    ACCEPT_S,
    ACTIVE_AT,
    BOOT_S,
    DELETE_S,
    FLEX_REFUSAL_S,
    PROJECT,
    QUEUED_AT,
    SUSPEND_S,
    create,
    lab_world,
)

ZONE = "us-east5-b"


def op_id(op: dict[str, object]) -> str:
    return str(op["name"]).rsplit("/", 1)[-1]


class TestQueuedResourceHappyPath:
    def test_create_is_creating_with_an_unfinished_operation(self) -> None:
        world = lab_world()
        op = create(world)
        assert op["done"] is False
        assert op["metadata"]["verb"] == "create"
        assert op["metadata"]["@type"] == "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata"
        assert world.qr_state(ZONE, "qr-1") == "CREATING"

    def test_the_create_operation_completes_at_accepted_with_the_queued_resource(self) -> None:
        world = lab_world()
        op = create(world)
        world.advance(ACCEPT_S)
        assert world.qr_state(ZONE, "qr-1") == "ACCEPTED"
        done = world.get_operation(PROJECT, ZONE, op_id(op))
        assert done["done"] is True
        assert done["response"]["@type"] == "type.googleapis.com/google.cloud.tpu.v2.QueuedResource"
        assert done["response"]["state"]["state"] == "ACCEPTED"

    def test_accepted_then_waiting_then_provisioning_then_active(self) -> None:
        world = lab_world()
        create(world)
        world.advance(QUEUED_AT - 0.5)
        assert world.qr_state(ZONE, "qr-1") == "ACCEPTED"
        world.advance(0.5)
        # Chips are free, so the same instant's match moves it on to PROVISIONING with a CREATING node.
        assert world.qr_state(ZONE, "qr-1") == "PROVISIONING"
        assert world.node_state(ZONE, "qr-1-node") == "CREATING"
        world.advance(BOOT_S)
        assert world.qr_state(ZONE, "qr-1") == "ACTIVE"
        node = world.node(ZONE, "qr-1-node")
        assert node is not None
        assert node["state"] == "READY"
        assert node["queuedResource"] == f"projects/{PROJECT}/locations/{ZONE}/queuedResources/qr-1"
        assert node["networkEndpoints"][0]["ipAddress"].startswith("10.")
        assert node["metadata"]["startup-script"].startswith("#!/bin/bash")

    def test_without_chips_it_waits_and_capacity_arriving_later_fulfils_it(self) -> None:
        world = lab_world(
            zones={"us-east5-a": {"capacity": {"v6e": {"spot": {"chips": 0, "timeline": [{"at_s": 600, "chips": 4}]}}}}}
        )
        create(world, zone="us-east5-a")
        world.advance(599)
        assert world.qr_state("us-east5-a", "qr-1") == "WAITING_FOR_RESOURCES"
        world.advance(1 + BOOT_S)
        assert world.qr_state("us-east5-a", "qr-1") == "ACTIVE"
        assert world.pool("us-east5-a", "spot") == {"total": 4, "used": 4, "free": 0}

    def test_waiting_requests_are_served_first_in_first_out(self) -> None:
        world = lab_world()
        world.set_capacity("us-east5-a", "spot", 0)
        create(world, "qr-first", "us-east5-a")
        world.advance(1)
        create(world, "qr-second", "us-east5-a")
        world.advance(QUEUED_AT + 1)
        world.set_capacity("us-east5-a", "spot", 4)
        world.advance(BOOT_S)
        assert world.qr_state("us-east5-a", "qr-first") == "ACTIVE"
        assert world.qr_state("us-east5-a", "qr-second") == "WAITING_FOR_RESOURCES"

    def test_valid_after_holds_a_request_back_until_its_time(self) -> None:
        world = lab_world()
        create(world, queueingPolicy={"validAfterDuration": "600s"})
        world.advance(599)
        assert world.qr_state(ZONE, "qr-1") == "WAITING_FOR_RESOURCES"
        world.advance(1)
        assert world.qr_state(ZONE, "qr-1") == "PROVISIONING"

    def test_valid_until_duration_is_rewritten_into_valid_until_time(self) -> None:
        world = lab_world()
        create(world, valid_until_s=1800)
        rendered = world.queued_resource(ZONE, "qr-1")
        assert rendered is not None
        assert rendered["queueingPolicy"] == {"validUntilTime": "2026-12-02T12:30:00.000Z"}

    def test_multi_node_requests_are_all_or_nothing(self) -> None:
        world = lab_world()
        world.set_capacity("us-east5-a", "spot", 4)
        body_spec = {"multisliceParams": {"nodeCount": 2, "nodeIdPrefix": "slice"}}
        op = world.create_queued_resource(
            PROJECT,
            "us-east5-a",
            "multi",
            {
                "tpu": {
                    "nodeSpec": [
                        {
                            "parent": f"projects/{PROJECT}/locations/us-east5-a",
                            "node": {"acceleratorType": "v6e-4", "runtimeVersion": "v2-alpha-tpuv6e"},
                            **body_spec,
                        }
                    ]
                },
                "spot": {},
            },
        )
        assert op["done"] is False
        world.advance(QUEUED_AT + BOOT_S)
        assert world.qr_state("us-east5-a", "multi") == "WAITING_FOR_RESOURCES"
        assert world.node_state("us-east5-a", "slice-0") is None
        world.set_capacity("us-east5-a", "spot", 8)
        world.advance(BOOT_S)
        assert world.qr_state("us-east5-a", "multi") == "ACTIVE"
        assert world.node_state("us-east5-a", "slice-1") == "READY"


class TestFailureAndExpiry:
    def test_valid_until_passing_before_active_fails_it_and_keeps_it_listed(self) -> None:
        world = lab_world()
        create(world, zone="us-east5-a", valid_until_s=900)
        world.advance(900)
        assert world.qr_state("us-east5-a", "qr-1") == "FAILED"
        rendered = world.queued_resource("us-east5-a", "qr-1")
        assert rendered is not None
        error = rendered["state"]["failedData"]["error"]
        assert error["code"] == 8
        assert 'zone "us-east5-a"' in error["message"]
        world.advance(86_400)
        assert world.qr_state("us-east5-a", "qr-1") == "FAILED"

    def test_valid_until_during_provisioning_removes_the_partial_nodes(self) -> None:
        world = lab_world()
        create(world, valid_until_s=QUEUED_AT + 50)
        world.advance(QUEUED_AT + 50)
        assert world.qr_state(ZONE, "qr-1") == "FAILED"
        assert world.node_state(ZONE, "qr-1-node") == "DELETING"
        world.advance(DELETE_S)
        assert world.node_state(ZONE, "qr-1-node") is None
        assert world.pool(ZONE, "spot")["used"] == 0

    def test_cycling_provisioning_flickers_and_never_turns_active(self) -> None:
        world = lab_world(zones={ZONE: {"cycling": {"probability": 1.0, "flicker_s": 120, "fail_after_s": 2700}}})
        create(world)
        world.advance(QUEUED_AT)
        assert world.qr_state(ZONE, "qr-1") == "PROVISIONING"
        seen = set()
        for _ in range(20):
            world.advance(60)
            seen.add(world.node_state(ZONE, "qr-1-node"))
            assert world.qr_state(ZONE, "qr-1") in ("PROVISIONING", "FAILED")
        assert seen >= {"CREATING", None}
        world.advance(2700)
        assert world.qr_state(ZONE, "qr-1") == "FAILED"
        assert world.pool(ZONE, "spot")["used"] == 0


class TestFlexStart:
    def test_flex_start_gets_a_termination_time_and_is_suspended_by_the_service_at_the_end(self) -> None:
        world = lab_world()
        op = create(world, tier="flex", max_run_s=3600)
        assert op["metadata"]["@type"] == "type.googleapis.com/google.cloud.tpu.v2alpha1.OperationMetadata"
        world.advance(ACTIVE_AT)
        rendered = world.queued_resource(ZONE, "qr-1")
        assert rendered is not None
        assert rendered["state"]["state"] == "ACTIVE"
        assert rendered["provisioningModel"] == "FLEX_START"
        assert rendered["runDuration"]["terminationTime"] == "2026-12-02T13:01:45.000Z"
        node = world.node(ZONE, "qr-1-node")
        assert node is not None
        assert node["schedulingConfig"]["terminationTimestamp"] == "2026-12-02T13:01:45.000Z"
        world.advance(3600)
        assert world.qr_state(ZONE, "qr-1") == "SUSPENDING"
        world.advance(DELETE_S)
        rendered = world.queued_resource(ZONE, "qr-1")
        assert rendered is not None
        assert rendered["state"] == {"state": "SUSPENDED", "stateInitiator": "SERVICE"}
        assert world.node_state(ZONE, "qr-1-node") is None

    def test_a_refused_flex_start_fails_on_the_operation_with_code_3_and_lingers_as_failed(self) -> None:
        world = lab_world()
        op = create(world, zone="asia-east1-c", tier="flex")
        world.advance(FLEX_REFUSAL_S)
        done = world.get_operation(PROJECT, "asia-east1-c", op_id(op))
        assert done["error"] == {
            "code": 3,
            "message": 'FLEX_START provisioning model is not supported for accelerator type "v6e-4" in location '
            '"asia-east1-c"',
        }
        assert world.qr_state("asia-east1-c", "qr-1") == "FAILED"

    def test_a_refused_flex_start_can_vanish_instead_when_configured(self) -> None:
        world = lab_world(limits={"flex_refusal_lingers": False})
        create(world, zone="asia-east1-c", tier="flex")
        world.advance(FLEX_REFUSAL_S)
        assert world.qr_state("asia-east1-c", "qr-1") is None

    def test_the_sync_refusal_variant_answers_400(self) -> None:
        world = lab_world(zones={"asia-east1-c": {"flex_refusal": "sync"}})
        with pytest.raises(SimApiError) as caught:
            create(world, zone="asia-east1-c", tier="flex")
        assert caught.value.http_status == 400
        assert "FLEX_START provisioning model is not supported" in caught.value.message

    def test_flex_fields_are_unknown_to_v2(self) -> None:
        world = lab_world()
        body = {"provisioningModel": "FLEX_START", "runDuration": {"maxRunDuration": "3600s"}}
        with pytest.raises(SimApiError) as caught:
            world.create_queued_resource(PROJECT, ZONE, "qr-1", {**_plain_body(), **body}, api_version="v2")
        assert 'Unknown name "provisioningModel"' in caught.value.message

    def test_max_run_duration_over_seven_days_is_refused(self) -> None:
        world = lab_world()
        with pytest.raises(SimApiError) as caught:
            create(world, tier="flex", max_run_s=8 * 86_400)
        assert "max_run_duration" in caught.value.message


class TestPreemption:
    def test_preempting_an_active_spot_node_keeps_the_node_and_suspends_the_queued_resource(self) -> None:
        world = lab_world()
        create(world)
        world.advance(ACTIVE_AT)
        assert world.preempt(ZONE, node="qr-1-node") == ["qr-1-node"]
        assert world.node_state(ZONE, "qr-1-node") == "PREEMPTED"
        assert world.qr_state(ZONE, "qr-1") == "SUSPENDING"
        assert world.pool(ZONE, "spot")["used"] == 0
        world.advance(SUSPEND_S)
        rendered = world.queued_resource(ZONE, "qr-1")
        assert rendered is not None
        assert rendered["state"] == {"state": "SUSPENDED", "stateInitiator": "SERVICE"}
        world.advance(86_400)
        assert world.node_state(ZONE, "qr-1-node") == "PREEMPTED"

    def test_preemption_during_provisioning_also_suspends(self) -> None:
        world = lab_world()
        create(world)
        world.advance(QUEUED_AT + 10)
        assert world.preempt(ZONE, queued_resource="qr-1") == ["qr-1-node"]
        world.advance(SUSPEND_S)
        assert world.qr_state(ZONE, "qr-1") == "SUSPENDED"

    def test_a_hazard_rate_preempts_spot_nodes_by_itself_and_replays_identically(self) -> None:
        def run() -> list[tuple[str, str]]:
            world = lab_world(zones={ZONE: {"preemption": {"hazard_per_hour": 6.0}}})
            create(world)
            world.advance(ACTIVE_AT + 6 * 3600)
            return [(event["time"], event["kind"]) for event in world.events()]

        first = run()
        assert ("node.preempted" in {kind for _, kind in first}) is True
        assert run() == first

    def test_on_demand_nodes_are_not_preempted_by_the_hazard(self) -> None:
        world = lab_world(zones={ZONE: {"preemption": {"hazard_per_hour": 60.0}}})
        create(world, tier="guaranteed")
        world.advance(ACTIVE_AT + 3600)
        assert world.qr_state(ZONE, "qr-1") == "ACTIVE"

    def test_a_pending_operation_on_a_preempted_node_fails_with_code_3(self) -> None:
        world = lab_world()
        create(world)
        world.advance(ACTIVE_AT)
        stop = world.stop_node(PROJECT, ZONE, "qr-1-node")
        world.preempt(ZONE, node="qr-1-node")
        done = world.get_operation(PROJECT, ZONE, op_id(stop))
        assert done["error"]["code"] == 3
        assert done["error"]["message"].endswith("stop is not supported while in state PREEMPTED")

    def test_updating_a_preempted_node_fails_on_the_operation(self) -> None:
        world = lab_world()
        create(world)
        world.advance(ACTIVE_AT)
        world.preempt(ZONE, node="qr-1-node")
        op = world.update_node(PROJECT, ZONE, "qr-1-node", {"labels": {"a": "b"}}, "labels")
        assert op["error"]["message"].endswith("update is not supported while in state PREEMPTED")


class TestDelete:
    def test_non_force_delete_of_an_active_queued_resource_is_a_failed_precondition(self) -> None:
        world = lab_world()
        create(world)
        world.advance(ACTIVE_AT)
        with pytest.raises(SimApiError) as caught:
            world.delete_queued_resource(PROJECT, ZONE, "qr-1", force=False)
        assert (caught.value.http_status, caught.value.status) == (400, "FAILED_PRECONDITION")
        assert world.qr_state(ZONE, "qr-1") == "ACTIVE"

    @pytest.mark.parametrize("state", ["ACCEPTED", "WAITING_FOR_RESOURCES", "FAILED", "SUSPENDED"])
    def test_non_force_delete_is_allowed_when_accepted_waiting_failed_or_suspended(self, state: str) -> None:
        world = lab_world()
        create(world, zone="us-east5-a", valid_until_s=600)
        if state == "ACCEPTED":
            world.advance(ACCEPT_S)
        elif state == "WAITING_FOR_RESOURCES":
            world.advance(QUEUED_AT)
        elif state == "FAILED":
            world.advance(600)
        else:
            world.set_capacity("us-east5-a", "spot", 4)
            world.advance(ACTIVE_AT)
            world.preempt("us-east5-a", queued_resource="qr-1")
            world.advance(SUSPEND_S)
        assert world.qr_state("us-east5-a", "qr-1") == state
        op = world.delete_queued_resource(PROJECT, "us-east5-a", "qr-1", force=False)
        assert world.qr_state("us-east5-a", "qr-1") == "DELETING"
        world.advance(DELETE_S)
        assert world.qr_state("us-east5-a", "qr-1") is None
        done = world.get_operation(PROJECT, "us-east5-a", op_id(op))
        assert done["response"] == {"@type": "type.googleapis.com/google.protobuf.Empty"}

    def test_non_force_delete_of_a_waiting_request_can_be_refused_by_configuration(self) -> None:
        world = lab_world(limits={"delete_waiting_without_force": False})
        create(world, zone="us-east5-a")
        world.advance(QUEUED_AT)
        with pytest.raises(SimApiError):
            world.delete_queued_resource(PROJECT, "us-east5-a", "qr-1", force=False)
        world.delete_queued_resource(PROJECT, "us-east5-a", "qr-1", force=True)
        world.advance(ACCEPT_S)
        assert world.qr_state("us-east5-a", "qr-1") is None

    def test_force_delete_removes_nodes_first_then_the_queued_resource(self) -> None:
        world = lab_world()
        create(world)
        world.advance(ACTIVE_AT)
        op = world.delete_queued_resource(PROJECT, ZONE, "qr-1", force=True)
        assert world.qr_state(ZONE, "qr-1") == "DELETING"
        assert world.node_state(ZONE, "qr-1-node") == "DELETING"
        world.advance(DELETE_S)
        assert world.node_state(ZONE, "qr-1-node") is None
        assert world.qr_state(ZONE, "qr-1") is None
        assert world.get_operation(PROJECT, ZONE, op_id(op))["done"] is True
        with pytest.raises(SimApiError) as caught:
            world.get_queued_resource(PROJECT, ZONE, "qr-1")
        assert caught.value.http_status == 404
        assert world.pool(ZONE, "spot")["used"] == 0

    def test_deleting_an_absent_queued_resource_is_404(self) -> None:
        with pytest.raises(SimApiError) as caught:
            lab_world().delete_queued_resource(PROJECT, ZONE, "ghost", force=True)
        assert caught.value.http_status == 404

    def test_a_queued_resource_deleted_while_waiting_is_never_fulfilled(self) -> None:
        world = lab_world()
        world.set_capacity("us-east5-a", "spot", 0)
        create(world, zone="us-east5-a")
        world.advance(QUEUED_AT + 60)
        world.delete_queued_resource(PROJECT, "us-east5-a", "qr-1", force=True)
        world.set_capacity("us-east5-a", "spot", 8)
        world.advance(4 * 3600)
        assert world.qr_state("us-east5-a", "qr-1") is None
        assert world.node_state("us-east5-a", "qr-1-node") is None
        assert world.pool("us-east5-a", "spot")["used"] == 0
        kinds = {(event["resource"], event["kind"]) for event in world.events()}
        assert ("qr-1", "qr.active") not in kinds
        assert ("qr-1", "qr.provisioning") not in kinds

    def test_deleting_a_queued_resources_node_suspends_it_by_the_user(self) -> None:
        world = lab_world()
        create(world)
        world.advance(ACTIVE_AT)
        world.delete_node(PROJECT, ZONE, "qr-1-node")
        assert world.qr_state(ZONE, "qr-1") == "SUSPENDING"
        world.advance(DELETE_S)
        rendered = world.queued_resource(ZONE, "qr-1")
        assert rendered is not None
        assert rendered["state"] == {"state": "SUSPENDED", "stateInitiator": "USER"}

    def test_deleting_during_creating_aborts_the_create_operation(self) -> None:
        world = lab_world()
        op = create(world)
        world.delete_queued_resource(PROJECT, ZONE, "qr-1", force=False)
        world.advance(ACCEPT_S)
        done = world.get_operation(PROJECT, ZONE, op_id(op))
        assert done["error"]["code"] == 10
        assert world.qr_state(ZONE, "qr-1") is None


class TestIdempotencyAndReset:
    def test_the_same_request_id_returns_the_same_operation_and_creates_nothing_new(self) -> None:
        world = lab_world()
        first = create(world, request_id="req-1")
        world.advance(1)
        again = create(world, request_id="req-1")
        assert again["name"] == first["name"]
        assert len(world.list_queued_resources(PROJECT, "-")[0]) == 1

    def test_an_expired_request_id_is_a_new_request(self) -> None:
        world = lab_world(limits={"idempotency_window_s": 60})
        create(world, request_id="req-1")
        world.advance(61)
        with pytest.raises(SimApiError) as caught:
            create(world, request_id="req-1")
        assert caught.value.http_status == 409

    def test_a_delete_request_id_is_idempotent_too(self) -> None:
        world = lab_world()
        create(world)
        world.advance(ACTIVE_AT)
        first = world.delete_queued_resource(PROJECT, ZONE, "qr-1", force=True, request_id="del-1")
        again = world.delete_queued_resource(PROJECT, ZONE, "qr-1", force=True, request_id="del-1")
        assert again["name"] == first["name"]

    def test_reset_queued_resource_requeues_a_suspended_one(self) -> None:
        world = lab_world()
        create(world)
        world.advance(ACTIVE_AT)
        world.preempt(ZONE, node="qr-1-node")
        world.advance(SUSPEND_S)
        op = world.reset_queued_resource(PROJECT, ZONE, "qr-1")
        assert op["done"] is True
        assert world.node_state(ZONE, "qr-1-node") is None
        world.advance(QUEUED_AT + BOOT_S)
        assert world.qr_state(ZONE, "qr-1") == "ACTIVE"

    def test_world_reset_returns_to_the_scenario_start(self) -> None:
        world = lab_world()
        create(world)
        world.advance(ACTIVE_AT)
        world.reset()
        assert world.qr_state(ZONE, "qr-1") is None
        assert world.elapsed_s() == 0


class TestNodes:
    def test_a_bare_node_boots_when_chips_are_free(self) -> None:
        world = lab_world()
        op = world.create_node(PROJECT, ZONE, "bare", _node_body(spot=True))
        world.advance(10 + BOOT_S)
        assert world.node_state(ZONE, "bare") == "READY"
        assert world.get_operation(PROJECT, ZONE, op_id(op))["response"]["state"] == "READY"

    @pytest.mark.parametrize(
        ("variant", "code", "text"),
        [
            ("capacity", 8, 'There is no more capacity in the zone "us-east5-a"'),
            ("internal", 13, "an internal error has occurred"),
            ("reservation", 9, "Insufficient reserved capacity."),
        ],
    )
    def test_a_bare_node_in_a_stocked_out_zone_fails_its_operation(self, variant: str, code: int, text: str) -> None:
        world = lab_world(zones={"us-east5-a": {"stockout_error": variant}})
        op = world.create_node(PROJECT, "us-east5-a", "bare", _node_body(spot=True))
        world.advance(10)
        error = world.get_operation(PROJECT, "us-east5-a", op_id(op))["error"]
        assert error["code"] == code
        assert error["message"].startswith(text)
        assert world.node_state("us-east5-a", "bare") is None

    def test_stop_and_start_move_through_their_states(self) -> None:
        world = lab_world()
        world.create_node(PROJECT, ZONE, "bare", _node_body())
        world.advance(10 + BOOT_S)
        world.stop_node(PROJECT, ZONE, "bare")
        assert world.node_state(ZONE, "bare") == "STOPPING"
        world.advance(20)
        assert world.node_state(ZONE, "bare") == "STOPPED"
        world.start_node(PROJECT, ZONE, "bare")
        assert world.node_state(ZONE, "bare") == "STARTING"
        world.advance(30)
        assert world.node_state(ZONE, "bare") == "READY"

    def test_stopping_a_node_that_is_not_ready_is_refused(self) -> None:
        world = lab_world()
        world.create_node(PROJECT, ZONE, "bare", _node_body())
        with pytest.raises(SimApiError) as caught:
            world.stop_node(PROJECT, ZONE, "bare")
        assert caught.value.status == "FAILED_PRECONDITION"

    def test_deleted_nodes_are_gone_after_the_delete_time(self) -> None:
        world = lab_world()
        world.create_node(PROJECT, ZONE, "bare", _node_body())
        world.advance(10 + BOOT_S)
        world.delete_node(PROJECT, ZONE, "bare")
        assert world.node_state(ZONE, "bare") == "DELETING"
        world.advance(DELETE_S)
        with pytest.raises(SimApiError) as caught:
            world.get_node(PROJECT, ZONE, "bare")
        assert caught.value.http_status == 404


class TestListenersAndEndpoints:
    def test_listeners_hear_ready_preempted_and_deleted_with_the_startup_script(self) -> None:
        world = lab_world()
        heard: list[NodeEvent] = []
        world.add_node_listener(heard.append)
        create(world)
        world.advance(ACTIVE_AT)
        world.preempt(ZONE, node="qr-1-node")
        world.delete_queued_resource(PROJECT, ZONE, "qr-1", force=True)
        world.advance(DELETE_S)
        assert [event.kind for event in heard] == ["ready", "preempted", "deleted"]
        assert heard[0].metadata["startup-script"].startswith("#!/bin/bash")
        assert heard[0].labels == {"tpuctl-deployment": "dep-a"}
        assert heard[0].queued_resource == "qr-1"

    def test_a_listener_may_call_back_into_the_world_to_attach_an_endpoint(self) -> None:
        world = lab_world()

        def attach(event: NodeEvent) -> None:
            if event.kind == "ready":
                world.set_node_endpoint(event.zone, event.node_id, "127.0.0.1", 18000)

        world.add_node_listener(attach)
        create(world)
        world.advance(ACTIVE_AT)
        node = world.node(ZONE, "qr-1-node")
        assert node is not None
        assert node["networkEndpoints"] == [{"ipAddress": "127.0.0.1", "port": 18000}]

    def test_a_failing_listener_does_not_break_the_world(self) -> None:
        world = lab_world()

        def broken(event: NodeEvent) -> None:
            raise RuntimeError("listener bug")

        world.add_node_listener(broken)
        create(world)
        world.advance(ACTIVE_AT)
        assert world.qr_state(ZONE, "qr-1") == "ACTIVE"


class TestClock:
    def test_the_world_clock_reads_virtual_time(self) -> None:
        world = lab_world()
        world.advance(90)
        assert world.clock.now().isoformat() == "2026-12-02T12:01:30+00:00"
        assert world.clock.monotonic() == 90

    def test_time_cannot_go_backwards(self) -> None:
        with pytest.raises(ValueError, match="seconds"):
            lab_world().advance(-1)

    def test_a_time_scale_moves_virtual_time_with_the_wall_clock(self) -> None:
        world = World(lab_world().scenario, time_scale=10_000)
        before = world.elapsed_s()
        while world.elapsed_s() - before < 100:
            world.sync()
        assert world.elapsed_s() >= 100


def _plain_body() -> dict[str, object]:
    return {
        "tpu": {
            "nodeSpec": [
                {
                    "parent": f"projects/{PROJECT}/locations/{ZONE}",
                    "nodeId": "n",
                    "node": {"acceleratorType": "v6e-4", "runtimeVersion": "v2-alpha-tpuv6e"},
                }
            ]
        }
    }


def _node_body(*, spot: bool = False) -> dict[str, object]:
    body: dict[str, object] = {"acceleratorType": "v6e-4", "runtimeVersion": "v2-alpha-tpuv6e"}
    if spot:
        body["schedulingConfig"] = {"spot": True}
    return body

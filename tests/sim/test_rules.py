"""Synchronous create checks (in the §9 order), quotas, limits, billing, invariants and scenario loading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localcloud.tpu_sim import ScenarioError, World, available_scenarios, load_scenario
from localcloud.tpu_sim.wire import SimApiError
from shared.domain.models import Tier
from shared.domain.prices import price_per_chip_hour
from tests.sim.bodies import ACTIVE_AT, DELETE_S, PROJECT, QUEUED_AT, create, lab_scenario, lab_world

ZONE = "us-east5-b"


def refused(world: World, **kwargs: object) -> SimApiError:
    with pytest.raises(SimApiError) as caught:
        create(world, **kwargs)  # type: ignore[arg-type]
    return caught.value


class TestSyncChecks:
    def test_a_bad_id_is_400_before_anything_else(self) -> None:
        error = refused(lab_world(), qr_id="Bad_Id", zone="us-central2-b")
        assert error.http_status == 400
        assert "queuedResourceId" in error.message

    def test_bad_labels_are_400(self) -> None:
        error = refused(lab_world(), labels={"Bad Key": "x"})
        assert error.http_status == 400
        assert "label key" in error.message

    def test_a_forbidden_zone_is_403_with_location_policy_error_info(self) -> None:
        error = refused(lab_world(), zone="us-central2-b", accelerator="v9-1")
        assert error.http_status == 403
        assert error.message == "Permission denied on 'locations/us-central2-b' (or it may not exist)."
        assert error.details[0]["reason"] == "LOCATION_POLICY_VIOLATED"
        assert error.details[0]["metadata"]["location"] == "us-central2-b"

    def test_an_unknown_zone_is_403_not_found_or_unauthorized(self) -> None:
        error = refused(lab_world(), zone="us-east1-d")
        assert (error.http_status, error.message) == (
            403,
            "Location us-east1-d is not found or access is unauthorized.",
        )

    def test_a_zone_the_api_does_not_serve_is_400(self) -> None:
        error = refused(lab_world(), zone="asia-northeast1-a", accelerator="v9-1")
        assert error.http_status == 400
        assert 'The requested zone "asia-northeast1-a" is not supported. [EID: 0x' in error.message

    def test_an_accelerator_missing_from_the_zone_is_400(self) -> None:
        error = refused(lab_world(), zone="asia-east1-a")
        assert error.http_status == 400
        assert "the accelerator v6e-4 was not found in zone asia-east1-a" in error.message

    def test_a_duplicate_id_is_409(self) -> None:
        world = lab_world()
        create(world)
        error = refused(world)
        assert (error.http_status, error.status) == (409, "ALREADY_EXISTS")

    def test_the_other_project_is_403_with_a_hint(self) -> None:
        with pytest.raises(SimApiError) as caught:
            lab_world().list_queued_resources("other-proj", "-")
        assert caught.value.http_status == 403
        assert "--project other-proj" in caught.value.message

    @pytest.mark.parametrize(
        ("policy", "field"),
        [
            ({"validUntilDuration": "60s", "validAfterDuration": "60s"}, "at most one timing constraint"),
            ({"validUntilDuration": "soon"}, "Duration"),
            ({"validUntilTime": "yesterday"}, "RFC 3339"),
        ],
    )
    def test_bad_queueing_policies_are_400(self, policy: dict[str, str], field: str) -> None:
        error = refused(lab_world(), queueingPolicy=policy)
        assert error.http_status == 400
        assert field in error.message

    def test_two_tiers_are_400(self) -> None:
        error = refused(lab_world(), guaranteed={})
        assert "at most one tier" in error.message

    def test_an_empty_node_spec_is_400(self) -> None:
        with pytest.raises(SimApiError, match="non-empty array"):
            lab_world().create_queued_resource(PROJECT, ZONE, "qr-1", {"tpu": {"nodeSpec": []}, "spot": {}})

    def test_a_node_spec_parent_in_another_zone_is_400(self) -> None:
        body = {
            "tpu": {
                "nodeSpec": [
                    {
                        "parent": f"projects/{PROJECT}/locations/us-east5-a",
                        "nodeId": "n",
                        "node": {"acceleratorType": "v6e-4", "runtimeVersion": "v2-alpha-tpuv6e"},
                    }
                ]
            }
        }
        with pytest.raises(SimApiError, match="parent"):
            lab_world().create_queued_resource(PROJECT, ZONE, "qr-1", body)

    def test_an_unknown_reservation_is_400(self) -> None:
        world = lab_world()
        body_override = {"reservationName": f"projects/{PROJECT}/locations/{ZONE}/reservations/nope"}
        error = refused(world, tier="plain", **body_override)
        assert "Reservation" in error.message

    def test_a_reservation_request_draws_on_its_reservation_pool(self) -> None:
        world = lab_world()
        create(world, tier="reservation")
        world.advance(ACTIVE_AT)
        assert world.qr_state(ZONE, "qr-1") == "ACTIVE"
        assert world.pool(ZONE, "reservation:res-a")["used"] == 4


class TestQuotaAndLimits:
    def test_region_quota_exhausted_with_zone_headroom_is_a_sync_429_naming_the_region_id(self) -> None:
        world = lab_world(
            quotas=[
                {"id": "TPUV6EPreemptiblePerProjectPerZoneForTPUAPI", "location": ZONE, "limit": 32},
                {"id": "TPUV6EPreemptiblePerProjectPerRegionForTPUAPI", "location": "us-east5", "limit": 0},
            ]
        )
        error = refused(world)
        assert (error.http_status, error.status) == (429, "RESOURCE_EXHAUSTED")
        assert error.message == (
            "Quota limit 'TPUV6EPreemptiblePerProjectPerRegionForTPUAPI' has been exceeded. "
            "Limit: 0 in region us-east5."
        )
        assert error.details[0]["@type"] == "type.googleapis.com/google.rpc.QuotaFailure"
        assert world.qr_state(ZONE, "qr-1") is None

    def test_zone_and_region_both_exceeded_are_joined_like_gcloud(self) -> None:
        world = lab_world(
            quotas=[
                {"id": "TPUV6EPerProjectPerZoneForTPUAPI", "location": ZONE, "limit": 0},
                {"id": "TPUV6EPerProjectPerRegionForTPUAPI", "location": "us-east5", "limit": 0},
            ]
        )
        error = refused(world, tier="guaranteed")
        assert error.message == (
            "Quota limit 'TPUV6EPerProjectPerRegionForTPUAPI,TPUV6EPerProjectPerZoneForTPUAPI' has been exceeded. "
            "Limit: 0,0 in region us-east5,zone us-east5-b."
        )

    def test_quota_counts_live_nodes_only_unless_the_leak_flag_is_on(self) -> None:
        quotas = [{"id": "TPUV6EPreemptiblePerProjectPerZoneForTPUAPI", "location": "us-east5-a", "limit": 4}]
        for leak, second_allowed in ((False, True), (True, False)):
            world = lab_world(quotas=quotas, limits={"quota_leak": leak})
            create(world, "qr-1", "us-east5-a", valid_until_s=600)
            world.advance(600)
            assert world.qr_state("us-east5-a", "qr-1") == "FAILED"
            if second_allowed:
                create(world, "qr-2", "us-east5-a")
            else:
                assert refused(world, qr_id="qr-2", zone="us-east5-a").http_status == 429

    def test_a_preempted_node_holds_quota_when_the_leak_flag_is_on(self) -> None:
        quotas = [{"id": "TPUV6EPreemptiblePerProjectPerZoneForTPUAPI", "location": ZONE, "limit": 4}]
        world = lab_world(quotas=quotas, limits={"quota_leak": True})
        create(world)
        world.advance(ACTIVE_AT)
        world.preempt(ZONE, node="qr-1-node")
        assert refused(world, qr_id="qr-2").http_status == 429
        world.delete_queued_resource(PROJECT, ZONE, "qr-1", force=True)
        world.advance(DELETE_S)
        create(world, "qr-2")

    def test_flex_start_draws_on_preemptible_quota_by_default(self) -> None:
        quotas = [{"id": "TPUV6EPreemptiblePerProjectPerZoneForTPUAPI", "location": ZONE, "limit": 0}]
        assert "Preemptible" in refused(lab_world(quotas=quotas), tier="flex").message
        create(lab_world(quotas=quotas, limits={"flex_quota": "on_demand"}), tier="flex")

    def test_the_create_rate_limit_is_a_sync_429_and_frees_up_after_a_minute(self) -> None:
        world = lab_world(limits={"creates_per_minute": 3})
        for index in range(3):
            create(world, f"qr-{index}")
        error = refused(world, qr_id="qr-9")
        assert error.http_status == 429
        assert "Maximum number of CreateNode requests per minute" in error.message
        assert error.details[0]["reason"] == "RATE_LIMIT_EXCEEDED"
        world.advance(60)
        create(world, "qr-9")

    def test_the_per_zone_queued_request_limit(self) -> None:
        world = lab_world(limits={"queued_per_zone": 2})
        create(world, "qr-1", "us-east5-a")
        create(world, "qr-2", "us-east5-a")
        error = refused(world, qr_id="qr-3", zone="us-east5-a")
        assert error.http_status == 429
        assert "TPUQueuedResourcesPerProjectPerZoneForTPUAPI" in error.message


class TestBilling:
    def test_ready_nodes_are_billed_chips_times_price_by_tier(self) -> None:
        world = lab_world()
        create(world)
        world.advance(ACTIVE_AT + 3600)
        billing = world.billing()
        spot_price = price_per_chip_hour("us-east5", Tier.SPOT)
        assert spot_price is not None
        assert billing["by_tier"]["spot"] == {"chip_hours": 4.0, "usd": pytest.approx(4 * spot_price)}
        assert billing["by_deployment"] == {"dep-a": pytest.approx(4 * spot_price)}

    def test_a_preemption_in_the_first_minute_is_free(self) -> None:
        world = lab_world()
        create(world)
        world.advance(ACTIVE_AT + 30)
        world.preempt(ZONE, node="qr-1-node")
        world.advance(3600)
        assert world.billing()["total_usd"] == 0

    def test_a_later_preemption_bills_up_to_the_preemption(self) -> None:
        world = lab_world()
        create(world)
        world.advance(ACTIVE_AT + 1800)
        world.preempt(ZONE, node="qr-1-node")
        world.advance(3600)
        assert world.billing()["by_tier"]["spot"]["chip_hours"] == 2.0

    def test_billing_stops_while_stopped(self) -> None:
        world = lab_world()
        world.create_node(PROJECT, ZONE, "bare", {"acceleratorType": "v6e-1", "runtimeVersion": "v2-alpha-tpuv6e"})
        world.advance(10 + 100 + 3600)
        world.stop_node(PROJECT, ZONE, "bare")
        world.advance(7200)
        on_demand = world.billing()["by_tier"]["on_demand"]
        assert on_demand["chip_hours"] == 1.0
        assert on_demand["usd"] == pytest.approx(2.70)

    def test_a_region_the_table_lacks_is_billed_at_the_us_east5_price(self) -> None:
        world = lab_world()
        create(world, "qr-1", "asia-east1-c")
        world.advance(ACTIVE_AT + 3600)
        assert world.billing()["total_usd"] == pytest.approx(4 * (price_per_chip_hour("us-east5", Tier.SPOT) or 0))

    def test_scenario_prices_override_the_dated_defaults(self) -> None:
        world = lab_world(prices={"us-east5": {"spot": 2.0}})
        create(world)
        world.advance(ACTIVE_AT + 3600)
        assert world.billing()["total_usd"] == pytest.approx(8.0)


class TestInvariants:
    def test_a_clean_world_is_ok(self) -> None:
        world = lab_world()
        create(world)
        world.advance(ACTIVE_AT)
        report = world.invariants(["dep-a"])
        assert report["ok"] is True
        assert report["orphans"] == [] and report["duplicate_active"] == {}

    def test_unlabelled_resources_and_gone_deployments_are_orphans(self) -> None:
        world = lab_world()
        create(world, "qr-1", labels={})
        create(world, "qr-2", labels={"tpuctl-deployment": "dep-gone"})
        report = world.invariants(["dep-a"])
        assert [(item["name"], item["reason"]) for item in report["orphans"]] == [
            ("qr-1", "no tpuctl-deployment label"),
            ("qr-2", "deployment 'dep-gone' is gone"),
        ]
        assert report["ok"] is False

    def test_leftovers_report_their_age_and_go_stale_after_the_limit(self) -> None:
        world = lab_world()
        create(world, "qr-1", "us-east5-a", valid_until_s=600)
        create(world, "qr-2")
        world.advance(ACTIVE_AT)
        world.preempt(ZONE, node="qr-2-node")
        world.advance(600)
        report = world.invariants(max_leftover_s=300)
        leftovers = {(item["kind"], item["name"], item["state"]): item for item in report["leftovers"]}
        assert leftovers[("queued_resource", "qr-1", "FAILED")]["age_s"] == pytest.approx(ACTIVE_AT)
        assert leftovers[("node", "qr-2-node", "PREEMPTED")]["age_s"] == 600
        assert leftovers[("node", "qr-2-node", "PREEMPTED")]["too_old"] is True
        assert report["ok"] is False

    def test_two_active_slots_for_one_deployment_are_duplicates(self) -> None:
        world = lab_world()
        create(world, "qr-1")
        create(world, "qr-2", "asia-east1-c")
        world.advance(ACTIVE_AT)
        report = world.invariants(["dep-a"])
        assert report["duplicate_active"] == {"dep-a": ["asia-east1-c/qr-2", "us-east5-b/qr-1"]}


class TestScenarios:
    def test_the_shipped_scenarios_load(self) -> None:
        assert available_scenarios() == [
            "advice-noisy",
            "flex-start-expiry",
            "quota-bound",
            "reference-agent-zones",
            "scarce-v6e",
            "spot-preemptions",
        ]
        for name in available_scenarios():
            assert World(name).scenario.name == name

    def test_a_json_scenario_file_loads(self, tmp_path: Path) -> None:
        path = tmp_path / "mine.json"
        path.write_text(json.dumps(lab_scenario(name="mine")))
        assert load_scenario(path).name == "mine"

    def test_an_unknown_scenario_name_lists_the_shipped_ones(self) -> None:
        with pytest.raises(ScenarioError, match="choose one of advice-noisy, flex-start-expiry"):
            load_scenario("nope")

    def test_a_bad_field_is_named_with_the_fix(self) -> None:
        with pytest.raises(ScenarioError, match=r"zones\.us-east5-b\.capacity.*v6e\.spto: unknown pool"):
            load_scenario(lab_scenario(zones={"us-east5-b": {"capacity": {"v6e": {"spto": 4}}}}))
        with pytest.raises(ScenarioError, match=r"timings\.boot_s"):
            load_scenario(lab_scenario(timings={"boot_s": [300, 60]}))

    def test_scarce_v6e_gets_spot_capacity_in_us_east5_b_after_forty_minutes(self) -> None:
        world = World("scarce-v6e")
        create(world, "qr-1", ZONE)
        world.advance(2399)
        assert world.qr_state(ZONE, "qr-1") == "WAITING_FOR_RESOURCES"
        world.advance(1 + 300)
        assert world.qr_state(ZONE, "qr-1") == "ACTIVE"

    def test_quota_bound_refuses_us_east5_by_region_but_serves_europe(self) -> None:
        world = World("quota-bound")
        assert "in region us-east5" in refused(world, zone=ZONE).message
        assert "in zone us-central1-b" in refused(world, zone="us-central1-b").message
        create(world, zone="europe-west4-a")
        world.advance(400)
        assert world.qr_state("europe-west4-a", "qr-1") == "ACTIVE"

    def test_spot_preemptions_preempts_within_hours(self) -> None:
        world = World("spot-preemptions")
        create(world, zone=ZONE)
        world.advance(6 * 3600)
        assert world.qr_state(ZONE, "qr-1") == "SUSPENDED"
        assert world.node_state(ZONE, "qr-1-node") == "PREEMPTED"

    def test_flex_start_expiry_suspends_at_the_end_of_the_run(self) -> None:
        world = World("flex-start-expiry")
        create(world, zone=ZONE, tier="flex", max_run_s=7200)
        create(world, "qr-2", "us-east5-a", tier="flex", valid_until_s=1800)
        world.advance(QUEUED_AT + 300 + 7200 + 90)
        assert world.qr_state(ZONE, "qr-1") == "SUSPENDED"
        assert world.qr_state("us-east5-a", "qr-2") == "FAILED"

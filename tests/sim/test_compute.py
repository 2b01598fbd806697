"""The simulator's Compute Engine half, driven in-process: quotas, flex-start waiting, max-run, preemption,
billing and invariants shared with the TPU API half."""

from __future__ import annotations

from typing import Any

import pytest

from localcloud.tpu_sim import NodeEvent, World
from localcloud.tpu_sim.compute import ComputeApiError
from localcloud.tpu_sim.compute_wire import catalog_skus, compute_dispatch
from tests.support.fixtures_compute_sim import LAB, lab_world

ZONE = "us-east5-b"
PROJECT = "demo-proj"


def body(name: str, model: str = "SPOT", machine: str = "ct6e-standard-4t", **scheduling: Any) -> dict[str, Any]:
    sched = {"provisioningModel": model, "onHostMaintenance": "TERMINATE", **scheduling}
    if model == "FLEX_START":
        sched.setdefault("maxRunDuration", "3600s")
        sched.setdefault("instanceTerminationAction", "DELETE")
    return {
        "name": name,
        "machineType": f"zones/{ZONE}/machineTypes/{machine}",
        "labels": {"tpuctl-deployment": "dep-a"},
        "scheduling": sched,
    }


def world(**extra: Any) -> World:
    zones = extra.pop("zones", {ZONE: {"capacity": {"v6e": {"spot": 8, "flex_start": 8, "on_demand": 8}}}})
    return World(lab_world(zones, **extra))


def test_flex_start_uses_the_preemptible_pool_first_then_the_family_pool_then_waits() -> None:
    w = world(
        compute_quotas=[
            {"metric": "preemptible", "region": "us-east5", "limit": 4},
            {"metric": "family", "region": "us-east5", "limit": 4},
        ]
    )
    for name in ("f1", "f2", "f3"):
        w.compute.insert(PROJECT, ZONE, body(name, "FLEX_START", machine="ct6e-standard-4t"))
    w.advance(LAB.accept_s + 1)
    assert [w.compute.status(ZONE, n) for n in ("f1", "f2", "f3")] == ["STAGING", "STAGING", "PENDING"]
    quota = {item["metric"]: item["usage"] for item in w.state()["compute"]["quota"]}
    assert quota == {"preemptible": 4, "family": 4}
    w.compute.delete(PROJECT, ZONE, "f1")
    w.advance(LAB.delete_s + 1)
    assert w.compute.status(ZONE, "f3") in ("STAGING", "RUNNING")  # quota freed: the waiting request goes


def test_spot_short_of_quota_fails_its_operation_with_quota_info_and_creates_nothing() -> None:
    w = world(compute_quotas=[{"metric": "preemptible", "region": "us-east5", "limit": 0}])
    op = w.compute.insert(PROJECT, ZONE, body("s1"))
    w.advance(LAB.accept_s + 1)
    done = w.compute.get_operation(PROJECT, ZONE, op["name"])
    error = done["error"]["errors"][0]
    assert error["code"] == "QUOTA_EXCEEDED"
    assert error["errorDetails"][0]["quotaInfo"]["limitName"] == "PREEMPTIBLE-TPU-V6E-per-project-region"
    assert done["httpErrorStatusCode"] == 403
    assert w.compute.status(ZONE, "s1") is None


def test_tpu_api_quota_does_not_apply_to_compute_engine() -> None:
    w = world(quotas=[{"id": "TPUV6EPreemptiblePerProjectPerRegionForTPUAPI", "location": "us-east5", "limit": 0}])
    w.compute.insert(PROJECT, ZONE, body("s1"))
    w.advance(LAB.running_at + 1)
    assert w.compute.status(ZONE, "s1") == "RUNNING"


def test_max_run_with_stop_leaves_a_terminated_leftover_the_invariants_report() -> None:
    w = world()
    w.compute.insert(PROJECT, ZONE, body("s1", "STANDARD", maxRunDuration="600s", instanceTerminationAction="STOP"))
    w.advance(LAB.running_at + 600 + LAB.delete_s + 1)
    assert w.compute.status(ZONE, "s1") == "TERMINATED"
    report = w.invariants(["dep-a"], max_leftover_s=60)
    assert report["leftovers"] == [
        {
            "kind": "instance",
            "zone": ZONE,
            "name": "s1",
            "state": "TERMINATED",
            "age_s": pytest.approx(0.0, abs=1),
            "too_old": False,
        }
    ]
    w.advance(120)
    assert w.invariants(["dep-a"], max_leftover_s=60)["ok"] is False


def test_spot_hazard_preempts_running_instances_and_a_preemption_in_the_first_minute_is_free() -> None:
    zones = {ZONE: {"capacity": {"v6e": {"spot": 8}}, "preemption": {"hazard_per_hour": 3600}}}
    w = world(zones=zones)
    events: list[NodeEvent] = []
    w.add_node_listener(events.append)
    w.compute.insert(PROJECT, ZONE, body("s1", instanceTerminationAction="DELETE"))
    w.advance(LAB.running_at + 30)
    kinds = [event.kind for event in events]
    assert kinds[:2] == ["ready", "preempted"]
    assert w.billing()["total_usd"] == 0.0
    w.advance(LAB.delete_s + 1)
    assert w.compute.status(ZONE, "s1") is None
    assert [event.kind for event in events][-1] == "deleted"


def test_the_node_runtime_can_attach_a_serving_endpoint_to_an_instance() -> None:
    w = world()
    w.compute.insert(PROJECT, ZONE, body("s1"))
    w.advance(LAB.running_at + 1)
    w.set_node_endpoint(ZONE, "s1", "127.0.0.1", 8123)
    items = w.compute.instance(ZONE, "s1")["metadata"]["items"]  # type: ignore[index]
    assert {"key": "tpuctl-endpoint", "value": "127.0.0.1:8123"} in items


def test_billing_meters_instances_at_the_scenario_price_of_their_tier() -> None:
    w = world(prices={"us-east5": {"on_demand": 3.0}})
    w.compute.insert(PROJECT, ZONE, body("s1", "STANDARD"))
    w.advance(LAB.running_at + 3600)
    billing = w.billing()
    assert billing["by_tier"]["on_demand"]["chip_hours"] == pytest.approx(4.0, rel=1e-3)
    assert billing["by_deployment"]["dep-a"] == pytest.approx(12.0, rel=1e-3)


def test_unlabelled_instances_are_orphans_and_deleted_ones_are_not() -> None:
    w = world()
    unlabelled = body("x1")
    unlabelled.pop("labels")
    w.compute.insert(PROJECT, ZONE, unlabelled)
    w.compute.insert(PROJECT, ZONE, body("s1"))
    w.advance(LAB.running_at + 1)
    orphans = w.invariants(["dep-a"])["orphans"]
    assert [(item["kind"], item["name"]) for item in orphans] == [("instance", "x1")]
    w.compute.delete(PROJECT, ZONE, "x1")
    assert w.invariants(["dep-a"])["orphans"] == []


@pytest.mark.parametrize(
    ("patch", "reason", "text"),
    [
        ({"name": "Bad_Name"}, "invalid", "resource.name"),
        ({"labels": {"Bad": "x"}}, "invalid", "label key"),
        ({"machineType": "zones/us-east5-b/machineTypes/n2-standard-4"}, "invalid", "does not exist in zone"),
        ({"scheduling": {"provisioningModel": "SPOT"}}, "invalid", "onHostMaintenance"),
        (
            {"scheduling": {"provisioningModel": "FLEX_START", "onHostMaintenance": "TERMINATE"}},
            "invalid",
            "FLEX_START",
        ),
        (
            {"scheduling": {"provisioningModel": "BOGUS", "onHostMaintenance": "TERMINATE"}},
            "invalid",
            "provisioningModel",
        ),
        (
            {
                "scheduling": {"provisioningModel": "SPOT", "onHostMaintenance": "TERMINATE"},
                "params": {"requestValidForDuration": "60s"},
            },
            "invalid",
            "requestValidForDuration",
        ),
        (
            {
                "scheduling": {
                    "provisioningModel": "STANDARD",
                    "onHostMaintenance": "TERMINATE",
                    "maxRunDuration": "600s",
                }
            },
            "invalid",
            "instanceTerminationAction",
        ),
    ],
)
def test_bad_inserts_are_refused_synchronously_naming_the_field(patch: dict[str, Any], reason: str, text: str) -> None:
    w = world()
    with pytest.raises(ComputeApiError) as caught:
        w.compute.insert(PROJECT, ZONE, {**body("s1"), **patch})
    assert caught.value.reason == reason
    assert text in caught.value.message
    assert caught.value.envelope()["error"]["errors"][0]["reason"] == reason


def test_reset_forgets_instances_and_the_wire_routes_answer_in_compute_shapes() -> None:
    w = world()
    w.compute.insert(PROJECT, ZONE, body("s1"))
    w.reset()
    assert w.compute.status(ZONE, "s1") is None
    status, listed = compute_dispatch(w, "GET", f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/machineTypes", {}, {})
    assert status == 200
    assert [item["name"] for item in listed["items"]] == ["ct6e-standard-1t", "ct6e-standard-4t", "ct6e-standard-8t"]
    with pytest.raises(ComputeApiError) as caught:
        compute_dispatch(w, "GET", "/compute/v1/nowhere", {}, {})
    assert caught.value.http_status == 404


def test_the_catalog_serves_sku_descriptions_the_adapter_matches() -> None:
    w = world(zones={ZONE: {}, "europe-west4-a": {}}, billing_catalog={"omit_tiers": ["spot"]})
    descriptions = {sku["description"] for sku in catalog_skus(w)}
    assert "DWS Defined Duration V6e running in Columbus" in descriptions
    assert "TpuV6e running in Netherlands" in descriptions
    assert not any("Spot Preemptible" in text for text in descriptions)

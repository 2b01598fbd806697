"""Guest attributes end to end: written as the VM's metadata server does (``World.put_guest_attribute``), read by the
real google-cloud-tpu and google-cloud-compute clients in the adapters, over the simulator's HTTP wire and in
process, with the wire shapes Google's types define."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from localcloud.in_process_compute import InProcessComputeTpu
from localcloud.in_process_tpu import InProcessTpuApi
from shared.domain.boot_progress import BOOT_QUERY_PATH, GuestAttribute
from shared.domain.cloud import LABEL_DEPLOYMENT, ProvisionRequest
from shared.domain.errors import CloudError, ErrorClass
from shared.domain.models import Backend, Tier
from tests.sim.bodies import ACTIVE_AT, DELETE_S, lab_scenario
from tests.support.fixtures_compute_sim import LAB, ComputeSimFactory, ComputeSimHandle, lab_world
from tests.support.fixtures_tpu_sim import TpuSimFactory, TpuSimHandle

ZONE = "us-east5-b"
NODE = "dep-a-g1-a0"
PROGRESS = {"phase": "weights", "detail": "downloading", "boot": "1767355200000"}
EXPECTED = [GuestAttribute("tpuctl", key, PROGRESS[key]) for key in ("boot", "detail", "phase")]


def tpu_request(name: str) -> ProvisionRequest:
    return ProvisionRequest(
        resource_id=name,
        node_id=name,
        zone=ZONE,
        accelerator="v6e-4",
        tier=Tier.SPOT,
        request_id=f"req-{name}",
        labels={LABEL_DEPLOYMENT: name.split("-g")[0]},
        startup_script="#!/bin/bash\necho serving",
    )


def ce_request(name: str, tier: Tier = Tier.SPOT) -> ProvisionRequest:
    return tpu_request(name).model_copy(update={"tier": tier, "backend": Backend.COMPUTE_ENGINE})


def write(world: Any, name: str = NODE) -> None:
    for key, value in PROGRESS.items():
        world.put_guest_attribute(ZONE, name, "tpuctl", key, value)
    world.put_guest_attribute(ZONE, name, "other-agent", "phase", "not ours")


def raised(call: Any, *args: Any) -> CloudError:
    with pytest.raises(CloudError) as caught:
        call(*args)
    return caught.value


@pytest.fixture
def tpu(tpu_sim_factory: TpuSimFactory) -> TpuSimHandle:
    lab = tpu_sim_factory(lab_scenario())
    lab.api.create(tpu_request(NODE))
    lab.advance(ACTIVE_AT)
    return lab


@pytest.fixture
def ce(compute_sim_factory: ComputeSimFactory) -> ComputeSimHandle:
    lab = compute_sim_factory(lab_world({ZONE: {"capacity": {"v6e": {"spot": 8, "on_demand": 8}}}}))
    lab.ce.create(ce_request(NODE))
    lab.advance(LAB.running_at + 1)
    return lab


class TestTpuApi:
    def test_what_the_vm_wrote_reads_back_through_the_client_namespace_only(self, tpu: TpuSimHandle) -> None:
        assert tpu.api.guest_attributes(ZONE, NODE, BOOT_QUERY_PATH) == []
        write(tpu.world)
        assert list(tpu.api.guest_attributes(ZONE, NODE, BOOT_QUERY_PATH)) == EXPECTED
        assert len(tpu.api.guest_attributes(ZONE, NODE, "")) == 4

    def test_the_wire_is_google_s_get_guest_attributes_response(self, tpu: TpuSimHandle) -> None:
        write(tpu.world)
        url = f"{tpu.base_url}/v2/projects/demo-proj/locations/{ZONE}/nodes/{NODE}:getGuestAttributes"
        body = httpx.post(url, json={"queryPath": "tpuctl/", "workerIds": ["0"]}).json()
        items = [{"namespace": "tpuctl", "key": key, "value": PROGRESS[key]} for key in ("boot", "detail", "phase")]
        assert body == {"guestAttributes": [{"queryPath": "tpuctl/", "queryValue": {"items": items}}]}
        other_worker = httpx.post(url, json={"queryPath": "tpuctl/", "workerIds": ["1"]}).json()
        assert other_worker == {"guestAttributes": []}

    def test_attributes_outlive_stop_and_start_and_go_with_the_node(self, tpu: TpuSimHandle) -> None:
        write(tpu.world)
        tpu.api.delete(ZONE, NODE, force=True)  # the queued resource's node; a bare node stops and starts below
        tpu.advance(DELETE_S + 1)
        assert raised(tpu.api.guest_attributes, ZONE, NODE, BOOT_QUERY_PATH).error_class is ErrorClass.NOT_FOUND
        with pytest.raises(KeyError):
            tpu.world.put_guest_attribute(ZONE, NODE, "tpuctl", "phase", "booting")
        tpu.world.create_node(
            "demo-proj", ZONE, "bare", {"acceleratorType": "v6e-1", "runtimeVersion": "v2-alpha-tpuv6e"}
        )
        tpu.advance(200)
        write(tpu.world, "bare")
        tpu.api.stop_node(ZONE, "bare")
        tpu.advance(20)
        tpu.api.start_node(ZONE, "bare")
        tpu.advance(30)
        assert tpu.world.node_state(ZONE, "bare") == "READY"
        assert list(tpu.api.guest_attributes(ZONE, "bare", BOOT_QUERY_PATH)) == EXPECTED

    def test_errors_are_classified_like_every_other_call(self, tpu: TpuSimHandle) -> None:
        assert raised(tpu.api.guest_attributes, ZONE, "nobody", BOOT_QUERY_PATH).error_class is ErrorClass.NOT_FOUND
        tpu.world.inject_fault({"endpoint": "get_guest_attributes", "status": 503, "times": 1})
        assert raised(tpu.api.guest_attributes, ZONE, NODE, BOOT_QUERY_PATH).error_class is ErrorClass.TRANSIENT

    def test_in_process_the_same_client_reads_the_same(self, tpu: TpuSimHandle) -> None:
        write(tpu.world)
        assert list(InProcessTpuApi(tpu.world).guest_attributes(ZONE, NODE, BOOT_QUERY_PATH)) == EXPECTED

    @pytest.mark.parametrize("name", ["", "../x", "a/b", "x" * 129, "phase\n"])
    def test_a_name_that_is_not_one_path_segment_is_refused(self, tpu: TpuSimHandle, name: str) -> None:
        with pytest.raises(ValueError, match="guest attribute name"):
            tpu.world.put_guest_attribute(ZONE, NODE, "tpuctl", name, "x")
        with pytest.raises(ValueError, match="guest attribute name"):
            tpu.world.put_guest_attribute(ZONE, NODE, name, "phase", "x")

    def test_delete_removes_one_key(self, tpu: TpuSimHandle) -> None:
        write(tpu.world)
        tpu.world.delete_guest_attribute(ZONE, NODE, "tpuctl", "detail")
        tpu.world.delete_guest_attribute(ZONE, NODE, "tpuctl", "never-written")
        assert tpu.world.guest_attributes(ZONE, NODE, "tpuctl/") == [
            ("tpuctl", "boot", PROGRESS["boot"]),
            ("tpuctl", "phase", "weights"),
        ]
        assert tpu.world.guest_attributes(ZONE, NODE, "tpuctl/phase") == [("tpuctl", "phase", "weights")]


class TestComputeEngine:
    def test_the_instance_asks_for_guest_attributes(self, ce: ComputeSimHandle) -> None:
        items = {item.key: item.value for item in ce.ce.instance_for(ce_request(NODE)).metadata.items}
        assert items["enable-guest-attributes"] == "TRUE"

    def test_what_the_vm_wrote_reads_back_and_nothing_yet_is_empty(self, ce: ComputeSimHandle) -> None:
        assert ce.ce.guest_attributes(ZONE, NODE, BOOT_QUERY_PATH) == []  # Compute's 404 for an empty path
        write(ce.world)
        assert list(ce.ce.guest_attributes(ZONE, NODE, BOOT_QUERY_PATH)) == EXPECTED
        assert list(InProcessComputeTpu(ce.world).guest_attributes(ZONE, NODE, BOOT_QUERY_PATH)) == EXPECTED

    def test_the_wire_is_compute_s_guest_attributes_resource(self, ce: ComputeSimHandle) -> None:
        write(ce.world)
        base = f"{ce.base_url}/compute/v1/projects/demo-proj/zones/{ZONE}/instances/{NODE}/getGuestAttributes"
        body = httpx.get(base, params={"queryPath": "tpuctl/"}).json()
        assert body["queryPath"] == "tpuctl/"
        assert body["queryValue"]["items"][2] == {"namespace": "tpuctl", "key": "phase", "value": "weights"}
        one = httpx.get(base, params={"variableKey": "tpuctl/detail"}).json()
        assert (one["variableKey"], one["variableValue"]) == ("tpuctl/detail", "downloading")
        assert httpx.get(base, params={"queryPath": "nobody/"}).status_code == 404

    def test_a_missing_instance_is_not_found_and_a_stopped_one_keeps_its_values(self, ce: ComputeSimHandle) -> None:
        assert raised(ce.ce.guest_attributes, ZONE, "nobody", BOOT_QUERY_PATH).error_class is ErrorClass.NOT_FOUND
        ce.ce.create(ce_request("dep-a-g1-a1", tier=Tier.ON_DEMAND))
        ce.advance(LAB.running_at + 1)
        write(ce.world, "dep-a-g1-a1")
        ce.ce.stop_node(ZONE, "dep-a-g1-a1")
        ce.advance(LAB.stop_s + 1)
        assert list(ce.ce.guest_attributes(ZONE, "dep-a-g1-a1", BOOT_QUERY_PATH)) == EXPECTED


def test_the_router_finds_each_node_on_its_back_end(ce: ComputeSimHandle) -> None:
    ce.tpu.create(tpu_request("dep-b-g1-a0"))
    ce.advance(ACTIVE_AT)
    write(ce.world)
    ce.world.put_guest_attribute(ZONE, "dep-b-g1-a0", "tpuctl", "phase", "compiling")
    assert list(ce.multi.guest_attributes(ZONE, NODE, BOOT_QUERY_PATH)) == EXPECTED
    assert list(ce.multi.guest_attributes(ZONE, "dep-b-g1-a0", BOOT_QUERY_PATH)) == [
        GuestAttribute("tpuctl", "phase", "compiling")
    ]
    assert raised(ce.multi.guest_attributes, ZONE, "nobody", BOOT_QUERY_PATH).error_class is ErrorClass.NOT_FOUND

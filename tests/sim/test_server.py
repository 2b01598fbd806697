"""The simulator on the wire: paths, enums, envelopes, faults and the /_sim/ admin calls, over real HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from localcloud.tpu_sim import SimServer, World
from tests.sim.bodies import ACTIVE_AT, DELETE_S, PROJECT, lab_scenario, qr_body

ZONE = "us-east5-b"
PARENT = f"v2/projects/{PROJECT}/locations/{ZONE}"
ALT = {"$alt": "json;enum-encoding=int"}


@pytest.fixture
def served() -> Iterator[tuple[World, httpx.Client]]:
    world = World(lab_scenario(zones={"us-east5-a": {"unreachable": True}}))
    server = SimServer(world)
    base_url = server.start()
    with httpx.Client(base_url=base_url, timeout=10) as client:
        yield world, client
    server.stop()


def create(client: httpx.Client, qr_id: str = "qr-1", body: dict[str, Any] | None = None, **params: str) -> Any:
    return client.post(
        f"/{PARENT}/queuedResources",
        params={"queuedResourceId": qr_id, **ALT, **params},
        json=body or qr_body(node_id=f"{qr_id}-node"),
    )


class TestApi:
    def test_create_get_and_list_with_numeric_enums_and_alt_ignored(self, served: tuple[World, httpx.Client]) -> None:
        world, client = served
        body = qr_body(node_id="qr-1-node")
        node = body["tpu"]["nodeSpec"][0]["node"]
        del node["acceleratorType"]
        node["acceleratorConfig"] = {"type": 6, "topology": "2x2"}
        answer = create(client, body=body)
        assert answer.status_code == 200
        assert answer.json()["done"] is False
        world.advance(ACTIVE_AT)
        got = client.get(f"/{PARENT}/queuedResources/qr-1", params=ALT).json()
        assert got["state"]["state"] == "ACTIVE"
        node_json = client.get(f"/{PARENT}/nodes/qr-1-node").json()
        assert node_json["acceleratorType"] == "v6e-4"
        assert node_json["acceleratorConfig"] == {"type": "V6E", "topology": "2x2"}
        listed = client.get(f"/v2/projects/{PROJECT}/locations/-/queuedResources").json()
        assert [item["name"].rsplit("/", 1)[-1] for item in listed["queuedResources"]] == ["qr-1"]
        assert listed["unreachable"] == ["us-east5-a"]

    def test_errors_use_googles_envelope(self, served: tuple[World, httpx.Client]) -> None:
        _, client = served
        answer = client.get(f"/{PARENT}/queuedResources/ghost")
        assert answer.status_code == 404
        assert answer.json() == {
            "error": {
                "code": 404,
                "message": f"Resource 'projects/{PROJECT}/locations/{ZONE}/queuedResources/ghost' was not found",
                "status": "NOT_FOUND",
            }
        }

    def test_invalid_json_and_unknown_paths_are_clear_errors(self, served: tuple[World, httpx.Client]) -> None:
        _, client = served
        broken = client.post(
            f"/{PARENT}/queuedResources",
            params={"queuedResourceId": "x"},
            content=b"{not json",
            headers={"Content-Type": "application/json"},
        )
        assert broken.status_code == 400
        assert broken.json()["error"]["message"].startswith("Invalid JSON payload received.")
        assert client.get("/v3/whatever").json()["error"]["code"] == 404

    def test_pagination_follows_next_page_token(self, served: tuple[World, httpx.Client]) -> None:
        _, client = served
        for index in range(3):
            assert create(client, f"qr-{index}", qr_body(node_id=f"n-{index}")).status_code == 200
        first = client.get(f"/{PARENT}/queuedResources", params={"pageSize": "2"}).json()
        assert len(first["queuedResources"]) == 2
        second = client.get(f"/{PARENT}/queuedResources", params={"pageSize": "2", "pageToken": first["nextPageToken"]})
        assert [item["name"][-4:] for item in second.json()["queuedResources"]] == ["qr-2"]
        assert "nextPageToken" not in second.json()

    def test_operations_get_list_cancel_and_delete(self, served: tuple[World, httpx.Client]) -> None:
        _, client = served
        name = create(client).json()["name"]
        assert client.get(f"/v2/{name}").json()["name"] == name
        assert [op["name"] for op in client.get(f"/{PARENT}/operations").json()["operations"]] == [name]
        assert client.post(f"/v2/{name}:cancel", json={}).status_code == 200
        assert client.get(f"/v2/{name}").json()["metadata"]["cancelRequested"] is True
        assert client.delete(f"/v2/{name}").status_code == 200
        assert client.get(f"/v2/{name}").status_code == 404

    def test_catalogue_calls(self, served: tuple[World, httpx.Client]) -> None:
        _, client = served
        types = client.get(f"/{PARENT}/acceleratorTypes").json()["acceleratorTypes"]
        assert [item["type"] for item in types] == ["v6e-1", "v6e-4", "v6e-8"]
        assert client.get(f"/{PARENT}/acceleratorTypes/v6e-8").json()["acceleratorConfigs"] == [
            {"type": "V6E", "topology": "2x4"}
        ]
        versions = client.get(f"/{PARENT}/runtimeVersions").json()["runtimeVersions"]
        assert "v2-alpha-tpuv6e" in [item["version"] for item in versions]
        locations = client.get(f"/v2/projects/{PROJECT}/locations").json()["locations"]
        assert "us-central2-b" not in [item["locationId"] for item in locations]
        assert client.get(f"/{PARENT}").json()["locationId"] == ZONE
        reservations = client.get(f"/v2alpha1/projects/{PROJECT}/locations/{ZONE}/reservations").json()
        assert reservations["reservations"][0]["name"].endswith("/reservations/res-a")

    def test_node_create_stop_start_and_guest_attributes(self, served: tuple[World, httpx.Client]) -> None:
        world, client = served
        body = {"acceleratorType": "v6e-1", "runtimeVersion": "v2-alpha-tpuv6e"}
        assert client.post(f"/{PARENT}/nodes", params={"nodeId": "bare"}, json=body).status_code == 200
        world.advance(10 + 100)
        assert client.post(f"/{PARENT}/nodes/bare:getGuestAttributes", json={}).json() == {"guestAttributes": []}
        stop = client.post(f"/{PARENT}/nodes/bare:stop", json={}).json()
        world.advance(20)
        assert client.get(f"/v2/{stop['name']}").json()["response"]["state"] == "STOPPED"
        client.post(f"/{PARENT}/nodes/bare:start", json={})
        world.advance(30)
        assert client.get(f"/{PARENT}/nodes/bare").json()["state"] == "READY"
        patched = client.patch(
            f"/{PARENT}/nodes/bare", params={"updateMask": "labels"}, json={"labels": {"team": "ml"}}
        ).json()
        assert patched["response"]["labels"] == {"team": "ml"}

    def test_list_lag_hides_new_resources_and_shows_gone_ones_for_a_while(self) -> None:
        world = World(lab_scenario(limits={"list_lag_s": 30}))
        with SimServer(world) as server, httpx.Client(base_url=server.base_url) as client:
            create(client)
            assert client.get(f"/{PARENT}/queuedResources").json()["queuedResources"] == []
            world.advance(ACTIVE_AT)
            client.delete(f"/{PARENT}/queuedResources/qr-1", params={"force": "true"})
            world.advance(DELETE_S)
            assert client.get(f"/{PARENT}/queuedResources/qr-1").status_code == 404
            assert len(client.get(f"/{PARENT}/queuedResources").json()["queuedResources"]) == 1
            world.advance(30)
            assert client.get(f"/{PARENT}/queuedResources").json()["queuedResources"] == []

    def test_an_auth_token_is_checked_when_configured(self) -> None:
        world = World(lab_scenario(auth_token="s3cret"))
        with SimServer(world) as server, httpx.Client(base_url=server.base_url) as client:
            assert client.get(f"/{PARENT}/queuedResources").status_code == 401
            assert client.get(f"/{PARENT}/queuedResources", headers={"Authorization": "Bearer no"}).status_code == 403
            ok = client.get(f"/{PARENT}/queuedResources", headers={"Authorization": "Bearer s3cret"})
            assert ok.status_code == 200


class TestFaults:
    def test_an_injected_503_answers_n_times_then_the_call_succeeds(self, served: tuple[World, httpx.Client]) -> None:
        _, client = served
        name = create(client).json()["name"]
        added = client.post("/_sim/faults", json={"endpoint": "get_operation", "status": 503, "times": 2}).json()
        assert added["faults"][0]["remaining"] == 2
        answers = [client.get(f"/v2/{name}") for _ in range(3)]
        assert [answer.status_code for answer in answers] == [503, 503, 200]
        assert answers[0].json()["error"]["status"] == "UNAVAILABLE"

    def test_a_wildcard_fault_hits_any_endpoint(self, served: tuple[World, httpx.Client]) -> None:
        _, client = served
        client.post("/_sim/faults", json={"endpoint": "*", "status": 500, "times": 1, "message": "boom"})
        answer = client.get(f"/{PARENT}/queuedResources")
        assert (answer.status_code, answer.json()["error"]["message"]) == (500, "boom")
        assert client.get(f"/{PARENT}/queuedResources").status_code == 200

    def test_faults_can_be_cleared_and_bad_ones_are_refused(self, served: tuple[World, httpx.Client]) -> None:
        _, client = served
        client.post("/_sim/faults", json={"endpoint": "list_nodes", "status": 429, "times": 5})
        assert client.delete("/_sim/faults").json()["faults"] == []
        bad = client.post("/_sim/faults", json={"endpoint": "list_nodes", "status": 200})
        assert bad.status_code == 400
        assert "status" in bad.json()["error"]["message"]


class TestAdmin:
    def test_state_advance_capacity_preempt_and_reset(self, served: tuple[World, httpx.Client]) -> None:
        world, client = served
        create(client)
        assert client.post("/_sim/advance", params={"seconds": str(ACTIVE_AT)}).json()["elapsed_s"] == ACTIVE_AT
        state = client.get("/_sim/state").json()
        assert state["queued_resources"][0]["state"]["state"] == "ACTIVE"
        assert state["nodes"][0]["sim"]["tier"] == "spot"
        assert any(item["kind"] == "qr.active" for item in state["events"])
        pool = client.post("/_sim/capacity", json={"zone": "us-east5-a", "pool": "spot", "chips": 12}).json()
        assert pool == {"total": 12, "used": 0, "free": 12}
        assert client.post("/_sim/preempt", json={"zone": ZONE, "queued_resource": "qr-1"}).json() == {
            "preempted": ["qr-1-node"]
        }
        assert world.node_state(ZONE, "qr-1-node") == "PREEMPTED"
        client.post("/_sim/reset")
        assert client.get("/_sim/state").json()["queued_resources"] == []

    def test_invariants_take_the_live_deployments(self, served: tuple[World, httpx.Client]) -> None:
        world, client = served
        create(client)
        world.advance(ACTIVE_AT)
        assert client.get("/_sim/invariants", params={"live": "dep-a"}).json()["ok"] is True
        report = client.post("/_sim/invariants", json={"live_deployments": ["dep-b"]}).json()
        assert report["orphans"][0]["reason"] == "deployment 'dep-a' is gone"
        assert report["billing"]["by_tier"] == {"spot": {"chip_hours": 0.0, "usd": 0.0}}

    def test_a_node_endpoint_can_be_attached(self, served: tuple[World, httpx.Client]) -> None:
        world, client = served
        create(client)
        world.advance(ACTIVE_AT)
        answer = client.post(f"/_sim/nodes/{ZONE}/qr-1-node/endpoint", json={"ip_address": "127.0.0.1", "port": 18000})
        assert answer.json()["networkEndpoints"] == [{"ipAddress": "127.0.0.1", "port": 18000}]
        missing = client.post(f"/_sim/nodes/{ZONE}/ghost/endpoint", json={"ip_address": "127.0.0.1", "port": 1})
        assert missing.status_code == 400
        assert "ghost" in missing.json()["error"]["message"]

    def test_admin_input_errors_name_the_field(self, served: tuple[World, httpx.Client]) -> None:
        _, client = served
        answer = client.post("/_sim/capacity", json={"zone": ZONE})
        assert answer.status_code == 400
        assert answer.json()["error"]["message"].startswith("pool: required")
        assert client.post("/_sim/advance", params={"seconds": "-5"}).status_code == 400

    def test_the_server_binds_loopback_only(self) -> None:
        with pytest.raises(ValueError, match="loopback"):
            SimServer(World(lab_scenario()), host="0.0.0.0")

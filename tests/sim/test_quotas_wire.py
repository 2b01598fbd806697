"""The simulator's Cloud Quotas subset on the wire: QuotaInfo shape, get, paging and refusals, over real HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from localcloud.tpu_sim import SimServer, World

BASE = "/v1/projects/demo-proj/locations/global/services/tpu.googleapis.com/quotaInfos"
SCENARIO = {
    "name": "quotas",
    "zones": {"us-east5-b": {}},
    "quotas": [
        {"id": "TPUV6EPreemptiblePerProjectPerZoneForTPUAPI", "location": "us-east5-b", "limit": 32},
        {"id": "TPUV6EPreemptiblePerProjectPerRegionForTPUAPI", "location": "us-east5", "limit": 64},
        {"id": "TPUV6EPerProjectPerRegionForTPUAPI", "location": "us-east5", "limit": 0},
    ],
}


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    server = SimServer(World(SCENARIO))
    with httpx.Client(base_url=server.start(), timeout=10) as http:
        yield http
    server.stop()


def test_a_quota_info_carries_its_dimension_and_limit_per_location(client: httpx.Client) -> None:
    answer = client.get(f"{BASE}/TPUV6EPreemptiblePerProjectPerZoneForTPUAPI")
    assert answer.status_code == 200
    info = answer.json()
    assert info["name"].endswith("/services/tpu.googleapis.com/quotaInfos/TPUV6EPreemptiblePerProjectPerZoneForTPUAPI")
    assert info["service"] == "tpu.googleapis.com" and info["dimensions"] == ["zone"]
    assert info["dimensionsInfos"] == [
        {"dimensions": {"zone": "us-east5-b"}, "details": {"value": "32"}, "applicableLocations": ["us-east5-b"]}
    ]


def test_the_list_pages_in_quota_id_order(client: httpx.Client) -> None:
    first = client.get(BASE, params={"pageSize": 2}).json()
    second = client.get(BASE, params={"pageSize": 2, "pageToken": first["nextPageToken"]}).json()
    ids = [info["quotaId"] for info in first["quotaInfos"] + second["quotaInfos"]]
    assert ids == sorted(ids) and len(ids) == 3
    assert "nextPageToken" not in second


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", f"{BASE}/NoSuchQuota", 404),
        ("GET", BASE.replace("/global/", "/us-east5/"), 400),
        ("GET", BASE.replace("demo-proj", "other-proj"), 403),
        ("POST", BASE, 405),
    ],
)
def test_refusals_come_in_googles_envelope(client: httpx.Client, method: str, path: str, status: int) -> None:
    answer = client.request(method, path)
    assert answer.status_code == status
    assert answer.json()["error"]["code"] == status

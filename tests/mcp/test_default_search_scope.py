"""The default search scope: with no zones given, plan and create use every catalog zone where the slice fits
the live quota (issue #18 item 10), shown in the plan before anything is created.

The simulator's made-up world: spot quota in us-east5-a and us-east5-b (zone 32 each, region 64), in
europe-west4-a (zone 8, where a spot v6e-4 already runs: 4 chips free) and in us-central1-b (zone 4, where a
spot v6e-4 runs: 0 free); us-east1-d has a spot zone limit of 0. No other catalog zone lists a v6e limit.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Iterator
from typing import Any

import pytest
from mcp import Client

from mcp_client_gateway.cli import EXIT_OK, run
from mcp_client_gateway.core import GatewayCore
from mcp_client_gateway.errors import GatewayError
from shared.adapters.cloud_quotas import CloudQuotas
from shared.domain.cloud import ProvisionRequest
from shared.domain.models import Tier
from shared.domain.zone_catalog import V6E_ZONES
from tests.mcp.conftest import GatewayWorld
from tests.support.fixtures_tpu_sim import TpuSimFactory

pytestmark = pytest.mark.anyio

_PLENTY = {"accelerators": ["v6e-1", "v6e-4", "v6e-8"], "capacity": {"v6e": {"spot": 32, "on_demand": 32}}}
_SPOT_ZONE = "TPUV6EPreemptiblePerProjectPerZoneForTPUAPI"
SCENARIO: dict[str, Any] = {
    "name": "scope-test",
    "project": "demo-proj",
    "seed": 3,
    "zones": {zone: _PLENTY for zone in ("us-east5-a", "us-east5-b", "europe-west4-a", "us-central1-b", "us-east1-d")},
    "quotas": [
        {"id": _SPOT_ZONE, "location": "us-east5-a", "limit": 32},
        {"id": _SPOT_ZONE, "location": "us-east5-b", "limit": 32},
        {"id": "TPUV6EPreemptiblePerProjectPerRegionForTPUAPI", "location": "us-east5", "limit": 64},
        {"id": _SPOT_ZONE, "location": "europe-west4-a", "limit": 8},
        {"id": _SPOT_ZONE, "location": "us-central1-b", "limit": 4},
        {"id": _SPOT_ZONE, "location": "us-east1-d", "limit": 0},
    ],
}
FITS = {"us-east5-a", "us-east5-b", "us-east5-c", "europe-west4-a"}  # us-east5-c: under the region limit


@pytest.fixture
def live(world: GatewayWorld, tpu_sim_factory: TpuSimFactory) -> Iterator[GatewayWorld]:
    sim = tpu_sim_factory(SCENARIO)
    for name, zone in (("other-a-g1-a0", "europe-west4-a"), ("other-b-g1-a0", "us-central1-b")):
        sim.api.create(
            ProvisionRequest(
                resource_id=name, node_id=name, zone=zone, accelerator="v6e-4", tier=Tier.SPOT, request_id=name
            )
        )
    sim.advance(3600)
    quotas = CloudQuotas(sim.project, endpoint=sim.base_url, retry_budget_s=0.5)
    ports = dataclasses.replace(world.ports, quotas=quotas, tpu=sim.api)
    yield dataclasses.replace(world, ports=ports, core=GatewayCore(ports))
    quotas.close()


async def plan_tool(world: GatewayWorld, **arguments: Any) -> Any:
    async with Client(world.server()) as session:
        result = await session.call_tool("tpu_plan", {"model": "gemma-4-26b-a4b", "accelerator": "v6e-4", **arguments})
    assert not result.is_error, result.content
    return result


async def test_the_plan_without_zones_shows_every_zone_where_the_slice_fits_the_quota(live: GatewayWorld) -> None:
    result = await plan_tool(live, tiers=["spot"])
    scope = result.structured_content["search_scope"]
    assert scope["source"] == "live_quota" and scope["problem"] is None
    assert set(scope["zones"]) == FITS and len(scope["zones"]) > 1
    excluded = {item["zone"]: item["reason"] for item in scope["excluded"]}
    assert excluded["us-east1-d"] == "quota 0 spot chips in zone us-east1-d"
    assert excluded["us-central1-b"] == "quota 0 spot chips in zone us-central1-b"  # its 4 chips are in use
    assert excluded["us-west1-c"] == "no v6e quota listed"  # unknown is not free
    assert set(excluded) == set(V6E_ZONES) - FITS
    assert scope["summary"].startswith("search scope: 4 zone(s) where v6e-4 fits your quota: ")
    assert "us-east1-d (quota 0 spot chips in zone us-east1-d)" in scope["summary"]
    summary = " ".join(block.text for block in result.content if hasattr(block, "text"))
    assert "search scope: 4 zone(s)" in summary
    regions = {cost["region"] for cost in result.structured_content["costs"]}
    assert regions == {"us-east5", "europe-west4"}  # priced where it would search


async def test_the_scope_is_ordered_cheapest_first(live: GatewayWorld) -> None:
    scope = live.core.capacity.search_scope(accelerator="v6e-4", tiers=["spot"])
    plan = live.core.plan(model="gemma-4-26b-a4b", accelerator="v6e-4", tiers=["spot"])
    hourly = {cost.region: cost.usd_per_hour for cost in plan.costs}
    prices = [hourly[zone.rsplit("-", 1)[0]] for zone in scope.zones]
    assert prices == sorted(prices) and plan.search_scope.zones == scope.zones


async def test_given_zones_are_the_scope_as_given(live: GatewayWorld) -> None:
    scope = (await plan_tool(live, zones=["us-east1-d"], tiers=["spot"])).structured_content["search_scope"]
    assert scope["source"] == "given" and scope["zones"] == ["us-east1-d"] and scope["excluded"] == []


async def test_a_create_without_zones_sends_the_plans_scope(live: GatewayWorld) -> None:
    plan = live.core.plan(model="gemma-4-26b-a4b", accelerator="v6e-4", tiers=["spot"])
    live.core.create_deployment(deployment_id="gemma-a", model="gemma-4-26b-a4b", accelerator="v6e-4", tiers=["spot"])
    (message,) = live.published()
    assert message.kind == "deployment.create"
    assert list(message.spec.zones) == plan.search_scope.zones and "us-east1-d" not in message.spec.zones


def test_tpuctl_deploy_without_a_zone_sends_the_scope_and_plan_prints_it(live: GatewayWorld) -> None:
    stdout, stderr = io.StringIO(), io.StringIO()
    argv = ["deploy", "gemma-a", "--model", "gemma-4-26b-a4b", "--tier", "spot"]
    assert run(argv, ports=live.ports, stdout=stdout, stderr=stderr) == EXIT_OK, stderr.getvalue()
    (message,) = live.published()
    assert set(message.spec.zones) == FITS
    stdout = io.StringIO()
    assert run(["plan", "--model", "gemma-4-26b-a4b", "--tier", "spot"], ports=live.ports, stdout=stdout) == EXIT_OK
    assert "search scope: 4 zone(s) where v6e-4 fits your quota" in " ".join(stdout.getvalue().split())


def test_a_tier_no_limit_is_listed_for_falls_back_to_the_catalog_saying_so(live: GatewayWorld) -> None:
    scope = live.core.capacity.search_scope(accelerator="v6e-4", tiers=["on_demand"])
    assert scope.source == "catalog" and set(scope.zones) == set(V6E_ZONES)
    assert scope.problem == "the live quota lists no v6e limit"


def test_no_zone_with_room_refuses_the_create_naming_zones(world: GatewayWorld, tpu_sim_factory: TpuSimFactory) -> None:
    sim = tpu_sim_factory({**SCENARIO, "quotas": [{"id": _SPOT_ZONE, "location": "us-east5-a", "limit": 0}]})
    quotas = CloudQuotas(sim.project, endpoint=sim.base_url, retry_budget_s=0.5)
    core = GatewayCore(dataclasses.replace(world.ports, quotas=quotas, tpu=sim.api))
    with pytest.raises(GatewayError) as caught:
        core.create_deployment(deployment_id="gemma-a", model="gemma-4-26b-a4b", accelerator="v6e-4", tiers=["spot"])
    quotas.close()
    assert caught.value.field == "zones" and "pass zones explicitly" in caught.value.fix
    assert "us-east5-a (quota 0 spot chips in zone us-east5-a)" in caught.value.problem
    assert world.published() == []


def test_without_a_quota_port_the_scope_is_the_catalog_with_the_reason(world: GatewayWorld) -> None:
    plan = world.core.plan(model="gemma-4-26b-a4b", accelerator="v6e-4")
    scope = plan.search_scope
    assert scope.source == "catalog" and set(scope.zones) == set(V6E_ZONES)
    assert scope.problem == "this gateway has no Cloud Quotas port"
    assert "live quota not used: this gateway has no Cloud Quotas port" in scope.summary

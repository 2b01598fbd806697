"""tpu_plan(show='zones') with the live quota (always read over MCP): real Cloud Quotas and TPU clients against the
simulator over HTTP.

The simulator runs ``quota-bound``: us-east5 zones have zone room but region limits of 0, us-central1-b has a
zone limit of 0, europe-west4-a has 16 chips of each kind. A spot v6e-4 and an on-demand v6e-8 run in
europe-west4-a, so its headroom is 12 spot chips and 8 on-demand chips.
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from mcp_client_gateway.cli import EXIT_OK, run
from mcp_client_gateway.composition import build_ports
from mcp_client_gateway.core import GatewayCore
from shared.adapters.cloud_quotas import CloudQuotas
from shared.config import Settings
from shared.domain.cloud import ProvisionRequest
from shared.domain.models import Tier
from tests.mcp.conftest import GatewayWorld
from tests.support.fixtures_tpu_sim import TpuSimFactory, TpuSimHandle

pytestmark = pytest.mark.anyio

DENIED = "Permission 'cloudquotas.quotas.get' denied on resource 'projects/demo-proj'"


@dataclasses.dataclass
class QuotaWorld:
    gateway: GatewayWorld
    sim: TpuSimHandle


@pytest.fixture
def live(world: GatewayWorld, tpu_sim_factory: TpuSimFactory) -> Iterator[QuotaWorld]:
    sim = tpu_sim_factory("quota-bound")
    for name, tier, accelerator in (("dep-a-g1-a0", Tier.SPOT, "v6e-4"), ("dep-b-g1-a0", Tier.ON_DEMAND, "v6e-8")):
        sim.api.create(
            ProvisionRequest(
                resource_id=name,
                node_id=name,
                zone="europe-west4-a",
                accelerator=accelerator,
                tier=tier,
                request_id=f"req-{name}",
            )
        )
    sim.advance(3600)
    quotas = CloudQuotas(sim.project, endpoint=sim.base_url, retry_budget_s=0.5)
    ports = dataclasses.replace(world.ports, quotas=quotas, tpu=sim.api)
    yield QuotaWorld(dataclasses.replace(world, ports=ports, core=GatewayCore(ports)), sim)
    quotas.close()


async def list_zones(live: QuotaWorld, **arguments: Any) -> Any:
    async with Client(live.gateway.server()) as session:
        result = await session.call_tool("tpu_plan", {"show": "zones", "accelerator": "v6e-4", **arguments})
    assert not result.is_error, result.content
    return result


def by_tier(zone: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["tier"]: row for row in zone["quota"]}


async def test_live_quota_shows_limit_in_use_headroom_and_the_slices_that_fit(live: QuotaWorld) -> None:
    result = await list_zones(live)
    body = result.structured_content
    assert body["live_quota"]["read"] is True and body["live_quota"]["usage_source"] == "tpu_api"
    assert body["live_quota"]["problem"] is None
    zones = {z["zone"]: z for z in body["zones"]}
    europe = by_tier(zones["europe-west4-a"])
    spot = europe["spot"]
    assert [(b["scope"], b["limit"], b["in_use"], b["headroom"]) for b in spot["limits"]] == [
        ("zone", 16, 4, 12),
        ("region", 16, 4, 12),
    ]
    assert spot["headroom_chips"] == 12 and spot["slices_that_fit"] == ["v6e-1", "v6e-4", "v6e-8"]
    assert spot["fits"] is True
    assert europe["flex_start"]["headroom_chips"] == 12  # flex-start spends the preemptible quota
    on_demand = europe["on_demand"]
    assert on_demand["headroom_chips"] == 8 and on_demand["slices_that_fit"] == ["v6e-1", "v6e-4", "v6e-8"]
    assert [b["scope"] for b in on_demand["limits"]] == ["zone"]  # no region limit listed for on-demand
    assert "reservation" not in europe


async def test_a_region_limit_of_zero_closes_zones_with_zone_room(live: QuotaWorld) -> None:
    result = await list_zones(live, tiers=["spot"])
    zones = {z["zone"]: z for z in result.structured_content["zones"]}
    east = by_tier(zones["us-east5-b"])["spot"]
    assert east["headroom_chips"] == 0 and east["slices_that_fit"] == [] and east["fits"] is False
    assert zones["us-east5-b"]["available"] is False  # no room in the only tier asked about
    assert zones["us-central1-b"]["available"] is False  # its zone limit is 0
    assert zones["europe-west4-a"]["available"] is True
    unlisted = by_tier(zones["us-west1-c"])["spot"]  # the simulator lists no limit there: unknown, not free
    assert unlisted["limits"] == [] and unlisted["fits"] is None and zones["us-west1-c"]["available"] is True


async def test_without_the_viewer_role_the_listing_degrades_and_names_the_fix(live: QuotaWorld) -> None:
    live.sim.world.inject_fault({"endpoint": "cloudquotas.quotaInfos.list", "status": 403, "message": DENIED})
    result = await list_zones(live)
    body = result.structured_content
    quota = body["live_quota"]
    assert quota["read"] is False and quota["error_class"] == "permission" and quota["field"] == "live_quota"
    assert "cloudquotas.quotas.get" in quota["problem"]
    assert "roles/cloudquotas.viewer" in quota["fix"]
    assert all(zone["quota"] == [] for zone in body["zones"])
    assert body["zones"] and body["zones"][0]["usd_per_hour"]  # prices and memory still answer
    summary = " ".join(block.text for block in result.content if hasattr(block, "text"))
    assert "roles/cloudquotas.viewer" in summary


async def test_an_unreachable_quota_api_degrades_as_transient(live: QuotaWorld) -> None:
    live.sim.world.inject_fault({"endpoint": "cloudquotas.quotaInfos.list", "status": 503, "times": 1000})
    quota = (await list_zones(live)).structured_content["live_quota"]
    assert quota["read"] is False and quota["error_class"] == "transient"
    assert "retry" in quota["fix"]


async def test_when_the_tpu_list_is_refused_usage_falls_back_to_the_controllers_records(live: QuotaWorld) -> None:
    live.gateway.seed("gemma-a")  # one spot v6e-4 the controller runs in europe-west4-a
    live.sim.world.inject_fault({"endpoint": "list_queued_resources", "status": 403, "message": "Permission denied"})
    body = (await list_zones(live, tiers=["spot"])).structured_content
    quota = body["live_quota"]
    assert quota["read"] is True and quota["usage_source"] == "controller_records"
    assert "only tpuctl's own slices" in quota["problem"] and "roles/tpu.viewer" in quota["fix"]
    spot = by_tier({z["zone"]: z for z in body["zones"]}["europe-west4-a"])["spot"]
    assert spot["limits"][0]["limit"] == 16 and spot["limits"][0]["in_use"] == 4
    assert spot["headroom_chips"] == 12


def test_the_core_without_live_quota_makes_no_call(live: QuotaWorld) -> None:
    # live_quota is no longer an MCP argument (tpu_plan always reads it); the core and `tpuctl zones
    # --no-live-quota` can still skip it.
    live.sim.world.inject_fault({"endpoint": "cloudquotas.quotaInfos.list", "status": 403, "message": DENIED})
    view = live.gateway.core.list_zones(accelerator="v6e-4", live_quota=False)
    assert view.live_quota is None
    assert view.zones and all(zone.quota == [] for zone in view.zones)
    assert live.sim.world.faults()[0]["remaining"] == 1  # the armed fault was never consumed


async def test_live_quota_is_not_an_mcp_argument(live: QuotaWorld) -> None:
    async with Client(live.gateway.server()) as session:
        arguments = {"show": "zones", "accelerator": "v6e-4", "live_quota": False}
        result = await session.call_tool("tpu_plan", arguments)
    assert result.is_error
    said = " ".join(block.text for block in result.content if hasattr(block, "text"))
    assert "[invalid_argument] live_quota: is not a parameter of tpu_plan" in said


async def test_a_gateway_without_a_quota_port_says_so(world: GatewayWorld) -> None:
    async with Client(world.server()) as session:
        result = await session.call_tool("tpu_plan", {"show": "zones", "accelerator": "v6e-4"})
    quota = result.structured_content["live_quota"]
    assert quota["read"] is False and "no Cloud Quotas port" in quota["problem"]


def tpuctl(live: QuotaWorld, *argv: str) -> tuple[int, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    code = run(list(argv), ports=live.gateway.ports, stdout=stdout, stderr=stderr)
    return code, stdout.getvalue() + stderr.getvalue()


def test_the_cli_table_has_a_quota_column_and_json_carries_the_rows(live: QuotaWorld) -> None:
    code, output = tpuctl(live, "zones", "--tier", "spot")
    assert code == EXIT_OK, output
    assert "QUOTA" in output
    assert "spot 12 free (v6e-8)" in output
    code, output = tpuctl(live, "zones", "--tier", "spot", "--format", "json")
    zones = {z["zone"]: z for z in json.loads(output)["zones"]}
    assert zones["europe-west4-a"]["quota"][0]["headroom_chips"] == 12


def test_the_cli_prints_the_fix_when_quota_cannot_be_read_and_can_skip_it(live: QuotaWorld) -> None:
    live.sim.world.inject_fault({"endpoint": "cloudquotas.quotaInfos.list", "status": 403, "message": DENIED})
    code, output = tpuctl(live, "zones", "--tier", "spot")
    assert code == EXIT_OK, output
    assert "live quota not read" in output and "roles/cloudquotas.viewer" in output
    code, output = tpuctl(live, "zones", "--tier", "spot", "--no-live-quota", "--format", "json")
    assert json.loads(output)["live_quota"] is None


def test_the_local_default_ports_read_live_quota_from_the_simulator(
    tpu_sim_factory: TpuSimFactory, tmp_path: Path
) -> None:
    sim = tpu_sim_factory("quota-bound")
    settings = Settings(backend="local", project=sim.project, tpu_endpoint=sim.base_url, data_dir=tmp_path / "var")
    ports = build_ports(settings)
    try:
        view = GatewayCore(ports).list_zones(accelerator="v6e-4", tier="on_demand")
    finally:
        ports.close()
    assert view.live_quota is not None and view.live_quota.read and view.live_quota.usage_source == "tpu_api"
    europe = next(zone for zone in view.zones if zone.zone == "europe-west4-a")
    assert europe.quota[0].headroom_chips == 16 and europe.quota[0].slices_that_fit[-1] == "v6e-16"

"""tpu_plan's views (plan, startup_script/gke_manifest, zones): read-only, over the serving plan, the price table
and the zone memory."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mcp_client_gateway.core import GatewayError
from shared.domain.models import Tier, ZoneMemoryEntry
from tests.mcp.conftest import API_KEY, HF_TOKEN, GatewayWorld, call, text

pytestmark = pytest.mark.anyio


class TestPlan:
    async def test_the_reference_shape_fits_with_an_hbm_table_flags_and_prices(self, world: GatewayWorld) -> None:
        arguments: dict[str, Any] = {
            "model": "gemma-4-26b-a4b",
            "accelerator": "v6e-4",
            "kv_cache_dtype": "fp8",
            "zones": ["us-east5-b"],
            "ttl_hours": 10,
        }
        result = await call(world, "tpu_plan", arguments)  # show defaults to "plan"
        assert not result.is_error, text(result)
        plan = result.structured_content
        assert plan["fits"] is True and plan["reasons"] == []
        assert plan["capacity"]["tensor_parallel"] == 4 and plan["capacity"]["kv_tokens"] > 0
        assert "| KV tokens in total |" in plan["hbm_table"]
        assert "--kv-cache-dtype" in plan["argv"] and "fp8" in plan["argv"]
        assert plan["image"].startswith("vllm/vllm-tpu:v")
        flex = next(c for c in plan["costs"] if c["tier"] == "flex_start")
        assert flex["usd_per_hour"] == pytest.approx(1.35 * 4)
        # flex-start runs stop at the spec's 4-hour run cap, so a 10-hour TTL bills 4 hours
        assert flex["usd_for_ttl"] == pytest.approx(1.35 * 4 * 4) and flex["capped_by_run_duration"] is True
        on_demand = next(c for c in plan["costs"] if c["tier"] == "on_demand")
        assert on_demand["usd_for_ttl"] == pytest.approx(2.70 * 4 * 10) and on_demand["capped_by_run_duration"] is False
        assert "fits" in text(result)

    def test_a_measured_rate_prices_a_million_tokens_in_the_core(self, world: GatewayWorld) -> None:
        # tokens_per_second is no longer an argument of tpu_plan (tpuctl plan --tokens-per-second); the core keeps it.
        plan = world.core.plan(
            model="gemma-4-26b-a4b", accelerator="v6e-4", zones=["us-east5-b"], tokens_per_second=94.3
        )
        flex = next(c for c in plan.costs if c.tier == "flex_start")
        assert flex.usd_per_million_tokens == pytest.approx(5.4 / (94.3 * 3600) * 1e6, rel=1e-3)

    async def test_a_model_too_big_for_the_slice_says_so_and_names_the_smallest_that_fits(
        self, world: GatewayWorld
    ) -> None:
        result = await call(world, "tpu_plan", {"model": "gemma-4-31b", "accelerator": "v6e-1"})
        assert not result.is_error
        plan = result.structured_content
        assert plan["fits"] is False and plan["reasons"]
        assert plan["smallest_fitting_slice"] == "v6e-4"

    async def test_a_bad_zone_is_refused_naming_the_field(self, world: GatewayWorld) -> None:
        result = await call(world, "tpu_plan", {"model": "gemma-4-e4b", "zones": ["2x2"]})
        assert result.is_error and "[invalid_argument] zones" in text(result)

    def test_an_out_of_range_utilisation_is_refused_by_the_core_naming_the_field(self, world: GatewayWorld) -> None:
        # gpu_memory_utilization is no longer an argument of tpu_plan (tpuctl plan --gpu-memory-utilization).
        with pytest.raises(GatewayError) as refused:
            world.core.plan(model="gemma-4-e4b", accelerator="v6e-1", gpu_memory_utilization=1.5)
        assert refused.value.code == "invalid_argument" and refused.value.field == "gpu_memory_utilization"

    async def test_a_plan_without_a_model_is_refused_naming_it(self, world: GatewayWorld) -> None:
        result = await call(world, "tpu_plan", {"accelerator": "v6e-1"})
        assert result.is_error and "[invalid_argument] model" in text(result)


class TestRender:
    async def test_artefacts_of_a_stored_deployment_reference_secrets_by_name_only(self, world: GatewayWorld) -> None:
        world.secrets.put(world.settings.hf_token_secret, HF_TOKEN)
        world.secrets.put(world.settings.vllm_api_key_secret, API_KEY)
        world.seed("gemma-a")
        results = {
            show: await call(world, "tpu_plan", {"show": show, "deployment_id": "gemma-a"})
            for show in ("startup_script", "gke_manifest")
        }
        for result in results.values():
            assert not result.is_error, text(result)
        script = results["startup_script"].structured_content["startup_script"]
        manifest = results["gke_manifest"].structured_content["gke_manifest"]
        assert script.startswith("#!") and "kind: Deployment" in manifest
        for result in results.values():
            assert result.structured_content["secret_references"] == [
                "projects/tpuctl-local/secrets/tpuctl-hf-token/versions/latest",
                "projects/tpuctl-local/secrets/tpuctl-vllm-api-key/versions/latest",
            ]
            for secret in (HF_TOKEN, API_KEY):
                assert secret not in script and secret not in manifest and secret not in text(result)
        assert "nightly" not in script and ":latest" not in manifest

    async def test_one_kind_at_a_time(self, world: GatewayWorld) -> None:
        arguments = {"model": "gemma-4-e2b", "accelerator": "v6e-1"}
        result = await call(world, "tpu_plan", {"show": "gke_manifest", **arguments})
        body = result.structured_content
        assert body["startup_script"] is None and "google.com/tpu" in body["gke_manifest"]
        script = (await call(world, "tpu_plan", {"show": "startup_script", **arguments})).structured_content
        assert script["gke_manifest"] is None and script["startup_script"].startswith("#!")

    async def test_neither_a_deployment_nor_a_model_is_a_clear_error(self, world: GatewayWorld) -> None:
        result = await call(world, "tpu_plan", {"show": "startup_script"})
        assert result.is_error and "[invalid_argument] deployment_id" in text(result)


class TestZones:
    async def test_zones_show_prices_and_what_the_search_remembers(self, world: GatewayWorld) -> None:
        now = datetime.now(UTC)
        world.store.put_zone_memory(
            ZoneMemoryEntry(
                key="stockout/us-east5-b/v6e/spot",
                kind="cooldown",
                error_class="stockout",
                zone="us-east5-b",
                region="us-east5",
                tier=Tier.SPOT,
                reason="no more capacity in the zone",
                failures=2,
                until=now + timedelta(minutes=20),
                updated_at=now,
            )
        )
        world.store.put_zone_memory(
            ZoneMemoryEntry(
                key="stockout/europe-west4-a/v6e/spot",
                kind="cooldown",
                error_class="stockout",
                zone="europe-west4-a",
                tier=Tier.SPOT,
                until=now - timedelta(minutes=1),  # expired: forgotten
                updated_at=now,
            )
        )
        result = await call(world, "tpu_plan", {"show": "zones", "accelerator": "v6e-4"})
        assert not result.is_error, text(result)
        zones = {z["zone"]: z for z in result.structured_content["zones"]}
        east = zones["us-east5-b"]
        assert east["usd_per_hour"]["flex_start"] == pytest.approx(5.4)
        assert east["blocked_tiers"] == {"spot": "stockout/us-east5-b/v6e/spot"}
        assert east["available"] is True and east["memory"][0]["failures"] == 2
        assert zones["europe-west4-a"]["blocked_tiers"] == {}

    async def test_a_zone_is_unavailable_when_its_only_tier_is_blocked(self, world: GatewayWorld) -> None:
        now = datetime.now(UTC)
        world.store.put_zone_memory(
            ZoneMemoryEntry(
                key="permission/zone/us-east1-d",
                kind="block",
                error_class="permission",
                zone="us-east1-d",
                reason="LOCATION_POLICY_VIOLATED",
                updated_at=now,
            )
        )
        result = await call(world, "tpu_plan", {"show": "zones", "accelerator": "v6e-4", "tiers": ["spot"]})
        zones = {z["zone"]: z for z in result.structured_content["zones"]}
        assert zones["us-east1-d"]["available"] is False
        assert set(zones["us-east1-d"]["usd_per_hour"]) == {"spot"}

    async def test_an_unknown_accelerator_is_refused(self, world: GatewayWorld) -> None:
        result = await call(world, "tpu_plan", {"show": "zones", "accelerator": "v7-4"})
        assert result.is_error and "accelerator" in text(result)

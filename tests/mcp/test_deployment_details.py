"""Details the gateway showed wrong or not at all (issue #18 item 13): a resource's reservation, valid-until and
flex-start run cap; prices from the controller's source (the Billing Catalog) with the dated table labelled; why
a completion came back empty; and what a TTL is in wall time when the controller's clock runs fast."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from mcp import Client

from mcp_client_gateway.cli import EXIT_OK, run
from mcp_client_gateway.core import GatewayCore
from shared.adapters.billing_catalog import BillingCatalog
from shared.adapters.sim_clock import SimulatorClock
from shared.domain.models import NodeState, QueuedResourceState, ResourceRef, Tier
from shared.domain.prices import PRICE_TABLE_DATE, price_per_chip_hour
from shared.domain.serving_key import deployment_api_key
from tests.mcp.conftest import API_KEY, GatewayWorld
from tests.support.fixtures_tpu_sim import TpuSimFactory
from tests.support.openai_stub import StubConfig, serve_openai_stub

pytestmark = pytest.mark.anyio

CATALOG_SPOT = 1.11  # USD per chip-hour the dated table does not have: proves the price came from the catalog
PRICED: dict[str, Any] = {
    "name": "priced",
    "zones": {"us-east5-b": {}, "europe-west4-a": {}},
    "prices": {"us-east5": {"spot": CATALOG_SPOT}, "europe-west4": {"spot": 2 * CATALOG_SPOT}},
    "billing_catalog": {"page_size": 50},
}


async def call(world: GatewayWorld, tool: str, arguments: dict[str, Any]) -> Any:
    async with Client(world.server()) as session:
        result = await session.call_tool(tool, arguments)
    assert not result.is_error, result.content
    return result


def summary_of(result: Any) -> str:
    return " ".join(block.text for block in result.content if hasattr(block, "text"))


def with_ports(world: GatewayWorld, **ports: Any) -> GatewayWorld:
    import dataclasses

    replaced = dataclasses.replace(world.ports, **ports)
    return dataclasses.replace(world, ports=replaced, core=GatewayCore(replaced))


class TestResourceTerms:
    def seed_terms(self, world: GatewayWorld) -> datetime:
        record = world.seed("gemma-a")
        created = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
        refs = [
            ResourceRef(
                name="gemma-a-g1-a2",
                zone="us-east5-b",
                tier=Tier.FLEX_START,
                generation=1,
                attempt=2,
                state=QueuedResourceState.ACTIVE,
                node_state=NodeState.READY,
                created_at=created,
                active_at=created + timedelta(minutes=10),
            ),
            ResourceRef(
                name="gemma-a-g1-a3",
                zone="us-east5-a",
                tier=Tier.RESERVATION,
                generation=1,
                attempt=3,
                state=QueuedResourceState.ACTIVE,
                created_at=created,
                active_at=created + timedelta(minutes=1),
            ),
            ResourceRef(
                name="gemma-a-g1-a4",
                zone="europe-west4-a",
                tier=Tier.SPOT,
                generation=1,
                attempt=4,
                state=QueuedResourceState.WAITING,
                created_at=created,
            ),
        ]
        spec = record.spec.model_copy(
            update={"reservation_name": "team-res", "valid_until_minutes": 90, "max_run_hours": 6.0}
        )
        status = record.status.model_copy(update={"resources": refs})
        world.store.put_deployment(
            record.model_copy(update={"spec": spec, "status": status}), expected_version=record.version
        )
        return created

    async def test_status_of_a_deployment_shows_reservation_valid_until_and_run_cap(self, world: GatewayWorld) -> None:
        created = self.seed_terms(world)
        body = (await call(world, "tpu_status", {"deployment_id": "gemma-a"})).structured_content
        flex, reserved, waiting = body["resources"]
        assert flex["run_ends_at"] == (created + timedelta(minutes=10, hours=6)).isoformat().replace("+00:00", "Z")
        assert flex["valid_until"] is None and flex["reservation"] is None
        assert reserved["reservation"] == "team-res" and reserved["run_ends_at"] is None
        assert waiting["valid_until"] == (created + timedelta(minutes=90)).isoformat().replace("+00:00", "Z")
        assert waiting["run_ends_at"] is None and waiting["reservation"] is None

    def test_tpuctl_status_prints_the_terms(self, world: GatewayWorld) -> None:
        self.seed_terms(world)
        stdout = io.StringIO()
        assert run(["status", "gemma-a"], ports=world.ports, stdout=stdout, stderr=io.StringIO()) == EXIT_OK
        text = stdout.getvalue()  # the TERMS cell wraps in a narrow console: one line per half
        assert "run cap ends" in text and "12-01 16:10" in text
        assert "reservation" in text and "team-res" in text
        assert "valid until" in text and "12-01 11:30" in text


class TestPriceSource:
    async def test_plan_and_zones_price_from_the_billing_catalog_like_the_controller(
        self, world: GatewayWorld, tpu_sim_factory: TpuSimFactory
    ) -> None:
        sim = tpu_sim_factory(PRICED)
        catalog = BillingCatalog(endpoint=sim.base_url, clock=sim.world.clock)
        live = with_ports(world, prices=catalog.prices())
        catalog.close()
        plan = live.core.plan(model="gemma-4-26b-a4b", accelerator="v6e-4", zones=["us-east5-b"], tiers=["spot"])
        (cost,) = plan.costs
        assert cost.usd_per_hour == pytest.approx(CATALOG_SPOT * 4)
        assert cost.usd_per_hour != pytest.approx((price_per_chip_hour("us-east5", Tier.SPOT) or 0) * 4)
        assert plan.price_source.startswith("Cloud Billing Catalog (read ")
        assert cost.price_source.startswith("catalog ")
        zones = await call(live, "tpu_plan", {"show": "zones", "accelerator": "v6e-4", "tiers": ["spot"]})
        east = {z["zone"]: z for z in zones.structured_content["zones"]}["us-east5-b"]
        assert east["usd_per_hour"]["spot"] == pytest.approx(CATALOG_SPOT * 4)
        assert zones.structured_content["price_source"] == plan.price_source
        live.seed("gemma-a")  # a spot v6e-4 running in europe-west4-a
        detail = live.core.get_deployment("gemma-a")
        assert detail.hourly_usd == pytest.approx(2 * CATALOG_SPOT * 4) and detail.price_source == plan.price_source

    async def test_an_unreadable_catalog_falls_back_to_the_dated_table_labelled(self, world: GatewayWorld) -> None:
        catalog = BillingCatalog(endpoint="http://127.0.0.1:9", timeout_s=2)
        live = with_ports(world, prices=catalog.prices())
        catalog.close()
        result = await call(live, "tpu_plan", {"model": "gemma-4-26b-a4b", "zones": ["us-east5-b"], "tiers": ["spot"]})
        body = result.structured_content
        label = f"dated price table ({PRICE_TABLE_DATE.isoformat()})"
        assert body["price_source"].startswith(label + ": Cloud Billing Catalog unreachable")
        assert body["costs"][0]["usd_per_hour"] == pytest.approx((price_per_chip_hour("us-east5", Tier.SPOT) or 0) * 4)
        assert label in summary_of(result)

    def test_without_a_price_port_the_label_says_dated_table(self, world: GatewayWorld) -> None:
        view = world.core.list_zones(accelerator="v6e-4", live_quota=False)
        assert view.price_source == f"dated price table ({PRICE_TABLE_DATE.isoformat()}): this gateway has no " + (
            "Billing Catalog port"
        )


class TestEmptyAnswer:
    async def test_an_empty_completion_says_why_and_what_to_try(self, world: GatewayWorld) -> None:
        world.secrets.put(world.settings.vllm_api_key_secret, API_KEY)
        config = StubConfig(api_key=deployment_api_key(API_KEY, "gemma-a"), reply_text=[])
        with serve_openai_stub(config) as stub:
            world.seed("gemma-a", endpoint=stub.base_url)
            result = await call(
                world,
                "tpu_query",
                {"deployment_id": "gemma-a", "prompt": "Hi", "max_tokens": 16, "temperature": 0.8},
            )
        body = result.structured_content
        assert body["text"] == ""
        note = body["note"]
        assert body["finish_reason"] is None  # the stub's stream ends without one
        assert note.startswith(f"the model returned no text (no finish_reason, {body['completion_tokens']} completion")
        assert "try temperature 0, more max_tokens (this call allowed 16) or another prompt" in note
        assert note in summary_of(result)

    async def test_an_answer_with_text_has_no_note(self, world: GatewayWorld) -> None:
        world.secrets.put(world.settings.vllm_api_key_secret, API_KEY)
        with serve_openai_stub(StubConfig(api_key=deployment_api_key(API_KEY, "gemma-a"))) as stub:
            world.seed("gemma-a", endpoint=stub.base_url)
            result = await call(world, "tpu_query", {"deployment_id": "gemma-a", "prompt": "Hi"})
        assert result.structured_content["text"] and result.structured_content["note"] is None


class TestFastClock:
    def test_plan_and_create_warn_what_a_ttl_is_in_wall_time(
        self, world: GatewayWorld, tpu_sim_factory: TpuSimFactory
    ) -> None:
        sim = tpu_sim_factory("scarce-v6e", time_scale=60.0)
        fast = with_ports(world, clock=SimulatorClock(sim.base_url))
        plan = fast.core.plan(model="gemma-4-26b-a4b", accelerator="v6e-4", zones=["us-east5-b"], ttl_hours=2)
        assert plan.clock_warning == "the controller's clock runs x60 wall time: a 2 h TTL ends in 2 wall minutes"
        accepted = fast.core.create_deployment(
            deployment_id="gemma-a", model="gemma-4-26b-a4b", accelerator="v6e-4", zones=["us-east5-b"], ttl_hours=2
        )
        assert accepted.warnings == [plan.clock_warning]
        stderr = io.StringIO()
        argv = ["plan", "--model", "gemma-4-26b-a4b", "--zone", "us-east5-b", "--ttl-hours", "2"]
        assert run(argv, ports=fast.ports, stdout=io.StringIO(), stderr=stderr) == EXIT_OK
        assert "a 2 h TTL ends in 2 wall minutes" in " ".join(stderr.getvalue().split())

    def test_at_wall_speed_there_is_no_warning(self, world: GatewayWorld) -> None:
        plan = world.core.plan(model="gemma-4-26b-a4b", accelerator="v6e-4", zones=["us-east5-b"], ttl_hours=2)
        assert plan.clock_warning is None


class TestEngineFacts:
    """What vLLM printed at start-up, as the monitor kept it: shown as stored, checked again, one line in status."""

    def seed_engine(self, world: GatewayWorld, engine: dict[str, Any]) -> None:
        record = world.seed("gemma-a")
        status = record.status.model_copy(update={"engine": engine})
        world.store.put_deployment(record.model_copy(update={"status": status}), expected_version=record.version)

    async def test_status_of_a_deployment_shows_the_facts_and_a_line(self, world: GatewayWorld) -> None:
        engine = {"version": "v0.32.0", "max_model_len": 512, "tensor_parallel": 1, "attention_backends": ["PALLAS"]}
        self.seed_engine(world, engine)
        body = (await call(world, "tpu_status", {"deployment_id": "gemma-a"})).structured_content
        assert body["engine"] == engine
        assert body["engine_summary"] == "vLLM v0.32.0, context 512, TP 1, attention PALLAS"

    async def test_a_forged_stored_field_is_not_shown(self, world: GatewayWorld) -> None:
        self.seed_engine(world, {"max_model_len": 512, "quantization": "\x1b]52;c;aGk=\x07"})
        body = (await call(world, "tpu_status", {"deployment_id": "gemma-a"})).structured_content
        assert body["engine"] == {"max_model_len": 512}

    def test_tpuctl_status_prints_the_engine_row(self, world: GatewayWorld) -> None:
        self.seed_engine(world, {"version": "v0.32.0", "kv_cache_tokens": 1_048_576, "kv_cache_dtype": "auto"})
        stdout = io.StringIO()
        assert run(["status", "gemma-a"], ports=world.ports, stdout=stdout, stderr=io.StringIO()) == EXIT_OK
        assert "KV 1,048,576 tokens (auto)" in " ".join(stdout.getvalue().split())

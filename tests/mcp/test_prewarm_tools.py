"""Prewarm (issue 20, item 3) through the MCP tools and the CLI: ``tpu_deploy`` with ``action='prewarm'`` publishes
a builder spec with a TTL backstop, a prewarm cannot widen to other slices, and the plan prices one prewarm."""

from __future__ import annotations

import dataclasses
import io

import pytest

from mcp_client_gateway.cli import run
from mcp_client_gateway.core import GatewayCore
from shared.domain.prewarm import PREWARM_TTL_HOURS
from shared.messages import CreateDeployment
from tests.mcp.conftest import GatewayWorld, call, text

pytestmark = pytest.mark.anyio


BASE = {"model": "gemma-4-26b-a4b", "accelerator": "v6e-4", "zones": ["us-east5-b"]}


@pytest.fixture
def world(world: GatewayWorld) -> GatewayWorld:
    """The gateway of an installation with a cache bucket in us-east5 (a prewarm fills it)."""
    settings = world.settings.model_copy(update={"weights_cache_buckets": {"us-east5": "tpuctl-weights-us-east5"}})
    ports = dataclasses.replace(world.ports, settings=settings)
    return dataclasses.replace(world, settings=settings, ports=ports, core=GatewayCore(ports))


async def test_a_prewarm_where_no_cache_bucket_is_is_refused_naming_the_zone(world: GatewayWorld) -> None:
    arguments = {"deployment_id": "warm", "action": "prewarm", **BASE, "zones": ["us-east5-b", "europe-west4-a"]}
    result = await call(world, "tpu_deploy", arguments)
    assert result.is_error and "zones[1]" in text(result) and "us-east5" in text(result)
    assert world.published() == []


async def test_a_prewarm_publishes_a_builder_spec_with_a_ttl_backstop_and_a_create_does_not(
    world: GatewayWorld,
) -> None:
    result = await call(world, "tpu_deploy", {"deployment_id": "warm", "action": "prewarm", **BASE})
    assert not result.is_error, text(result)
    (message,) = world.published()
    assert isinstance(message, CreateDeployment)
    assert message.spec.prewarm and message.spec.ttl_hours == PREWARM_TTL_HOURS
    result = await call(world, "tpu_deploy", {"deployment_id": "served", **BASE, "ttl_hours": 3})
    assert not result.is_error and not world.published()[-1].spec.prewarm


async def test_a_prewarm_with_alternative_slices_is_refused_before_anything_is_published(world: GatewayWorld) -> None:
    arguments = {"deployment_id": "warm", "action": "prewarm", **BASE, "alternative_accelerators": ["v6e-8"]}
    result = await call(world, "tpu_deploy", arguments)
    assert result.is_error and "prewarm" in text(result) and "alternative" in text(result)
    assert world.published() == []


async def test_the_plan_prices_one_prewarm(world: GatewayWorld) -> None:
    result = await call(world, "tpu_plan", BASE)
    assert not result.is_error, text(result)
    prewarm = result.structured_content["prewarm"]
    cheapest = min(cost["usd_per_hour"] for cost in result.structured_content["costs"])
    assert 9 < prewarm["minutes"] < 12 and prewarm["usd"] == pytest.approx(cheapest * prewarm["minutes"] / 60, abs=0.01)


def test_tpuctl_prewarm_publishes_a_prewarm_and_deploy_does_not(world: GatewayWorld) -> None:
    stdout, stderr = io.StringIO(), io.StringIO()
    argv = ["--model", "gemma-4-26b-a4b", "--accelerator", "v6e-4", "--zone", "us-east5-b"]
    assert run(["prewarm", "cli-warm", *argv], ports=world.ports, stdout=stdout, stderr=stderr) == 0, stderr.getvalue()
    assert run(["deploy", "cli-served", *argv], ports=world.ports, stdout=stdout, stderr=stderr) == 0, stderr.getvalue()
    warm, served = world.published()
    assert (warm.spec.prewarm, warm.spec.ttl_hours) == (True, PREWARM_TTL_HOURS)
    assert (served.spec.prewarm, served.spec.ttl_hours) == (False, None)

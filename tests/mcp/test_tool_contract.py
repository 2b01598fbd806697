"""Every tool: a tpu_ name, described typed inputs, an output schema, and all four annotations set on purpose."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from mcp import Client

from mcp_client_gateway.capabilities.deployments import CLEARABLE, UPDATABLE
from shared.domain.models import ACCELERATOR_TYPES, MODEL_PRESET_NAMES, Phase, Tier
from tests.mcp.conftest import GatewayWorld

pytestmark = pytest.mark.anyio

# name: (read_only, destructive, idempotent, open_world)
EXPECTED: dict[str, tuple[bool, bool, bool, bool]] = {
    "tpu_create_deployment": (False, False, True, True),
    "tpu_list_deployments": (True, False, True, False),
    "tpu_get_deployment": (True, False, True, False),
    "tpu_get_operation": (True, False, True, False),
    "tpu_delete_deployment": (False, True, True, True),
    "tpu_stop_deployment": (False, True, True, True),
    "tpu_start_deployment": (False, False, True, True),
    "tpu_restart_serving": (False, True, True, True),
    "tpu_update_deployment": (False, True, True, True),
    "tpu_plan_deployment": (True, False, True, False),
    "tpu_render_artifacts": (True, False, True, False),
    "tpu_list_zones": (True, False, True, False),
    "tpu_query_model": (True, False, False, True),
    "tpu_check_health": (True, False, True, True),
    "tpu_get_metrics": (True, False, True, False),
    "tpu_get_logs": (True, False, True, True),
    "tpu_tail_serving_logs": (False, False, False, True),
    "tpu_analyze_logs": (True, False, False, True),
    "tpu_debug_bundle": (False, False, False, True),
    "tpu_run_benchmark": (False, False, True, True),
    "tpu_get_benchmark": (True, False, True, False),
    "tpu_compare_benchmarks": (True, False, True, False),
    "tpu_save_hf_token": (False, True, True, True),
}


async def _tools(world: GatewayWorld, *, read_only: bool = False) -> dict[str, Any]:
    async with Client(world.server(read_only=read_only)) as client:
        listed = await client.list_tools()
    return {tool.name: tool for tool in listed.tools}


_LISTED: dict[str, Any] = {}


def _listed(world: GatewayWorld) -> dict[str, Any]:
    """The full listing, fetched once per module (listing is read-only and identical every time)."""
    if not _LISTED:
        _LISTED.update(anyio.run(_tools, world))
    return _LISTED


async def test_the_server_lists_exactly_the_documented_tools(world: GatewayWorld) -> None:
    tools = await _tools(world)
    assert sorted(tools) == sorted(EXPECTED)
    assert 15 <= len(tools) <= 23


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_tool_sets_every_annotation_and_a_title(world: GatewayWorld, name: str) -> None:
    tool = _listed(world)[name]
    hints = tool.annotations
    assert hints is not None and hints.title
    observed = (hints.read_only_hint, hints.destructive_hint, hints.idempotent_hint, hints.open_world_hint)
    assert observed == EXPECTED[name]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_tool_describes_every_parameter_and_publishes_an_output_schema(world: GatewayWorld, name: str) -> None:
    tool = _listed(world)[name]
    properties = tool.input_schema.get("properties", {})
    for parameter, schema in properties.items():
        assert schema.get("description"), f"{name}.{parameter} has no description"
    assert "answer" not in properties and "ctx" not in properties  # injected, never model-supplied
    assert tool.output_schema is not None and tool.output_schema.get("properties")
    assert tool.description and len(tool.description) > 80
    assert "always" not in tool.description.lower() and "never call" not in tool.description.lower()


async def test_closed_choices_are_enums_in_the_schema(world: GatewayWorld) -> None:
    schema = (await _tools(world))["tpu_create_deployment"].input_schema["properties"]
    assert "gemma-4-26b-a4b" in schema["model"]["enum"]
    assert set(schema["accelerator"]["enum"]) >= {"v6e-1", "v6e-4", "v6e-8"}
    tiers = schema["tiers"]["items"]["enum"]  # an optional list: published without its null branch
    assert set(tiers) == {tier.value for tier in Tier}
    assert set(schema["model"]["enum"]) == set(MODEL_PRESET_NAMES)
    assert set(schema["accelerator"]["enum"]) == set(ACCELERATOR_TYPES)
    for name in ("tpu_plan_deployment", "tpu_create_deployment"):  # the weight dtype: the domain's closed set
        dtype = (await _tools(world))[name].input_schema["properties"]["dtype"]
        assert dtype["enum"] == ["bfloat16", "fp8"] and dtype["description"]
    phases = (await _tools(world))["tpu_list_deployments"].input_schema["properties"]["phase"]["enum"]
    assert set(phases) == {phase.value for phase in Phase}


async def test_the_update_tool_takes_exactly_the_fields_the_core_updates(world: GatewayWorld) -> None:
    schema = (await _tools(world))["tpu_update_deployment"].input_schema
    properties = schema["properties"]
    assert schema["required"] == ["deployment_id"]
    assert set(properties) - {"deployment_id", "clear", "confirm", "command_id"} == set(UPDATABLE)
    assert properties["clear"]["items"]["enum"] == list(CLEARABLE)


async def test_read_only_mode_serves_only_tools_that_change_nothing(world: GatewayWorld) -> None:
    tools = await _tools(world, read_only=True)
    assert tools
    assert all(EXPECTED[name][0] for name in tools)
    assert "tpu_delete_deployment" not in tools and "tpu_save_hf_token" not in tools

"""Every tool: a tpu_ name, described typed inputs, an output schema, and all four annotations set on purpose."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from mcp import Client

from mcp_client_gateway.capabilities.deployments import CLEARABLE, UPDATABLE
from shared.domain.models import ACCELERATOR_TYPES, MODEL_PRESET_NAMES, Tier
from tests.mcp.conftest import GatewayWorld

pytestmark = pytest.mark.anyio

# name: (read_only, destructive, idempotent, open_world)
EXPECTED: dict[str, tuple[bool, bool, bool, bool]] = {
    "tpu_status": (True, False, True, False),
    "tpu_plan": (True, False, True, False),
    "tpu_observe": (True, False, True, True),
    "tpu_query": (True, False, False, True),
    "tpu_deploy": (False, True, True, True),
    "tpu_control": (False, True, False, True),
    "tpu_benchmark": (False, False, True, True),
    "tpu_save_hf_token": (False, True, True, True),
}


# Parameters whose names say it all: left undescribed to keep the tool list small (issue #23).
SELF_DESCRIBING = frozenset({"input_len", "output_len", "slo_ttft_ms", "slo_tpot_ms", "temperature", "system_prompt"})


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
    assert len(tools) <= 10


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
        assert schema.get("description") or parameter in SELF_DESCRIBING, f"{name}.{parameter} has no description"
    assert "answer" not in properties and "ctx" not in properties  # injected, never model-supplied
    output = tool.output_schema
    assert output is not None and output.get("type") == "object"
    assert output.get("properties") or len(output.get("anyOf", ())) >= 2  # one view, or one of several
    assert tool.description and len(tool.description) > 60
    assert "always" not in tool.description.lower() and "never call" not in tool.description.lower()


async def test_closed_choices_are_enums_in_the_schema(world: GatewayWorld) -> None:
    schema = (await _tools(world))["tpu_deploy"].input_schema["properties"]
    assert "gemma-4-26b-a4b" in schema["model"]["enum"]
    assert set(schema["accelerator"]["enum"]) >= {"v6e-1", "v6e-4", "v6e-8"}
    tiers = schema["tiers"]["items"]["enum"]  # an optional list: published without its null branch
    assert set(tiers) == {tier.value for tier in Tier}
    assert set(schema["model"]["enum"]) == set(MODEL_PRESET_NAMES)
    assert set(schema["accelerator"]["enum"]) == set(ACCELERATOR_TYPES)
    assert schema["action"]["enum"] == ["create", "update", "prewarm"]
    for name in ("tpu_plan", "tpu_deploy"):  # the weight dtype: the domain's closed set
        dtype = (await _tools(world))[name].input_schema["properties"]["dtype"]
        assert dtype["enum"] == ["bfloat16", "fp8"] and dtype["description"]


async def test_the_deploy_tool_takes_every_field_the_core_updates(world: GatewayWorld) -> None:
    schema = (await _tools(world))["tpu_deploy"].input_schema
    properties = schema["properties"]
    assert schema["required"] == ["deployment_id"]
    assert set(UPDATABLE) - {"hedge"} <= set(properties)  # hedge: `tpuctl update --hedge` (kept off the tool list)
    assert properties["clear"]["items"]["enum"] == list(CLEARABLE)


async def test_read_only_mode_serves_only_tools_that_change_nothing(world: GatewayWorld) -> None:
    tools = await _tools(world, read_only=True)
    assert tools
    assert all(EXPECTED[name][0] for name in tools)
    assert "tpu_control" not in tools and "tpu_save_hf_token" not in tools

"""Toolsets: ``--toolset read-only|operate|all`` (``TPUCTL_TOOLSET``), ``--read-only`` as its alias, hints that
policy engines can act on, and instructions that name only the tools and actions served (operate serves
``tpu_control`` without its irrecoverable ``delete``)."""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Any, get_args

import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import ToolAnnotations

from mcp_client_gateway import __main__ as gateway_main
from mcp_client_gateway.cli import build_parser, run
from mcp_client_gateway.server import build_server
from mcp_client_gateway.tools.common import IRRECOVERABLE_ACTIONS, TOOLSETS, ToolSet, Toolset, resolve_toolset
from shared.config import Settings
from tests.mcp.conftest import GatewayWorld
from tests.mcp.test_tool_contract import EXPECTED

pytestmark = pytest.mark.anyio

REPO_ROOT = Path(__file__).resolve().parents[2]

READ_ONLY = {name for name, (read_only, *_) in EXPECTED.items() if read_only}
EXPECTED_SETS = {"read-only": READ_ONLY, "operate": set(EXPECTED), "all": set(EXPECTED)}  # operate: every tool
# The actions of tpu_control each toolset offers: operate leaves out the irrecoverable delete.
CONTROL_ACTIONS = {"start", "stop", "restart", "delete", "log_tail", "capture_bundle"}
EXPECTED_CONTROL = {"read-only": set(), "operate": CONTROL_ACTIONS - {"delete"}, "all": CONTROL_ACTIONS}
_CONFIRMED = re.compile(r"Destructive tools \((.*)\) are refused until confirmed")


async def _listing(server: Any) -> tuple[dict[str, Any], str]:
    async with Client(server) as client:
        listed = await client.list_tools()
        instructions = client.instructions or ""
    return {tool.name: tool for tool in listed.tools}, instructions


def _confirmed_in(instructions: str) -> set[str]:
    """The tool names the instructions' "Destructive tools (...)" sentence enumerates (empty when none)."""
    found = _CONFIRMED.search(" ".join(instructions.split()))
    return set(re.findall(r"tpu_\w+", found.group(1))) if found else set()


def _actions_named(instructions: str, tool: str) -> set[str]:
    """The actions the instructions name for ``tool``: every word of each "tool (a, b, c)" they write."""
    groups = re.findall(rf"{tool} \(([^)]*)\)", " ".join(instructions.split()))
    return {word for group in groups for word in re.findall(r"\w+", group)}


def _control_actions(tools: dict[str, Any]) -> set[str]:
    """The actions ``tpu_control``'s listed schema offers (none when it is not listed)."""
    control = tools.get("tpu_control")
    return set(control.input_schema["properties"]["action"]["enum"]) if control else set()


@pytest.mark.parametrize("toolset", ["read-only", "operate", "all"])
async def test_each_toolset_lists_exactly_its_tools_and_instructions_name_only_those(
    world: GatewayWorld, toolset: Toolset
) -> None:
    tools, instructions = await _listing(build_server(world.core, toolset=toolset))
    assert set(tools) == EXPECTED_SETS[toolset]
    assert _control_actions(tools) == EXPECTED_CONTROL[toolset]
    assert set(re.findall(r"tpu_\w+", instructions)) <= set(tools), "the instructions name a tool not served"
    named = _actions_named(instructions, "tpu_control")
    assert named <= _control_actions(tools), f"the instructions name tpu_control actions not served: {named}"
    destructive = {name for name, tool in tools.items() if tool.annotations.destructive_hint}
    assert _confirmed_in(instructions) == destructive
    if toolset != "read-only":
        assert {"tpu_deploy", "tpu_control"} <= _confirmed_in(instructions)
        assert "Commands only publish" in instructions
        assert "a create with book_calendar, whose window is paid whole" in instructions
    else:
        assert "read-only toolset" in instructions and "Commands only publish" not in instructions
        assert "book_calendar" not in instructions


async def test_every_tool_is_marked_and_the_read_only_set_is_the_read_only_hints(world: GatewayWorld) -> None:
    everything, _ = await _listing(build_server(world.core, toolset="all"))
    read_only, _ = await _listing(build_server(world.core, toolset="read-only"))
    for name, tool in everything.items():
        hints = tool.annotations
        assert isinstance(hints.read_only_hint, bool), f"{name} has no readOnlyHint"
        if not hints.read_only_hint:
            assert isinstance(hints.destructive_hint, bool), f"{name} writes but has no destructiveHint"
    assert set(read_only) == {name for name, tool in everything.items() if tool.annotations.read_only_hint is True}


async def test_operate_leaves_out_only_the_irrecoverable_actions(world: GatewayWorld) -> None:
    everything, _ = await _listing(build_server(world.core, toolset="all"))
    operate, instructions = await _listing(build_server(world.core, toolset="operate"))
    assert set(operate) == set(everything)  # every tool is served; only an action is left out
    left_out = _control_actions(everything) - _control_actions(operate)
    assert left_out == set(IRRECOVERABLE_ACTIONS["tpu_control"]) == {"delete"}
    assert set(IRRECOVERABLE_ACTIONS) == {"tpu_control"}
    assert all(everything[name].annotations.destructive_hint for name in IRRECOVERABLE_ACTIONS)
    assert {"stop", "restart", "start"} <= _control_actions(operate)  # reversible
    assert "tpuctl delete" in instructions


async def test_operate_refuses_a_delete_before_anything_is_published(world: GatewayWorld) -> None:
    world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
    async with Client(build_server(world.core, toolset="operate")) as client:
        refused = await client.call_tool("tpu_control", {"action": "delete", "deployment_id": "gemma-a"})
        stop = await client.call_tool("tpu_control", {"action": "stop", "deployment_id": "gemma-a"})
    message = " ".join(block.text for block in refused.content if hasattr(block, "text"))
    assert refused.is_error and message.startswith("[invalid_argument] action: is not one of the allowed values")
    assert stop.is_error and "[confirmation_required]" in stop.content[0].text  # stop is still offered, confirmed
    assert world.published() == []


async def test_read_only_is_an_alias_and_disagreeing_with_toolset_is_refused(world: GatewayWorld) -> None:
    aliased, aliased_text = await _listing(build_server(world.core, read_only=True))
    named, named_text = await _listing(build_server(world.core, read_only=True, toolset="read-only"))
    assert set(aliased) == set(named) == READ_ONLY and aliased_text == named_text
    with pytest.raises(ValueError, match=r"--read-only and --toolset operate disagree"):
        build_server(world.core, read_only=True, toolset="operate")
    with pytest.raises(ValueError, match=r"--toolset: 'everything' is not a toolset; choose one of read-only"):
        resolve_toolset("everything", read_only=False)
    assert resolve_toolset(None, read_only=False) == "all"


def test_a_tool_without_explicit_hints_is_refused_at_registration(world: GatewayWorld) -> None:
    tools = ToolSet(world.core, toolset="all")

    async def tpu_example() -> str:
        """An example."""
        return "x"

    with pytest.raises(ValueError, match=r"tool tpu_example: a writing tool needs an explicit destructiveHint"):
        tools.tool(annotations=ToolAnnotations(title="Example", read_only_hint=False))(tpu_example)
    with pytest.raises(ValueError, match=r"tool tpu_example: readOnlyHint is not set"):
        tools.tool(annotations=ToolAnnotations(title="Example"))(tpu_example)
    assert tools.tools == []


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--read-only", "--toolset", "operate"], "--toolset operate"),
        (["--toolset", "all", "--read-only"], "--toolset all"),
    ],
)
def test_both_entry_points_refuse_read_only_with_another_toolset(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert gateway_main.main(argv) == 2
    assert f"--read-only and {flag} disagree" in capsys.readouterr().err
    assert run(["mcp", *argv]) == 2  # tpuctl mcp forwards both flags to the same check
    assert f"--read-only and {flag} disagree" in capsys.readouterr().err


def test_the_flags_the_setting_and_the_toolset_names_agree(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    commands = next(action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction))
    cli_choices, main_choices = (
        next(tuple(action.choices or ()) for action in parser._actions if "--toolset" in action.option_strings)
        for parser in (commands.choices["mcp"], gateway_main._parser())
    )
    assert cli_choices == main_choices == TOOLSETS == get_args(Settings.model_fields["toolset"].annotation)
    assert Settings().toolset == "all"
    monkeypatch.setenv("TPUCTL_TOOLSET", "delete-only")
    assert gateway_main.main([]) == 2
    assert "TPUCTL_TOOLSET: 'delete-only' is not a toolset; use read-only, operate" in capsys.readouterr().err


async def _over_stdio(tmp_path: Path, args: list[str], env_extra: dict[str, str]) -> tuple[dict[str, Any], str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("TPUCTL_")}
    env.update({"TPUCTL_BACKEND": "local", "PYTHONPATH": str(REPO_ROOT), **env_extra})
    tmp_path.mkdir(parents=True, exist_ok=True)
    params = StdioServerParameters(
        command=sys.executable, args=[*args, "--data-dir", str(tmp_path / "var")], env=env, cwd=str(REPO_ROOT)
    )
    with (tmp_path / "gateway.stderr").open("w", encoding="utf-8") as errlog:
        async with Client(stdio_client(params, errlog=errlog)) as client:
            listed = await client.list_tools()
            instructions = client.instructions or ""
    return {tool.name: tool for tool in listed.tools}, instructions


async def test_tpuctl_mcp_serves_the_operate_toolset_over_stdio(tmp_path: Path) -> None:
    tools, instructions = await _over_stdio(
        tmp_path, ["-m", "mcp_client_gateway.cli", "mcp", "--toolset", "operate"], {}
    )
    assert set(tools) == EXPECTED_SETS["operate"]
    assert _control_actions(tools) == EXPECTED_CONTROL["operate"]
    assert "delete" not in _actions_named(instructions, "tpu_control")


async def test_the_setting_chooses_the_toolset_and_read_only_overrides_it_over_stdio(tmp_path: Path) -> None:
    tools, _ = await _over_stdio(tmp_path / "a", ["-m", "mcp_client_gateway"], {"TPUCTL_TOOLSET": "operate"})
    assert set(tools) == EXPECTED_SETS["operate"] and _control_actions(tools) == EXPECTED_CONTROL["operate"]
    tools, instructions = await _over_stdio(
        tmp_path / "b", ["-m", "mcp_client_gateway", "--read-only"], {"TPUCTL_TOOLSET": "operate"}
    )
    assert set(tools) == READ_ONLY and "read-only toolset" in instructions


def test_the_guide_lists_each_toolset_as_served() -> None:
    guide = (REPO_ROOT / "docs" / "gateway.md").read_text(encoding="utf-8")
    section = guide.split("### Toolsets", 1)[1].split("\n### ", 1)[0].split("\n\nEvery tool", 1)[0]
    bullets = {match[0]: match[1] for match in re.findall(r"- \*\*`([a-z-]+)`\*\*(.*?)(?=\n- \*\*|\Z)", section, re.S)}
    assert set(bullets) == set(TOOLSETS)
    assert set(re.findall(r"tpu_\w+", bullets["read-only"])) == READ_ONLY
    assert f"the {len(READ_ONLY)} tools" in bullets["read-only"] and f"all {len(EXPECTED)}" in bullets["all"]
    named = set(re.findall(r"tpu_\w+", bullets["operate"]))
    assert named == (set(EXPECTED) - READ_ONLY)  # every writing tool it keeps (it keeps them all)
    assert "every tool" in bullets["operate"] and "`delete`" in bullets["operate"]  # tpu_control's action left out

"""One error shape everywhere (code, field, problem, fix), worded for the interface that shows it.

Over MCP (the real stdio server) a refused argument comes back as the gateway's line plus the same four as JSON,
in plain words: no pydantic text, no link to pydantic's site, no regular expression. On the command line a fix
names ``tpuctl`` commands and ``--flags``, never a ``tpu_`` tool or ``confirm='...'``. The table that maps one
to the other (``interface_words``) is held against the real tool registry and the real argument parser.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from mcp_client_gateway import cli
from mcp_client_gateway.cli import EXIT_NOT_FOUND, EXIT_REFUSED, build_parser, run
from mcp_client_gateway.confirmation import Confirmations
from mcp_client_gateway.errors import Fix, GatewayError, ParamRef, ToolRef
from mcp_client_gateway.interface_words import (
    COMMANDS,
    CONFIRMED_BY,
    PATTERN_WORDS,
    call_key,
    cli_text,
    param_flag,
    tool_of,
)
from shared.adapters.clock import SystemClock
from tests.mcp.conftest import GatewayWorld
from tests.mcp.test_tool_contract import EXPECTED

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOL_NAME = re.compile(r"\btpu_(status|plan|observe|query|deploy|control|delete|benchmark|save_hf_token)\b")
REGEX_BITS = re.compile(r"\^|\$'|\[a-z|\{1,|\\d|pattern")
SHAPE_KEYS = {"code", "field", "problem", "fix"}


def _shape(result: Any) -> tuple[str, dict[str, Any]]:
    """The refusal's line and its shape (the JSON block after it)."""
    assert result.is_error, "the call was not refused"
    texts = [block.text for block in result.content if hasattr(block, "text")]
    assert len(texts) >= 2, f"no shape beside the line: {texts}"
    shape = json.loads(texts[1])
    assert set(shape) >= SHAPE_KEYS, shape
    return texts[0], shape


def _no_library_words(text: str) -> None:
    assert "pydantic.dev" not in text and "errors.pydantic" not in text, text
    assert "input should" not in text.lower() and "validation error" not in text.lower(), text
    assert not REGEX_BITS.search(text), text


# ---------------------------------------------------------------- over stdio


@pytest.mark.anyio
async def test_refused_arguments_come_back_in_the_shape_in_plain_words_over_stdio(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith("TPUCTL_")}
    env.update({"TPUCTL_BACKEND": "local", "PYTHONPATH": str(REPO_ROOT)})
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "mcp_client_gateway", "--data-dir", str(tmp_path / "var")],
        env=env,
        cwd=str(REPO_ROOT),
    )
    base = {"deployment_id": "gemma-a", "model": "gemma-4-e4b", "accelerator": "v6e-1"}
    with (tmp_path / "gateway.stderr").open("w", encoding="utf-8") as errlog:
        async with Client(stdio_client(params, errlog=errlog)) as client:
            bad_zone = await client.call_tool("tpu_deploy", {**base, "zones": ["US East 5"]})
            wrong_type = await client.call_tool("tpu_deploy", {**base, "ttl_hours": "5"})
            too_big = await client.call_tool("tpu_observe", {"show": "logs", "minutes": 10**9})
            missing = await client.call_tool("tpu_control", {"action": "delete"})
            unknown = await client.call_tool("tpu_status", {"deployment_id": "ghost"})

    line, shape = _shape(bad_zone)
    assert line.startswith("[invalid_argument] zones[0]: ") and ". Fix: " in line
    assert shape["code"] == "invalid_argument" and shape["field"] == "zones[0]"
    assert shape["problem"] == "is not in the expected form"
    assert shape["fix"].startswith("send a zone name like us-east5-b")
    assert line == f"[{shape['code']}] {shape['field']}: {shape['problem']}. Fix: {shape['fix']}"
    _no_library_words(line + json.dumps(shape))

    line, shape = _shape(wrong_type)
    assert shape["field"] == "ttl_hours" and shape["problem"] == "is not a number"
    assert re.match(r"send a number (from|above) \S+ (to|and at most) \S+", shape["fix"]), shape["fix"]
    _no_library_words(line + json.dumps(shape))

    line, shape = _shape(too_big)
    assert shape["field"] == "minutes" and shape["problem"] == "is too large"
    assert "a whole number from 1 to 10080" in shape["fix"]
    _no_library_words(line)

    line, shape = _shape(missing)
    assert shape["field"] == "deployment_id" and shape["problem"] == "is required"
    assert "like gemma-a" in shape["fix"]
    _no_library_words(line)

    line, shape = _shape(unknown)  # raised by the core, not by argument validation: the same shape
    assert shape == {
        "code": "not_found",
        "field": "deployment_id",
        "problem": "no deployment 'ghost'",
        "fix": "list them with tpu_status",
    }


# ---------------------------------------------------------------- the CLI


def _tpuctl(world: GatewayWorld, *argv: str) -> tuple[int, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    code = run(list(argv), ports=world.ports, stdout=stdout, stderr=stderr)
    return code, stderr.getvalue()


def _cli_words_only(text: str) -> None:
    assert "confirm='" not in text and not TOOL_NAME.search(text), text


@pytest.mark.parametrize("command", ["delete", "stop", "restart"])
def test_a_destructive_command_without_confirmation_says_how_in_tpuctl_words(world: GatewayWorld, command: str) -> None:
    world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
    code, stderr = _tpuctl(world, command, "gemma-a")
    assert code == EXIT_REFUSED
    assert f"run tpuctl {command} gemma-a --confirm gemma-a (or pass --yes)" in stderr, stderr
    _cli_words_only(stderr)
    assert world.published() == []


def test_confirm_naming_another_target_says_the_command_that_works(world: GatewayWorld) -> None:
    world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
    code, stderr = _tpuctl(world, "delete", "gemma-a", "--confirm", "gemma-b")
    assert code == EXIT_REFUSED and "tpuctl delete gemma-a --confirm gemma-a" in stderr, stderr
    _cli_words_only(stderr)


def test_a_core_fix_that_names_a_tool_names_the_command_on_the_cli(world: GatewayWorld) -> None:
    code, stderr = _tpuctl(world, "delete", "ghost", "--yes")
    assert code == EXIT_NOT_FOUND
    assert "[not_found] deployment_id: no deployment 'ghost'. Fix: list them with tpuctl status" in stderr, stderr
    _cli_words_only(stderr)


def test_a_zone_the_catalog_lacks_is_named_by_its_flag_and_the_command_that_lists_zones(
    world: GatewayWorld,
) -> None:
    code, stderr = _tpuctl(world, "deploy", "gemma-a", "--model", "gemma-4-e4b", "--zone", "us-east5-z")
    assert code == 2
    assert "[invalid_argument] --zone: us-east5-z is not a zone that offers v6e" in stderr, stderr
    assert "(tpuctl zones lists them all)" in stderr, stderr
    _cli_words_only(stderr)
    assert world.published() == []


def test_the_core_refusal_is_worded_for_each_interface() -> None:
    confirmations = Confirmations(SystemClock())
    request = confirmations.issue("delete", "gemma-a", "g1-abc", "deleting 'gemma-a' force-deletes 1 TPU resource")
    refusal = confirmations.refusal(request)
    mcp, cli_line = refusal.render("mcp"), refusal.render("cli")
    assert f"call again with confirm='{request.confirm}'" in mcp and "(valid 5 min" in mcp
    assert "Fix: show this to the user and, only once they agree, run tpuctl delete gemma-a --confirm gemma-a" in (
        cli_line
    )
    assert request.confirm not in cli_line and "valid 5 min" not in cli_line
    _cli_words_only(cli_line)
    assert refusal.shape("cli")["fix"] == refusal.fix_words("cli") and refusal.shape("mcp")["fix"] == refusal.fix


def test_plain_text_fixes_are_worded_for_the_cli() -> None:
    error = GatewayError(
        "not_found",
        "task_id",
        "the node has not answered",
        "read it with tpu_control(action='log_tail', deployment_id='gemma-a', task_id='t1') or wait until "
        "tpu_status(deployment_id=ID) shows SERVING; with zones='us-east5-b'",
    )
    assert error.fix_words("cli") == (
        "read it with tpuctl logs gemma-a --task-id t1 or wait until tpuctl status ID shows SERVING; "
        "with --zone us-east5-b"
    )
    assert error.fix_words("mcp") == error.fix and "tpu_control(action='log_tail'" in error.render()
    assert cli_text("tpu_quota_usage stays") == "tpu_quota_usage stays"  # not a tool: left alone


def test_references_are_worded_per_interface() -> None:
    error = GatewayError(
        "failed_precondition",
        "deployment_id",
        "'gemma-a' is not serving",
        Fix(
            "wait until ",
            ToolRef("tpu_status", (("deployment_id", "gemma-a"),)),
            " shows SERVING, or set ",
            ParamRef("ttl_hours", "8"),
        ),
    )
    assert error.fix == "wait until tpu_status(deployment_id='gemma-a') shows SERVING, or set ttl_hours='8'"
    assert error.fix_words("cli") == "wait until tpuctl status gemma-a shows SERVING, or set --ttl-hours 8"
    analysis = ToolRef("tpu_observe", (("show", "analysis"),))
    assert analysis.words("cli").startswith("the tpu_observe tool (tpuctl mcp serves it")


# ---------------------------------------------------------------- the table against the real things


def _subcommands(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                path = f"{prefix} {name}".strip()
                found[path] = sub
                found |= _subcommands(sub, path)
    return found


def _registry(world: GatewayWorld) -> dict[str, dict[str, Any]]:
    import anyio

    async def listed() -> dict[str, dict[str, Any]]:
        async with Client(world.server()) as client:
            tools = await client.list_tools()
        return {tool.name: tool.input_schema for tool in tools.tools}

    return anyio.run(listed)


def test_the_table_maps_every_tool_and_parameter_to_what_exists(world: GatewayWorld) -> None:
    registry = _registry(world)
    commands = _subcommands(build_parser())
    assert {tool_of(key) for key in COMMANDS} == set(registry) == set(EXPECTED)
    covered: dict[str, set[str]] = {tool: set() for tool in registry}
    for key, entry in COMMANDS.items():
        tool = tool_of(key)
        parameters = set(registry[tool]["properties"])
        covered[tool] |= {"action", "show"} & parameters  # the selector names the entry, not a flag
        if entry is None:
            covered[tool] = parameters  # no command: the whole call is MCP-only
            continue
        assert entry.command in commands, f"{key}: no `tpuctl {entry.command}`"
        sub = commands[entry.command]
        options = {flag for action in sub._actions for flag in action.option_strings}
        positionals = [action.dest for action in sub._actions if not action.option_strings]
        for name, flag in entry.flags.items():
            assert name in parameters, f"{key}: {tool} has no parameter {name}"
            assert flag in options, f"`tpuctl {entry.command}` has no {flag} (for {key}.{name})"
        for name in entry.positionals:
            assert name in parameters, f"{key}: {tool} has no parameter {name}"
            assert name in positionals or (name, entry.command) == ("command_id", "bench show"), (
                f"{key}.{name} is not positional in {entry.command}"
            )
        for word in entry.fixed:
            assert word in options, f"`tpuctl {entry.command}` has no {word}"
        covered[tool] |= set(entry.flags) | set(entry.positionals) | entry.lacks
    for tool, names in covered.items():
        parameters = set(registry[tool]["properties"])
        assert parameters <= names, f"{tool}: parameters no command covers: {sorted(parameters - names)}"
    for tool, selected in CONFIRMED_BY.values():
        entry = COMMANDS[call_key(tool, dict(selected))]
        assert entry is not None and entry.flags.get("confirm") == "--confirm", tool


def test_each_call_of_a_tool_finds_its_command() -> None:
    assert cli_text("tpu_control(action='stop', deployment_id='gemma-a')") == "tpuctl stop gemma-a"
    assert cli_text("tpu_status(command_id='x')") == "tpuctl status"
    assert cli_text("see tpu_status(deployment_id=ID)") == "see tpuctl status ID"
    assert cli_text("tpu_observe(show='benchmarks', command_id='r1')") == "tpuctl bench show r1"
    assert cli_text("tpu_observe(show='benchmarks')") == "tpuctl bench compare"
    assert cli_text("tpu_control(action='capture_bundle', deployment_id='a')") == "tpuctl debug a --capture"
    assert cli_text("tpu_query") == "tpuctl health ID"
    assert cli_text("tpu_deploy(action='update', deployment_id='a')") == "tpuctl update a"
    assert cli_text("tpu_plan(show='zones')") == "tpuctl zones"


def test_the_cli_names_fields_with_the_same_flags_as_the_table() -> None:
    named = {name for entry in COMMANDS.values() if entry is not None for name in entry.flags}
    for field, flag in cli._FLAG_OF.items():
        if field in named:  # window_minutes is the core's name; the tool calls it minutes
            assert param_flag(field) == flag, field


def test_every_pattern_a_tool_enforces_has_words(world: GatewayWorld) -> None:
    def patterns(node: Any) -> set[str]:
        if isinstance(node, dict):
            own = {node["pattern"]} if isinstance(node.get("pattern"), str) else set()
            return own.union(*(patterns(value) for value in node.values()))
        if isinstance(node, list):
            return set().union(*(patterns(value) for value in node))
        return set()

    enforced = set().union(*(patterns(schema) for schema in world.enforced_schemas().values()))
    assert enforced and enforced <= set(PATTERN_WORDS), sorted(enforced - set(PATTERN_WORDS))
    assert set(world.enforced_schemas()) == set(_registry(world))

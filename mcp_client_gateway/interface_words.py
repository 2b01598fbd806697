"""One table of how the two interfaces name the same thing: MCP tools and their parameters, CLI commands and flags.

An error's fix refers to a tool, a parameter or a confirmation (``errors.ToolRef``, ``ParamRef``, ``ConfirmRef``)
and is worded here for the interface that shows it: ``tpu_control(action='stop')`` and ``confirm='TOKEN'`` over
MCP, ``tpuctl stop ID`` and ``--confirm ID`` on the command line. A tool with several views or actions maps each
to its own command (``call_key``). ``tests/mcp/test_error_shape.py`` holds the table
against the real tool registry and the real argument parser: every tool is listed, every parameter is given a
flag, a position or is listed as one the CLI lacks, and every flag and command named exists.

Text from places that still write tool names into plain strings is worded for the CLI by ``cli_text``, which
knows the same table. Argument patterns are worded for people by ``PATTERN_WORDS`` (a zone is "a zone name like
us-east5-b", never its regular expression). Pure data and string work: it imports nothing of the gateway.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "COMMANDS",
    "CONFIRMED_BY",
    "PATTERN_WORDS",
    "PLACEHOLDERS",
    "CliCommand",
    "Interface",
    "call_key",
    "cli_call",
    "cli_text",
    "param_flag",
    "tool_of",
]

Interface = Literal["mcp", "cli"]


@dataclass(frozen=True)
class CliCommand:
    """The ``tpuctl`` command that does what one MCP call does (a tool, or one view or action of it).

    ``positionals``: the call's parameters the command takes by position, in order; ``flags``: the parameters the
    command takes as a flag (``zones`` is ``--zone``); ``lacks``: the parameters the command has no way to give;
    ``fixed``: words the command always carries for this call (``--capture``). ``--confirm`` on the command line
    takes the target's name, not a token: the CLI obtains the token itself once the person at the terminal agreed.
    """

    command: str
    positionals: tuple[str, ...] = ()
    flags: Mapping[str, str] = field(default_factory=dict)
    lacks: frozenset[str] = frozenset()
    fixed: tuple[str, ...] = ()


_DEPLOY_SPEC = {
    "accelerator": "--accelerator",
    "zones": "--zone",
    "tiers": "--tier",
    "ttl_hours": "--ttl-hours",
    "budget_usd": "--budget-usd",
    "idle_minutes": "--idle-minutes",
    "max_model_len": "--max-model-len",
    "kv_cache_dtype": "--kv-cache-dtype",
    "dtype": "--dtype",
    "command_id": "--command-id",
}
_CREATE_SPEC = {
    "model": "--model",
    **_DEPLOY_SPEC,
    "alternative_accelerators": "--alternative-accelerator",
    "preset": "--preset",
}
_ID = ("deployment_id",)
_BENCH_FLAGS = {  # tpuctl bench run and tpuctl tune (a benchmark run with tune_trials)
    "num_prompts": "--num-prompts",
    "input_len": "--input-len",
    "output_len": "--output-len",
    "command_id": "--command-id",
    "workload": "--workload",
    "prefix_len": "--prefix-len",
    "prefix_share": "--prefix-share",
    "turns": "--turns",
    "slo_ttft_ms": "--slo-ttft-ms",
    "slo_tpot_ms": "--slo-tpot-ms",
}
_CONFIRM = {"confirm": "--confirm"}

# Which view or action of a tool a call is: the tool's selecting parameter and its default. tpu_status and
# tpu_query select by the ids and prompt given (``call_key``).
_SELECTOR = {
    "tpu_plan": ("show", "plan"),
    "tpu_observe": ("show", "metrics"),
    "tpu_deploy": ("action", "create"),
    "tpu_control": ("action", "start"),
}

# MCP call (``call_key``) -> the tpuctl command that does the same (None: no such command; use `tpuctl mcp`).
COMMANDS: dict[str, CliCommand | None] = {
    "tpu_status": CliCommand("status", (), {"include_deleted": "--all"}, frozenset({"offset"})),
    "tpu_status:deployment": CliCommand("status", _ID),
    "tpu_status:command": CliCommand("status", (), {}, frozenset({"command_id", "wait_seconds"})),
    "tpu_plan:plan": CliCommand(
        "plan",
        (),
        {
            "model": "--model",
            "accelerator": "--accelerator",
            "zones": "--zone",
            "tiers": "--tier",
            "max_model_len": "--max-model-len",
            "kv_cache_dtype": "--kv-cache-dtype",
            "dtype": "--dtype",
            "ttl_hours": "--ttl-hours",
        },
    ),
    "tpu_plan:zones": CliCommand("zones", (), {"accelerator": "--accelerator", "tiers": "--tier"}),
    "tpu_plan:startup_script": None,
    "tpu_plan:gke_manifest": None,
    "tpu_observe:metrics": CliCommand("metrics", _ID, {"minutes": "--window"}),
    "tpu_observe:logs": CliCommand(
        "logs",
        _ID,
        {
            "source": "--source",
            "min_severity": "--severity",
            "minutes": "--minutes",
            "limit": "--limit",
        },
    ),
    "tpu_observe:analysis": None,
    "tpu_observe:benchmarks": CliCommand("bench compare", (), {"deployment_id": "--deployment", "limit": "--limit"}),
    "tpu_observe:benchmark": CliCommand("bench show", ("command_id",)),
    "tpu_observe:debug_bundle": CliCommand("debug", _ID, {"command_id": "--task-id"}),
    "tpu_query:query": CliCommand(
        "query",
        ("deployment_id", "prompt"),
        {"max_tokens": "--max-tokens", "temperature": "--temperature", "system_prompt": "--system"},
    ),
    "tpu_query:health": CliCommand("health", _ID),
    "tpu_deploy:create": CliCommand("deploy", _ID, {**_CREATE_SPEC, "book_calendar": "--book-calendar", **_CONFIRM}),
    "tpu_deploy:update": CliCommand("update", _ID, {**_DEPLOY_SPEC, "clear": "--clear", **_CONFIRM}),
    "tpu_deploy:prewarm": CliCommand("prewarm", _ID, _CREATE_SPEC),
    "tpu_control:start": CliCommand("start", _ID),
    "tpu_control:stop": CliCommand("stop", _ID, _CONFIRM),
    "tpu_control:restart": CliCommand("restart", _ID, _CONFIRM),
    "tpu_control:log_tail": CliCommand("logs", _ID, {"lines": "--tail", "task_id": "--task-id"}),
    "tpu_control:capture_bundle": CliCommand("debug", _ID, fixed=("--capture",)),
    "tpu_control:capture_poll": CliCommand("debug", _ID, {"task_id": "--task-id"}),  # a pending capture, read
    "tpu_control:delete": CliCommand("delete", _ID, _CONFIRM),
    "tpu_benchmark": CliCommand(
        "bench run", _ID, {"concurrency": "--concurrency", **_BENCH_FLAGS}, frozenset({"request_rate"})
    ),
    "tpu_benchmark:tune": CliCommand(
        "tune", _ID, {"tune_trials": "--trials", **_BENCH_FLAGS}, frozenset({"request_rate", "concurrency"})
    ),
    "tpu_save_hf_token": CliCommand("token set", (), _CONFIRM, frozenset({"token"})),
}

# The call that confirms each action of ``confirmation.ConfirmAction``: its tool and the arguments that select it
# (its command: ``COMMANDS``).
CONFIRMED_BY: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {
    "delete": ("tpu_control", (("action", "delete"),)),
    "stop": ("tpu_control", (("action", "stop"),)),
    "restart": ("tpu_control", (("action", "restart"),)),
    "update": ("tpu_deploy", (("action", "update"),)),
    "replace_hf_token": ("tpu_save_hf_token", ()),
    "book_calendar": ("tpu_deploy", (("action", "create"),)),
}


def call_key(tool: str, arguments: Mapping[str, object]) -> str:
    """Which ``COMMANDS`` entry a call is: ``tpu_control`` with ``action='stop'`` is ``tpu_control:stop``;
    ``tpu_status`` with a ``command_id`` is ``tpu_status:command``; ``tpu_benchmark`` with ``tune_trials`` is
    ``tpu_benchmark:tune`` (``tpuctl tune``); a tool with one command is its own name."""
    if tool == "tpu_status":
        return (
            "tpu_status:command"
            if "command_id" in arguments
            else ("tpu_status:deployment" if "deployment_id" in arguments else tool)
        )
    if tool == "tpu_query":
        return "tpu_query:query" if "prompt" in arguments else "tpu_query:health"
    if tool == "tpu_benchmark":
        return "tpu_benchmark:tune" if "tune_trials" in arguments else tool
    if tool not in _SELECTOR:
        return tool
    name, default = _SELECTOR[tool]
    chosen = str(arguments.get(name, default))
    if tool == "tpu_control" and chosen == "capture_bundle" and "task_id" in arguments:
        return "tpu_control:capture_poll"
    if tool == "tpu_observe" and chosen == "benchmarks" and "command_id" in arguments:
        return "tpu_observe:benchmark"
    return f"{tool}:{chosen}"


def tool_of(key: str) -> str:
    """The MCP tool of a ``COMMANDS`` key."""
    return key.split(":", 1)[0]


# How a positional parameter is written in a command's usage when its value is not known.
PLACEHOLDERS = {"deployment_id": "ID", "command_id": "RUN", "prompt": "PROMPT"}

# Argument patterns in people's words (keyed by the pattern, so every parameter that uses one is covered).
PATTERN_WORDS = {
    r"^[a-z]+-[a-z]+[0-9]+-[a-z0-9]{1,8}$": "a zone name like us-east5-b",
    r"^[a-z][-a-z0-9]{0,38}[a-z0-9]$": "2-40 lower-case letters, digits or '-', starting with a letter, like gemma-a",
    r"^[0-9a-f]{8}-[0-9a-f]{4}-[1-8][0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$": "a lower-case UUID like "
    "0f0f0f0f-0f0f-4f0f-8f0f-0f0f0f0f0f0f",
}


def param_flag(name: str) -> str | None:
    """The flag every command gives ``name`` (``zones`` -> ``--zone``), or None when none or not the same."""
    flags = {cli.flags[name] for cli in COMMANDS.values() if cli is not None and name in cli.flags}
    return flags.pop() if len(flags) == 1 else None


def cli_call(tool: str, arguments: Mapping[str, str | bool] | None = None) -> str:
    """``tpuctl stop gemma-a`` for ``tpu_control`` with ``action='stop', deployment_id='gemma-a'``; a switch given
    as True (``include_probes=true`` in text) is its flag alone (``--probes``)."""
    given = dict(arguments or {})
    key = call_key(tool, given)
    cli = COMMANDS.get(key)
    if cli is None:
        return f"the {tool} tool (tpuctl mcp serves it; no tpuctl command does this)"
    words = ["tpuctl", cli.command]
    for name in cli.positionals:
        value = given.pop(name, None)
        words.append(value if isinstance(value, str) else PLACEHOLDERS.get(name, name.upper()))
    words += cli.fixed
    for name, value in given.items():
        flag = cli.flags.get(name)
        if flag is not None and value is True:
            words.append(flag)
        elif flag is not None and isinstance(value, str):
            words += [flag, value]
    return " ".join(words)


_CALL = re.compile(r"\b(tpu_[a-z_]+)(?:\(([^()]*)\))?")
_ARGUMENT = re.compile(r"([a-z_]+)='([^']*)'")
_NAMED = re.compile(r"\b([a-z_]+)=(?:'([^']*)'|([A-Z]+)\b)")  # inside a call: a value, or a placeholder like ID
_SWITCH = re.compile(r"\b([a-z_]+)=true\b")


_TOOLS = frozenset(tool_of(key) for key in COMMANDS)


def cli_text(text: str) -> str:
    """Plain text worded for the CLI: tool names (and ``tool(a='v')`` calls) become ``tpuctl`` commands, and
    ``param='value'`` becomes ``--flag value``. Names that are not tools (``tpu_quota``) are left as they are."""

    def command(match: re.Match[str]) -> str:
        tool, inside = match[1], match[2]
        if tool not in _TOOLS:
            return match[0]
        arguments: dict[str, str | bool] = {name: quoted or bare for name, quoted, bare in _NAMED.findall(inside or "")}
        arguments |= {name: True for name in _SWITCH.findall(inside or "")}
        return cli_call(tool, arguments)

    def flag(match: re.Match[str]) -> str:
        found = param_flag(match[1])
        return f"{found} {match[2]}" if found else match[0]

    def switch(match: re.Match[str]) -> str:
        return param_flag(match[1]) or match[0]

    return _SWITCH.sub(switch, _ARGUMENT.sub(flag, _CALL.sub(command, text)))

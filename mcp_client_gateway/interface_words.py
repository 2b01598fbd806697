"""One table of how the two interfaces name the same thing: MCP tools and their parameters, CLI commands and flags.

An error's fix refers to a tool, a parameter or a confirmation (``errors.ToolRef``, ``ParamRef``, ``ConfirmRef``)
and is worded here for the interface that shows it: ``tpu_delete_deployment`` and ``confirm='TOKEN'`` over MCP,
``tpuctl delete ID`` and ``--confirm ID`` on the command line. ``tests/mcp/test_error_shape.py`` holds the table
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
    "cli_call",
    "cli_text",
    "param_flag",
]

Interface = Literal["mcp", "cli"]


@dataclass(frozen=True)
class CliCommand:
    """The ``tpuctl`` command that does what one MCP tool does.

    ``positionals``: the tool's parameters the command takes by position, in order; ``flags``: the tool's
    parameters the command takes as a flag (``zones`` is ``--zone``); ``lacks``: the tool's parameters the
    command has no way to give. ``--confirm`` on the command line takes the target's name, not a token: the CLI
    obtains the token itself once the person at the terminal agreed.
    """

    command: str
    positionals: tuple[str, ...] = ()
    flags: Mapping[str, str] = field(default_factory=dict)
    lacks: frozenset[str] = frozenset()


_DEPLOY_SPEC = {
    "accelerator": "--accelerator",
    "zones": "--zone",
    "tiers": "--tier",
    "hedge": "--hedge",
    "ttl_hours": "--ttl-hours",
    "budget_usd": "--budget-usd",
    "idle_minutes": "--idle-minutes",
    "max_model_len": "--max-model-len",
    "kv_cache_dtype": "--kv-cache-dtype",
    "dtype": "--dtype",
    "command_id": "--command-id",
}
_ID = ("deployment_id",)
_CONFIRM = {"confirm": "--confirm"}

# MCP tool -> the tpuctl command that does the same (None: the CLI has no such command; use `tpuctl mcp`).
COMMANDS: dict[str, CliCommand | None] = {
    "tpu_create_deployment": CliCommand(
        "deploy",
        _ID,
        {
            "model": "--model",
            **_DEPLOY_SPEC,
            "alternative_accelerators": "--alternative-accelerator",
            "book_calendar": "--book-calendar",
            "prewarm": "--prewarm",
            **_CONFIRM,
        },
    ),
    "tpu_list_deployments": CliCommand(
        "status", (), {"include_deleted": "--all"}, frozenset({"phase", "offset", "limit"})
    ),
    "tpu_get_deployment": CliCommand("status", _ID),
    "tpu_get_operation": CliCommand("status", (), {}, frozenset({"command_id", "wait_seconds"})),
    "tpu_delete_deployment": CliCommand("delete", _ID, _CONFIRM),
    "tpu_stop_deployment": CliCommand("stop", _ID, _CONFIRM),
    "tpu_start_deployment": CliCommand("start", _ID),
    "tpu_restart_serving": CliCommand("restart", _ID, _CONFIRM, frozenset({"reason"})),
    "tpu_update_deployment": CliCommand("update", _ID, {**_DEPLOY_SPEC, "clear": "--clear", **_CONFIRM}),
    "tpu_list_zones": CliCommand(
        "zones", (), {"accelerator": "--accelerator", "tier": "--tier", "live_quota": "--live-quota"}
    ),
    "tpu_plan_deployment": CliCommand(
        "plan",
        (),
        {
            "model": "--model",
            "accelerator": "--accelerator",
            "alternative_accelerators": "--alternative-accelerator",
            "zones": "--zone",
            "tiers": "--tier",
            "max_model_len": "--max-model-len",
            "kv_cache_dtype": "--kv-cache-dtype",
            "dtype": "--dtype",
            "gpu_memory_utilization": "--gpu-memory-utilization",
            "ttl_hours": "--ttl-hours",
            "tokens_per_second": "--tokens-per-second",
        },
    ),
    "tpu_render_artifacts": None,
    "tpu_query_model": CliCommand(
        "query",
        ("deployment_id", "prompt"),
        {"max_tokens": "--max-tokens", "temperature": "--temperature", "system_prompt": "--system"},
    ),
    "tpu_check_health": CliCommand("health", _ID),
    "tpu_get_metrics": CliCommand("metrics", _ID, {"window_minutes": "--window"}),
    "tpu_get_logs": CliCommand(
        "logs",
        _ID,
        {
            "source": "--source",
            "min_severity": "--severity",
            "minutes": "--minutes",
            "limit": "--limit",
            "include_probes": "--probes",
        },
    ),
    "tpu_tail_serving_logs": CliCommand("logs", _ID, {"lines": "--tail", "task_id": "--task-id"}),
    "tpu_analyze_logs": None,
    "tpu_debug_bundle": CliCommand("debug", _ID, {"capture": "--capture", "task_id": "--task-id"}),
    "tpu_run_benchmark": CliCommand(
        "bench run",
        _ID,
        {
            "concurrency": "--concurrency",
            "num_prompts": "--num-prompts",
            "input_len": "--input-len",
            "output_len": "--output-len",
            "endpoint": "--endpoint",
            "command_id": "--command-id",
            "workload": "--workload",
            "prefix_len": "--prefix-len",
            "prefix_share": "--prefix-share",
            "turns": "--turns",
            "trace": "--trace-file",
            "slo_ttft_ms": "--slo-ttft-ms",
            "slo_tpot_ms": "--slo-tpot-ms",
        },
        frozenset({"mode", "request_rate"}),
    ),
    "tpu_get_benchmark": CliCommand("bench show", ("run_id",)),
    "tpu_compare_benchmarks": CliCommand(
        "bench compare", (), {"deployment_id": "--deployment", "model": "--model", "limit": "--limit"}
    ),
    "tpu_save_hf_token": CliCommand("token set", (), _CONFIRM, frozenset({"token"})),
}

# The tool that confirms each action of ``confirmation.ConfirmAction`` (its command: ``COMMANDS``).
CONFIRMED_BY = {
    "delete": "tpu_delete_deployment",
    "stop": "tpu_stop_deployment",
    "restart": "tpu_restart_serving",
    "update": "tpu_update_deployment",
    "replace_hf_token": "tpu_save_hf_token",
    "book_calendar": "tpu_create_deployment",
}

# How a positional parameter is written in a command's usage when its value is not known.
PLACEHOLDERS = {"deployment_id": "ID", "run_id": "RUN", "prompt": "PROMPT"}

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
    """``tpuctl delete gemma-a`` for ``tpu_delete_deployment`` with ``deployment_id='gemma-a'``; a switch given
    as True (``capture=true`` in text) is its flag alone (``--capture``)."""
    cli = COMMANDS.get(tool)
    given = dict(arguments or {})
    if cli is None:
        return f"the {tool} tool (tpuctl mcp serves it; no tpuctl command does this)"
    words = ["tpuctl", cli.command]
    for name in cli.positionals:
        value = given.pop(name, None)
        words.append(value if isinstance(value, str) else PLACEHOLDERS.get(name, name.upper()))
    for name, value in given.items():
        flag = cli.flags.get(name)
        if flag is not None and value is True:
            words.append(flag)
        elif flag is not None and isinstance(value, str):
            words += [flag, value]
    return " ".join(words)


_CALL = re.compile(r"\b(tpu_[a-z_]+)(?:\(([^()]*)\))?")
_ARGUMENT = re.compile(r"([a-z_]+)='([^']*)'")
_SWITCH = re.compile(r"\b([a-z_]+)=true\b")


def cli_text(text: str) -> str:
    """Plain text worded for the CLI: tool names (and ``tool(a='v')`` calls) become ``tpuctl`` commands, and
    ``param='value'`` becomes ``--flag value``. Names that are not tools (``tpu_quota``) are left as they are."""

    def command(match: re.Match[str]) -> str:
        tool, inside = match[1], match[2]
        if tool not in COMMANDS:
            return match[0]
        arguments: dict[str, str | bool] = dict(_ARGUMENT.findall(inside or ""))
        arguments |= {name: True for name in _SWITCH.findall(inside or "")}
        return cli_call(tool, arguments)

    def flag(match: re.Match[str]) -> str:
        found = param_flag(match[1])
        return f"{found} {match[2]}" if found else match[0]

    def switch(match: re.Match[str]) -> str:
        return param_flag(match[1]) or match[0]

    return _SWITCH.sub(switch, _ARGUMENT.sub(flag, _CALL.sub(command, text)))

"""Fuzz every tool of the real gateway over stdio: a hostile argument meets a one-line refusal naming it.

Why (issue #17, "Must show"): the gateway is driven by a model, and a model steered by text it read can send
any value in any argument. Whatever arrives, the gateway must answer with ``[code] field: problem. Fix: ...``
naming the argument at fault, never a traceback or an internal error, never crash, never write anything
when it refuses, and never echo a stored secret. The tool list and each parameter come from the published
``inputSchema``, so a tool or parameter added later is fuzzed too. A tool that does several things (an ``action``
or a ``show`` view, ``tpu_status`` by the id given, ``tpu_query`` with a prompt or without) is fuzzed in each of its
modes, so every action and view meets the values its schema lets through.

How: ``python -m mcp_client_gateway --data-dir <tmp>`` runs as a subprocess spoken to by the SDK client, as in
``test_stdio_server.py``. The data dir is the ``world`` fixture's folder, so a deployment ``fuzz-target`` is
seeded in it first (COMPILING: its node is up, so restart checks ``confirm``, but it is not serving, so
benchmarks and queries are refused before any network call) and the Hugging Face token is saved. Then every
parameter of every tool gets a fixed list of 10-20 hostile values (not combinatorial) while the other
arguments are the required ones with plausible values and those selecting the mode, plus one call per tool with
an unknown argument. A value the schema refuses is refused before the mode matters, so it is sent in one mode; a
value the schema allows is sent in every mode the parameter belongs to.

The schema the server enforces decides what each call should do: the tool's full argument schema
(``StrictTool.enforced_schema``, the published ``inputSchema`` before its patterns and length caps were left out
for the model's sake). A value the schema refuses must be refused naming the parameter. A value it allows
(``null`` for an optional parameter, text for a free-text one) may be accepted, or refused naming the parameter,
or refused exactly as the plain call in the same mode is (``fuzz-target`` is not serving, say).
The data dir's logical contents (SQLite rows, secret files) are compared across the whole run of refusals and
read-only calls, and around each call of a tool that writes with a value its schema allows, where an acceptance
must have exactly the effect the tool promises.

Non-finite numbers: JSON has none, and the SDK serialises ``float("nan")``, ``inf`` and ``-inf`` as ``null``, so
those reach the server as ``null``. To reach it as numbers, the bare literals ``NaN``, ``Infinity`` and
``-Infinity`` (which the server's JSON parser accepts) are spliced into the request line by a thin wrapper
around the stdio transport; the refusals saying "finite" prove they arrived as numbers.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sqlite3
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, cast

import anyio
import pytest
from jsonschema import Draft202012Validator
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.message import SessionMessage

from shared.domain.models import Phase
from shared.domain.spec_change import IN_PLACE_FIELDS
from tests.mcp.conftest import HF_TOKEN, GatewayWorld
from tests.mcp.test_tool_contract import EXPECTED

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

REPO_ROOT = Path(__file__).resolve().parents[2]
TARGET = "fuzz-target"
FUZZ_UUID = "0f0f0f0f-0f0f-4f0f-8f0f-0f0f0f0f0f0f"
UNKNOWN = "fuzz_unknown"
INTERNAL_MARKERS = (
    "Traceback",
    "Internal",
    "internal_error",
    "[internal]",
    "Error executing tool",
    "Exception",
    "ValueError",
    "KeyError",
    "TypeError",
    "AttributeError",
    "IndexError",
    "RuntimeError",
    "OverflowError",
    "UnicodeError",
    "ValidationError",
)
REFUSAL = re.compile(r"\[(?P<code>[a-z_]+)\] (?P<field>[^\s:]+): \S")
# In a refusal line: control characters, zero-width or bidi controls, or a run of the 100k-character value.
ECHOED = re.compile("[\x00-\x08\x0b-\x1f\x7f\u200b-\u200f\u202a-\u202e\u2066-\u2069]|A{200}")
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[1-8][0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


# ---------------------------------------------------------------- hostile values


@dataclass(frozen=True)
class Hostile:
    """One value to send: ``sent`` goes to ``call_tool``, ``arrives`` is what the server parses."""

    label: str
    sent: Any
    arrives: Any


def plain(label: str, value: Any) -> Hostile:
    return Hostile(label, value, value)


def via_sdk(label: str, value: float) -> Hostile:
    """A non-finite float handed to the SDK, which serialises it as JSON null: the server receives null."""
    return Hostile(f"{label} (SDK sends null)", value, None)


BARE_LITERALS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def bare_sentinel(literal: str) -> str:
    return f"__fuzz_bare_{literal}__"


def bare(literal: str) -> Hostile:
    """A non-finite number sent as the bare JSON literal (see ``splice_bare_literals``)."""
    return Hostile(f"bare {literal}", bare_sentinel(literal), BARE_LITERALS[literal])


HUGE = "A" * 100_000
WRONG_TYPES = [plain("true", True), plain("[]", []), plain("{}", {}), plain("null", None), plain("1.5", 1.5)]
WRONG_TYPES.append(plain('"5"', "5"))
TEXT_VALUES = [
    plain("100k characters", HUGE),
    plain("bidi override", "\u202egnp.exe"),
    plain("zero-width space", "fuzz\u200b-target"),
    plain("emoji", "\U0001f525\U0001f480"),
    plain("NUL", "fuzz\x00target"),
    plain("ANSI escape", "\x1b[31mred\x1b[0m"),
    plain("trailing newline", f"{TARGET}\n"),
    plain("path traversal", "../../etc/passwd"),
    plain("absolute path", "/etc/passwd"),
    plain("command substitution", "$(rm -rf /)"),
    plain("backticks", "`id`"),
    plain("command chaining", "; ls"),
    plain("pipe", "| cat"),
    plain("empty", ""),
]
NUMBER_VALUES = [
    via_sdk("float nan", math.nan),
    via_sdk("float inf", math.inf),
    via_sdk("float -inf", -math.inf),
    *(bare(literal) for literal in BARE_LITERALS),
    plain('"NaN"', "NaN"),
    plain('"Infinity"', "Infinity"),
    plain("1e308", 1e308),
    plain("-1", -1),
    plain("10**30", 10**30),
    plain("0", 0),
]
BOOLEAN_VALUES = [plain('"true"', "true"), plain("1", 1), plain("0", 0), plain("command substitution", "$(id)")]
ARRAY_VALUES = [
    plain("a string, not a list", "../../etc/passwd"),
    plain("[100k characters]", [HUGE]),
    plain("[bidi override]", ["\u202e"]),
    plain("[NUL]", ["\x00"]),
    plain("[path traversal]", ["../../etc/passwd"]),
    plain("[command substitution]", ["$(rm -rf /)"]),
    plain("[null]", [None]),
    plain("[[]]", [[]]),
    plain("[-1]", [-1]),
    plain("[10**30]", [10**30]),
    Hostile("[bare NaN]", [bare_sentinel("NaN")], [math.nan]),
    plain("1000 items", ["us-east5-b"] * 1000),
]


def schema_types(schema: dict[str, Any]) -> set[str]:
    """The JSON types a parameter takes, ``null`` left out (``anyOf`` branches included)."""
    branches = [schema, *schema.get("anyOf", [])]
    return {str(branch["type"]) for branch in branches if "type" in branch} - {"null"}


def hostile_values(schema: dict[str, Any]) -> list[Hostile]:
    """The fixed hostile values for a parameter of this schema: its kind's list plus the wrong types."""
    kinds = schema_types(schema)
    if "array" in kinds:
        return ARRAY_VALUES + WRONG_TYPES
    if "boolean" in kinds:
        return BOOLEAN_VALUES + WRONG_TYPES
    if kinds & {"integer", "number"}:
        return NUMBER_VALUES + WRONG_TYPES
    assert kinds == {"string"}, f"no hostile values for a parameter of type {kinds}: add them"
    return TEXT_VALUES + WRONG_TYPES


def plausible(name: str, schema: dict[str, Any]) -> Any:
    """A valid-looking value for a required parameter; an unknown kind fails so the test gets updated."""
    if name == "token":
        return HF_TOKEN  # the one already saved: saving it again changes nothing
    if "enum" in schema:
        return schema.get("default", schema["enum"][0])
    pattern = schema.get("pattern")
    for candidate in (TARGET, FUZZ_UUID, "fuzz"):
        if pattern is not None and re.search(pattern, candidate):
            return candidate
    if schema.get("type") == "string" and pattern is None:
        return "fuzz"
    raise AssertionError(f"no plausible value for required parameter {name}: {schema}")


def has_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, list):
        return any(has_non_finite(item) for item in value)
    return False


def schema_allows(input_schema: dict[str, Any], arguments: dict[str, Any]) -> bool:
    """Whether the published schema accepts these arguments as the server parses them (JSON has no NaN)."""
    if any(has_non_finite(value) for value in arguments.values()):
        return False
    return bool(Draft202012Validator(input_schema).is_valid(arguments))


# ---------------------------------------------------------------- the transport


class RenderedMessage:
    """A JSON-RPC message already rendered: ``stdio_client`` only calls ``model_dump_json`` on what it sends."""

    def __init__(self, text: str) -> None:
        self.text = text

    def model_dump_json(self, **_: Any) -> str:
        return self.text


def with_bare_literals(message: SessionMessage) -> SessionMessage:
    """``message`` with each quoted sentinel replaced by its bare literal (``"__fuzz_bare_NaN__"`` -> ``NaN``)."""
    text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
    spliced = text
    for literal in BARE_LITERALS:
        spliced = spliced.replace(json.dumps(bare_sentinel(literal)), literal)
    if spliced == text:
        return message
    return SessionMessage(cast(Any, RenderedMessage(spliced)), metadata=message.metadata)


@asynccontextmanager
async def splice_bare_literals(
    transport: AbstractAsyncContextManager[tuple[Any, Any]],
) -> AsyncIterator[tuple[Any, Any]]:
    """The stdio transport, with bare non-finite literals spliced into outgoing requests."""
    async with transport as (read_stream, write_stream):
        sender, receiver = anyio.create_memory_object_stream[SessionMessage](0)

        async def forward() -> None:
            async with receiver:
                async for message in receiver:
                    await write_stream.send(with_bare_literals(message))

        async with anyio.create_task_group() as group:
            group.start_soon(forward)
            try:
                yield read_stream, sender
            finally:
                sender.close()


# ---------------------------------------------------------------- the data dir


def sqlite_rows(path: Path) -> dict[str, str]:
    """A digest of each table's rows (order-free), read through a read-only connection."""
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = [row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        digests = {}
        for table in sorted(tables):
            rows = sorted(repr(row) for row in connection.execute(f'SELECT * FROM "{table}"'))  # noqa: S608
            digests[table] = hashlib.sha256("\n".join(rows).encode()).hexdigest()
        return digests
    finally:
        connection.close()


def snapshot(data_dir: Path) -> dict[str, str]:
    """The data dir's logical contents: SQLite rows per table, every other file by hash.

    Left out: the logs and SQLite's WAL, shared-memory and journal files (they change when a reader opens
    the database; the rows they hold are read through the database itself).
    """
    contents: dict[str, str] = {}
    for path in sorted(data_dir.rglob("*")):
        relative = path.relative_to(data_dir).as_posix()
        if not path.is_file() or relative.startswith("logs/") or path.suffix in (".log", ".jsonl"):
            continue
        if path.name.endswith(("-wal", "-shm", "-journal")):
            continue
        if path.suffix == ".sqlite":
            contents.update({f"{relative}:{table}": digest for table, digest in sqlite_rows(path).items()})
        else:
            contents[relative] = hashlib.sha256(path.read_bytes()).hexdigest()
    return contents


def changed(before: dict[str, str], after: dict[str, str]) -> set[str]:
    return {key for key in before.keys() | after.keys() if before.get(key) != after.get(key)}


# ---------------------------------------------------------------- results


def texts(result: Any) -> list[str]:
    return [block.text for block in result.content if hasattr(block, "text")]


def refusal_of(result: Any) -> tuple[str, str] | None:
    """``(code, field)`` of a refusal's first line, or None when it is not in the gateway's format."""
    lines = texts(result)
    match = REFUSAL.match(lines[0]) if lines else None
    return (match["code"], match["field"]) if match else None


def names_parameter(field_name: str, parameter: str) -> bool:
    """``zones[2]`` names ``zones``; ``confirm`` names ``confirm``."""
    return field_name == parameter or field_name.startswith(f"{parameter}[")


@dataclass
class Tally:
    """What the fuzz run saw, for the assertions and the summary."""

    calls: int = 0
    rejected: int = 0
    accepted: int = 0
    problems: list[str] = field(default_factory=list)
    named: set[tuple[str, str]] = field(default_factory=set)  # (tool, parameter) some refusal named

    def problem(self, where: str, text: str) -> None:
        self.problems.append(f"{where}: {text[:300]!r}")


MODEL = "gemma-4-e2b"  # fits the default slice: a create, prewarm or plan of it gets past the fit check


def modes(name: str, schema: dict[str, Any]) -> list[dict[str, Any]]:
    """What the tool can do, as the arguments that select each mode (and what that mode needs besides): one per
    value of its ``action`` or ``show`` enum, ``tpu_status`` by the id given, ``tpu_query`` without or with a prompt.
    A tool of one mode: ``[{}]``."""
    properties = schema.get("properties", {})
    for selector in ("action", "show"):
        if "enum" in properties.get(selector, {}):
            return [{selector: value, **MODE_NEEDS.get((name, value), {})} for value in properties[selector]["enum"]]
    return [dict(mode) for mode in OPTIONAL_MODES.get(name, ({},))]


# What a mode needs besides its selector, for its plain call to get past "X is required" to the mode's own checks.
MODE_NEEDS: dict[tuple[str, str], dict[str, Any]] = {
    ("tpu_deploy", "create"): {"model": MODEL},
    ("tpu_deploy", "prewarm"): {"model": MODEL},
    ("tpu_plan", "plan"): {"model": MODEL},
    ("tpu_plan", "startup_script"): {"deployment_id": TARGET},
    ("tpu_plan", "gke_manifest"): {"deployment_id": TARGET},
    ("tpu_observe", "metrics"): {"deployment_id": TARGET},
    ("tpu_observe", "analysis"): {"deployment_id": TARGET},
    ("tpu_observe", "debug_bundle"): {"deployment_id": TARGET},
}
# Modes that read only some of the tool's parameters and wait for the node's answer (up to 3 s a call, with no node
# agent here): only the parameters they read are sent to them; the others are fuzzed in the tool's other modes.
MODE_PARAMETERS: dict[str, frozenset[str]] = {
    "tpu_control.log_tail": frozenset({"deployment_id", "lines", "task_id"}),
    "tpu_control.capture_bundle": frozenset({"deployment_id", "task_id"}),
}
# Tools whose mode follows from which optional argument is given.
OPTIONAL_MODES: dict[str, tuple[dict[str, Any], ...]] = {
    "tpu_status": ({}, {"deployment_id": TARGET}, {"command_id": FUZZ_UUID}),
    "tpu_query": ({}, {"prompt": "fuzz"}),
}


def mode_name(tool: str, mode: dict[str, Any]) -> str:
    """``tpu_control.log_tail``, ``tpu_query.prompt``, ``tpu_status``."""
    selector = mode.get("action", mode.get("show"))
    if selector is not None:
        return f"{tool}.{selector}"
    return ".".join([tool, *sorted(mode)])


@dataclass(frozen=True)
class Probe:
    """One fuzz call: ``parameter`` of ``tool`` set to ``value`` (or the unknown argument) in ``mode`` (the
    arguments selecting what the tool does), judged against ``schema``, the tool's enforced argument schema."""

    tool: Any
    schema: dict[str, Any]
    parameter: str
    value: Hostile
    mode: dict[str, Any] = field(default_factory=dict)

    @property
    def mode_name(self) -> str:
        return mode_name(self.tool.name, self.mode)

    @property
    def where(self) -> str:
        return f"{self.mode_name}.{self.parameter}={self.value.label}"

    @property
    def writes(self) -> bool:
        hints = self.tool.annotations
        return not (hints is not None and hints.read_only_hint)

    def required(self) -> dict[str, Any]:
        """The plain call of this mode: the required arguments with plausible values, and the mode's own."""
        schema = self.schema
        required = {name: plausible(name, schema["properties"][name]) for name in schema.get("required", [])}
        return {**required, **self.mode}

    def arguments(self, *, arriving: bool = False) -> dict[str, Any]:
        return {**self.required(), self.parameter: self.value.arrives if arriving else self.value.sent}

    @cached_property
    def allowed(self) -> bool:
        """Whether the enforced schema accepts this call's arguments."""
        if self.parameter == UNKNOWN:
            return False
        return schema_allows(self.schema, self.arguments(arriving=True))


def probes(tools: list[Any], enforced: dict[str, dict[str, Any]]) -> list[Probe]:
    """Every hostile value for every parameter of every tool, and one unknown argument per tool.

    A parameter that selects a mode (or that a mode needs) is probed in the modes that set it, any other in every
    mode that reads it (``MODE_PARAMETERS``); a value the schema refuses is refused before the mode matters, so it is
    sent in the first of them only."""
    planned: list[Probe] = []
    for tool in tools:
        schema = enforced[tool.name]
        assert set(schema.get("properties", {})) == set(tool.input_schema.get("properties", {})), tool.name
        tool_modes = modes(tool.name, schema)
        for parameter, parameter_schema in schema.get("properties", {}).items():
            its_modes = [mode for mode in tool_modes if parameter in mode] or [
                mode for mode in tool_modes if parameter in MODE_PARAMETERS.get(mode_name(tool.name, mode), {parameter})
            ]
            for value in hostile_values(parameter_schema):
                first, *others = (Probe(tool, schema, parameter, value, mode) for mode in its_modes)
                planned.extend([first, *(probe for probe in others if probe.allowed)])
        planned.append(Probe(tool, schema, UNKNOWN, plain("unknown argument", 1), tool_modes[0]))
    return planned


# ---------------------------------------------------------------- the run


@dataclass
class FuzzRun:
    """The client, the data dir and what was seen; the checks every call goes through."""

    client: Client
    data_dir: Path
    world: GatewayWorld
    tally: Tally = field(default_factory=Tally)
    results: list[str] = field(default_factory=list)
    baselines: dict[str, tuple[str, str] | None] = field(default_factory=dict)  # by mode

    async def call(self, name: str, arguments: dict[str, Any], where: str) -> Any:
        """One call; the session breaking here fails the test (a crash), as does any internal-error text."""
        result = await self.client.call_tool(name, arguments)
        self.tally.calls += 1
        body = "\n".join(texts(result))
        self.results.append(body)
        for marker in INTERNAL_MARKERS:
            if marker in body:
                self.tally.problem(f"{where} internal error ({marker})", body)
        return result

    async def baseline(self, probe: Probe) -> tuple[str, str] | None:
        """The refusal of the probe's mode called with its plain arguments only (None: it was accepted)."""
        name = probe.mode_name
        if name not in self.baselines:
            plain_call = Probe(probe.tool, probe.schema, "", plain("baseline", None), probe.mode)
            if probe.writes:
                result = await self.write_checked(plain_call, plain_call.required())
            else:
                result = await self.call(probe.tool.name, plain_call.required(), f"{name} baseline")
            self.baselines[name] = refusal_of(result) if result.is_error else None
        return self.baselines[name]

    async def probe(self, probe: Probe) -> None:
        """Send one hostile value and judge the answer against what the schema says of it."""
        if probe.writes and probe.allowed:
            result = await self.write_checked(probe, probe.arguments())
        else:
            result = await self.call(probe.tool.name, probe.arguments(), probe.where)
        if not result.is_error:
            self.tally.accepted += 1
            if not probe.allowed:
                self.tally.problem(f"{probe.where} accepted a value the schema refuses", texts(result)[0])
            return
        self.tally.rejected += 1
        refusal = refusal_of(result)
        if ECHOED.search(texts(result)[0]):
            self.tally.problem(f"{probe.where} refusal echoes control characters or the 100k value", texts(result)[0])
        if refusal is None:
            self.tally.problem(f"{probe.where} refusal not in '[code] field: ...' form", texts(result)[0])
        elif names_parameter(refusal[1], probe.parameter):
            self.tally.named.add((probe.tool.name, probe.parameter))
        elif probe.allowed and probe.mode_name in CONFIRMED_CHANGES and refusal == ("confirmation_required", "confirm"):
            pass  # a change the schema allows, refused until confirmed: fuzz-target's slice is up (COMPILING)
        elif not probe.allowed or refusal != await self.baseline(probe):
            # A value the schema allows may be refused for the reason the plain call is (the target is not serving).
            self.tally.problem(f"{probe.where} refusal does not name {probe.parameter}", texts(result)[0])

    async def write_checked(self, probe: Probe, arguments: dict[str, Any]) -> Any:
        """A call to a tool that writes, with values its schema allows: a refusal changes nothing, and an
        acceptance has exactly the effect the tool promises (``ACCEPTED_WRITES``)."""
        before = snapshot(self.data_dir)
        result = await self.call(probe.tool.name, arguments, probe.where)
        differences = changed(before, snapshot(self.data_dir))
        if result.is_error:
            if differences:
                self.tally.problem(f"{probe.where} refused but wrote {sorted(differences)}", texts(result)[0])
            return result
        check = ACCEPTED_WRITES.get(probe.mode_name)
        if check is None:
            self.tally.problem(f"{probe.where} accepted by a tool that writes; it wrote", str(sorted(differences)))
        else:
            complaint = check(self, result, differences)
            if complaint:
                self.tally.problem(f"{probe.where} accepted: {complaint}", texts(result)[0])
        return result


def saving_the_same_token(run: FuzzRun, result: Any, differences: set[str]) -> str:
    """Saving the token already stored reports it unchanged and writes nothing."""
    if result.structured_content.get("version") != "unchanged":
        return "saving the stored token again did not report it unchanged"
    return f"saving the stored token again wrote {sorted(differences)}" if differences else ""


def asking_the_node_for_its_log(run: FuzzRun, result: Any, differences: set[str]) -> str:
    """A log tail publishes one serving.logs task for the node and, with no node agent here, answers pending."""
    view = result.structured_content
    published = run.world.published()
    if view.get("status") != "pending" or not UUID.match(str(view.get("task_id"))):
        return f"expected status pending with a task_id, got {view.get('status')}"
    if [(message.kind, message.deployment_id) for message in published] != [("serving.logs", TARGET)]:
        return f"expected one serving.logs command for {TARGET}, got {published}"
    if not differences or any(not key.startswith("bus.sqlite:") for key in differences):
        return f"expected a change to the bus only, got {sorted(differences)}"
    return ""


def capturing_a_debug_bundle(run: FuzzRun, result: Any, differences: set[str]) -> str:
    """A capture publishes one serving.debug task for the node and, with no node agent here, answers pending."""
    view = result.structured_content
    published = run.world.published()
    if view.get("status") != "pending" or not UUID.match(str(view.get("task_id"))):
        return f"expected status pending with a task_id, got {view.get('status')}"
    if [(message.kind, message.deployment_id) for message in published] != [("serving.debug", TARGET)]:
        return f"expected one serving.debug command for {TARGET}, got {published}"
    if not differences or any(not key.startswith("bus.sqlite:") for key in differences):
        return f"expected a change to the bus only, got {sorted(differences)}"
    return ""


def updating_in_place(run: FuzzRun, result: Any, differences: set[str]) -> str:
    """A change of when fuzz-target ends (TTL, budget, idle) applies to its running slice without a confirmation:
    one deployment.update for it on the bus, no slice replaced."""
    view = result.structured_content
    fields = {change.get("field") for change in view.get("changes", [])}
    if view.get("replaces_slice") is not False or not fields or not fields <= IN_PLACE_FIELDS:
        return f"accepted without confirmation a change that is not in place: {sorted(map(str, fields))}"
    published = run.world.published()
    if [(message.kind, message.deployment_id) for message in published] != [("deployment.update", TARGET)]:
        return f"expected one deployment.update for {TARGET}, got {published}"
    if not differences or any(not key.startswith("bus.sqlite:") for key in differences):
        return f"expected a change to the bus only, got {sorted(differences)}"
    return ""


# Modes whose changes to fuzz-target (its slice is up) that replace the slice are refused until confirmed: a value
# the schema allows may meet that refusal rather than the plain call's (which, giving no change, is refused for that).
CONFIRMED_CHANGES = frozenset({"tpu_deploy.update"})

# Modes of tools that write that may legitimately accept a value their schema allows: the effect each promises.
ACCEPTED_WRITES: dict[str, Callable[[FuzzRun, Any, set[str]], str]] = {
    "tpu_save_hf_token": saving_the_same_token,  # confirm is not needed to save the token already stored
    "tpu_control.log_tail": asking_the_node_for_its_log,  # task_id null is its default: ask the node again
    "tpu_control.capture_bundle": capturing_a_debug_bundle,  # task_id null is its default: ask the node again
    "tpu_deploy.update": updating_in_place,  # a TTL, budget or idle change keeps the slice: no confirm needed
}


def gateway_params(data_dir: Path) -> StdioServerParameters:
    env = {key: value for key, value in os.environ.items() if not key.startswith("TPUCTL_")}
    env.update({"TPUCTL_BACKEND": "local", "TPUCTL_LOG_LEVEL": "DEBUG", "PYTHONPATH": str(REPO_ROOT)})
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "mcp_client_gateway", "--data-dir", str(data_dir)],
        env=env,
        cwd=str(REPO_ROOT),
    )


async def test_every_tool_refuses_hostile_arguments_by_name_without_crashing_or_writing(
    world: GatewayWorld, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    data_dir = tmp_path  # the world fixture's store, bus and secrets live here: the gateway opens the same files
    world.seed(TARGET, phase=Phase.COMPILING)
    stderr_path = tmp_path_factory.mktemp("stderr") / "gateway.stderr"  # outside the data dir
    started = time.monotonic()
    with stderr_path.open("w", encoding="utf-8") as errlog:
        async with Client(splice_bare_literals(stdio_client(gateway_params(data_dir), errlog=errlog))) as client:
            run = FuzzRun(client, data_dir, world)
            saved = await run.call("tpu_save_hf_token", {"token": HF_TOKEN}, "setup")
            assert not saved.is_error, texts(saved)
            tools = (await client.list_tools()).tools
            planned = probes(tools, world.enforced_schemas())
            reads_and_refusals = [probe for probe in planned if not (probe.writes and probe.allowed)]
            allowed_writes = [probe for probe in planned if probe.writes and probe.allowed]

            before = snapshot(data_dir)
            for probe in reads_and_refusals:
                await run.probe(probe)
            wrote = changed(before, snapshot(data_dir))
            for probe in allowed_writes:  # each one checked against a snapshot of its own
                await run.probe(probe)
            final = await run.call("tpu_status", {}, "final")
    elapsed = time.monotonic() - started

    tally = run.tally
    print(
        f"\nfuzz: {len(tools)} tools, {tally.calls} calls ({len(planned)} probes), {tally.rejected} rejected, "
        f"{tally.accepted} accepted, {len(allowed_writes)} write-tool calls with schema-valid values, "
        f"{elapsed:.1f} s"
    )
    assert sorted(tool.name for tool in tools) == sorted(EXPECTED)
    every_parameter = {(probe.tool.name, probe.parameter) for probe in planned}
    assert every_parameter - tally.named == set(), "parameters no hostile value was refused by name"
    assert not tally.problems, f"{len(tally.problems)} problem(s):\n" + "\n".join(tally.problems[:40])
    assert not wrote, f"refused or read-only calls changed the data dir: {sorted(wrote)}"
    assert not final.is_error and final.structured_content["deployments"][0]["deployment_id"] == TARGET
    assert tally.rejected > 0 and tally.rejected + tally.accepted == len(planned)
    bare_refusals = [body for body in run.results if "finite" in body]
    assert bare_refusals, "no refusal mentions a non-finite number: the bare NaN/Infinity literals did not arrive"

    assert not any(HF_TOKEN in body for body in run.results), "a result echoed the saved Hugging Face token"
    lines = [line for line in stderr_path.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert lines, "the gateway logged nothing at DEBUG"
    for line in lines:
        record = json.loads(line)  # every stderr line is one JSON log object
        assert {"severity", "message", "logger"} <= set(record)
        assert record["severity"] not in ("ERROR", "CRITICAL"), record["message"]
        assert HF_TOKEN not in line

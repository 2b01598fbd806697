"""Closed, strict tool inputs for the MCP server: unknown arguments and loose types are refused, by name.

Why: the SDK builds each tool's argument model from the function signature (``func_metadata``) with pydantic's
defaults: unknown arguments are dropped silently and values are coerced (``true`` becomes ``1`` for a number,
``"5"`` becomes ``5``), and a string holding JSON is parsed into a list or object before validation. A model
steered by injected text should meet a closed door instead, so every tool here is a :class:`StrictTool`:

- the argument model is a subclass of the SDK's with ``extra="forbid"``, ``strict=True`` and
  ``allow_inf_nan=False``; the published ``inputSchema`` is regenerated from it (``additionalProperties:
  false``) and compacted (``tool_schema``: no titles, nullable wrappers or patterns; the model gets the
  structure, the server still enforces all of the model's schema). ``FuncMetadata``'s fields are documented as
  read live, and ``Tool`` is public, so this is configuration of the SDK's own objects, not a patch of its
  internals;
- the JSON-in-a-string pre-parse is turned off (``_NoPreParse``): a list is a list, text stays text;
- a refused call is the gateway's error shape (``errors.GatewayError``): one line naming the argument, the
  problem in plain words and the fix (``[invalid_argument] ttl_hours: is not a number. Fix: send a number from
  1 to 168 (...)``), then the same as JSON (``code``, ``field``, ``problem``, ``fix``). Never pydantic's text,
  its links or a regular expression: a pattern is worded by ``interface_words.PATTERN_WORDS`` ("a zone name
  like us-east5-b"). Values are never repeated, and an unknown argument's name is shown escaped and cut to 64
  characters. The errors the tool body raises (``[code] field: ...`` from the core) lose the SDK's "Error
  executing tool NAME:" prefix and carry the same shape, so every refusal starts with its code and field.

The MCP server passes the tools to ``MCPServer(tools=...)``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Union, cast

from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.server.mcpserver.tools import Tool
from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase, FuncMetadata
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from mcp_client_gateway.errors import Fix, GatewayError, ParamRef, ToolRef, parse_line
from mcp_client_gateway.interface_words import PATTERN_WORDS
from mcp_client_gateway.log_hygiene import clean_text
from mcp_client_gateway.tool_schema import compact_schema, compact_text

if TYPE_CHECKING:
    from mcp.server.mcpserver import Context

__all__ = ["GatewayToolError", "StrictTool", "argument_error", "error_result", "strict_arguments"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, arbitrary_types_allowed=True)


class _NoPreParse(FuncMetadata):
    """The SDK's function metadata without its lenient pre-parse of JSON held in strings."""

    def pre_parse_json(self, data: dict[str, Any]) -> dict[str, Any]:
        return dict(data)


def strict_arguments(model: type[ArgModelBase]) -> type[ArgModelBase]:
    """``model`` closed to unknown fields and validated strictly (no coercion, finite numbers only)."""
    namespace = {"__module__": model.__module__, "__qualname__": model.__qualname__, "model_config": _STRICT}
    metaclass: Any = type(model)  # pydantic's model metaclass: builds the subclass like a class statement would
    return cast(type[ArgModelBase], metaclass(model.__name__, (model,), namespace))


def _field(loc: tuple[int | str, ...]) -> str:
    """``zones[2]`` from pydantic's ``('zones', 2)``; an unknown name escaped and cut (it is caller text)."""
    if not loc:
        return "arguments"
    head = str(loc[0])
    name = head if _NAME.fullmatch(head) else json.dumps(head[:64], ensure_ascii=True)
    for part in loc[1:]:
        if isinstance(part, int):
            name += f"[{part}]"
    return name


def _describe(model: type[BaseModel], param: str) -> str:
    field = model.model_fields.get(param)
    description = (field.description or "") if field is not None else ""
    text, cut = clean_text(description, limit=160)
    return text.rstrip(".") + ("..." if cut else "")


# A pydantic error type in plain words (the value itself is never repeated).
_PROBLEMS = {
    "string_type": "is not text",
    "int_type": "is not a whole number",
    "int_from_float": "is not a whole number",
    "float_type": "is not a number",
    "finite_number": "is not a finite number",
    "bool_type": "is not true or false",
    "list_type": "is not a list",
    "dict_type": "is not an object",
    "model_type": "is not an object",
    "literal_error": "is not one of the allowed values",
    "enum": "is not one of the allowed values",
    "string_pattern_mismatch": "is not in the expected form",
    "string_too_long": "is too long",
    "string_too_short": "is too short",
    "too_long": "has too many items",
    "too_short": "has too few items",
    "less_than_equal": "is too large",
    "less_than": "is too large",
    "greater_than_equal": "is too small",
    "greater_than": "is too small",
    "none_required": "must be left out",
}


def _schema_at(schema: dict[str, Any], loc: tuple[int | str, ...]) -> dict[str, Any]:
    """The JSON schema of the value at ``loc`` (``('zones', 0)`` is an item of ``zones``); {} when unknown."""
    defs = schema.get("$defs", {})
    node: dict[str, Any] = schema
    for part in loc:
        node = _resolved(node, defs)
        if isinstance(part, int):
            node = node.get("items", {})
        elif part in node.get("properties", {}):
            node = node["properties"][part]
    return _resolved(node, defs)


def _resolved(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """``node`` with a ``$ref`` followed and an optional (``X | None``) reduced to its ``X``."""
    if "$ref" in node:
        node = defs.get(str(node["$ref"]).rsplit("/", 1)[-1], {})
    branches = [branch for branch in node.get("anyOf", []) if branch.get("type") != "null"]
    if len(branches) == 1:
        return _resolved({**node, **branches[0], "anyOf": []}, defs)
    return node


def _range(schema: dict[str, Any]) -> str:
    low, high = schema.get("minimum"), schema.get("maximum")
    above, below = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if low is not None and high is not None:
        return f" from {low:g} to {high:g}"
    lower = f"at least {low:g}" if low is not None else f"above {above:g}" if above is not None else ""
    upper = f"at most {high:g}" if high is not None else f"below {below:g}" if below is not None else ""
    return " " + " and ".join(part for part in (lower, upper) if part) if lower or upper else ""


def _allowed(schema: dict[str, Any], defs: dict[str, Any] | None = None) -> str:
    """What a value must be, in people's words: never a regular expression."""
    schema = _resolved(schema, defs or {})
    if "enum" in schema or "const" in schema:
        values = [str(value) for value in schema.get("enum", [schema.get("const")])]
        return "one of " + ", ".join(values[:12]) + (", ..." if len(values) > 12 else "")
    if schema.get("anyOf"):
        return " or ".join(_allowed(branch, defs) for branch in schema["anyOf"] if branch.get("type") != "null")
    kind = schema.get("type")
    if kind == "string":
        if "pattern" in schema:
            return PATTERN_WORDS.get(str(schema["pattern"]), "text in the form the parameter's description gives")
        limit = schema.get("maxLength")
        return "text" + (f" of at most {limit} characters" if limit is not None else "")
    if kind in ("integer", "number"):
        return ("a whole number" if kind == "integer" else "a number") + _range(schema)
    if kind == "boolean":
        return "true or false"
    if kind == "array":
        most = schema.get("maxItems")
        return f"a list of {_allowed(schema.get('items', {}), defs)}" + (f" (at most {most})" if most else "")
    return "a JSON object" if kind == "object" else "a value the tool's input schema allows"


def argument_error(tool: str, exc: ValidationError, model: type[BaseModel]) -> GatewayError:
    """The first bad argument (unknown ones first): its field, the problem and the fix, in people's words."""
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    errors.sort(key=lambda error: (error["type"] != "extra_forbidden", error["type"] != "missing"))
    first = errors[0]
    loc = tuple(first["loc"])
    field = _field(loc)
    param = str(loc[0]) if loc else ""
    schema = model.model_json_schema(by_alias=True)
    allowed = _allowed(_schema_at(schema, loc), schema.get("$defs", {}))
    described = _describe(model, param)
    about = f" ({described})" if described else ""
    known = [info.alias or name for name, info in model.model_fields.items()]
    if first["type"] == "extra_forbidden":
        problem = f"is not a parameter of {tool}"
        fix: str | Fix = Fix("remove it; ", ToolRef(tool), f" takes only: {', '.join(known) or 'no arguments'}")
    elif first["type"] == "missing":
        problem = "is required"
        fix = Fix("add ", ParamRef(param), f": {allowed}{about}")
    else:
        problem = _PROBLEMS.get(str(first["type"]), "is not a value this parameter accepts")
        fix = f"send {allowed}{about}"
    others = [name for name in dict.fromkeys(_field(tuple(error["loc"])) for error in errors[1:]) if name != field]
    if others:
        shown = ", ".join(others[:5]) + (", ..." if len(others) > 5 else "")
        problem += f" (also wrong: {shown})"
    return GatewayError("invalid_argument", field, problem, fix)


class GatewayToolError(ToolError):
    """A tool's refusal carrying the gateway's error, so its result can carry the error's shape as data."""

    def __init__(self, error: GatewayError) -> None:
        super().__init__(error.render())
        self.error = error


def error_result(error: GatewayError, **extra: Any) -> CallToolResult:
    """An is_error result: the one line, then the shape (``code``, ``field``, ``problem``, ``fix``) as JSON."""
    shape = {**error.shape("mcp"), **extra}
    return CallToolResult(
        content=[
            TextContent(type="text", text=error.render("mcp")),
            TextContent(type="text", text=json.dumps(shape, ensure_ascii=False, default=str)),
        ],
        is_error=True,
    )


class StrictTool(Tool):
    """A tool whose arguments are validated strictly against a closed model, refused in the gateway's format."""

    @classmethod
    def strict(
        cls, fn: Callable[..., Any], *, annotations: ToolAnnotations, views: tuple[type[BaseModel], ...] = ()
    ) -> StrictTool:
        """Build the tool as the SDK would (``Tool.from_function``), then close and tighten its arguments.

        ``views``: a tool with several views (``tpu_status`` lists, shows one deployment or one command) declares
        them all; its output schema is an object that is one of them, and each result is validated against it."""
        tool = cast(StrictTool, cls.from_function(fn, annotations=annotations))
        loose = tool.fn_metadata
        closed = strict_arguments(loose.arg_model)
        output_model, output_schema = loose.output_model, loose.output_schema
        if views:
            output_model = Union[views]  # noqa: UP007 - a runtime union of the view classes
            output_schema = {"type": "object", **TypeAdapter(output_model).json_schema()}
        tool.fn_metadata = _NoPreParse(
            arg_model=closed,
            output_schema=output_schema,
            output_model=output_model,
            wrap_output=False if views else loose.wrap_output,
        )
        tool.parameters = compact_schema(closed.model_json_schema(by_alias=True))
        tool.description = compact_text(tool.description)
        return tool

    @property
    def enforced_schema(self) -> dict[str, Any]:
        """The full JSON schema the arguments are validated against; ``parameters`` publishes its compact form
        (``tool_schema``), without the patterns and length caps."""
        return self.fn_metadata.arg_model.model_json_schema(by_alias=True)

    async def run(self, arguments: dict[str, Any], context: Context[Any, Any], convert_result: bool = False) -> Any:
        try:
            self.fn_metadata.arg_model.model_validate(arguments)
        except ValidationError as exc:
            return error_result(argument_error(self.name, exc, self.fn_metadata.arg_model))
        try:
            return await super().run(arguments, context, convert_result)
        except UnexpectedToolError:
            raise
        except ToolError as exc:
            # The SDK prefixes a deliberate error with "Error executing tool NAME: "; keep the gateway's one line,
            # and its shape as data when the line is in the gateway's format.
            cause = exc.__cause__
            if isinstance(cause, GatewayToolError):
                return error_result(cause.error)
            if isinstance(cause, ToolError) and not isinstance(cause, UnexpectedToolError):
                parsed = parse_line(str(cause))
                if parsed is not None:
                    return error_result(parsed)
                raise ToolError(str(cause)) from cause
            raise

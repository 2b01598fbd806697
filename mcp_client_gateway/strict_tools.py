"""Closed, strict tool inputs for the MCP server: unknown arguments and loose types are refused, by name.

Why: the SDK builds each tool's argument model from the function signature (``func_metadata``) with pydantic's
defaults: unknown arguments are dropped silently and values are coerced (``true`` becomes ``1`` for a number,
``"5"`` becomes ``5``), and a string holding JSON is parsed into a list or object before validation. A model
steered by injected text should meet a closed door instead, so every tool here is a :class:`StrictTool`:

- the argument model is a subclass of the SDK's with ``extra="forbid"``, ``strict=True`` and
  ``allow_inf_nan=False``; the published ``inputSchema`` is regenerated from it (``additionalProperties:
  false``). ``FuncMetadata``'s fields are documented as read live, and ``Tool`` is public, so this is
  configuration of the SDK's own objects, not a patch of its internals;
- the JSON-in-a-string pre-parse is turned off (``_NoPreParse``): a list is a list, text stays text;
- a refused call is one line in the gateway's error format, naming the argument and the fix
  (``[invalid_argument] ttl_hours: input should be a valid number. Fix: ...``); values are never repeated,
  and an unknown argument's name is shown escaped and cut to 64 characters. The errors the tool body raises
  (``[code] field: ...`` from the core) lose the SDK's "Error executing tool NAME:" prefix, so every
  refusal starts with its code and field.

The MCP server passes the tools to ``MCPServer(tools=...)``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.server.mcpserver.tools import Tool
from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase, FuncMetadata
from mcp.types import ToolAnnotations
from pydantic import BaseModel, ConfigDict, ValidationError

from mcp_client_gateway.errors import GatewayError
from mcp_client_gateway.log_hygiene import clean_text

if TYPE_CHECKING:
    from mcp.server.mcpserver import Context

__all__ = ["StrictTool", "argument_error", "strict_arguments"]

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


def argument_error(tool: str, exc: ValidationError, model: type[BaseModel]) -> str:
    """One line naming the first bad argument (unknown ones first), the problem and the fix."""
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    errors.sort(key=lambda error: (error["type"] != "extra_forbidden", error["type"] != "missing"))
    first = errors[0]
    field = _field(tuple(first["loc"]))
    param = str(first["loc"][0]) if first["loc"] else ""
    known = [info.alias or name for name, info in model.model_fields.items()]
    if first["type"] == "extra_forbidden":
        problem = f"is not a parameter of {tool}"
        fix = f"remove it; {tool} takes only: {', '.join(known) or 'no arguments'}"
    elif first["type"] == "missing":
        problem = "is required"
        fix = f"add {field} ({_describe(model, param)})"
    else:
        message = clean_text(str(first["msg"]), limit=200)[0]
        problem = message[:1].lower() + message[1:]
        fix = f"send {param} as the tool's input schema says ({_describe(model, param)})"
    others = list(dict.fromkeys(_field(tuple(error["loc"])) for error in errors[1:]))
    if others:
        shown = ", ".join(others[:5]) + (", ..." if len(others) > 5 else "")
        problem += f" (also wrong: {shown})"
    return GatewayError("invalid_argument", field, problem, fix).render()


class StrictTool(Tool):
    """A tool whose arguments are validated strictly against a closed model, refused in the gateway's format."""

    @classmethod
    def strict(cls, fn: Callable[..., Any], *, annotations: ToolAnnotations) -> StrictTool:
        """Build the tool as the SDK would (``Tool.from_function``), then close and tighten its arguments."""
        tool = cast(StrictTool, cls.from_function(fn, annotations=annotations))
        loose = tool.fn_metadata
        closed = strict_arguments(loose.arg_model)
        tool.fn_metadata = _NoPreParse(
            arg_model=closed,
            output_schema=loose.output_schema,
            output_model=loose.output_model,
            wrap_output=loose.wrap_output,
        )
        tool.parameters = closed.model_json_schema(by_alias=True)
        return tool

    async def run(self, arguments: dict[str, Any], context: Context[Any, Any], convert_result: bool = False) -> Any:
        try:
            self.fn_metadata.arg_model.model_validate(arguments)
        except ValidationError as exc:
            raise ToolError(argument_error(self.name, exc, self.fn_metadata.arg_model)) from None
        try:
            return await super().run(arguments, context, convert_result)
        except UnexpectedToolError:
            raise
        except ToolError as exc:
            # The SDK prefixes a deliberate error with "Error executing tool NAME: "; keep the gateway's one line.
            cause = exc.__cause__
            if isinstance(cause, ToolError) and not isinstance(cause, UnexpectedToolError):
                raise ToolError(str(cause)) from cause
            raise

"""The compact input schema a tool publishes: what the model needs to fill in the arguments, nothing more.

Why (issue #23): every client sends each tool's ``inputSchema`` to its model on every turn, so its size is paid in
tokens on every request. pydantic's schema carries a lot the model does not use. ``compact_schema`` keeps the
structure (``type``, ``properties``, ``required``, ``items``, ``enum``/``const``, ``additionalProperties: false``,
``$defs``/``$ref``, ``description`` and a meaningful ``default``) and drops:

- every ``title`` (pydantic's "Deployment Id" restates the property's name);
- the nullable wrapper of an optional argument: ``anyOf: [X, {type: null}]`` becomes ``X``, and its ``default:
  null`` goes too (an optional argument is simply one not ``required``; the server still accepts ``null``);
- the validation-only keywords ``pattern``, ``minLength``/``maxLength``, ``minItems``/``maxItems`` and the
  numeric bounds (``minimum``, ``maximum`` and their exclusive forms): regular expressions and caps the model
  seldom needs to get a call right, since the parameter's description says the form in words and a value out
  of range is refused with the range in words ("send a number from 1 to 168"). The server still enforces all of
  them: the arguments are validated strictly against the full schema of the argument model
  (``StrictTool.enforced_schema``), and a refusal names the field and the fix in people's words ("send a zone
  name like us-east5-b", ``strict_tools.argument_error``).

The published schema is therefore looser than the enforced one, with one exception: an explicit ``null`` for an
optional argument, which the server takes as "left out", is not in it; the model leaves the argument out instead.
Anything else it refuses, the server refuses too.
"""

from __future__ import annotations

from typing import Any

__all__ = ["VALIDATION_ONLY", "compact_schema", "compact_text"]

VALIDATION_ONLY = frozenset(
    {
        "pattern",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
    }
)
_NULL = {"type": "null"}
_DATA = frozenset({"default", "enum", "const", "examples", "required"})


def compact_text(text: str | None) -> str:
    """``text`` on one line: a docstring's indentation and line breaks are spaces the model would be sent."""
    return " ".join((text or "").split())


def compact_schema(schema: Any) -> Any:
    """``schema`` without titles, nullable wrappers, ``default: null`` and validation-only keywords (a new object)."""
    if isinstance(schema, list):
        return [compact_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    node = _without_null_branch(schema)
    compact: dict[str, Any] = {}
    for key, value in node.items():
        if (
            key in VALIDATION_ONLY
            or (key == "title" and isinstance(value, str))
            or (key == "default" and value is None)
        ):
            continue
        if key in _DATA:
            compact[key] = value  # values, not schemas: copied as they are
        elif key in ("properties", "$defs") and isinstance(value, dict):
            compact[key] = {name: compact_schema(sub) for name, sub in value.items()}  # names, not keywords
        elif key == "description" and isinstance(value, str):
            compact[key] = compact_text(value)
        else:
            compact[key] = compact_schema(value)
    return compact


def _without_null_branch(node: dict[str, Any]) -> dict[str, Any]:
    """``{anyOf: [X, {type: null}], ...}`` as ``{...X, ...}``; any other node unchanged."""
    branches = node.get("anyOf")
    if not isinstance(branches, list) or _NULL not in branches:
        return node
    rest = [branch for branch in branches if branch != _NULL]
    if len(rest) != 1 or not isinstance(rest[0], dict):
        return node
    merged = {key: value for key, value in node.items() if key != "anyOf"}
    for key, value in rest[0].items():
        merged.setdefault(key, value)  # the outer description and default win over the branch's
    return merged

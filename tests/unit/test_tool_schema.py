"""The compact input schema a tool publishes (``tool_schema``): smaller, never stricter than the enforced one."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import pytest
from jsonschema import Draft202012Validator
from pydantic import BaseModel, ConfigDict, Field

from mcp_client_gateway.tool_schema import VALIDATION_ONLY, compact_schema, compact_text


class _Item(BaseModel):
    model_config = ConfigDict(extra="forbid")

    size: int = Field(description="How big.", ge=1, le=8)


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")

    deployment_id: str = Field(description="Deployment id.", pattern=r"^[a-z][-a-z0-9]{0,38}[a-z0-9]$", max_length=40)
    tier: Literal["spot", "on_demand"] = Field("spot", description="Capacity tier.")
    hedge: Annotated[int | None, Field(description="Outstanding requests.", ge=1, le=4)] = None
    zones: Annotated[list[Annotated[str, Field(max_length=40)]] | None, Field(description="Zones.", max_length=32)] = (
        None
    )
    items: list[_Item] | None = Field(None, description="Items.")


def _walk(node: Any) -> list[dict[str, Any]]:
    if isinstance(node, dict):
        return [node, *(found for value in node.values() for found in _walk(value))]
    if isinstance(node, list):
        return [found for value in node for found in _walk(value)]
    return []


FULL = _Args.model_json_schema()
COMPACT = compact_schema(FULL)


def test_an_optional_argument_is_its_type_without_the_null_branch_or_the_null_default() -> None:
    hedge = COMPACT["properties"]["hedge"]
    assert hedge == {"description": "Outstanding requests.", "type": "integer"}  # bounds: enforced, not published
    assert COMPACT["properties"]["zones"]["type"] == "array"
    assert COMPACT["properties"]["items"]["items"] == {"$ref": "#/$defs/_Item"}


def test_titles_and_validation_only_keywords_are_gone_everywhere() -> None:
    for node in _walk(COMPACT):
        assert not isinstance(node.get("title"), str), node
        assert not VALIDATION_ONLY & set(node), node
        assert "anyOf" not in node, node
        assert node.get("default", "unset") is not None, node


def test_the_structure_the_model_needs_stays() -> None:
    assert COMPACT["additionalProperties"] is False
    assert COMPACT["required"] == ["deployment_id"]
    assert COMPACT["properties"]["tier"] == {
        "default": "spot",
        "description": "Capacity tier.",
        "enum": ["spot", "on_demand"],
        "type": "string",
    }
    assert COMPACT["$defs"]["_Item"]["additionalProperties"] is False
    assert COMPACT["$defs"]["_Item"]["properties"]["size"] == {"description": "How big.", "type": "integer"}
    assert FULL["properties"]["hedge"]["anyOf"], "compacting returns a new object; the model's schema is untouched"


GOOD = [
    {"deployment_id": "gemma-a"},
    {"deployment_id": "gemma-a", "tier": "on_demand", "hedge": 2, "zones": ["us-east5-b"], "items": [{"size": 3}]},
]
BAD_FOR_BOTH = [
    {},
    {"deployment_id": "gemma-a", "surprise": 1},
    {"deployment_id": "gemma-a", "tier": "reserved"},
    {"deployment_id": "gemma-a", "hedge": "2"},
    {"deployment_id": "gemma-a", "items": [{"size": 3, "colour": "red"}]},
]


@pytest.mark.parametrize("arguments", GOOD)
def test_the_published_schema_accepts_what_the_full_one_accepts(arguments: dict[str, Any]) -> None:
    assert Draft202012Validator(FULL).is_valid(arguments)
    assert Draft202012Validator(COMPACT).is_valid(arguments)


@pytest.mark.parametrize("arguments", BAD_FOR_BOTH)
def test_the_published_schema_still_refuses_wrong_names_types_choices_and_ranges(arguments: dict[str, Any]) -> None:
    assert not Draft202012Validator(FULL).is_valid(arguments)
    assert not Draft202012Validator(COMPACT).is_valid(arguments)


def test_a_value_out_of_range_is_refused_by_the_enforced_schema_alone() -> None:
    """Numeric bounds are not published (they cost tokens on every turn); the server refuses the value and words the
    range (``strict_tools.argument_error``)."""
    arguments = {"deployment_id": "gemma-a", "hedge": 9}
    assert not Draft202012Validator(FULL).is_valid(arguments)
    assert Draft202012Validator(COMPACT).is_valid(arguments)


def test_an_explicit_null_is_the_one_thing_only_the_enforced_schema_admits() -> None:
    """The server takes ``null`` as "left out"; the published schema says so by not requiring the argument."""
    arguments = {"deployment_id": "gemma-a", "hedge": None, "zones": None}
    assert Draft202012Validator(FULL).is_valid(arguments)
    assert not Draft202012Validator(COMPACT).is_valid(arguments)
    assert _Args.model_validate(arguments).hedge is None


def test_a_property_named_like_a_keyword_is_kept() -> None:
    schema = {"type": "object", "properties": {"title": {"type": "string", "title": "Title"}, "pattern": {}}}
    assert compact_schema(schema) == {"type": "object", "properties": {"title": {"type": "string"}, "pattern": {}}}


def test_a_docstring_becomes_one_line() -> None:
    assert compact_text("Start a deployment.\n            Returns command_id.  ") == (
        "Start a deployment. Returns command_id."
    )
    assert compact_text(None) == ""

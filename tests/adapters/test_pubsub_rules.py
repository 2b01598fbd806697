"""The Pub/Sub rules both buses share: the filter language subset and message checks, including fuzzing."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.adapters._pubsub_rules import (
    MAX_ATTRIBUTE_VALUE_BYTES,
    check_message,
    check_resource_name,
    parse_filter,
)

Attributes = Mapping[str, str]


@dataclass(frozen=True)
class Expression:
    """A filter as text plus the meaning it should have, built side by side."""

    text: str
    meaning: Callable[[Attributes], bool]
    compound: bool = False

    def grouped(self) -> str:
        return f"({self.text})" if self.compound else self.text


KEYS = ("kind", "zone", "tag")
VALUES = ("deployment.create", "us-east5-b", "", 'quote"d', "back\\slash")


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _equals(key: str, value: str) -> Expression:
    return Expression(f"attributes.{key} = {_quoted(value)}", lambda attributes: attributes.get(key) == value)


def _has(key: str) -> Expression:
    return Expression(f"attributes:{key}", lambda attributes: key in attributes)


def _negated(inner: Expression) -> Expression:
    return Expression(f"NOT {inner.grouped()}", lambda attributes: not inner.meaning(attributes))


def _joined(operator: str, parts: list[Expression]) -> Expression:
    text = f" {operator} ".join(part.grouped() for part in parts)
    combine = all if operator == "AND" else any
    return Expression(text, lambda attributes: combine(part.meaning(attributes) for part in parts), compound=True)


leaves = st.one_of(
    st.builds(_equals, st.sampled_from(KEYS), st.sampled_from(VALUES)),
    st.builds(_has, st.sampled_from(KEYS)),
)
expressions = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.builds(_negated, children),
        st.builds(_joined, st.sampled_from(["AND", "OR"]), st.lists(children, min_size=2, max_size=3)),
    ),
    max_leaves=6,
)
attribute_sets = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=3)


@settings(max_examples=1500, deadline=None)
@given(expression=expressions, attributes=attribute_sets)
def test_a_parsed_filter_means_what_it_says(expression: Expression, attributes: dict[str, str]) -> None:
    if len(expression.text.encode()) > 256:
        with pytest.raises(ValueError, match=r"filter: .* bytes"):
            parse_filter(expression.text)
        return
    parsed = parse_filter(expression.text)

    assert parsed is not None
    assert parsed.matches(attributes) == expression.meaning(attributes)


FILTER_PIECES = ["attributes", ".", ":", "=", "!=", "(", ")", "AND", "OR", "NOT", "and", "kind", '"x"', '"', "\\", ","]


@settings(max_examples=3000, deadline=None)
@given(text=st.one_of(st.text(max_size=80), st.lists(st.sampled_from(FILTER_PIECES), max_size=12).map(" ".join)))
def test_any_text_either_parses_or_is_rejected_with_a_value_error(text: str) -> None:
    try:
        parsed = parse_filter(text)
    except ValueError as exc:
        assert str(exc).startswith("filter: ")
        return
    if parsed is not None:
        parsed.matches({"kind": "x"})


def test_no_filter_and_a_blank_filter_mean_every_message() -> None:
    assert parse_filter(None) is None
    assert parse_filter("   ") is None


def test_not_binds_tighter_than_and() -> None:
    parsed = parse_filter('NOT attributes:tag AND attributes.kind = "a"')

    assert parsed is not None
    assert parsed.matches({"kind": "a"})
    assert not parsed.matches({"kind": "a", "tag": "t"})
    assert not parsed.matches({})


@pytest.mark.parametrize("name", ["abc", "tpuctl-commands", "a.b_c~d+e%f", "x" * 255])
def test_valid_resource_names_pass(name: str) -> None:
    assert check_resource_name("topic", name) == name


@pytest.mark.parametrize("name", ["ab", "1abc", "goog-topic", "with space", "x" * 256, "slash/name", ""])
def test_invalid_resource_names_are_refused_naming_the_field(name: str) -> None:
    with pytest.raises(ValueError, match=r"^subscription: .* is not a valid Pub/Sub name"):
        check_resource_name("subscription", name)


@pytest.mark.parametrize(
    ("data", "attributes", "ordering_key", "message"),
    [
        ("text", {}, None, "data: must be bytes"),
        (b"x", {"": "v"}, None, "attributes: key '' must be a non-empty string"),
        (b"x", {"googKey": "v"}, None, "attributes.googKey: keys starting with 'goog' are reserved"),
        (b"x", {"k": "v" * (MAX_ATTRIBUTE_VALUE_BYTES + 1)}, None, "attributes.k: value is 1025 bytes"),
        (b"x", {f"k{i}": "v" for i in range(101)}, None, "attributes: 101 attributes"),
        (b"x", {"k": "v"}, "k" * 1025, "ordering_key: longer than 1024 bytes"),
        (b"x" * (10 * 1024 * 1024), {"k": "v"}, None, "data: message is 10485762 bytes"),
    ],
)
def test_bad_messages_are_refused_naming_the_field(
    data: bytes, attributes: dict[str, str], ordering_key: str | None, message: str
) -> None:
    with pytest.raises(ValueError, match=r"^" + message.replace("(", r"\(")):
        check_message(data, attributes, ordering_key)


def test_a_message_with_only_attributes_is_accepted() -> None:
    check_message(b"", {"kind": "reconcile.tick"}, "gemma-a")

"""Pub/Sub's rules for names, messages and subscription filters, shared by both command buses.

``LocalBus`` and ``PubSubBus`` check input with the same functions, so a topic name, an attribute or a
filter that the embedded bus accepts is one that Google Cloud accepts too, and bad input fails before it
reaches either back end, with a ``ValueError`` that names the field and the fix.

Filters are a strict subset of the Pub/Sub filter language::

    attributes.KEY = "VALUE"      the attribute is present and equal to VALUE
    attributes:KEY                the attribute is present
    NOT <expr>                    negation
    <expr> AND <expr> ...         all of them
    <expr> OR <expr> ...          any of them
    ( <expr> )                    grouping; AND and OR may not be mixed without parentheses

KEY is an identifier (letters, digits, underscore; not starting with a digit); VALUE is a double-quoted
string with ``\\"`` and ``\\\\`` escapes. Keywords are upper case, as in Pub/Sub.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "MAX_ATTRIBUTES",
    "MAX_ATTRIBUTE_KEY_BYTES",
    "MAX_ATTRIBUTE_VALUE_BYTES",
    "MAX_FILTER_BYTES",
    "MAX_MESSAGE_BYTES",
    "MAX_ORDERING_KEY_BYTES",
    "RESERVED_ATTRIBUTE_KEYS",
    "AttributeFilter",
    "check_max_delivery_attempts",
    "check_message",
    "check_resource_name",
    "parse_filter",
]

MAX_ATTRIBUTES = 100
MAX_ATTRIBUTE_KEY_BYTES = 256
MAX_ATTRIBUTE_VALUE_BYTES = 1024
MAX_ORDERING_KEY_BYTES = 1024
MAX_MESSAGE_BYTES = 10 * 1024 * 1024
MAX_FILTER_BYTES = 256
MIN_DELIVERY_ATTEMPTS = 5
MAX_DELIVERY_ATTEMPTS = 100

# google-cloud-pubsub takes attributes as keyword arguments of ``publish(topic, data, ordering_key, retry,
# timeout, **attrs)``: these keys would collide with its parameters, so neither bus accepts them.
RESERVED_ATTRIBUTE_KEYS = frozenset({"topic", "data", "ordering_key", "retry", "timeout"})

_RESOURCE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9\-_.~+%]{2,254}")


def check_resource_name(field: str, name: str) -> str:
    """A topic or subscription short name as Pub/Sub accepts it; returns it unchanged."""
    if not isinstance(name, str) or not _RESOURCE_NAME.fullmatch(name) or name.lower().startswith("goog"):
        raise ValueError(
            f"{field}: {name!r} is not a valid Pub/Sub name (use 3-255 characters: a letter first, then letters, "
            "digits or - _ . ~ + %; not starting with 'goog')"
        )
    return name


def check_max_delivery_attempts(value: int) -> int:
    """Pub/Sub's dead-letter policy allows 5 to 100 attempts; the local bus keeps the same bounds."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not MIN_DELIVERY_ATTEMPTS <= value <= MAX_DELIVERY_ATTEMPTS
    ):
        raise ValueError(
            f"max_delivery_attempts: {value!r} is out of range "
            f"(use an integer from {MIN_DELIVERY_ATTEMPTS} to {MAX_DELIVERY_ATTEMPTS}, as Pub/Sub requires)"
        )
    return value


def check_message(data: bytes, attributes: Mapping[str, str], ordering_key: str | None) -> None:
    """Reject a message Pub/Sub would reject (or that the client library would mangle)."""
    if not isinstance(data, bytes | bytearray):
        raise ValueError(f"data: must be bytes, got {type(data).__name__} (encode text with .encode('utf-8'))")
    if not isinstance(attributes, Mapping):
        raise ValueError(f"attributes: must be a mapping of str to str, got {type(attributes).__name__}")
    if len(attributes) > MAX_ATTRIBUTES:
        raise ValueError(f"attributes: {len(attributes)} attributes (at most {MAX_ATTRIBUTES} are allowed)")
    size = len(data)
    for key, value in attributes.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"attributes: key {key!r} must be a non-empty string")
        if not isinstance(value, str):
            raise ValueError(f"attributes.{key}: value must be a string, got {type(value).__name__}")
        if key in RESERVED_ATTRIBUTE_KEYS:
            raise ValueError(
                f"attributes.{key}: the key is reserved by the Pub/Sub client "
                f"(do not use {', '.join(sorted(RESERVED_ATTRIBUTE_KEYS))})"
            )
        if key.lower().startswith("goog"):
            raise ValueError(f"attributes.{key}: keys starting with 'goog' are reserved by Pub/Sub")
        key_bytes, value_bytes = len(key.encode()), len(value.encode())
        if key_bytes > MAX_ATTRIBUTE_KEY_BYTES:
            raise ValueError(f"attributes.{key[:40]}...: key is {key_bytes} bytes (at most {MAX_ATTRIBUTE_KEY_BYTES})")
        if value_bytes > MAX_ATTRIBUTE_VALUE_BYTES:
            raise ValueError(f"attributes.{key}: value is {value_bytes} bytes (at most {MAX_ATTRIBUTE_VALUE_BYTES})")
        size += key_bytes + value_bytes
    if not data and not attributes:
        raise ValueError("data: a message needs non-empty data or at least one attribute")
    if size > MAX_MESSAGE_BYTES:
        raise ValueError(f"data: message is {size} bytes with its attributes (at most {MAX_MESSAGE_BYTES})")
    if ordering_key is not None:
        if not isinstance(ordering_key, str):
            raise ValueError(f"ordering_key: must be a string, got {type(ordering_key).__name__}")
        if len(ordering_key.encode()) > MAX_ORDERING_KEY_BYTES:
            raise ValueError(f"ordering_key: longer than {MAX_ORDERING_KEY_BYTES} bytes")


# --- filters -----------------------------------------------------------------------------------------------

_FILTER_HELP = 'supported: attributes.KEY = "VALUE", attributes:KEY, NOT, AND, OR and parentheses'


@dataclass(frozen=True)
class _HasKey:
    key: str

    def matches(self, attributes: Mapping[str, str]) -> bool:
        return self.key in attributes


@dataclass(frozen=True)
class _Equals:
    key: str
    value: str

    def matches(self, attributes: Mapping[str, str]) -> bool:
        return attributes.get(self.key) == self.value


@dataclass(frozen=True)
class _Not:
    inner: _Node

    def matches(self, attributes: Mapping[str, str]) -> bool:
        return not self.inner.matches(attributes)


@dataclass(frozen=True)
class _All:
    parts: tuple[_Node, ...]

    def matches(self, attributes: Mapping[str, str]) -> bool:
        return all(part.matches(attributes) for part in self.parts)


@dataclass(frozen=True)
class _Any:
    parts: tuple[_Node, ...]

    def matches(self, attributes: Mapping[str, str]) -> bool:
        return any(part.matches(attributes) for part in self.parts)


_Node = _HasKey | _Equals | _Not | _All | _Any


@dataclass(frozen=True)
class AttributeFilter:
    """A parsed subscription filter; ``text`` is what the user wrote, ``matches`` decides delivery."""

    text: str
    root: _Node

    def matches(self, attributes: Mapping[str, str]) -> bool:
        return self.root.matches(attributes)


@dataclass(frozen=True)
class _Token:
    kind: str  # IDENT KEYWORD STRING DOT COLON EQ LPAREN RPAREN END
    text: str
    position: int


_PUNCTUATION = {".": "DOT", ":": "COLON", "=": "EQ", "(": "LPAREN", ")": "RPAREN"}
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KEYWORDS = frozenset({"AND", "OR", "NOT"})


def _filter_error(text: str, position: int, problem: str) -> ValueError:
    return ValueError(f"filter: {problem} at position {position} in {text!r} ({_FILTER_HELP})")


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char.isspace():
            index += 1
        elif char in _PUNCTUATION:
            tokens.append(_Token(_PUNCTUATION[char], char, index))
            index += 1
        elif char == "!" and text.startswith("!=", index):
            raise _filter_error(text, index, "'!=' is not supported (write NOT attributes.KEY = \"VALUE\")")
        elif char == '"':
            start, index, chars = index, index + 1, []
            while True:
                if index >= len(text):
                    raise _filter_error(text, start, "unterminated string")
                if text[index] == "\\":
                    if index + 1 >= len(text) or text[index + 1] not in '"\\':
                        raise _filter_error(text, index, 'only \\" and \\\\ escapes are allowed in a string')
                    chars.append(text[index + 1])
                    index += 2
                elif text[index] == '"':
                    index += 1
                    break
                else:
                    chars.append(text[index])
                    index += 1
            tokens.append(_Token("STRING", "".join(chars), start))
        elif match := _IDENTIFIER.match(text, index):
            word = match.group()
            kind = "KEYWORD" if word in _KEYWORDS else "IDENT"
            if kind == "IDENT" and word.upper() in _KEYWORDS:
                raise _filter_error(text, index, f"keyword {word!r} must be upper case ({word.upper()})")
            if kind == "IDENT" and text[match.end() :].lstrip().startswith("("):
                raise _filter_error(text, index, f"functions such as {word}() are not supported")
            tokens.append(_Token(kind, word, index))
            index = match.end()
        else:
            raise _filter_error(text, index, f"unexpected character {char!r}")
    tokens.append(_Token("END", "", len(text)))
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokenize(text)
        self.index = 0

    @property
    def current(self) -> _Token:
        return self.tokens[self.index]

    def take(self, kind: str, what: str) -> _Token:
        token = self.current
        if token.kind != kind:
            found = "the end of the filter" if token.kind == "END" else repr(token.text)
            raise _filter_error(self.text, token.position, f"expected {what}, found {found}")
        self.index += 1
        return token

    def parse(self) -> _Node:
        node = self.expression()
        if self.current.kind != "END":
            raise _filter_error(self.text, self.current.position, f"unexpected {self.current.text!r}")
        return node

    def expression(self) -> _Node:
        parts = [self.term()]
        operator: str | None = None
        while self.current.kind == "KEYWORD" and self.current.text in ("AND", "OR"):
            token = self.current
            if operator is not None and token.text != operator:
                raise _filter_error(
                    self.text, token.position, "AND and OR cannot be mixed without parentheses (group with ( ))"
                )
            operator = token.text
            self.index += 1
            parts.append(self.term())
        if operator is None:
            return parts[0]
        return _All(tuple(parts)) if operator == "AND" else _Any(tuple(parts))

    def term(self) -> _Node:
        token = self.current
        if token.kind == "KEYWORD" and token.text == "NOT":
            self.index += 1
            return _Not(self.term())
        if token.kind == "LPAREN":
            self.index += 1
            node = self.expression()
            self.take("RPAREN", "')'")
            return node
        return self.predicate()

    def predicate(self) -> _Node:
        token = self.current
        if token.kind != "IDENT" or token.text != "attributes":
            found = "the end of the filter" if token.kind == "END" else repr(token.text)
            raise _filter_error(self.text, token.position, f"expected 'attributes', NOT or '(', found {found}")
        self.index += 1
        if self.current.kind == "COLON":
            self.index += 1
            return _HasKey(self.take("IDENT", "an attribute key").text)
        self.take("DOT", "'.' or ':' after 'attributes'")
        key = self.take("IDENT", "an attribute key").text
        self.take("EQ", f"'=' after attributes.{key}")
        return _Equals(key, self.take("STRING", 'a double-quoted value like "VALUE"').text)


def parse_filter(text: str | None) -> AttributeFilter | None:
    """Parse a subscription filter strictly; ``None`` or blank means "every message"."""
    if text is None:
        return None
    if not isinstance(text, str):
        raise ValueError(f"filter: must be a string, got {type(text).__name__}")
    if not text.strip():
        return None
    if len(text.encode()) > MAX_FILTER_BYTES:
        raise ValueError(f"filter: {len(text.encode())} bytes (Pub/Sub allows at most {MAX_FILTER_BYTES})")
    return AttributeFilter(text, _Parser(text).parse())

"""The part of Cloud Logging's query language the local Cloud Logging stand-in understands, and nothing else.

Why: ``entries:list`` takes a filter, and a stand-in that matched everything on a filter it did not understand would
let a wrong filter pass every test. Understood, as Google documents the language:

* comparisons ``FIELD OP VALUE`` with ``=``, ``!=``, ``<``, ``<=``, ``>``, ``>=`` and ``:`` (has: a substring;
  ``FIELD:*`` tests presence), values quoted (``"..."`` with backslash escapes) or bare words;
* fields ``severity`` (names or numbers, ordered), ``timestamp`` (RFC 3339, ordered), ``logName``, ``insertId``,
  ``textPayload``, ``resource.type``, ``resource.labels.K``, ``labels.K``, ``jsonPayload.K[.K...]``; a key may be
  quoted (``labels."tpuctl-deployment"``);
* ``AND`` (or juxtaposition), ``OR``, ``NOT`` and parentheses, with Google's precedence: NOT, then OR, then AND
  (``a OR b AND c`` is ``(a OR b) AND c``).

String comparisons ignore case, as Google's do. A comparison on a field an entry lacks is false (so is ``!=``);
``NOT`` of it is true. Anything else (regular expressions, global restrictions, functions, value lists, other
fields) raises :class:`FilterError` naming the part, which the stand-in answers as 400 ``INVALID_ARGUMENT``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

__all__ = ["SEVERITY_NUMBERS", "FilterError", "Matcher", "compile_filter", "parse_time_ns"]

SEVERITY_NUMBERS = {
    "DEFAULT": 0,
    "DEBUG": 100,
    "INFO": 200,
    "NOTICE": 300,
    "WARNING": 400,
    "ERROR": 500,
    "CRITICAL": 600,
    "ALERT": 700,
    "EMERGENCY": 800,
}
_MAX_FILTER = 20_000
_TOKEN = re.compile(
    r'\s*(?:(?P<quoted>"(?:[^"\\]|\\.)*")|(?P<op>>=|<=|!=|=~|!~|[=<>:])|(?P<paren>[()])|(?P<word>[^\s()"=<>!:~]+))'
)
_SEGMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:?\d\d)$", re.IGNORECASE)
_ORDERED = frozenset({"<", "<=", ">", ">=", "=", "!="})
_STRING_OPS = frozenset({"=", "!=", ":"})

Matcher = Callable[[Mapping[str, Any]], bool]


class FilterError(ValueError):
    """A filter this stand-in does not understand; the message names the part."""


@dataclass(frozen=True)
class _Token:
    kind: str  # quoted, op, paren, word, end
    text: str
    column: int


def parse_time_ns(text: str) -> int | None:
    """RFC 3339 (``Z`` or an offset, ``+00:00`` or ``+0000``; up to nine fraction digits) in nanoseconds, or None."""
    match = _TIME.match(text.strip())
    if match is None:
        return None
    whole, fraction, zone = match.groups()
    try:
        offset = "+00:00" if zone.upper() == "Z" else f"{zone[:3]}:{zone[-2:]}"  # the client sends +0000
        moment = datetime.fromisoformat(whole + offset)
    except ValueError:
        return None
    return int(moment.timestamp()) * 1_000_000_000 + int((fraction or "0").ljust(9, "0"))


def compile_filter(text: str) -> Matcher:
    """A predicate over stored entries (Google's JSON shape); an empty filter matches everything."""
    if len(text) > _MAX_FILTER:
        raise FilterError(f"the filter is {len(text)} characters long; at most {_MAX_FILTER}")
    parser = _Parser(_tokens(text))
    if parser.peek().kind == "end":
        return lambda _entry: True
    matcher = parser.conjunction()
    if parser.peek().kind != "end":
        raise parser.unsupported(parser.peek(), "unexpected here")
    return matcher


def _tokens(text: str) -> list[_Token]:
    tokens, position = [], 0
    while position < len(text):
        if not text[position:].strip():
            break
        match = _TOKEN.match(text, position)
        if match is None or match.end() == position:
            raise FilterError(f"unsupported filter at column {position + 1}: {text[position : position + 30]!r}")
        kind = str(match.lastgroup)
        tokens.append(_Token(kind, match.group(kind), match.start(kind) + 1))
        position = match.end()
    tokens.append(_Token("end", "", len(text) + 1))
    return tokens


class _Parser:
    """Recursive descent over the tokens: conjunction > disjunction > negation > primary."""

    def __init__(self, tokens: list[_Token]) -> None:
        self._tokens, self._at = tokens, 0

    def peek(self, ahead: int = 0) -> _Token:
        return self._tokens[min(self._at + ahead, len(self._tokens) - 1)]

    def take(self) -> _Token:
        token = self.peek()
        self._at += 1
        return token

    def unsupported(self, token: _Token, why: str) -> FilterError:
        shown = token.text or "the end of the filter"
        return FilterError(f"unsupported filter at column {token.column}: {shown!r}: {why}")

    def conjunction(self) -> Matcher:
        parts = [self.disjunction()]
        while self.peek().kind != "end" and self.peek().text != ")":
            if self.peek().text == "AND":
                self.take()
            parts.append(self.disjunction())
        return parts[0] if len(parts) == 1 else (lambda entry: all(part(entry) for part in parts))

    def disjunction(self) -> Matcher:
        parts = [self.negation()]
        while self.peek().text == "OR":
            self.take()
            parts.append(self.negation())
        return parts[0] if len(parts) == 1 else (lambda entry: any(part(entry) for part in parts))

    def negation(self) -> Matcher:
        if self.peek().text == "NOT":
            self.take()
            inner = self.negation()
            return lambda entry: not inner(entry)
        return self.primary()

    def primary(self) -> Matcher:
        token = self.peek()
        if token.text == "(":
            self.take()
            inner = self.conjunction()
            if self.take().text != ")":
                raise self.unsupported(token, "this parenthesis is never closed")
            return inner
        if token.kind not in ("word", "quoted") or token.text in ("AND", "OR", "NOT", ")"):
            raise self.unsupported(token, "a comparison (FIELD OP VALUE) was expected")
        path = self.path()
        op = self.take()
        if op.kind != "op":
            raise self.unsupported(token, "a bare term (a global restriction or a function) is not supported")
        value = self.take()
        if value.kind not in ("word", "quoted") or value.text in ("AND", "OR", "NOT"):
            raise self.unsupported(value, "a value list or expression on the right of an operator is not supported")
        return _comparison(path, token, op, _unquote(value.text), self)

    def path(self) -> list[str]:
        token = self.take()
        segments = _segments(token, self)
        while segments and segments[-1] == "" and self.peek().kind == "quoted":  # labels."k-v"
            segments[-1] = _unquote(self.take().text)
            if self.peek().kind == "word" and self.peek().text.startswith("."):
                segments += _segments(self.take(), self)[1:]
        return segments


def _segments(token: _Token, parser: _Parser) -> list[str]:
    if token.kind == "quoted":
        return [_unquote(token.text)]
    segments = token.text.split(".")
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if not _SEGMENT.match(segment) and not (segment == "" and (last or index == 0)):
            raise parser.unsupported(token, "not a field path")
    return segments


def _unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return re.sub(r"\\(.)", r"\1", text[1:-1])
    return text


def _comparison(path: list[str], field: _Token, op: _Token, value: str, parser: _Parser) -> Matcher:
    if op.text in ("=~", "!~"):
        raise parser.unsupported(op, "regular expressions are not supported")
    name = ".".join(path)
    if path == ["severity"]:
        return _ordered(op, _severity_value(value, op, parser), _severity_of, parser)
    if path == ["timestamp"]:
        moment = parse_time_ns(value)
        if moment is None:
            raise parser.unsupported(op, f"timestamp: {value!r} is not an RFC 3339 time")
        return _ordered(op, moment, _time_of, parser)
    getter = _string_field(path)
    if getter is None:
        raise parser.unsupported(field, f"the field {name!r} is not supported")
    if op.text not in _STRING_OPS:
        raise parser.unsupported(op, f"{name} takes =, != or : here")
    return _string_match(op.text, value, getter)


def _severity_value(value: str, op: _Token, parser: _Parser) -> int:
    if value.isdigit():
        return int(value)
    if value.upper() not in SEVERITY_NUMBERS:
        raise parser.unsupported(op, f"severity: {value!r} is not a severity ({', '.join(SEVERITY_NUMBERS)})")
    return SEVERITY_NUMBERS[value.upper()]


def _severity_of(entry: Mapping[str, Any]) -> int | None:
    return SEVERITY_NUMBERS.get(str(entry.get("severity") or "DEFAULT"))


def _time_of(entry: Mapping[str, Any]) -> int | None:
    return parse_time_ns(str(entry.get("timestamp") or ""))


def _ordered(op: _Token, wanted: int, getter: Callable[[Mapping[str, Any]], int | None], parser: _Parser) -> Matcher:
    if op.text not in _ORDERED:
        raise parser.unsupported(op, "this field takes =, !=, <, <=, > or >=")
    compare: dict[str, Callable[[int], bool]] = {
        "=": lambda have: have == wanted,
        "!=": lambda have: have != wanted,
        "<": lambda have: have < wanted,
        "<=": lambda have: have <= wanted,
        ">": lambda have: have > wanted,
        ">=": lambda have: have >= wanted,
    }
    test = compare[op.text]

    def match(entry: Mapping[str, Any]) -> bool:
        have = getter(entry)
        return have is not None and test(have)

    return match


def _string_field(path: list[str]) -> Callable[[Mapping[str, Any]], Any] | None:
    top = {"logName", "insertId", "textPayload"}
    if len(path) == 1 and path[0] in top:
        return lambda entry: entry.get(path[0])
    if path == ["resource", "type"]:
        return lambda entry: (entry.get("resource") or {}).get("type")
    if len(path) == 3 and path[:2] == ["resource", "labels"]:
        return lambda entry: ((entry.get("resource") or {}).get("labels") or {}).get(path[2])
    if len(path) == 2 and path[0] == "labels":
        return lambda entry: (entry.get("labels") or {}).get(path[1])
    if len(path) >= 2 and path[0] == "jsonPayload" and all(path[1:]):
        return lambda entry: _dig(entry.get("jsonPayload"), path[1:])
    return None


def _dig(value: Any, keys: list[str]) -> Any:
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def _string_match(op: str, wanted: str, getter: Callable[[Mapping[str, Any]], Any]) -> Matcher:
    folded = wanted.casefold()

    def match(entry: Mapping[str, Any]) -> bool:
        have = getter(entry)
        if have is None or isinstance(have, dict | list):
            return False
        text = str(have).casefold()
        if op == ":":
            return wanted == "*" or folded in text
        return (text == folded) == (op == "=")

    return match

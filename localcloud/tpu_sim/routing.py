"""Table-driven routing for the simulator's HTTP fronts (``server.py``, ``compute_wire.py``).

A route table is a declarative list of rows ``(method, path pattern, endpoint name, handler)``; every handler
is a small named function. :func:`compile_routes` turns the rows into :class:`Route` tuples (which still
unpack as ``method, pattern, name, handler``) and :func:`find_route` picks the one that answers a request.

Precedence: rows are tried in table order and the first row whose method equals the request's method and
whose pattern ``re.match``-es the path wins. Patterns are anchored with ``^`` and end in ``$`` (which, as
``re`` defines it, also matches before one trailing newline); callers keep that behaviour by keeping their
patterns as they are. A request no row answers is the caller's to refuse, in its own error envelope.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Generic, NamedTuple, TypeVar

__all__ = ["Route", "compile_routes", "find_route"]

H = TypeVar("H")


class Route(NamedTuple, Generic[H]):
    """One compiled row of a route table."""

    method: str
    pattern: re.Pattern[str]
    endpoint: str  # the name fault injection and call counters use
    handler: H


def compile_routes(table: Sequence[tuple[str, str, str, H]]) -> list[Route[H]]:
    """Compile a declarative table, keeping its order (the matching precedence)."""
    return [Route(method, re.compile(pattern), endpoint, handler) for method, pattern, endpoint, handler in table]


def find_route(routes: Sequence[Route[H]], method: str, path: str) -> tuple[Route[H], dict[str, str]] | None:
    """The first route for ``method`` whose pattern matches ``path``, with the named groups; None if none does."""
    for route in routes:
        if route.method != method:
            continue
        match = route.pattern.match(path)
        if match is not None:
            return route, match.groupdict()
    return None

"""The domain never parses provider error text: zone memory and the back-end split read the fields the
adapter set (``CloudFailure.scope``, ``quota_id``, ``location``), and ``learn`` is a table over every class.

The source check is an AST walk, not a grep: a message may be carried (``reason=failure.message``) but not
looked into (no ``re``, no ``in`` test, no ``.lower()``, no slicing, no ``str(exc)``).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from pathlib import Path

import pytest

from shared.domain import backends, zone_memory
from shared.domain.errors import ErrorClass, ErrorScope
from shared.domain.zone_memory import CloudFailure

DOMAIN_MODULES = {module.__name__: Path(inspect.getfile(module)) for module in (zone_memory, backends)}
_TEXT_ATTRIBUTES = frozenset({"message", "args", "error_message"})
_TEXT_CALLS = frozenset({"str", "repr", "format"})


def _is_text_call(node: ast.Call) -> bool:
    """``str(x)``, ``repr(x)``, ``format(x)`` of anything but a literal."""
    return (
        isinstance(node.func, ast.Name)
        and node.func.id in _TEXT_CALLS
        and any(not isinstance(arg, ast.Constant) for arg in node.args)
    )


def text_parsing(source: str) -> list[str]:
    """Where ``source`` looks into error text: one line per finding, empty when it only carries it."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(alias.name == "re" for alias in node.names):
            found.append(f"line {node.lineno}: imports re")
        elif isinstance(node, ast.ImportFrom) and node.module == "re":
            found.append(f"line {node.lineno}: imports from re")
        elif isinstance(node, ast.Attribute) and node.attr in _TEXT_ATTRIBUTES and isinstance(node.ctx, ast.Load):
            if not isinstance(parents.get(node), ast.keyword):  # only ``name=x.message`` (carried as it is)
                found.append(f"line {node.lineno}: reads .{node.attr} other than to pass it on")
        elif isinstance(node, ast.Call) and _is_text_call(node):
            found.append(f"line {node.lineno}: {ast.unparse(node)}: the text of a value (an exception's?)")
    return found


@pytest.mark.parametrize("name", sorted(DOMAIN_MODULES))
def test_the_domain_module_never_looks_into_error_text(name: str) -> None:
    assert text_parsing(DOMAIN_MODULES[name].read_text()) == []


@pytest.mark.parametrize(
    "snippet",
    [
        'if "unknown zone" in failure.message.lower():\n    pass',
        "import re\nmatch = re.search(r'in zone (\\S+)', text)",
        "from re import search",
        "text = failure.message\nhead = text[:10]",
        "words = str(exc).split()",
        'denied = "denied" in error.args[0]',
        "key = f'unsupported/{failure.message}'",
    ],
)
def test_the_check_catches_text_parsing(snippet: str) -> None:
    assert text_parsing(textwrap.dedent(snippet)) != []


def test_carrying_the_message_as_a_reason_is_allowed() -> None:
    assert text_parsing("entry = _entry(key, reason=failure.message)\nfailure = F(message=error.message)") == []


def test_learn_has_a_row_for_every_error_class() -> None:
    assert set(zone_memory._LESSONS) == set(ErrorClass)


def test_learn_and_its_lessons_are_small_functions() -> None:
    for name, value in vars(zone_memory).items():
        if inspect.isfunction(value) and value.__module__ == zone_memory.__name__:
            lines, _ = inspect.getsourcelines(value)
            assert len(lines) <= 50, f"{name} is {len(lines)} lines"


def test_a_failure_written_before_the_scope_existed_still_loads_and_the_scope_round_trips() -> None:
    old = {"error_class": "unsupported", "message": "m", "quota_id": None, "location": None, "code": 400}
    assert CloudFailure(**{**old, "error_class": ErrorClass(old["error_class"]), "surfaced": "sync"}).scope is None
    fields = dataclasses.asdict(CloudFailure(ErrorClass.UNSUPPORTED, "m", scope=ErrorScope.TIER))
    assert fields["scope"] == "tier"
    assert CloudFailure(**{**fields, "scope": ErrorScope(fields["scope"])}).scope is ErrorScope.TIER

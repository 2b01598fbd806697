"""What a packaged function can import, found statically: the closure of its imports, lazy ones included.

A Cloud Function installs only its own ``requirements.txt``. ``import main`` alone would miss the
imports that ``shared.wiring`` makes inside functions (the SDK clients are built lazily), so this
walks the AST of ``main.py`` and every project module it reaches, following imports wherever they
appear (module level or inside a function), except under ``if TYPE_CHECKING:``. The result is
the list of project modules to import in a clean venv and the third-party modules they name.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ImportClosure", "import_closure"]


@dataclass
class ImportClosure:
    """Project modules reachable from an entry file, and the outside modules they import."""

    project_modules: set[str] = field(default_factory=set)
    external_modules: set[str] = field(default_factory=set)

    @property
    def external_top_levels(self) -> set[str]:
        return {name.split(".", 1)[0] for name in self.external_modules}


def _module_file(root: Path, dotted: str) -> Path | None:
    base = root.joinpath(*dotted.split("."))
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, current: str, is_package: bool) -> list[str]:
    """Dotted names imported anywhere in ``tree`` (``from a import b`` yields a and a.b)."""
    names: list[str] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = current.split(".")
                anchor = parts if is_package else parts[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)] if node.level > 1 else anchor
                module = ".".join([*anchor, node.module] if node.module else anchor)
            else:
                module = node.module or ""
            names.append(module)
            names.extend(f"{module}.{alias.name}" for alias in node.names if alias.name != "*")
        stack.extend(ast.iter_child_nodes(node))
    return names


def import_closure(root: Path, entry: str = "main") -> ImportClosure:
    """Follow imports from ``root/<entry>.py`` through the project modules under ``root``."""
    closure = ImportClosure()
    local_tops = {p.stem for p in root.glob("*.py")} | {p.name for p in root.iterdir() if (p / "__init__.py").is_file()}
    pending = [entry]
    while pending:
        dotted = pending.pop()
        if dotted in closure.project_modules:
            continue
        path = _module_file(root, dotted)
        if path is None:
            continue  # a name imported from a module (a class or function), not a module itself
        closure.project_modules.add(dotted)
        parent = dotted.rsplit(".", 1)[0] if "." in dotted else None
        if parent:
            pending.append(parent)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for name in _imports(tree, dotted, path.name == "__init__.py"):
            top = name.split(".", 1)[0]
            if not top or top == "__future__" or top in sys.stdlib_module_names:
                continue
            if top in local_tops:
                pending.append(name)
            else:
                closure.external_modules.add(name)
    return closure

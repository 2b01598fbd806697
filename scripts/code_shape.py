"""The shape of the code a newcomer reads: long modules, long functions, import cycles.

Run ``python scripts/code_shape.py`` (add ``--list`` for the offenders by name). docs/architecture.md quotes its
output before and after each reorganisation, and ``tests/unit/test_code_shape.py`` holds the limits.
Counts cover our packages' non-test code; a function's length is its source lines, decorators and docstring
included. Declarative tables (a module-level assignment) are not functions and are not counted.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("shared", "functions", "mcp_client_gateway", "localcloud", "node_agent", "loadgen", "benchmarks", "scripts")
MODULE_LIMIT = 800
FUNCTION_LIMIT = 80
FUNCTION_WARN = 40


@dataclass(frozen=True)
class Shape:
    modules: dict[str, int]  # path -> lines
    functions: dict[str, int]  # path:qualified name -> lines
    cycles: list[tuple[str, ...]]

    def long_modules(self, limit: int = MODULE_LIMIT) -> dict[str, int]:
        return {name: lines for name, lines in self.modules.items() if lines > limit}

    def long_functions(self, limit: int = FUNCTION_LIMIT) -> dict[str, int]:
        return {name: lines for name, lines in self.functions.items() if lines > limit}


def source_files(root: Path = ROOT) -> Iterator[Path]:
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if "__pycache__" not in path.parts:
                yield path


def _functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, int]]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            yield f"{prefix}{node.name}", (node.end_lineno or node.lineno) - start + 1
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")


def import_cycles(root: Path = ROOT) -> list[tuple[str, ...]]:
    """Strongly connected groups of modules (imports at any depth, lazy ones included) among our packages."""
    import grimp

    sys.path.insert(0, str(root))
    graph = grimp.build_graph(*PACKAGES[:-1], cache_dir=None, exclude_type_checking_imports=True)
    modules = sorted(graph.modules)
    edges = {m: graph.find_modules_directly_imported_by(m) for m in modules}
    return _strongly_connected(modules, edges)


def _strongly_connected(nodes: list[str], edges: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """Tarjan's algorithm, iterative; groups of more than one module only (package ``__init__`` edges included)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[tuple[str, ...]] = []
    counter = 0
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(tuple(sorted(group)))
    return sorted(found)


def measure(root: Path = ROOT, *, cycles: bool = True) -> Shape:
    modules: dict[str, int] = {}
    functions: dict[str, int] = {}
    for path in source_files(root):
        text = path.read_text(encoding="utf-8")
        name = str(path.relative_to(root))
        modules[name] = len(text.splitlines())
        for qualified, lines in _functions(ast.parse(text)):
            functions[f"{name}:{qualified}"] = lines
    return Shape(modules, functions, import_cycles(root) if cycles else [])


def report(shape: Shape, *, listing: bool) -> str:
    lines = [
        f"modules: {len(shape.modules)}, lines: {sum(shape.modules.values())}",
        f"modules over {MODULE_LIMIT} lines: {len(shape.long_modules())}",
        f"functions over {FUNCTION_WARN} lines: {len(shape.long_functions(FUNCTION_WARN))}",
        f"functions over {FUNCTION_LIMIT} lines: {len(shape.long_functions())}",
        f"import cycles: {len(shape.cycles)}",
    ]
    if listing:
        lines += [f"  {n} lines  {name}" for name, n in sorted(shape.long_modules().items(), key=lambda x: -x[1])]
        lines += [f"  {n} lines  {name}" for name, n in sorted(shape.long_functions().items(), key=lambda x: -x[1])]
        lines += ["  cycle: " + " <-> ".join(group) for group in shape.cycles]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="name every module, function and cycle over a limit")
    parser.add_argument("--root", type=Path, default=ROOT, help="another checkout (to count a past commit)")
    args = parser.parse_args(argv)
    print(report(measure(args.root.resolve()), listing=args.list))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

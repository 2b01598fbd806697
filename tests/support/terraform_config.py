"""The Terraform tree parsed with python-hcl2, for structure tests that run without a terraform binary.

python-hcl2 8 keeps quotes and adds ``__is_block__`` markers by default; the serialization options
below give plain dicts (docs/reference/gcp-local.md §7). Every expression comes back as a ``"${...}"`` string, so
references are found with a small scanner over those strings, and ``${local.X}`` can be resolved
where X is itself a plain string (enough for filters and names built from other locals).

Parsing the whole tree takes a few seconds the first time (grammar build), so it is cached.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

import hcl2
from hcl2.utils import SerializationOptions

__all__ = [
    "REPO_ROOT",
    "TERRAFORM_ROOT",
    "ModuleDir",
    "Reference",
    "expressions",
    "find_references",
    "iter_values",
    "load_module",
    "load_tree",
    "parse_file",
    "resolve_locals",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
TERRAFORM_ROOT = REPO_ROOT / "terraform"

_OPTIONS = SerializationOptions(strip_string_quotes=True, explicit_blocks=False, with_comments=False)
_BLOCK_KINDS = ("resource", "data", "module", "variable", "output", "locals", "terraform", "provider")


@dataclass
class ModuleDir:
    """One Terraform module (a folder of .tf files) as plain dicts."""

    path: Path
    resources: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    data: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    modules: dict[str, dict[str, Any]] = field(default_factory=dict)
    variables: dict[str, dict[str, Any]] = field(default_factory=dict)
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    locals: dict[str, Any] = field(default_factory=dict)
    terraform: list[dict[str, Any]] = field(default_factory=list)
    files: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.path.relative_to(TERRAFORM_ROOT).as_posix()

    def resources_of(self, type_name: str) -> dict[str, dict[str, Any]]:
        """Resources of one type, by name."""
        return {name: body for (kind, name), body in self.resources.items() if kind == type_name}

    def module_source(self, call: str) -> ModuleDir:
        """The module a ``module "call"`` block points at."""
        source = self.modules[call]["source"]
        return load_module((self.path / source).resolve())


def parse_file(path: Path) -> dict[str, Any]:
    """One .tf (or .tfvars) file as plain dicts; raises with the file name on a syntax error."""
    try:
        parsed = hcl2.loads(path.read_text(encoding="utf-8"), serialization_options=_OPTIONS)
    except Exception as exc:  # python-hcl2 raises lark errors of several classes
        raise AssertionError(f"{path.relative_to(REPO_ROOT)}: not valid HCL: {exc}") from exc
    return dict(parsed)


@cache
def load_module(path: Path) -> ModuleDir:
    """Parse every .tf file directly in ``path``."""
    module = ModuleDir(path=path)
    for tf in sorted(path.glob("*.tf")):
        parsed = parse_file(tf)
        module.files[tf.name] = parsed
        unknown = set(parsed) - set(_BLOCK_KINDS)
        if unknown:
            raise AssertionError(f"{tf}: unexpected top-level blocks {sorted(unknown)}")
        for entry in parsed.get("resource", []):
            for type_name, named in entry.items():
                for name, body in named.items():
                    module.resources[(type_name, name)] = body
        for entry in parsed.get("data", []):
            for type_name, named in entry.items():
                for name, body in named.items():
                    module.data[(type_name, name)] = body
        for entry in parsed.get("module", []):
            module.modules.update(entry)
        for entry in parsed.get("variable", []):
            module.variables.update(entry)
        for entry in parsed.get("output", []):
            module.outputs.update(entry)
        for entry in parsed.get("locals", []):
            module.locals.update(entry)
        module.terraform.extend(parsed.get("terraform", []))
    return module


@lru_cache(maxsize=1)
def load_tree() -> tuple[ModuleDir, ...]:
    """Every module folder under terraform/ (modules/* and envs/*)."""
    folders = sorted({tf.parent for tf in TERRAFORM_ROOT.rglob("*.tf") if ".terraform" not in tf.parts})
    return tuple(load_module(folder) for folder in folders)


def iter_values(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Every leaf value with a dotted path (lists index with [i])."""
    if isinstance(value, Mapping):
        for key, inner in value.items():
            yield from iter_values(inner, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from iter_values(inner, f"{path}[{index}]")
    else:
        yield path, value


def expressions(text: str) -> list[str]:
    """The bodies of ``${...}`` interpolations in ``text`` (``$${`` is an escaped literal)."""
    found: list[str] = []
    index = 0
    while True:
        start = text.find("${", index)
        if start < 0:
            return found
        if start > 0 and text[start - 1] == "$":
            index = start + 2
            continue
        depth, cursor, quoted = 0, start + 1, False
        while cursor < len(text):
            char = text[cursor]
            if char == '"' and text[cursor - 1] != "\\":
                quoted = not quoted
            elif not quoted and char == "{":
                depth += 1
            elif not quoted and char == "}":
                depth -= 1
                if depth == 0:
                    break
            cursor += 1
        found.append(text[start + 2 : cursor])
        index = cursor + 1


@dataclass(frozen=True)
class Reference:
    """A reference found in an expression: kind is var, local, module, data or resource."""

    kind: str
    target: tuple[str, ...]
    text: str


_REFERENCE = re.compile(
    r"(?<![\w.\-\"/])(?:"
    r"(?P<kind>var|local)\.(?P<name>[A-Za-z_][\w-]*)"
    r"|module\.(?P<module>[A-Za-z_][\w-]*)(?:\[[^\]]*\])?(?:\.(?P<output>[A-Za-z_][\w-]*))?"
    r"|data\.(?P<dtype>[a-z][a-z0-9_]*)\.(?P<dname>[A-Za-z_][\w-]*)"
    r"|(?P<rtype>google_[a-z0-9_]+)\.(?P<rname>[A-Za-z_][\w-]*)"
    r")"
)


def _strip_string_literals(expression: str) -> str:
    """Blank out quoted literals but keep nested ${...} inside them (they are expressions too)."""
    out: list[str] = []
    index, quoted = 0, False
    while index < len(expression):
        char = expression[index]
        if char == '"' and (index == 0 or expression[index - 1] != "\\"):
            quoted = not quoted
            out.append(" ")
        elif quoted and expression.startswith("${", index):
            inner = expressions(expression[index:])
            body = inner[0] if inner else ""
            out.append(" " + body + " ")
            index += len(body) + 3
            continue
        else:
            out.append(" " if quoted else char)
        index += 1
    return "".join(out)


def find_references(value: Any) -> list[Reference]:
    """References to variables, locals, modules, data sources and google_* resources in ``value``."""
    references = []
    for _, leaf in iter_values(value):
        if not isinstance(leaf, str):
            continue
        for expression in expressions(leaf):
            for match in _REFERENCE.finditer(_strip_string_literals(expression)):
                if match.group("kind"):
                    references.append(Reference(match.group("kind"), (match.group("name"),), match.group(0)))
                elif match.group("module"):
                    target = (match.group("module"),) + ((match.group("output"),) if match.group("output") else ())
                    references.append(Reference("module", target, match.group(0)))
                elif match.group("dtype"):
                    references.append(Reference("data", (match.group("dtype"), match.group("dname")), match.group(0)))
                else:
                    references.append(
                        Reference("resource", (match.group("rtype"), match.group("rname")), match.group(0))
                    )
    return references


_LOCAL_ONLY = re.compile(r"\$\{local\.([A-Za-z_][\w-]*)\}")


def resolve_locals(text: str, module: ModuleDir, depth: int = 0) -> str:
    """Replace ``${local.X}`` where X is a plain string local (recursively); leave other expressions."""
    if depth > 10:
        raise AssertionError(f"{module.name}: locals refer to each other in a loop: {text}")

    def replace(match: re.Match[str]) -> str:
        value = module.locals.get(match.group(1))
        if not isinstance(value, str):
            return match.group(0)
        return resolve_locals(value, module, depth + 1)

    return _LOCAL_ONLY.sub(replace, text)

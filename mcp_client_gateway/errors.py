"""``GatewayError``: the one error shape of the gateway (code, field, problem, fix), worded per interface.

One line ``[code] field: problem. Fix: ...`` everywhere, and the same four as a mapping (``shape``) for
results an agent reads. The fix may refer to a tool, a parameter or a confirmation (``ToolRef``, ``ParamRef``,
``ConfirmRef``, inside a ``Fix``), worded for the interface that shows it by ``interface_words``:
``tpu_status`` and ``confirm='TOKEN'`` over MCP, ``tpuctl status`` and ``--confirm ID`` on the
command line. A fix given as plain text is worded for the CLI by the same table (``interface_words.cli_text``).

Kept in its own module so the core, its argument bounds (``bounds``) and the confirmation tokens
(``confirmation``) raise the same error without importing each other in a circle. ``core`` re-exports it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mcp_client_gateway import interface_words
from mcp_client_gateway.interface_words import Interface
from mcp_client_gateway.models import ErrorCode

if TYPE_CHECKING:
    from mcp_client_gateway.confirmation import ConfirmationRequest

__all__ = ["ConfirmRef", "Fix", "GatewayError", "Interface", "ParamRef", "ToolRef", "Words", "parse_line"]


@dataclass(frozen=True)
class ToolRef:
    """A tool to call, with the arguments known: ``tpu_status(deployment_id='a')`` / ``tpuctl status a``."""

    tool: str
    arguments: tuple[tuple[str, str], ...] = ()

    def words(self, interface: Interface) -> str:
        if interface == "cli":
            return interface_words.cli_call(self.tool, dict(self.arguments))
        inside = ", ".join(f"{name}='{value}'" for name, value in self.arguments)
        return f"{self.tool}({inside})" if inside else self.tool


@dataclass(frozen=True)
class ParamRef:
    """A parameter, optionally with its value: ``ttl_hours=24`` / ``--ttl-hours 24``."""

    name: str
    value: str | None = None

    def words(self, interface: Interface) -> str:
        if interface == "cli":
            flag = interface_words.param_flag(self.name) or "--" + self.name.replace("_", "-")
            return flag if self.value is None else f"{flag} {self.value}"
        return self.name if self.value is None else f"{self.name}='{self.value}'"


@dataclass(frozen=True)
class ConfirmRef:
    """How to confirm: over MCP, call ``tool`` again with the token; on the CLI, run the command naming the target
    (``--confirm`` takes the target's name there; the CLI fetches the token itself)."""

    tool: str
    target: str
    token: str
    positional: tuple[tuple[str, str], ...] = ()

    def words(self, interface: Interface) -> str:
        if interface == "cli":
            command = interface_words.cli_call(self.tool, dict(self.positional))
            return f"run {command} --confirm {self.target} (or pass --yes)"
        return f"call again with confirm='{self.token}'"


@dataclass(frozen=True)
class Words:
    """Plain text that differs per interface (``cli`` empty: the CLI needs no such words)."""

    mcp: str
    cli: str = ""

    def words(self, interface: Interface) -> str:
        return self.cli if interface == "cli" else self.mcp


class Fix:
    """A fix made of text and references, worded per interface."""

    def __init__(self, *parts: str | ToolRef | ParamRef | ConfirmRef | Words) -> None:
        self.parts = parts

    def words(self, interface: Interface) -> str:
        return "".join(part if isinstance(part, str) else part.words(interface) for part in self.parts)

    def __repr__(self) -> str:
        return f"Fix{self.parts!r}"


class GatewayError(Exception):
    """A problem the caller can act on: a code, the field at fault, what is wrong and how to fix it.

    ``fix`` is plain text or a ``Fix`` with references; ``self.fix`` is always the MCP wording (a string), and
    ``fix_words("cli")`` the command line's. A refusal for want of confirmation carries ``confirmation``: the
    impact and the token that confirms it.
    """

    def __init__(
        self,
        code: ErrorCode,
        field: str | None,
        problem: str,
        fix: str | Fix = "",
        *,
        retry_after_s: float | None = None,
        confirmation: ConfirmationRequest | None = None,
    ) -> None:
        self.code = code
        self.field = field
        self.problem = problem
        self.fix_parts = fix if isinstance(fix, Fix) else Fix(fix)
        self.fix = self.fix_parts.words("mcp")
        self.retry_after_s = retry_after_s
        self.confirmation = confirmation
        super().__init__(self.render())

    def fix_words(self, interface: Interface = "mcp") -> str:
        """The fix for ``interface``; plain text is worded for the CLI by ``interface_words.cli_text``."""
        if interface == "mcp":
            return self.fix
        return interface_words.cli_text(self.fix_parts.words("cli"))

    def problem_words(self, interface: Interface = "mcp") -> str:
        return interface_words.cli_text(self.problem) if interface == "cli" else self.problem

    def render(self, interface: Interface = "mcp") -> str:
        """``[code] field: problem. Fix: fix (retry after N s)``, worded for ``interface``."""
        where = f"{self.field}: " if self.field else ""
        text = f"[{self.code}] {where}{self.problem_words(interface)}"
        fix = self.fix_words(interface)
        if fix:
            text += f". Fix: {fix}"
        if self.retry_after_s is not None:
            text += f" (retry after {self.retry_after_s:g} s)"
        return text

    def shape(self, interface: Interface = "mcp") -> dict[str, Any]:
        """The error as data: ``code``, ``field``, ``problem``, ``fix`` (and ``retry_after_s`` when known)."""
        shape: dict[str, Any] = {
            "code": self.code,
            "field": self.field,
            "problem": self.problem_words(interface),
            "fix": self.fix_words(interface),
        }
        if self.retry_after_s is not None:
            shape["retry_after_s"] = self.retry_after_s
        return shape


_LINE = re.compile(
    r"^\[(?P<code>[a-z_]+)\] (?:(?P<field>[^\s:]+): )?(?P<problem>.*?)(?:\. Fix: (?P<fix>.*?))?"
    r"(?: \(retry after (?P<retry>[0-9.e+-]+) s\))?$",
    re.DOTALL,
)


def parse_line(line: str) -> GatewayError | None:
    """The error a ``[code] field: problem. Fix: ...`` line says (None when it is not one): for tool errors raised
    as text by code that had no ``GatewayError`` at hand, so their result carries the shape too."""
    match = _LINE.match(line)
    if match is None:
        return None
    retry = match["retry"]
    try:
        retry_after_s = float(retry) if retry else None
    except ValueError:
        retry_after_s = None
    code: Any = match["code"]
    return GatewayError(code, match["field"], match["problem"], match["fix"] or "", retry_after_s=retry_after_s)

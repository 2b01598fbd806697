"""``GatewayError``: a problem the caller can act on, rendered as one line ``[code] field: problem. Fix: ...``.

Kept in its own module so the core, its argument bounds (``bounds``) and the confirmation tokens
(``confirmation``) raise the same error without importing each other in a circle. ``core`` re-exports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mcp_client_gateway.models import ErrorCode

if TYPE_CHECKING:
    from mcp_client_gateway.confirmation import ConfirmationRequest

__all__ = ["GatewayError"]


class GatewayError(Exception):
    """A problem the caller can act on: a code, the field at fault, what is wrong and how to fix it.

    A refusal for want of confirmation carries ``confirmation``: the impact and the token that confirms it.
    """

    def __init__(
        self,
        code: ErrorCode,
        field: str | None,
        problem: str,
        fix: str = "",
        *,
        retry_after_s: float | None = None,
        confirmation: ConfirmationRequest | None = None,
    ) -> None:
        self.code = code
        self.field = field
        self.problem = problem
        self.fix = fix
        self.retry_after_s = retry_after_s
        self.confirmation = confirmation
        super().__init__(self.render())

    def render(self) -> str:
        where = f"{self.field}: " if self.field else ""
        text = f"[{self.code}] {where}{self.problem}"
        if self.fix:
            text += f". Fix: {self.fix}"
        if self.retry_after_s is not None:
            text += f" (retry after {self.retry_after_s:g} s)"
        return text

"""The secret tool: store the Hugging Face token (never echoed); replacing a different one is confirmed.

No ``from __future__ import annotations`` here: the SDK reads these signatures at registration.
"""

from typing import Annotated, Any

from mcp.server.mcpserver import Context, Elicit, ElicitationResult, Resolve
from mcp.types import CallToolResult
from pydantic import Field

from mcp_client_gateway import bounds
from mcp_client_gateway.confirmation import ConfirmationRequest
from mcp_client_gateway.core import GatewayError
from mcp_client_gateway.models import SecretSaved
from mcp_client_gateway.strict_tools import GatewayToolError
from mcp_client_gateway.tools.common import (
    ConfirmationRefused,
    ConfirmForm,
    ToolSet,
    annotations,
    run,
    supports_elicitation,
    token_to_use,
    tool_result,
)

__all__ = ["register"]


def register(tools: ToolSet) -> None:
    """``tpu_save_hf_token`` (not served read-only)."""
    core = tools.core

    def token_replacement(token: str, ctx: Context) -> ConfirmationRequest | None:
        """With elicitation and a different token stored: the impact and a token, minted before asking."""
        if not supports_elicitation(ctx):
            return None
        try:
            return core.hf_token_confirmation(token)
        except GatewayError as exc:
            raise GatewayToolError(exc) from None

    def ask_token_replacement(request: Annotated[ConfirmationRequest | None, Resolve(token_replacement)]) -> Any:
        if request is None:
            return None
        name = request.target
        return Elicit(f"A Hugging Face token is already stored in '{name}'. Type '{name}' to replace it.", ConfirmForm)

    if not tools.read_only:

        @tools.tool(
            annotations=annotations(
                "Save the Hugging Face token", read_only=False, destructive=True, idempotent=True, open_world=True
            )
        )
        async def tpu_save_hf_token(
            token: Annotated[
                str,
                Field(
                    description="A Hugging Face token (hf_...).",
                    max_length=bounds.HF_TOKEN_CHARS,
                ),
            ],
            confirmation: Annotated[ConfirmationRequest | None, Resolve(token_replacement)],
            answer: Annotated[ElicitationResult[ConfirmForm], Resolve(ask_token_replacement)],
            confirm: Annotated[
                str | None,
                Field(description="Token from the refusal, once the user agreed.", max_length=bounds.CONFIRM_CHARS),
            ] = None,
        ) -> Annotated[CallToolResult, SecretSaved]:
            """Store the Hugging Face token for gated weights; never shown or logged. `tpuctl token set` keeps it
            away from the model."""
            confirmed = token_to_use(confirmation, answer, confirm)
            try:
                saved = await run(lambda: core.save_hf_token(token, confirm=confirmed))
            except ConfirmationRefused as refused:
                return refused.result
            verb = "Replaced" if saved.replaced else "Unchanged" if saved.version == "unchanged" else "Stored"
            return tool_result(saved, f"{verb} the Hugging Face token in secret {saved.name} ({saved.version}).")

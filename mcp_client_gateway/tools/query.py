"""``tpu_query``: the deployed model, live. With a prompt, one timed chat request; without, the deep health check.

No ``from __future__ import annotations`` here: the SDK reads these signatures at registration.
"""

from typing import Annotated

from mcp.types import CallToolResult
from pydantic import Field

from mcp_client_gateway import bounds
from mcp_client_gateway.models import HealthReport, QueryResult
from mcp_client_gateway.tools.common import DeploymentIdArg, ToolSet, annotations, run, tool_result

__all__ = ["register"]


def register(tools: ToolSet) -> None:
    """``tpu_query`` (read-only: it changes nothing, but talks to the deployment)."""
    core = tools.core

    @tools.tool(
        annotations=annotations("Query or check", read_only=True, destructive=False, idempotent=False, open_world=True),
        views=(QueryResult, HealthReport),
    )
    async def tpu_query(
        deployment_id: DeploymentIdArg,
        prompt: Annotated[
            str | None,
            Field(description="User message; none: health check.", min_length=1, max_length=bounds.PROMPT_CHARS),
        ] = None,
        max_tokens: Annotated[
            int, Field(description="Most tokens to generate.", ge=bounds.MAX_TOKENS[0], le=bounds.MAX_TOKENS[1])
        ] = 256,
        temperature: Annotated[float, Field(ge=bounds.TEMPERATURE[0], le=bounds.TEMPERATURE[1])] = 0.0,
        system_prompt: Annotated[str | None, Field(max_length=bounds.SYSTEM_PROMPT_CHARS)] = None,
    ) -> CallToolResult:
        """A SERVING deployment. prompt: one timed chat (TTFT, tok/s). None: a deep health check."""
        if prompt is None:
            report = await run(lambda: core.check_health(deployment_id))
            failing = [c.name for c in report.checks if not c.ok]
            verdict = "healthy" if report.healthy else "unhealthy (" + ", ".join(failing) + ")"
            return tool_result(report, f"{deployment_id} is {verdict}.")
        result = await run(
            lambda: core.query_model(
                deployment_id,
                prompt=prompt,
                max_tokens=max_tokens,
                temperature=temperature,
                system_prompt=system_prompt,
            )
        )
        ttft = f"{result.ttft_ms:.0f} ms" if result.ttft_ms is not None else "n/a"
        rate = f"{result.decode_tokens_per_s} tok/s" if result.decode_tokens_per_s is not None else "n/a"
        note = f" {result.note}." if result.note else ""
        return tool_result(result, f"{result.completion_tokens} tokens, TTFT {ttft}, decode {rate}.{note}")

"""Tools on the deployed model, live: one timed query, a deep health check.

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
    """``tpu_query_model``, ``tpu_check_health``."""
    _register_query(tools)
    _register_health(tools)


def _register_query(tools: ToolSet) -> None:
    core = tools.core

    @tools.tool(
        annotations=annotations(
            "Query the deployed model", read_only=True, destructive=False, idempotent=False, open_world=True
        )
    )
    async def tpu_query_model(
        deployment_id: DeploymentIdArg,
        prompt: Annotated[str, Field(description="The user message.", min_length=1, max_length=bounds.PROMPT_CHARS)],
        max_tokens: Annotated[
            int, Field(description="Most tokens to generate.", ge=bounds.MAX_TOKENS[0], le=bounds.MAX_TOKENS[1])
        ] = 256,
        temperature: Annotated[
            float, Field(description="Sampling temperature.", ge=bounds.TEMPERATURE[0], le=bounds.TEMPERATURE[1])
        ] = 0.0,
        system_prompt: Annotated[
            str | None, Field(description="Optional system message.", max_length=bounds.SYSTEM_PROMPT_CHARS)
        ] = None,
    ) -> Annotated[CallToolResult, QueryResult]:
        """Send one chat request to a SERVING deployment and time it: time to first token, total time, tokens
        and tokens per second (up to 30 s)."""
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


def _register_health(tools: ToolSet) -> None:
    core = tools.core

    @tools.tool(
        annotations=annotations(
            "Deep health check", read_only=True, destructive=False, idempotent=True, open_world=True
        )
    )
    async def tpu_check_health(deployment_id: DeploymentIdArg) -> Annotated[CallToolResult, HealthReport]:
        """Check a deployment end to end now: /health, /v1/models, /version, a one-token completion with its
        latency, and the monitor's phase."""
        report = await run(lambda: core.check_health(deployment_id))
        failing = [c.name for c in report.checks if not c.ok]
        verdict = "healthy" if report.healthy else "unhealthy (" + ", ".join(failing) + ")"
        return tool_result(report, f"{deployment_id} is {verdict}.")

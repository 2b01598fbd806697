"""``tpu_status``: the deployments, one deployment's dashboard, or where a command is, in one read tool.

Why one tool: every client sends the tool list to its model on every turn (issue #23), and the three reads share
their purpose ("where are things?"); which one is meant follows from the id given.

No ``from __future__ import annotations`` here: the SDK reads these signatures at registration.
"""

from typing import Annotated

import anyio
from mcp.server.mcpserver import Context
from mcp.types import CallToolResult
from pydantic import Field

from mcp_client_gateway import bounds
from mcp_client_gateway.core import GatewayCore, GatewayError
from mcp_client_gateway.models import DeploymentDetail, DeploymentList, OperationView
from mcp_client_gateway.strict_tools import GatewayToolError
from mcp_client_gateway.tools.common import (
    UUID_PATTERN,
    OptionalDeploymentIdArg,
    ToolSet,
    annotations,
    run,
    tool_result,
)

__all__ = ["register"]

PAGE_SIZE = 20


def register(tools: ToolSet) -> None:
    """``tpu_status`` (read-only)."""
    core = tools.core

    @tools.tool(
        annotations=annotations("Status", read_only=True, destructive=False, idempotent=True, open_world=False),
        views=(DeploymentList, DeploymentDetail, OperationView),
    )
    async def tpu_status(
        ctx: Context,
        deployment_id: OptionalDeploymentIdArg = None,
        command_id: Annotated[str | None, Field(description="A command's id.", pattern=UUID_PATTERN)] = None,
        wait_seconds: Annotated[
            int,
            Field(description="command_id: wait this long for a change.", ge=bounds.WAIT_SECONDS[0], le=5),
        ] = 0,
        include_deleted: Annotated[bool, Field(description="List: also deleted ones.")] = False,
        offset: Annotated[
            int, Field(description="List: skip (next_offset).", ge=bounds.LIST_OFFSET[0], le=bounds.LIST_OFFSET[1])
        ] = 0,
    ) -> CallToolResult:
        """No id: the deployments. deployment_id: its dashboard (phase, resources, attempts, SLIs, findings, boot,
        spend). command_id: its progress; call until done."""
        if command_id is not None and deployment_id is not None:
            raise GatewayToolError(
                GatewayError("invalid_argument", "command_id", "goes alone", "give deployment_id or command_id")
            )
        if command_id is not None:
            return await _operation(core, ctx, command_id, wait_seconds)
        if deployment_id is not None:
            detail = await run(lambda: core.get_deployment(deployment_id))
            where = f" in {detail.zone} ({detail.tier})" if detail.zone else ""
            summary = f"{detail.deployment_id}: {detail.phase}{where}; endpoint {detail.endpoint or 'none'}."
            return tool_result(detail, summary)
        page = await run(lambda: core.list_deployments(include_deleted=include_deleted, offset=offset, limit=PAGE_SIZE))
        names = ", ".join(f"{d.deployment_id} ({d.phase})" for d in page.deployments) or "none"
        return tool_result(page, f"{page.total} deployment(s): {names}.")


async def _operation(core: GatewayCore, ctx: Context, command_id: str, wait_seconds: int) -> CallToolResult:
    """The command's view, waiting up to ``wait_seconds`` for its stage, status or end to change."""
    view = await run(lambda: core.get_operation(command_id))
    waited = 0.0
    while not view.done and waited < wait_seconds:
        await ctx.report_progress(waited, float(wait_seconds), view.stage)
        await anyio.sleep(0.5)
        waited += 0.5
        latest = await run(lambda: core.get_operation(command_id))
        changed = (latest.stage, latest.status, latest.done) != (view.stage, view.status, view.done)
        view = latest
        if changed:
            break
    return tool_result(view, f"{view.kind or 'command'} {view.status}: {view.stage}" + (" (done)" if view.done else ""))

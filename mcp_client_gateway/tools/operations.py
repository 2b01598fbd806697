"""Read tools over deployments and commands: the list, one deployment's dashboard, where a command is.

No ``from __future__ import annotations`` here: the SDK reads these signatures at registration.
"""

from typing import Annotated

import anyio
from mcp.server.mcpserver import Context
from mcp.types import CallToolResult
from pydantic import Field

from mcp_client_gateway import bounds
from mcp_client_gateway.models import DeploymentDetail, DeploymentList, OperationView
from mcp_client_gateway.tools.common import (
    UUID_PATTERN,
    DeploymentIdArg,
    PhaseChoice,
    ToolSet,
    annotations,
    run,
    tool_result,
)

__all__ = ["register"]


def register(tools: ToolSet) -> None:
    """``tpu_list_deployments``, ``tpu_get_deployment``, ``tpu_get_operation``."""
    _register_list(tools)
    _register_get(tools)
    _register_operation(tools)


def _register_list(tools: ToolSet) -> None:
    core = tools.core

    @tools.tool(
        annotations=annotations(
            "List deployments", read_only=True, destructive=False, idempotent=True, open_world=False
        )
    )
    async def tpu_list_deployments(
        phase: Annotated[PhaseChoice | None, Field(description="Only deployments in this phase.")] = None,
        include_deleted: Annotated[bool, Field(description="Also list deleted deployments.")] = False,
        offset: Annotated[
            int,
            Field(description="Skip this many (next_offset).", ge=bounds.LIST_OFFSET[0], le=bounds.LIST_OFFSET[1]),
        ] = 0,
        limit: Annotated[int, Field(description="Page size.", ge=bounds.LIST_LIMIT[0], le=bounds.LIST_LIMIT[1])] = 20,
    ) -> Annotated[CallToolResult, DeploymentList]:
        """List deployments, newest first: phase, zone, tier, endpoint, spend and TPU resources. Details:
        tpu_get_deployment."""
        page = await run(
            lambda: core.list_deployments(include_deleted=include_deleted, phase=phase, offset=offset, limit=limit)
        )
        names = ", ".join(f"{d.deployment_id} ({d.phase})" for d in page.deployments) or "none"
        return tool_result(page, f"{page.total} deployment(s): {names}.")


def _register_get(tools: ToolSet) -> None:
    core = tools.core

    @tools.tool(
        annotations=annotations(
            "Deployment dashboard", read_only=True, destructive=False, idempotent=True, open_world=False
        )
    )
    async def tpu_get_deployment(deployment_id: DeploymentIdArg) -> Annotated[CallToolResult, DeploymentDetail]:
        """One deployment's dashboard: phase, zone, tier, TPU resources, capacity-search attempts, endpoint,
        SLIs, findings, spend, price per hour and the node's system details."""
        detail = await run(lambda: core.get_deployment(deployment_id))
        where = f" in {detail.zone} ({detail.tier})" if detail.zone else ""
        return tool_result(
            detail, f"{detail.deployment_id}: {detail.phase}{where}; endpoint {detail.endpoint or 'none'}."
        )


def _register_operation(tools: ToolSet) -> None:
    core = tools.core

    @tools.tool(
        annotations=annotations(
            "Follow a command", read_only=True, destructive=False, idempotent=True, open_world=False
        )
    )
    async def tpu_get_operation(
        command_id: Annotated[
            str,
            Field(
                description="The command_id a command returned.",
                pattern=UUID_PATTERN,
            ),
        ],
        ctx: Context,
        wait_seconds: Annotated[
            int,
            Field(
                description="Wait up to this long for a change.",
                ge=bounds.WAIT_SECONDS[0],
                le=bounds.WAIT_SECONDS[1],
            ),
        ] = 0,
    ) -> Annotated[CallToolResult, OperationView]:
        """Progress of a command: its stage (capacity search, provisioning, boot, vLLM start, healthy) or why it
        failed. Call again until done is true."""
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
        return tool_result(
            view, f"{view.kind or 'command'} {view.status}: {view.stage}" + (" (done)" if view.done else "")
        )

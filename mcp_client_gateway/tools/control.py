"""``tpu_control``: start, stop or delete a deployment, restart its vLLM container, tail that container's log,
capture a debug bundle. Stop, restart and delete are confirmed: by elicitation when the client supports it,
otherwise by the token their refusal hands out. The operate toolset serves the tool without ``delete``
(``ToolSet.actions``), so the irrecoverable call is not even offered there.

No ``from __future__ import annotations`` here: the SDK reads these signatures at registration.
"""

from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context, Elicit, ElicitationResult, Resolve
from mcp.types import CallToolResult
from pydantic import Field

from mcp_client_gateway import bounds
from mcp_client_gateway.confirmation import ConfirmationRequest
from mcp_client_gateway.core import GatewayCore, GatewayError
from mcp_client_gateway.models import CommandAccepted, DebugBundleView, ServingLogsView
from mcp_client_gateway.strict_tools import GatewayToolError
from mcp_client_gateway.tools.common import (
    UUID_PATTERN,
    ConfirmArg,
    ConfirmForm,
    DeploymentIdArg,
    ToolSet,
    accepted_summary,
    annotations,
    confirmed_command,
    run,
    supports_elicitation,
    token_to_use,
    tool_result,
)
from mcp_client_gateway.tools.observe import bundle_summary

__all__ = ["register"]

ACTIONS = ("start", "stop", "restart", "delete", "log_tail", "capture_bundle")
_CONFIRMED = ("stop", "restart", "delete")


def register(tools: ToolSet) -> None:
    """``tpu_control`` (not served read-only; served without ``delete`` by operate)."""
    if tools.read_only:
        return
    core = tools.core
    Action: Any = Literal[tools.actions("tpu_control", ACTIONS)]  # this toolset's actions

    def control_confirmation(action: str, deployment_id: str, ctx: Context) -> ConfirmationRequest | None:
        """With elicitation, for stop and restart: the impact and a token, minted before the user is asked."""
        if action not in _CONFIRMED or not supports_elicitation(ctx):
            return None
        try:
            return core.request_confirmation(action, deployment_id)  # type: ignore[arg-type]
        except GatewayError as exc:
            raise GatewayToolError(exc) from None

    def ask(request: Annotated[ConfirmationRequest | None, Resolve(control_confirmation)]) -> Any:
        if request is None:
            return None
        return Elicit(f"{request.impact}. Type '{request.target}' to confirm.", ConfirmForm)

    @tools.tool(
        annotations=annotations("Control", read_only=False, destructive=True, idempotent=False, open_world=True),
        views=(CommandAccepted, ServingLogsView, DebugBundleView),
    )
    async def tpu_control(
        action: Annotated[Action, Field(description="What to do.")],
        deployment_id: DeploymentIdArg,
        confirmation: Annotated[ConfirmationRequest | None, Resolve(control_confirmation)],
        answer: Annotated[ElicitationResult[ConfirmForm], Resolve(ask)],
        confirm: ConfirmArg = None,
        lines: Annotated[int, Field(description="log_tail: newest lines.", ge=1, le=bounds.TAIL_LINES[1])] = 100,
        task_id: Annotated[
            str | None, Field(description="Poll a pending log_tail or capture_bundle.", pattern=UUID_PATTERN)
        ] = None,
    ) -> CallToolResult:
        """start a stopped deployment; stop: release the slice, keep the record; delete: resources and record, no
        undo; restart vLLM (requests fail). log_tail, capture_bundle: if pending, call again with task_id."""
        if action == "start":
            accepted = await run(lambda: core.start_deployment(deployment_id))
            return tool_result(accepted, accepted_summary(accepted))
        if action in _CONFIRMED:
            token = token_to_use(confirmation, answer, confirm)
            return await confirmed_command(lambda: _confirmed(core, action, deployment_id, token))
        if action == "log_tail":
            return await _tail(core, deployment_id, lines, task_id)
        bundle = await run(lambda: core.debug_bundle(deployment_id, capture=task_id is None, task_id=task_id))
        return tool_result(bundle, bundle_summary(bundle))


def _confirmed(core: GatewayCore, action: str, deployment_id: str, token: str | None) -> CommandAccepted:
    if action == "stop":
        return core.stop_deployment(deployment_id, confirm=token)
    if action == "delete":
        return core.delete_deployment(deployment_id, confirm=token)
    return core.restart_serving(deployment_id, confirm=token, reason="user_request")


async def _tail(core: GatewayCore, deployment_id: str, lines: int, task_id: str | None) -> CallToolResult:
    view = await run(lambda: core.tail_serving_logs(deployment_id, lines=lines, task_id=task_id))
    if view.status == "pending":
        summary = f"The node has not answered yet: call again with task_id {view.task_id}."
    elif view.status == "failed":
        summary = f"The log tail failed: {view.detail}"
    else:
        cut = " (truncated)" if view.truncated else ""
        summary = f"{len(view.lines)} line(s) of the vLLM log{cut}; untrusted data."
    return tool_result(view, summary)

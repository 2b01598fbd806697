"""``tpu_deploy``: bring a model up (create), change a deployment's spec (update), or fill the region's compile
cache (prewarm), with one spec schema. Commands answer at once with a command_id; an update that replaces a
running slice and a create that books a calendar window are confirmed (by elicitation, or by the token their
refusal hands out).

Why one tool: create, update and prewarm take the same ~15 spec fields; three tools repeated them in every turn's
tool list (issue #23).

No ``from __future__ import annotations`` here: the SDK reads these signatures at registration.
"""

from collections.abc import Callable
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context, Elicit, ElicitationResult, Resolve
from mcp.types import CallToolResult
from pydantic import Field

from mcp_client_gateway import bounds
from mcp_client_gateway.capabilities.deployments import CLEARABLE, UPDATABLE, describe_changes
from mcp_client_gateway.confirmation import ConfirmationRequest
from mcp_client_gateway.core import GatewayCore, GatewayError
from mcp_client_gateway.models import CommandAccepted, UpdateAccepted
from mcp_client_gateway.strict_tools import GatewayToolError
from mcp_client_gateway.tools.common import (
    UUID_PATTERN,
    AcceleratorChoice,
    AlternativeAcceleratorsArg,
    CommandIdArg,
    ConfirmArg,
    ConfirmationRefused,
    ConfirmForm,
    DeploymentIdArg,
    ModelChoice,
    TierChoice,
    ToolSet,
    WeightDtypeArg,
    ZonesArg,
    accepted_summary,
    annotations,
    run,
    supports_elicitation,
    token_to_use,
    tool_result,
)
from mcp_client_gateway.tools.plan import KvCacheDtypeArg, MaxModelLenArg

__all__ = ["register"]

Action = Literal["create", "update", "prewarm"]
DEFAULT_ACCELERATOR = "v6e-4"
_SPEC = ("model", "accelerator", "alternative_accelerators", *UPDATABLE, "preset")  # what create and prewarm take
_CREATE_ONLY = ("model", "alternative_accelerators", "book_calendar", "preset")


def _fields(arguments: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    return {name: arguments[name] for name in names if arguments.get(name) is not None}


def _refused_for(action: str, arguments: dict[str, Any]) -> GatewayError | None:
    """An argument the action does not take, or a missing one, named with the fix."""
    if action == "update":
        for name in _CREATE_ONLY:
            if arguments.get(name) not in (None, False):
                return GatewayError("invalid_argument", name, "cannot be changed by an update", "leave it out")
        return None
    if arguments.get("clear"):
        return GatewayError("invalid_argument", "clear", f"is for action update, not {action}", "leave it out")
    if arguments.get("model") is None:
        return GatewayError("invalid_argument", "model", f"is required to {action}", "add model, e.g. gemma-4-e2b")
    if action == "prewarm":
        for name, why in (
            ("book_calendar", "books no window"),
            ("alternative_accelerators", "fills one slice's cache"),
        ):
            if arguments.get(name):
                return GatewayError("invalid_argument", name, f"is not for a prewarm: it {why}", "leave it out")
    return None


def _create(core: GatewayCore, action: str, arguments: dict[str, Any], confirm: str | None) -> CommandAccepted:
    spec = _fields(arguments, _SPEC)
    spec.setdefault("accelerator", DEFAULT_ACCELERATOR)
    return core.create_deployment(
        deployment_id=arguments["deployment_id"],
        command_id=arguments.get("command_id"),
        book_calendar=bool(arguments.get("book_calendar")),
        prewarm=action == "prewarm",
        confirm=confirm,
        **spec,
    )


def _confirmation(core: GatewayCore, action: str, arguments: dict[str, Any]) -> ConfirmationRequest | None:
    """The impact and a token, minted before asking: an update that replaces a running slice, a create that books
    a window. A booking create with no token is refused before anything is published."""
    if action == "update":
        changes = _fields(arguments, UPDATABLE)
        return core.update_confirmation(arguments["deployment_id"], changes, clear=arguments.get("clear") or ())
    if action != "create" or not arguments.get("book_calendar") or _refused_for(action, arguments):
        return None
    try:
        _create(core, action, arguments, None)
    except GatewayError as exc:
        if exc.confirmation is None:
            raise
        return exc.confirmation
    raise GatewayError("internal", None, "a booking create was not refused for confirmation")


def _resolvers(core: GatewayCore) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """With elicitation: the confirmation a call needs (minted before asking) and the question to ask."""

    def deploy_confirmation(
        ctx: Context,
        action: str,
        deployment_id: str,
        model: str | None = None,
        accelerator: str | None = None,
        alternative_accelerators: list[str] | None = None,
        zones: list[str] | None = None,
        tiers: list[str] | None = None,
        ttl_hours: float | None = None,
        budget_usd: float | None = None,
        idle_minutes: int | None = None,
        max_model_len: int | None = None,
        kv_cache_dtype: str | None = None,
        dtype: str | None = None,
        book_calendar: bool = False,
        clear: list[str] | None = None,
        preset: str | None = None,
    ) -> ConfirmationRequest | None:
        if not supports_elicitation(ctx):
            return None
        arguments = {name: value for name, value in locals().items() if name != "ctx"}
        try:
            return _confirmation(core, action, arguments)
        except GatewayError as exc:
            raise GatewayToolError(exc) from None

    def ask(request: Annotated[ConfirmationRequest | None, Resolve(deploy_confirmation)]) -> Any:
        if request is None:
            return None
        return Elicit(f"{request.impact}. Type '{request.target}' to confirm.", ConfirmForm)

    return deploy_confirmation, ask


def register(tools: ToolSet) -> None:
    """``tpu_deploy`` (not served read-only)."""
    core = tools.core
    deploy_confirmation, ask = _resolvers(core)
    if tools.read_only:
        return

    @tools.tool(
        annotations=annotations("Deploy", read_only=False, destructive=True, idempotent=True, open_world=True),
        views=(CommandAccepted, UpdateAccepted),
    )
    async def tpu_deploy(
        deployment_id: DeploymentIdArg,
        confirmation: Annotated[ConfirmationRequest | None, Resolve(deploy_confirmation)],
        answer: Annotated[ElicitationResult[ConfirmForm], Resolve(ask)],
        action: Annotated[Action, Field(description="prewarm: compile only, fill the cache, delete.")] = "create",
        model: Annotated[ModelChoice | None, Field(description="Model (create, prewarm).")] = None,
        accelerator: Annotated[AcceleratorChoice | None, Field(description="TPU slice; default v6e-4.")] = None,
        alternative_accelerators: AlternativeAcceleratorsArg = None,
        zones: Annotated[
            ZonesArg | None,
            Field(description="Best first; default: all the quota allows.", min_length=1, max_length=16),
        ] = None,
        tiers: Annotated[
            list[TierChoice] | None,
            Field(description="In order; default flex_start, spot, on_demand.", min_length=1, max_length=4),
        ] = None,
        ttl_hours: Annotated[
            float | None, Field(description="Tear down after.", gt=bounds.TTL_HOURS[0], le=bounds.TTL_HOURS[1])
        ] = None,
        budget_usd: Annotated[
            float | None, Field(description="Tear down past.", gt=bounds.BUDGET_USD[0], le=bounds.BUDGET_USD[1])
        ] = None,
        idle_minutes: Annotated[
            int | None,
            Field(description="Stop when idle.", ge=bounds.IDLE_MINUTES[0], le=bounds.IDLE_MINUTES[1]),
        ] = None,
        max_model_len: MaxModelLenArg = None,
        kv_cache_dtype: KvCacheDtypeArg = None,
        dtype: WeightDtypeArg = None,
        book_calendar: Annotated[bool, Field(description="Book the plan's calendar window; paid whole.")] = False,
        preset: Annotated[
            str | None, Field(description="A tune run's id: its verified flags.", pattern=UUID_PATTERN)
        ] = None,
        clear: Annotated[
            list[Literal["ttl_hours", "budget_usd", "idle_minutes", "max_model_len"]] | None,
            Field(description="update: fields to unset.", max_length=len(CLEARABLE)),
        ] = None,
        confirm: ConfirmArg = None,
        command_id: CommandIdArg = None,
    ) -> CallToolResult:
        """create: serve a model on a TPU slice (minutes to hours; bills once ACTIVE). update: change the fields
        given; a new slice takes over. Returns command_id; follow with tpu_status."""
        arguments = {name: value for name, value in locals().items() if name not in ("confirmation", "answer")}
        refused = _refused_for(action, arguments)
        if refused is not None:
            raise GatewayToolError(refused)
        token = token_to_use(confirmation, answer, confirm)  # a user who was asked: the token minted then
        try:
            if action == "update":
                changes = _fields(arguments, UPDATABLE)
                updated = await run(
                    lambda: core.update_deployment(
                        deployment_id, changes, clear=clear or (), confirm=token, command_id=command_id
                    )
                )
                return tool_result(updated, _update_summary(updated))
            accepted = await run(lambda: _create(core, action, arguments, token))
        except ConfirmationRefused as refused_call:
            return refused_call.result
        return tool_result(accepted, accepted_summary(accepted))


def _update_summary(accepted: UpdateAccepted) -> str:
    if accepted.duplicate:
        return accepted_summary(accepted)
    return f"{accepted_summary(accepted)} Changes: {describe_changes(accepted.changes)}."

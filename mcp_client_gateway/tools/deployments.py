"""Deployment tools: create, update, delete, stop, start, restart serving. Commands answer at once with a
command_id; delete, stop, restart and an update that replaces a running slice are confirmed (by elicitation, or by
the token their refusal hands out).

No ``from __future__ import annotations`` here: the SDK reads these signatures at registration.
"""

import inspect
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
    confirmed_command,
    run,
    supports_elicitation,
    token_to_use,
    tool_result,
)

__all__ = ["register_create", "register_lifecycle"]

CreateZonesArg = Annotated[
    ZonesArg | None,
    Field(
        description="Zones to search, best first, e.g. ['us-east5-b']; default: every zone the quota allows.",
        min_length=1,
        max_length=bounds.MAX_ZONES,
    ),
]
CreateTiersArg = Annotated[
    list[TierChoice] | None,
    Field(
        description="Tiers in priority order; default flex_start, spot, on_demand.",
        max_length=bounds.MAX_TIERS,
    ),
]
PrewarmArg = Annotated[
    bool,
    Field(description="Only compile: fill the region's compile cache for this plan, then delete (tpu_plan's prewarm)."),
]
BookCalendarArg = Annotated[
    bool, Field(description="Book the earliest calendar-mode window (tpu_plan_deployment's calendar); paid whole.")
]
HedgeArg = Annotated[
    int | None,
    Field(description="Queued requests kept outstanding.", ge=bounds.HEDGE[0], le=bounds.HEDGE[1]),
]
TtlHoursArg = Annotated[
    float | None,
    Field(description="Tear down after this many hours.", gt=bounds.TTL_HOURS[0], le=bounds.TTL_HOURS[1]),
]
BudgetArg = Annotated[
    float | None,
    Field(description="Tear down past this spend.", gt=bounds.BUDGET_USD[0], le=bounds.BUDGET_USD[1]),
]
IdleMinutesArg = Annotated[
    int | None,
    Field(
        description="Stop after this long without requests.",
        ge=bounds.IDLE_MINUTES[0],
        le=bounds.IDLE_MINUTES[1],
    ),
]
MaxModelLenArg = Annotated[
    int | None,
    Field(
        description="Context length in tokens; default: the preset's.",
        ge=bounds.MAX_MODEL_LEN[0],
        le=bounds.MAX_MODEL_LEN[1],
    ),
]
KvCacheDtypeArg = Annotated[Literal["auto", "fp8"] | None, Field(description="fp8 halves the KV cache.")]
UpdateZonesArg = Annotated[
    ZonesArg | None,
    Field(
        description="New zones to search, best first (replaces the list).",
        min_length=1,
        max_length=bounds.MAX_ZONES,
    ),
]
UpdateTiersArg = Annotated[
    list[TierChoice] | None,
    Field(
        description="New tiers in priority order (replaces the list).",
        min_length=1,
        max_length=bounds.MAX_TIERS,
    ),
]
UpdateAcceleratorArg = Annotated[
    AcceleratorChoice | None, Field(description="New TPU slice type; the model must fit it.")
]
ClearableField = Literal["ttl_hours", "budget_usd", "idle_minutes", "max_model_len"]
ClearArg = Annotated[
    list[ClearableField] | None,
    Field(
        description="Fields to unset (context length: back to the preset's).",
        max_length=len(CLEARABLE),
    ),
]


def register_create(tools: ToolSet) -> None:
    """``tpu_create_deployment`` (not served read-only); booking a calendar window is confirmed like a destructive
    call: by elicitation when the client supports it, else by the token its refusal hands out."""
    core = tools.core

    def booking_confirmation(
        ctx: Context,
        deployment_id: str,
        model: str,
        accelerator: str = "v6e-4",
        zones: list[str] | None = None,
        tiers: list[str] | None = None,
        hedge: int | None = None,
        ttl_hours: float | None = None,
        budget_usd: float | None = None,
        idle_minutes: int | None = None,
        max_model_len: int | None = None,
        kv_cache_dtype: str | None = None,
        dtype: str | None = None,
        alternative_accelerators: list[str] | None = None,
        book_calendar: bool = False,
        prewarm: bool = False,
    ) -> ConfirmationRequest | None:
        """With elicitation and a window to book: its terms and a token, minted before asking. A create that books
        and carries no token is refused before anything is published, so this never creates anything."""
        if not book_calendar or not supports_elicitation(ctx):
            return None
        arguments = {name: value for name, value in locals().items() if name in _CREATE_PARAMETERS}
        try:
            core.create_deployment(**{**arguments, "confirm": None})
        except GatewayError as exc:
            if exc.confirmation is None:
                raise GatewayToolError(exc) from None
            return exc.confirmation
        raise GatewayToolError(GatewayError("internal", None, "a booking create was not refused for confirmation"))

    def ask_booking(request: Annotated[ConfirmationRequest | None, Resolve(booking_confirmation)]) -> Any:
        if request is None:
            return None
        return Elicit(f"{request.impact}. Type '{request.target}' to confirm.", ConfirmForm)

    if not tools.read_only:

        @tools.tool(
            annotations=annotations(
                "Create a deployment", read_only=False, destructive=False, idempotent=True, open_world=True
            )
        )
        async def tpu_create_deployment(
            deployment_id: DeploymentIdArg,
            booking: Annotated[ConfirmationRequest | None, Resolve(booking_confirmation)],
            answer: Annotated[ElicitationResult[ConfirmForm], Resolve(ask_booking)],
            model: Annotated[ModelChoice, Field(description="Model preset to serve.")],
            accelerator: Annotated[AcceleratorChoice, Field(description="TPU slice type.")] = "v6e-4",
            zones: CreateZonesArg = None,
            tiers: CreateTiersArg = None,
            hedge: HedgeArg = None,
            ttl_hours: TtlHoursArg = None,
            budget_usd: BudgetArg = None,
            idle_minutes: IdleMinutesArg = None,
            max_model_len: MaxModelLenArg = None,
            kv_cache_dtype: KvCacheDtypeArg = None,
            dtype: WeightDtypeArg = None,
            command_id: CommandIdArg = None,
            alternative_accelerators: AlternativeAcceleratorsArg = None,
            book_calendar: BookCalendarArg = False,
            confirm: ConfirmArg = None,
            prewarm: PrewarmArg = False,
        ) -> Annotated[CallToolResult, CommandAccepted]:
            """Bring a model up on a TPU slice. Returns command_id at once; the capacity search, boot and model
            load take minutes to hours in the cloud. Costs money once a slice is ACTIVE. Follow with
            tpu_get_operation."""
            arguments = {name: value for name, value in locals().items() if name in _CREATE_PARAMETERS}
            arguments["confirm"] = token_to_use(booking, answer, confirm)  # a user who was asked: the minted token
            try:
                accepted = await run(lambda: core.create_deployment(**arguments))
            except ConfirmationRefused as refused:  # book_calendar: the window and its price, confirmed first
                return refused.result
            return tool_result(accepted, accepted_summary(accepted))


_CREATE_PARAMETERS = frozenset(inspect.signature(GatewayCore.create_deployment).parameters) - {"self"}


def register_lifecycle(tools: ToolSet) -> None:
    """Delete, stop, start and restart serving (not served read-only); the destructive ones are confirmed."""
    _register_delete(tools)
    _register_stop(tools)
    _register_start(tools)
    _register_restart(tools)
    _register_update(tools)


def _register_delete(tools: ToolSet) -> None:
    core = tools.core
    delete_confirmation, ask_delete = tools.confirmation["delete"], tools.ask["delete"]

    if not tools.read_only:

        @tools.tool(
            annotations=annotations(
                "Delete a deployment", read_only=False, destructive=True, idempotent=True, open_world=True
            )
        )
        async def tpu_delete_deployment(
            deployment_id: DeploymentIdArg,
            confirmation: Annotated[ConfirmationRequest | None, Resolve(delete_confirmation)],
            answer: Annotated[ElicitationResult[ConfirmForm], Resolve(ask_delete)],
            confirm: ConfirmArg = None,
        ) -> Annotated[CallToolResult, CommandAccepted]:
            """Delete a deployment: its TPU resources, then its record. Cannot be undone. Confirmed first.
            Returns command_id at once; follow with tpu_get_operation."""
            token = token_to_use(confirmation, answer, confirm)
            return await confirmed_command(lambda: core.delete_deployment(deployment_id, confirm=token))


def _register_stop(tools: ToolSet) -> None:
    core = tools.core
    stop_confirmation, ask_stop = tools.confirmation["stop"], tools.ask["stop"]

    if not tools.read_only:

        @tools.tool(
            annotations=annotations(
                "Stop a deployment (release the TPU)",
                read_only=False,
                destructive=True,
                idempotent=True,
                open_world=True,
            )
        )
        async def tpu_stop_deployment(
            deployment_id: DeploymentIdArg,
            confirmation: Annotated[ConfirmationRequest | None, Resolve(stop_confirmation)],
            answer: Annotated[ElicitationResult[ConfirmForm], Resolve(ask_stop)],
            confirm: ConfirmArg = None,
        ) -> Annotated[CallToolResult, CommandAccepted]:
            """Stop a deployment: release its TPU slice (serving and billing stop), keep the record for
            tpu_start_deployment. Confirmed first. Returns command_id at once."""
            token = token_to_use(confirmation, answer, confirm)
            return await confirmed_command(lambda: core.stop_deployment(deployment_id, confirm=token))


def _register_start(tools: ToolSet) -> None:
    core = tools.core

    if not tools.read_only:

        @tools.tool(
            annotations=annotations(
                "Start a stopped deployment", read_only=False, destructive=False, idempotent=True, open_world=True
            )
        )
        async def tpu_start_deployment(deployment_id: DeploymentIdArg) -> Annotated[CallToolResult, CommandAccepted]:
            """Start a stopped deployment: a new capacity search with the stored spec. Costs money once a slice
            is ACTIVE. Returns command_id at once; follow with tpu_get_operation."""
            accepted = await run(lambda: core.start_deployment(deployment_id))
            return tool_result(accepted, accepted_summary(accepted))


def _register_restart(tools: ToolSet) -> None:
    core = tools.core
    restart_confirmation, ask_restart = tools.confirmation["restart"], tools.ask["restart"]

    if not tools.read_only:

        @tools.tool(
            annotations=annotations(
                "Restart the vLLM container", read_only=False, destructive=True, idempotent=True, open_world=True
            )
        )
        async def tpu_restart_serving(
            deployment_id: DeploymentIdArg,
            confirmation: Annotated[ConfirmationRequest | None, Resolve(restart_confirmation)],
            answer: Annotated[ElicitationResult[ConfirmForm], Resolve(ask_restart)],
            confirm: ConfirmArg = None,
            reason: Annotated[
                Literal["user_request", "unhealthy", "stalled", "flags_changed"],
                Field(description="Why (recorded)."),
            ] = "user_request",
        ) -> Annotated[CallToolResult, CommandAccepted]:
            """Restart the vLLM container on the deployment's node: in-flight requests fail and serving pauses
            while the model loads again (minutes). Confirmed first. Returns command_id at once."""
            token = token_to_use(confirmation, answer, confirm)
            return await confirmed_command(lambda: core.restart_serving(deployment_id, confirm=token, reason=reason))


def _register_update(tools: ToolSet) -> None:
    core = tools.core

    def update_confirmation(
        deployment_id: str,
        ctx: Context,
        ttl_hours: float | None,
        budget_usd: float | None,
        idle_minutes: int | None,
        zones: list[str] | None,
        tiers: list[str] | None,
        hedge: int | None,
        accelerator: str | None,
        max_model_len: int | None,
        kv_cache_dtype: str | None,
        dtype: str | None,
        clear: list[str] | None,
    ) -> ConfirmationRequest | None:
        """With elicitation and a running slice to replace: the impact and a token, minted before asking."""
        changes = {name: value for name, value in locals().items() if name in UPDATABLE}  # the parameters above
        if not supports_elicitation(ctx):
            return None
        try:
            return core.update_confirmation(deployment_id, changes, clear=clear or ())
        except GatewayError as exc:
            raise GatewayToolError(exc) from None

    def ask_update(request: Annotated[ConfirmationRequest | None, Resolve(update_confirmation)]) -> Any:
        if request is None:
            return None
        return Elicit(f"{request.impact}. Type '{request.target}' to confirm.", ConfirmForm)

    if not tools.read_only:

        @tools.tool(
            annotations=annotations(
                "Update a deployment's spec", read_only=False, destructive=True, idempotent=True, open_world=True
            )
        )
        async def tpu_update_deployment(
            deployment_id: DeploymentIdArg,
            confirmation: Annotated[ConfirmationRequest | None, Resolve(update_confirmation)],
            answer: Annotated[ElicitationResult[ConfirmForm], Resolve(ask_update)],
            ttl_hours: TtlHoursArg = None,
            budget_usd: BudgetArg = None,
            idle_minutes: IdleMinutesArg = None,
            zones: UpdateZonesArg = None,
            tiers: UpdateTiersArg = None,
            hedge: HedgeArg = None,
            accelerator: UpdateAcceleratorArg = None,
            max_model_len: MaxModelLenArg = None,
            kv_cache_dtype: KvCacheDtypeArg = None,
            dtype: WeightDtypeArg = None,
            clear: ClearArg = None,
            confirm: ConfirmArg = None,
            command_id: CommandIdArg = None,
        ) -> Annotated[CallToolResult, UpdateAccepted]:
            """Change a deployment's spec (only the fields given; clear unsets). A new slice takes over while
            the old one serves, both billing meanwhile; confirmed first when a slice is up. Returns command_id
            and each change at once; follow with tpu_get_operation."""
            changes = {name: value for name, value in locals().items() if name in UPDATABLE}  # the fields above
            token = token_to_use(confirmation, answer, confirm)
            try:
                accepted = await run(
                    lambda: core.update_deployment(
                        deployment_id, changes, clear=clear or (), confirm=token, command_id=command_id
                    )
                )
            except ConfirmationRefused as refused:
                return refused.result
            return tool_result(accepted, _update_summary(accepted))


def _update_summary(accepted: UpdateAccepted) -> str:
    if accepted.duplicate:
        return accepted_summary(accepted)
    return f"{accepted_summary(accepted)} Changes: {describe_changes(accepted.changes)}."

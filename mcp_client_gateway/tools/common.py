"""What every tool module shares: the parameter aliases, the strict registration (``ToolSet``), running a core
call off the event loop, results with a one-line summary, and the confirmation of destructive tools.

Destructive tools are confirmed on the server: by elicitation when the client supports it (the server mints the
confirmation token itself once the user accepted), otherwise by a ``confirm`` token that only the refusal of an
unconfirmed call hands out (``confirmation``).

No ``from __future__ import annotations`` here: the SDK reads these signatures at registration.
"""

import logging
import uuid
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar, cast, get_args

import anyio
import anyio.to_thread
from mcp.server.mcpserver import AcceptedElicitation, Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field

from mcp_client_gateway import bounds
from mcp_client_gateway.confirmation import ConfirmationRequest
from mcp_client_gateway.core import GatewayCore, GatewayError
from mcp_client_gateway.models import CommandAccepted
from mcp_client_gateway.strict_tools import GatewayToolError, StrictTool, error_result
from shared.domain.models import AcceleratorType, ModelPreset

__all__ = [
    "ID_PATTERN",
    "IRRECOVERABLE_ACTIONS",
    "TOOLSETS",
    "UUID_PATTERN",
    "AcceleratorChoice",
    "AlternativeAcceleratorsArg",
    "CommandIdArg",
    "ConfirmArg",
    "ConfirmForm",
    "DeploymentIdArg",
    "ModelChoice",
    "OptionalDeploymentIdArg",
    "PhaseChoice",
    "SeverityChoice",
    "TierChoice",
    "ToolSet",
    "Toolset",
    "WeightDtypeArg",
    "ZonesArg",
    "accepted_summary",
    "annotations",
    "confirmed_command",
    "resolve_toolset",
    "run",
    "serves",
    "token_to_use",
    "tool_result",
]

log = logging.getLogger("mcp_client_gateway.server")  # the server's log lines keep the logger name they had

T = TypeVar("T")

AcceleratorChoice = AcceleratorType  # the domain's allow-lists, so the schema and the messages agree
AlternativeAcceleratorsArg = Annotated[
    list[AcceleratorType] | None,
    Field(
        description="Fallback slices, in order, when scarce.",
        max_length=4,
    ),
]
ModelChoice = ModelPreset
TierChoice = Literal["flex_start", "spot", "on_demand", "reservation"]  # Tier's values (a test keeps them equal)
PhaseChoice = Literal[
    "PENDING",
    "SEARCHING",
    "PROVISIONING",
    "BOOTING",
    "COMPILING",
    "SERVING",
    "DEGRADED",
    "STALLED",
    "DOWN",
    "STOPPING",
    "STOPPED",
    "DELETING",
    "DELETED",
    "FAILED",
]
SeverityChoice = Literal["DEFAULT", "DEBUG", "INFO", "NOTICE", "WARNING", "ERROR", "CRITICAL"]

ID_PATTERN = bounds.DEPLOYMENT_ID_PATTERN
UUID_PATTERN = bounds.COMMAND_ID_PATTERN
DeploymentIdArg = Annotated[
    str,
    Field(
        description="Deployment id.",
        pattern=ID_PATTERN,
        max_length=40,
    ),
]
OptionalDeploymentIdArg = Annotated[
    str | None,
    Field(description="Deployment id.", pattern=ID_PATTERN, max_length=40),
]
ConfirmArg = Annotated[
    str | None,
    Field(description="Token from the refusal, once the user agreed.", max_length=bounds.CONFIRM_CHARS),
]
CommandIdArg = Annotated[
    str | None,
    Field(
        description="Idempotency UUID.",
        pattern=UUID_PATTERN,
    ),
]
ZonesArg = list[Annotated[str, Field(pattern=bounds.ZONE_PATTERN, max_length=bounds.ZONE_CHARS)]]


class ConfirmForm(BaseModel):
    """The elicitation form for destructive tools: the user types the target's name."""

    confirm: str = Field(description="Type the name shown in the message to confirm.")


def annotations(
    title: str, *, read_only: bool, destructive: bool, idempotent: bool, open_world: bool
) -> ToolAnnotations:
    return ToolAnnotations(
        title=title,
        read_only_hint=read_only,
        destructive_hint=destructive,
        idempotent_hint=idempotent,
        open_world_hint=open_world,
    )


def tool_result(model: BaseModel, summary: str) -> CallToolResult:
    """Structured content plus a short summary and the same JSON as text for clients that ignore structure."""
    return CallToolResult(
        content=[
            TextContent(type="text", text=summary),
            TextContent(type="text", text=model.model_dump_json(exclude_none=False)),
        ],
        structured_content=model.model_dump(mode="json"),
    )


async def run(call: Callable[[], T]) -> T:
    """Run a core call off the event loop; map caller-fixable errors to ToolError, hide everything else."""
    try:
        return await anyio.to_thread.run_sync(call)
    except GatewayError as exc:
        if exc.confirmation is not None:
            raise ConfirmationRefused(exc) from None
        raise GatewayToolError(exc) from None
    except ToolError:
        raise
    except Exception:
        correlation_id = uuid.uuid4().hex[:12]
        log.exception("a tool call failed unexpectedly", extra={"correlation_id": correlation_id})
        raise GatewayToolError(
            GatewayError(
                "internal",
                None,
                f"the gateway failed unexpectedly (correlation id {correlation_id}); the details are in the "
                "gateway's log, not here",
            )
        ) from None


def supports_elicitation(ctx: Context) -> bool:
    capabilities = ctx.client_capabilities
    elicitation = capabilities.elicitation if capabilities is not None else None
    return elicitation is not None and (elicitation.form is not None or elicitation.url is None)


class ConfirmationRefused(ToolError):
    """A destructive call refused for want of confirmation; ``result`` carries the error's shape and, beside it
    in the same JSON, the confirmation request (the impact and the new token)."""

    def __init__(self, error: GatewayError) -> None:
        super().__init__(error.render())
        request = error.confirmation
        assert request is not None
        self.request = request
        self.result = error_result(error, **request.model_dump(mode="json"))


async def confirmed_command(call: Callable[[], CommandAccepted]) -> CallToolResult:
    """A destructive command's result, or its refusal with the impact and the token as an is_error result."""
    try:
        accepted = await run(call)
    except ConfirmationRefused as refused:
        return refused.result
    return tool_result(accepted, accepted_summary(accepted))


def token_to_use(request: ConfirmationRequest | None, answer: Any, confirm: str | None) -> str | None:
    """The confirmation token for the core.

    Without elicitation (``request`` is None) it is the caller's ``confirm``, which the core checks. With it, the
    user was shown ``request.impact`` and typed the target's name: then the token minted before asking is used
    (so a change made while the user read the question is still refused), and ``confirm`` is ignored.
    """
    if request is None:
        return confirm
    if not isinstance(answer, AcceptedElicitation):
        raise GatewayToolError(
            GatewayError("confirmation_required", "confirm", "the user declined; nothing was changed")
        )
    typed = str(getattr(answer.data, "confirm", "")).strip()
    if typed != request.target:
        raise GatewayToolError(
            GatewayError(
                "confirmation_required",
                "confirm",
                f"what the user typed does not match '{request.target}'; nothing was changed",
                f"ask again; the user confirms by typing '{request.target}'",
            )
        )
    return request.confirm


def accepted_summary(accepted: CommandAccepted) -> str:
    if accepted.duplicate:
        return f"{accepted.kind} for {accepted.deployment_id} was already received (command {accepted.command_id})."
    published = f"Published {accepted.kind} for {accepted.deployment_id}: command_id {accepted.command_id}."
    return f"{published} {accepted.next_step}"


Toolset = Literal["read-only", "operate", "all"]  # Settings.toolset, --toolset (a test keeps them equal)
TOOLSETS: tuple[str, ...] = get_args(Toolset)
# Actions that destroy state nothing can bring back, per tool: left out of the operate toolset (the tool is served
# without them). Stop, restart, update and a token replacement are destructive too (confirmed), but reversible:
# start, another restart or update, the secret's earlier versions.
IRRECOVERABLE_ACTIONS: dict[str, frozenset[str]] = {"tpu_control": frozenset({"delete"})}


def resolve_toolset(toolset: str | None, *, read_only: bool) -> Toolset:
    """The toolset to serve: ``read_only`` (``--read-only``) is ``toolset='read-only'``; the two disagreeing is
    an error naming both flags. Neither given: ``all``."""
    if toolset is not None and toolset not in TOOLSETS:
        raise ValueError(f"--toolset: {toolset[:40]!r} is not a toolset; choose one of {', '.join(TOOLSETS)}")
    if read_only and toolset not in (None, "read-only"):
        raise ValueError(
            f"--read-only and --toolset {toolset} disagree: --read-only means --toolset read-only; give only one"
        )
    return cast(Toolset, "read-only" if read_only else toolset or "all")  # checked against TOOLSETS above


def serves(toolset: Toolset, name: str, hints: ToolAnnotations) -> bool:
    """Whether a server of ``toolset`` lists the tool: read-only: readOnlyHint true; operate and all: every tool
    (operate serves them without their irrecoverable actions, ``ToolSet.actions``)."""
    if toolset == "read-only":
        return hints.read_only_hint is True
    return True


def _explicit_hints(name: str, hints: ToolAnnotations) -> None:
    """Policy engines act on the hints, so every tool says whether it only reads, and a writing tool whether it
    destroys."""
    if hints.read_only_hint is None:
        raise ValueError(f"tool {name}: readOnlyHint is not set; build its annotations with annotations(...)")
    if not hints.read_only_hint and hints.destructive_hint is None:
        raise ValueError(f"tool {name}: a writing tool needs an explicit destructiveHint; pass destructive=")
    if name in IRRECOVERABLE_ACTIONS and not hints.destructive_hint:
        raise ValueError(f"tool {name}: a tool with an irrecoverable action must be annotated destructive=True")


class ToolSet:
    """The tools of one server being registered: the core they call, the toolset served (``read-only``,
    ``operate`` or ``all``), strict registration (``StrictTool``), and the resolvers that confirm the destructive
    deployment tools. A tool outside the toolset is not listed."""

    def __init__(self, core: GatewayCore, *, toolset: Toolset = "all") -> None:
        if toolset not in TOOLSETS:
            raise ValueError(f"toolset: {toolset!r} is not a toolset; choose one of {', '.join(TOOLSETS)}")
        self.core = core
        self.toolset: Toolset = toolset
        self.tools: list[Tool] = []

    def tool(
        self, *, annotations: ToolAnnotations, views: tuple[type[BaseModel], ...] = ()
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register a tool with a closed, strict input schema (``StrictTool``); ``views``: the results of a tool
        with several views (``StrictTool.strict``)."""

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            tool = StrictTool.strict(fn, annotations=annotations, views=views)
            _explicit_hints(tool.name, annotations)
            if serves(self.toolset, tool.name, annotations):
                self.tools.append(tool)
            return fn

        return register

    def actions(self, tool: str, actions: tuple[str, ...]) -> tuple[str, ...]:
        """The actions of ``tool`` this toolset offers: operate leaves out the irrecoverable ones."""
        left_out = IRRECOVERABLE_ACTIONS.get(tool, frozenset()) if self.toolset == "operate" else frozenset()
        return tuple(action for action in actions if action not in left_out)

    @property
    def read_only(self) -> bool:
        """The tool modules skip registering writing tools under ``read-only`` (``tool`` leaves them out too)."""
        return self.toolset == "read-only"


WeightDtypeArg = Annotated[
    Literal["bfloat16", "fp8"] | None,
    Field(description="Weights; fp8 halves their HBM."),
]

"""``tpu_plan``: everything before spending, in one read tool. The serving plan (fit, flags, cost per region and
tier, caches, the calendar window and a prewarm's price), the zones with prices, capacity memory and live quota,
or the rendered startup script or GKE manifest. Creates and changes nothing.

No ``from __future__ import annotations`` here: the SDK reads these signatures at registration.
"""

from collections.abc import Sequence
from typing import Annotated, Literal

from mcp.types import CallToolResult
from pydantic import Field

from mcp_client_gateway import bounds
from mcp_client_gateway.core import GatewayCore, GatewayError
from mcp_client_gateway.models import ArtifactsView, PlanView, ZonesView
from mcp_client_gateway.strict_tools import GatewayToolError
from mcp_client_gateway.tools.common import (
    AcceleratorChoice,
    ModelChoice,
    OptionalDeploymentIdArg,
    TierChoice,
    ToolSet,
    WeightDtypeArg,
    ZonesArg,
    annotations,
    run,
    tool_result,
)

__all__ = ["KvCacheDtypeArg", "MaxModelLenArg", "register"]

Show = Literal["plan", "zones", "startup_script", "gke_manifest"]
MaxModelLenArg = Annotated[
    int | None,
    Field(description="Context tokens; default: the preset's.", ge=bounds.MAX_MODEL_LEN[0], le=bounds.MAX_MODEL_LEN[1]),
]
KvCacheDtypeArg = Annotated[Literal["auto", "fp8"] | None, Field(description="fp8 halves the KV cache.")]


def register(tools: ToolSet) -> None:
    """``tpu_plan`` (read-only)."""
    core = tools.core

    @tools.tool(
        annotations=annotations("Plan", read_only=True, destructive=False, idempotent=True, open_world=False),
        views=(PlanView, ZonesView, ArtifactsView),
    )
    async def tpu_plan(
        show: Annotated[Show, Field(description="What to show.")] = "plan",
        model: Annotated[ModelChoice | None, Field(description="Model (plan, scripts).")] = None,
        deployment_id: OptionalDeploymentIdArg = None,
        accelerator: Annotated[AcceleratorChoice, Field(description="TPU slice type.")] = "v6e-4",
        zones: Annotated[
            ZonesArg | None,
            Field(description="Default: all the quota allows.", min_length=1, max_length=16),
        ] = None,
        tiers: Annotated[
            list[TierChoice] | None,
            Field(description="Tiers to price.", min_length=1, max_length=bounds.MAX_TIERS),
        ] = None,
        max_model_len: MaxModelLenArg = None,
        kv_cache_dtype: KvCacheDtypeArg = None,
        dtype: WeightDtypeArg = None,
        ttl_hours: Annotated[
            float | None, Field(description="Price a run this long.", gt=bounds.TTL_HOURS[0], le=bounds.TTL_HOURS[1])
        ] = None,
    ) -> CallToolResult:
        """Before spending. plan: model's fit on the slice (HBM, KV), vLLM flags, $/h and $/M tokens by region
        and tier, caches. zones: prices, stockouts, quota. startup_script, gke_manifest: for deployment_id or
        model."""
        if show == "zones":
            return await _zones(core, accelerator, tiers)
        if show != "plan":
            return await _render(core, show, deployment_id=deployment_id, model=model, accelerator=accelerator)
        if model is None:
            raise GatewayToolError(GatewayError("invalid_argument", "model", "is required for a plan", "add model"))
        plan = await run(
            lambda: core.plan(
                model=model,
                accelerator=accelerator,
                zones=zones,
                tiers=tiers,
                max_model_len=max_model_len,
                kv_cache_dtype=kv_cache_dtype,
                dtype=dtype,
                ttl_hours=ttl_hours,
            )
        )
        cheapest = f"; from ${plan.costs[0].usd_per_hour:.2f}/h ({plan.costs[0].tier})" if plan.costs else ""
        verdict = "fits" if plan.fits else f"does not fit (smallest: {plan.smallest_fitting_slice or 'none'})"
        return tool_result(
            plan,
            f"{model} on {accelerator} {verdict}; {plan.capacity.kv_tokens:,} KV tokens{cheapest}. "
            f"{plan.search_scope.summary}. Prices: {plan.price_source}."
            + (f" Warning: {plan.clock_warning}." if plan.clock_warning else ""),
        )


async def _zones(core: GatewayCore, accelerator: str, tiers: Sequence[str] | None) -> CallToolResult:
    """The zones for a slice type, for one tier when exactly one is given."""
    tier = tiers[0] if tiers is not None and len(tiers) == 1 else None
    view = await run(lambda: core.list_zones(accelerator=accelerator, tier=tier, live_quota=True))
    open_zones = [z.zone for z in view.zones if z.available]
    summary = f"{len(view.zones)} zone(s) for {accelerator}; {len(open_zones)} not blocked."
    if view.live_quota is not None and not view.live_quota.read:
        summary += f" Live quota not read: {view.live_quota.problem} Fix: {view.live_quota.fix}."
    elif view.live_quota is not None and view.live_quota.problem:
        summary += f" {view.live_quota.problem}."
    return tool_result(view, summary)


async def _render(
    core: GatewayCore,
    kind: Literal["startup_script", "gke_manifest"],
    *,
    deployment_id: str | None,
    model: str | None,
    accelerator: str,
) -> CallToolResult:
    """The startup script or GKE manifest of a stored deployment, or of a model on a slice."""
    view = await run(
        lambda: core.render_artifacts(
            deployment_id=deployment_id, model=model, accelerator=accelerator if model else None, kind=kind
        )
    )
    return tool_result(view, f"Rendered {kind} for {view.model} on {view.accelerator} (plan {view.plan_hash}).")

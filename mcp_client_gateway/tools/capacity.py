"""Capacity and planning tools: zones with prices, capacity memory and live quota; the serving plan (fit,
flags, cost); the rendered startup script and GKE manifest. Read-only, no change anywhere.

No ``from __future__ import annotations`` here: the SDK reads these signatures at registration.
"""

from typing import Annotated, Literal

from mcp.types import CallToolResult
from pydantic import Field

from mcp_client_gateway import bounds
from mcp_client_gateway.models import ArtifactsView, PlanView, ZonesView
from mcp_client_gateway.tools.common import (
    ID_PATTERN,
    AcceleratorChoice,
    AlternativeAcceleratorsArg,
    ModelChoice,
    TierChoice,
    ToolSet,
    WeightDtypeArg,
    ZonesArg,
    annotations,
    run,
    tool_result,
)

__all__ = ["register"]


def register(tools: ToolSet) -> None:
    """``tpu_list_zones``, ``tpu_plan_deployment``, ``tpu_render_artifacts``."""
    _register_zones(tools)
    _register_plan(tools)
    _register_render(tools)


def _register_zones(tools: ToolSet) -> None:
    core = tools.core

    @tools.tool(
        annotations=annotations(
            "Zones, prices and capacity memory", read_only=True, destructive=False, idempotent=True, open_world=False
        )
    )
    async def tpu_list_zones(
        accelerator: Annotated[AcceleratorChoice, Field(description="TPU slice type to price.")] = "v6e-4",
        tier: Annotated[TierChoice | None, Field(description="Only this capacity tier.")] = None,
        live_quota: Annotated[
            bool,
            Field(description="Read the live quota and usage now."),
        ] = True,
    ) -> Annotated[CallToolResult, ZonesView]:
        """Zones for a slice type: price per hour by tier, what the capacity search learned (stockouts, quota
        blocks) and live quota headroom. Use it to pick zones for tpu_create_deployment."""
        view = await run(lambda: core.list_zones(accelerator=accelerator, tier=tier, live_quota=live_quota))
        open_zones = [z.zone for z in view.zones if z.available]
        summary = f"{len(view.zones)} zone(s) for {accelerator}; {len(open_zones)} not blocked."
        if view.live_quota is not None and not view.live_quota.read:
            summary += f" Live quota not read: {view.live_quota.problem} Fix: {view.live_quota.fix}."
        elif view.live_quota is not None and view.live_quota.problem:
            summary += f" {view.live_quota.problem}."
        return tool_result(view, summary)


def _register_plan(tools: ToolSet) -> None:
    core = tools.core

    @tools.tool(
        annotations=annotations(
            "Plan a deployment (fit, flags, cost)", read_only=True, destructive=False, idempotent=True, open_world=False
        )
    )
    async def tpu_plan_deployment(
        model: Annotated[ModelChoice, Field(description="Model preset.")],
        accelerator: Annotated[AcceleratorChoice, Field(description="TPU slice type.")] = "v6e-4",
        zones: Annotated[
            ZonesArg | None,
            Field(
                description="Zones to price; default: every zone the live quota allows.",
                min_length=1,
                max_length=bounds.MAX_ZONES,
            ),
        ] = None,
        tiers: Annotated[
            list[TierChoice] | None,
            Field(description="Tiers to price; default: all but reservation.", max_length=bounds.MAX_TIERS),
        ] = None,
        max_model_len: Annotated[
            int | None,
            Field(description="Context length in tokens.", ge=bounds.MAX_MODEL_LEN[0], le=bounds.MAX_MODEL_LEN[1]),
        ] = None,
        kv_cache_dtype: Annotated[Literal["auto", "fp8"] | None, Field(description="KV cache element type.")] = None,
        dtype: WeightDtypeArg = None,
        gpu_memory_utilization: Annotated[
            float | None,
            Field(
                description="Share of HBM vLLM may use.",
                ge=bounds.GPU_MEMORY_UTILIZATION[0],
                le=bounds.GPU_MEMORY_UTILIZATION[1],
            ),
        ] = None,
        ttl_hours: Annotated[
            float | None,
            Field(description="Price a run of this length.", gt=bounds.TTL_HOURS[0], le=bounds.TTL_HOURS[1]),
        ] = None,
        tokens_per_second: Annotated[
            float | None,
            Field(
                description="Measured output tokens/s, to price a million tokens.",
                gt=bounds.TOKENS_PER_SECOND[0],
                le=bounds.TOKENS_PER_SECOND[1],
            ),
        ] = None,
        alternative_accelerators: AlternativeAcceleratorsArg = None,
    ) -> Annotated[CallToolResult, PlanView]:
        """Plan before spending: whether the model fits the slice (HBM, KV cache) or the smallest that does,
        the vLLM flags, prices per hour, day and million tokens by region and tier, and the zones a create
        would search. Creates nothing."""
        plan = await run(
            lambda: core.plan(
                model=model,
                accelerator=accelerator,
                zones=zones,
                tiers=tiers,
                max_model_len=max_model_len,
                kv_cache_dtype=kv_cache_dtype,
                dtype=dtype,
                gpu_memory_utilization=gpu_memory_utilization,
                ttl_hours=ttl_hours,
                tokens_per_second=tokens_per_second,
                alternative_accelerators=alternative_accelerators,
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


def _register_render(tools: ToolSet) -> None:
    core = tools.core

    @tools.tool(
        annotations=annotations(
            "Render deployment artefacts", read_only=True, destructive=False, idempotent=True, open_world=False
        )
    )
    async def tpu_render_artifacts(
        deployment_id: Annotated[
            str | None,
            Field(description="A stored deployment to render.", pattern=ID_PATTERN, max_length=40),
        ] = None,
        model: Annotated[ModelChoice | None, Field(description="Or a model preset (with accelerator).")] = None,
        accelerator: Annotated[AcceleratorChoice | None, Field(description="Slice type, with model.")] = None,
        kind: Annotated[
            Literal["startup_script", "gke_manifest", "both"], Field(description="Which artefact.")
        ] = "both",
    ) -> Annotated[CallToolResult, ArtifactsView]:
        """Render the TPU VM startup script and/or GKE manifest for a stored deployment or a model and slice.
        Secrets appear only as Secret Manager names."""
        view = await run(
            lambda: core.render_artifacts(deployment_id=deployment_id, model=model, accelerator=accelerator, kind=kind)
        )
        return tool_result(view, f"Rendered {kind} for {view.model} on {view.accelerator} (plan {view.plan_hash}).")

"""Plans: the capacity verdict and HBM table, the vLLM launch and prices of a spec, and its rendered artefacts.

The plan is the one the controller would deploy: the facade passes the same environment
(``shared.wiring.serving_environment``), so the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from mcp_client_gateway import bounds
from mcp_client_gateway.cache_views import WeightsCacheView, prewarm_view, weights_cache_views
from mcp_client_gateway.capabilities.calendar import CalendarQuotes
from mcp_client_gateway.capabilities.capacity import Capacity, given_scope
from mcp_client_gateway.capabilities.checks import (
    ARTIFACT_KINDS,
    KV_CACHE_DTYPES,
    WEIGHT_DTYPES,
    optional,
    slice_arguments,
)
from mcp_client_gateway.capabilities.common import (
    CommandPublisher,
    GatewayPorts,
    Pricing,
    Records,
    clock_warning,
    pricing,
)
from mcp_client_gateway.errors import GatewayError
from mcp_client_gateway.models import ArtifactsView, CapacityView, CostView, PlanView
from mcp_client_gateway.slice_views import AlternativeSliceView
from shared.domain.errors import InvalidMessage, PermanentError
from shared.domain.models import ACCELERATOR_TYPES, MODEL_PRESET_NAMES, DeploymentSpec
from shared.domain.prices import PRICE_TABLE_DATE

if TYPE_CHECKING:  # the serving plan pulls in the capacity, launch and manifest modules: loaded on first use
    from shared.domain.capacity import CapacityReport
    from shared.domain.serving_plan import ServingEnvironment, ServingPlan

__all__ = ["Plans"]


class Plans:
    """Read-only planning over the serving plan; no cloud calls."""

    def __init__(
        self,
        ports: GatewayPorts,
        records: Records,
        publisher: CommandPublisher,
        environment: Callable[[], ServingEnvironment],
    ) -> None:
        self.ports = ports
        self.records = records
        self.publisher = publisher
        self.environment = environment
        """The serving environment the controller deploys with (``shared.wiring.serving_environment``)."""
        self.capacity = Capacity(ports)
        self.calendar = CalendarQuotes(ports)

    def plan(
        self,
        *,
        model: str,
        accelerator: str,
        zones: Sequence[str] | None = None,
        tiers: Sequence[str] | None = None,
        max_model_len: int | None = None,
        kv_cache_dtype: str | None = None,
        dtype: str | None = None,
        gpu_memory_utilization: float | None = None,
        ttl_hours: float | None = None,
        tokens_per_second: float | None = None,
        alternative_accelerators: Sequence[str] | None = None,
    ) -> PlanView:
        """Capacity, the vLLM launch, prices, weights caches, and the zones searched (given, else by live quota)."""
        scope = None if zones is not None else self.capacity.ladder_scope(accelerator, alternative_accelerators, tiers)
        model, accelerator, zones, tiers = slice_arguments(
            model, accelerator, zones if scope is None else scope.zones, tiers
        )
        max_model_len = optional(bounds.integer, "max_model_len", max_model_len, bounds.MAX_MODEL_LEN)
        kv_cache_dtype = optional(bounds.choice, "kv_cache_dtype", kv_cache_dtype, KV_CACHE_DTYPES)
        dtype = optional(bounds.choice, "dtype", dtype, WEIGHT_DTYPES)
        gpu_memory_utilization = optional(
            bounds.number, "gpu_memory_utilization", gpu_memory_utilization, bounds.GPU_MEMORY_UTILIZATION
        )
        ttl_hours = optional(bounds.number, "ttl_hours", ttl_hours, bounds.TTL_HOURS, low_open=True)
        tokens_per_second = _checked_throughput(tokens_per_second)
        alternatives = checked_alternatives(accelerator, alternative_accelerators)
        spec = self.spec(
            "plan-preview",
            model=model,
            accelerator=accelerator,
            alternative_accelerators=alternatives,
            zones=zones,
            tiers=tiers or None,
            ttl_hours=ttl_hours,
            serving={
                "max_model_len": max_model_len,
                "kv_cache_dtype": kv_cache_dtype,
                "dtype": dtype,
                "gpu_memory_utilization": gpu_memory_utilization,
            },
        )
        plan = self.serving_plan(spec)
        prices = pricing(self.ports)
        return PlanView(
            model=plan.preset.name,
            hub_id=plan.engine.model,
            accelerator=plan.slice.name,
            chips=plan.slice.chips,
            topology=plan.slice.topology,
            fits=plan.fits,
            reasons=list(plan.capacity.reasons),
            smallest_fitting_slice=plan.smallest_fitting_slice,
            alternatives=self.check_alternatives(spec),
            capacity=_capacity_view(plan.capacity),
            hbm_table=plan.capacity.table(),
            image=plan.launch.image,
            argv=list(plan.launch.argv),
            env=dict(plan.launch.env),
            costs=_cost_views(plan, tokens_per_second, prices),
            unpriced=list(plan.unpriced),
            notes=list(plan.notes),
            price_table_date=PRICE_TABLE_DATE.isoformat(),
            price_source=prices.label,
            plan_hash=plan.plan_hash,
            search_scope=scope or given_scope(zones),
            clock_warning=clock_warning(self.ports, ttl_hours),
            calendar=self.calendar.quote(plan.slice.name, plan.slice.chips, spec.zones, ttl_hours),
            weights_cache=self.weights_caches(plan, spec.zones),
            prewarm=prewarm_view(plan.preset.name, plan.slice.name, plan.cheapest()),
        )

    def weights_caches(self, plan: ServingPlan, zones: Sequence[str]) -> list[WeightsCacheView]:
        """Each region's weights cache for the plan's model: warm, partial, cold or none, and its storage price."""
        from shared.domain.capacity import weight_bytes_per_chip

        settings = self.ports.settings
        model_bytes = weight_bytes_per_chip(plan.preset, 1, plan.capacity.weight_dtype)  # the whole model
        return weights_cache_views(
            settings.weights_cache_buckets,
            settings.weights_cache_cross_region,
            self.ports.weights_cache,
            plan.engine.model,
            model_bytes,
            zones,
            plan.compile_key,
        )

    def render_artifacts(
        self,
        *,
        deployment_id: str | None = None,
        model: str | None = None,
        accelerator: str | None = None,
        kind: Literal["startup_script", "gke_manifest", "both"] = "both",
    ) -> ArtifactsView:
        """The startup script and GKE manifest of a stored deployment (or of a model on a slice)."""
        kind = bounds.choice("kind", kind, ARTIFACT_KINDS)  # type: ignore[assignment]
        model = optional(bounds.choice, "model", model, MODEL_PRESET_NAMES)
        accelerator = optional(bounds.choice, "accelerator", accelerator, ACCELERATOR_TYPES)
        if deployment_id is not None:
            spec = self.records.get(deployment_id).spec
        elif model and accelerator:
            spec = self.spec("render-preview", model=model, accelerator=accelerator, zones=("us-east5-b",))
        else:
            raise GatewayError(
                "invalid_argument",
                "deployment_id",
                "give a deployment_id, or both model and accelerator",
                "e.g. deployment_id='gemma-a', or model='gemma-4-26b-a4b' with accelerator='v6e-4'",
            )
        plan = self.serving_plan(spec)
        return ArtifactsView(
            deployment_id=spec.deployment_id,
            model=plan.preset.name,
            accelerator=plan.slice.name,
            plan_hash=plan.plan_hash,
            image=plan.launch.image,
            startup_script=plan.startup_script() if kind in ("startup_script", "both") else None,
            gke_manifest=plan.gke_manifest() if kind in ("gke_manifest", "both") else None,
            secret_references=[plan.hf_token_resource, plan.api_key_resource],
        )

    def spec(self, deployment_id: str, **fields: Any) -> DeploymentSpec:
        body: dict[str, Any] = {"deployment_id": deployment_id}
        for key, value in fields.items():
            if key == "serving":
                chosen = {k: v for k, v in value.items() if v is not None}
                if chosen:
                    body["serving"] = chosen
            elif value is not None:
                body[key] = list(value) if isinstance(value, tuple | list) else value
        message = self.publisher.validated({"kind": "deployment.create", "deployment_id": deployment_id, "spec": body})
        spec: DeploymentSpec = message.spec
        return spec

    def check_alternatives(self, spec: DeploymentSpec) -> list[AlternativeSliceView]:
        """Each alternative slice must fit the preset at the spec's context by the serving plan's own rule
        (``shared.domain.slice_ladder.check_alternatives``); raises naming ``alternative_accelerators[i]``."""
        from shared.domain.slice_ladder import check_alternatives, spec_for_slice

        try:
            check_alternatives(spec, self.environment())
        except InvalidMessage as exc:
            raise GatewayError("invalid_argument", exc.field, exc.problem, exc.fix) from None
        views: list[AlternativeSliceView] = []
        for accelerator in spec.alternative_accelerators:
            plan = self.serving_plan(spec_for_slice(spec, accelerator))
            views.append(
                AlternativeSliceView(
                    accelerator=accelerator,
                    chips=plan.slice.chips,
                    tensor_parallel_size=plan.engine.tensor_parallel,
                    max_model_len=plan.engine.max_model_len,
                )
            )
        return views

    def serving_plan(self, spec: DeploymentSpec) -> ServingPlan:
        """The plan the controller would deploy: same environment (``serving_environment``), same bytes."""
        from shared.domain.serving_plan import build_serving_plan

        try:
            return build_serving_plan(spec, self.environment())
        except InvalidMessage as exc:
            raise GatewayError("invalid_argument", _tool_field(exc.field), exc.problem, exc.fix) from None
        except PermanentError as exc:
            field = getattr(exc, "field", None)
            raise GatewayError(
                "invalid_argument", field if isinstance(field, str) else None, str(exc), "see tpu_plan"
            ) from None


def _checked_throughput(value: float | None) -> float | None:
    fix = "pass the measured output throughput in tokens per second (above 0)"
    return optional(bounds.number, "tokens_per_second", value, bounds.TOKENS_PER_SECOND, low_open=True, fix=fix)


def _cost_views(plan: ServingPlan, tokens_per_second: float | None, prices: Pricing) -> list[CostView]:
    """The plan's prices per region and tier (the first of each), cheapest first, at the controller's prices
    (the Billing Catalog; the plan's dated-table estimate where the source knows no price)."""
    from shared.domain.cost import HOURS_PER_DAY, cost_per_million_tokens

    costs: dict[tuple[str, str], CostView] = {}
    for cost in plan.costs:
        found = prices.lookup(cost.region, cost.tier, plan.slice.family)
        hourly, source = (found[0] * cost.chips, found[1]) if found else (cost.usd_per_hour, cost.price_source)
        per_million = None
        if tokens_per_second:
            per_million = round(cost_per_million_tokens(hourly, tokens_per_second), 4)
        costs.setdefault(
            (cost.region, cost.tier.value),
            CostView(
                region=cost.region,
                tier=cost.tier.value,
                usd_per_hour=round(hourly, 4),
                usd_per_day=round(hourly * HOURS_PER_DAY, 2),
                usd_for_ttl=round(hourly * cost.billable_hours, 2) if cost.billable_hours is not None else None,
                capped_by_run_duration=cost.capped_by_run_duration,
                usd_per_million_tokens=per_million,
                price_source=source,
            ),
        )
    return sorted(costs.values(), key=lambda c: c.usd_per_hour)


def _capacity_view(capacity: CapacityReport) -> CapacityView:
    return CapacityView(
        tensor_parallel=capacity.tensor_parallel,
        weight_dtype=capacity.weight_dtype,
        kv_cache_dtype=capacity.kv_cache_dtype,
        gpu_memory_utilization=capacity.gpu_memory_utilization,
        max_model_len=capacity.max_model_len,
        max_num_seqs=capacity.max_num_seqs,
        usable_hbm_gib=round(capacity.usable_hbm_gib, 3),
        weights_gib=round(capacity.weights_gib, 3),
        weights_source=capacity.weights_source,
        kv_gib=round(capacity.kv_allocated_gib, 3),
        free_gib=round(capacity.free_gib, 3),
        activation_gib_estimate=round(capacity.activation_estimate_gib, 3),
        kv_bytes_per_token=capacity.kv_bytes_per_token,
        block_size=capacity.block_size,
        num_blocks=capacity.num_blocks,
        kv_tokens=capacity.kv_tokens,
        max_sequences_at_context=capacity.max_sequences_at_context,
    )


def checked_alternatives(accelerator: str, values: Sequence[str] | None) -> tuple[str, ...]:
    """``alternative_accelerators`` as given: known slice types, each once, not the accelerator itself (their fit
    is checked against the spec by ``Plans.check_alternatives``)."""
    if values is None:
        return ()
    if isinstance(values, str) or len(values) > 4:
        raise GatewayError(
            "invalid_argument", "alternative_accelerators", "must be a list of at most 4 slice types", "e.g. [v6e-4]"
        )
    checked: list[str] = []
    for index, value in enumerate(values):
        field = f"alternative_accelerators[{index}]"
        checked.append(bounds.choice(field, value, ACCELERATOR_TYPES))
        if value == accelerator or value in checked[:-1]:
            raise GatewayError(
                "invalid_argument", field, f"{value} is already in the list or is the accelerator", f"drop {value}"
            )
    return tuple(checked)


def _tool_field(field: str | None) -> str | None:
    """A spec field as the tools name it (``serving.dtype`` is the ``dtype`` parameter)."""
    return field.removeprefix("serving.") if field in ("serving.dtype", "serving.kv_cache_dtype") else field


def fit_fixes(plan: ServingPlan) -> str:
    """Only the fixes that help this misfit: fp8 weights (or a bigger slice) for weights that do not fit; for a
    KV pool too small, a shorter context, an fp8 KV cache, and fp8 weights (they leave more HBM to the pool)."""
    capacity = plan.capacity
    fixes = [f"use {plan.smallest_fitting_slice}" if plan.smallest_fitting_slice else "use a bigger slice"]
    weights = any(reason.startswith("weights ") for reason in capacity.reasons)
    kv = any(reason.startswith("the KV pool") for reason in capacity.reasons)
    if (weights or kv) and capacity.weight_dtype != "fp8" and "fp8" in plan.preset.weight_dtypes:
        fixes.append("set dtype='fp8' (fp8 weights)")
    if kv:
        fixes.append("lower max_model_len")
        if capacity.kv_cache_dtype != "fp8":
            fixes.append("set kv_cache_dtype='fp8'")
    return ", ".join(fixes[:-1]) + (" or " if len(fixes) > 1 else "") + fixes[-1]

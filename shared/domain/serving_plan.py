"""The serving plan: everything decided about running one ``DeploymentSpec``, before any money is spent.

``build_serving_plan(spec, environment)`` looks the model and slice up in the catalog, resolves the vLLM knobs,
checks capacity, prices every (zone, tier) the search may use, and builds the launch; the startup script and
the GKE manifest are rendered from that one launch. The plan holds names of secrets, never their values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from shared.domain.capacity import CapacityReport, estimate_capacity, smallest_fitting_slice
from shared.domain.catalog import AcceleratorSpec, ModelPreset, accelerator, preset
from shared.domain.compile_cache import compile_key
from shared.domain.cost import CostEstimate, UnknownPrice, estimate_cost
from shared.domain.errors import InvalidMessage
from shared.domain.gke import GkeOptions, render_gke_manifest
from shared.domain.launch import API_KEY_FILE, DEFAULT_IMAGE, EngineConfig, VllmLaunch, build_launch
from shared.domain.models import DeploymentSpec, ServingOptions, Tier
from shared.domain.startup_script import (
    StartupScriptInputs,
    node_agent_bundle_problem,
    plan_hash,
    render_startup_script,
    secret_resource,
    sha256_problem,
)
from shared.domain.weights_cache import check_cache_buckets

__all__ = ["NODE_AGENT_ENV_NAMES", "ServingEnvironment", "ServingPlan", "build_serving_plan"]

_PROJECT = re.compile(r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$")
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$")
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,99}$")
# The node agent reads these (python -m node_agent.agent on the VM).
NODE_AGENT_ENV_NAMES = (
    "TPUCTL_BACKEND",
    "TPUCTL_PROJECT",
    "TPUCTL_DEPLOYMENT_ID",
    "TPUCTL_NODE_VLLM_URL",
    "TPUCTL_NODE_API_KEY_FILE",
    "TPUCTL_NODE_SERVED_MODEL",
    "TPUCTL_NODE_DOCKER_HOST",  # set by the startup script itself, with the Docker socket's mount
    "TPUCTL_NODE_CONTAINER",  # likewise: the serving container's name (CONTAINER)
    "TPUCTL_DEBUG_BUNDLE_BUCKET",  # where bundles go before a restart (absent: none are kept)
    "TPUCTL_TRACE_EXPORT",  # cloud-trace when the controller's spans go there (absent: the agent records none)
)


@dataclass(frozen=True, slots=True)
class ServingEnvironment:
    """Where and how plans run: project, secret names (from Settings), the pinned image, the node agent.

    ``shared.wiring.serving_environment(settings)`` builds the one instance the controller deploys with and the
    gateway previews with, so a previewed plan is the plan that runs.
    """

    project: str
    # Secret Manager secret names (Settings.hf_token_secret / vllm_api_key_secret), never values.
    hf_token_secret: str = "tpuctl-hf-token"  # noqa: S105
    api_key_secret: str = "tpuctl-vllm-api-key"  # noqa: S105
    secret_version: str = "latest"  # noqa: S105 - Secret Manager's version alias; rotate by adding a version
    image: str = DEFAULT_IMAGE
    # gs:// URI and SHA-256 of the node-agent bundle (make package; Terraform uploads it); "" = no node agent.
    node_agent_bundle: str = ""
    node_agent_bundle_sha256: str = ""
    # The bucket node agents keep debug bundles in (Terraform's); "" = none kept (shared.domain.debug_bundle).
    debug_bundle_bucket: str = ""
    # The regional weights caches, (region, bucket) pairs (Terraform's); a VM reads its region's (weights_cache).
    weights_cache_buckets: tuple[tuple[str, str], ...] = ()
    weights_cache_cross_region: bool = False  # a VM may read another region's cache (egress is billed)
    # The controller's TPUCTL_TRACE_EXPORT: the node agents export to Cloud Trace too when it is "cloud-trace"
    # (any other value, e.g. a file of the controller's, means nothing on a VM: they then record no spans).
    trace_export: str = "none"
    bind_host: str = "127.0.0.1"
    port: int = 8000

    def __post_init__(self) -> None:
        if not _PROJECT.fullmatch(self.project):
            raise InvalidMessage("project", f"{self.project!r} is not a project id", "6-30 chars, [a-z0-9-]")
        self._check_node_agent_bundle()
        try:
            check_cache_buckets(dict(self.weights_cache_buckets))
        except ValueError as exc:
            raise InvalidMessage(
                "weights_cache_buckets", str(exc), "use Terraform's weights_cache_buckets output"
            ) from exc

    def _check_node_agent_bundle(self) -> None:
        if not (self.node_agent_bundle or self.node_agent_bundle_sha256):
            return
        fix = "use Terraform's output node_agent_bundle_uri and the SHA-256 of the file make package printed"
        problem = node_agent_bundle_problem(self.node_agent_bundle)
        if problem:
            raise InvalidMessage("node_agent_bundle", problem, fix)
        problem = sha256_problem(self.node_agent_bundle_sha256)
        if problem:
            raise InvalidMessage("node_agent_bundle_sha256", problem, fix)


@dataclass(frozen=True, slots=True)
class ServingPlan:
    """Model, slice, knobs, capacity verdict, prices and the one vLLM launch for a deployment spec."""

    spec: DeploymentSpec
    environment: ServingEnvironment
    preset: ModelPreset
    slice: AcceleratorSpec
    engine: EngineConfig
    launch: VllmLaunch
    capacity: CapacityReport
    costs: tuple[CostEstimate, ...]
    unpriced: tuple[str, ...]
    smallest_fitting_slice: str | None
    hf_token_resource: str
    api_key_resource: str
    notes: tuple[str, ...] = field(default=())

    @property
    def fits(self) -> bool:
        return self.capacity.fits

    @property
    def plan_hash(self) -> str:
        return plan_hash(self.launch, self.engine.revision or "")

    @property
    def compile_key(self) -> str:
        """What this plan compiles on this slice: the shared compile cache's key (shared.domain.compile_cache)."""
        return compile_key(self.launch, self.engine.revision or "", self.slice.name)

    def cheapest(self) -> CostEstimate | None:
        return min(self.costs, key=lambda cost: cost.usd_per_hour, default=None)

    def startup_script(self) -> str:
        """The TPU VM startup script for this plan."""
        base_url = f"http://{'127.0.0.1' if self.launch.host == '0.0.0.0' else self.launch.host}:{self.launch.port}"
        agent_env: tuple[tuple[str, str], ...] = (
            ("TPUCTL_BACKEND", "gcp"),
            ("TPUCTL_PROJECT", self.environment.project),
            ("TPUCTL_DEPLOYMENT_ID", self.spec.deployment_id),
            ("TPUCTL_NODE_VLLM_URL", base_url),
            ("TPUCTL_NODE_API_KEY_FILE", API_KEY_FILE),
            ("TPUCTL_NODE_SERVED_MODEL", self.engine.served_name),
        )
        if self.environment.debug_bundle_bucket:
            agent_env += (("TPUCTL_DEBUG_BUNDLE_BUCKET", self.environment.debug_bundle_bucket),)
        if self.environment.trace_export == "cloud-trace":
            agent_env += (("TPUCTL_TRACE_EXPORT", "cloud-trace"),)
        return render_startup_script(
            StartupScriptInputs(
                deployment_id=self.spec.deployment_id,
                launch=self.launch,
                model=self.engine.model,
                model_revision=self.engine.revision or "",
                hf_token_secret=self.hf_token_resource,
                api_key_secret=self.api_key_resource,
                node_agent_bundle=self.environment.node_agent_bundle,
                node_agent_bundle_sha256=self.environment.node_agent_bundle_sha256,
                node_agent_env=agent_env,
                weights_cache_buckets=self.environment.weights_cache_buckets,
                weights_cache_cross_region=self.environment.weights_cache_cross_region,
                compile_cache_key=self.compile_key,
                prewarm=self.spec.prewarm,
            )
        )

    def gke_manifest(self, options: GkeOptions | None = None) -> str:
        """Deployment + Service YAML for a GKE TPU node pool."""
        return render_gke_manifest(
            self.launch, self.slice, self.engine.revision or "", options or GkeOptions(name=self.spec.deployment_id)
        )

    def summary(self) -> dict[str, Any]:
        """JSON-able digest for records, the gateway and benchmark results (no secret values exist to leak)."""
        cheapest = self.cheapest()
        return {
            "model": self.preset.name,
            "hub_id": self.engine.model,
            "revision": self.engine.revision,
            "accelerator": self.slice.name,
            "chips": self.slice.chips,
            "topology": self.slice.topology,
            "image": self.launch.image,
            "plan_hash": self.plan_hash,
            "argv": list(self.launch.argv),
            "env": dict(self.launch.env),
            "fits": self.fits,
            "reasons": list(self.capacity.reasons),
            "smallest_fitting_slice": self.smallest_fitting_slice,
            "weights_gib_per_chip": round(self.capacity.weights_gib, 2),
            "kv_gib_per_chip": round(self.capacity.kv_allocated_gib, 2),
            "kv_tokens": self.capacity.kv_tokens,
            "max_sequences_at_context": self.capacity.max_sequences_at_context,
            "cheapest": None
            if cheapest is None
            else {
                "region": cheapest.region,
                "tier": cheapest.tier.value,
                "usd_per_hour": round(cheapest.usd_per_hour, 4),
            },
            "unpriced": list(self.unpriced),
            "notes": list(self.notes),
        }


def _resolve_preset(spec: DeploymentSpec, custom: ModelPreset | None) -> ModelPreset:
    chosen = custom or preset(spec.model)
    if not _HUB_ID.fullmatch(chosen.hub_id):
        raise InvalidMessage("model.hub_id", f"{chosen.hub_id!r} is not a repository id", "use owner/name")
    if chosen.revision is not None and not _REVISION.fullmatch(chosen.revision):
        raise InvalidMessage("model.revision", f"{chosen.revision!r} is not a revision", "use a commit sha or tag")
    return chosen


def _costs(spec: DeploymentSpec, slice_: AcceleratorSpec) -> tuple[tuple[CostEstimate, ...], tuple[str, ...]]:
    costs: list[CostEstimate] = []
    unpriced: list[str] = []
    for zone in spec.zones:
        for tier in spec.tiers:
            try:
                costs.append(
                    estimate_cost(
                        slice_,
                        zone,
                        tier,
                        ttl_hours=spec.ttl_hours,
                        max_run_hours=spec.max_run_hours if tier is Tier.FLEX_START else None,
                    )
                )
            except UnknownPrice:
                unpriced.append(f"{zone} {tier.value}")
    return tuple(costs), tuple(unpriced)


def build_serving_plan(
    spec: DeploymentSpec,
    environment: ServingEnvironment,
    *,
    custom_preset: ModelPreset | None = None,
    measured_weights_gib: float | None = None,
) -> ServingPlan:
    """Plan a deployment; raises ``InvalidMessage`` (naming the field) on inputs that cannot be served."""
    model = _resolve_preset(spec, custom_preset)
    slice_ = accelerator(spec.accelerator)
    options = spec.serving
    if options.dtype not in model.weight_dtypes:
        raise InvalidMessage(
            "serving.dtype",
            f"{model.name} does not offer {options.dtype}",
            f"use one of {', '.join(model.weight_dtypes)}",
        )
    max_model_len = options.max_model_len or model.default_max_model_len
    max_num_seqs = options.max_num_seqs or model.default_max_num_seqs
    batched = _batched_tokens(model, options, max_num_seqs)

    capacity = estimate_capacity(
        model,
        slice_,
        weight_dtype=options.dtype,
        kv_cache_dtype=options.kv_cache_dtype,
        gpu_memory_utilization=options.gpu_memory_utilization,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=batched,
        block_size=options.block_size,
        measured_weights_gib=measured_weights_gib,
    )
    smallest = None
    if not capacity.fits:
        smallest = _smallest_fitting(model, slice_, options, max_model_len, max_num_seqs, batched)
    engine = _engine_config(model, capacity, options, environment, max_model_len, max_num_seqs, batched)
    costs, unpriced = _costs(spec, slice_)
    notes = list(capacity.notes)
    if model.revision is None:
        notes.append(f"{model.hub_id} is not pinned to a revision; the boot log records the snapshot downloaded")
    if options.preset:
        notes.append(f"serving flags from the verified preset of tune run {options.preset}")
    return ServingPlan(
        spec=spec,
        environment=environment,
        preset=model,
        slice=slice_,
        engine=engine,
        launch=build_launch(engine),
        capacity=capacity,
        costs=costs,
        unpriced=unpriced,
        smallest_fitting_slice=smallest,
        hf_token_resource=secret_resource(environment.project, environment.hf_token_secret, environment.secret_version),
        api_key_resource=secret_resource(environment.project, environment.api_key_secret, environment.secret_version),
        notes=tuple(notes),
    )


def _batched_tokens(model: ModelPreset, options: ServingOptions, max_num_seqs: int) -> int:
    """The spec's max_num_batched_tokens (e.g. a tuned preset's) or the model's default, refused where vLLM would
    refuse it: below one token per sequence, or below the model's largest image (a multimodal model)."""
    chosen = options.max_num_batched_tokens
    if chosen is None:
        return max(model.default_max_num_batched_tokens, model.min_batched_tokens)
    if chosen < model.min_batched_tokens:
        raise InvalidMessage(
            "serving.max_num_batched_tokens",
            f"{chosen} is below {model.name}'s largest image ({model.min_batched_tokens} tokens)",
            f"give at least {model.min_batched_tokens}, or leave it unset for the plan's choice",
        )
    if chosen < max_num_seqs:
        raise InvalidMessage(
            "serving.max_num_batched_tokens",
            f"{chosen} is below max_num_seqs {max_num_seqs} (vLLM schedules at least one token per sequence)",
            f"give at least {max_num_seqs} or lower max_num_seqs",
        )
    return chosen


def _smallest_fitting(
    model: ModelPreset,
    slice_: AcceleratorSpec,
    options: ServingOptions,
    max_model_len: int,
    max_num_seqs: int,
    batched: int,
) -> str | None:
    """The smallest slice of the same family that would serve these options (the hint when this one does not)."""
    found = smallest_fitting_slice(
        model,
        families=(slice_.family,),
        weight_dtype=options.dtype,
        kv_cache_dtype=options.kv_cache_dtype,
        gpu_memory_utilization=options.gpu_memory_utilization,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=batched,
    )
    return found.name if found else None


def _engine_config(
    model: ModelPreset,
    capacity: CapacityReport,
    options: ServingOptions,
    environment: ServingEnvironment,
    max_model_len: int,
    max_num_seqs: int,
    batched: int,
) -> EngineConfig:
    """The vLLM settings: the preset's parsers and pins, the spec's options, the layout the estimate chose."""
    return EngineConfig(
        model=model.hub_id,
        served_name=model.served_name,
        tensor_parallel=capacity.tensor_parallel,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=batched,
        gpu_memory_utilization=options.gpu_memory_utilization,
        kv_cache_dtype=options.kv_cache_dtype,
        weight_dtype=options.dtype,
        block_size=capacity.block_size,
        revision=model.revision,
        tool_parser=model.tool_parser,
        reasoning_parser=model.reasoning_parser,
        multimodal=model.multimodal,
        prefix_caching=options.prefix_caching,
        fp8_env=model.fp8_env,
        image=environment.image,
        host=environment.bind_host,
        port=environment.port,
    )

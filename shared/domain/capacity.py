"""HBM capacity model: does a model fit a slice, and how many KV-cache tokens does vLLM get?

Why: a user should know before paying for a slice whether the weights fit, how large the KV pool is and how
many full-context sequences run at once. The model follows how vLLM on TPU budgets memory:
``KV pool per chip = gpu_memory_utilization x usable HBM - weights per chip``, cut into blocks of
``block_size`` tokens, each token costing the KV bytes of every layer that keeps its own cache. On CPU the
pool is ``VLLM_CPU_KVCACHE_SPACE`` GiB. Weights come, in order of preference, from a figure the caller measured
(the first boot log), a published measurement in the catalog for the same slice and dtype, or the
parameter-count estimate scaled by that preset's published measurement (``weights_source`` says which).
All numbers come from the catalog or the caller.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from shared.domain.catalog import (
    ACCELERATORS,
    CPU_RUNTIME,
    DTYPE_BYTES,
    AcceleratorSpec,
    KvHeadPolicy,
    ModelPreset,
)
from shared.domain.errors import InvalidMessage

__all__ = [
    "GIB",
    "HEADROOM",
    "CapacityReport",
    "CpuKvPool",
    "HeadroomModel",
    "cpu_kv_pool",
    "estimate_capacity",
    "kv_bytes_per_token_per_chip",
    "kv_heads_per_chip",
    "smallest_fitting_slice",
    "weight_bytes_per_chip",
    "weights_per_chip",
]

GIB = 1024**3
# K and V are both stored (Gemma 4's K=V layers included: docs/reference/reference-agent.md §11)
KV_TENSORS_PER_LAYER = 2


@dataclass(frozen=True, slots=True)
class HeadroomModel:
    """Rough HBM the runtime needs outside the weights+KV budget, per chip (assumed; not measured)."""

    runtime_reserve_gib: float  # XLA programs, runtime scratch
    activation_values_per_hidden: int  # live activation tensors of width hidden_size per batched token
    logits_bytes: int  # bytes per vocabulary entry of the sampler's logits (float32)
    source: str


HEADROOM = HeadroomModel(
    runtime_reserve_gib=0.5,
    activation_values_per_hidden=16,
    logits_bytes=4,
    source=(
        "(assumed) order-of-magnitude reserve; docs/reference/vllm.md §8.2 reports allocation failures only at 0.95+"
    ),
)


def kv_heads_per_chip(kv_heads: int, tensor_parallel: int, policy: KvHeadPolicy) -> int:
    """KV heads one chip holds under tensor parallelism."""
    if kv_heads % tensor_parallel == 0:
        return kv_heads // tensor_parallel
    if policy == "replicate":
        return kv_heads
    return max(1, kv_heads // tensor_parallel)


def _kv_dtype(preset: ModelPreset, kv_cache_dtype: str) -> str:
    dtype = preset.checkpoint_dtype if kv_cache_dtype == "auto" else kv_cache_dtype
    if dtype not in DTYPE_BYTES:
        raise InvalidMessage("serving.kv_cache_dtype", f"{kv_cache_dtype!r} is not known", "use auto or fp8")
    return dtype


def kv_bytes_per_token_per_chip(
    preset: ModelPreset, tensor_parallel: int, kv_cache_dtype: str = "auto", policy: KvHeadPolicy = "replicate"
) -> int:
    """KV-cache bytes one token costs on one chip, over every layer that keeps its own cache."""
    element = DTYPE_BYTES[_kv_dtype(preset, kv_cache_dtype)]
    return sum(
        group.layers
        * kv_heads_per_chip(group.kv_heads, tensor_parallel, policy)
        * group.head_dim
        * KV_TENSORS_PER_LAYER
        * element
        for group in preset.attention
    )


def _windowed_bytes_per_sequence(
    preset: ModelPreset, tensor_parallel: int, kv_cache_dtype: str, policy: KvHeadPolicy, context: int, block: int
) -> int:
    element = DTYPE_BYTES[_kv_dtype(preset, kv_cache_dtype)]
    total = 0
    for group in preset.attention:
        tokens = context if group.window is None else min(context, group.window + block)
        heads = kv_heads_per_chip(group.kv_heads, tensor_parallel, policy)
        total += group.layers * heads * group.head_dim * KV_TENSORS_PER_LAYER * element * tokens
    return total


def weight_bytes_per_chip(preset: ModelPreset, tensor_parallel: int, weight_dtype: str = "bfloat16") -> int:
    """Weight bytes on one chip: TP- and expert-sharded groups divide, replicated groups do not."""
    if weight_dtype not in preset.weight_dtypes:
        raise InvalidMessage(
            "serving.dtype",
            f"{preset.name} does not offer {weight_dtype}",
            f"use one of {', '.join(preset.weight_dtypes)}",
        )
    total = 0.0
    for group in preset.params:
        dtype = weight_dtype if group.quantizable else preset.checkpoint_dtype
        size = group.params * DTYPE_BYTES[dtype]
        total += size if group.sharding == "replicated" else size / tensor_parallel
    return int(total)


def weights_per_chip(
    preset: ModelPreset,
    slice_name: str,
    tensor_parallel: int,
    weight_dtype: str,
    measured_gib: float | None = None,
) -> tuple[float, str]:
    """Weight bytes per chip and where the figure came from (measured, published, calibrated or estimated)."""
    estimate = weight_bytes_per_chip(preset, tensor_parallel, weight_dtype)
    if measured_gib is not None:
        return measured_gib * GIB, "measured"
    for point in preset.measured_weights:
        if (point.accelerator, point.weight_dtype, point.tensor_parallel) == (
            slice_name,
            weight_dtype,
            tensor_parallel,
        ):
            return point.gib_per_chip * GIB, f"published ({point.source})"
    if preset.measured_weights:
        point = preset.measured_weights[0]
        ratio = point.gib_per_chip * GIB / weight_bytes_per_chip(preset, point.tensor_parallel, point.weight_dtype)
        return estimate * ratio, f"estimated x{ratio:.3f} (calibrated on {point.accelerator} {point.weight_dtype})"
    return float(estimate), "estimated from parameter counts"


@dataclass(frozen=True, slots=True)
class CapacityReport:
    """Per-chip HBM layout, KV pool and verdict for one model on one slice with one set of knobs."""

    model: str
    accelerator: str
    chips: int
    tensor_parallel: int
    weight_dtype: str
    kv_cache_dtype: str
    gpu_memory_utilization: float
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    usable_hbm_gib: float
    weights_gib: float
    weights_estimate_gib: float
    weights_source: str
    kv_budget_gib: float
    kv_allocated_gib: float
    free_gib: float
    activation_estimate_gib: float
    kv_bytes_per_token: int
    kv_heads_per_chip: tuple[int, ...]
    head_dims: tuple[int, ...]
    num_blocks: int
    kv_tokens: int
    max_sequences_at_context: int
    max_sequences_if_windows_freed: int
    fits: bool
    reasons: tuple[str, ...]
    notes: tuple[str, ...]

    @property
    def max_concurrency(self) -> float:
        """What vLLM logs as "Maximum concurrency for N tokens per request"."""
        return self.kv_tokens / self.max_model_len

    def table(self) -> str:
        """A per-chip markdown table in the shape of the reference agent's HBM report."""
        heads = "/".join(str(h) for h in self.kv_heads_per_chip)
        dims = "/".join(str(d) for d in self.head_dims)
        kv_dtype = self.kv_cache_dtype
        weights_label = f"Weights per chip — {self.weights_source}"
        rows = [
            ("Model / slice", f"{self.model} on {self.accelerator} (TP {self.tensor_parallel}, {self.weight_dtype})"),
            ("Usable HBM per chip", f"{self.usable_hbm_gib:.2f} GiB"),
            ("Utilisation target (--gpu-memory-utilization)", f"{self.gpu_memory_utilization:.0%}"),
            (weights_label, f"{self.weights_gib:.2f} GiB"),
            ("KV cache per chip", f"{self.kv_allocated_gib:.2f} GiB (budget {self.kv_budget_gib:.2f} GiB)"),
            ("Free per chip", f"{self.free_gib:.2f} GiB (activations need ~{self.activation_estimate_gib:.2f} GiB)"),
            (
                "KV cache shape",
                f"({self.num_blocks} blocks, {self.block_size} tokens/block, {heads} KV heads, {dims} head dim), "
                f"{kv_dtype}",
            ),
            ("KV bytes per token per chip", f"{self.kv_bytes_per_token:,} B"),
            ("KV tokens in total", f"{self.kv_tokens:,}"),
            ("Context (--max-model-len)", f"{self.max_model_len:,}"),
            ("Full-context sequences at once", f"{self.max_sequences_at_context:,}"),
            ("Verdict", "fits" if self.fits else "does not fit: " + "; ".join(self.reasons)),
        ]
        lines = ["| Figure | Value |", "|---|---|"]
        lines += [f"| {name} | {value} |" for name, value in rows]
        return "\n".join(lines)


def _activation_bytes(preset: ModelPreset, batched_tokens: int, num_seqs: int, headroom: HeadroomModel) -> float:
    activations = batched_tokens * preset.hidden_size * DTYPE_BYTES["bfloat16"] * headroom.activation_values_per_hidden
    logits = num_seqs * preset.vocab_size * headroom.logits_bytes
    return activations + logits + headroom.runtime_reserve_gib * GIB


def estimate_capacity(
    preset: ModelPreset,
    slice_: AcceleratorSpec,
    *,
    weight_dtype: str = "bfloat16",
    kv_cache_dtype: str = "auto",
    gpu_memory_utilization: float = 0.90,
    max_model_len: int | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    tensor_parallel: int | None = None,
    block_size: int | None = None,
    measured_weights_gib: float | None = None,
    headroom: HeadroomModel = HEADROOM,
) -> CapacityReport:
    """The per-chip layout and verdict; ``measured_weights_gib`` replaces the weight estimate when known."""
    if not 0 < gpu_memory_utilization <= 1:
        raise InvalidMessage("serving.gpu_memory_utilization", "must be in (0, 1]", "e.g. 0.90")
    tp = tensor_parallel or slice_.chips
    if tp < 1 or tp > slice_.chips:
        raise InvalidMessage("tensor_parallel", f"{tp} is outside 1..{slice_.chips}", "use the slice's chip count")
    context = max_model_len or preset.default_max_model_len
    seqs = max_num_seqs or preset.default_max_num_seqs
    batched = max_num_batched_tokens or preset.default_max_num_batched_tokens
    block = block_size or slice_.runtime.kv_block_size
    policy = slice_.runtime.kv_head_policy
    usable = slice_.hbm_gib_usable * GIB

    estimated = weight_bytes_per_chip(preset, tp, weight_dtype)
    weights, weights_source = weights_per_chip(preset, slice_.name, tp, weight_dtype, measured_weights_gib)
    budget = max(0.0, gpu_memory_utilization * usable - weights)
    per_token = kv_bytes_per_token_per_chip(preset, tp, kv_cache_dtype, policy)
    blocks = int(budget // (block * per_token))
    tokens = blocks * block
    allocated = blocks * block * per_token
    free = usable - weights - allocated
    activation = _activation_bytes(preset, batched, seqs, headroom)
    per_sequence = _windowed_bytes_per_sequence(preset, tp, kv_cache_dtype, policy, context, block)
    layout = _Layout(
        tp=tp, context=context, seqs=seqs, batched=batched, block=block, usable=usable, estimated=estimated,
        weights=weights, weights_source=weights_source, budget=budget, per_token=per_token, blocks=blocks,
        tokens=tokens, allocated=allocated, free=free, activation=activation, per_sequence=per_sequence,
    )  # fmt: skip
    return _report(preset, slice_, layout, weight_dtype, kv_cache_dtype, gpu_memory_utilization)


def _report(
    preset: ModelPreset,
    slice_: AcceleratorSpec,
    layout: _Layout,
    weight_dtype: str,
    kv_cache_dtype: str,
    gpu_memory_utilization: float,
) -> CapacityReport:
    """The layout in GiB, with the verdict: the reasons it does not fit and the notes on what it costs."""
    tp, context, tokens = layout.tp, layout.context, layout.tokens
    reasons = _reasons_it_does_not_fit(preset, slice_, layout, gpu_memory_utilization)
    return CapacityReport(
        model=preset.name,
        accelerator=slice_.name,
        chips=slice_.chips,
        tensor_parallel=tp,
        weight_dtype=weight_dtype,
        kv_cache_dtype=_kv_dtype(preset, kv_cache_dtype),
        gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=context,
        max_num_seqs=layout.seqs,
        max_num_batched_tokens=layout.batched,
        block_size=layout.block,
        usable_hbm_gib=slice_.hbm_gib_usable,
        weights_gib=layout.weights / GIB,
        weights_estimate_gib=layout.estimated / GIB,
        weights_source=layout.weights_source,
        kv_budget_gib=layout.budget / GIB,
        kv_allocated_gib=layout.allocated / GIB,
        free_gib=layout.free / GIB,
        activation_estimate_gib=layout.activation / GIB,
        kv_bytes_per_token=layout.per_token,
        kv_heads_per_chip=tuple(
            kv_heads_per_chip(g.kv_heads, tp, slice_.runtime.kv_head_policy) for g in preset.attention
        ),
        head_dims=tuple(g.head_dim for g in preset.attention),
        num_blocks=layout.blocks,
        kv_tokens=tokens,
        max_sequences_at_context=tokens // context,
        max_sequences_if_windows_freed=int(layout.allocated // layout.per_sequence) if layout.per_sequence else 0,
        fits=not reasons,
        reasons=tuple(reasons),
        notes=tuple(_layout_notes(preset, layout)),
    )


@dataclass(frozen=True, slots=True)
class _Layout:
    """The per-chip numbers the verdict is judged on (bytes, tokens), computed once by ``estimate_capacity``."""

    tp: int
    context: int
    seqs: int
    batched: int
    block: int
    usable: float
    estimated: float
    weights: float
    weights_source: str
    budget: float
    per_token: int
    blocks: int
    tokens: int
    allocated: float
    free: float
    activation: float
    per_sequence: int


def _reasons_it_does_not_fit(
    preset: ModelPreset, slice_: AcceleratorSpec, layout: _Layout, gpu_memory_utilization: float
) -> list[str]:
    """Why vLLM would refuse to start (or run out of memory) with this layout; empty when it fits."""
    tp, context, weights, usable = layout.tp, layout.context, layout.weights, layout.usable
    reasons: list[str] = []
    if preset.num_attention_heads % tp:
        reasons.append(f"tensor parallel size {tp} does not divide {preset.num_attention_heads} attention heads")
    if weights >= gpu_memory_utilization * usable:
        reasons.append(
            f"weights {weights / GIB:.2f} GiB per chip exceed the {gpu_memory_utilization * usable / GIB:.2f} GiB "
            f"vLLM may use ({gpu_memory_utilization:.2f} x {slice_.hbm_gib_usable:.2f} GiB): use fp8 weights "
            "or a larger slice"
        )
    elif layout.tokens < context:
        reasons.append(
            f"the KV pool holds {layout.tokens:,} tokens, fewer than one {context:,}-token sequence: lower "
            "max_model_len, use kv_cache_dtype fp8, raise gpu_memory_utilization or use a larger slice"
        )
    if weights < gpu_memory_utilization * usable and layout.free < layout.activation:
        reasons.append(
            f"{layout.free / GIB:.2f} GiB left per chip for activations, about {layout.activation / GIB:.2f} GiB "
            "needed: lower gpu_memory_utilization or max_num_batched_tokens"
        )
    if context > preset.max_position_embeddings:
        reasons.append(f"max_model_len {context} exceeds the model's {preset.max_position_embeddings} positions")
    return reasons


def _layout_notes(preset: ModelPreset, layout: _Layout) -> list[str]:
    """What the operator should know about a layout that still starts (uneven experts, queueing, estimates)."""
    tp, context, tokens, seqs = layout.tp, layout.context, layout.tokens, layout.seqs
    notes: list[str] = []
    if preset.num_experts and preset.num_experts % tp:
        notes.append(f"{preset.num_experts} experts do not split evenly over {tp} chips")
    if layout.batched < preset.min_batched_tokens:
        notes.append(
            f"max_num_batched_tokens {layout.batched} is below the largest image ({preset.min_batched_tokens} tokens)"
        )
    if tokens and seqs * context > tokens:
        notes.append(f"at full context only {tokens // context} of {seqs} sequences run at once; the rest queue")
    if layout.weights != layout.estimated:
        notes.append(
            f"parameter-count estimate {layout.estimated / GIB:.2f} GiB per chip; used {layout.weights / GIB:.2f} GiB"
        )
    return notes


def smallest_fitting_slice(
    preset: ModelPreset,
    *,
    families: Iterable[str] = ("v6e",),
    candidates: Iterable[AcceleratorSpec] | None = None,
    weight_dtype: str = "bfloat16",
    kv_cache_dtype: str = "auto",
    gpu_memory_utilization: float = 0.90,
    max_model_len: int | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
) -> AcceleratorSpec | None:
    """The slice with the fewest chips (then least HBM) on which the model fits with these knobs, or None."""
    wanted = set(families)
    pool = [s for s in (candidates if candidates is not None else ACCELERATORS.values()) if s.family in wanted]
    for slice_ in sorted(pool, key=lambda s: (s.chips, s.hbm_gib_usable)):
        report = estimate_capacity(
            preset,
            slice_,
            weight_dtype=weight_dtype,
            kv_cache_dtype=kv_cache_dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
        )
        if report.fits:
            return slice_
    return None


@dataclass(frozen=True, slots=True)
class CpuKvPool:
    """The KV pool vLLM on CPU builds from ``VLLM_CPU_KVCACHE_SPACE``."""

    kv_space_gib: float
    block_size: int
    kv_bytes_per_token: int
    num_blocks: int
    tokens: int

    def max_concurrency(self, max_model_len: int) -> float:
        return self.tokens / max_model_len


def cpu_kv_pool(preset: ModelPreset, kv_space_gib: float, kv_cache_dtype: str = "auto") -> CpuKvPool:
    """Blocks and tokens for ``VLLM_CPU_KVCACHE_SPACE=kv_space_gib`` (one CPU rank, no tensor parallelism)."""
    if kv_space_gib <= 0:
        raise InvalidMessage("kv_space_gib", "must be positive", "VLLM_CPU_KVCACHE_SPACE is in GiB, e.g. 1")
    block = CPU_RUNTIME.kv_block_size
    per_token = kv_bytes_per_token_per_chip(preset, 1, kv_cache_dtype, CPU_RUNTIME.kv_head_policy)
    blocks = int(kv_space_gib * GIB // (block * per_token))
    return CpuKvPool(kv_space_gib, block, per_token, blocks, blocks * block)

"""The physical ceiling of decode throughput, and whether a measured benchmark is plausible against it (pure).

Why: a benchmark figure is only as good as its measurement. One faster than the slice can physically go means the
measurement is wrong (cached answers, miscounted tokens, failed requests counted as fast); one far below it means
the engine is not healthy (a fallback attention path, host offload, throttling). Both deserve a finding.

The ceiling (a roofline, nominal figures from the catalog, docs/reference/vllm.md §8.4): every decode step
produces one token for each of ``c`` running sequences and

* reads each weight byte the step uses once (multimodal encoders idle during text decode and per-token lookup
  tables read a row, not the table, so neither counts; of the experts, the share ``1 - (1 - k/E)^c`` the ``c``
  sequences are expected to route to) plus each sequence's KV cache at the mean context of the run
  (``input + output/2``; sliding layers stop at their window) across ``chips x HBM bandwidth``;
* computes ``2 x active parameters`` FLOPs per output token, plus the same per prompt token when the prompt must
  be prefilled (no shared prefix), against ``chips x peak bf16 compute``.

``bound = min(c x chips x bandwidth / bytes per step, chips x peak / FLOPs per output token)``. Lengths unknown:
the KV term and prefill are left out (a looser ceiling, still a ceiling). Unknown model, slice, dtype or figures,
and non-finite or negative inputs (they come from the VM, untrusted) give no verdict (None), never an error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from shared.domain.capacity import KV_TENSORS_PER_LAYER
from shared.domain.catalog import ACCELERATORS, DTYPE_BYTES, PRESETS, AcceleratorSpec, ModelPreset

__all__ = [
    "FLOOR_LOW",
    "TOLERANCE_HIGH",
    "ThroughputVerdict",
    "bound_summary",
    "decode_bound",
    "judge_throughput",
]

TOLERANCE_HIGH = 1.10
"""Above ``bound x 1.10`` is implausibly high: the margin absorbs nominal figures, rounded parameter counts and
expert routing that touches fewer experts than expected; a healthy engine reaches well under the roofline."""
FLOOR_LOW = 0.05
"""Below 5% of the bound is implausibly low: healthy vLLM on TPU decodes at tens of percent of the roofline."""

_LOOKUP_GROUPS = frozenset({"per_layer_embeddings"})  # read one row per token, not the whole table

Verdict = Literal["plausible", "implausibly high", "implausibly low"]


@dataclass(frozen=True, slots=True)
class ThroughputVerdict:
    """A measured output throughput against the slice's physical ceiling for that model and concurrency."""

    measured_tok_s: float
    bound_tok_s: float
    efficiency: float  # measured / bound
    limited_by: Literal["memory bandwidth", "compute"]
    verdict: Verdict
    finding: str | None  # names both figures when the verdict is implausible

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "measured_tok_s": round(self.measured_tok_s, 2),
            "bound_tok_s": round(self.bound_tok_s, 2),
            "efficiency": round(self.efficiency, 4),
            "limited_by": self.limited_by,
            "verdict": self.verdict,
        }
        return {**out, "finding": self.finding} if self.finding else out


def _number(value: Any, *, positive: bool = False) -> float | None:
    """A finite, non-negative number (positive when asked); anything else (bool, NaN, -1, text) is missing."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return None
    return None if positive and value == 0 else float(value)


def _weights(preset: ModelPreset, weight_dtype: str, concurrency: float) -> tuple[float, float]:
    """(bytes one decode step reads, active parameters per token) over the whole slice."""
    read, active = 0.0, 0.0
    for group in preset.params:
        if group.sharding == "replicated" or group.name in _LOOKUP_GROUPS:
            continue
        size = group.params * DTYPE_BYTES[weight_dtype if group.quantizable else preset.checkpoint_dtype]
        if group.sharding == "expert" and preset.num_experts and preset.experts_per_token:
            share = preset.experts_per_token / preset.num_experts
            read += size * (1 - (1 - share) ** concurrency)
            active += group.params * share
        else:
            read += size
            active += group.params
    return read, active


def _kv_bytes_per_sequence(preset: ModelPreset, kv_cache_dtype: str, context: float) -> float:
    """KV bytes one sequence's step reads at ``context`` tokens: every KV head once, windows respected."""
    element = DTYPE_BYTES[preset.checkpoint_dtype if kv_cache_dtype == "auto" else kv_cache_dtype]
    return sum(
        g.layers * g.kv_heads * g.head_dim * KV_TENSORS_PER_LAYER * element * min(context, g.window or context)
        for g in preset.attention
    )


def decode_bound(
    preset: ModelPreset,
    slice_: AcceleratorSpec,
    concurrency: float,
    *,
    input_tokens: float | None = None,
    output_tokens: float | None = None,
    prefill: bool = False,
    weight_dtype: str = "bfloat16",
    kv_cache_dtype: str = "auto",
) -> tuple[float, Literal["memory bandwidth", "compute"]] | None:
    """The ceiling of output tok/s and what sets it; None without the slice's figures or with unknown dtypes."""
    bandwidth, peak = slice_.hbm_bandwidth_bytes_per_s, slice_.peak_bf16_flops
    known_kv = kv_cache_dtype == "auto" or kv_cache_dtype in DTYPE_BYTES
    if not bandwidth or not peak or weight_dtype not in preset.weight_dtypes or not known_kv:
        return None
    weight_bytes, active = _weights(preset, weight_dtype, concurrency)
    kv = 0.0
    if input_tokens is not None and output_tokens is not None:
        kv = _kv_bytes_per_sequence(preset, kv_cache_dtype, input_tokens + output_tokens / 2)
    memory = concurrency * slice_.chips * bandwidth / (weight_bytes + concurrency * kv)
    flops_per_output = 2 * active
    if prefill and input_tokens is not None and output_tokens:
        flops_per_output *= (input_tokens + output_tokens) / output_tokens
    compute = slice_.chips * peak / flops_per_output
    return (memory, "memory bandwidth") if memory <= compute else (compute, "compute")


def judge_throughput(
    model: str,
    accelerator: str,
    *,
    concurrency: Any,
    measured_tok_s: Any,
    input_tokens: Any = None,
    output_tokens: Any = None,
    prefill: bool = False,
    weight_dtype: str = "bfloat16",
    kv_cache_dtype: str = "auto",
) -> ThroughputVerdict | None:
    """The verdict on one measured level; None when the model, slice or any needed figure is unknown or bad."""
    preset, slice_ = PRESETS.get(model), ACCELERATORS.get(accelerator)
    users, measured = _number(concurrency, positive=True), _number(measured_tok_s)
    inputs, outputs = _number(input_tokens), _number(output_tokens, positive=True)
    if preset is None or slice_ is None or users is None or measured is None:
        return None
    found = decode_bound(
        preset,
        slice_,
        users,
        input_tokens=inputs,
        output_tokens=outputs,
        prefill=prefill,
        weight_dtype=weight_dtype,
        kv_cache_dtype=kv_cache_dtype,
    )
    if found is None:
        return None
    bound, limited_by = found
    efficiency = measured / bound
    verdict: Verdict = "plausible"
    if measured > bound * TOLERANCE_HIGH:
        verdict = "implausibly high"
    elif efficiency < FLOOR_LOW:
        verdict = "implausibly low"
    finding = None
    if verdict != "plausible":
        finding = (
            f"throughput {verdict}: {measured:,.1f} tok/s measured, {efficiency:.1%} of {slice_.name}'s bound of "
            f"{bound:,.0f} tok/s for {preset.name} at concurrency {users:g} ({limited_by})"
        )
    return ThroughputVerdict(measured, bound, efficiency, limited_by, verdict, finding)


def bound_summary(stored: Any) -> str | None:
    """One line for people from a stored check (``{"levels": [...], "findings": [...]}``): the first finding,
    else how the peak level compares with its bound. None when there is no check (results stored before it)."""
    levels = stored.get("levels") if isinstance(stored, dict) else None
    rows = [row for row in levels if isinstance(row, dict)] if isinstance(levels, list) else []
    findings = [text for text in stored.get("findings") or () if isinstance(text, str)] if rows else []
    if findings:
        more = f" (and {len(findings) - 1} more level(s))" if len(findings) > 1 else ""
        return findings[0] + more
    scored = [(m, row) for row in rows if (m := _number(row.get("measured_tok_s"))) is not None]
    if not scored:
        return None
    measured, peak = max(scored, key=lambda item: item[0])
    bound, efficiency = _number(peak.get("bound_tok_s")), _number(peak.get("efficiency"))
    if bound is None or efficiency is None:
        return None
    return (
        f"throughput against the physical bound: {measured:,.1f} tok/s at the peak level, {efficiency:.1%} of "
        f"the bound of {bound:,.0f} tok/s"
    )

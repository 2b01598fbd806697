"""What vLLM actually allocated and chose, read back from its ``/metrics``, against what the plan said.

Why: vLLM on TPU fails quietly. A published run printed an fp8 KV-cache banner while the allocation was bf16
(half the tokens), and nothing but the logs said so. vLLM exports its cache configuration as the labels of
``vllm:cache_config_info`` (``cache_dtype``, ``num_gpu_blocks`` x ``block_size`` = ``kv_cache_size_tokens``,
``kv_cache_max_concurrency``); the monitor keeps those (``MetricsSnapshot.cache_config``, untrusted text reduced
to short plain values) and this module compares them with the deployment's spec and the planner's KV estimate.

What vLLM printed at start-up (``shared.domain.engine_facts``: its config line, KV allocation and attention
backend, read from its log by the node agent) adds the rest of the plan: the weights' quantisation, the context,
the tensor-parallel split, and an attention back end it could not use.

A finding is raised when vLLM runs another KV-cache dtype than the spec asked for, or allocated fewer than
``SHORT_OF_PLAN`` of the planned KV tokens (the harmful direction: less context or concurrency than promised; a
larger pool than planned means the estimate was conservative, which is no fault); when fp8 weights were planned and
nothing was quantised (or the reverse); when it serves a shorter context or another tensor-parallel split than the
plan; or when it refused an attention back end (a slower fallback path, as a published run found only in its
logs). It is tagged ``effective config`` (``shared.services.monitor`` keeps one finding per tag) and kept while the
metrics are not readable, so a failed scrape does not clear and raise it again.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shared.domain.capacity import CapacityReport, estimate_capacity
from shared.domain.catalog import UnknownPreset, accelerator, preset
from shared.domain.engine_facts import EngineFacts
from shared.domain.models import DeploymentSpec

__all__ = ["SHORT_OF_PLAN", "TAG", "EffectiveConfig", "config_finding", "engine_problems", "planned_kv_tokens"]

TAG = "effective config"
SHORT_OF_PLAN = 0.85


@dataclass(frozen=True)
class EffectiveConfig:
    """The cache configuration vLLM reported: KV dtype (``auto`` is the weights' dtype), pool size, concurrency."""

    kv_dtype: str | None
    kv_tokens: int | None
    max_concurrency: float | None

    @classmethod
    def from_labels(cls, labels: Mapping[str, str]) -> EffectiveConfig | None:
        """From ``MetricsSnapshot.cache_config``; None when vLLM exported none."""
        if not labels:
            return None
        tokens = _number(labels.get("kv_cache_size_tokens"))
        if tokens is None:
            blocks, size = _number(labels.get("num_gpu_blocks")), _number(labels.get("block_size"))
            tokens = blocks * size if blocks is not None and size is not None else None
        return cls(
            kv_dtype=labels.get("cache_dtype"),
            kv_tokens=int(tokens) if tokens is not None else None,
            max_concurrency=_number(labels.get("kv_cache_max_concurrency")),
        )


def planned_kv_tokens(spec: DeploymentSpec) -> int | None:
    """The planner's KV-cache tokens for ``spec`` (``shared.domain.capacity``); None for a model it cannot plan."""
    report = _plan(spec)
    return report.kv_tokens if report is not None and report.fits else None


def _plan(spec: DeploymentSpec) -> CapacityReport | None:
    try:
        model = preset(spec.model)
    except UnknownPreset:
        return None
    options = spec.serving
    return estimate_capacity(
        model,
        accelerator(spec.accelerator),
        weight_dtype=options.dtype,
        kv_cache_dtype=options.kv_cache_dtype,
        gpu_memory_utilization=options.gpu_memory_utilization,
        max_model_len=_planned_context(spec) or model.default_max_model_len,
        max_num_seqs=options.max_num_seqs or model.default_max_num_seqs,
        max_num_batched_tokens=max(model.default_max_num_batched_tokens, model.min_batched_tokens),
    )


def _planned_context(spec: DeploymentSpec) -> int | None:
    if spec.serving.max_model_len:
        return spec.serving.max_model_len
    try:
        return preset(spec.model).default_max_model_len
    except UnknownPreset:
        return None


def config_finding(
    spec: DeploymentSpec,
    cache_config: Mapping[str, str] | None,
    previous: Sequence[str],
    engine: EngineFacts | None = None,
) -> str | None:
    """The ``effective config`` finding for one scrape, or None; with no cache configuration read this tick,
    the previous finding (from ``previous``, the record's findings) stands. ``engine``: the newest start-up facts."""
    effective = EffectiveConfig.from_labels(cache_config) if cache_config is not None else None
    if effective is None:
        return next((text for text in previous if text.partition(":")[0] == TAG), None)
    kv_dtype = effective.kv_dtype or (engine.kv_cache_dtype if engine else None)
    problems = _dtype_problems(spec.serving.kv_cache_dtype, kv_dtype)
    planned = planned_kv_tokens(spec)
    tokens = effective.kv_tokens if effective.kv_tokens is not None else (engine.kv_cache_tokens if engine else None)
    if planned and tokens is not None and tokens < SHORT_OF_PLAN * planned:
        problems.append(
            f"planned {planned:,} KV tokens, vLLM allocated {tokens:,} ({tokens / planned:.0%} of the plan)"
        )
    if engine is not None:
        problems += engine_problems(spec, engine)
    return f"{TAG}: " + "; ".join(problems) if problems else None


def engine_problems(spec: DeploymentSpec, engine: EngineFacts) -> list[str]:
    """What the start-up facts contradict in the plan: quantisation, context, tensor-parallel split, back end."""
    problems = []
    if spec.serving.dtype == "fp8" and engine.quantization is not None and not engine.quantized:
        problems.append("planned fp8 weights, vLLM quantised nothing: about 2x the HBM for weights")
    elif spec.serving.dtype != "fp8" and engine.quantized:
        problems.append(f"vLLM quantised the weights to {engine.quantization}, which the spec did not ask for")
    context = _planned_context(spec)
    if context and engine.max_model_len is not None and engine.max_model_len < context:
        problems.append(f"planned a {context:,}-token context, vLLM serves {engine.max_model_len:,}")
    report = _plan(spec)
    split = report.tensor_parallel if report is not None and report.fits else None
    if split and engine.tensor_parallel is not None and engine.tensor_parallel != split:
        problems.append(f"planned tensor parallel {split}, vLLM runs {engine.tensor_parallel}")
    if engine.refused_backends:
        used = ", ".join(engine.attention_backends) or "another"
        problems.append(f"vLLM could not use the {', '.join(engine.refused_backends)} back end and runs {used}")
    return problems


def _dtype_problems(planned: str, running: str | None) -> list[str]:
    """fp8 asked and not running (half the tokens), or fp8 running unasked (quantised KV nobody chose)."""
    if running is None:
        return []
    running_fp8 = running.startswith("fp8")
    if planned == "fp8" and not running_fp8:
        return [f"planned fp8 KV cache, vLLM runs {running} (the weights' dtype): about 2x fewer tokens"]
    if planned != "fp8" and running_fp8:
        return [f"planned {planned} KV cache, vLLM runs {running}: quantised KV the spec did not ask for"]
    return []


def _number(text: str | None) -> float | None:
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) and value >= 0 else None

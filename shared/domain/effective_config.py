"""What vLLM actually allocated and chose, read back from its ``/metrics``, against what the plan said.

Why: vLLM on TPU fails quietly. A published run printed an fp8 KV-cache banner while the allocation was bf16
(half the tokens), and nothing but the logs said so. vLLM exports its cache configuration as the labels of
``vllm:cache_config_info`` (``cache_dtype``, ``num_gpu_blocks`` x ``block_size`` = ``kv_cache_size_tokens``,
``kv_cache_max_concurrency``); the monitor keeps those (``MetricsSnapshot.cache_config``, untrusted text reduced
to short plain values) and this module compares them with the deployment's spec and the planner's KV estimate.

A finding is raised when vLLM runs another KV-cache dtype than the spec asked for, or allocated fewer than
``SHORT_OF_PLAN`` of the planned KV tokens (the harmful direction: less context or concurrency than promised; a
larger pool than planned means the estimate was conservative, which is no fault). It is tagged
``effective config`` (``shared.services.monitor`` keeps one finding per tag) and kept while the metrics are
not readable, so a failed scrape does not clear and raise it again.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shared.domain.capacity import estimate_capacity
from shared.domain.catalog import UnknownPreset, accelerator, preset
from shared.domain.models import DeploymentSpec

__all__ = ["SHORT_OF_PLAN", "TAG", "EffectiveConfig", "config_finding", "planned_kv_tokens"]

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
    try:
        model = preset(spec.model)
    except UnknownPreset:
        return None
    options = spec.serving
    report = estimate_capacity(
        model,
        accelerator(spec.accelerator),
        weight_dtype=options.dtype,
        kv_cache_dtype=options.kv_cache_dtype,
        gpu_memory_utilization=options.gpu_memory_utilization,
        max_model_len=options.max_model_len or model.default_max_model_len,
        max_num_seqs=options.max_num_seqs or model.default_max_num_seqs,
        max_num_batched_tokens=max(model.default_max_num_batched_tokens, model.min_batched_tokens),
    )
    return report.kv_tokens if report.fits else None


def config_finding(spec: DeploymentSpec, cache_config: Mapping[str, str] | None, previous: Sequence[str]) -> str | None:
    """The ``effective config`` finding for one scrape, or None; with no cache configuration read this tick,
    the previous finding (from ``previous``, the record's findings) stands."""
    effective = EffectiveConfig.from_labels(cache_config) if cache_config is not None else None
    if effective is None:
        return next((text for text in previous if text.partition(":")[0] == TAG), None)
    problems = _dtype_problems(spec.serving.kv_cache_dtype, effective.kv_dtype)
    planned = planned_kv_tokens(spec)
    if planned and effective.kv_tokens is not None and effective.kv_tokens < SHORT_OF_PLAN * planned:
        problems.append(
            f"planned {planned:,} KV tokens, vLLM allocated {effective.kv_tokens:,} "
            f"({effective.kv_tokens / planned:.0%} of the plan)"
        )
    return f"{TAG}: " + "; ".join(problems) if problems else None


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

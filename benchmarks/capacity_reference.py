"""Reproduce the published HBM, KV-cache and cost figures with the capacity and cost models, and print the errors.

Run: ``.venv/bin/python -m benchmarks.capacity_reference``

Inputs are the published ones (docs/reference/reference-agent.md §6 and §11): slice, utilisation, context, KV dtype,
block size
and, where the source measured it, the weights per chip. Prints a markdown table per check with the relative
error, plus the per-chip table for the reference configuration and the raw parameter-count weight estimates.
"""

from __future__ import annotations

from shared.domain.capacity import GIB, cpu_kv_pool, estimate_capacity, weight_bytes_per_chip
from shared.domain.catalog import ACCELERATORS, PRESETS
from shared.domain.cost import estimate_cost
from shared.domain.models import Tier


def number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def error(predicted: float, published: float) -> str:
    return f"{(predicted - published) / published:+.2%}"


def main() -> None:
    reference = estimate_capacity(
        PRESETS["gemma-4-26b-a4b"],
        ACCELERATORS["v6e-4"],
        weight_dtype="fp8",
        kv_cache_dtype="fp8",
        gpu_memory_utilization=0.80,
        max_model_len=16_384,
    )
    e2b = estimate_capacity(
        PRESETS["gemma-4-e2b"], ACCELERATORS["v6e-1"], gpu_memory_utilization=0.92, max_model_len=32_768, block_size=64
    )
    flex = estimate_cost("v6e-1", "us-east5-b", Tier.FLEX_START)
    rows = [
        ("26B-A4B fp8 v6e-4 0.80: KV per chip (GiB)", reference.kv_allocated_gib, 15.32),
        ("26B-A4B fp8 v6e-4 0.80: KV blocks of 32", reference.num_blocks, 14_320),
        ("26B-A4B fp8 v6e-4 0.80: KV tokens", reference.kv_tokens, 458_240),
        ("26B-A4B fp8 v6e-4 0.80: free per chip (GiB)", reference.free_gib, 6.23),
        (
            "26B-A4B fp8: KV bytes/token/chip vs 15.32 GiB / 458,240",
            reference.kv_bytes_per_token,
            15.32 * GIB / 458_240,
        ),
        ("E2B v6e-1 0.92 block 64: KV tokens", e2b.kv_tokens, 1_151_744),
        ("E2B v6e-1: KV pool (GiB)", e2b.kv_allocated_gib, 19.77),
        ("26B-A4B fp8 weights/chip, parameter-count estimate (GiB)", reference.weights_estimate_gib, 9.70),
        ("E2B bf16 weights/chip, parameter-count estimate (GiB)", e2b.weights_estimate_gib, 8.97),
        ("flex-start v6e-1 $/M tokens at 202.9 tok/s", flex.per_million_tokens(202.9), 1.848),
        ("flex-start v6e-1 $/M tokens at 870 tok/s", flex.per_million_tokens(870), 0.431),
        ("v6e-4 flex-start $/h (us-east5)", estimate_cost("v6e-4", "us-east5", Tier.FLEX_START).usd_per_hour, 5.40),
        (
            "tiny-llama CPU 1 GiB: KV tokens (cache_config_info)",
            cpu_kv_pool(PRESETS["tiny-llama"], 1).tokens,
            1_048_576,
        ),
    ]
    print("| Figure | Ours | Published | Error |")
    print("|---|---|---|---|")
    for name, ours, published in rows:
        print(f"| {name} | {number(ours)} | {number(published)} | {error(ours, published)} |")
    print()
    print(reference.table())
    print()
    print("| Preset | TP | dtype | weights/chip estimate (GiB) |")
    print("|---|---|---|---|")
    for name, tp, dtype in (
        ("gemma-4-26b-a4b", 4, "fp8"),
        ("gemma-4-e2b", 1, "bfloat16"),
        ("gemma-4-31b", 4, "bfloat16"),
    ):
        print(f"| {name} | {tp} | {dtype} | {weight_bytes_per_chip(PRESETS[name], tp, dtype) / GIB:.2f} |")


if __name__ == "__main__":
    main()

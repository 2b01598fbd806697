"""The physical ceiling of decode throughput and the verdict on a measured figure (shared.domain.throughput_bound)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from shared.domain.catalog import ACCELERATORS, PRESETS
from shared.domain.throughput_bound import (
    FLOOR_LOW,
    TOLERANCE_HIGH,
    bound_summary,
    decode_bound,
    judge_throughput,
)

V6E_BANDWIDTH, V6E_PEAK = 1638e9, 918e12
TINY_PARAMS = 590_464  # docs/reference/vllm.md §10.1
TINY_KV_PER_TOKEN = 2 * 2 * 64 * 2 * 2  # layers x KV heads x head dim x (K, V) x bf16 bytes


def test_a_dense_model_is_bound_by_reading_its_weights_once_per_step() -> None:
    # gemma-4-31b bf16: every parameter but the 0.55B vision encoder (idle in decode), 2 bytes each, over 4 chips.
    bound, limited_by = decode_bound(PRESETS["gemma-4-31b"], ACCELERATORS["v6e-4"], 1) or (0, "")
    weight_bytes = (30_700_000_000 - 550_000_000) * 2
    assert limited_by == "memory bandwidth"
    assert bound == pytest.approx(4 * V6E_BANDWIDTH / weight_bytes)  # about 108.7 tok/s
    assert 108 < bound < 109


def test_each_sequence_adds_its_kv_cache_at_the_mean_context_of_the_run() -> None:
    # tiny-llama on v6e-1, 2 sequences, 100 in / 50 out: mean context 125 tokens.
    bound, limited_by = decode_bound(
        PRESETS["tiny-llama"], ACCELERATORS["v6e-1"], 2, input_tokens=100, output_tokens=50
    ) or (0, "")
    step_bytes = TINY_PARAMS * 2 + 2 * TINY_KV_PER_TOKEN * 125  # 1,180,928 + 256,000
    assert limited_by == "memory bandwidth"
    assert bound == pytest.approx(2 * V6E_BANDWIDTH / step_bytes)


def test_at_a_concurrency_past_the_ridge_compute_sets_the_bound() -> None:
    bound, limited_by = decode_bound(PRESETS["tiny-llama"], ACCELERATORS["v6e-1"], 1024) or (0, "")
    assert limited_by == "compute"
    assert bound == pytest.approx(V6E_PEAK / (2 * TINY_PARAMS))


def test_prefill_of_unshared_prompts_counts_against_compute() -> None:
    bound, limited_by = decode_bound(
        PRESETS["tiny-llama"], ACCELERATORS["v6e-1"], 1024, input_tokens=3, output_tokens=1, prefill=True
    ) or (0, "")
    assert limited_by == "compute"
    assert bound == pytest.approx(V6E_PEAK / (2 * TINY_PARAMS * 4))  # 4 tokens computed per token produced
    no_prefill, _ = decode_bound(
        PRESETS["tiny-llama"], ACCELERATORS["v6e-1"], 1024, input_tokens=3, output_tokens=1
    ) or (0, "")
    assert no_prefill > bound


def test_a_moe_step_reads_only_the_experts_its_sequences_route_to() -> None:
    preset = PRESETS["gemma-4-26b-a4b"]
    dense = (24_650_000_000 - 22_240_000_000) * 2  # embedding and shared transformer, bf16; vision excluded
    experts = 22_240_000_000 * 2
    one, _ = decode_bound(preset, ACCELERATORS["v6e-4"], 1) or (0, "")
    assert one == pytest.approx(4 * V6E_BANDWIDTH / (dense + experts * 8 / 128))
    many, _ = decode_bound(preset, ACCELERATORS["v6e-4"], 64) or (0, "")
    share = 1 - (1 - 8 / 128) ** 64  # nearly every expert
    assert many == pytest.approx(64 * 4 * V6E_BANDWIDTH / (dense + experts * share))


def test_fp8_weights_halve_the_bytes_read() -> None:
    preset, slice_ = PRESETS["gemma-4-31b"], ACCELERATORS["v6e-4"]
    bf16, _ = decode_bound(preset, slice_, 1) or (0, "")
    fp8, _ = decode_bound(preset, slice_, 1, weight_dtype="fp8") or (0, "")
    assert 1.9 < fp8 / bf16 < 2.0  # the embedding stays bf16


def _judge(measured: Any, **overrides: Any) -> Any:
    arguments: dict[str, Any] = {"concurrency": 1, "measured_tok_s": measured}
    arguments.update(overrides)
    model = arguments.pop("model", "gemma-4-31b")
    accelerator = arguments.pop("accelerator", "v6e-4")
    return judge_throughput(model, accelerator, **arguments)


def test_faster_than_physics_is_implausibly_high_and_the_finding_names_both_figures() -> None:
    verdict = _judge(500.0)
    assert verdict is not None
    assert verdict.verdict == "implausibly high"
    assert verdict.efficiency == pytest.approx(500.0 / verdict.bound_tok_s)
    assert verdict.finding == (
        "throughput implausibly high: 500.0 tok/s measured, 460.2% of v6e-4's bound of 109 tok/s "
        "for gemma-4-31b at concurrency 1 (memory bandwidth)"
    )
    assert verdict.as_dict()["finding"] == verdict.finding


def test_the_tolerance_and_the_floor_are_the_edges_of_plausible() -> None:
    bound = (_judge(1.0)).bound_tok_s
    assert _judge(bound * TOLERANCE_HIGH * 0.999).verdict == "plausible"
    assert _judge(bound * TOLERANCE_HIGH * 1.001).verdict == "implausibly high"
    assert _judge(bound * FLOOR_LOW * 1.001).verdict == "plausible"
    low = _judge(bound * FLOOR_LOW * 0.9)
    assert low.verdict == "implausibly low"
    assert low.finding.startswith("throughput implausibly low: 4.9 tok/s measured, 4.5% of v6e-4's bound of 109")
    assert "finding" not in _judge(bound / 2).as_dict()


@pytest.mark.parametrize(
    "overrides",
    [
        {"model": "llama-3-70b"},
        {"accelerator": "v4-8"},
        {"accelerator": "cpu"},
        {"weight_dtype": "int4"},
        {"kv_cache_dtype": "fp4"},
    ],
)
def test_an_unknown_model_slice_or_dtype_gives_no_verdict(overrides: dict[str, Any]) -> None:
    assert _judge(50.0, **overrides) is None


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0, True, "50", None])
def test_bad_measured_or_concurrency_from_the_vm_gives_no_verdict(bad: Any) -> None:
    assert _judge(bad) is None
    assert _judge(50.0, concurrency=bad) is None
    assert _judge(50.0, concurrency=0) is None


@pytest.mark.parametrize("bad", [math.nan, -256, math.inf])
def test_bad_lengths_are_treated_as_missing(bad: Any) -> None:
    without = _judge(50.0)
    assert _judge(50.0, input_tokens=bad, output_tokens=64).bound_tok_s == without.bound_tok_s
    with_lengths = _judge(50.0, input_tokens=4096, output_tokens=64)
    assert with_lengths.bound_tok_s < without.bound_tok_s  # the KV cache costs bandwidth


def test_a_slice_without_figures_gives_no_bound() -> None:
    unknown = dataclasses.replace(ACCELERATORS["v6e-1"], hbm_bandwidth_bytes_per_s=None, peak_bf16_flops=None)
    assert decode_bound(PRESETS["tiny-llama"], unknown, 1) is None


def test_the_summary_line_shows_the_first_finding_or_the_peak_level() -> None:
    high = _judge(500.0).as_dict()
    low = _judge(1.0).as_dict()
    stored = {"levels": [high, low], "findings": [high["finding"], low["finding"]]}
    assert bound_summary(stored) == high["finding"] + " (and 1 more level(s))"
    fine = [_judge(40.0).as_dict(), _judge(60.0).as_dict()]
    line = bound_summary({"levels": fine, "findings": []})
    assert line == (
        "throughput against the physical bound: 60.0 tok/s at the peak level, 55.2% of the bound of 109 tok/s"
    )


@pytest.mark.parametrize(
    "stored", [None, {}, [], "text", {"levels": "x"}, {"levels": [{"measured_tok_s": "fast"}], "findings": [3]}]
)
def test_no_or_malformed_stored_check_gives_no_line(stored: Any) -> None:
    assert bound_summary(stored) is None

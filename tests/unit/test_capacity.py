"""The HBM capacity model: reference figures reproduced, CPU calibration, verdicts and the per-chip table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from shared.domain.capacity import (
    GIB,
    cpu_kv_pool,
    estimate_capacity,
    kv_bytes_per_token_per_chip,
    kv_heads_per_chip,
    smallest_fitting_slice,
    weight_bytes_per_chip,
)
from shared.domain.catalog import ACCELERATORS, PRESETS, KvHeadPolicy
from shared.domain.errors import InvalidMessage

METRICS_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vllm" / "real_vllm_metrics.txt"


def cache_config_labels(metrics_text: str) -> dict[str, str]:
    line = next(line for line in metrics_text.splitlines() if line.startswith("vllm:cache_config_info{"))
    return dict(re.findall(r'(\w+)="([^"]*)"', line))


class TestReferenceFigures:
    """docs/reference/reference-agent.md §6: 26B-A4B FP8 on v6e-4, TP 4, 0.80, FP8 KV, context 16,384."""

    def test_the_kv_token_total_is_reproduced_within_0_1_percent(self) -> None:
        report = estimate_capacity(
            PRESETS["gemma-4-26b-a4b"],
            ACCELERATORS["v6e-4"],
            weight_dtype="fp8",
            kv_cache_dtype="fp8",
            gpu_memory_utilization=0.80,
            max_model_len=16_384,
        )
        assert report.weights_gib == pytest.approx(9.70)  # the published measurement, from the catalog
        assert report.kv_bytes_per_token == 35_840  # 25 x 2 x 256 + 5 x 2 x 512, K and V, fp8
        assert report.num_blocks == 14_324  # published 14,320
        assert report.kv_tokens == 458_368  # published 458,240
        assert abs(report.kv_tokens - 458_240) / 458_240 < 0.001
        assert report.kv_allocated_gib == pytest.approx(15.32, rel=0.005)  # 15.30: -0.13 %
        assert report.free_gib == pytest.approx(6.23, abs=0.05)
        assert report.max_sequences_at_context == 27  # "≈ 28 full-length sequences"
        assert report.fits

    def test_the_parameter_count_estimate_misses_the_measured_weights_by_the_documented_error(self) -> None:
        estimate = weight_bytes_per_chip(PRESETS["gemma-4-26b-a4b"], 4, "fp8") / GIB
        assert estimate == pytest.approx(6.94, abs=0.01)  # docs/benchmarks.md: -28.5 % against 9.70 GiB

    def test_the_e2b_kv_pool_from_the_follow_on_repository_is_reproduced(self) -> None:
        report = estimate_capacity(
            PRESETS["gemma-4-e2b"],
            ACCELERATORS["v6e-1"],
            gpu_memory_utilization=0.92,
            max_model_len=32_768,
            block_size=64,
        )
        assert report.weights_gib == pytest.approx(8.97)
        assert abs(report.kv_tokens - 1_151_744) / 1_151_744 < 0.001
        assert report.kv_allocated_gib == pytest.approx(19.77, abs=0.02)

    def test_the_table_has_the_reference_rows(self) -> None:
        report = estimate_capacity(
            PRESETS["gemma-4-26b-a4b"],
            ACCELERATORS["v6e-4"],
            weight_dtype="fp8",
            kv_cache_dtype="fp8",
            gpu_memory_utilization=0.80,
            max_model_len=16_384,
        )
        table = report.table()
        for text in ("| Usable HBM per chip | 31.25 GiB |", "9.70 GiB", "458,368", "32 tokens/block", "| 80% |"):
            assert text in table


class TestCpuCalibration:
    def test_one_gib_gives_the_block_count_the_real_server_reported(self) -> None:
        labels = cache_config_labels(METRICS_FIXTURE.read_text())
        pool = cpu_kv_pool(PRESETS["tiny-llama"], 1)
        assert pool.block_size == int(labels["block_size"])
        assert pool.num_blocks == int(labels["num_gpu_blocks"])
        assert pool.tokens == int(labels["kv_cache_size_tokens"])
        assert pool.max_concurrency(512) == float(labels["kv_cache_max_concurrency"])
        assert pool.num_blocks * pool.block_size * pool.kv_bytes_per_token == int(labels["kv_cache_memory_bytes"])

    @pytest.mark.parametrize(("gib", "tokens"), [(1, 1_048_576), (2, 2_097_152), (3, 3_145_728)])
    def test_the_pool_grows_linearly_with_the_kv_space(self, gib: int, tokens: int) -> None:
        assert cpu_kv_pool(PRESETS["tiny-llama"], gib).tokens == tokens

    def test_a_non_positive_space_is_refused(self) -> None:
        with pytest.raises(InvalidMessage, match="VLLM_CPU_KVCACHE_SPACE"):
            cpu_kv_pool(PRESETS["tiny-llama"], 0)


@pytest.mark.parametrize(
    ("heads", "tp", "policy", "expected"),
    [
        (8, 4, "replicate", 2),
        (2, 4, "replicate", 2),  # JAX cannot split 2 heads over 4 chips: every chip keeps both
        (2, 4, "one_per_rank", 1),  # vLLM on GPU/CPU: one head per rank
        (16, 8, "one_per_rank", 2),
        (1, 1, "replicate", 1),
    ],
)
def test_kv_heads_per_chip(heads: int, tp: int, policy: KvHeadPolicy, expected: int) -> None:
    assert kv_heads_per_chip(heads, tp, policy) == expected


def test_fp8_kv_halves_the_bf16_footprint() -> None:
    model = PRESETS["gemma-4-31b"]
    assert kv_bytes_per_token_per_chip(model, 4, "auto") == 2 * kv_bytes_per_token_per_chip(model, 4, "fp8")


def test_tensor_parallelism_divides_sharded_weights_but_not_replicated_ones() -> None:
    model = PRESETS["gemma-4-31b"]
    one, four = weight_bytes_per_chip(model, 1), weight_bytes_per_chip(model, 4)
    replicated = sum(g.params for g in model.params if g.sharding == "replicated") * 2
    assert four == pytest.approx((one - replicated) / 4 + replicated, rel=1e-9)


def test_fp8_weights_shrink_only_quantizable_groups() -> None:
    model = PRESETS["gemma-4-31b"]
    saved = weight_bytes_per_chip(model, 1, "bfloat16") - weight_bytes_per_chip(model, 1, "fp8")
    assert saved == sum(g.params for g in model.params if g.quantizable)


@pytest.mark.parametrize(
    ("model", "slice_name", "options", "verdict"),
    [
        ("gemma-4-e2b", "v6e-1", {}, "fits"),
        ("gemma-4-31b", "v6e-4", {"max_model_len": 8192}, "fits"),
        ("gemma-4-31b", "v6e-1", {}, "exceed"),
        ("gemma-4-31b", "v5litepod-4", {}, "exceed"),
        ("gemma-4-31b", "v6e-4", {"max_model_len": 131_072}, "fewer than one 131,072-token sequence"),
        ("gemma-4-e2b", "v6e-1", {"gpu_memory_utilization": 0.98}, "left per chip for activations"),
        ("tiny-llama", "v6e-4", {}, "does not divide 2 attention heads"),
        ("gemma-4-e4b", "v6e-1", {"max_model_len": 200_000}, "exceeds the model's 131072 positions"),
    ],
)
def test_verdicts_say_why(model: str, slice_name: str, options: dict[str, float], verdict: str) -> None:
    report = estimate_capacity(PRESETS[model], ACCELERATORS[slice_name], **options)  # type: ignore[arg-type]
    if verdict == "fits":
        assert report.fits, report.reasons
        assert report.kv_tokens >= report.max_model_len
    else:
        assert not report.fits
        assert any(verdict in reason for reason in report.reasons), report.reasons


@pytest.mark.parametrize(
    ("model", "families", "options", "expected"),
    [
        ("gemma-4-e2b", ("v6e",), {}, "v6e-1"),
        ("gemma-4-31b", ("v6e",), {}, "v6e-4"),
        ("gemma-4-26b-a4b", ("v6e",), {"weight_dtype": "fp8", "kv_cache_dtype": "fp8"}, "v6e-4"),
        ("gemma-4-31b", ("v5e",), {}, "v5litepod-8"),
        ("gemma-4-31b", ("v5e",), {"max_model_len": 131_072}, None),
    ],
)
def test_the_smallest_slice_that_fits(
    model: str, families: tuple[str, ...], options: dict[str, object], expected: str | None
) -> None:
    found = smallest_fitting_slice(PRESETS[model], families=families, **options)  # type: ignore[arg-type]
    assert (found.name if found else None) == expected


def test_a_measured_weight_figure_replaces_the_estimate() -> None:
    report = estimate_capacity(PRESETS["gemma-4-31b"], ACCELERATORS["v6e-8"], measured_weights_gib=9.0)
    assert report.weights_gib == 9.0
    assert report.weights_source == "measured"
    assert any("parameter-count estimate" in note for note in report.notes)


def test_a_preset_with_one_published_measurement_calibrates_its_other_slices() -> None:
    report = estimate_capacity(PRESETS["gemma-4-26b-a4b"], ACCELERATORS["v6e-8"], weight_dtype="fp8")
    assert report.weights_source.startswith("estimated x1.39")
    assert report.weights_gib > report.weights_estimate_gib


def test_vllms_maximum_concurrency_is_tokens_over_context() -> None:
    report = estimate_capacity(PRESETS["gemma-4-e2b"], ACCELERATORS["v6e-1"], max_model_len=4096)
    assert report.max_concurrency == report.kv_tokens / 4096
    assert report.max_sequences_if_windows_freed >= report.max_sequences_at_context


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"gpu_memory_utilization": 1.5}, "serving.gpu_memory_utilization"),
        ({"weight_dtype": "int4"}, "serving.dtype"),
        ({"kv_cache_dtype": "int3"}, "serving.kv_cache_dtype"),
        ({"tensor_parallel": 8}, "tensor_parallel"),
    ],
)
def test_bad_knobs_name_the_field(options: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidMessage) as raised:
        estimate_capacity(PRESETS["gemma-4-e2b"], ACCELERATORS["v6e-4"], **options)  # type: ignore[arg-type]
    assert raised.value.field == field

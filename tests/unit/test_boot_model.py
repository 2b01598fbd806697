"""The boot-stage model (shared/domain/boot_model.py): calibration, cache states, seeding, bounded jitter."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from shared.domain.boot_model import (
    ANCHORS,
    CLIP_Z,
    SIGMA,
    BootStages,
    CacheState,
    WeightSource,
    boot_stages,
    median_stages,
)

# Published time to serve on one v6e chip, vLLM 0.29 (docs/reference/time-to-serve.md B6).
ONE_CHIP_S = {"gemma-4-e2b": 346.0, "gemma-4-e4b": 421.0, "gemma-4-12b": 512.0, "gemma-4-26b-a4b": 616.0}
TOLERANCE = 0.03  # the empirical median of jittered cold boots is within 3 % of the published figure


@pytest.mark.parametrize(("preset", "published"), sorted(ONE_CHIP_S.items()))
def test_cold_medians_hit_the_published_one_chip_figures(preset: str, published: float) -> None:
    assert median_stages(preset, "v6e-1", CacheState.COLD).total_s == pytest.approx(published, abs=0.01)
    rng = random.Random(7)
    draws = [boot_stages(preset, "v6e-1", CacheState.COLD, rng).total_s for _ in range(2001)]
    assert statistics.median(draws) == pytest.approx(published, rel=TOLERANCE)


def test_31b_engine_init_and_compile_are_the_measured_ones() -> None:
    stages = median_stages("gemma-4-31b", "v6e-4", CacheState.COLD)
    assert stages.engine_init_s + stages.compile_s == pytest.approx(427.9)
    assert stages.compile_s == pytest.approx(399.6)


def test_weights_come_from_the_source_of_the_cache_state() -> None:
    cold = median_stages("gemma-4-e2b", "v6e-1", CacheState.COLD)
    assert cold.weights_s == pytest.approx(10.0, rel=0.01)  # 9.54 GiB in about 10 s from the Hub
    tar = median_stages("gemma-4-31b", "v6e-4", CacheState.WARM_WEIGHTS, warm_source=WeightSource.GCS_TAR)
    assert tar.weights_s == pytest.approx(337.0 * (30.7e9 * 2 / 1024**3) / 58.28, rel=0.001)


def test_warm_reboot_is_under_a_third_of_a_cold_boot_for_26b() -> None:
    for slice_name in ("v6e-1", "v6e-4"):
        cold = median_stages("gemma-4-26b-a4b", slice_name, CacheState.COLD).total_s
        weights = median_stages("gemma-4-26b-a4b", slice_name, CacheState.WARM_WEIGHTS).total_s
        warm = median_stages("gemma-4-26b-a4b", slice_name, CacheState.WARM).total_s
        assert warm < cold / 3
        assert warm < weights < cold


def test_deterministic_under_a_seed() -> None:
    def draws(seed: int) -> list[BootStages]:
        rng = random.Random(seed)
        return [boot_stages("gemma-4-26b-a4b", "v6e-4", state, rng) for state in CacheState for _ in range(5)]

    assert draws(3) == draws(3)
    assert draws(3) != draws(4)


def test_jitter_is_bounded() -> None:
    rng = random.Random(11)
    median = median_stages("gemma-4-26b-a4b", "v6e-4", CacheState.COLD)
    widest = math.exp(CLIP_Z * max(SIGMA.values()))
    for _ in range(5000):
        stages = boot_stages("gemma-4-26b-a4b", "v6e-4", CacheState.COLD, rng)
        for name in ("image_pull_s", "weights_s", "engine_init_s", "compile_s", "first_token_s"):
            ratio = getattr(stages, name) / getattr(median, name)
            assert 1 / widest - 1e-9 <= ratio <= widest + 1e-9
        assert stages.compile_s / median.compile_s <= math.exp(CLIP_Z * SIGMA["compile"]) + 1e-9


def test_uncalibrated_presets_and_slices_are_refused() -> None:
    assert "tiny-llama" not in ANCHORS
    with pytest.raises(ValueError, match="no published boot figure"):
        median_stages("tiny-llama", "v6e-1", CacheState.COLD)
    with pytest.raises(ValueError, match="single-host v6e"):
        median_stages("gemma-4-26b-a4b", "v5litepod-4", CacheState.COLD)

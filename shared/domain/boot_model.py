"""Boot stages of vLLM on a granted TPU slice: a pure, seeded model calibrated to published figures.

Why: the simulator stops at ACTIVE, but a user waits for the first token. This model turns a
(model preset, slice, cache state) into the durations of the boot stages so the capacity benchmark can
report command -> first token and the outage a preemption really causes (re-boot included). It is a
model, not a measurement: every median comes from a figure in ``docs/reference/time-to-serve.md``
(B6); where no figure exists the assumption is named below. No I/O, no clock: a seed fixes every draw.

Stages: image pull, weights (bytes / throughput of the source), engine init (without compilation),
XLA compile, first token. Cache states:

* ``cold``: weights from the Hugging Face Hub, empty compile cache (today's pipeline);
* ``warm-weights``: weights restored from a regional Cloud Storage cache, empty compile cache;
* ``warm``: weights and the JAX compile cache both restored.

Calibration (which figure fixes which parameter):

* Cold total per preset on **v6e-1** = the published time to serve on one v6e chip (vLLM 0.29.1rc1,
  ct6e-standard-1t): E2B 346 s, E4B 421 s, 12B 512 s, 26B-A4B FP8 616 s. Read as container start to first
  token with everything cold (the source does not split it; that reading is an assumption).
  31B has no one-chip figure: its anchor is the measured engine init 427.9 s on v6e-4.
* Image pull = 55 s (GKE "pod to container running", the only timed pull), every preset and state.
* Weights bytes = the preset's parameters x checkpoint dtype bytes (``shared.domain.catalog``); E2B gives
  9.5 GiB, the published checkpoint is 9.54 GiB.
* Hub throughput = 9.54 GiB in about 10 s (E2B, v5e-1), 0.954 GiB/s. The 60-90 minute figure for 31B is a
  timeout budget, not a timed pull, and is not used.
* Cloud Storage throughput: ``gcs-tar`` = 58.28 GiB in 337 s (31B, ``gcloud storage cat | tar``, one stream),
  0.173 GiB/s, measured; ``gcs-streamer`` (the Run:ai streamer, concurrency 32) = 15 GB in 4.88 s, 2.86 GiB/s:
  the only published streamer figure (S3 in-region, A10G), **assumed** for GCS on a v6e host. The warm states
  use the streamer unless told otherwise.
* First token after a precompiled engine = 5 s: **assumed** (no published non-MTP figure).
* Engine init (with compile) = the anchor minus image pull, Hub weights and first token; it splits into
  compile 399.6/427.9 = 93.4 % and the rest (KV allocation, weight placement) 6.6 %: the 31B TP=4 measurement.
* Warm compile = cold compile x 50.26/579.75 = 0.087: the same setup (31B FP8 + MTP, v6e-4) gave a first
  query after 579.75 s with an empty JAX cache and 50.26 s (mostly cache deserialization) with a warm one.
* Slices: no preset has published figures on two slices, so compile and init are taken as independent of
  the slice for single-host v6e slices (v6e-1, -4, -8; the 31B compile on v6e-4, 399.6 s, is of the order
  of the one-chip 12B and 26B compiles this calibration gives, 400 s and 473 s). A host downloads the whole
  checkpoint whatever its chips. Multi-host slices are refused: nothing calibrates them.
* Jitter: lognormal per stage around the median, z clipped to +-3 (so bounded), sigma 0.2 image pull, 0.3 Hub,
  0.15 Cloud Storage, 0.05 engine init and compile, 0.3 first token. The only repeats published are 497 s vs
  500 s (warm boot, 0.6 %) and 28 min vs 26.5 min (GKE, nothing to first token, 5 %): the sigmas are
  **assumed**, wider than those.

Cross-checks, not fitted: on v5e a compile cache took E2B startup from 857 s to 497 s (a warm/cold of 0.58 with
a partial cache hit); GKE "nothing to first token" was 26-28 min, of which about 10 min container to health.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, fields
from enum import StrEnum

from shared.domain.catalog import DTYPE_BYTES, PRESETS, accelerator

__all__ = [
    "ANCHORS",
    "BootStages",
    "CacheState",
    "WeightSource",
    "boot_stages",
    "median_stages",
]

GIB = 1024**3
IMAGE_PULL_S = 55.0
FIRST_TOKEN_S = 5.0
COMPILE_SHARE = 399.6 / 427.9  # of engine init, 31B TP=4 on v6e-4
WARM_COMPILE_FACTOR = 50.26 / 579.75  # first query, warm vs empty JAX cache, 31B FP8 + MTP on v6e-4
CLIP_Z = 3.0


class CacheState(StrEnum):
    COLD = "cold"
    WARM_WEIGHTS = "warm-weights"
    WARM = "warm"


class WeightSource(StrEnum):
    HUB = "hub"
    GCS_TAR = "gcs-tar"
    GCS_STREAMER = "gcs-streamer"


# Median throughput in GiB/s and lognormal sigma per weight source.
THROUGHPUT_GIB_S: dict[WeightSource, float] = {
    WeightSource.HUB: 9.54 / 10.0,
    WeightSource.GCS_TAR: 58.28 / 337.0,
    WeightSource.GCS_STREAMER: 15e9 / GIB / 4.88,
}
SIGMA = {"image_pull": 0.2, "hub": 0.3, "gcs": 0.15, "engine_init": 0.05, "compile": 0.05, "first_token": 0.3}

# Preset -> (slice, what the figure is, seconds). "total": cold container start to first token; "engine": init.
ANCHORS: dict[str, tuple[str, str, float]] = {
    "gemma-4-e2b": ("v6e-1", "total", 346.0),
    "gemma-4-e4b": ("v6e-1", "total", 421.0),
    "gemma-4-12b": ("v6e-1", "total", 512.0),
    "gemma-4-26b-a4b": ("v6e-1", "total", 616.0),
    "gemma-4-31b": ("v6e-4", "engine", 427.9),
}


@dataclass(frozen=True, slots=True)
class BootStages:
    """Seconds per stage of one boot, from a granted ACTIVE slice to the first token."""

    image_pull_s: float
    weights_s: float
    engine_init_s: float
    compile_s: float
    first_token_s: float

    @property
    def total_s(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))


def weights_gib(preset: str) -> float:
    """Checkpoint size: every parameter in the checkpoint dtype (fp8 is applied at load time)."""
    model = PRESETS[preset]
    return model.total_params * DTYPE_BYTES[model.checkpoint_dtype] / GIB


def _check_slice(slice_name: str) -> None:
    spec = accelerator(slice_name)
    if spec.family != "v6e" or spec.chips > 8:
        raise ValueError(f"{slice_name}: the boot model is calibrated for single-host v6e slices only")


def _source(state: CacheState, warm_source: WeightSource) -> WeightSource:
    return WeightSource.HUB if state is CacheState.COLD else warm_source


def median_stages(
    preset: str, slice_name: str, state: CacheState, *, warm_source: WeightSource = WeightSource.GCS_STREAMER
) -> BootStages:
    """The median of each stage (no jitter) for ``preset`` on ``slice_name`` in cache state ``state``."""
    if preset not in ANCHORS:
        raise ValueError(f"{preset}: no published boot figure calibrates this preset")
    _check_slice(slice_name)
    _anchor_slice, kind, seconds = ANCHORS[preset]
    hub_s = weights_gib(preset) / THROUGHPUT_GIB_S[WeightSource.HUB]
    engine_s = seconds if kind == "engine" else seconds - IMAGE_PULL_S - hub_s - FIRST_TOKEN_S
    compile_cold = engine_s * COMPILE_SHARE
    return BootStages(
        image_pull_s=IMAGE_PULL_S,
        weights_s=weights_gib(preset) / THROUGHPUT_GIB_S[_source(state, warm_source)],
        engine_init_s=engine_s - compile_cold,
        compile_s=compile_cold * (WARM_COMPILE_FACTOR if state is CacheState.WARM else 1.0),
        first_token_s=FIRST_TOKEN_S,
    )


def _jitter(rng: random.Random, median: float, sigma: float) -> float:
    z = max(-CLIP_Z, min(CLIP_Z, rng.gauss(0.0, 1.0)))
    return median * math.exp(sigma * z)


def boot_stages(
    preset: str,
    slice_name: str,
    state: CacheState,
    rng: random.Random,
    *,
    warm_source: WeightSource = WeightSource.GCS_STREAMER,
) -> BootStages:
    """One boot's stages: the medians with seeded lognormal jitter (five draws from ``rng``, always)."""
    median = median_stages(preset, slice_name, state, warm_source=warm_source)
    weights_sigma = SIGMA["hub"] if _source(state, warm_source) is WeightSource.HUB else SIGMA["gcs"]
    return BootStages(
        image_pull_s=_jitter(rng, median.image_pull_s, SIGMA["image_pull"]),
        weights_s=_jitter(rng, median.weights_s, weights_sigma),
        engine_init_s=_jitter(rng, median.engine_init_s, SIGMA["engine_init"]),
        compile_s=_jitter(rng, median.compile_s, SIGMA["compile"]),
        first_token_s=_jitter(rng, median.first_token_s, SIGMA["first_token"]),
    )

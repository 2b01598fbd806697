"""The max-rate search run against a stateful fake vLLM, its comparison with a previous run, and its front doors:
``python -m loadgen --search-max-rate``, ``tpuctl bench run --search-max-rate-from`` and a stored rate sweep's
economics (issue 22, items 3 and 4). The real-vLLM agreement is ``tests/integration/test_rate_search_real_vllm.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest

from loadgen.__main__ import main as loadgen_main
from loadgen.generator import BenchmarkSetupError, LoadGenerator, Target
from loadgen.rate_search import (
    SearchPlan,
    compare_searches,
    comparison_lines,
    read_search,
    search_max_rate,
    search_table,
)
from mcp_client_gateway.cli_bench import add_workload_arguments, workload_settings
from mcp_client_gateway.errors import GatewayError
from shared.domain.bench_economics import benchmark_economics, economics_lines
from shared.domain.bench_rate_search import SearchSettings, rate_ladder, sweep_rate_search
from shared.messages import BenchmarkRequest
from tests.support.fake_prefix_vllm import FakePrefixVllm


def _search(server: FakePrefixVllm, repeats: int = 2) -> dict[str, Any]:
    generator = LoadGenerator(Target("http://fake"), transport=server, server_counts=True, text_salt=1)
    base = BenchmarkRequest(input_len=8, output_len=3, slo_ttft_ms=60000, warmup_requests=1)
    # Rates low enough that a loaded machine's event-loop delays stay well inside the 5 % saturation margin.
    plan = SearchPlan(SearchSettings(start_rate=20.0, max_rate=40.0), repeats, probe_requests=6, probe_seconds=0.01)
    return asyncio.run(search_max_rate(generator, base, plan))


def test_the_search_climbs_to_max_rate_and_its_counts_match_the_fakes_metrics() -> None:
    server = FakePrefixVllm()
    result = _search(server)
    assert [row["rate"] for row in result["rows"]] == [20.0, 40.0]
    assert result["max_rate_at_slo"] == 40.0 and "max_rate 40" in result["stop_reason"]
    for row in result["rows"]:
        assert row["server"]["completed"] == 12 == row["server"]["server_requests_succeeded"]
        assert row["server"]["server_generation_tokens"] == 36 == row["server"]["output_tokens"]
        assert row["server"]["requests_agreement"] == 0.0
        assert row["figures"]["slo_attainment"]["median"] == 1.0 and row["figures"]["slo_attainment"]["n"] == 2
    # one warm-up request, then 2 probes x 2 repeats x 6: the server counted every one and the levels none twice
    assert server.succeeded == 1 + 24
    table = search_table(result)
    assert "Max rate at the SLO: 40.0 req/s" in table and table.count("pass") == 2


def test_a_trace_cannot_be_searched() -> None:
    generator = LoadGenerator(Target("http://fake"), transport=FakePrefixVllm())
    base = BenchmarkRequest(workload="trace", trace=({"timestamp": 0, "input_len": 4, "output_len": 2},))
    with pytest.raises(BenchmarkSetupError, match=r"^workload: a trace"):
        asyncio.run(search_max_rate(generator, base, SearchPlan(SearchSettings(start_rate=1.0))))


def _estimate(value: float, spread: float) -> dict[str, Any]:
    return {
        "n": 3,
        "mean": value,
        "mean_ci95": [value - spread, value + spread],
        "median": value,
        "median_ci95": [value - spread, value + spread],
    }


def test_the_comparison_flags_a_change_significant_only_when_the_intervals_part() -> None:
    before = {
        "max_rate_at_slo": 8.0,
        "lowest_failing_rate": 16.0,
        "rows": [{"rate": 8.0, "figures": {"median_ttft_ms": _estimate(100.0, 5.0), "achieved_rate": _estimate(8, 1)}}],
    }
    now = copy.deepcopy(before)
    now["rows"][0]["figures"] = {"median_ttft_ms": _estimate(130.0, 5.0), "achieved_rate": _estimate(8.5, 1)}
    now["max_rate_at_slo"] = 16.0
    now["lowest_failing_rate"] = 32.0
    compared = compare_searches(now, before)
    changes = compared["rates"][0]["changes"]
    assert changes["median_ttft_ms"] == {**changes["median_ttft_ms"], "change_pct": 30.0, "significant": True}
    assert changes["achieved_rate"]["significant"] is False
    best = compared["max_rate_at_slo"]
    assert best["change_pct"] == 100.0 and best["significant"] is None  # one search: no interval to test
    assert best["verdicts_contradict"] is True  # the new run passed 16, where the old one failed
    lines = comparison_lines(compared)
    assert "8.0 -> 16.0 (+100.0%, the verdicts contradict" in lines[0]
    assert "median_ttft_ms +30.0%*" in lines[1] and "achieved_rate +6.2%," not in lines[1]


def test_the_cli_searches_and_names_the_flag_of_a_bad_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = loadgen_main(["--url", "http://127.0.0.1:9", "--search-max-rate", "--repeats", "0"])
    assert code == 2 and "error: --repeats: 0 must be within 1..20" in capsys.readouterr().err
    code = loadgen_main(["--url", "http://127.0.0.1:9", "--search-max-rate", "--start-rate", "-1"])
    assert code == 2 and "error: --start-rate: -1.0 must be > 0" in capsys.readouterr().err
    bad = tmp_path / "old.json"
    bad.write_text('{"generator": "other"}', encoding="utf-8")
    with pytest.raises(BenchmarkSetupError, match=r"^previous: .* is not a search result"):
        read_search(bad)


def test_a_stored_rate_sweep_is_judged_as_the_ladder_and_priced_at_its_max_rate() -> None:
    def point(level: float, achieved: float, good: int) -> dict[str, Any]:
        return {
            "level": level,
            "arrival_rate": level,
            "completion_rate": achieved,
            "completed": 20,
            "failed": 0,
            "duration": 10.0,
            "request_goodput": good / 10.0,
            "output_throughput": achieved * 16,
            "output_goodput": good / 10.0 * 16,
        }

    request = {"mode": "rate", "request_rate": [1, 2, 4, 8], "slo_ttft_ms": 500}
    points = [point(1, 1, 20), point(2, 2, 19), point(4, 3.0, 5), point(8, 8, 20)]
    search = sweep_rate_search(request, points)
    assert search is not None and search["max_rate_at_slo"] == 2.0 and search["lowest_failing_rate"] == 4.0
    assert search["not_judged"] == [8.0]  # the search stops at the first failure
    assert sweep_rate_search({"mode": "concurrency"}, points) is None
    plan = {"tier": "spot", "zone": "us-east5-b", "accelerator": "v6e-1", "chips": 1}
    economics = benchmark_economics(plan, request, points)
    assert economics["max_rate_at_slo"]["usd_per_million_output_tokens_at_max_rate"] is not None
    assert any(line.startswith("Max rate at the SLO (open loop): 2.0 req/s") for line in economics_lines(economics))


def test_tpuctl_bench_run_turns_search_max_rate_from_into_the_ladder() -> None:
    cli = argparse.ArgumentParser()
    add_workload_arguments(cli)
    settings = workload_settings(cli.parse_args(["--search-max-rate-from", "0.5", "--slo-ttft-ms", "200"]))
    assert settings["mode"] == "rate" and settings["request_rate"] == rate_ladder(0.5) == [0.5, 1, 2, 4, 8, 16]
    BenchmarkRequest.model_validate(settings)  # a valid benchmark as it goes out
    with pytest.raises(GatewayError) as refused:
        workload_settings(cli.parse_args(["--search-max-rate-from", "0"]))
    assert refused.value.field == "search_max_rate_from"

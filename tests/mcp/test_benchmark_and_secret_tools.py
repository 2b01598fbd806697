"""tpu_benchmark (run), tpu_observe's benchmark views (one run, runs compared) and the Hugging Face token tool."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from mcp.types import ElicitResult

from mcp_client_gateway.core import GatewayError
from shared.domain.models import BenchmarkRun, Phase
from shared.domain.throughput_bound import judge_throughput
from shared.messages import RunBenchmark, new_command_id
from tests.mcp.conftest import HF_TOKEN, GatewayWorld, call, refusal_confirmation, text

pytestmark = pytest.mark.anyio


def run_record(
    deployment_id: str,
    *,
    minutes_ago: float,
    peak: float,
    ttft: float,
    model: str = "gemma-4-26b-a4b",
    status: str = "completed",
) -> BenchmarkRun:
    at = datetime.now(UTC) - timedelta(minutes=minutes_ago)
    points = [  # the benchmarker's stored shape: one flat object per sweep level
        {"level": 1, "output_throughput": peak / 4, "request_throughput": 1.0, "median_ttft_ms": ttft / 2},
        {"level": 16, "output_throughput": peak, "request_throughput": 4.0, "median_ttft_ms": ttft},
    ]
    return BenchmarkRun(
        run_id=new_command_id(),
        deployment_id=deployment_id,
        status=status,  # type: ignore[arg-type]
        request={"mode": "concurrency", "concurrency": [1, 16]},
        result={"points": points} if status == "completed" else None,
        plan={"model": model, "accelerator": "v6e-4", "tier": "spot"},
        created_at=at,
        updated_at=at,
    )


class TestRunBenchmark:
    async def test_a_serving_deployment_gets_a_run_command_whose_id_is_the_run_id(self, world: GatewayWorld) -> None:
        world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
        result = await call(
            world, "tpu_benchmark", {"deployment_id": "gemma-a", "concurrency": [1, 8], "output_len": 32}
        )
        assert not result.is_error, text(result)
        (message,) = world.published()
        assert isinstance(message, RunBenchmark)
        assert message.command_id == result.structured_content["command_id"]
        assert message.benchmark.concurrency == (1, 8) and message.benchmark.output_len == 32
        assert message.benchmark.mode == "concurrency" and message.benchmark.endpoint == "completions"
        assert f"tpu_observe(show='benchmarks', command_id='{message.command_id}')" in text(result)

    async def test_a_deployment_that_is_not_serving_is_refused(self, world: GatewayWorld) -> None:
        world.seed("gemma-a", phase=Phase.COMPILING)
        result = await call(world, "tpu_benchmark", {"deployment_id": "gemma-a"})
        assert result.is_error and "[failed_precondition]" in text(result)
        assert "tpu_status(deployment_id='gemma-a') shows SERVING" in text(result)
        assert world.published() == []

    async def test_request_rates_make_a_rate_sweep(self, world: GatewayWorld) -> None:
        world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
        result = await call(world, "tpu_benchmark", {"deployment_id": "gemma-a", "request_rate": [0.5, 2.0]})
        assert not result.is_error, text(result)
        (message,) = world.published()
        assert isinstance(message, RunBenchmark)
        assert message.benchmark.mode == "rate" and message.benchmark.request_rate == (0.5, 2.0)

    def test_the_core_refuses_rate_mode_without_rates_naming_the_field(self, world: GatewayWorld) -> None:
        # Over MCP the mode follows from request_rate, so only the core (and the CLI) can ask for rates without any.
        world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
        with pytest.raises(GatewayError) as refused:
            world.core.run_benchmark("gemma-a", benchmark={"mode": "rate"})
        assert refused.value.render().startswith("[invalid_argument] request_rate")
        assert world.published() == []

    async def test_a_shared_prefix_workload_reaches_the_command(self, world: GatewayWorld) -> None:
        world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
        arguments = {"workload": "shared_prefix", "prefix_len": 192, "prefix_share": 0.75, "slo_ttft_ms": 500.0}
        result = await call(world, "tpu_benchmark", {"deployment_id": "gemma-a", **arguments})
        assert not result.is_error, text(result)
        (message,) = world.published()
        assert isinstance(message, RunBenchmark)
        benchmark = message.benchmark
        assert (benchmark.workload, benchmark.prefix_len, benchmark.prefix_share) == ("shared_prefix", 192, 0.75)

    async def test_a_prefix_as_long_as_the_prompt_is_refused_naming_prefix_len(self, world: GatewayWorld) -> None:
        world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
        arguments = {"workload": "shared_prefix", "prefix_len": 256, "input_len": 256}
        result = await call(world, "tpu_benchmark", {"deployment_id": "gemma-a", **arguments})
        assert result.is_error and "[invalid_argument] prefix_len" in text(result)
        assert "below input_len" in text(result)
        assert world.published() == []

    def test_the_core_sends_a_trace_whole_and_refuses_a_bad_entry_by_name(self, world: GatewayWorld) -> None:
        # Trace replay is not an MCP argument any more (tpuctl bench run --trace-file); the core still takes it.
        world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
        trace = [
            {"timestamp": 0.0, "input_len": 64, "output_len": 16},
            {"timestamp": 0.5, "input_len": 32, "output_len": 8},
        ]
        world.core.run_benchmark("gemma-a", benchmark={"mode": "concurrency", "workload": "trace", "trace": trace})
        (message,) = world.published()
        assert isinstance(message, RunBenchmark)
        assert [entry.model_dump() for entry in message.benchmark.trace] == trace
        bad = [{"timestamp": 0.0, "input_len": 0, "output_len": 16}]  # no tokens to send
        with pytest.raises(GatewayError) as refused:
            world.core.run_benchmark("gemma-a", benchmark={"mode": "concurrency", "workload": "trace", "trace": bad})
        assert refused.value.code == "invalid_argument" and refused.value.field == "trace.0.input_len"
        assert world.published() == []  # nothing more was published

    async def test_trace_is_not_an_mcp_argument(self, world: GatewayWorld) -> None:
        world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
        trace = [{"timestamp": 0.0, "input_len": 64, "output_len": 16}]
        result = await call(world, "tpu_benchmark", {"deployment_id": "gemma-a", "trace": trace})
        assert result.is_error and "[invalid_argument] trace: is not a parameter of tpu_benchmark" in text(result)
        assert world.published() == []

    async def test_an_absurd_sweep_is_refused_by_the_schema(self, world: GatewayWorld) -> None:
        world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
        result = await call(world, "tpu_benchmark", {"deployment_id": "gemma-a", "concurrency": [100000]})
        assert result.is_error and "concurrency" in text(result)
        assert world.published() == []


def show_run(run_id: str) -> dict[str, Any]:
    return {"show": "benchmarks", "command_id": run_id}


class TestResults:
    async def test_a_run_shows_headline_figures_at_the_peak_and_the_change_from_the_last_run(
        self, world: GatewayWorld
    ) -> None:
        older = run_record("gemma-a", minutes_ago=60, peak=500.0, ttft=200.0)
        newer = run_record("gemma-a", minutes_ago=5, peak=600.0, ttft=150.0)
        for run in (older, newer):
            world.store.create_benchmark_run(run)
        result = await call(world, "tpu_observe", show_run(newer.run_id))
        assert not result.is_error, text(result)
        body = result.structured_content
        assert body["run_id"] == newer.run_id
        assert body["headline"]["peak_output_throughput"] == 600.0
        assert body["headline"]["peak_at_level"] == 16.0
        assert body["headline"]["median_ttft_ms_at_knee"] == 150.0  # no knee recorded: at the peak level
        assert body["previous"]["run_id"] == older.run_id
        assert body["change_pct"]["peak_output_throughput"] == pytest.approx(20.0)
        assert body["change_pct"]["median_ttft_ms_at_knee"] == pytest.approx(-25.0)

    async def test_a_run_judged_against_the_physical_bound_says_so_in_one_line(self, world: GatewayWorld) -> None:
        judged = run_record("gemma-a", minutes_ago=5, peak=9000.0, ttft=150.0)
        verdict = judge_throughput("gemma-4-26b-a4b", "v6e-4", concurrency=16, measured_tok_s=9000.0)
        assert verdict is not None and verdict.finding
        check = {"levels": [{"level": 16, **verdict.as_dict()}], "findings": [verdict.finding]}
        judged.result = {**(judged.result or {}), "comparison": {"throughput_bound": check}}
        old = run_record("gemma-b", minutes_ago=5, peak=600.0, ttft=150.0)  # stored before the check existed
        for run in (judged, old):
            world.store.create_benchmark_run(run)
        result = await call(world, "tpu_observe", show_run(judged.run_id))
        assert not result.is_error, text(result)
        summary = result.content[0].text  # the line before the JSON
        assert summary.endswith(f" {verdict.finding}.")
        assert "throughput implausibly high: 9,000.0 tok/s measured" in verdict.finding
        assert result.structured_content["result"]["comparison"]["throughput_bound"] == check
        plain = await call(world, "tpu_observe", show_run(old.run_id))
        assert not plain.is_error and "bound" not in plain.content[0].text

    async def test_an_unknown_run_is_not_found_and_a_malformed_id_refused(self, world: GatewayWorld) -> None:
        missing = await call(world, "tpu_observe", show_run(new_command_id()))
        assert missing.is_error and "[not_found]" in text(missing)
        assert "tpu_observe(show='benchmarks')" in text(missing)
        bad = await call(world, "tpu_observe", show_run("latest"))
        assert bad.is_error and "[invalid_argument] command_id" in text(bad)

    async def test_compare_puts_runs_of_several_deployments_side_by_side(self, world: GatewayWorld) -> None:
        fast = run_record("gemma-a", minutes_ago=30, peak=900.0, ttft=120.0)
        slow = run_record("gemma-b", minutes_ago=20, peak=300.0, ttft=400.0, model="gemma-4-31b")
        failed = run_record("gemma-b", minutes_ago=10, peak=0, ttft=0, model="gemma-4-31b", status="failed")
        for run in (fast, slow, failed):
            world.store.create_benchmark_run(run)
        result = await call(world, "tpu_observe", {"show": "benchmarks"})
        assert not result.is_error, text(result)
        body = result.structured_content
        assert [row["run_id"] for row in body["rows"]] == [failed.run_id, slow.run_id, fast.run_id]
        assert body["best"]["peak_output_throughput"] == fast.run_id
        assert body["best"]["median_ttft_ms_at_knee"] == fast.run_id
        only_b = await call(world, "tpu_observe", {"show": "benchmarks", "deployment_id": "gemma-b", "limit": 1})
        assert [row["run_id"] for row in only_b.structured_content["rows"]] == [failed.run_id]
        bad = await call(world, "tpu_observe", {"show": "benchmarks", "limit": 0})
        assert bad.is_error and "limit" in text(bad)

    def test_the_core_filters_a_comparison_by_model(self, world: GatewayWorld) -> None:
        # The model filter is not an MCP argument any more (tpuctl bench compare --model); the core keeps it.
        for run in (
            run_record("gemma-a", minutes_ago=30, peak=900.0, ttft=120.0),
            run_record("gemma-b", minutes_ago=20, peak=300.0, ttft=400.0, model="gemma-4-31b"),
        ):
            world.store.create_benchmark_run(run)
        only_31b = world.core.compare_benchmarks(model="gemma-4-31b")
        assert {row.deployment_id for row in only_31b.rows} == {"gemma-b"}


class TestHuggingFaceToken:
    async def test_a_token_is_stored_and_never_returned(self, world: GatewayWorld) -> None:
        result = await call(world, "tpu_save_hf_token", {"token": HF_TOKEN})
        assert not result.is_error, text(result)
        assert result.structured_content == {
            "name": "tpuctl-hf-token",
            "version": "secrets/tpuctl-hf-token/versions/1",
            "replaced": False,
        }
        assert HF_TOKEN not in text(result)
        assert world.secrets.get("tpuctl-hf-token") == HF_TOKEN

    async def test_a_malformed_token_is_refused_without_repeating_it(self, world: GatewayWorld) -> None:
        attempt = "not-a-token-but-secretish-0123456789"
        result = await call(world, "tpu_save_hf_token", {"token": attempt})
        assert result.is_error and "[invalid_argument] token" in text(result)
        assert attempt not in text(result)
        assert world.secrets.get("tpuctl-hf-token") is None

    async def test_replacing_a_stored_token_needs_confirmation(self, world: GatewayWorld) -> None:
        world.secrets.put("tpuctl-hf-token", HF_TOKEN)
        replacement = "hf_" + "Replacement0123456789abcdefghij"
        refused = await call(world, "tpu_save_hf_token", {"token": replacement})
        body = refusal_confirmation(refused)
        assert body["action"] == "replace_hf_token" and body["target"] == "tpuctl-hf-token"
        assert HF_TOKEN not in text(refused) and replacement not in text(refused)
        assert world.secrets.get("tpuctl-hf-token") == HF_TOKEN
        by_name = await call(world, "tpu_save_hf_token", {"token": replacement, "confirm": "tpuctl-hf-token"})
        assert by_name.is_error and "[confirmation_required] confirm" in text(by_name)
        another = "hf_" + "Other0123456789abcdefghijkl"
        other = await call(world, "tpu_save_hf_token", {"token": another, "confirm": body["confirm"]})
        assert other.is_error and "is not the one confirmed" in text(other)
        assert world.secrets.get("tpuctl-hf-token") == HF_TOKEN
        done = await call(world, "tpu_save_hf_token", {"token": replacement, "confirm": body["confirm"]})
        assert not done.is_error and done.structured_content["replaced"] is True
        assert world.secrets.get("tpuctl-hf-token") == replacement

    async def test_an_elicitation_client_is_asked_before_a_replacement_and_never_for_the_token(
        self, world: GatewayWorld
    ) -> None:
        world.secrets.put("tpuctl-hf-token", HF_TOKEN)
        asked: list[Any] = []

        async def decline(context: Any, params: Any) -> ElicitResult:
            asked.append(params)
            return ElicitResult(action="decline")

        result = await call(
            world,
            "tpu_save_hf_token",
            {"token": "hf_" + "Replacement0123456789abcdefghij"},
            elicitation_callback=decline,
        )
        assert result.is_error and "declined" in text(result)
        assert len(asked) == 1 and list(asked[0].requested_schema["properties"]) == ["confirm"]
        assert world.secrets.get("tpuctl-hf-token") == HF_TOKEN

    async def test_saving_the_same_token_again_changes_nothing(self, world: GatewayWorld) -> None:
        world.secrets.put("tpuctl-hf-token", HF_TOKEN)
        result = await call(world, "tpu_save_hf_token", {"token": HF_TOKEN})
        assert not result.is_error and result.structured_content["version"] == "unchanged"

"""Auto-tune over MCP (issue 22, item 5): tpu_benchmark(tune_trials) starts one, tpu_observe shows its trials and the
verified preset the controller kept, and tpu_deploy(preset) serves a new deployment with that preset's flags, only
for the model and slice it was verified on."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mcp_client_gateway.interface_words import cli_text
from shared.messages import CreateDeployment, RunBenchmark
from tests.mcp.conftest import GatewayWorld, call, text
from tests.support.tune_reports import trial, tuned_run

pytestmark = pytest.mark.anyio

WINNER = {"max_num_seqs": 32, "prefix_caching": False, "block_size": 64}


def _tuned(world: GatewayWorld) -> str:
    """gemma-a (gemma-4-26b-a4b on v6e-4) tuned: the third trial won, 1.5x the baseline's max rate."""
    world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
    return tuned_run(
        world.store,
        world.bus,
        "gemma-a",
        trial({}, 2.0),
        trial({"max_num_seqs": 32}, 2.5),
        trial(WINNER, 3.0),
    )


def _refusal(result: Any) -> dict[str, Any]:
    assert result.is_error, text(result)
    shape: dict[str, Any] = json.loads(result.content[1].text)
    return shape


async def test_tpu_benchmark_starts_a_tune_and_refuses_one_without_an_slo(world: GatewayWorld) -> None:
    world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
    started = await call(world, "tpu_benchmark", {"deployment_id": "gemma-a", "tune_trials": 4, "slo_ttft_ms": 400})
    assert not started.is_error, text(started)
    assert "A tune of 4 trials recreates the engine for each" in started.structured_content["next_step"]
    (message,) = world.published()
    assert isinstance(message, RunBenchmark) and message.benchmark.tune_trials == 4
    assert message.benchmark.slo_ttft_ms == 400.0
    no_slo = _refusal(await call(world, "tpu_benchmark", {"deployment_id": "gemma-a", "tune_trials": 4}))
    assert no_slo["field"] == "slo_ttft_ms" and "needs an SLO" in no_slo["problem"]
    one = _refusal(
        await call(world, "tpu_benchmark", {"deployment_id": "gemma-a", "tune_trials": 1, "slo_ttft_ms": 400})
    )
    assert one["field"] == "tune_trials" and "2" in one["fix"]
    assert world.published() == []


async def test_tpu_observe_shows_the_trials_the_best_and_the_preset(world: GatewayWorld) -> None:
    run_id = _tuned(world)
    result = await call(world, "tpu_observe", {"show": "benchmarks", "command_id": run_id})
    assert not result.is_error, text(result)
    summary = result.content[0].text
    assert (
        "tuned: max rate at the SLO 2 -> 3 req/s (1.50x) with max_num_seqs=32, block_size=64, prefix_caching=off "
        "(3 trials)." in summary
    ), summary
    assert summary.startswith(f"Run {run_id} completed. tuned:")  # no sweep figures: the trials are the result
    assert f"Deploy with it: tpu_deploy(preset='{run_id}')." in summary
    body = result.structured_content
    assert [row["max_rate_at_slo"] for row in body["tune"]["trials"]] == [2.0, 2.5, 3.0]
    assert [row["best"] for row in body["tune"]["trials"]] == [False, False, True]
    assert body["tune"]["trials"][0]["flags"] == "defaults" and body["tune"]["best"] == 2
    assert body["preset"]["overrides"] == WINNER and body["preset"]["accelerator"] == "v6e-4"
    assert body["result"]["tune"]["best"] == 2 and body["node_reported"]["fields_dropped"] == 0


async def test_a_preset_create_publishes_a_spec_whose_serving_carries_the_verified_flags(
    world: GatewayWorld,
) -> None:
    run_id = _tuned(world)
    world.published()
    arguments = {"deployment_id": "gemma-b", "model": "gemma-4-26b-a4b", "accelerator": "v6e-4", "preset": run_id}
    result = await call(world, "tpu_deploy", {**arguments, "zones": ["us-east5-b"], "max_model_len": 8192})
    assert not result.is_error, text(result)
    (message,) = world.published()
    assert isinstance(message, CreateDeployment)
    serving = message.spec.serving
    assert (serving.max_num_seqs, serving.prefix_caching, serving.block_size) == (32, False, 64)
    assert serving.preset == run_id and serving.max_model_len == 8192
    assert serving.max_num_batched_tokens is None  # not in the preset: the plan's choice


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"model": "gemma-4-e4b"}, "was verified for model gemma-4-26b-a4b, not gemma-4-e4b"),
        ({"accelerator": "v6e-8"}, "was verified for accelerator v6e-4, not v6e-8"),
    ],
)
async def test_a_preset_from_another_model_or_slice_is_refused_naming_preset(
    world: GatewayWorld, change: dict[str, str], problem: str
) -> None:
    run_id = _tuned(world)
    world.published()
    arguments = {"deployment_id": "gemma-b", "model": "gemma-4-26b-a4b", "accelerator": "v6e-4", "preset": run_id}
    shape = _refusal(await call(world, "tpu_deploy", {**arguments, **change, "zones": ["us-east5-b"]}))
    assert shape["field"] == "preset" and problem in shape["problem"], shape
    assert "tune_trials" in shape["fix"]
    assert world.published() == []


async def test_a_run_that_kept_no_preset_or_a_conflicting_flag_is_refused_by_name(world: GatewayWorld) -> None:
    run_id = _tuned(world)
    plain = tuned_run(world.store, world.bus, "gemma-a", trial({}, None), trial({"max_num_seqs": 8}, None))
    world.published()
    base = {"deployment_id": "gemma-b", "model": "gemma-4-26b-a4b", "zones": ["us-east5-b"]}
    none_kept = _refusal(await call(world, "tpu_deploy", {**base, "accelerator": "v6e-4", "preset": plain}))
    assert none_kept["field"] == "preset" and "kept no verified preset" in none_kept["problem"]
    unknown = _refusal(await call(world, "tpu_deploy", {**base, "preset": "0f0f0f0f-0f0f-4f0f-8f0f-0f0f0f0f0f0f"}))
    assert (unknown["code"], unknown["field"]) == ("not_found", "preset")
    tuned_auto = tuned_run(world.store, world.bus, "gemma-a", trial({}, 1.0), trial({"kv_cache_dtype": "auto"}, 2.0))
    conflict = {**base, "accelerator": "v6e-4", "preset": tuned_auto, "kv_cache_dtype": "fp8"}
    clash = _refusal(await call(world, "tpu_deploy", conflict))
    assert clash["field"] == "kv_cache_dtype" and "leave kv_cache_dtype out" in clash["fix"]
    update = _refusal(
        await call(world, "tpu_deploy", {"deployment_id": "gemma-a", "action": "update", "preset": run_id})
    )
    assert update["field"] == "preset" and "cannot be changed by an update" in update["problem"]
    stepping = {**base, "accelerator": "v6e-4", "preset": run_id, "alternative_accelerators": ["v6e-8"]}
    alternatives = _refusal(await call(world, "tpu_deploy", stepping))
    assert alternatives["field"] == "alternative_accelerators"
    assert world.published() == []


def test_a_tune_call_is_worded_as_tpuctl_tune_on_the_command_line() -> None:
    assert cli_text("tpu_benchmark(deployment_id='gemma-a', tune_trials='4')") == "tpuctl tune gemma-a --trials 4"
    assert cli_text("tpu_benchmark(deployment_id='gemma-a')") == "tpuctl bench run gemma-a"
    assert cli_text("tpu_deploy(deployment_id='b', preset='R')") == "tpuctl deploy b --preset R"

"""``tpuctl tune`` (a benchmark run with tune_trials), ``tpuctl bench show`` of a tune (its trials table and the
preset it kept) and ``tpuctl deploy --preset`` (issue 22, item 5), on the gateway's embedded adapters."""

from __future__ import annotations

import pytest

from mcp_client_gateway.cli import EXIT_OK, EXIT_USAGE
from shared.messages import CreateDeployment, RunBenchmark
from tests.mcp.conftest import GatewayWorld
from tests.mcp.test_cli import tpuctl
from tests.support.tune_reports import trial, tuned_run

TUNE = ("tune", "gemma-a", "--slo-ttft-ms", "400")


def test_tune_publishes_a_benchmark_run_with_its_trials_and_workload(world: GatewayWorld) -> None:
    world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
    started = tpuctl(world, *TUNE, "--trials", "5", "--workload", "shared_prefix", "--prefix-len", "128")
    assert started.code == EXIT_OK, started.stderr
    (message,) = world.published()
    assert isinstance(message, RunBenchmark)
    assert (message.benchmark.tune_trials, message.benchmark.workload) == (5, "shared_prefix")
    assert (message.benchmark.prefix_len, message.benchmark.slo_ttft_ms) == (128, 400.0)


def test_tune_refuses_too_few_trials_or_no_slo_naming_the_flag(
    world: GatewayWorld, capsys: pytest.CaptureFixture[str]
) -> None:
    world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
    one = tpuctl(world, *TUNE, "--trials", "1")
    assert one.code == EXIT_USAGE and "--trials" in one.stderr, one.stderr
    no_slo = tpuctl(world, "tune", "gemma-a", "--trials", "4")
    assert no_slo.code == EXIT_USAGE and "--slo-ttft-ms" in no_slo.stderr, no_slo.stderr
    missing = tpuctl(world, *TUNE)
    assert missing.code == EXIT_USAGE and "required: --trials" in capsys.readouterr().err  # argparse's own
    assert world.published() == []


def test_bench_show_prints_every_trial_the_best_and_how_to_deploy_the_preset(world: GatewayWorld) -> None:
    world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
    run_id = tuned_run(
        world.store,
        world.bus,
        "gemma-a",
        trial({}, 2.0),
        trial({"max_num_seqs": 32}, 3.0),
        trial({"max_num_seqs": 32, "block_size": 64}, None, 1.0, stop_reason="engine did not start: out of HBM"),
    )
    shown = tpuctl(world, "bench", "show", run_id)
    assert shown.code == EXIT_OK, shown.stderr
    lines = shown.stdout.splitlines()
    assert "Tune: max rate at the SLO 2 -> 3 req/s (1.50x) with max_num_seqs=32" in shown.stdout
    assert any(line.split()[:3] == ["0", "2", "4"] and "baseline (planned flags)" in line for line in lines)
    assert any(line.split()[:3] == ["1", "3", "6"] and line.endswith("max_num_seqs=32 *") for line in lines)
    assert any(line.split()[:3] == ["2", "none", "1"] and "block_size=64" in line for line in lines)
    assert "engine did not start: out of HBM" in shown.stdout
    assert f"tpuctl deploy ID --model gemma-4-26b-a4b --accelerator v6e-4 --preset {run_id}" in shown.stdout


def test_deploy_with_a_preset_serves_its_flags_and_refuses_another_slice(world: GatewayWorld) -> None:
    world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
    run_id = tuned_run(world.store, world.bus, "gemma-a", trial({}, 2.0), trial({"max_num_seqs": 64}, 2.6))
    world.published()
    deploy = ("deploy", "gemma-b", "--model", "gemma-4-26b-a4b", "--zone", "us-east5-b", "--preset", run_id)
    accepted = tpuctl(world, *deploy, "--accelerator", "v6e-4")
    assert accepted.code == EXIT_OK, accepted.stderr
    (message,) = world.published()
    assert isinstance(message, CreateDeployment)
    assert (message.spec.serving.max_num_seqs, message.spec.serving.preset) == (64, run_id)
    refused = tpuctl(world, *deploy, "--accelerator", "v6e-8")
    assert refused.code == EXIT_USAGE
    assert f"[invalid_argument] --preset: run {run_id} was verified for accelerator v6e-4, not v6e-8" in (
        refused.stderr
    )
    assert "tpuctl tune ID --trials 4 --slo-ttft-ms 500" in refused.stderr  # the fix, in tpuctl words
    assert world.published() == []

"""A tune's ``benchmark.completed`` as a TPU VM's node agent reports it (``loadgen.autotune``), so the controller and
gateway tests state only the trials they vary."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from shared.adapters.clock import SystemClock
from shared.messages import BenchmarkCompleted, BenchmarkRequest, RunBenchmark, new_command_id
from shared.ports import CommandBus, StateStore
from shared.services.benchmarker import Benchmarker

BASELINE = {"max_num_seqs": 16, "max_num_batched_tokens": 2048, "block_size": 32, "prefix_caching": True}
IMAGE = "vllm/vllm-tpu:v0.32.0"


def trial(overrides: dict[str, Any], rate: float | None, failing: float | None = None, **extra: Any) -> dict[str, Any]:
    """One trial: its flags, max rate at the SLO and lowest failing rate (twice the max rate unless given)."""
    return {
        "overrides": overrides,
        "max_rate_at_slo": rate,
        "lowest_failing_rate": failing if failing is not None else (rate * 2 if rate else 0.5),
        "stop_reason": "the SLO broke at the next rate",
        "goodput_at_max_rate": rate,
        "rows": [],
        **extra,
    }


def tune_section(*trials: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """The ``tune`` section of a tune's result (``extra``: what a VM may add, e.g. a claimed ``best``)."""
    return {"baseline": BASELINE, "trials": list(trials), "image": IMAGE, **extra}


def tune_result(section: dict[str, Any]) -> dict[str, Any]:
    """A tune's whole result: the run's usual figures (none here) and its ``tune`` section."""
    return {
        "endpoint": "completions",
        "server": {"version": "0.32.0", "model": "google/gemma-4-31B-it", "max_model_len": 8192},
        "tune": section,
    }


def tuned_run(store: StateStore, bus: CommandBus, deployment_id: str, *trials: dict[str, Any]) -> str:
    """A tune of ``deployment_id`` (serving, in ``store``) recorded, dispatched and answered with ``trials`` through
    the real benchmarker, as the controller keeps it; returns its run id."""
    bus.ensure_topic("tpuctl-node-tasks")
    benchmarker = Benchmarker(store, bus, SystemClock())
    request = BenchmarkRequest(tune_trials=max(len(trials), 2), slo_ttft_ms=500.0, input_len=512)
    now = datetime.now(UTC)
    message = RunBenchmark(command_id=new_command_id(), issued_at=now, deployment_id=deployment_id, benchmark=request)
    benchmarker.handle(message)
    answer = BenchmarkCompleted(
        command_id=new_command_id(),
        issued_at=now,
        deployment_id=deployment_id,
        run_id=message.command_id,
        status="completed",
        result=tune_result(tune_section(*trials)),
    )
    outcome = benchmarker.handle(answer)
    assert outcome.startswith("stored completed"), outcome
    return message.command_id

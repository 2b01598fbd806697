"""The benchmarker's side of an auto-tune (issue 22, item 5) against the embedded store and bus: a tune run's
``tune`` section, reported by a VM that may be hostile, is checked (closed flags, bounded numbers), its best trial
recomputed, and the verified preset kept with the run; a section that fails the check fails the run by name."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from shared.adapters.clock import ManualClock
from shared.adapters.local_bus import LocalBus
from shared.adapters.sqlite_store import SqliteStateStore
from shared.domain.autotune import VerifiedPreset
from shared.domain.models import BenchmarkRun, DeploymentRecord, DeploymentSpec, DeploymentStatus, Phase, Tier
from shared.messages import BenchmarkCompleted, BenchmarkRequest, RunBenchmark, new_command_id
from shared.services.benchmarker import Benchmarker, BenchmarkerSettings
from tests.support.builders import spec_dict
from tests.support.tune_reports import BASELINE, IMAGE, trial, tune_result, tune_section

START = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
NODE_TASKS = "tpuctl-node-tasks"


@dataclass
class World:
    store: SqliteStateStore
    clock: ManualClock
    benchmarker: Benchmarker

    def run(self, run_id: str) -> BenchmarkRun:
        stored = self.store.get_benchmark_run(run_id)
        assert stored is not None, f"run {run_id} is not stored"
        return stored


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    clock = ManualClock(START)
    store = SqliteStateStore(tmp_path / "state.sqlite")
    bus = LocalBus(tmp_path / "bus.sqlite", clock=clock)
    bus.ensure_topic(NODE_TASKS)
    spec = DeploymentSpec.model_validate(spec_dict("gemma-a", model="gemma-4-31b", accelerator="v6e-4"))
    store.put_deployment(
        DeploymentRecord(
            deployment_id="gemma-a",
            spec=spec,
            status=DeploymentStatus(phase=Phase.SERVING, tier=Tier.SPOT, zone="us-east5-b"),
            created_at=START,
            updated_at=START,
        ),
        expected_version=None,
    )
    try:
        yield World(store, clock, Benchmarker(store, bus, clock, settings=BenchmarkerSettings()))
    finally:
        bus.close()
        store.close()


def _tune(world: World, trials: int = 4, **benchmark: Any) -> RunBenchmark:
    """A tune run, recorded and dispatched to the node as the controller does it."""
    request = BenchmarkRequest.model_validate(
        {"tune_trials": trials, "slo_ttft_ms": 500.0, "slo_tpot_ms": 50.0, "input_len": 512, **benchmark}
    )
    message = RunBenchmark(command_id=new_command_id(), issued_at=START, deployment_id="gemma-a", benchmark=request)
    assert world.benchmarker.handle(message).startswith("dispatched")
    return message


def _answer(run: RunBenchmark, result: dict[str, Any]) -> BenchmarkCompleted:
    return BenchmarkCompleted.model_validate(
        {
            "command_id": new_command_id(),
            "issued_at": START,
            "deployment_id": "gemma-a",
            "run_id": run.command_id,
            "status": "completed",
            "result": result,
        }
    )


def test_a_tune_keeps_its_checked_trials_and_a_verified_preset_of_the_best(world: World) -> None:
    run = _tune(world)
    world.clock.advance(40 * 60)
    section = tune_section(
        trial({}, 2.0),
        trial({"max_num_seqs": 32}, 3.0),
        trial({"max_num_seqs": 32, "max_num_batched_tokens": 4096}, 2.5),
    )
    answer = _answer(run, tune_result(section))
    outcome = world.benchmarker.handle(answer)
    assert outcome.startswith(f"stored completed run {run.command_id}")
    assert "tuned: verified preset max_num_seqs=32 (1.50x the baseline)" in outcome
    stored = world.run(run.command_id)
    assert stored.status == "completed" and stored.error == ""
    tune = (stored.result or {})["tune"]
    assert [t["max_rate_at_slo"] for t in tune["trials"]] == [2.0, 3.0, 2.5]
    assert tune["best"] == 1 and tune["gain"] == pytest.approx(1.5) and tune["baseline"] == BASELINE
    preset = VerifiedPreset.model_validate((stored.result or {})["preset"])
    assert preset.run_id == run.command_id and preset.deployment_id == "gemma-a"
    assert (preset.model, preset.accelerator, preset.image) == ("gemma-4-31b", "v6e-4", IMAGE)
    assert preset.overrides == {"max_num_seqs": 32} and preset.max_rate_at_slo == 3.0
    assert preset.baseline_max_rate == 2.0 and preset.trials == 3
    assert (preset.slo_ttft_ms, preset.slo_tpot_ms) == (500.0, 50.0)
    assert preset.workload == {"workload": "random", "input_len": 512, "output_len": 64}
    assert preset.created_at == START + timedelta(minutes=40)
    assert world.benchmarker.handle(answer).startswith("duplicate")  # redelivered: nothing changes
    assert world.run(run.command_id) == stored


def test_the_best_and_gain_a_vm_claims_are_recomputed_not_taken(world: World) -> None:
    run = _tune(world)
    section = tune_section(trial({}, 2.0), trial({"max_num_seqs": 8}, 1.0), best=1, gain=99.0)
    world.benchmarker.handle(_answer(run, tune_result(section)))
    result = world.run(run.command_id).result or {}
    assert result["tune"]["best"] == 0 and result["tune"]["gain"] == pytest.approx(1.0)
    assert result["preset"]["overrides"] == {}  # the baseline won: the plan's own flags are what was verified
    assert result["preset"]["gain"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("section", "field"),
    [
        (
            tune_section(trial({}, 2.0), trial({"max_num_seqs": 32, "entrypoint": "sh -c 'curl evil'"}, 9.0)),
            "tune.trials[1].overrides.entrypoint: is not a tunable flag",
        ),
        (tune_section(trial({}, 2.0), trial({"max_num_seqs": 10**9}, 9.0)), "tune.trials[1].overrides.max_num_seqs"),
        (tune_section(trial({}, 2.0), trial({"max_num_seqs": 32}, 1e12, 2e12)), "tune.trials[1].max_rate_at_slo"),
        (tune_section(*[trial({}, 1.0)] * 5), "tune.trials: has 5 trials, over the 4 asked for"),
        (tune_section(trial({"max_num_seqs": 32}, 3.0)), "tune.trials[0].overrides: is not the baseline"),
        ("all good, trust me", "tune: the node reported no tune section"),
    ],
)
def test_a_hostile_tune_section_fails_the_run_by_name_and_keeps_no_preset(
    world: World, section: Any, field: str
) -> None:
    run = _tune(world)
    outcome = world.benchmarker.handle(_answer(run, tune_result(section)))
    stored = world.run(run.command_id)
    assert stored.status == "failed" and field in stored.error, stored.error
    assert outcome.startswith(f"stored failed run {run.command_id}") and field in outcome
    assert "tune" not in (stored.result or {}) and "preset" not in (stored.result or {})
    assert "curl" not in stored.error  # the refusal names the flag, never the value the VM sent


def test_a_tune_where_no_trial_met_the_slo_keeps_its_trials_and_no_preset(world: World) -> None:
    run = _tune(world, trials=2)
    outcome = world.benchmarker.handle(_answer(run, tune_result(tune_section(trial({}, None), trial({}, 0.0)))))
    result = world.run(run.command_id).result or {}
    assert world.run(run.command_id).status == "completed"
    assert result["tune"]["best"] is None and "preset" not in result
    assert outcome.endswith("tuned: no trial met the SLO, no preset kept")


def test_a_plain_run_never_stores_a_tune_section_its_node_slipped_in(world: World) -> None:
    request = BenchmarkRequest(concurrency=(1,), num_prompts=8)
    message = RunBenchmark(command_id=new_command_id(), issued_at=START, deployment_id="gemma-a", benchmark=request)
    world.benchmarker.handle(message)
    claimed = tune_section(trial({}, 1.0), trial({"max_num_seqs": 64}, 9.0))
    preset = {"run_id": message.command_id, "overrides": {"max_num_seqs": 64}}
    world.benchmarker.handle(_answer(message, {**tune_result(claimed), "preset": preset}))
    stored = world.run(message.command_id)
    assert stored.status == "completed"
    assert "tune" not in (stored.result or {}) and "preset" not in (stored.result or {})


def test_a_tune_is_given_time_for_every_trial_before_it_counts_as_unanswered(world: World) -> None:
    tune = _tune(world, trials=4)
    plain = RunBenchmark(
        command_id=new_command_id(),
        issued_at=START,
        deployment_id="gemma-a",
        benchmark=BenchmarkRequest(concurrency=(1,), num_prompts=8),
    )
    world.benchmarker.handle(plain)
    world.clock.advance(3 * 3600)  # past the plain run's 2 h, within the tune's 2 h + 4 trials
    expired = world.benchmarker.expire_stale("gemma-a", world.clock.now())
    assert expired == [plain.command_id]
    assert world.run(tune.command_id).status == "dispatched"
    world.clock.advance(3600 + 60)
    assert world.benchmarker.expire_stale("gemma-a", world.clock.now()) == [tune.command_id]

"""The auto-tune trial loop (``loadgen.autotune``) against a fake engine whose capacity follows its argv.

The fake engine keeps the argv it was planned with and the one it runs (``apply_to_argv``, as the container
adapter does); the fake generator measures whatever the engine runs now: it keeps up with any rate up to
``max_num_seqs / 2`` req/s and saturates above. Both keep state; the tests read it, never the calls made.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from loadgen.autotune import EngineDidNotStart, autotune, compact_rows, search_base, tune_plan
from loadgen.generator import BenchmarkSetupError
from loadgen.rate_search import SearchPlan
from shared.domain.autotune import TuneSearch, baseline_from_argv, check_tune_result
from shared.domain.bench_rate_search import SearchSettings
from shared.domain.serving_overrides import apply_to_argv
from shared.messages import BenchmarkRequest

PLANNED = (
    "/bin/sh", "-c", "exec \"$@\"", "tpuctl-vllm", "vllm", "serve", "google/gemma-3-1b-it",
    "--max-num-seqs", "8", "--max-num-batched-tokens", "2048", "--block-size", "32", "--enable-prefix-caching",
)  # fmt: skip
IMAGE = "vllm/vllm-tpu:v0.32.0"
REQUEST = BenchmarkRequest(tune_trials=4, slo_ttft_ms=500, input_len=8, output_len=4, num_prompts=10)
PLAN = SearchPlan(SearchSettings(start_rate=1.0, max_rate=64.0, refine_steps=0), probe_requests=10)


@dataclass
class FakeEngine:
    """The serving engine: what it runs, what it was planned with, and every flag set it was started with."""

    most_seqs: int = 32  # more sequences than this do not fit: the engine exits at start
    argv: list[str] = field(default_factory=lambda: list(PLANNED))
    starts: list[dict[str, Any]] = field(default_factory=list)

    def seqs(self) -> int:
        return int(baseline_from_argv(self.argv)["max_num_seqs"])

    async def apply(self, overrides: Mapping[str, Any]) -> None:
        argv = apply_to_argv(PLANNED, overrides) if overrides else list(PLANNED)
        if argv == self.argv:
            return  # already serving these flags: nothing recreated
        self.argv = argv
        self.starts.append(dict(overrides))
        if self.seqs() > self.most_seqs:
            raise EngineDidNotStart(f"max_num_seqs {self.seqs()} does not fit the KV cache")

    def image(self) -> str | None:
        return IMAGE

    def baseline(self) -> dict[str, Any]:
        return baseline_from_argv(PLANNED)


@dataclass
class _Point:
    figures: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return self.figures


@dataclass
class _Result:
    model: str
    points: list[_Point]


@dataclass
class FakeGenerator:
    """Measures the engine as it runs now: it keeps up with ``max_num_seqs / 2`` req/s and no more."""

    engine: FakeEngine
    fail_on_seqs: int | None = None  # a probe against this many sequences raises (the server broke mid-search)
    stop_on_seqs: int | None = None  # the run is stopped during a probe against this many sequences
    probes: list[tuple[int, float]] = field(default_factory=list)
    _stopped: bool = False

    @property
    def stopped(self) -> bool:
        return self._stopped

    def stop(self) -> None:
        self._stopped = True

    async def run(self, request: BenchmarkRequest) -> _Result:
        seqs, rate = self.engine.seqs(), request.request_rate[0]
        assert request.tune_trials == 0 and request.mode == "rate"
        if seqs == self.fail_on_seqs:
            raise RuntimeError("the server went away")
        if seqs == self.stop_on_seqs:
            self.stop()
            return _Result("gemma", [])
        self.probes.append((seqs, rate))
        capacity = seqs / 2
        achieved = min(rate, capacity)
        good = request.num_prompts if rate <= capacity else 0
        point = {
            "arrival_rate": rate,
            "completion_rate": achieved,
            "completed": request.num_prompts,
            "failed": 0,
            "duration": request.num_prompts / rate,
            "request_goodput": good / (request.num_prompts / rate),
            "total_output_tokens": request.num_prompts * request.output_len,
            "median_ttft_ms": 50.0 if rate <= capacity else 5000.0,
        }
        return _Result("gemma", [_Point(point)])


def _tune(engine: FakeEngine, generator: FakeGenerator, budget: int = 4) -> dict[str, Any]:
    search = TuneSearch(engine.baseline(), REQUEST.workload, budget)
    return asyncio.run(autotune(engine, generator, REQUEST, PLAN, search))  # type: ignore[arg-type]


def test_each_trial_runs_on_its_own_flags_keeps_the_best_and_the_planned_flags_come_back() -> None:
    engine = FakeEngine()
    generator = FakeGenerator(engine)
    seen: list[dict[str, Any]] = []
    search = TuneSearch(engine.baseline(), REQUEST.workload, 4)
    tune = asyncio.run(autotune(engine, generator, REQUEST, PLAN, search, on_trial=seen.append))  # type: ignore[arg-type]
    trials = tune["trials"]
    assert [trial["overrides"] for trial in trials] == [
        {},
        {"max_num_seqs": 16},
        {"max_num_seqs": 32},
        {"max_num_seqs": 64},
    ]
    assert [trial["max_rate_at_slo"] for trial in trials] == [4.0, 8.0, 16.0, None]
    assert trials[3]["stop_reason"] == "engine did not start: max_num_seqs 64 does not fit the KV cache"
    assert seen == trials
    # every probe ran against the engine as the trial set it: 8 seqs keep up with 4 req/s, 16 with 8, 32 with 16
    assert {seqs for seqs, _ in generator.probes} == {8, 16, 32}
    assert max(rate for seqs, rate in generator.probes if seqs == 8) == 8.0  # the first failing rung
    # the baseline ran on the planned engine (nothing recreated); the failed start was followed by the restore
    assert engine.starts == [{"max_num_seqs": 16}, {"max_num_seqs": 32}, {"max_num_seqs": 64}, {}]
    assert engine.argv == list(PLANNED)
    assert search.best() == ({"max_num_seqs": 32}, 16.0)
    assert tune["baseline"] == baseline_from_argv(PLANNED) and tune["image"] == IMAGE and tune["model"] == "gemma"
    assert trials[0]["rows"][0] == {
        "rate": 1.0,
        "requests_per_repeat": 10,
        "repeats": 1,
        "passed": True,
        "failure": None,
        "figures": {
            "offered_rate": {"n": 1, "median": 1.0},
            "achieved_rate": {"n": 1, "median": 1.0},
            "request_goodput": {"n": 1, "median": 1.0},
            "median_ttft_ms": {"n": 1, "median": 50.0},
            "slo_attainment": {"n": 1, "median": 1.0},
        },
    }


def test_what_the_loop_reports_passes_the_controllers_check_which_finds_the_same_winner() -> None:
    engine = FakeEngine()
    tune = _tune(engine, FakeGenerator(engine))
    report = {key: tune[key] for key in ("baseline", "trials", "image")}
    checked = check_tune_result(REQUEST, report)
    assert checked["best"] == 2 and checked["gain"] == 4.0
    assert "fields_dropped" not in checked  # every row field is one the controller keeps
    assert checked["trials"][2]["rows"] == tune["trials"][2]["rows"]


def test_an_error_mid_search_still_restores_the_planned_flags() -> None:
    engine = FakeEngine()
    with pytest.raises(RuntimeError, match="the server went away"):
        _tune(engine, FakeGenerator(engine, fail_on_seqs=16))
    assert engine.argv == list(PLANNED) and engine.starts == [{"max_num_seqs": 16}, {}]


def test_a_stop_ends_the_loop_without_a_partial_trial_and_restores() -> None:
    engine = FakeEngine()
    generator = FakeGenerator(engine, stop_on_seqs=16)
    tune = _tune(engine, generator)
    assert [trial["overrides"] for trial in tune["trials"]] == [{}]  # the stopped trial is not reported
    assert engine.argv == list(PLANNED) and engine.starts[-1] == {}


def test_a_baseline_that_cannot_be_measured_fails_the_tune_and_a_later_trial_is_only_recorded() -> None:
    class SetupFails(FakeGenerator):
        async def run(self, request: BenchmarkRequest) -> _Result:
            if self.engine.seqs() == self.fail_on_seqs:
                raise BenchmarkSetupError("input_len: longer than the served context")
            return await super().run(request)

    engine = FakeEngine()
    with pytest.raises(BenchmarkSetupError):
        _tune(engine, SetupFails(engine, fail_on_seqs=8))
    engine = FakeEngine()
    tune = _tune(engine, SetupFails(engine, fail_on_seqs=16), budget=3)
    assert tune["trials"][1]["stop_reason"].startswith("search failed: input_len: longer")
    assert tune["trials"][1]["max_rate_at_slo"] is None and engine.argv == list(PLANNED)


def test_the_search_plan_and_probe_request_follow_the_tune_request() -> None:
    plan = tune_plan(REQUEST.model_copy(update={"request_rate": (2.0, 0.5, 40.0), "duration_s": 5.0}))
    assert (plan.settings.start_rate, plan.settings.max_rate) == (0.5, 40.0)
    assert (plan.probe_requests, plan.probe_seconds, plan.repeats) == (10, 5.0, 1)
    plain = tune_plan(REQUEST)
    assert (plain.settings.start_rate, plain.settings.max_rate, plain.probe_seconds) == (1.0, 1000.0, 8.0)
    base = search_base(REQUEST)
    assert base.tune_trials == 0 and base.slo_ttft_ms == 500 and base.input_len == 8


def test_compact_rows_keep_medians_and_drop_the_rest() -> None:
    row = {
        "rate": 2.0,
        "requests_per_repeat": 16,
        "repeats": 3,
        "passed": False,
        "failure": "slo",
        "reason": "2 req/s: 70% met the SLO",
        "figures": {"mean_tpot_ms": {"n": 3, "median": 9.5, "mean": 9.0, "median_ci95": [8, 11]}, "p90_itl_ms": {}},
        "server": {"completed": 48},
    }
    assert compact_rows([row]) == [
        {
            "rate": 2.0,
            "requests_per_repeat": 16,
            "repeats": 3,
            "passed": False,
            "failure": "slo",
            "figures": {"mean_tpot_ms": {"n": 3, "median": 9.5}},
        }
    ]

"""Auto-tune (issue 22, item 5): which serving flags to try next, what a VM's tune report may say, and the preset.

A tune is a greedy coordinate search over ``serving_overrides.TUNABLE``: the baseline (the planned flags, ``{}``)
first, then trials that each change ONE knob of the best set so far (cumulative: an improvement is kept and the
next trial starts from it). Each trial is judged by its max request rate at the SLO (``bench_rate_search``); the
search stops when the trial budget is spent or no candidate is left. Why greedy: every trial recreates vLLM (on a
TPU a recompile of minutes), so a budget of a handful of trials must go to the knobs most likely to matter first:
batch width (max_num_seqs), the prefill chunk (max_num_batched_tokens), prefix caching for workloads that share
prompts, then the KV block size and an fp8 KV cache.

The VM runs the trials and reports them; the VM is untrusted (``shared.domain.untrusted``), so
:func:`check_tune_result` checks every value it reports and recomputes the winner itself, and only then
:func:`preset_from` keeps the winner as a :class:`VerifiedPreset` a deployment can reuse without tuning again.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

from shared.domain.bench_rate_search import SEARCH_FIGURES
from shared.domain.errors import InvalidMessage
from shared.domain.launch import check_image
from shared.domain.models import (
    RUN_ID_PATTERN,
    AcceleratorType,
    BenchmarkRun,
    DeploymentId,
    ModelPreset,
    UtcDateTime,
)
from shared.domain.serving_overrides import BLOCK_SIZES, TUNABLE, check_overrides
from shared.domain.untrusted import DROPPED_KEY, Choice, Either, Flag, Items, Number, Record, clean_record, clean_text

__all__ = [
    "MAX_TUNE_RATE",
    "TUNE_FIGURES",
    "TuneRequest",
    "TuneSearch",
    "VerifiedPreset",
    "baseline_from_argv",
    "check_tune_result",
    "preset_from",
    "tune_in_progress",
]

_SHARING_WORKLOADS = frozenset({"shared_prefix", "multi_turn"})
MAX_TUNE_RATE = 10000.0
"""The highest rate (req/s) a trial may report: ``BenchmarkRequest.request_rate``'s own bound."""
_STOP_REASON_CHARS = 300
_IMAGE_CHARS = 300
_MAX_ROWS = 64  # SearchSettings.max_probes' bound: one row per probed rate
_IMAGE_ID = re.compile(r"^sha256:[0-9a-f]{64}$")


def _flag_value(words: Sequence[str], flag: str) -> str | None:
    """The value of the last ``flag VALUE`` or ``flag=VALUE`` (argparse keeps the last), or None."""
    found = None
    for at, word in enumerate(words):
        if word == flag and at + 1 < len(words):
            found = words[at + 1]
        elif word.startswith(flag + "="):
            found = word[len(flag) + 1 :]
    return found


def baseline_from_argv(argv: Sequence[str]) -> dict[str, Any]:
    """The TUNABLE values a vLLM argv runs with: vLLM's defaults where a flag is absent (prefix caching on, KV cache
    in the model's dtype). A value outside the tunable range is left out, so the search leaves that knob alone."""
    words = list(argv)
    switches = [word for word in words if word in ("--enable-prefix-caching", "--no-enable-prefix-caching")]
    found: dict[str, Any] = {"prefix_caching": not switches or switches[-1] == "--enable-prefix-caching"}
    for name, (flag, kind, _allowed) in TUNABLE.items():
        value = _flag_value(words, flag) if kind != "bool" else None
        if value is None:
            continue
        whole = value.isascii() and value.isdigit()  # not "²", which isdigit() takes and int() refuses
        found[name] = int(value) if whole and (kind == "int" or name == "block_size") else value
    found.setdefault("kv_cache_dtype", "auto")
    kept: dict[str, Any] = {}
    for name, value in found.items():
        try:
            kept.update(check_overrides({name: value}, "baseline"))
        except InvalidMessage:
            continue
    return kept


def _clamp(name: str, value: int) -> int:
    low, high = TUNABLE[name][2]
    return max(low, min(high, value))


class TuneSearch:
    """The trials of one tune: ``next_overrides`` gives the next flag set to try (None: done), ``record`` its max
    rate at the SLO (None: it met the SLO at no rate, or its engine did not start)."""

    def __init__(self, baseline: Mapping[str, Any], workload: str, budget: int) -> None:
        if budget < 1:
            raise InvalidMessage("tune_trials", f"{budget} leaves no trial", "give at least 2 (the baseline and one)")
        self.baseline = check_overrides(baseline, "baseline")
        self.workload = workload
        self.budget = budget
        self.tried: list[tuple[dict[str, Any], float | None]] = []
        self._best: tuple[dict[str, Any], float | None] = ({}, None)

    def _value(self, name: str, overrides: Mapping[str, Any]) -> Any:
        return overrides.get(name, self.baseline.get(name))

    def _changes(self, best: Mapping[str, Any]) -> list[tuple[str, Any]]:
        """One-knob changes of ``best``, the most promising first."""
        changes: list[tuple[str, Any]] = []
        prefix = self._value("prefix_caching", best)
        if self.workload in _SHARING_WORKLOADS and prefix is False:
            changes.append(("prefix_caching", True))
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            value = self._value(name, best)
            if isinstance(value, int):
                changes += [(name, _clamp(name, value * 2)), (name, _clamp(name, value // 2))]
        if self.workload not in _SHARING_WORKLOADS and prefix is not False:
            changes.append(("prefix_caching", False))  # distinct prompts: the cache's lookups buy nothing
        block = self._value("block_size", best)
        if block in BLOCK_SIZES:
            at = BLOCK_SIZES.index(block)
            changes += [("block_size", size) for size in (*BLOCK_SIZES[at + 1 : at + 2], *BLOCK_SIZES[:at][-1:])]
        if self._value("kv_cache_dtype", best) != "fp8":
            changes.append(("kv_cache_dtype", "fp8"))
        return changes

    def _candidates(self, best: Mapping[str, Any]) -> list[dict[str, Any]]:
        """``best`` with each change applied, skipping no-ops and sets vLLM refuses (fewer batched tokens than
        sequences: it schedules at least one token per sequence)."""
        candidates = []
        for name, value in self._changes(best):
            if value == self._value(name, best):
                continue
            trial = {**best, name: value}
            seqs, batched = self._value("max_num_seqs", trial), self._value("max_num_batched_tokens", trial)
            if isinstance(seqs, int) and isinstance(batched, int) and batched < seqs:
                continue
            candidates.append(trial)
        return candidates

    def _effective(self, overrides: Mapping[str, Any]) -> dict[str, Any]:
        return {name: self._value(name, overrides) for name in TUNABLE}

    def _seen(self, overrides: Mapping[str, Any]) -> bool:
        effective = self._effective(overrides)
        return any(self._effective(tried) == effective for tried, _ in self.tried)

    def next_overrides(self) -> dict[str, Any] | None:
        """The next flag set (``{}`` first: the baseline), or None when the budget is spent or nothing is left."""
        if len(self.tried) >= self.budget:
            return None
        if not self.tried:
            return {}
        for candidate in self._candidates(self._best[0]):
            if not self._seen(candidate):
                return candidate
        return None

    def record(self, overrides: Mapping[str, Any], max_rate_at_slo: float | None) -> None:
        """A trial's outcome; the best so far is the highest max rate (the earlier trial on a tie)."""
        tried = check_overrides(overrides, "overrides")
        if max_rate_at_slo is not None and not (math.isfinite(max_rate_at_slo) and max_rate_at_slo >= 0):
            raise InvalidMessage("max_rate_at_slo", f"{max_rate_at_slo} is not a rate", "give req/s >= 0 or None")
        self.tried.append((tried, max_rate_at_slo))
        best_rate = self._best[1]
        if max_rate_at_slo and (best_rate is None or max_rate_at_slo > best_rate):
            self._best = (tried, max_rate_at_slo)

    def best(self) -> tuple[dict[str, Any], float | None]:
        """The best flag set and its max rate at the SLO (``({}, None)`` when no trial met the SLO)."""
        return dict(self._best[0]), self._best[1]


# --- the VM's report, checked -------------------------------------------------------------------------------------


class TuneRequest(Protocol):
    """What the check and the preset read of the run's request: ``shared.messages.BenchmarkRequest`` (the domain
    does not import the messages)."""

    @property
    def tune_trials(self) -> int: ...
    @property
    def workload(self) -> str: ...
    @property
    def input_len(self) -> int: ...
    @property
    def output_len(self) -> int: ...
    @property
    def prefix_len(self) -> int: ...
    @property
    def prefix_share(self) -> float: ...
    @property
    def turns(self) -> int: ...
    @property
    def slo_ttft_ms(self) -> float | None: ...
    @property
    def slo_tpot_ms(self) -> float | None: ...


TUNE_FIGURES = SEARCH_FIGURES  # the figures a trial's row may carry: the search's

_FIGURE = Number(low=-1e12, high=1e12)  # a 95 % t-interval's low end may dip below zero
_ESTIMATE = Record(
    {
        "n": Number(integer=True, high=1e6),
        "mean": _FIGURE,
        "mean_ci95": Items(_FIGURE, 2),
        "median": _FIGURE,
        "median_ci95": Items(_FIGURE, 2),
    }
)
_COUNT = Number(integer=True, high=1e15)
_ROW = Record(
    {
        "rate": Number(high=MAX_TUNE_RATE),
        "requests_per_repeat": _COUNT,
        "repeats": Number(integer=True, high=20),
        "passed": Flag(),
        "failure": Choice(frozenset({"saturated", "slo"})),
        "figures": Record({name: _ESTIMATE for name in TUNE_FIGURES}),
        "server": Record(
            {
                "completed": _COUNT,
                "server_requests_succeeded": _COUNT,
                "output_tokens": _COUNT,
                "server_generation_tokens": _COUNT,
                "requests_agreement": Number(low=-1, high=1e6),
                "output_tokens_agreement": Number(low=-1, high=1e6),
            }
        ),
    }
)
"""One probed rate of a trial's search (``loadgen.rate_search._row``), numbers only: its reason text is dropped."""
_TRIAL_DETAIL = Record({"rows": Items(_ROW, _MAX_ROWS), "goodput_at_max_rate": Either((_ESTIMATE, _FIGURE))})

Redact = Callable[[str], str]


def _mapping(value: Any, field: str, fix: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidMessage(field, "is not an object", fix)
    return value


def _rate(value: Any, field: str) -> float | None:
    """A reported rate: None, or a finite number of req/s within 0..MAX_TUNE_RATE."""
    if value is None:
        return None
    good = isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= MAX_TUNE_RATE
    if not good or not math.isfinite(value):
        raise InvalidMessage(field, "is not a rate", f"give req/s from 0 to {MAX_TUNE_RATE:g}, or null")
    return float(value)


def _image(value: Any) -> str | None:
    """The serving image the VM ran: a pinned reference (``repo:tag``, ``repo@sha256:...``) or an image id."""
    if value is None:
        return None
    fix = "report the container's pinned image reference or sha256 image id"
    if not isinstance(value, str) or len(value) > _IMAGE_CHARS:
        raise InvalidMessage("tune.image", "is not an image reference", fix)
    if _IMAGE_ID.fullmatch(value):
        return value
    try:
        return check_image(value)
    except InvalidMessage:
        raise InvalidMessage("tune.image", "is not a pinned image reference", fix) from None


def _check_trial(raw: Any, field: str, redact: Redact | None) -> tuple[dict[str, Any], int]:
    """One trial as the controller keeps it, and how many row fields cleaning dropped."""
    trial = _mapping(raw, field, "report {overrides, max_rate_at_slo, lowest_failing_rate, stop_reason, rows}")
    overrides = _mapping(trial.get("overrides"), f"{field}.overrides", "give the trial's flags, {} for the baseline")
    max_rate = _rate(trial.get("max_rate_at_slo"), f"{field}.max_rate_at_slo")
    failing = _rate(trial.get("lowest_failing_rate"), f"{field}.lowest_failing_rate")
    if max_rate is not None and failing is not None and max_rate >= failing:
        raise InvalidMessage(
            f"{field}.max_rate_at_slo",
            f"{max_rate:g} is not below the lowest failing rate {failing:g}",
            "the max rate at the SLO is the highest passing rate below the lowest failing one",
        )
    reason = trial.get("stop_reason")
    if reason is not None and not isinstance(reason, str):
        raise InvalidMessage(f"{field}.stop_reason", "is not text", "say why the trial's search stopped")
    detail = clean_record(
        {key: trial[key] for key in ("rows", "goodput_at_max_rate") if key in trial}, _TRIAL_DETAIL, redact=redact
    )
    checked = {
        "overrides": check_overrides(overrides, f"{field}.overrides"),
        "max_rate_at_slo": max_rate,
        "lowest_failing_rate": failing,
        "stop_reason": clean_text(reason or "", _STOP_REASON_CHARS, redact=redact),
        "goodput_at_max_rate": detail.data.get("goodput_at_max_rate"),
        "rows": detail.data.get("rows", []),
    }
    return checked, detail.dropped


def _best_index(trials: Sequence[Mapping[str, Any]]) -> int | None:
    """The trial with the highest max rate at the SLO (the earlier on a tie); None when none met the SLO."""
    best: int | None = None
    for index, trial in enumerate(trials):
        rate = trial.get("max_rate_at_slo")
        if rate and (best is None or rate > trials[best]["max_rate_at_slo"]):
            best = index
    return best


def _gain(trials: Sequence[Mapping[str, Any]], best: int | None) -> float | None:
    """The winner's max rate over the baseline's (trial 0), or None without both."""
    baseline = trials[0]["max_rate_at_slo"] if trials else None
    return trials[best]["max_rate_at_slo"] / baseline if best is not None and baseline else None


def check_tune_result(request: TuneRequest, raw: Mapping[str, Any], *, redact: Redact | None = None) -> dict[str, Any]:
    """The ``tune`` section a VM reported, as the controller keeps it: ``baseline``, ``trials`` (overrides, max rate
    at the SLO, lowest failing rate, stop reason, goodput at the max rate, numeric rows), ``image``, and the
    winner recomputed here, never taken from the VM: ``best`` (a trial's index or None) and ``gain`` (its max rate
    over the baseline's; None without a baseline rate). Unknown keys are ignored; a malformed value raises
    ``InvalidMessage`` naming it. ``redact`` scrubs secrets from the texts (the controller's secret scrubber)."""
    if request.tune_trials < 2:
        raise InvalidMessage("tune", "was reported for a run that asked for no tune", "tune with tune_trials >= 2")
    tune = _mapping(raw, "tune", "report {baseline, trials, image}")
    baseline = _mapping(tune.get("baseline"), "tune.baseline", "report the running engine's tunable values")
    reported = tune.get("trials")
    if not isinstance(reported, list | tuple):
        raise InvalidMessage("tune.trials", "is not a list", "report one entry per trial, the baseline first")
    if len(reported) > request.tune_trials:
        raise InvalidMessage(
            "tune.trials", f"has {len(reported)} trials, over the {request.tune_trials} asked for", "run at most those"
        )
    trials: list[dict[str, Any]] = []
    dropped = 0
    for index, entry in enumerate(reported):
        trial, inner = _check_trial(entry, f"tune.trials[{index}]", redact)
        trials.append(trial)
        dropped += inner
    if trials and trials[0]["overrides"]:
        raise InvalidMessage("tune.trials[0].overrides", "is not the baseline", "the first trial runs the plan's {}")
    best = _best_index(trials)
    checked: dict[str, Any] = {
        "baseline": check_overrides(baseline, "tune.baseline"),
        "trials": trials,
        "image": _image(tune.get("image")),
        "best": best,
        "gain": _gain(trials, best),
    }
    if dropped:
        checked[DROPPED_KEY] = dropped
    return checked


# --- the verified preset ------------------------------------------------------------------------------------------

_REVISION = r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,99}$"


class VerifiedPreset(BaseModel):
    """The winning flags of a tune with what they were verified on (image, model revision, slice, workload, SLO)
    and what they measured: reusable by a deployment of the same model on the same slice without tuning again."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str = Field(pattern=RUN_ID_PATTERN, description="The tune run; a deployment names it as serving.preset.")
    deployment_id: DeploymentId
    model: ModelPreset
    model_revision: str | None = Field(default=None, pattern=_REVISION)
    accelerator: AcceleratorType
    image: str | None = Field(default=None, max_length=_IMAGE_CHARS)
    workload: dict[str, Any] = Field(description="The request's workload and lengths the trials ran.")
    slo_ttft_ms: float | None = Field(default=None, gt=0)
    slo_tpot_ms: float | None = Field(default=None, gt=0)
    overrides: dict[str, Any] = Field(description="The winning flags, as changes of the planned ones ({}: the plan).")
    max_rate_at_slo: float = Field(gt=0, le=MAX_TUNE_RATE)
    baseline_max_rate: float | None = Field(default=None, ge=0, le=MAX_TUNE_RATE)
    gain: float | None = Field(default=None, gt=0)
    trials: int = Field(ge=1, le=64, description="Trials run, the baseline included.")
    created_at: UtcDateTime

    @field_validator("overrides")
    @classmethod
    def _tunable(cls, value: dict[str, Any]) -> dict[str, Any]:
        try:
            return check_overrides(value, "overrides")
        except InvalidMessage as exc:
            raise ValueError(str(exc)) from None

    def serving_values(self) -> dict[str, Any]:
        """What a deployment spec's ``serving`` takes from this preset: the flags and the run they came from."""
        return {**self.overrides, "preset": self.run_id}


def _workload(request: TuneRequest) -> dict[str, Any]:
    """The request's workload and the lengths that shaped it (the settings another workload ignores left out)."""
    shape: dict[str, Any] = {
        "workload": request.workload,
        "input_len": request.input_len,
        "output_len": request.output_len,
    }
    if request.workload == "shared_prefix":
        shape.update(prefix_len=request.prefix_len, prefix_share=request.prefix_share)
    if request.workload == "multi_turn":
        shape["turns"] = request.turns
    return shape


def preset_from(
    run_id: str,
    *,
    deployment_id: str,
    model: str,
    model_revision: str | None,
    accelerator: str,
    planned_image: str | None,
    request: TuneRequest,
    checked: Mapping[str, Any],
    created_at: datetime,
) -> VerifiedPreset | None:
    """The preset a checked tune (:func:`check_tune_result`) verified, or None when no trial met the SLO. The image
    is the one the VM reported running (a digest when it gave one), else the plan's."""
    trials = list(checked.get("trials") or [])
    best = _best_index(trials)
    if best is None:
        return None
    winner = trials[best]
    return VerifiedPreset.model_validate(
        {
            "run_id": run_id,
            "deployment_id": deployment_id,
            "model": model,
            "model_revision": model_revision,
            "accelerator": accelerator,
            "image": checked.get("image") or planned_image,
            "workload": _workload(request),
            "slo_ttft_ms": request.slo_ttft_ms,
            "slo_tpot_ms": request.slo_tpot_ms,
            "overrides": winner["overrides"],
            "max_rate_at_slo": winner["max_rate_at_slo"],
            "baseline_max_rate": trials[0]["max_rate_at_slo"],
            "gain": _gain(trials, best),
            "trials": len(trials),
            "created_at": created_at,
        }
    )


def tune_in_progress(runs: Iterable[BenchmarkRun]) -> bool:
    """Whether one of a deployment's runs is a tune the node is carrying out (its trials restart vLLM)."""
    return any(run.status in ("dispatched", "running") and run.request.get("tune_trials", 0) for run in runs)

"""The auto-tune views of a benchmark run (issue 22, item 5), apart from ``models.py`` (its size).

A tune run's stored result carries the controller's ``tune`` section (``shared.domain.autotune.check_tune_result``:
each trial's flags and max rate at the SLO, the best trial and its gain recomputed by the controller, never taken
from the VM) and, when a trial met the SLO, the ``preset`` it kept (``VerifiedPreset``). These views read both as
stored, defensively: a run stored by an older controller, or a field of the wrong type, gives no view rather than
an error.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from shared.domain.serving_overrides import TUNABLE, describe_overrides
from shared.domain.untrusted import clean_text

__all__ = ["PresetView", "TuneTrialView", "TuneView", "preset_view", "tune_line", "tune_table", "tune_view"]


class TuneTrialView(BaseModel):
    """One trial of a tune: the flags it changed from the plan and its max request rate at the SLO."""

    model_config = ConfigDict(extra="forbid")

    trial: int = Field(description="0 is the baseline (the planned flags).")
    overrides: dict[str, Any] = Field(description="The serving flags this trial changed from the plan.")
    flags: str = Field(description="The same for people, e.g. 'max_num_seqs=64, prefix_caching=on'.")
    max_rate_at_slo: float | None = Field(default=None, description="Requests/s at the SLO; None: met it at none.")
    lowest_failing_rate: float | None = None
    stop_reason: str = ""
    best: bool = False


class TuneView(BaseModel):
    """A tune's trials and the best one (chosen by the controller from the measured rates)."""

    model_config = ConfigDict(extra="forbid")

    trials: list[TuneTrialView]
    best: int | None = Field(default=None, description="The best trial's number; None: no trial met the SLO.")
    baseline_max_rate: float | None = None
    best_max_rate: float | None = None
    gain: float | None = Field(default=None, description="Best max rate over the baseline's.")
    image: str | None = None
    text: str = Field(description="For people: the baseline's max rate at the SLO, the best's, the gain and flags.")


class PresetView(BaseModel):
    """The verified preset a tune kept: reuse it with tpu_deploy(preset=RUN_ID) on the same model and slice."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    model: str | None = None
    model_revision: str | None = None
    accelerator: str | None = None
    image: str | None = None
    workload: dict[str, Any] = Field(default_factory=dict)
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    overrides: dict[str, Any]
    flags: str
    max_rate_at_slo: float | None = None
    baseline_max_rate: float | None = None
    gain: float | None = None


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _ordered(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The flags in ``TUNABLE``'s order (a stored dict comes back with its keys sorted), unknown names last."""
    return {**{name: overrides[name] for name in TUNABLE if name in overrides}, **overrides}


def _text(value: Any, limit: int = 200) -> str | None:
    """Stored text cleaned again (the stop reasons and image name came from the VM): None when absent."""
    return clean_text(value, limit) or None if isinstance(value, str) else None


def _rate(value: float | None) -> str:
    return "none" if value is None else f"{value:g}"


def tune_line(baseline: float | None, best: float | None, gain: float | None, flags: str | None) -> str:
    """``max rate at the SLO 2 -> 3.1 req/s (1.55x) with max_num_seqs=64`` (the words of every summary)."""
    if best is None:
        return "no trial met the SLO at any rate probed"
    change = f" ({gain:.2f}x)" if gain is not None else ""
    return f"max rate at the SLO {_rate(baseline)} -> {_rate(best)} req/s{change} with {flags or 'defaults'}"


def tune_view(result: Mapping[str, Any] | None) -> TuneView | None:
    """The stored ``tune`` section as a view; None when the run has none (or it is not the stored shape)."""
    tune = (result or {}).get("tune")
    trials = tune.get("trials") if isinstance(tune, Mapping) else None
    if not isinstance(tune, Mapping) or not isinstance(trials, list):
        return None
    best = tune.get("best") if isinstance(tune.get("best"), int) and not isinstance(tune.get("best"), bool) else None
    rows = []
    for index, trial in enumerate(trials):
        if not isinstance(trial, Mapping) or not isinstance(trial.get("overrides"), Mapping):
            return None
        overrides = _ordered(trial["overrides"])
        rows.append(
            TuneTrialView(
                trial=index,
                overrides=overrides,
                flags=describe_overrides(overrides),
                max_rate_at_slo=_number(trial.get("max_rate_at_slo")),
                lowest_failing_rate=_number(trial.get("lowest_failing_rate")),
                stop_reason=_text(trial.get("stop_reason")) or "",
                best=index == best,
            )
        )
    best_row = rows[best] if best is not None and 0 <= best < len(rows) else None
    baseline = rows[0].max_rate_at_slo if rows else None
    best_rate = best_row.max_rate_at_slo if best_row else None
    gain = _number(tune.get("gain"))
    return TuneView(
        trials=rows,
        best=best_row.trial if best_row else None,
        baseline_max_rate=baseline,
        best_max_rate=best_rate,
        gain=gain,
        image=_text(tune.get("image")),
        text=tune_line(baseline, best_rate, gain, best_row.flags if best_row else None),
    )


def preset_view(result: Mapping[str, Any] | None) -> PresetView | None:
    """The stored ``preset`` as a view; None when the tune kept none."""
    preset = (result or {}).get("preset")
    if not isinstance(preset, Mapping) or not isinstance(preset.get("overrides"), Mapping):
        return None
    run_id = _text(preset.get("run_id"))
    if run_id is None:
        return None
    overrides = _ordered(preset["overrides"])
    workload = preset.get("workload")
    return PresetView(
        run_id=run_id,
        model=_text(preset.get("model")),
        model_revision=_text(preset.get("model_revision")),
        accelerator=_text(preset.get("accelerator")),
        image=_text(preset.get("image")),
        workload=dict(workload) if isinstance(workload, Mapping) else {},
        slo_ttft_ms=_number(preset.get("slo_ttft_ms")),
        slo_tpot_ms=_number(preset.get("slo_tpot_ms")),
        overrides=overrides,
        flags=describe_overrides(overrides),
        max_rate_at_slo=_number(preset.get("max_rate_at_slo")),
        baseline_max_rate=_number(preset.get("baseline_max_rate")),
        gain=_number(preset.get("gain")),
    )


def tune_table(view: TuneView, preset: PresetView | None) -> str:
    """The trials as a plain-text table for people (``tpuctl bench show``), with the preset line under it."""
    header = f"{'trial':>5} {'max req/s':>10} {'fails at':>9}  flags (changed from the plan)"
    lines = [f"Tune: {view.text}", "", header, "-" * len(header)]
    for row in view.trials:
        mark = " *" if row.best else ""
        failing = "-" if row.lowest_failing_rate is None else f"{row.lowest_failing_rate:g}"
        flags = "baseline (planned flags)" if row.trial == 0 else row.flags
        lines.append(f"{row.trial:>5} {_rate(row.max_rate_at_slo):>10} {failing:>9}  {flags}{mark}")
        if row.stop_reason:
            lines.append(f"{'':>28}{row.stop_reason[:100]}")
    lines.append("")
    if preset is None:
        lines.append("No verified preset: no trial met the SLO.")
    else:
        lines.append(
            f"Verified preset {preset.run_id}: {preset.flags} on {preset.model} / {preset.accelerator}; "
            f"deploy with it: tpuctl deploy ID --model {preset.model} --accelerator {preset.accelerator} "
            f"--preset {preset.run_id}"
        )
    return "\n".join(lines)

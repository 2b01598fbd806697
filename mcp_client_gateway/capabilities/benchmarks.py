"""Benchmarks: run one on a serving deployment, read a run with its change from the previous one, compare runs.

The headline figures of a sweep are read as the benchmarker reads them (``sweep_headline``), so the gateway and
the stored comparison agree; other result shapes are read by ``shared.domain.benchmark_headline`` too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from mcp_client_gateway import bounds
from mcp_client_gateway.capabilities.checks import check_benchmark, optional
from mcp_client_gateway.capabilities.common import SERVING_PHASES, CommandPublisher, GatewayPorts, Records
from mcp_client_gateway.errors import GatewayError
from mcp_client_gateway.log_hygiene import clean_text
from mcp_client_gateway.models import BenchmarkComparison, BenchmarkRow, BenchmarkView, CommandAccepted
from mcp_client_gateway.tune_views import preset_view, tune_view
from shared.domain.autotune import VerifiedPreset
from shared.domain.benchmark_headline import (
    best_run_per_metric,
    headline_change_pct,
    headline_from_result,
    sweep_headline,
)
from shared.domain.models import MODEL_PRESET_NAMES, BenchmarkRun
from shared.domain.throughput_bound import bound_summary
from shared.ports import StateStore

__all__ = ["Benchmarks", "headline_metrics", "preset_serving", "throughput_bound_line"]


def headline_metrics(result: dict[str, Any] | None) -> dict[str, float]:
    """Headline numbers from a benchmark result, wherever the result keeps them.

    A sweep (``points`` with a ``level`` each, as the benchmarker stores it) is read as the benchmarker reads it
    (``sweep_headline``: peak throughput, the level it was reached at, latencies at the knee), so the gateway and
    the stored comparison agree. Other shapes: ``shared.domain.benchmark_headline.headline_from_result``.
    """
    if result and isinstance(result.get("points"), list):
        numbers = {
            key: float(value)
            for key, value in sweep_headline(result).items()
            if isinstance(value, int | float) and not isinstance(value, bool)
        }
        if numbers:
            return numbers
    return headline_from_result(result)


def throughput_bound_line(result: dict[str, Any] | None) -> str | None:
    """One line on the run's throughput against the slice's physical bound, as the benchmarker stored it; None when
    no bound was drawn (results stored before the check, rate sweeps, unknown model or slice)."""
    comparison = result.get("comparison") if isinstance(result, dict) else None
    return bound_summary(comparison.get("throughput_bound")) if isinstance(comparison, dict) else None


class Benchmarks:
    """Benchmark runs: published as commands, read from the state store."""

    def __init__(self, ports: GatewayPorts, records: Records, publisher: CommandPublisher) -> None:
        self.ports = ports
        self.records = records
        self.publisher = publisher

    def run_benchmark(
        self,
        deployment_id: str,
        *,
        benchmark: dict[str, Any] | None = None,
        command_id: str | None = None,
    ) -> CommandAccepted:
        """Publish ``benchmark.run``; the command id is the run id."""
        deployment_id = bounds.deployment_id(deployment_id)
        if benchmark is not None:
            check_benchmark(benchmark)
            _check_tune(benchmark)
        command_id = self.publisher.command_id(command_id)
        duplicate = self.publisher.duplicate(command_id, "benchmark.run", deployment_id)
        if duplicate is not None:
            return duplicate
        body: dict[str, Any] = {"kind": "benchmark.run", "deployment_id": deployment_id}
        if benchmark:
            body["benchmark"] = benchmark
        message = self.publisher.validated(body, command_id)
        record = self.records.get(deployment_id)
        if record.status.phase not in SERVING_PHASES:
            raise GatewayError(
                "failed_precondition",
                "deployment_id",
                f"'{deployment_id}' is not serving (phase {record.status.phase.value})",
                f"benchmark once tpu_status(deployment_id='{deployment_id}') shows SERVING",
            )
        tune = message.benchmark.tune_trials
        return self.publisher.publish(
            message,
            f"The command_id is the run id: follow it with tpu_observe(show='benchmarks', "
            f"command_id='{message.command_id}')."
            + (f" A tune of {tune} trials recreates the engine for each (minutes each on a TPU)." if tune else ""),
        )

    def get_benchmark(self, run_id: str) -> BenchmarkView:
        """One run with its result and the change from the previous run of the same deployment."""
        run_id = bounds.command_id(run_id, "run_id", fix="pass the command_id tpu_benchmark returned")
        run = self.ports.store.get_benchmark_run(run_id)
        if run is None:
            published = self.publisher.published(run_id)
            if published is None:
                raise GatewayError(
                    "not_found",
                    "run_id",
                    f"no benchmark run '{run_id}'",
                    "list runs with tpu_observe(show='benchmarks')",
                )
            raise GatewayError(
                "not_found",
                "run_id",
                "the run is published but not recorded yet",
                "try again in a few seconds",
                retry_after_s=5,
            )
        earlier = [
            r
            for r in self.ports.store.list_benchmark_runs(run.deployment_id, limit=50)
            if r.run_id != run.run_id and r.created_at < run.created_at and r.status == "completed"
        ]
        earlier.sort(key=lambda r: r.created_at, reverse=True)
        previous = earlier[0] if earlier else None
        headline = headline_metrics(run.result)
        change = headline_change_pct(headline, headline_metrics(previous.result)) if previous is not None else {}
        return BenchmarkView(
            run_id=run.run_id,
            deployment_id=run.deployment_id,
            status=run.status,
            request=run.request,
            result=run.result,
            plan=run.plan,
            error=clean_text(run.error, limit=1000)[0],
            created_at=run.created_at,
            updated_at=run.updated_at,
            headline=headline,
            previous=_benchmark_row(previous) if previous else None,
            change_pct=change,
            tune=tune_view(run.result),
            preset=preset_view(run.result),
        )

    def compare_benchmarks(
        self, *, deployment_id: str | None = None, model: str | None = None, limit: int = 20
    ) -> BenchmarkComparison:
        """Runs side by side, newest first, with the best run per headline metric."""
        deployment_id = None if deployment_id is None else bounds.deployment_id(deployment_id)
        model = optional(bounds.choice, "model", model, MODEL_PRESET_NAMES)
        limit = bounds.integer("limit", limit, bounds.COMPARE_LIMIT)
        runs = self.ports.store.list_benchmark_runs(deployment_id, limit=200)
        rows = [_benchmark_row(run) for run in runs]
        if model is not None:
            rows = [row for row in rows if row.model == model]
        rows.sort(key=lambda row: row.created_at, reverse=True)
        rows = rows[:limit]
        best = best_run_per_metric((row.run_id, row.metrics) for row in rows)
        return BenchmarkComparison(rows=rows, best=best)


def _check_tune(benchmark: Mapping[str, Any]) -> None:
    """A tune's trials and SLO, refused in words before the wire model (0 or none: a plain run)."""
    trials = benchmark.get("tune_trials")
    if not trials:
        return
    fix = "give the trials in all, the baseline included: 2 (the baseline and one trial) to 12"
    bounds.integer("tune_trials", trials, bounds.TUNE_TRIALS, fix=fix)
    if benchmark.get("slo_ttft_ms") is None and benchmark.get("slo_tpot_ms") is None:
        raise GatewayError(
            "invalid_argument",
            "slo_ttft_ms",
            "a tune needs an SLO to judge its trials by (each trial's max request rate at it)",
            "add slo_ttft_ms='500' and/or slo_tpot_ms='50' (milliseconds)",
        )


def _benchmark_row(run: BenchmarkRun) -> BenchmarkRow:
    plan = run.plan or {}

    def text(*keys: str) -> str | None:
        for key in keys:
            value = plan.get(key)
            if isinstance(value, str) and value:
                return value
        return None

    return BenchmarkRow(
        run_id=run.run_id,
        deployment_id=run.deployment_id,
        status=run.status,
        created_at=run.created_at,
        model=text("model", "model_preset"),
        accelerator=text("accelerator", "accelerator_type"),
        tier=text("tier"),
        metrics=headline_metrics(run.result),
    )


_TUNE_IT = "tune it first: tpu_benchmark(deployment_id=ID, tune_trials='4', slo_ttft_ms='500') on a deployment of it"


def preset_serving(
    store: StateStore, run_id: Any, model: str, accelerator: str, serving: Mapping[str, Any]
) -> dict[str, Any]:
    """A create's serving options with the verified preset of tune run ``run_id`` in them (its flag values and
    ``preset``: the run id). Refused naming ``preset`` unless the run is a completed tune that kept a preset for
    the same model and slice; a serving option also given with another value than the preset's is refused by name.
    """
    run_id = bounds.command_id(run_id, "preset", fix="pass the command_id of a completed tune (tpu_benchmark)")
    run = store.get_benchmark_run(run_id)
    if run is None:
        raise GatewayError(
            "not_found", "preset", f"no tune run '{run_id}'", "list runs with tpu_observe(show='benchmarks')"
        )
    stored = (run.result or {}).get("preset")
    if run.status != "completed" or stored is None:
        why = "kept no verified preset (not a tune, or no trial met the SLO)"
        raise GatewayError(
            "failed_precondition",
            "preset",
            f"run {run_id} {why if run.status == 'completed' else 'is ' + run.status}",
            f"pass a tune run that kept a preset, or {_TUNE_IT}",
        )
    try:
        preset = VerifiedPreset.model_validate(stored)
    except ValidationError:  # stored by another version of the controller, with flags no longer tunable
        raise GatewayError(
            "failed_precondition", "preset", f"run {run_id}'s preset is not one this version can use", _TUNE_IT
        ) from None
    for field, wanted in (("model", model), ("accelerator", accelerator)):
        verified = getattr(preset, field)
        if verified != wanted:
            raise GatewayError(
                "invalid_argument",
                "preset",
                f"run {run_id} was verified for {field} {verified}, not {wanted}",
                f"deploy {field} {verified} with it, or {_TUNE_IT} on {wanted}",
            )
    for name, value in preset.overrides.items():
        given = serving.get(name)
        if given is not None and given != value:
            raise GatewayError(
                "invalid_argument",
                name,
                f"is {given} but preset {run_id} verified {value}",
                f"leave {name} out to serve with the preset's value, or leave preset out",
            )
    return {**serving, **preset.serving_values()}

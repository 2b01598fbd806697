"""The benchmarker: records benchmark requests, dispatches them to the node, stores results with a comparison.

``Benchmarker(...).handle(message) -> str`` is the entry for ``functions/benchmark`` (raise to retry, return
to ack; ``shared.entry`` maps the error families):

- ``benchmark.run``: the run (id = ``command_id``) is recorded with the deployment's plan through
  ``StateStore.create_benchmark_run`` (create-if-absent, so a redelivery changes nothing), checked (the
  deployment exists and serves; the workload fits its ``max_model_len``), then published on the node-tasks
  topic with ``deployment_id``, ``kind`` and ``run_id`` attributes, which the node agent's subscription
  filters on. A refused run is stored ``failed`` with the reason (users read it with the run id) and raised
  as ``PermanentError``. A run recorded but not dispatched (a crash in between) is dispatched on redelivery.
- ``benchmark.completed`` (from the node agent): accepted only for a run this controller recorded for that
  deployment and still waits on (``requested``, ``dispatched``, ``running``; or failed here for want of an answer,
  then the result is kept as late). Any other (a run nobody dispatched, another deployment's run, a run already
  answered or refused) is a ``PermanentError`` naming why, and nothing is written. The node is untrusted (it
  parses prompts): the result keeps only the known fields, cleaned and bounded (``shared.domain.untrusted``),
  and the error text is cleaned too. The result is stored with the plan (model, slice, tier, zone, image, vLLM
  version and flags), priced per level at the deployment's tier and zone (``result["economics"]``: tokens per
  second per chip, USD per million output tokens, and the same at the SLO; ``shared.domain.bench_economics``, with
  the live catalog price the wiring passes, else the dated table), and a comparison with the deployment's previous
  completed run and with the best run of the same model on other slices, as JSON (``result["comparison"]``) and
  as a table (``result["comparison_table"]``).
  The same event twice is a no-op.
  A tune (``tune_trials`` > 0, issue 22 item 5) answers the same way with a ``tune`` section: its trials are checked
  by ``shared.domain.autotune.check_tune_result`` (closed flags, bounded numbers, the best trial and its gain
  recomputed here, never taken from the VM) and stored as ``result["tune"]``, with the verified preset they yield
  as ``result["preset"]`` (``preset_from``; none when no trial met the SLO), which ``tpu_deploy(preset=RUN_ID)``
  reuses. A tune section that fails the check fails the run, naming the field, and keeps no preset.
- ``node.booted`` (from the node agent): the node's name and its known system fields, cleaned and bounded, are
  kept on the deployment (``status.node_system``); unknown fields are dropped and counted.
- ``benchmark.schedule``: one Scheduler job per deployment (``tpuctl-bench-<deployment>``) publishing a
  ``benchmark.run`` on the cron (``cron`` None deletes it). The job's messages carry the ``scheduled_job``
  attribute, so each firing is its own run (``shared.entry``). :func:`delete_benchmark_jobs` is what the
  provisioner calls when a deployment is deleted.

Runs dispatched but never answered (the node died) are marked failed after ``result_timeout_s`` plus the
run's own duration bound, whenever a message for that deployment is handled.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from shared.domain.autotune import check_tune_result, preset_from
from shared.domain.bench_economics import PriceLookup, benchmark_economics, economics_lines, table_price
from shared.domain.benchmark_headline import sweep_headline
from shared.domain.errors import CloudError, ConflictError, InvalidMessage, PermanentError, TransientError
from shared.domain.models import BenchmarkRun, DeploymentRecord, Desired, Phase
from shared.domain.serving_overrides import describe_overrides
from shared.domain.serving_plan import ServingEnvironment, build_serving_plan
from shared.domain.slice_ladder import served_spec
from shared.domain.throughput_bound import FLOOR_LOW, TOLERANCE_HIGH, bound_summary, judge_throughput
from shared.domain.untrusted import clean_benchmark_result, clean_node_system, clean_text
from shared.logging import scrub_untrusted
from shared.messages import (
    SCHEDULED_JOB_ATTRIBUTE,
    BenchmarkCompleted,
    BenchmarkRequest,
    Message,
    NodeBooted,
    RunBenchmark,
    ScheduleBenchmark,
    encode_message,
    message_attributes,
)
from shared.ports import Clock, CommandBus, SchedulerApi, SchedulerJob, StateStore

__all__ = [
    "Benchmarker",
    "BenchmarkerSettings",
    "benchmark_job_name",
    "compare_runs",
    "delete_benchmark_jobs",
    "headline",
    "keep_tune",
    "plan_summary",
    "throughput_check",
]

log = logging.getLogger("tpuctl.benchmarker")

JOB_PREFIX = "tpuctl-bench-"
_TEMPLATE_NAMESPACE = uuid.UUID("9a3e6c1d-2b7f-4d8a-8e5c-1f0b3d7a6c42")
_RUNNABLE_PHASES = frozenset({Phase.SERVING, Phase.DEGRADED})
_OPEN_STATES = ("requested", "dispatched", "running")
_NO_ANSWER = "no result from the node agent within"
"""How :meth:`Benchmarker.expire_stale` starts the error of a run it failed for want of an answer."""
_MAX_ERROR_CHARS = 4000


def _redact(text: str) -> str:
    """Registered secrets and token-shaped strings out of node-reported text (cleaning comes first)."""
    return scrub_untrusted(text, len(text) + 1)[0]


@dataclass(frozen=True)
class BenchmarkerSettings:
    """Knobs of the benchmark service; the entry point builds it from ``shared.config.Settings``."""

    project: str = "tpuctl-local"
    """Project used to rebuild a deployment's serving plan (names only; nothing is called)."""
    topic_commands: str = "tpuctl-commands"
    topic_node_tasks: str = "tpuctl-node-tasks"
    result_timeout_s: float = 7200.0
    """How long a dispatched run may stay unanswered (plus its duration bound) before it is marked failed."""
    regression_share: float = 0.10
    """A drop in output throughput (or rise in TTFT p50 of twice this) beyond this share is a regression."""
    history_limit: int = 500
    """Runs read to find the previous run and the best run on other slices."""

    def __post_init__(self) -> None:
        if self.result_timeout_s <= 0:
            raise ValueError(f"result_timeout_s: {self.result_timeout_s} must be > 0")
        if not 0 < self.regression_share < 1:
            raise ValueError(f"regression_share: {self.regression_share} must be between 0 and 1")


def benchmark_job_name(deployment_id: str) -> str:
    """The Scheduler job of a deployment's scheduled benchmark."""
    return f"{JOB_PREFIX}{deployment_id}"


def delete_benchmark_jobs(scheduler: SchedulerApi, deployment_id: str) -> list[str]:
    """Delete the deployment's scheduled-benchmark job(s); returns the names deleted. Safe to repeat."""
    name = benchmark_job_name(deployment_id)
    deleted = []
    for job in scheduler.list_jobs(prefix=name):
        if job.name == name:
            scheduler.delete_job(job.name)
            deleted.append(job.name)
    return deleted


def plan_summary(record: DeploymentRecord, project: str) -> dict[str, Any]:
    """What a result is stored with: model, slice, tier, zone, image, flags (vLLM version comes with the result)."""
    spec = served_spec(record)  # the slice granted (a step-down's), not only the first one asked for
    plan: dict[str, Any] = {
        "model": spec.model,
        "accelerator": spec.accelerator,
        "tier": record.status.tier.value if record.status.tier else None,
        "zone": record.status.zone,
        "generation": record.generation,
    }
    try:
        summary = build_serving_plan(spec, ServingEnvironment(project=project)).summary()
    except PermanentError as exc:  # a spec the catalog cannot plan still gets its run recorded
        plan["plan_error"] = str(exc)[:300]
        return plan
    argv = [str(arg) for arg in summary.get("argv", [])]
    plan.update(
        hub_id=summary.get("hub_id"),
        chips=summary.get("chips"),
        topology=summary.get("topology"),
        image=summary.get("image"),
        plan_hash=summary.get("plan_hash"),
        revision=summary.get("revision"),
        flags=argv[3:],
        env=summary.get("env", {}),
        max_model_len=_flag_value(argv, "--max-model-len"),
    )
    return plan


def _flag_value(argv: Sequence[str], flag: str) -> int | None:
    text = _flag_text(argv, flag)
    return int(text) if text is not None and text.isdigit() else None


class Benchmarker:
    """Benchmark commands and results, through ports only. See the module docstring."""

    def __init__(
        self,
        store: StateStore,
        bus: CommandBus,
        clock: Clock,
        *,
        scheduler: SchedulerApi | None = None,
        settings: BenchmarkerSettings | None = None,
        plan: Callable[[DeploymentRecord], dict[str, Any]] | None = None,
        price: PriceLookup = table_price,
    ) -> None:
        self._store = store
        self._price = price
        self._bus = bus
        self._clock = clock
        self._scheduler = scheduler
        self._settings = settings or BenchmarkerSettings()
        self._plan = plan or (lambda record: plan_summary(record, self._settings.project))

    def handle(self, message: Message) -> str:
        """Dispatch one decoded message; other kinds are acknowledged without effect."""
        match message:
            case RunBenchmark():
                return self.run(message)
            case BenchmarkCompleted():
                return self.ingest(message)
            case ScheduleBenchmark():
                return self.schedule(message)
            case NodeBooted():
                return self.node_booted(message)
            case _:
                return f"ignored: {getattr(message, 'kind', type(message).__name__)} is not a benchmark message"

    # --- node.booted --------------------------------------------------------------------------------------------

    def node_booted(self, message: NodeBooted) -> str:
        """Keep the node's system details on the deployment (the gateway's node view reads them), cleaned."""
        system = clean_node_system(message.node, message.system, redact=_redact)
        node = system.get("node") or "?"  # the cleaned name: outcomes land in the ledger and the logs
        for _ in range(3):
            record = self._store.get_deployment(message.deployment_id)
            if record is None:
                return f"ignored: node {node} reports for unknown deployment {message.deployment_id}"
            if record.status.node_system == system:
                return f"noted: node {node} of {message.deployment_id} (unchanged)"
            status = record.status.model_copy(update={"node_system": system})
            try:
                self._store.put_deployment(
                    record.model_copy(update={"status": status, "updated_at": self._clock.now()}),
                    expected_version=record.version,
                )
            except ConflictError:
                continue
            return f"noted: node {node} of {message.deployment_id} booted"
        raise TransientError(f"deployment {message.deployment_id} kept changing; node details retried later")

    # --- benchmark.run -----------------------------------------------------------------------------------------

    def run(self, message: RunBenchmark) -> str:
        now = self._clock.now()
        self.expire_stale(message.deployment_id, now)
        run_id = message.command_id
        record = self._store.get_deployment(message.deployment_id)
        plan = self._plan(record) if record is not None else {}
        refusal = _refusal(record, message.deployment_id, message.benchmark, plan)
        run = BenchmarkRun(
            run_id=run_id,
            deployment_id=message.deployment_id,
            status="failed" if refusal else "requested",
            request=message.benchmark.model_dump(mode="json"),
            plan=plan,
            error=refusal or "",
            created_at=now,
            updated_at=now,
        )
        created, stored = self._store.create_benchmark_run(run)
        if not created:
            if stored.status != "requested":
                return f"duplicate: run {run_id} is already {stored.status}"
            log.info("run %s was recorded but not dispatched; dispatching now", run_id)
        elif refusal:
            raise PermanentError(f"benchmark run {run_id} refused: {refusal}")
        self._bus.publish(
            self._settings.topic_node_tasks,
            encode_message(message),
            {**message_attributes(message), "run_id": run_id},
            ordering_key=message.deployment_id,
        )
        self._store.update_benchmark_run(stored.model_copy(update={"status": "dispatched", "updated_at": now}))
        return f"dispatched run {run_id} to the node of {message.deployment_id}"

    def expire_stale(self, deployment_id: str, now: datetime) -> list[str]:
        """Mark runs of the deployment that never got an answer as failed; returns their ids."""
        expired = []
        for run in self._store.list_benchmark_runs(deployment_id, limit=self._settings.history_limit):
            if run.status not in _OPEN_STATES:
                continue
            allowed = self._settings.result_timeout_s + _duration_bound(run.request)
            if (now - run.updated_at).total_seconds() <= allowed:
                continue
            error = (
                f"{_NO_ANSWER} {allowed:.0f} s of dispatch (the node may be down or "
                "restarted without its journal); run it again"
            )
            self._store.update_benchmark_run(
                run.model_copy(update={"status": "failed", "error": error, "updated_at": now})
            )
            expired.append(run.run_id)
        return expired

    # --- benchmark.completed -----------------------------------------------------------------------------------

    def ingest(self, event: BenchmarkCompleted) -> str:
        now = self._clock.now()
        run = self._store.get_benchmark_run(event.run_id)
        if run is None:
            raise PermanentError(
                f"run_id: no benchmark run {event.run_id} was dispatched by this controller; the result from the "
                f"node of {event.deployment_id} is not stored"
            )
        if run.deployment_id != event.deployment_id:
            raise PermanentError(
                f"run_id: run {event.run_id} belongs to {run.deployment_id}, not {event.deployment_id}; "
                "the result is not stored"
            )
        if run.result is not None and run.result.get("event_id") == event.command_id:
            return f"duplicate: result of run {event.run_id} already stored"
        late = ""
        if run.status not in _OPEN_STATES:
            if run.status != "failed" or run.result is not None or not run.error.startswith(_NO_ANSWER):
                raise PermanentError(
                    f"run_id: run {event.run_id} of {event.deployment_id} is {run.status}, not waiting for a "
                    "result; the result is not stored"
                )
            late = f" (arrived after the run was marked failed: {run.error[:200]})"
        raw = dict(event.result or {})
        raw_tune = raw.pop("tune", None)  # checked on its own below (check_tune_result), never cleaned as figures
        result = clean_benchmark_result(raw, redact=_redact)
        plan = dict(run.plan)
        server = result.get("server")
        if isinstance(server, dict) and server.get("version"):
            plan["vllm_version"] = server.get("version")
        result["event_id"] = event.command_id
        stored = run.model_copy(update={"plan": plan, "result": result})
        if result.get("points"):
            result["economics"] = benchmark_economics(stored.plan, stored.request, _points(stored), self._price)
        if event.status == "completed" and result.get("points"):
            history = self._store.list_benchmark_runs(None, limit=self._settings.history_limit)
            comparison = compare_runs(stored, history, regression_share=self._settings.regression_share)
            check = throughput_check(stored.plan, stored.request, _points(stored))
            if check is not None:
                comparison["throughput_bound"] = check
            result["comparison"] = comparison
            result["comparison_table"] = comparison_table(stored, comparison)
        error = clean_text(event.error, _MAX_ERROR_CHARS, redact=_redact) if event.status == "failed" else ""
        status = event.status
        if status == "completed" and _tune_trials(run.request):
            error = keep_tune(stored, raw_tune, result, now)
            status = "failed" if error else status
        updated = stored.model_copy(
            update={
                "status": status,
                "result": result,
                "error": (error + late).strip()[:_MAX_ERROR_CHARS],
                "updated_at": now,
            }
        )
        self._store.update_benchmark_run(updated)
        verdict = ((result.get("comparison") or {}).get("previous") or {}).get("verdict")
        tuned = f"; {error}" if error and status != event.status else _preset_note(result)
        note = (f"; vs previous: {verdict}" if verdict else "") + tuned
        return f"stored {status} run {event.run_id}" + note + late

    # --- benchmark.schedule ------------------------------------------------------------------------------------

    def schedule(self, message: ScheduleBenchmark) -> str:
        if self._scheduler is None:
            raise PermanentError("benchmark.schedule: no Scheduler is configured for this controller")
        name = benchmark_job_name(message.deployment_id)
        scheduler = self._scheduler
        if message.cron is None:
            self._call(lambda: delete_benchmark_jobs(scheduler, message.deployment_id))
            return f"deleted the scheduled benchmark of {message.deployment_id}"
        record = self._store.get_deployment(message.deployment_id)
        if record is None or record.desired is Desired.ABSENT or record.status.phase is Phase.DELETED:
            raise InvalidMessage(
                "deployment_id", f"no live deployment {message.deployment_id!r}", "schedule benchmarks of a deployment"
            )
        problem = _fits(message.benchmark, self._plan(record))
        if problem:
            field, _, detail = problem.partition(": ")
            raise InvalidMessage(field, detail, "shorten the workload to fit the deployment's context")
        template = RunBenchmark(
            command_id=str(uuid.uuid5(_TEMPLATE_NAMESPACE, f"{name}/{message.command_id}")),
            issued_at=message.issued_at,
            deployment_id=message.deployment_id,
            benchmark=message.benchmark,
        )
        job = SchedulerJob(
            name=name,
            schedule=message.cron,
            topic=self._settings.topic_commands,
            data=encode_message(template),
            attributes={**message_attributes(template), SCHEDULED_JOB_ATTRIBUTE: name},
        )
        self._call(lambda: scheduler.upsert_job(job))
        return f"scheduled benchmark of {message.deployment_id} on '{message.cron}' (job {name})"

    @staticmethod
    def _call(action: Callable[[], object]) -> None:
        try:
            action()
        except ValueError as exc:  # the local scheduler's cron check
            raise InvalidMessage("cron", str(exc), "use five unix-cron fields, e.g. '0 3 * * *'") from exc
        except CloudError as exc:
            if exc.transient:
                raise TransientError(f"Scheduler: {exc.message}", retry_after_s=30) from exc
            raise PermanentError(f"Scheduler refused the job: {exc.message}") from exc


# --- checks ---------------------------------------------------------------------------------------------------


def _refusal(
    record: DeploymentRecord | None, deployment_id: str, request: BenchmarkRequest, plan: dict[str, Any]
) -> str | None:
    if record is None or record.desired is Desired.ABSENT or record.status.phase is Phase.DELETED:
        return f"deployment_id: no live deployment {deployment_id!r} (check tpu_status)"
    if record.status.phase not in _RUNNABLE_PHASES:
        return (
            f"deployment_id: {deployment_id} is {record.status.phase.value}, not serving; "
            f"benchmark it once tpu_status(deployment_id='{deployment_id}') shows SERVING"
        )
    return _fits(request, plan)


def _fits(request: BenchmarkRequest, plan: dict[str, Any]) -> str | None:
    limit = plan.get("max_model_len")
    return request.context_problem(limit, "the deployment's") if isinstance(limit, int) else None


def _flag_text(argv: Sequence[str], flag: str) -> str | None:
    index = argv.index(flag) if flag in argv else -1
    return argv[index + 1] if 0 <= index < len(argv) - 1 else None


def throughput_check(
    plan: dict[str, Any], request: dict[str, Any], points: Sequence[dict[str, Any]]
) -> dict[str, Any] | None:
    """Each concurrency level's output throughput against the slice's physical ceiling for the run's model, dtypes
    and lengths (``shared.domain.throughput_bound``); None for rate sweeps (concurrency unknown) or no known level."""
    if request.get("mode", "concurrency") != "concurrency":
        return None
    flags = [str(flag) for flag in plan.get("flags") or []]
    max_seqs = _flag_value(flags, "--max-num-seqs")
    exact = request.get("dataset", "random") == "random"  # exact random prompts; the prompts dataset's are unknown
    levels = []
    for point in points:
        level = _number(point.get("level"))
        concurrency = min(level, max_seqs) if level is not None and max_seqs else level
        verdict = judge_throughput(
            str(plan.get("model")),
            str(plan.get("accelerator")),
            concurrency=concurrency,
            measured_tok_s=point.get("output_throughput"),
            input_tokens=request.get("input_len") if exact else None,
            output_tokens=request.get("output_len") if exact else None,
            prefill=exact,  # random prompts share no prefix a cache could skip
            weight_dtype="fp8" if _flag_text(flags, "--quantization") == "fp8" else "bfloat16",
            kv_cache_dtype=_flag_text(flags, "--kv-cache-dtype") or "auto",
        )
        if verdict is not None:
            levels.append({"level": point.get("level"), "concurrency": concurrency, **verdict.as_dict()})
    if not levels:
        return None
    findings = [row["finding"] for row in levels if "finding" in row]
    return {"levels": levels, "findings": findings, "tolerance_high": TOLERANCE_HIGH, "floor_low": FLOOR_LOW}


def _duration_bound(request: dict[str, Any]) -> float:
    duration = request.get("duration_s")
    levels = request.get("request_rate") if request.get("mode") == "rate" else request.get("concurrency")
    count = len(levels) if isinstance(levels, list) else 1
    bound = float(duration) * count if isinstance(duration, int | float) else 0.0
    return bound + _tune_trials(request) * _TRIAL_ALLOWANCE_S


# --- auto-tune ------------------------------------------------------------------------------------------------

_TRIAL_ALLOWANCE_S = 1800.0
"""What each trial of a tune adds to the run's answer deadline: its engine recreated (on a TPU a recompile of
minutes) and a max-rate search of up to a dozen probes."""


def _tune_trials(request: Mapping[str, Any]) -> int:
    trials = request.get("tune_trials")
    return trials if isinstance(trials, int) and not isinstance(trials, bool) else 0


def keep_tune(run: BenchmarkRun, raw: Any, result: dict[str, Any], now: datetime) -> str:
    """A completed tune's ``tune`` section as the (untrusted) VM reported it, checked by ``check_tune_result`` (the
    best trial and its gain recomputed here, never taken from the VM) into ``result["tune"]``, and the verified
    preset it yields (``preset_from``: None when no trial met the SLO) into ``result["preset"]``. Returns why the
    section was refused ("" when kept); a refused tune fails its run and keeps no preset."""
    if not isinstance(raw, Mapping):
        return "tune: the node reported no tune section for this tune run; run the tune again"
    try:
        request = BenchmarkRequest.model_validate(run.request)
        checked = check_tune_result(request, raw, redact=_redact)
    except InvalidMessage as exc:
        reason = clean_text(str(exc), 600, redact=_redact)
        return f"the node's tune result was refused, so no preset was kept: {reason}"
    result["tune"] = checked
    plan = run.plan
    try:
        preset = preset_from(
            run.run_id,
            deployment_id=run.deployment_id,
            model=str(plan.get("model")),
            model_revision=plan.get("revision"),
            accelerator=str(plan.get("accelerator")),
            planned_image=plan.get("image"),
            request=request,
            checked=checked,
            created_at=now,
        )
    except ValidationError as exc:  # the plan's facts do not make a preset (a plan the catalog could not build)
        log.warning("run %s: tuned, but no preset kept: %s", run.run_id, exc.errors()[:1])
        return ""
    if preset is not None:
        result["preset"] = preset.model_dump(mode="json")
    return ""


def _preset_note(result: Mapping[str, Any]) -> str:
    """What a stored tune kept, for the ledger's outcome ("" for a plain run)."""
    if "tune" not in result:
        return ""
    preset = result.get("preset")
    if not isinstance(preset, Mapping):
        return "; tuned: no trial met the SLO, no preset kept"
    gain = preset.get("gain")
    times = f" ({gain:.2f}x the baseline)" if isinstance(gain, float) else ""
    return f"; tuned: verified preset {describe_overrides(preset.get('overrides') or {})}{times}"


# --- comparison -----------------------------------------------------------------------------------------------

_LEVEL_FIGURES = (
    "request_throughput",
    "output_throughput",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_itl_ms",
    "p99_itl_ms",
)


def _points(run: BenchmarkRun) -> list[dict[str, Any]]:
    points = (run.result or {}).get("points")
    return [point for point in points if isinstance(point, dict)] if isinstance(points, list) else []


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _workload(run: BenchmarkRun) -> dict[str, Any]:
    request = run.request or (run.result or {}).get("request") or {}
    endpoint = (run.result or {}).get("endpoint") or request.get("endpoint")
    keys = ("mode", "input_len", "output_len", "dataset")
    shape = {"endpoint": endpoint, **{key: request.get(key) for key in keys}}
    workload = request.get("workload") or "random"
    if workload != "random":  # results from before the workloads were random: they stay comparable
        shape["workload"] = workload
        extra = {"shared_prefix": ("prefix_len", "prefix_share"), "multi_turn": ("turns",)}.get(str(workload), ())
        shape.update({key: request.get(key) for key in extra})
    return shape


def headline(run: BenchmarkRun) -> dict[str, Any]:
    """Peak output throughput, where it was reached, the knee, and latencies at the knee (or the peak)."""
    return sweep_headline(run.result)


def _change(now: float | None, before: float | None) -> float | None:
    if now is None or before is None or before == 0:
        return None
    return round((now - before) / before * 100.0, 1)


def _plan_changes(before: dict[str, Any], now: dict[str, Any]) -> dict[str, list[Any]]:
    keys = ("accelerator", "tier", "image", "vllm_version", "plan_hash", "flags", "env", "generation")
    return {key: [before.get(key), now.get(key)] for key in keys if before.get(key) != now.get(key)}


def _versus_previous(run: BenchmarkRun, previous: BenchmarkRun, regression_share: float) -> dict[str, Any]:
    if _workload(previous) != _workload(run):
        return {
            "run_id": previous.run_id,
            "created_at": previous.created_at.isoformat(),
            "verdict": "not comparable",
            "reason": f"different workload: {_workload(previous)} vs {_workload(run)}",
            "plan_changes": _plan_changes(previous.plan, run.plan),
            "levels": [],
        }
    before_by_level = {_number(point.get("level")): point for point in _points(previous)}
    levels = []
    for point in _points(run):
        match = before_by_level.get(_number(point.get("level")))
        if match is None:
            continue
        row: dict[str, Any] = {"level": point.get("level")}
        for figure in _LEVEL_FIGURES:
            row[f"{figure}_change_pct"] = _change(_number(point.get(figure)), _number(match.get(figure)))
        levels.append(row)
    throughput = [
        row["output_throughput_change_pct"] for row in levels if row["output_throughput_change_pct"] is not None
    ]
    ttft = [row["median_ttft_ms_change_pct"] for row in levels if row["median_ttft_ms_change_pct"] is not None]
    mean_throughput = sum(throughput) / len(throughput) if throughput else None
    mean_ttft = sum(ttft) / len(ttft) if ttft else None
    limit = regression_share * 100
    if mean_throughput is None:
        verdict, reason = "not comparable", "no load level in common"
    elif mean_throughput < -limit or (mean_ttft is not None and mean_ttft > 2 * limit):
        verdict = "regression"
        reason = f"output throughput {mean_throughput:+.1f}%, TTFT p50 {_signed(mean_ttft)} at common levels"
    elif mean_throughput > limit and (mean_ttft is None or mean_ttft <= 2 * limit):
        verdict = "improvement"
        reason = f"output throughput {mean_throughput:+.1f}%, TTFT p50 {_signed(mean_ttft)} at common levels"
    else:
        verdict = "unchanged"
        reason = f"output throughput {mean_throughput:+.1f}%, TTFT p50 {_signed(mean_ttft)} (within ±{limit:.0f}%)"
    return {
        "run_id": previous.run_id,
        "created_at": previous.created_at.isoformat(),
        "verdict": verdict,
        "reason": reason,
        "output_throughput_change_pct": None if mean_throughput is None else round(mean_throughput, 1),
        "median_ttft_change_pct": None if mean_ttft is None else round(mean_ttft, 1),
        "plan_changes": _plan_changes(previous.plan, run.plan),
        "levels": levels,
    }


def _signed(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.1f}%"


def compare_runs(
    run: BenchmarkRun, history: Sequence[BenchmarkRun], *, regression_share: float = 0.10
) -> dict[str, Any]:
    """JSON comparison of ``run`` with its deployment's previous completed run and the same model elsewhere."""
    mine = headline(run)
    completed = [r for r in history if r.status == "completed" and r.run_id != run.run_id and _points(r)]
    earlier = sorted(
        (r for r in completed if r.deployment_id == run.deployment_id and r.created_at <= run.created_at),
        key=lambda r: r.created_at,
    )
    comparison: dict[str, Any] = {
        "run_id": run.run_id,
        "model": run.plan.get("model"),
        "accelerator": run.plan.get("accelerator"),
        "workload": _workload(run),
        "headline": mine,
        "previous": _versus_previous(run, earlier[-1], regression_share) if earlier else None,
        "other_slices": [],
    }
    model, accelerator = run.plan.get("model"), run.plan.get("accelerator")
    best: dict[str, tuple[bool, float, BenchmarkRun]] = {}
    for other in completed:
        other_accelerator = other.plan.get("accelerator")
        if other.plan.get("model") != model or not other_accelerator or other_accelerator == accelerator:
            continue
        peak = headline(other).get("peak_output_throughput")
        if peak is None:
            continue
        key = (_workload(other) == _workload(run), float(peak), other)
        current = best.get(str(other_accelerator))
        if current is None or key[:2] > current[:2]:
            best[str(other_accelerator)] = key
    for other_accelerator, (same_workload, peak, other) in sorted(best.items()):
        ratio = peak / mine["peak_output_throughput"] if mine.get("peak_output_throughput") else None
        comparison["other_slices"].append(
            {
                "accelerator": other_accelerator,
                "run_id": other.run_id,
                "deployment_id": other.deployment_id,
                "tier": other.plan.get("tier"),
                "same_workload": same_workload,
                "headline": headline(other),
                "peak_output_throughput_ratio": None if ratio is None else round(ratio, 3),
            }
        )
    return comparison


def _cell(value: Any, digits: int = 1) -> str:
    number = _number(value)
    return "-" if number is None else f"{number:,.{digits}f}"


def comparison_table(run: BenchmarkRun, comparison: dict[str, Any]) -> str:
    """The result and its comparison as a plain-text table for people."""
    workload = comparison.get("workload", {})
    plan = run.plan
    lines = [
        f"Benchmark {run.run_id} of {run.deployment_id}: {plan.get('model')} on {plan.get('accelerator')} "
        f"({plan.get('tier') or 'tier ?'}, vLLM {plan.get('vllm_version') or '?'})",
        f"{workload.get('endpoint')} {workload.get('input_len')} in / {workload.get('output_len')} out, "
        f"{workload.get('mode')} sweep; knee at {comparison.get('headline', {}).get('knee_level')}",
    ]
    previous = comparison.get("previous") or {}
    by_level = {_number(row.get("level")): row for row in previous.get("levels", [])}
    header = (
        f"{'level':>8} {'req/s':>9} {'out tok/s':>10} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8}"
    )
    lines += ["", header + (f" {'vs previous':>24}" if previous else ""), "-" * (len(header) + (25 if previous else 0))]
    for point in _points(run):
        row = (
            f"{_cell(point.get('level'), 0) if run.request.get('mode') != 'rate' else _cell(point.get('level'), 2):>8} "
            f"{_cell(point.get('request_throughput'), 2):>9} {_cell(point.get('output_throughput')):>10} "
            f"{_cell(point.get('median_ttft_ms')):>9} {_cell(point.get('p99_ttft_ms')):>9} "
            f"{_cell(point.get('median_itl_ms'), 2):>8} {_cell(point.get('p99_itl_ms'), 2):>8}"
        )
        change = by_level.get(_number(point.get("level")))
        if change is not None:
            row += (
                f"   tok/s {_signed(change.get('output_throughput_change_pct'))},"
                f" TTFT {_signed(change.get('median_ttft_ms_change_pct'))}"
            )
        lines.append(row)
    lines.append("")
    if previous:
        lines.append(f"Previous run {previous.get('run_id')}: {previous.get('verdict')} ({previous.get('reason')})")
        for key, (before, now) in (previous.get("plan_changes") or {}).items():
            lines.append(f"  changed {key}: {_short(before)} -> {_short(now)}")
    else:
        lines.append("No earlier completed run of this deployment to compare with.")
    lines += economics_lines((run.result or {}).get("economics"))
    bound = bound_summary(comparison.get("throughput_bound"))
    if bound:
        lines.append(bound[:1].upper() + bound[1:])
    for other in comparison.get("other_slices", []):
        note = "" if other.get("same_workload") else " (different workload)"
        lines.append(
            f"Best on {other.get('accelerator')}: run {other.get('run_id')} peaks at "
            f"{_cell(other.get('headline', {}).get('peak_output_throughput'))} tok/s, "
            f"{_cell(other.get('peak_output_throughput_ratio'), 2)}x this run{note}"
        )
    return "\n".join(lines)


def _short(value: Any) -> str:
    text = " ".join(value) if isinstance(value, list) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."

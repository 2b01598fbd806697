"""The monitor: on each Scheduler tick, probe every serving deployment, record a sample, move phases, heal.

One tick:

1. read the deployments the monitor owns (desired present, phase BOOTING..DOWN, an endpoint) and, for each,
   its recent samples (the previous counters for rates, the history for "for N seconds" conditions);
2. probe them all concurrently through the ``ServingProbe`` port, at most ``max_concurrency`` at once, each
   bounded by ``probe_timeout_s``;
3. derive interval SLIs (``shared.domain.metrics``); when a deployment answers but has had no traffic for
   ``canary_interval_s``, send it one canary completion (``shared.domain.canary``: a failed one makes it
   DEGRADED, its latency is an SLI); derive the phase (``shared.domain.health``) and the headroom SLI, with its
   warning finding on the status while short of room (``shared.domain.saturation``);
4. publish healing commands: STALLED or DOWN past the grace period -> ``serving.restart`` (the deployment
   then counts as BOOTING again); DOWN on a preempted or terminated node -> a ``reconcile.tick`` for the
   provisioner; idle for ``spec.idle_minutes`` -> ``deployment.stop`` or ``deployment.delete``. Command ids are
   derived from the incident, so a repeated tick publishes the same id and the ledger drops the duplicate;
5. write every sample in one batched ``write_samples`` (chunks of 500, Firestore's batch limit);
6. compare-and-set the deployment records whose phase changed, then publish ``deployment.phase_changed``
   events. A lost race is re-read once and re-applied only if the deployment is still the monitor's. Without
   a change a record is rewritten only to refresh its stored SLIs (every ``record_refresh_s`` to twice that,
   spread per deployment), ``last_request_at`` (under traffic, at most every quarter of the idle window) or
   the last canary (idle, at most every ``canary_interval_s``, which the record keeps for the rate limit):
   the live SLIs are in the samples, so a steady tick is one batched write;
7. write the samples' SLIs, phase and hourly price as time series through the ``MetricWriter`` port (Cloud
   Monitoring custom metrics, ``shared.domain.sli_metrics``), for dashboards and SLO-burn alerts; a failure there
   is counted and logged, never fatal.

Boot progress: for a deployment whose node is up but has never served (BOOTING, COMPILING, or DOWN within its
first boot), the tick also reads the node's guest attributes ``tpuctl/*`` through ``TpuApi.guest_attributes`` (one
read per booting node per tick, under the service's ~10 reads a minute per VM), stores the startup script's stage
and stage times on the record (``status.boot``: "pulling image", "downloading weights", "compiling"; a node that
served before its script said so still has that boot's end taken), and when the script says
``failed`` the deployment goes FAILED at once with the script's reason (cleaned, bounded) and a ``reconcile.tick``
for it: the planner deletes the slices of a generation whose boot failed and keeps it FAILED, so nothing bills on
until the ready timeout. The rules for stale and hostile values are in ``shared.domain.boot_progress``.

TPU telemetry: for a serving deployment (SERVING, DEGRADED, STALLED) the same one read per node per tick returns
the node agent's ``tpuctl/telemetry`` (HBM per chip, duty cycle, HBM bandwidth from libtpu); a fresh, well-formed
reading (``telemetry_max_age_s``; ``shared.domain.tpu_telemetry``) adds ``tpu_*`` SLIs to the sample. The same
read carries ``tpuctl/engine``, what vLLM printed at start-up (``shared.domain.engine_facts``): kept on the status
(``engine``) when it changes, and diffed against the plan in the effective-configuration finding.

Level-triggered and safe to repeat: a deployment sampled less than ``min_sample_interval_s`` ago is skipped, so
a redelivered tick changes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel

from shared.domain.autotune import tune_in_progress
from shared.domain.boot_progress import (
    BOOT_FAILED,
    BOOT_QUERY_PATH,
    BootReading,
    advance_boot,
    boot_failure,
    boot_open,
    read_boot,
)
from shared.domain.canary import CanaryCheck, canary_slis, carried_canary_slis, judge_canary, plan_canary, with_canary
from shared.domain.effective_config import config_finding
from shared.domain.engine_facts import EngineFacts, as_record, facts_from, read_engine_facts
from shared.domain.errors import CloudError, ConflictError, ErrorClass
from shared.domain.health import (
    MONITORED_PHASES,
    Assessment,
    EndpointCheck,
    HealingAction,
    PriorState,
    ProbeOutcome,
    ProbeResult,
    assess,
    healing_action,
    history_point,
    idle_for,
    interval_since,
)
from shared.domain.metrics import IntervalStats
from shared.domain.models import (
    FINDING_LOG_KIND,
    BootProgress,
    DeploymentRecord,
    Desired,
    MonitorSample,
    Phase,
    QueuedResourceState,
    ResourceRef,
)
from shared.domain.prewarm import builder_finished
from shared.domain.saturation import HEADROOM_SLI, max_running, measure, saturation_finding
from shared.domain.sli_metrics import points_for
from shared.domain.slice_ladder import served_spec
from shared.domain.tpu_telemetry import TpuTelemetry, read_node_telemetry, telemetry_slis
from shared.logging import scrub_untrusted
from shared.messages import (
    Command,
    DeleteDeployment,
    PhaseChanged,
    ReconcileTick,
    RestartServing,
    StopDeployment,
    encode_message,
    message_attributes,
    topic_for,
)
from shared.ports import Clock, CommandBus, MetricWriter, ServingProbe, StateStore, TpuApi
from shared.services.deployment_trace import deployment_work
from shared.services.monitor_types import (
    DeploymentReport,
    MonitorSettings,
    TickReport,
    activity_write_s,
    history_window_s,
    id_hash,
    refresh_after_s,
)

__all__ = ["DeploymentReport", "Monitor", "MonitorSettings", "TickReport"]

log = logging.getLogger("tpuctl.monitor")

_ID_NAMESPACE = uuid.UUID("6f1d3c52-52a4-4c8e-9a55-3f0e0c6b7a10")
_MAX_BATCH = 500  # Firestore's limit on writes in one batch
_SERVING_PHASES = frozenset({Phase.SERVING, Phase.DEGRADED, Phase.STALLED})
_ALERT_PHASES = frozenset({Phase.DEGRADED, Phase.STALLED, Phase.DOWN, Phase.FAILED})
_BOOT_READ_PHASES = frozenset({Phase.BOOTING, Phase.COMPILING, Phase.DOWN})


@dataclass
class _Work:
    record: DeploymentRecord
    history: list[MonitorSample]
    result: ProbeResult | None = None
    interval: IntervalStats | None = None
    assessed: IntervalStats | None = None  # the interval without the canaries' own requests
    traffic: bool = False  # requests in the interval besides the monitor's own canaries
    canary: CanaryCheck | None = None  # the canary sent this tick, if one was due
    node: ResourceRef | None = None  # the node whose guest attributes are read this tick
    booting: bool = False  # the node has never served: its attributes carry boot progress
    boot: BootReading | None = None
    telemetry: TpuTelemetry | None = None  # the node agent's newest TPU reading, when fresh
    engine: EngineFacts | None = None  # what vLLM printed at start-up, as the node agent read it


@dataclass
class _Decision:
    record: DeploymentRecord
    sample: MonitorSample
    report: DeploymentReport
    new_status: dict[str, Any] | None
    events: list[BaseModel] = field(default_factory=list)
    unhealed_status: dict[str, Any] | None = None  # what to store if the healing command could not be sent


class Monitor:
    """Probes serving deployments and records what it saw. See the module docstring for one tick."""

    def __init__(
        self,
        store: StateStore,
        probe: ServingProbe,
        bus: CommandBus,
        clock: Clock,
        settings: MonitorSettings | None = None,
        *,
        tpu: TpuApi | None = None,
        metrics: MetricWriter | None = None,
    ) -> None:
        self.store = store
        self.probe = probe
        self.bus = bus
        self.clock = clock
        self.settings = settings or MonitorSettings()
        self.tpu = tpu  # None: boot progress is not read (the ready timeout still ends a hung boot)
        self.metrics = metrics  # None: the SLIs stay in the store only

    # Entry points

    def handle(self, message: Command) -> str:
        """Handle a decoded message: ``reconcile.tick`` with purpose ``monitor`` runs a tick; others are ignored."""
        match message:
            case ReconcileTick(purpose="monitor"):
                return self.tick(only=message.deployment_id).summary()
            case ReconcileTick():
                return f"ignored: tick purpose {message.purpose!r} is not 'monitor'"
            case _:
                return f"ignored: {getattr(message, 'kind', type(message).__name__)} is not a monitor tick"

    def tick(self, now: datetime | None = None, *, only: str | None = None) -> TickReport:
        """One tick from synchronous code (a Cloud Function); use :meth:`tick_async` inside an event loop."""
        return asyncio.run(self.tick_async(now, only=only))

    async def tick_async(self, now: datetime | None = None, *, only: str | None = None) -> TickReport:
        started = self.clock.monotonic()
        now = now or self.clock.now()
        report = TickReport(taken_at=now)
        work = self._collect(now, only, report)
        if any(item.node is not None for item in work):
            await asyncio.gather(self._probe_all(work, now), asyncio.to_thread(self._read_nodes, work, now))
        else:
            await self._probe_all(work, now)
        decisions = [self._decide(item, now) for item in work]
        self._publish_healing(decisions, report)
        self._write_samples([d.sample for d in decisions], report)
        for decision in decisions:
            with deployment_work(decision.record, "monitor"):  # in the command's trace while its work is under way
                self._write_record(decision, now, report)
            report.deployments.append(decision.report)
        self._write_metrics(decisions, report)
        report.duration_s = self.clock.monotonic() - started
        log.info("monitor tick: %s", report.summary())
        return report

    # Steps

    def _collect(self, now: datetime, only: str | None, report: TickReport) -> list[_Work]:
        work: list[_Work] = []
        for record in self.store.list_deployments():
            if only is not None and record.deployment_id != only:
                continue
            if not _monitored(record):
                continue
            window = history_window_s(record)
            history = self.store.list_samples(
                record.deployment_id, since=now - timedelta(seconds=window), limit=self.settings.history_limit
            )
            if history:
                age = (now - history[0].taken_at).total_seconds()
                if age < self.settings.min_sample_interval_s:
                    report.skipped.append((record.deployment_id, f"sampled {age:.0f} s ago"))
                    continue
            node = _attribute_node(record) if self.tpu is not None else None
            booting = _first_boot(record)
            work.append(_Work(record=record, history=history, node=node, booting=booting))
        _spread_telemetry_reads(work, now, self.settings.telemetry_reads_per_tick)
        return work

    async def _probe_all(self, work: Sequence[_Work], now: datetime) -> None:
        gate = asyncio.Semaphore(self.settings.max_concurrency)

        async def one(item: _Work) -> None:
            endpoint = item.record.status.endpoint or ""
            async with gate:
                started = self.clock.monotonic()
                try:
                    item.result = await asyncio.wait_for(
                        self.probe.probe(endpoint, item.record.deployment_id), self.settings.probe_timeout_s
                    )
                except TimeoutError:
                    waited = self.clock.monotonic() - started
                    check = EndpointCheck(ProbeOutcome.TIMEOUT, None, waited, "probe exceeded its overall bound")
                    item.result = ProbeResult(base_url=endpoint, health=check)
                except Exception as exc:  # the port promises not to raise; a bug there must not stop the tick
                    log.exception("probe of %s failed unexpectedly", item.record.deployment_id)
                    check = EndpointCheck(ProbeOutcome.ERROR, None, 0.0, f"probe error: {type(exc).__name__}")
                    item.result = ProbeResult(base_url=endpoint, health=check)
                await self._canary(item, endpoint, now)

        await asyncio.gather(*(one(item) for item in work))

    async def _canary(self, item: _Work, endpoint: str, now: datetime) -> None:
        """The interval's rates and traffic, then a canary completion if one is due (``shared.domain.canary``),
        bounded like the probe."""
        result = item.result
        assert result is not None
        item.interval = interval_since(item.history, result, now)
        plan = plan_canary(
            result, item.interval, item.history, item.record.status, now, self.settings.canary_interval_s
        )
        item.traffic, item.assessed = plan.traffic, plan.assessed
        if not plan.due:
            return
        started = self.clock.monotonic()
        try:
            item.canary = await asyncio.wait_for(
                self.probe.canary(endpoint, result.served_models[0], item.record.deployment_id),
                self.settings.probe_timeout_s,
            )
        except TimeoutError:
            waited = self.clock.monotonic() - started
            item.canary = CanaryCheck(ProbeOutcome.TIMEOUT, None, waited, "canary exceeded its overall bound")
        except Exception as exc:  # the port promises not to raise; a bug there must not stop the tick
            log.exception("canary of %s failed unexpectedly", item.record.deployment_id)
            item.canary = CanaryCheck(ProbeOutcome.ERROR, None, 0.0, f"canary error: {type(exc).__name__}")

    def _read_nodes(self, work: Sequence[_Work], now: datetime) -> None:
        """Guest attributes of the booting and serving nodes (boot progress, TPU telemetry), one after another in
        one worker thread (the SDK clients are not shared across threads); a failed read leaves both as they were."""
        for item in work:
            node = item.node
            if node is None or self.tpu is None:
                continue
            try:
                attributes = self.tpu.guest_attributes(node.zone, node.name, BOOT_QUERY_PATH)
            except CloudError as exc:
                if exc.error_class is not ErrorClass.NOT_FOUND:
                    log.warning("boot progress of %s unread: %s", item.record.deployment_id, exc.error_class.value)
                continue
            except Exception:  # an adapter bug must not stop the tick
                log.exception("boot progress of %s unread", item.record.deployment_id)
                continue
            reads_boot = item.booting or boot_open(item.record.status.boot)  # a served node's boot may end late
            item.boot = read_boot(attributes, _clean) if reads_boot else None
            item.telemetry = read_node_telemetry(attributes, now, self.settings.telemetry_max_age_s, _clean)
            item.engine = read_engine_facts(attributes)

    def _decide(self, item: _Work, now: datetime) -> _Decision:
        """The tick's verdict on one probe: the sample, the status to store, and at most one healing command.

        A failed boot wins outright; otherwise the healing rules (``_HEALING_RULES``) are tried in order and the
        first that applies acts."""
        record, result = item.record, item.result
        assert result is not None
        interval, status = item.interval, record.status
        unproven = judge_canary(item.canary) if item.canary is not None else None  # why the canary failed
        unproven = _clean(unproven, 500) if unproven is not None else None
        assessment = _assess(item, result, item.assessed, now)
        assessment = with_canary(assessment, unproven, status.phase, status.phase_since, now)
        slis = _slis(result, interval) | canary_slis(now, item.canary, unproven)
        room = measure(result.metrics.gauges, max_running(record.spec)) if result.metrics is not None else None
        slis |= {HEADROOM_SLI: room.headroom} if room is not None else {}
        slis |= telemetry_slis(item.telemetry)
        decision = _observation(record, result, assessment, slis, now, self.settings.sample_ttl_days)
        boot, failure = _boot_update(item, now)
        if failure is not None:
            return _fail_boot(decision, boot, failure, now)
        if record.spec.prewarm:  # a builder serves nothing: never healed; it ends with its delete (domain.prewarm)
            return _builder_decision(decision, boot, now)

        write_s = activity_write_s(record, self.settings)
        active = item.traffic
        new_status = _next_status(record, assessment, active, slis, now, write_s)
        new_status["slis"] = {**carried_canary_slis(status.slis), **new_status["slis"]}
        serving_since, last_request_at = new_status["serving_since"], new_status["last_request_at"]
        node_states = [ref.node_state for ref in record.status.resources]
        verdict = _Verdict(
            decision=decision,
            assessment=assessment,
            now=now,
            new_status=new_status,
            action=self._unless_tuning(
                record, healing_action(assessment.phase, assessment.since, now, record.spec.health, node_states)
            ),
            active=active,
            activity_write_s=write_s,
        )
        for rule in _HEALING_RULES:
            if rule(verdict):  # first match wins
                break

        wanted = decision.report.phase is not status.phase or bool(decision.events) or item.canary is not None
        wanted = wanted or serving_since != status.serving_since or last_request_at != status.last_request_at
        as_of = status.slis.get("as_of_epoch_s")
        if as_of is None or now.timestamp() - as_of >= refresh_after_s(record.deployment_id, self.settings):
            wanted = True
        if boot is not None:
            new_status["boot"] = boot
            wanted = True
        if item.engine is not None and as_record(item.engine) != status.engine:
            new_status["engine"], wanted = as_record(item.engine), True
        engine = item.engine or facts_from(status.engine)
        cache_config = result.metrics.cache_config if result.metrics is not None else None
        found = [
            saturation_finding(room, [sample.slis for sample in item.history], record.spec.health),
            config_finding(served_spec(record), cache_config, record.status.findings, engine),
        ]
        wanted = _with_findings(record, [text for text in found if text], new_status, wanted) or wanted
        if wanted:
            decision.new_status = new_status
        return decision

    def _unless_tuning(self, record: DeploymentRecord, action: HealingAction | None) -> HealingAction | None:
        """No healing while a tune recreates vLLM trial by trial: those restarts are the tune's (issue 22)."""
        if action is None or not tune_in_progress(self.store.list_benchmark_runs(record.deployment_id, limit=5)):
            return action
        return None

    def _publish_healing(self, decisions: Sequence[_Decision], report: TickReport) -> None:
        """Publish before the records change: at-least-once (a failed publish leaves the phase to retry)."""
        for decision in decisions:
            sent: list[BaseModel] = []
            for message in decision.events:
                with deployment_work(decision.record, "monitor heal"):
                    published = self._publish(message, report)
                if published:
                    sent.append(message)
                    decision.report.published.append(str(getattr(message, "kind", "")))
            if len(sent) != len(decision.events) and decision.unhealed_status is not None:
                # The restart did not go out: store the sick phase, so the next tick tries again.
                decision.new_status = decision.unhealed_status
                decision.report.phase = decision.sample.phase
            decision.events = sent

    def _write_samples(self, samples: Sequence[MonitorSample], report: TickReport) -> None:
        for start in range(0, len(samples), _MAX_BATCH):
            batch = list(samples[start : start + _MAX_BATCH])
            self.store.write_samples(batch)
            report.sample_batches += 1
            report.samples_written += len(batch)

    def _write_metrics(self, decisions: Sequence[_Decision], report: TickReport) -> None:
        """The SLIs as time series, after the store has them: a failure here is logged and counted, never fatal."""
        if self.metrics is None:
            return
        points = [point for d in decisions for point in points_for(d.sample, d.record)]
        if not points:
            return
        try:
            self.metrics.write(points)
        except CloudError as exc:
            report.metric_failures += 1
            log.warning("monitor: %d metric point(s) not written: %s", len(points), exc)
            return
        report.metric_points += len(points)

    def _write_record(self, decision: _Decision, now: datetime, report: TickReport) -> None:
        if decision.new_status is None:
            return
        record = decision.record
        for attempt in range(2):
            updated = record.model_copy(
                update={"status": record.status.model_copy(update=decision.new_status), "updated_at": now}
            )
            try:
                self.store.put_deployment(updated, expected_version=record.version)
            except ConflictError:
                fresh = self.store.get_deployment(record.deployment_id)
                if (
                    attempt == 1
                    or fresh is None
                    or not _monitored(fresh)
                    or fresh.status.phase is not record.status.phase
                ):
                    report.conflicts += 1
                    decision.report.conflict = True
                    log.info("monitor left %s alone: it changed during the tick", record.deployment_id)
                    return
                record = fresh
                continue
            report.record_writes += 1
            decision.report.record_written = True
            break
        if decision.report.phase is not decision.report.previous:
            event = PhaseChanged(
                command_id=_command_id(record, f"phase-{decision.report.phase.value}", now),
                issued_at=now,
                deployment_id=record.deployment_id,
                previous=decision.report.previous,
                phase=decision.report.phase,
                reason=decision.report.reason[:2000],
            )
            # Structured on purpose: the phase-change alert policy (terraform/modules/monitoring) matches these fields.
            log.log(
                logging.WARNING if event.phase in _ALERT_PHASES else logging.INFO,
                "%s: %s -> %s (%s)",
                record.deployment_id,
                event.previous.value,
                event.phase.value,
                event.reason,
                extra={
                    "kind": event.kind,
                    "deployment_id": record.deployment_id,
                    "previous": event.previous.value,
                    "phase": event.phase.value,
                },
            )
            if self._publish(event, report):
                decision.report.published.append(event.kind)

    def _publish(self, message: BaseModel, report: TickReport) -> bool:
        deployment_id = str(getattr(message, "deployment_id", "") or "")
        try:
            self.bus.publish(
                self.settings.topic(topic_for(message)),
                encode_message(message),
                message_attributes(message),
                ordering_key=deployment_id or None,
            )
        except Exception:  # a bus outage must not lose the samples; the next tick publishes again
            report.publish_failures += 1
            log.exception("could not publish %s for %s", getattr(message, "kind", "?"), deployment_id)
            return False
        return True


def _clean(text: str, limit: int) -> str:
    """VM text made safe to store and show: no escapes or control characters, secrets redacted, bounded."""
    return scrub_untrusted(text, limit)[0]


def _with_findings(record: DeploymentRecord, findings: list[str], new_status: dict[str, Any], wanted: bool) -> bool:
    """Store the findings when one appears or clears (True), and refresh their figures when the record is written
    anyway; a finding is the same one while its tag (the text before ":") is. A new one is logged once at WARNING,
    structured like a phase change so an alert policy can match it; a cleared one at INFO."""
    before = {text.partition(":")[0]: text for text in record.status.findings}
    after = {text.partition(":")[0]: text for text in findings}
    for tag in after.keys() - before.keys():
        log.warning(
            "%s: %s",
            record.deployment_id,
            after[tag],
            extra={"kind": FINDING_LOG_KIND, "deployment_id": record.deployment_id, "finding": tag},
        )
    for tag in before.keys() - after.keys():
        log.info("%s: cleared: %s", record.deployment_id, tag, extra={"deployment_id": record.deployment_id})
    changed = before.keys() != after.keys()
    if changed or wanted:
        new_status["findings"] = findings
    return changed


def _spread_telemetry_reads(work: Sequence[_Work], now: datetime, cap: int) -> None:
    """Read at most ``cap`` serving nodes' telemetry per tick: over that, each deployment gets a fixed turn of
    ``period`` ticks (by its id's hash), so a large fleet's reads (one sequential API call each) stay bounded and
    every node is still read every ``period`` minutes. Booting nodes are always read (boot progress decides)."""
    serving = [item for item in work if item.node is not None and not item.booting]
    if len(serving) <= cap:
        return
    period = math.ceil(len(serving) / cap)
    turn = int(now.timestamp() // 60) % period
    for item in serving:
        if id_hash(item.record.deployment_id) % period != turn:
            item.node = None


def _first_boot(record: DeploymentRecord) -> bool:
    """The node is up but the deployment never served: its guest attributes carry boot progress."""
    return record.status.phase in _BOOT_READ_PHASES and record.status.serving_since is None


def _attribute_node(record: DeploymentRecord) -> ResourceRef | None:
    """The node to read guest attributes from: this generation's ACTIVE slice, while the deployment boots for the
    first time (boot progress) or serves (TPU telemetry)."""
    status = record.status
    if not _first_boot(record) and status.phase not in _SERVING_PHASES:
        return None
    live = [
        ref
        for ref in status.resources
        if ref.generation == record.generation
        and ref.state is QueuedResourceState.ACTIVE
        and ref.delete_requested_at is None
    ]
    return min(live, key=lambda ref: (ref.active_at or record.created_at, ref.attempt), default=None)


def _boot_update(item: _Work, now: datetime) -> tuple[BootProgress | None, str | None]:
    """(the record's new boot progress or None, the boot's failure reason or None)."""
    if item.node is None or item.boot is None:
        return None, None
    current = item.record.status.boot
    if not item.booting and (item.boot.stage == BOOT_FAILED or current is None or item.boot.boot != current.boot):
        return None, None  # served already: only that boot's own end (its last stage times) is still taken
    updated = advance_boot(current, item.boot, item.node.name, now)
    return updated, boot_failure(updated or current, item.node.name)


def _fail_boot(decision: _Decision, boot: BootProgress | None, failure: str, now: datetime) -> _Decision:
    """The startup script said ``failed``: FAILED now, and a reconcile nudge so the slice is deleted at once."""
    record = decision.record
    reason = failure[:2000]
    decision.new_status = {"phase": Phase.FAILED, "phase_since": now, "message": reason, "serving_since": None}
    if boot is not None:
        decision.new_status["boot"] = boot
    decision.report.phase = Phase.FAILED
    decision.report.reason = reason
    decision.sample = decision.sample.model_copy(update={"phase": Phase.FAILED, "detail": reason})
    failed_at = boot.stage_since if boot is not None else record.status.boot.stage_since if record.status.boot else now
    decision.events.append(
        ReconcileTick(
            command_id=_command_id(record, "boot-failed", failed_at),
            issued_at=now,
            deployment_id=record.deployment_id,
            purpose="reconcile",
        )
    )
    return decision


def _builder_decision(decision: _Decision, boot: BootProgress | None, now: datetime) -> _Decision:
    """A prewarm builder's tick: its boot progress kept, its phase unchanged, and once the record holds its
    ``prewarmed`` (stored on the tick that read it, so the deleted record says how it ended) the deployment's delete,
    its id fixed by when the builder said it: a repeated tick publishes the same command."""
    record = decision.record
    decision.report.phase = decision.sample.phase = record.status.phase
    decision.new_status = {"boot": boot} if boot is not None else None
    if builder_finished(record) and record.status.boot is not None:
        decision.events.append(
            DeleteDeployment(
                command_id=_command_id(record, "prewarmed", record.status.boot.stage_since),
                issued_at=now,
                deployment_id=record.deployment_id,
                expected_generation=record.generation,
            )
        )
    return decision


# The decision on one probe, in pieces: what was seen, the status it implies, then the healing rules.


def _assess(item: _Work, result: ProbeResult, interval: IntervalStats | None, now: datetime) -> Assessment:
    """The phase this probe implies, given the stored phase and the recent samples."""
    status = item.record.status
    prior = PriorState(phase=status.phase, phase_since=status.phase_since, serving_since=status.serving_since)
    history = [history_point(s) for s in item.history]
    return assess(result, interval, history, prior, now, item.record.spec.health)


def _observation(
    record: DeploymentRecord,
    result: ProbeResult,
    assessment: Assessment,
    slis: dict[str, float],
    now: datetime,
    sample_ttl_days: int,
) -> _Decision:
    """The decision before any rule acts: the report and the sample of what the probe saw; no status change yet."""
    report = DeploymentReport(
        deployment_id=record.deployment_id,
        previous=record.status.phase,
        phase=assessment.phase,
        probe=result.outcome.value,
        reason=assessment.reason,
    )
    sample = MonitorSample(
        deployment_id=record.deployment_id,
        taken_at=now,
        phase=assessment.phase,
        probe=result.outcome.value,
        slis=slis,
        counters=result.metrics.to_record() if result.metrics is not None else {},
        detail=_detail(assessment, result),
        expire_at=now + timedelta(days=sample_ttl_days),
    )
    return _Decision(record=record, sample=sample, report=report, new_status=None)


def _next_status(
    record: DeploymentRecord,
    assessment: Assessment,
    active: bool,
    slis: dict[str, float],
    now: datetime,
    activity_write_s: float,
) -> dict[str, Any]:
    """The status the assessment implies: ``serving_since`` set on first serving, ``last_request_at`` moved under
    traffic at most every ``activity_write_s``, and the interval's SLIs (or the stored ones when there are none)."""
    status = record.status
    serving_since = status.serving_since
    if assessment.phase in _SERVING_PHASES and serving_since is None:
        serving_since = now
    last_request_at = status.last_request_at
    if active and (last_request_at is None or (now - last_request_at).total_seconds() >= activity_write_s):
        last_request_at = now
    return {
        "phase": assessment.phase,
        "phase_since": assessment.since,
        "message": assessment.reason[:2000],
        "serving_since": serving_since,
        "last_request_at": last_request_at,
        "slis": {**slis, "as_of_epoch_s": now.timestamp()} if slis else {**status.slis},
    }


@dataclass
class _Verdict:
    """What a healing rule sees, and may change: the decision so far and the status about to be stored."""

    decision: _Decision
    assessment: Assessment
    now: datetime
    new_status: dict[str, Any]
    action: HealingAction | None
    active: bool
    activity_write_s: float


def _restart_when_sick_past_grace(verdict: _Verdict) -> bool:
    """STALLED or DOWN past the grace period: restart vLLM. It then boots again (minutes on TPU), so the record
    goes BOOTING with a fresh boot budget; the sick status is kept aside in case the command cannot be sent, so
    the next tick tries again."""
    if verdict.action != "restart":
        return False
    decision, assessment, now = verdict.decision, verdict.assessment, verdict.now
    record = decision.record
    decision.unhealed_status = dict(verdict.new_status)
    decision.events.append(
        RestartServing(
            command_id=_command_id(record, "restart", assessment.since),
            issued_at=now,
            deployment_id=record.deployment_id,
            reason=f"{assessment.phase.value} since {assessment.since.isoformat()}: {assessment.reason}"[:500],
        )
    )
    verdict.new_status.update(
        phase=Phase.BOOTING,
        phase_since=now,
        serving_since=None,
        last_request_at=None,
        message=f"restart requested: {assessment.reason}"[:2000],
    )
    decision.report.phase = Phase.BOOTING
    return True


def _reprovision_when_node_lost(verdict: _Verdict) -> bool:
    """DOWN on a preempted or terminated node: a restart cannot help, the provisioner must replace the slice.
    Sent on entering DOWN only; a deployment already DOWN was handed over by an earlier tick."""
    record = verdict.decision.record
    if verdict.action != "reprovision" or record.status.phase is Phase.DOWN:
        return False
    verdict.decision.events.append(
        ReconcileTick(
            command_id=_command_id(record, "reprovision", verdict.assessment.since),
            issued_at=verdict.now,
            deployment_id=record.deployment_id,
            purpose="reconcile",
        )
    )
    return True


def _stop_when_idle(verdict: _Verdict) -> bool:
    """Serving without traffic for ``spec.idle_minutes`` (plus the slack of the lazily written
    ``last_request_at``): stop or delete it, as the spec says, so an idle slice stops billing."""
    record = verdict.decision.record
    idle_phase = verdict.assessment.phase in (Phase.SERVING, Phase.DEGRADED)
    if not record.spec.idle_minutes or not idle_phase or verdict.active:
        return False
    now, last_request_at = verdict.now, verdict.new_status["last_request_at"]
    serving_since = verdict.new_status["serving_since"]
    idle_s = idle_for(last_request_at, serving_since, now)
    if idle_s is not None and idle_s >= record.spec.idle_minutes * 60 + verdict.activity_write_s:
        verdict.decision.events.append(_idle_command(record, now, last_request_at or serving_since))
    return True


_HEALING_RULES: tuple[Callable[[_Verdict], bool], ...] = (
    _restart_when_sick_past_grace,
    _reprovision_when_node_lost,
    _stop_when_idle,
)
"""Tried in order; the first that applies acts and the rest are skipped."""


def _idle_command(record: DeploymentRecord, now: datetime, since: datetime | None) -> BaseModel:
    """``deployment.stop`` or ``deployment.delete`` per ``spec.on_idle``, its id fixed by when idleness began."""
    command_id = _command_id(record, f"idle-{record.spec.on_idle}", since or now)
    if record.spec.on_idle == "delete":
        return DeleteDeployment(
            command_id=command_id,
            issued_at=now,
            deployment_id=record.deployment_id,
            expected_generation=record.generation,
        )
    return StopDeployment(command_id=command_id, issued_at=now, deployment_id=record.deployment_id)


def _monitored(record: DeploymentRecord) -> bool:
    return (
        record.desired is Desired.PRESENT and record.status.phase in MONITORED_PHASES and bool(record.status.endpoint)
    )


def _slis(result: ProbeResult, interval: IntervalStats | None) -> dict[str, float]:
    slis = interval.slis() if interval is not None else {}
    slis["health_latency_s"] = round(result.health.latency_s, 4)
    if result.max_model_len is not None:
        slis["max_model_len"] = float(result.max_model_len)
    return {name: value for name, value in slis.items() if math.isfinite(value)}


def _detail(assessment: Assessment, result: ProbeResult) -> str:
    parts = [assessment.reason]
    if result.version:
        parts.append(f"vllm {result.version}")
    if result.served_models:
        parts.append("models " + ",".join(result.served_models[:4]))
    if result.metrics is not None and result.metrics.legacy_names:
        parts.append("legacy metric names " + ",".join(result.metrics.legacy_names))
    return "; ".join(parts)[:2000]


def _command_id(record: DeploymentRecord, what: str, at: datetime) -> str:
    """The same incident always yields the same id, so the command ledger drops re-publications."""
    return str(uuid.uuid5(_ID_NAMESPACE, f"{record.deployment_id}/{record.generation}/{what}/{at.isoformat()}"))

"""The node agent: runs benchmarks next to vLLM on the TPU VM, restarts and tails the vLLM container, reports.

Run it as ``python -m node_agent.agent`` (the startup script does, with the ``TPUCTL_*`` variables of
``shared.domain.serving_plan.NODE_AGENT_ENV_NAMES``; the local cloud's node runtime does too). It:

1. takes ``<journal dir>/agent.lock`` (one agent, so one run at a time, per node);
2. reports runs a previous process left ``running`` as failed, with that cause, and publishes any result not
   yet published (``node_agent.journal``);
3. publishes ``node.booted`` with the machine's details (``node_agent.system_info``);
4. pulls runs and tasks from its deployment's node channel (``tpuctl-node-<deployment>``, which the controller
   opened and granted the VM's account alone; the agent creates nothing on the bus and waits for a missing one) on
   a background thread; each is journalled and acked, then carried out, and a redelivered id is acked without doing
   anything twice, across agent restarts too. A task's answer goes out in its request's trace (``shared.tracing``);
5. runs the load generator against the local vLLM (``loadgen.generator``), one run at a time, keeps the
   per-request records in a JSON Lines file beside the journal, and publishes ``benchmark.completed`` (status,
   structured result, cause of failure) on the events topic, retrying the publish until the bus takes it; a run
   whose request has ``tune_trials`` is an auto-tune, vLLM recreated per trial of serving flags and the planned
   flags restored after (``node_agent.tuning``);
6. carries out node tasks through the Docker Engine API (``shared.adapters.docker_engine``; the local cloud
   serves the same API over its vLLM process) and answers each with ``node.task_completed``, retried likewise:

   * ``serving.restart`` stops a run in progress first (reported failed: "serving restart requested: ..."),
     then restarts the container. A request issued before the container's current ``StartedAt`` is answered
     "already restarted at ...; nothing done", so a late or duplicated delivery never restarts twice;
   * ``serving.logs`` returns the newest N lines, stripped of terminal escapes and control characters, with
     secrets redacted (registered ones, the API key, token-shaped strings), each cut to 2000 characters, and the
     oldest dropped until the event fits one message;
   * ``serving.debug`` keeps a debug bundle (stacks, log, metrics, tpu-info, boot) and answers with its name;
     every restart keeps one first, so a restart never destroys the evidence (``node_agent.bundle_keeper``);

7. ships the serving container's log, cleaned the same way and with vLLM's severities, to the runtime's log sink
   (Cloud Logging on Google Cloud, nothing on the embedded default) on a thread of its own
   (``node_agent.log_shipper``), and reads vLLM's start-up facts from it into ``tpuctl/engine`` (``engine_report``);
8. samples TPU telemetry into ``tpuctl/telemetry`` and beside each benchmark result (``node_agent.tpu_telemetry``).

SIGTERM or SIGINT stop new requests, give requests in flight a short grace, record the run as failed ("stopped
during the run"), publish that and exit. The API key is read from a file and never logged.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from loadgen.generator import LoadGenerator, Target
from node_agent.answers import TASK_ACTIONS, TaskAnswer, fit_lines, shrink_result
from node_agent.boot_trace import read_boot_trace
from node_agent.bundle_keeper import BundleKeeper, KeptBundle, node_bundle_keeper
from node_agent.event_key import read_event_key
from node_agent.journal import AgentLock, JournalEntry, RunJournal, TaskEntry, TaskJournal
from node_agent.log_lines import clean_log_line
from node_agent.runs import RunControl, Runner, RunOutcome
from node_agent.system_info import boot_id, system_info
from node_agent.tpu_telemetry import TelemetrySampler, start_sampler, tpu_result
from shared.config import Settings
from shared.domain.errors import ControllerError, InvalidMessage, PermanentError
from shared.domain.models import DEPLOYMENT_ID_PATTERN
from shared.domain.node_seal import EVENT_SEAL_ATTRIBUTE, seal
from shared.logging import configure_logging, redact
from shared.messages import (
    BenchmarkCompleted,
    CaptureDebugBundle,
    NodeBooted,
    NodeTaskCompleted,
    RestartServing,
    RunBenchmark,
    TailServingLogs,
    decode_message,
    encode_message,
    message_attributes,
)
from shared.ports import Clock, CommandBus, Delivery, LogSink, MissingSubscription, ServingContainer, node_channel
from shared.tracing import TRACEPARENT, configure_tracing, delivery_span, with_trace_context

__all__ = [
    "SERVING_CONTAINER_NAME",
    "NodeAgent",
    "NodeAgentSettings",
    "RunControl",
    "RunOutcome",
    "VllmRunner",
    "clean_log_line",
    "fit_lines",
    "main",
    "node_subscription",
    "read_event_key",
    "ship_serving_logs",
    "shrink_result",
]

if TYPE_CHECKING:
    from shared.wiring import Runtime

log = logging.getLogger("tpuctl.node_agent")

_ID_NAMESPACE = uuid.UUID("0c8f5f6e-3a1d-4e0b-9d43-6b2f1c7e9a55")
_STOP_GRACE_S = 5.0
SERVING_CONTAINER_NAME = "tpuctl-vllm"
"""The vLLM container's name: the startup script's ``CONTAINER`` (``StartupScriptInputs.container_name``)."""
_RUN_STOP_WAIT_S = _STOP_GRACE_S * 6  # how long a restart waits for a stopped run to wind down
_MISSING_CHANNEL_WAIT_S = 10.0  # between pulls while the node channel does not exist yet
_MISSING_CHANNEL_LOG_EVERY_S = 300.0  # how often that is said again after the first time


class NodeAgentSettings(BaseSettings):
    """The agent's own settings (``TPUCTL_`` variables, next to the shared ``Settings``)."""

    model_config = SettingsConfigDict(env_prefix="TPUCTL_", frozen=True, extra="ignore")

    deployment_id: str = Field(pattern=DEPLOYMENT_ID_PATTERN, description="The deployment this node serves.")
    node_vllm_url: str = Field(default="http://127.0.0.1:8000", description="The local vLLM's base URL.")
    node_api_key_file: Path | None = Field(default=None, description="File holding the vLLM API key.")
    node_served_model: str | None = Field(default=None, description="Served model id (default: the first listed).")
    node_journal_dir: Path | None = Field(
        default=None, description="Journal and results; default /var/lib/tpuctl/bench (gcp) or DATA_DIR/node-<id>."
    )
    node_tokenizer: Path | None = Field(
        default=None, description="A tokenizer.json, model folder or HF cache to count tokens locally."
    )
    node_name: str = Field(default_factory=socket.gethostname, description="This node's name in events.")
    node_poll_s: float = Field(default=1.0, gt=0, le=60, description="How long one pull waits for a dispatch.")
    node_docker_host: str = Field(
        default="unix:///var/run/docker.sock", description="The Docker Engine API the vLLM container runs under."
    )
    node_container: str = Field(default=SERVING_CONTAINER_NAME, description="The vLLM container's name.")
    node_restart_timeout_s: float = Field(
        default=30.0, ge=0, le=600, description="Seconds vLLM gets to stop on a restart before SIGKILL."
    )
    node_log_flush_s: float = Field(
        default=5.0, gt=0, le=60, description="Longest a serving-log line waits before it is shipped."
    )
    node_tpu_metrics_addr: str = Field(default="127.0.0.1:8431", description="libtpu's runtime metrics service.")
    node_telemetry_interval_s: float = Field(default=30.0, gt=0, description="Seconds between TPU telemetry samples.")


def node_subscription(deployment_id: str) -> str:
    """The node agent's subscription on the node-tasks topic: its deployment's node channel, which the controller
    makes (``shared.ports.node_channel``)."""
    return node_channel(deployment_id)


class VllmRunner:
    """The default runner: :class:`~loadgen.generator.LoadGenerator` against the local server."""

    def __init__(self, target: Target, *, tokenizer_file: Path | None = None) -> None:
        self.target = target
        self.tokenizer_file = tokenizer_file

    async def __call__(self, message: RunBenchmark, control: RunControl) -> RunOutcome:
        generator = LoadGenerator(self.target, tokenizer_file=self.tokenizer_file)
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()

        def stop_soon() -> None:
            generator.stop()
            if task is not None:
                loop.call_later(_STOP_GRACE_S, task.cancel)  # requests still in flight after the grace are dropped

        def stop_from_any_thread() -> None:
            loop.call_soon_threadsafe(stop_soon)

        control.on_stop(stop_from_any_thread)
        result = await generator.run(message.benchmark)
        return RunOutcome(result=result.as_dict(), records=result.records_jsonl(), cancelled=result.cancelled)


class NodeAgent:
    """Receives dispatches and node tasks for one deployment, carries each out once, reports each exactly once."""

    def __init__(
        self,
        bus: CommandBus,
        *,
        deployment_id: str,
        node_name: str,
        journal: RunJournal,
        runner: Runner,
        clock: Clock,
        node_tasks_topic: str = "tpuctl-node-tasks",
        events_topic: str = "tpuctl-events",
        system: Callable[[], dict[str, Any]] = system_info,
        boot: Callable[[], str | None] = boot_id,
        container: ServingContainer | None = None,
        tasks: TaskJournal | None = None,
        api_key: str | None = None,
        restart_timeout_s: float = 30.0,
        event_key: str | None = None,
        bundles: BundleKeeper | None = None,
        telemetry: TelemetrySampler | None = None,
        boot_trace: str = "",
    ) -> None:
        self.bus = bus
        self.deployment_id = deployment_id
        self.node_name = node_name
        self.journal = journal
        self.runner = runner
        self.clock = clock
        self.node_tasks_topic = node_tasks_topic
        self.events_topic = events_topic
        self.subscription = node_subscription(deployment_id)
        self._system = system
        self._boot = boot
        self._booted_published = False
        self._boot_trace = boot_trace  # the controller's span that created this node (untrusted; node_agent.boot_trace)
        self.control: RunControl | None = None
        self.stopping = threading.Event()
        self.container = container
        self.tasks = tasks if tasks is not None else TaskJournal(journal.directory)
        self.restart_timeout_s = restart_timeout_s
        self._api_key = api_key
        self.bundles = bundles  # None: restarts and serving.debug keep no bundle, and say so
        self.telemetry = telemetry  # None: benchmark results carry no "tpu" summary
        self._event_key = event_key  # seals every event (shared.domain.node_seal); None: the controller refuses them
        self._serving = threading.Lock()  # held by a benchmark run and by a restart: never both at once
        self._work = threading.Event()  # set by the puller when a run was accepted
        self._channel_missing_since: float | None = None  # monotonic time the channel was first found missing
        self._channel_missing_said: float | None = None
        self._pull_refused_said: float | None = None

    # --- lifecycle -------------------------------------------------------------------------------------------

    def start(self) -> list[str]:
        """Settle what a previous process left behind, announce the node. Returns recovered run ids.

        Nothing is created on the bus: the topics are Terraform's and the node channel is the controller's."""
        log.info("node tasks come from %s on %s", self.subscription, self.node_tasks_topic)
        recovered = self.recover()
        self.publish_booted()
        self.publish_pending()
        self.publish_pending_tasks()
        return recovered

    def recover(self) -> list[str]:
        """Every run a previous agent left ``running`` becomes ``failed`` with the cause."""
        recovered = []
        for entry in self.journal.interrupted():
            cause = (
                f"the node agent restarted while this run was in progress (previous agent pid {entry.pid}, "
                f"run started {entry.started_at}); the run did not finish"
            )
            self.journal.finish(entry.run_id, "failed", self._now(), error=cause)
            log.warning("run %s was interrupted by an agent restart", entry.run_id)
            recovered.append(entry.run_id)
        return recovered

    def serve(self, stop: threading.Event, *, poll_s: float = 1.0) -> None:
        """Until ``stop`` is set: pull and carry out node tasks on a thread; here, publish and run benchmarks."""
        puller = threading.Thread(target=self.pull_loop, args=(stop, poll_s), name="node-agent-pull", daemon=True)
        puller.start()
        try:
            while not stop.is_set():
                self.publish_booted()
                self.publish_pending()
                if stop.is_set():
                    return
                if self.run_next():
                    continue
                self._work.wait(timeout=poll_s)
                self._work.clear()
        finally:
            stop.set()
            puller.join(timeout=poll_s + self.restart_timeout_s + 90)

    def pull_loop(self, stop: threading.Event, poll_s: float = 1.0) -> None:
        """The puller: receive, carry out node tasks, publish their answers; never dies of one bad round."""
        while not stop.is_set():
            try:
                self.poll_once(timeout_s=poll_s)
            except MissingSubscription as exc:
                self._channel_missing(exc)
                stop.wait(max(poll_s, _MISSING_CHANNEL_WAIT_S))
                continue
            except PermanentError as exc:  # e.g. not allowed to pull yet: a new grant takes minutes to apply
                now = time.monotonic()
                if self._pull_refused_said is None or now - self._pull_refused_said >= _MISSING_CHANNEL_LOG_EVERY_S:
                    self._pull_refused_said = now
                    log.warning(
                        "pulling %s was refused (%s); the controller grants this VM's account subscriber on it when "
                        "it opens the channel, and IAM takes a few minutes to apply; pulling again every %.0f s",
                        self.subscription,
                        exc,
                        _MISSING_CHANNEL_WAIT_S,
                    )
                stop.wait(max(poll_s, _MISSING_CHANNEL_WAIT_S))
                continue
            except Exception:  # the bus failed this round: wait a little, then go on
                log.exception("node task round failed")
                stop.wait(poll_s)
                continue
            self._channel_found()
            try:
                self.handle_tasks()
                self.publish_pending_tasks()
            except Exception:  # the disk or the bus failed this round: wait a little, then go on
                log.exception("node task round failed")
                stop.wait(poll_s)

    def _channel_missing(self, exc: MissingSubscription) -> None:
        """Say clearly, and not every round, that the node channel is not there (yet)."""
        now = time.monotonic()
        if self._channel_missing_since is None:
            self._channel_missing_since = now
        said = self._channel_missing_said
        if said is not None and now - said < _MISSING_CHANNEL_LOG_EVERY_S:
            return
        self._channel_missing_said = now
        log.warning(
            "subscription %s on %s does not exist yet (missing for %.0f s); the controller opens it when it creates "
            "the node (provisioner, NodeChannels) and this agent never creates it; pulling again every %.0f s. If it "
            "stays missing, check the provision function's log for 'node channel' errors: %s",
            self.subscription,
            self.node_tasks_topic,
            now - self._channel_missing_since,
            _MISSING_CHANNEL_WAIT_S,
            exc,
        )

    def _channel_found(self) -> None:
        if self._channel_missing_since is not None:
            log.info(
                "subscription %s exists now (after %.0f s); pulling node tasks",
                self.subscription,
                time.monotonic() - self._channel_missing_since,
            )
            self._channel_missing_since = self._channel_missing_said = None
        self._pull_refused_said = None

    def request_stop(self, reason: str) -> None:
        """Stop serving; a run in progress is stopped and reported failed with ``reason``."""
        self.stopping.set()
        if self.control is not None:
            self.control.stop(reason)

    # --- receiving ---------------------------------------------------------------------------------------------

    def poll_once(self, *, timeout_s: float = 1.0) -> int:
        return self.bus.pull(self.subscription, self._accept, max_messages=1, timeout_s=timeout_s)

    def _accept(self, delivery: Delivery) -> None:
        try:
            message = decode_message(delivery.data)
        except InvalidMessage as exc:
            log.warning("dropped an unreadable dispatch %s: %s", delivery.message_id, exc)
            return
        known = isinstance(message, RunBenchmark | RestartServing | TailServingLogs | CaptureDebugBundle)
        if not known or message.deployment_id != self.deployment_id:
            log.warning("dropped a %s for %s", getattr(message, "kind", "?"), getattr(message, "deployment_id", "?"))
            return
        body = delivery.data.decode("utf-8")
        if isinstance(message, RestartServing | TailServingLogs | CaptureDebugBundle):
            action = TASK_ACTIONS[message.kind]
            if self.tasks.accept(
                message.command_id, action, body, self._now(), trace=delivery.attributes.get(TRACEPARENT, "")[:64]
            ):
                log.info("accepted %s task %s", action, message.command_id)
            else:
                log.info("%s task %s was already accepted; redelivery acked", action, message.command_id)
            return
        if self.journal.accept(message.command_id, body, self._now()):
            log.info("accepted run %s", message.command_id)
            self._work.set()
        else:
            log.info("run %s was already accepted; redelivery acked", message.command_id)

    # --- node tasks --------------------------------------------------------------------------------------------

    def handle_tasks(self) -> int:
        """Carry out every accepted node task, oldest first; returns how many were carried out."""
        done = 0
        for entry in self.tasks.waiting():
            if self.stopping.is_set():
                break
            with delivery_span(f"node-agent {entry.action}", {TRACEPARENT: entry.trace}, task_id=entry.task_id):
                answer = self._carry_out(entry)
                trace = with_trace_context({}).get(TRACEPARENT, "")  # the answer is reported under this span
            self.tasks.finish(
                entry.task_id,
                answer.status,
                self._now(),
                detail=answer.detail[:2000],
                lines=answer.lines,
                bundle=answer.bundle,
                trace=trace,
            )
            log.info("%s task %s %s: %s", entry.action, entry.task_id, answer.status, answer.detail[:300])
            done += 1
        return done

    def _carry_out(self, entry: TaskEntry) -> TaskAnswer:
        try:
            message = decode_message(entry.message)
        except InvalidMessage as exc:
            return TaskAnswer("failed", f"unreadable task: {exc}")
        if self.container is None:
            return TaskAnswer("failed", "this node agent has no serving container configured (TPUCTL_NODE_CONTAINER)")
        try:
            if isinstance(message, RestartServing):
                return self._restart(message, self.container)
            if isinstance(message, TailServingLogs):
                return TaskAnswer("completed", "", self._tail(message.lines, self.container))
            if isinstance(message, CaptureDebugBundle):
                kept = self._keep_bundle(message.command_id, message.reason or "requested")
                return TaskAnswer("completed" if kept.name else "failed", kept.detail, bundle=kept.name)
        except ControllerError as exc:
            kind = "retrying may help" if not isinstance(exc, PermanentError) else "retrying will not help"
            return TaskAnswer("failed", redact(f"{exc} ({kind})"))
        except Exception as exc:  # a failed task is an answer to send, never a reason for the puller to die
            log.exception("%s task %s failed", entry.action, entry.task_id)
            return TaskAnswer("failed", redact(f"{type(exc).__name__}: {exc}"))
        return TaskAnswer("failed", f"not a node task: {getattr(message, 'kind', '?')}")

    def _keep_bundle(self, task_id: str, reason: str) -> KeptBundle:
        if self.bundles is None:
            return KeptBundle("", "no debug bundle kept: this node agent has no bundle keeper configured")
        return self.bundles.keep(task_id, reason)

    def _restart(self, message: RestartServing, container: ServingContainer) -> TaskAnswer:
        before = container.inspect()
        if before.started_at is not None and message.issued_at < before.started_at:
            return TaskAnswer(
                "completed",
                f"already restarted at {before.started_at.isoformat()} (after this request was issued at "
                f"{message.issued_at.isoformat()}); nothing done",
            )
        kept = self._keep_bundle(message.command_id, f"before restart: {message.reason or 'no reason given'}")
        held, stopped_run = self._hold_serving(f"serving restart requested: {message.reason or 'no reason given'}")
        try:
            after = container.restart(self.restart_timeout_s)
        finally:
            if held:
                self._serving.release()
        started = after.started_at.isoformat() if after.started_at else "unknown"
        stopped = "; the benchmark run in progress was stopped" if stopped_run else ""
        return TaskAnswer(
            "completed",
            f"restarted {after.name}: was {before.status} (pid {before.pid}), now {after.status} (pid {after.pid}) "
            f"since {started}{stopped}; {kept.detail}",
            bundle=kept.name,
        )

    def _hold_serving(self, cause: str) -> tuple[bool, bool]:
        """Take the serving lock, stopping the run that holds it; returns (held, whether a run was stopped)."""
        stopped_run = False
        deadline = time.monotonic() + _RUN_STOP_WAIT_S
        while not self._serving.acquire(timeout=0.2):
            control = self.control
            if control is not None and not control.stopping.is_set():
                log.warning("stopping the benchmark run in progress: %s", cause)
                control.stop(cause)
                stopped_run = True
            if time.monotonic() > deadline:
                log.warning("the run did not stop within %.0f s; restarting anyway", _RUN_STOP_WAIT_S)
                return False, stopped_run
        return True, stopped_run

    def _tail(self, lines: int, container: ServingContainer) -> list[str]:
        return [clean_log_line(line, self._api_key) for line in container.tail(lines)][-lines:]

    # --- running -----------------------------------------------------------------------------------------------

    def run_next(self) -> bool:
        """Run the oldest accepted run, if any, to the end; returns whether one ran."""
        entry = self.journal.next_accepted()
        if entry is None or self.stopping.is_set():
            return False
        with self._serving:  # a restart in progress finishes first
            self._run(entry)
        self.publish_pending()
        return True

    def _run(self, entry: JournalEntry) -> None:
        message = decode_message(entry.message)
        assert isinstance(message, RunBenchmark)
        started = self.clock.now()
        self.journal.mark_running(entry.run_id, started.isoformat(), os.getpid())
        control = RunControl()
        self.control = control
        log.info("running %s", entry.run_id)
        try:
            outcome = asyncio.run(self.runner(message, control))
        except asyncio.CancelledError:
            self.journal.finish(entry.run_id, "failed", self._now(), error=f"stopped during the run: {control.reason}")
            return
        except PermanentError as exc:
            self.journal.finish(entry.run_id, "failed", self._now(), error=str(exc)[:3900])
            return
        except Exception as exc:  # a failed run is a result to report, never a reason for the agent to die
            log.exception("run %s failed", entry.run_id)
            error = f"{type(exc).__name__}: {exc}"[:3900]
            self.journal.finish(entry.run_id, "failed", self._now(), error=error)
            return
        finally:
            self.control = None
        result_file = self.journal.result_path(entry.run_id, ".json")
        records_file = self.journal.result_path(entry.run_id, ".records.jsonl")
        with records_file.open("w", encoding="utf-8") as out:
            for line in outcome.records:
                out.write(line + "\n")
        result = {**outcome.result, "node": self._node_summary(), "records_file": str(records_file)}
        result.update(tpu_result(self.telemetry, started, self.clock))
        result_file.write_text(json.dumps(result), encoding="utf-8")
        if outcome.cancelled or control.stopping.is_set():
            error = f"stopped during the run: {control.reason or 'stop requested'}; partial result kept"
            self.journal.finish(
                entry.run_id,
                "failed",
                self._now(),
                error=error,
                result_file=str(result_file),
                records_file=str(records_file),
            )
            return
        self.journal.finish(
            entry.run_id, "completed", self._now(), result_file=str(result_file), records_file=str(records_file)
        )

    def _node_summary(self) -> dict[str, Any]:
        info = self._system()
        return {
            "name": self.node_name,
            "cpu_model": info.get("cpu_model"),
            "cpus": info.get("cpus"),
            "accelerator": info.get("accelerator"),
        }

    # --- publishing --------------------------------------------------------------------------------------------

    def publish_pending(self) -> int:
        """Publish every finished run the bus has not taken yet; returns how many went out."""
        sent = 0
        for entry in self.journal.unpublished():
            result = None
            if entry.result_file:
                try:
                    result = json.loads(Path(entry.result_file).read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    result = None
            event = BenchmarkCompleted(
                command_id=str(uuid.uuid5(_ID_NAMESPACE, f"{entry.run_id}/completed")),
                issued_at=self.clock.now(),
                deployment_id=self.deployment_id,
                run_id=entry.run_id,
                status="completed" if entry.state == "completed" else "failed",
                result=shrink_result(result) if result is not None else None,
                error=entry.error[:4000],
            )
            if not self._publish(event):
                return sent
            self.journal.mark_published(entry.run_id)
            sent += 1
        return sent

    def publish_booted(self) -> bool:
        if self._booted_published:
            return True
        boot = self._boot() or "unknown-boot"
        event = NodeBooted(
            command_id=str(uuid.uuid5(_ID_NAMESPACE, f"{self.deployment_id}/{self.node_name}/{boot}")),
            issued_at=self.clock.now(),
            deployment_id=self.deployment_id,
            node=self.node_name[:200],
            system=self._system(),
        )
        with delivery_span("node-agent boot", {TRACEPARENT: self._boot_trace}, node=event.node):  # the deploy's trace
            self._booted_published = self._publish(event)
        return self._booted_published

    def publish_pending_tasks(self) -> int:
        """Publish every node task answer the bus has not taken yet; returns how many went out."""
        sent = 0
        for entry in self.tasks.unpublished():
            event = NodeTaskCompleted(
                command_id=str(uuid.uuid5(_ID_NAMESPACE, f"{entry.task_id}/task_completed")),
                issued_at=self.clock.now(),
                deployment_id=self.deployment_id,
                task_id=entry.task_id,
                action=entry.action,
                status="completed" if entry.state == "completed" else "failed",
                detail=entry.detail[:2000],
                bundle=entry.bundle,
            )
            event = fit_lines(event, entry.lines)
            if not self._publish(event, trace=entry.trace):
                return sent
            self.tasks.mark_published(entry.task_id)
            sent += 1
        return sent

    def _publish(self, message: BenchmarkCompleted | NodeBooted | NodeTaskCompleted, *, trace: str = "") -> bool:
        body = encode_message(message)
        attributes = message_attributes(message) | ({TRACEPARENT: trace} if trace else {})
        if self._event_key is not None:
            attributes[EVENT_SEAL_ATTRIBUTE] = seal(self._event_key, body)
        try:
            self.bus.publish(self.events_topic, body, attributes, ordering_key=self.deployment_id)
        except Exception:  # the bus is down: keep it for the next round
            log.exception("could not publish %s", message.kind)
            return False
        return True

    def _now(self) -> str:
        return self.clock.now().isoformat()


def ship_serving_logs(
    sink: LogSink, agent: NodeAgentSettings, *, api_key: str | None, journal_dir: Path, stop: threading.Event
) -> None:
    """The log shipper's thread: the serving container's lines to ``sink`` until ``stop``, over its own engine
    connection so a long read never holds up a restart or a tail."""
    from node_agent.engine_report import start_reporter
    from node_agent.log_shipper import LogShipper
    from shared.adapters.docker_engine import DockerEngineContainer

    source = DockerEngineContainer(agent.node_docker_host, agent.node_container)
    reporter = start_reporter(stop)  # what vLLM printed at start-up, to tpuctl/engine
    shipper = LogShipper(
        source,
        sink,
        container=agent.node_container,
        state_file=journal_dir / "log-shipper.json",
        api_key=api_key,
        batch_wait_s=agent.node_log_flush_s,
        observe=reporter.observe,
    )
    try:
        shipper.run(stop, poll_s=min(2.0, agent.node_log_flush_s))
    finally:
        source.close()
        closer = getattr(sink, "close", None)
        if callable(closer):
            closer()


def _log_and_trace(settings: Settings) -> None:
    """JSON logs, and spans where ``TPUCTL_TRACE_EXPORT`` says (shared/tracing.py)."""
    configure_logging(settings.log_level)
    configure_tracing(settings.trace_export, "tpuctl-node-agent", project=settings.project)


def _journal_dir(settings: Settings, agent: NodeAgentSettings) -> Path:
    if agent.node_journal_dir is not None:
        return agent.node_journal_dir
    if settings.backend == "gcp":
        return Path("/var/lib/tpuctl/bench")
    return Path(settings.data_dir) / f"node-{agent.deployment_id}"


def _read_key(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        key = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise SystemExit(f"node_api_key_file: cannot read {path}: {exc.strerror}") from None
    return key or None


def _start_log_shipper(
    runtime: Runtime, agent: NodeAgentSettings, *, api_key: str | None, journal_dir: Path, stop: threading.Event
) -> threading.Thread:
    """The log shipper's thread (:func:`ship_serving_logs`), started."""
    sink = runtime.log_sink(agent.deployment_id, agent.node_container)
    shipping = threading.Thread(
        target=ship_serving_logs,
        args=(sink, agent),
        kwargs={"api_key": api_key, "journal_dir": journal_dir, "stop": stop},
        name="log-shipper",
        daemon=True,
    )
    shipping.start()
    return shipping


def main() -> int:
    """Entry point of ``python -m node_agent.agent``."""
    from loadgen.datasets import find_tokenizer_file
    from node_agent.tuning import TuningRunner, restore_planned_flags
    from shared.adapters.docker_engine import DockerEngineContainer
    from shared.config import get_settings
    from shared.domain.serving_key import deployment_api_key
    from shared.logging import register_secret
    from shared.wiring import Runtime

    settings = get_settings()
    _log_and_trace(settings)
    agent_settings = NodeAgentSettings()
    api_key = _read_key(agent_settings.node_api_key_file)  # the master, as vLLM was started with it
    serving_key = deployment_api_key(api_key, agent_settings.deployment_id) if api_key else None  # what the proxy takes
    event_key = read_event_key()
    for secret in (api_key, serving_key, event_key):
        register_secret(secret)
    journal_dir = _journal_dir(settings, agent_settings)
    lock = AgentLock(journal_dir)
    lock.acquire()
    runtime = Runtime(settings)
    tokenizer = find_tokenizer_file(agent_settings.node_tokenizer) if agent_settings.node_tokenizer else None
    target = Target(agent_settings.node_vllm_url, model=agent_settings.node_served_model, api_key=serving_key)
    container = DockerEngineContainer(agent_settings.node_docker_host, agent_settings.node_container)
    restore_planned_flags(container, agent_settings.node_restart_timeout_s)  # a tune that died left its flags
    stop = threading.Event()
    bundles = node_bundle_keeper(
        runtime,
        container,
        deployment_id=agent_settings.deployment_id,
        vllm_url=agent_settings.node_vllm_url,
        api_key=api_key,
        node=agent_settings.node_name,
    )
    agent = NodeAgent(
        runtime.bus,
        deployment_id=agent_settings.deployment_id,
        node_name=agent_settings.node_name,
        journal=RunJournal(journal_dir),
        runner=TuningRunner(  # a request with tune_trials is a tune (node_agent.tuning), any other a plain run
            VllmRunner(target, tokenizer_file=tokenizer),
            target,
            container,
            tokenizer_file=tokenizer,
            api_key=api_key,
            stop_timeout_s=agent_settings.node_restart_timeout_s,
        ),
        clock=runtime.clock,  # the simulator's virtual time in the local cloud, wall time on a VM
        node_tasks_topic=runtime.topic("node-tasks"),
        events_topic=runtime.topic("events"),
        system=lambda: system_info(environ=os.environ, disk_paths=(Path("/"), journal_dir)),
        container=container,
        api_key=api_key,
        restart_timeout_s=agent_settings.node_restart_timeout_s,
        event_key=event_key,
        bundles=bundles,
        telemetry=start_sampler(agent_settings, runtime.clock, stop),  # TPU telemetry, on a thread of its own
        boot_trace=read_boot_trace(),
    )

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()
        agent.request_stop(f"node agent received {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    shipping = _start_log_shipper(runtime, agent_settings, api_key=api_key, journal_dir=journal_dir, stop=stop)
    try:
        recovered = agent.start()
        log.info("node agent for %s up (recovered %d interrupted run(s))", agent.deployment_id, len(recovered))
        agent.serve(stop, poll_s=agent_settings.node_poll_s)
        agent.publish_pending()
    finally:
        stop.set()
        shipping.join(timeout=30)  # one last batch, bounded by the sink's timeout
        container.close()
        lock.release()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

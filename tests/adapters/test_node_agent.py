"""The node agent: dispatch through the bus, a run against a streaming stub, results back, restarts survived.

In-process tests drive one agent step by step; the process tests run ``python -m node_agent.agent``
for real and kill it mid-run, as a VM reboot or an OOM kill would.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path

import pytest

from loadgen.generator import Target
from localcloud.vm_twin.containers import tail_file
from node_agent.agent import (
    _ID_NAMESPACE,
    NodeAgent,
    VllmRunner,
    clean_log_line,
    fit_lines,
    node_subscription,
)
from node_agent.journal import JournalEntry, RunJournal, TaskJournal
from shared.adapters.clock import SystemClock
from shared.adapters.docker_engine import DockerEngineContainer
from shared.adapters.local_bus import LocalBus
from shared.adapters.node_channels import LocalBusNodeChannels
from shared.adapters.sqlite_store import SqliteStateStore
from shared.domain.errors import PermanentError, TransientError
from shared.domain.models import DeploymentRecord, DeploymentSpec, DeploymentStatus, Phase, Tier
from shared.messages import (
    MAX_MESSAGE_BYTES,
    BenchmarkCompleted,
    BenchmarkRequest,
    NodeBooted,
    NodeTaskCompleted,
    RestartServing,
    RunBenchmark,
    TailServingLogs,
    decode_message,
    encode_message,
    message_attributes,
    new_command_id,
)
from shared.ports import CommandBus, Delivery, Handler, MissingSubscription
from shared.services.benchmarker import Benchmarker
from tests.support.builders import spec_dict
from tests.support.serving_container import StandIn, serve_stand_in
from tests.support.stub_server import StubBehaviour, StubProcess, spawn_stub

EVENTS, NODE_TASKS = "tpuctl-events", "tpuctl-node-tasks"


def _events(bus: LocalBus) -> list[object]:
    seen: list[Delivery] = []
    bus.pull("test-events", seen.append, max_messages=100, timeout_s=0)
    return [decode_message(delivery.data) for delivery in seen]


def _bus(path: Path, *, channel: bool = True) -> LocalBus:
    """Topics as Terraform makes them; with ``channel``, gemma-a's node channel as the provisioner opens it."""
    bus = LocalBus(path)
    bus.ensure_topic(EVENTS)
    bus.ensure_topic(NODE_TASKS)
    bus.ensure_subscription(EVENTS, "test-events")
    if channel:
        LocalBusNodeChannels(bus, NODE_TASKS).open("gemma-a")
    return bus


def _dispatch(bus: LocalBus, benchmark: BenchmarkRequest, deployment_id: str = "gemma-a") -> RunBenchmark:
    message = RunBenchmark(
        command_id=new_command_id(), issued_at=datetime.now(UTC), deployment_id=deployment_id, benchmark=benchmark
    )
    attributes = {"kind": message.kind, "deployment_id": deployment_id, "run_id": message.command_id}
    bus.publish(NODE_TASKS, message.model_dump_json().encode(), attributes, ordering_key=deployment_id)
    return message


@pytest.fixture
def bus(tmp_path: Path) -> Iterator[LocalBus]:
    bus = _bus(tmp_path / "bus.sqlite")
    try:
        yield bus
    finally:
        bus.close()


def _agent(bus: LocalBus, journal_dir: Path, url: str, event_key: str | None = None) -> NodeAgent:
    return NodeAgent(
        bus,
        deployment_id="gemma-a",
        node_name="node-1",
        journal=RunJournal(journal_dir),
        runner=VllmRunner(Target(url)),
        clock=SystemClock(),
        system=lambda: {"cpu_model": "test cpu", "cpus": 2, "accelerator": None},
        boot=lambda: "boot-1",
        event_key=event_key,
    )


class TestInProcess:
    def test_a_dispatch_runs_once_and_its_result_reaches_the_benchmarker(
        self, bus: LocalBus, tmp_path: Path, timed_stub: StubProcess
    ) -> None:
        store = SqliteStateStore(tmp_path / "state.sqlite")
        now = datetime.now(UTC)
        spec = DeploymentSpec.model_validate(spec_dict("gemma-a", model="tiny-llama", accelerator="v6e-1"))
        store.put_deployment(
            DeploymentRecord(
                deployment_id="gemma-a",
                spec=spec,
                status=DeploymentStatus(phase=Phase.SERVING, tier=Tier.SPOT),
                created_at=now,
                updated_at=now,
            ),
            expected_version=None,
        )
        benchmarker = Benchmarker(store, bus, SystemClock())
        agent = _agent(bus, tmp_path / "node", timed_stub.base_url)
        assert agent.start() == []
        command = RunBenchmark(
            command_id=new_command_id(),
            issued_at=now,
            deployment_id="gemma-a",
            benchmark=BenchmarkRequest(concurrency=(1, 4), num_prompts=8, input_len=8, output_len=4),
        )
        benchmarker.handle(command)
        assert agent.poll_once(timeout_s=1) == 1
        # a redelivered dispatch is acked without a second run
        bus.publish(NODE_TASKS, command.model_dump_json().encode(), {"deployment_id": "gemma-a"})
        assert agent.poll_once(timeout_s=1) == 1
        assert agent.run_next() is True
        assert agent.run_next() is False
        events = _events(bus)
        assert isinstance(events[0], NodeBooted)
        assert events[0].system["cpu_model"] == "test cpu"
        completed = [event for event in events if isinstance(event, BenchmarkCompleted)]
        assert len(completed) == 1
        assert completed[0].status == "completed"
        assert completed[0].run_id == command.command_id
        result = completed[0].result or {}
        assert [point["level"] for point in result["points"]] == [1, 4]
        assert result["node"]["name"] == "node-1"
        records = Path(result["records_file"]).read_text().splitlines()
        assert len(records) == 16
        benchmarker.handle(completed[0])
        stored = store.get_benchmark_run(command.command_id)
        assert stored is not None
        assert stored.status == "completed"
        assert stored.plan["vllm_version"] == "0.32.0"

    def test_a_run_left_running_by_a_dead_agent_is_reported_failed_with_the_cause(
        self, bus: LocalBus, tmp_path: Path
    ) -> None:
        journal = RunJournal(tmp_path / "node")
        body = RunBenchmark(command_id=new_command_id(), issued_at=datetime.now(UTC), deployment_id="gemma-a")
        journal.accept(body.command_id, body.model_dump_json(), "2026-12-02T12:00:00+00:00")
        journal.mark_running(body.command_id, "2026-12-02T12:00:01+00:00", pid=31337)
        agent = _agent(bus, tmp_path / "node", "http://127.0.0.1:9")
        assert agent.start() == [body.command_id]
        failed = [event for event in _events(bus) if isinstance(event, BenchmarkCompleted)]
        assert [(event.run_id, event.status) for event in failed] == [(body.command_id, "failed")]
        assert "restarted while this run was in progress (previous agent pid 31337" in failed[0].error
        assert agent.start() == []  # nothing left to recover, nothing published twice
        assert [e for e in _events(bus) if isinstance(e, BenchmarkCompleted)] == []

    def test_a_run_against_a_dead_server_fails_with_the_reason(self, bus: LocalBus, tmp_path: Path) -> None:
        agent = _agent(bus, tmp_path / "node", "http://127.0.0.1:9")
        agent.start()
        _dispatch(bus, BenchmarkRequest(num_prompts=1, concurrency=(1,)))
        agent.poll_once(timeout_s=1)
        agent.run_next()
        failed = [event for event in _events(bus) if isinstance(event, BenchmarkCompleted)]
        assert failed[0].status == "failed"
        assert "base_url" in failed[0].error


def _spawn_agent(tmp_path: Path, url: str) -> subprocess.Popen[bytes]:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", ""),
        "TPUCTL_BACKEND": "local",
        "TPUCTL_DATA_DIR": str(tmp_path),
        "TPUCTL_DEPLOYMENT_ID": "gemma-a",
        "TPUCTL_NODE_VLLM_URL": url,
        "TPUCTL_NODE_POLL_S": "0.2",
        "TPUCTL_NODE_NAME": "node-1",
    }
    with (tmp_path / "agent.log").open("ab") as log:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "node_agent.agent"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )


def _wait(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"condition not met within {timeout_s} s")


def _journal_state(tmp_path: Path, run_id: str) -> str | None:
    try:
        runs = json.loads((tmp_path / "node-gemma-a" / "journal.json").read_text())["runs"]
    except (OSError, ValueError):
        return None
    return next((run["state"] for run in runs if run["run_id"] == run_id), None)


@pytest.fixture(scope="module")
def slow_stub() -> Iterator[StubProcess]:
    stub = spawn_stub(StubBehaviour(first_token_delay_s=0.2, inter_token_s=0.01))
    try:
        yield stub
    finally:
        stub.stop()


class TestProcess:
    def test_a_killed_agent_reports_the_interrupted_run_failed_when_it_comes_back(
        self, tmp_path: Path, slow_stub: StubProcess
    ) -> None:
        bus = _bus(tmp_path / "bus.sqlite")
        agent = _spawn_agent(tmp_path, slow_stub.base_url)
        try:
            _wait(lambda: bus.backlog("test-events") >= 1)  # node.booted: subscribed and announced
            message = _dispatch(bus, BenchmarkRequest(concurrency=(1,), num_prompts=200, input_len=4, output_len=4))
            _wait(lambda: _journal_state(tmp_path, message.command_id) == "running")
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait(timeout=10)
            agent = _spawn_agent(tmp_path, slow_stub.base_url)
            _wait(lambda: _journal_state(tmp_path, message.command_id) == "failed")
            _wait(lambda: bus.backlog("test-events") >= 2)
            completed = [e for e in _events(bus) if isinstance(e, BenchmarkCompleted)]
            assert [(e.run_id, e.status) for e in completed] == [(message.command_id, "failed")]
            assert "node agent restarted while this run was in progress" in completed[0].error
            agent.send_signal(signal.SIGTERM)
            assert agent.wait(timeout=10) == 0
        finally:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait(timeout=10)
            bus.close()

    def test_sigterm_mid_run_reports_the_run_failed_and_exits(self, tmp_path: Path, slow_stub: StubProcess) -> None:
        bus = _bus(tmp_path / "bus.sqlite")
        agent = _spawn_agent(tmp_path, slow_stub.base_url)
        try:
            _wait(lambda: bus.backlog("test-events") >= 1)
            message = _dispatch(bus, BenchmarkRequest(concurrency=(1,), num_prompts=200, input_len=4, output_len=4))
            _wait(lambda: _journal_state(tmp_path, message.command_id) == "running")
            time.sleep(0.5)  # a few requests in
            agent.send_signal(signal.SIGTERM)
            assert agent.wait(timeout=15) == 0
            completed = [e for e in _events(bus) if isinstance(e, BenchmarkCompleted)]
            assert [(e.run_id, e.status) for e in completed] == [(message.command_id, "failed")]
            assert "stopped during the run: node agent received SIGTERM" in completed[0].error
            assert completed[0].result is not None  # the partial result is kept
        finally:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait(timeout=10)
            bus.close()

    def test_node_subscription_is_per_deployment(self) -> None:
        assert node_subscription("gemma-a") == "tpuctl-node-gemma-a"


# --- node tasks: serving.restart and serving.logs through the Docker Engine API twin ---------------------------


class OutageBus:
    """A ``LocalBus`` whose publishing can be switched off, as during a Pub/Sub outage (pulling still works)."""

    def __init__(self, inner: LocalBus) -> None:
        self.inner = inner
        self.down = False

    def ensure_topic(self, topic: str) -> None:
        self.inner.ensure_topic(topic)

    def ensure_subscription(
        self,
        topic: str,
        subscription: str,
        *,
        filter: str | None = None,
        dead_letter_topic: str | None = None,
        max_delivery_attempts: int = 5,
    ) -> None:
        self.inner.ensure_subscription(
            topic,
            subscription,
            filter=filter,
            dead_letter_topic=dead_letter_topic,
            max_delivery_attempts=max_delivery_attempts,
        )

    def publish(
        self, topic: str, data: bytes, attributes: Mapping[str, str], *, ordering_key: str | None = None
    ) -> str:
        if self.down:
            raise TransientError("publish: the bus is unavailable")
        return self.inner.publish(topic, data, attributes, ordering_key=ordering_key)

    def pull(self, subscription: str, handler: Handler, *, max_messages: int = 10, timeout_s: float = 1.0) -> int:
        return self.inner.pull(subscription, handler, max_messages=max_messages, timeout_s=timeout_s)


def _send_task(bus: LocalBus, message: RestartServing | TailServingLogs) -> None:
    """As the control plane re-publishes a node task: the body unchanged, routing attributes set."""
    bus.publish(NODE_TASKS, encode_message(message), message_attributes(message), ordering_key=message.deployment_id)


def _restart(reason: str = "wedged", issued_at: datetime | None = None) -> RestartServing:
    return RestartServing(
        command_id=new_command_id(), issued_at=issued_at or datetime.now(UTC), deployment_id="gemma-a", reason=reason
    )


TaskAgentFactory = Callable[..., NodeAgent]


@pytest.fixture
def task_agent() -> Iterator[TaskAgentFactory]:
    """Builds agents wired to a Docker Engine API; their engine clients are closed after the test."""
    engines: list[DockerEngineContainer] = []

    def build(
        bus: CommandBus,
        journal_dir: Path,
        url: str,
        docker_host: str,
        *,
        api_key: str | None = None,
        name: str = "tpuctl-vllm",
    ) -> NodeAgent:
        engine = DockerEngineContainer(docker_host, name, timeout_s=10)
        engines.append(engine)
        return NodeAgent(
            bus,
            deployment_id="gemma-a",
            node_name="node-1",
            journal=RunJournal(journal_dir),
            runner=VllmRunner(Target(url)),
            clock=SystemClock(),
            system=lambda: {"cpu_model": "test cpu", "cpus": 2, "accelerator": None},
            boot=lambda: "boot-1",
            container=engine,
            api_key=api_key,
            restart_timeout_s=5,
        )

    try:
        yield build
    finally:
        for engine in engines:
            engine.close()


def _answers(bus: LocalBus) -> list[NodeTaskCompleted]:
    return [event for event in _events(bus) if isinstance(event, NodeTaskCompleted)]


@pytest.fixture
def stand_in(tmp_path: Path) -> Iterator[StandIn]:
    with serve_stand_in(tmp_path / "container") as served:
        yield served


class TestNodeTasks:
    def test_a_restart_during_a_run_stops_the_run_then_replaces_the_container(
        self, task_agent: TaskAgentFactory, bus: LocalBus, tmp_path: Path, slow_stub: StubProcess, stand_in: StandIn
    ) -> None:
        agent = task_agent(bus, tmp_path / "node", slow_stub.base_url, stand_in.docker_host)
        agent.start()
        stop = threading.Event()
        serving = threading.Thread(target=agent.serve, args=(stop,), kwargs={"poll_s": 0.2}, daemon=True)
        serving.start()
        try:
            run = _dispatch(bus, BenchmarkRequest(concurrency=(1,), num_prompts=200, input_len=4, output_len=4))
            _wait(lambda: (agent.journal.get(run.command_id) or _NO_ENTRY).state == "running", timeout_s=15)
            old_pid = stand_in.starts[0].pid
            request = _restart("engine wedged")
            _send_task(bus, request)
            _wait(lambda: bus.backlog("test-events") >= 3, timeout_s=30)  # booted, the run, the answer
        finally:
            stop.set()
            serving.join(timeout=30)
        assert not serving.is_alive()
        events = _events(bus)
        completed = [event for event in events if isinstance(event, BenchmarkCompleted)]
        assert [(event.run_id, event.status) for event in completed] == [(run.command_id, "failed")]
        assert "serving restart requested: engine wedged" in completed[0].error
        answers = [event for event in events if isinstance(event, NodeTaskCompleted)]
        assert [(a.task_id, a.action, a.status) for a in answers] == [(request.command_id, "restart", "completed")]
        assert "the benchmark run in progress was stopped" in answers[0].detail
        assert stand_in.restarts == 1
        assert not stand_in.starts[0].alive() and stand_in.starts[1].alive()
        assert f"(pid {old_pid})" in answers[0].detail and f"(pid {stand_in.starts[1].pid})" in answers[0].detail

    def test_duplicate_and_stale_restarts_change_nothing_even_across_agent_restarts(
        self, task_agent: TaskAgentFactory, bus: LocalBus, tmp_path: Path, stand_in: StandIn
    ) -> None:
        agent = task_agent(bus, tmp_path / "node", "http://127.0.0.1:9", stand_in.docker_host)
        agent.start()
        first = _restart("first")
        _send_task(bus, first)
        agent.poll_once(timeout_s=1)
        assert agent.handle_tasks() == 1
        assert stand_in.restarts == 1
        _send_task(bus, first)  # a redelivery of the same task
        assert agent.poll_once(timeout_s=1) == 1
        assert agent.handle_tasks() == 0
        late = _restart("sent before the first restart happened", issued_at=first.issued_at)
        _send_task(bus, late)
        agent.poll_once(timeout_s=1)
        assert agent.handle_tasks() == 1
        assert stand_in.restarts == 1
        assert agent.publish_pending_tasks() == 2
        answers = _answers(bus)
        assert [(a.task_id, a.status) for a in answers] == [
            (first.command_id, "completed"),
            (late.command_id, "completed"),
        ]
        assert answers[0].detail.startswith("restarted tpuctl-vllm")
        assert "; nothing done" in answers[1].detail and answers[1].detail.startswith("already restarted at ")
        # a new agent process on the same journal remembers the task ids
        again = task_agent(bus, tmp_path / "node", "http://127.0.0.1:9", stand_in.docker_host)
        again.start()
        _send_task(bus, first)
        assert again.poll_once(timeout_s=1) == 1
        assert again.handle_tasks() == 0
        assert again.publish_pending_tasks() == 0
        assert stand_in.restarts == 1
        assert [e for e in _events(bus) if isinstance(e, NodeTaskCompleted)] == []

    def test_a_log_tail_is_cleaned_and_redacts_secrets(
        self, task_agent: TaskAgentFactory, bus: LocalBus, tmp_path: Path
    ) -> None:
        canary = "hf_" + "CanaryTailToken" + "x7" * 10
        api_key = "agent-key-" + secrets.token_hex(8)
        lines = (
            f"downloading with token {canary} now",
            "\x1b[31mred\x1b[0m text\x07 with a bell\u202e",
            f"Authorization: Bearer {api_key}",
            "y" * 5000,
        )
        with serve_stand_in(tmp_path / "container", lines=lines) as served:
            agent = task_agent(bus, tmp_path / "node", "http://127.0.0.1:9", served.docker_host, api_key=api_key)
            agent.start()
            _wait(lambda: len(tail_file(served.image.log_path, 10)) >= 5)
            request = TailServingLogs(
                command_id=new_command_id(), issued_at=datetime.now(UTC), deployment_id="gemma-a", lines=4
            )
            _send_task(bus, request)
            agent.poll_once(timeout_s=1)
            agent.handle_tasks()
            assert agent.publish_pending_tasks() == 1
        (answer,) = _answers(bus)
        assert (answer.task_id, answer.action, answer.status) == (request.command_id, "logs", "completed")
        text = "\n".join(answer.lines)
        assert len(answer.lines) == 4
        assert canary not in text and api_key not in text
        assert "downloading with token [REDACTED] now" in answer.lines[0]
        assert answer.lines[1].endswith("red text with a bell")
        assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
        assert len(answer.lines[3]) == 2000
        stamp = answer.lines[0].split(" ", 1)[0]
        assert stamp.endswith("Z") and stamp[:4].isdigit()  # Docker's timestamps=1 prefix

    def test_an_answer_waits_for_the_bus_and_goes_out_once(
        self, task_agent: TaskAgentFactory, tmp_path: Path, stand_in: StandIn
    ) -> None:
        inner = _bus(tmp_path / "bus.sqlite")
        try:
            bus = OutageBus(inner)
            agent = task_agent(bus, tmp_path / "node", "http://127.0.0.1:9", stand_in.docker_host)
            agent.start()
            bus.down = True
            request = TailServingLogs(
                command_id=new_command_id(), issued_at=datetime.now(UTC), deployment_id="gemma-a", lines=5
            )
            _send_task(inner, request)
            agent.poll_once(timeout_s=1)
            assert agent.handle_tasks() == 1
            assert agent.publish_pending_tasks() == 0  # the bus is down: kept for the next round
            entry = agent.tasks.get(request.command_id)
            assert entry is not None and not entry.published
            bus.down = False
            assert agent.publish_pending_tasks() == 1
            assert agent.publish_pending_tasks() == 0
            (answer,) = _answers(inner)
            assert answer.command_id == str(uuid.uuid5(_ID_NAMESPACE, f"{request.command_id}/task_completed"))
            assert any("boot 1" in line for line in answer.lines)
        finally:
            inner.close()

    def test_a_missing_container_is_answered_failed_with_the_setting_to_fix(
        self, task_agent: TaskAgentFactory, bus: LocalBus, tmp_path: Path, stand_in: StandIn
    ) -> None:
        agent = task_agent(bus, tmp_path / "node", "http://127.0.0.1:9", stand_in.docker_host, name="not-there")
        agent.start()
        request = _restart()
        _send_task(bus, request)
        agent.poll_once(timeout_s=1)
        agent.handle_tasks()
        agent.publish_pending_tasks()
        (answer,) = _answers(bus)
        assert answer.status == "failed"
        assert "node_container: no container named 'not-there'" in answer.detail
        assert "retrying will not help" in answer.detail
        assert stand_in.restarts == 0

    def test_a_tail_too_big_for_one_message_drops_the_oldest_lines(self) -> None:
        event = NodeTaskCompleted(
            command_id=new_command_id(),
            issued_at=datetime.now(UTC),
            deployment_id="gemma-a",
            task_id=new_command_id(),
            action="logs",
            status="completed",
        )
        lines = [f"{n:04d} " + "z" * 1990 for n in range(500)]
        fitted = fit_lines(event, lines)
        assert len(encode_message(fitted)) <= MAX_MESSAGE_BYTES
        assert fitted.lines[-1] == lines[-1]
        assert 0 < len(fitted.lines) < 500
        assert fitted.lines[0] == lines[500 - len(fitted.lines)]
        assert fit_lines(event, ["short"]).lines == ("short",)

    def test_clean_log_line_keeps_ordinary_text(self) -> None:
        assert clean_log_line("INFO 12-02 18:00:01 [api_server.py:1] Started server\ttab") == (
            "INFO 12-02 18:00:01 [api_server.py:1] Started server tab"
        )


_NO_ENTRY = JournalEntry(run_id="", state="accepted", message="", accepted_at="")


def test_the_task_journal_survives_a_reopen_and_moves_a_broken_file_aside(tmp_path: Path) -> None:
    journal = TaskJournal(tmp_path)
    assert journal.accept("task-1", "logs", "{}", "2026-12-02T12:00:00+00:00") is True
    journal.finish("task-1", "completed", "2026-12-02T12:00:01+00:00", detail="", lines=["a", "b"])
    reopened = TaskJournal(tmp_path)
    assert reopened.accept("task-1", "logs", "{}", "2026-12-02T12:00:02+00:00") is False
    assert [entry.lines for entry in reopened.unpublished()] == [["a", "b"]]
    reopened.mark_published("task-1")
    entry = TaskJournal(tmp_path).get("task-1")
    assert entry is not None and entry.published and entry.lines == []  # the answer is out: lines not kept
    (tmp_path / "tasks.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(RuntimeError, match=r"task journal: .*tasks\.json was unreadable"):
        TaskJournal(tmp_path)
    assert (tmp_path / "tasks.broken").is_file()


# --- the node channel: the controller's, never the agent's -----------------------------------------------------


class TestNodeChannel:
    def test_the_agent_creates_nothing_on_the_bus_and_waits_for_its_channel_saying_so(
        self, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        import node_agent.agent as node_agent_module

        monkeypatch.setattr(node_agent_module, "_MISSING_CHANNEL_WAIT_S", 0.05)
        bus = _bus(tmp_path / "bus.sqlite", channel=False)
        try:
            agent = _agent(bus, tmp_path / "node", "http://127.0.0.1:9")
            assert agent.start() == []
            with pytest.raises(MissingSubscription):  # start() made no subscription of its own
                bus.backlog(node_subscription("gemma-a"))
            stop = threading.Event()
            puller = threading.Thread(target=agent.pull_loop, args=(stop, 0.05), daemon=True)
            with caplog.at_level(logging.INFO, logger="tpuctl.node_agent"):
                puller.start()
                try:
                    _wait(lambda: "does not exist yet" in caplog.text, timeout_s=10)
                    time.sleep(0.3)  # several missing rounds: said once, not every round
                    assert caplog.text.count("does not exist yet") == 1
                    assert "tpuctl-node-gemma-a" in caplog.text and "never creates it" in caplog.text
                    LocalBusNodeChannels(bus, NODE_TASKS).open("gemma-a")  # the provisioner opens it
                    run = _dispatch(bus, BenchmarkRequest(concurrency=(1,), num_prompts=2, input_len=4, output_len=4))
                    _wait(lambda: agent.journal.get(run.command_id) is not None, timeout_s=10)
                    assert "exists now" in caplog.text
                finally:
                    stop.set()
                    puller.join(timeout=10)
            assert not puller.is_alive()
            assert bus.backlog(node_subscription("gemma-a")) == 0
        finally:
            bus.close()

    def test_the_channel_is_filtered_on_the_deployment_and_closing_it_drops_its_backlog(self, tmp_path: Path) -> None:
        bus = _bus(tmp_path / "bus.sqlite")
        try:
            channels = LocalBusNodeChannels(bus, NODE_TASKS)
            assert channels.open("gemma-a") == "tpuctl-node-gemma-a"  # again: idempotent
            _dispatch(bus, BenchmarkRequest(concurrency=(1,), num_prompts=2, input_len=4, output_len=4))
            _dispatch(bus, BenchmarkRequest(concurrency=(1,), num_prompts=2, input_len=4, output_len=4), "other-b")
            assert bus.backlog("tpuctl-node-gemma-a") == 1
            assert channels.close("gemma-a") is True
            assert channels.close("gemma-a") is False
            with pytest.raises(MissingSubscription):
                bus.backlog("tpuctl-node-gemma-a")
        finally:
            bus.close()

    def test_a_refused_pull_is_said_plainly_and_tried_again_until_the_grant_applies(
        self, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        import node_agent.agent as node_agent_module

        monkeypatch.setattr(node_agent_module, "_MISSING_CHANNEL_WAIT_S", 0.05)
        inner = _bus(tmp_path / "bus.sqlite")

        class NotYetGranted(OutageBus):
            refusals = 5

            def pull(
                self, subscription: str, handler: Handler, *, max_messages: int = 10, timeout_s: float = 1.0
            ) -> int:
                if self.refusals:
                    self.refusals -= 1
                    raise PermanentError(f"pubsub pull from subscription {subscription!r}: PermissionDenied: 403")
                return super().pull(subscription, handler, max_messages=max_messages, timeout_s=timeout_s)

        bus = NotYetGranted(inner)
        try:
            agent = _agent(inner, tmp_path / "node", "http://127.0.0.1:9")
            agent.bus = bus
            stop = threading.Event()
            puller = threading.Thread(target=agent.pull_loop, args=(stop, 0.05), daemon=True)
            with caplog.at_level(logging.INFO, logger="tpuctl.node_agent"):
                puller.start()
                try:
                    run = _dispatch(inner, BenchmarkRequest(concurrency=(1,), num_prompts=2, input_len=4, output_len=4))
                    _wait(lambda: agent.journal.get(run.command_id) is not None, timeout_s=10)
                finally:
                    stop.set()
                    puller.join(timeout=10)
            assert bus.refusals == 0
            assert caplog.text.count("was refused") == 1 and "PermissionDenied" in caplog.text
            assert "Traceback" not in caplog.text
        finally:
            inner.close()


class _MetadataServer:
    """A stand-in for the GCE metadata server: ``instance/attributes/*`` from a dict, ``Metadata-Flavor`` required."""

    def __init__(self, attributes: Mapping[str, str]) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        served = dict(attributes)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                key = self.path.removeprefix("/computeMetadata/v1/instance/attributes/")
                if self.headers.get("Metadata-Flavor") != "Google":
                    status, text = 403, "missing Metadata-Flavor"
                elif key in served:
                    status, text = 200, served[key]
                else:
                    status, text = 404, "not found"
                body = text.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class TestEventSeal:
    """Events leave sealed with the key the node's own metadata holds; the controller's check accepts only those."""

    def _published(self, bus: LocalBus) -> list[Delivery]:
        seen: list[Delivery] = []
        bus.pull("test-events", seen.append, max_messages=100, timeout_s=0)
        return seen

    def test_the_agent_seals_its_events_with_its_deployment_s_key(self, bus: LocalBus, tmp_path: Path) -> None:
        from shared.adapters.file_secrets import FileSecretStore
        from shared.domain.errors import InvalidMessage
        from shared.services.event_seals import EventSeals

        seals = EventSeals(FileSecretStore(tmp_path / "secrets"), "tpuctl-event-key")
        agent = _agent(bus, tmp_path / "journal", "http://127.0.0.1:9", seals.event_key("gemma-a", create=True))
        agent.publish_booted()
        (delivery,) = self._published(bus)
        message = decode_message(delivery.data)
        seals.check(delivery.attributes, delivery.data, message)  # accepted: no error
        forged = message.model_copy(update={"deployment_id": "gemma-b"})
        with pytest.raises(InvalidMessage, match="event key of deployment 'gemma-b'"):
            seals.check(delivery.attributes, encode_message(forged), forged)
        with pytest.raises(InvalidMessage, match=r"attributes\.event_seal"):
            seals.check({"kind": message.kind}, delivery.data, message)

    def test_the_key_is_read_from_the_node_s_own_metadata(self) -> None:
        from node_agent.agent import read_event_key

        key = secrets.token_hex(32)
        server = _MetadataServer({"tpuctl-event-key": key + "\n"})
        try:
            assert read_event_key(server.host) == key
        finally:
            server.close()

    def test_a_node_without_a_key_says_its_events_will_be_refused(self, caplog: pytest.LogCaptureFixture) -> None:
        from node_agent.agent import read_event_key

        server = _MetadataServer({"tpuctl-event-key": "not-hex"})
        empty = _MetadataServer({})
        try:
            with caplog.at_level(logging.WARNING):
                assert read_event_key(empty.host, attempts=3, wait_s=0.01) is None
                assert read_event_key(server.host, attempts=2, wait_s=0.01) is None
        finally:
            server.close()
            empty.close()
        assert "refuse every event" in caplog.text
        assert "no usable event key (HTTP 200)" in caplog.text

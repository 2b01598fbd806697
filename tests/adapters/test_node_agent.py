"""The node agent: dispatch through the bus, a run against a streaming stub, results back, restarts survived.

In-process tests drive one agent step by step; the process tests run ``python -m shared.bench.node_agent``
for real and kill it mid-run, as a VM reboot or an OOM kill would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from shared.adapters.clock import SystemClock
from shared.adapters.local_bus import LocalBus
from shared.adapters.sqlite_store import SqliteStateStore
from shared.bench.journal import RunJournal
from shared.bench.loadgen import Target
from shared.bench.node_agent import NodeAgent, VllmRunner, node_subscription
from shared.bench.stub_server import StubBehaviour, StubProcess, spawn_stub
from shared.domain.models import DeploymentRecord, DeploymentSpec, DeploymentStatus, Phase, Tier
from shared.messages import (
    BenchmarkCompleted,
    BenchmarkRequest,
    NodeBooted,
    RunBenchmark,
    decode_message,
    new_command_id,
)
from shared.ports import Delivery
from shared.services.benchmarker import Benchmarker
from tests.support.builders import spec_dict

EVENTS, NODE_TASKS = "tpuctl-events", "tpuctl-node-tasks"


def _events(bus: LocalBus) -> list[object]:
    seen: list[Delivery] = []
    bus.pull("test-events", seen.append, max_messages=100, timeout_s=0)
    return [decode_message(delivery.data) for delivery in seen]


def _bus(path: Path) -> LocalBus:
    bus = LocalBus(path)
    bus.ensure_topic(EVENTS)
    bus.ensure_topic(NODE_TASKS)
    bus.ensure_subscription(EVENTS, "test-events")
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


def _agent(bus: LocalBus, journal_dir: Path, url: str) -> NodeAgent:
    return NodeAgent(
        bus,
        deployment_id="gemma-a",
        node_name="node-1",
        journal=RunJournal(journal_dir),
        runner=VllmRunner(Target(url)),
        clock=SystemClock(),
        system=lambda: {"cpu_model": "test cpu", "cpus": 2, "accelerator": None},
        boot=lambda: "boot-1",
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
            [sys.executable, "-m", "shared.bench.node_agent"],
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

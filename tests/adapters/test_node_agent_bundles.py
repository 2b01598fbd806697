"""The node agent keeps a debug bundle before every restart and on ``serving.debug``; a bundle that cannot be kept
never stops the restart it precedes.

Real parts: the agent, the VM twin's container runtime behind the Engine API socket (a real Python process as
the container), py-spy reading that process, the embedded bundle store on disk, the embedded bus.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from loadgen.generator import Target
from node_agent.agent import NodeAgent, VllmRunner
from node_agent.bundle_keeper import BundleKeeper
from node_agent.forensics import ForensicsSources, find_py_spy
from node_agent.journal import RunJournal
from shared.adapters.clock import SystemClock
from shared.adapters.directory_bundles import DirectoryBundles
from shared.adapters.docker_engine import DockerEngineContainer
from shared.adapters.local_bus import LocalBus
from shared.domain.debug_bundle import bundle_object_name
from shared.domain.errors import CloudError, ErrorClass
from shared.messages import (
    CaptureDebugBundle,
    NodeTaskCompleted,
    RestartServing,
    decode_message,
    encode_message,
    message_attributes,
    new_command_id,
)
from tests.support.serving_container import StandIn, serve_stand_in

NODE_TASKS = "test-node-tasks"
EVENTS = "test-events"
API_KEY = "sk-node-" + "k3y" * 8


class RefusingBundles:
    """A bundle store whose every write is refused, as a bucket without the VM's grant refuses it."""

    def __init__(self) -> None:
        self.attempts = 0

    def put(self, name: str, data: bytes) -> str:
        self.attempts += 1
        raise CloudError(ErrorClass.PERMISSION, f"gs://b/{name}: 403 (grant roles/storage.objectCreator)")

    def get(self, name: str) -> bytes:
        raise CloudError(ErrorClass.NOT_FOUND, name)

    def location(self, name: str) -> str:
        return f"gs://b/{name}"


@pytest.fixture
def bus(tmp_path: Path) -> Iterator[LocalBus]:
    bus = LocalBus(tmp_path / "bus.sqlite")
    for topic in (NODE_TASKS, EVENTS):
        bus.ensure_topic(topic)
    bus.ensure_subscription(NODE_TASKS, "tpuctl-node-gemma-a", filter='attributes.deployment_id = "gemma-a"')
    bus.ensure_subscription(EVENTS, "events")
    try:
        yield bus
    finally:
        bus.close()


@pytest.fixture
def stand_in(tmp_path: Path) -> Iterator[StandIn]:
    with serve_stand_in(tmp_path / "container", lines=(f"engine log with key {API_KEY}",)) as served:
        yield served


@pytest.fixture
def engine(stand_in: StandIn) -> Iterator[DockerEngineContainer]:
    container = DockerEngineContainer(stand_in.docker_host, "tpuctl-vllm", timeout_s=10)
    try:
        yield container
    finally:
        container.close()


def _agent(bus: LocalBus, tmp_path: Path, engine: DockerEngineContainer, store: object | None) -> NodeAgent:
    clock = SystemClock()
    keeper = BundleKeeper(
        ForensicsSources(
            container=engine, vllm_url="http://127.0.0.1:9", api_key=API_KEY, metadata_url=None, py_spy=find_py_spy()
        ),
        store,  # type: ignore[arg-type]
        deployment_id="gemma-a",
        node="node-1",
        clock=clock,
        deadline_s=30,
    )
    return NodeAgent(
        bus,
        deployment_id="gemma-a",
        node_name="node-1",
        journal=RunJournal(tmp_path / "node"),
        runner=VllmRunner(Target("http://127.0.0.1:9")),
        clock=clock,
        node_tasks_topic=NODE_TASKS,
        events_topic=EVENTS,
        system=lambda: {"cpus": 2},
        boot=lambda: "boot-1",
        container=engine,
        api_key=API_KEY,
        restart_timeout_s=5,
        bundles=keeper,
    )


def _carry_out(agent: NodeAgent, bus: LocalBus, message: RestartServing | CaptureDebugBundle) -> NodeTaskCompleted:
    bus.publish(NODE_TASKS, encode_message(message), message_attributes(message), ordering_key=message.deployment_id)
    assert agent.poll_once(timeout_s=1) == 1
    assert agent.handle_tasks() == 1
    assert agent.publish_pending_tasks() == 1
    answers: list[NodeTaskCompleted] = []

    def keep(delivery: object) -> None:
        decoded = decode_message(delivery.data)  # type: ignore[attr-defined]
        if isinstance(decoded, NodeTaskCompleted):
            answers.append(decoded)

    bus.pull("events", keep, max_messages=10, timeout_s=0)
    (answer,) = answers
    return answer


def _restart() -> RestartServing:
    return RestartServing(
        command_id=new_command_id(), issued_at=datetime.now(UTC), deployment_id="gemma-a", reason="STALLED: frozen"
    )


def test_a_restart_keeps_the_old_process_s_bundle_first_and_links_it(
    bus: LocalBus, tmp_path: Path, engine: DockerEngineContainer, stand_in: StandIn
) -> None:
    store = DirectoryBundles(tmp_path / "bundles")
    agent = _agent(bus, tmp_path, engine, store)
    old_pid = stand_in.starts[0].pid
    request = _restart()

    answer = _carry_out(agent, bus, request)

    name = bundle_object_name("gemma-a", request.command_id)
    assert (answer.action, answer.status, answer.bundle) == ("restart", "completed", name)
    assert f"debug bundle {store.location(name)}" in answer.detail
    assert stand_in.restarts == 1 and stand_in.starts[1].pid != old_pid
    bundle = json.loads(store.get(name))
    assert bundle["reason"] == "before restart: STALLED: frozen"
    assert bundle["container"]["pid"] == old_pid, "captured from the process the restart replaced"
    (process,) = [p for p in bundle["processes"] if p["pid"] == old_pid]
    assert any(frame["function"] == "<module>" for thread in process["threads"] for frame in thread["frames"])
    assert any("engine log with key" in line for line in bundle["log_tail"])
    assert API_KEY not in store.get(name).decode()


def test_a_debug_task_keeps_a_bundle_without_restarting(
    bus: LocalBus, tmp_path: Path, engine: DockerEngineContainer, stand_in: StandIn
) -> None:
    store = DirectoryBundles(tmp_path / "bundles")
    agent = _agent(bus, tmp_path, engine, store)
    request = CaptureDebugBundle(
        command_id=new_command_id(), issued_at=datetime.now(UTC), deployment_id="gemma-a", reason="a user asked"
    )

    answer = _carry_out(agent, bus, request)

    assert (answer.action, answer.status) == ("debug", "completed")
    assert answer.bundle == bundle_object_name("gemma-a", request.command_id)
    assert json.loads(store.get(answer.bundle))["reason"] == "a user asked"
    assert stand_in.restarts == 0


@pytest.mark.parametrize("store", [None, RefusingBundles()], ids=["no bucket", "write refused"])
def test_a_bundle_that_cannot_be_kept_never_stops_the_restart(
    bus: LocalBus, tmp_path: Path, engine: DockerEngineContainer, stand_in: StandIn, store: object | None
) -> None:
    agent = _agent(bus, tmp_path, engine, store)

    answer = _carry_out(agent, bus, _restart())

    assert (answer.status, answer.bundle) == ("completed", "")
    assert "no debug bundle kept" in answer.detail
    assert stand_in.restarts == 1
    if isinstance(store, RefusingBundles):
        assert store.attempts == 1 and "roles/storage.objectCreator" in answer.detail

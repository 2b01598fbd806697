"""One restart, one trace: a ``tpuctl`` command's span, the function that handles the command (``shared.entry`` with
the real ``NodeTasks`` service), the node agent that restarts the container (the Docker Engine API stand-in) and
the function that takes its answer, joined by the ``traceparent`` attribute the bus adapters add to every publish.
Spans are exported by the file exporter (``TPUCTL_TRACE_EXPORT=file:...``) and read back from the file."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from shared.adapters.clock import SystemClock
from shared.adapters.local_bus import LocalBus
from shared.adapters.sqlite_store import SqliteStateStore
from shared.domain.models import DeploymentRecord, DeploymentSpec, DeploymentStatus, Phase
from shared.entry import PubSubPayload, handle_payload
from shared.messages import RestartServing, encode_message, message_attributes, new_command_id
from shared.ports import Delivery
from shared.services.node_tasks import NodeTasks, NodeTaskSettings
from shared.tracing import TRACEPARENT, configure_tracing, delivery_span, traced, with_trace_context
from tests.adapters.test_node_agent import EVENTS, NODE_TASKS, TaskAgentFactory, _bus, stand_in, task_agent
from tests.support.builders import spec_dict
from tests.support.serving_container import StandIn

__all__ = ["stand_in", "task_agent"]  # fixtures used by name below

COMMANDS = "tpuctl-commands"
_SPANS: dict[str, Path] = {}


@pytest.fixture(scope="module")
def spans_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The process's one tracer provider writes here (a provider is installed once per process)."""
    path = _SPANS.setdefault("path", tmp_path_factory.mktemp("traces") / "spans.jsonl")
    configure_tracing(f"file:{path}", "tpuctl-test")
    return path


def _spans(path: Path, trace_id: str) -> list[dict[str, Any]]:
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    return [span for span in map(json.loads, lines) if span["trace_id"] == trace_id]


def _pull_one(bus: LocalBus, subscription: str) -> Delivery:
    seen: list[Delivery] = []
    bus.pull(subscription, seen.append, max_messages=10, timeout_s=0)
    assert len(seen) == 1, seen
    return seen[0]


def _payload(delivery: Delivery, topic: str) -> PubSubPayload:
    return PubSubPayload(
        data=delivery.data,
        message_id=delivery.message_id,
        attributes=delivery.attributes,
        publish_time=delivery.publish_time,
        source=f"//pubsub.googleapis.com/projects/p/topics/{topic}",
    )


@pytest.fixture
def plant(tmp_path: Path) -> Iterator[tuple[LocalBus, SqliteStateStore, NodeTasks]]:
    bus = _bus(tmp_path / "bus.sqlite")
    bus.ensure_topic(COMMANDS)
    bus.ensure_subscription(COMMANDS, "benchmark-commands")
    store = SqliteStateStore(tmp_path / "state.sqlite")
    now = datetime.now(UTC)
    spec = DeploymentSpec.model_validate(spec_dict("gemma-a"))
    record = DeploymentRecord(
        deployment_id="gemma-a", spec=spec, status=DeploymentStatus(phase=Phase.SERVING), created_at=now, updated_at=now
    )
    store.put_deployment(record, expected_version=None)
    service = NodeTasks(store, bus, SystemClock(), NodeTaskSettings(topic_node_tasks=NODE_TASKS))
    try:
        yield bus, store, service
    finally:
        bus.close()
        store.close()


def test_a_restart_is_one_trace_from_the_command_to_the_node_and_back(
    spans_file: Path,
    plant: tuple[LocalBus, SqliteStateStore, NodeTasks],
    task_agent: TaskAgentFactory,
    stand_in: StandIn,
    tmp_path: Path,
) -> None:
    bus, store, service = plant
    request = RestartServing(
        command_id=new_command_id(), issued_at=datetime.now(UTC), deployment_id="gemma-a", reason="wedged"
    )
    with traced("tpuctl restart") as root:
        bus.publish(COMMANDS, encode_message(request), message_attributes(request), ordering_key="gemma-a")
    trace_id = f"{root.get_span_context().trace_id:032x}"

    command = _pull_one(bus, "benchmark-commands")
    assert command.attributes[TRACEPARENT].split("-")[1] == trace_id, "the publish carried the command's trace"
    handled = handle_payload(
        _payload(command, COMMANDS), service.handle, store=store, clock=SystemClock(), max_age_s=600
    )
    assert handled.outcome.value == "applied", handled

    agent = task_agent(bus, tmp_path / "node", "http://127.0.0.1:9", stand_in.docker_host)
    agent.start()
    assert agent.poll_once(timeout_s=1) == 1 and agent.handle_tasks() == 1 and stand_in.restarts == 1
    assert agent.publish_pending_tasks() == 1
    events: list[Delivery] = []
    bus.pull("test-events", events.append, max_messages=10, timeout_s=0)
    [answer] = [e for e in events if e.attributes.get("kind") == "node.task_completed"]  # beside node.booted
    answered = handle_payload(_payload(answer, EVENTS), service.handle, store=store, clock=SystemClock(), max_age_s=600)
    assert answered.outcome.value == "applied", answered

    spans = {span["name"]: span for span in _spans(spans_file, trace_id)}
    assert set(spans) >= {
        "tpuctl restart",
        "handle serving.restart",
        "node-agent restart",
        "handle node.task_completed",
    }
    assert spans["handle serving.restart"]["parent_span_id"] == spans["tpuctl restart"]["span_id"]
    assert spans["node-agent restart"]["parent_span_id"] == spans["handle serving.restart"]["span_id"]
    assert spans["handle node.task_completed"]["parent_span_id"] == spans["node-agent restart"]["span_id"]
    assert spans["handle serving.restart"]["attributes"]["deployment_id"] == "gemma-a"
    assert spans["handle serving.restart"]["kind"] == "CONSUMER"


def test_a_malformed_or_missing_traceparent_starts_a_new_trace_and_nothing_else(spans_file: Path) -> None:
    for hostile in ({TRACEPARENT: "00-zzzz-not-a-trace-01"}, {TRACEPARENT: "x" * 5000}, {}):
        with delivery_span("handle node.booted", hostile) as span:
            context = span.get_span_context()
            assert context.is_valid and span.parent is None, hostile
            assert with_trace_context({"kind": "x"})[TRACEPARENT].split("-")[1] == f"{context.trace_id:032x}"


def test_without_a_span_a_publish_carries_no_trace_context() -> None:
    assert with_trace_context({"kind": "deployment.create"}) == {"kind": "deployment.create"}


def test_an_unknown_export_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="none, stdout, file:<path> or cloud-trace"):
        configure_tracing("jaeger", "tpuctl-test")

"""The benchmark function handles node tasks: real CloudEvents in, requests on the node-tasks topic, answers kept."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cloudevents.conversion import to_binary, to_structured
from cloudevents.http import CloudEvent
from functions_framework import create_app

from shared.config import get_settings
from shared.domain.models import DeploymentRecord, DeploymentSpec, DeploymentStatus, Phase
from shared.domain.node_seal import EVENT_SEAL_ATTRIBUTE, SEALED_KINDS, seal
from shared.messages import TailServingLogs, decode_message, new_command_id
from shared.messages.routing import TOPIC_KINDS
from shared.ports import Delivery
from shared.wiring import runtime
from tests.support.builders import command_dict, spec_dict

ROOT = Path(__file__).resolve().parents[2]


def _topic_of(body: Any) -> str:
    """The topic a message of this kind travels on (what the push path of its subscription names)."""
    kind = body.get("kind") if isinstance(body, dict) else None
    logical = next((topic for topic, kinds in TOPIC_KINDS.items() if kind in kinds), "commands")
    return f"tpuctl-{logical}"


NODE_SUBSCRIPTION = "test-node-gemma-a"


def _seal(body: dict[str, Any], raw: bytes) -> dict[str, str]:
    """What the deployment's node agent attaches to its events (shared/domain/node_seal.py)."""
    if body["kind"] not in SEALED_KINDS:
        return {}
    key = runtime().event_seals.event_key(body["deployment_id"], create=True)
    return {EVENT_SEAL_ATTRIBUTE: seal(key, raw)}


def _event(body: dict[str, Any], message_id: str) -> CloudEvent:
    attributes = {
        "type": "google.cloud.pubsub.topic.v1.messagePublished",
        "source": f"//pubsub.googleapis.com/projects/demo-tpuctl/topics/{_topic_of(body)}",
        "id": message_id,
    }
    raw = json.dumps(body).encode()
    data = base64.b64encode(raw).decode()
    message = {"data": data, "messageId": message_id, "attributes": {"kind": body["kind"], **_seal(body, raw)}}
    return CloudEvent(attributes, {"message": message, "subscription": "projects/demo-tpuctl/subscriptions/s"})


@pytest.fixture
def local_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("TPUCTL_BACKEND", "local")
    monkeypatch.setenv("TPUCTL_DATA_DIR", str(tmp_path))
    get_settings.cache_clear()
    runtime.cache_clear()
    rt = runtime()
    rt.bus.ensure_topic(rt.settings.topic_node_tasks)
    rt.bus.ensure_subscription(
        rt.settings.topic_node_tasks, NODE_SUBSCRIPTION, filter='attributes.deployment_id = "gemma-a"'
    )
    yield tmp_path
    runtime().close()
    get_settings.cache_clear()
    runtime.cache_clear()


def _deploy(phase: Phase) -> None:
    rt = runtime()
    now = rt.clock.now()
    record = DeploymentRecord(
        deployment_id="gemma-a",
        spec=DeploymentSpec.model_validate(spec_dict("gemma-a")),
        status=DeploymentStatus(phase=phase),
        created_at=now,
        updated_at=now,
    )
    rt.store.put_deployment(record, expected_version=None)


def _post(client: Any, body: dict[str, Any], message_id: str, *, binary: bool = False) -> int:
    headers, data = (to_binary if binary else to_structured)(_event(body, message_id))
    return int(client.post("/", headers=headers, data=data).status_code)


def _dispatched() -> list[Any]:
    seen: list[Delivery] = []
    runtime().bus.pull(NODE_SUBSCRIPTION, seen.append, max_messages=10, timeout_s=0)
    return [decode_message(delivery.data) for delivery in seen]


def _client() -> Any:
    source = str(ROOT / "functions" / "benchmark" / "main.py")
    return create_app(target="benchmark", source=source, signature_type="cloudevent").test_client()


def test_a_log_tail_reaches_the_node_and_its_answer_is_stored(local_env: Path) -> None:
    _deploy(Phase.SERVING)
    client = _client()
    now = runtime().clock.now().isoformat()
    request = command_dict("serving.logs", issued_at=now, lines=20)

    assert _post(client, request, "m-1") == 200
    assert _post(client, request, "m-2", binary=True) == 200  # a redelivery

    (dispatched,) = _dispatched()
    assert isinstance(dispatched, TailServingLogs) and dispatched.command_id == request["command_id"]
    answer = command_dict(
        "node.task_completed",
        issued_at=now,
        task_id=request["command_id"],
        action="logs",
        status="completed",
        detail="20 lines",
        lines=["INFO: Started server process", "INFO: Application startup complete."],
    )
    assert _post(client, answer, "e-1") == 200
    task = runtime().store.get_node_task(request["command_id"])
    assert task is not None and task.status == "completed"
    assert task.lines == ("INFO: Started server process", "INFO: Application startup complete.")


def test_a_restart_of_a_stopped_deployment_is_acked_and_stored_failed(local_env: Path) -> None:
    _deploy(Phase.STOPPED)
    request = command_dict("serving.restart", issued_at=runtime().clock.now().isoformat(), reason="user_request")

    assert _post(_client(), request, "m-1") == 200

    assert _dispatched() == []
    task = runtime().store.get_node_task(request["command_id"])
    assert task is not None and task.status == "failed" and "STOPPED" in task.detail
    ledger = runtime().store.get_command(request["command_id"])
    assert ledger is not None and ledger.status == "failed"


def test_benchmark_messages_still_reach_the_benchmarker(local_env: Path) -> None:
    _deploy(Phase.SERVING)
    booted = command_dict(
        "node.booted", command_id=new_command_id(), issued_at=runtime().clock.now().isoformat(), node="n-1"
    )
    assert _post(_client(), booted, "b-1") == 200
    record = runtime().store.get_deployment("gemma-a")
    assert record is not None and record.status.node_system == {"node": "n-1"}

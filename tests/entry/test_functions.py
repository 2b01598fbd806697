"""The Cloud Function entry points under functions-framework, fed real Pub/Sub CloudEvents."""

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
from shared.messages import new_command_id
from shared.messages.routing import TOPIC_KINDS
from shared.wiring import runtime
from tests.support.builders import command_dict
from tests.support.fixtures_tpu_sim import TpuSimHandle

ROOT = Path(__file__).resolve().parents[2]


def _topic_of(body: Any) -> str:
    """The topic a message of this kind travels on (what the push path of its subscription names)."""
    kind = body.get("kind") if isinstance(body, dict) else None
    logical = next((topic for topic, kinds in TOPIC_KINDS.items() if kind in kinds), "commands")
    return f"tpuctl-{logical}"


def _event(body: dict[str, Any] | bytes, message_id: str = "1") -> CloudEvent:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    attributes = {
        "type": "google.cloud.pubsub.topic.v1.messagePublished",
        "source": f"//pubsub.googleapis.com/projects/demo-tpuctl/topics/{_topic_of(body)}",
        "id": message_id,
    }
    message = {"data": base64.b64encode(raw).decode(), "messageId": message_id, "attributes": {}}
    return CloudEvent(attributes, {"message": message, "subscription": "projects/demo-tpuctl/subscriptions/s"})


def _now_iso() -> str:
    return runtime().clock.now().isoformat()


@pytest.fixture
def local_env(tmp_path: Path, tpu_sim: TpuSimHandle, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("TPUCTL_BACKEND", "local")
    monkeypatch.setenv("TPUCTL_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("TPUCTL_PROJECT", tpu_sim.project)
    monkeypatch.setenv("TPUCTL_TPU_ENDPOINT", tpu_sim.base_url)
    get_settings.cache_clear()
    runtime.cache_clear()
    yield tmp_path
    runtime().close()
    get_settings.cache_clear()
    runtime.cache_clear()


def _client(name: str) -> Any:
    return create_app(target=name, source=str(ROOT / "functions" / name / "main.py"), signature_type="cloudevent")


def test_a_create_command_is_stored_once_even_when_delivered_twice(local_env: Path) -> None:
    client = _client("provision").test_client()
    body = command_dict(issued_at=_now_iso(), spec={**command_dict()["spec"], "zones": ["us-east5-b"]})
    headers, data = to_structured(_event(body, "m-1"))
    assert client.post("/", headers=headers, data=data).status_code == 200
    headers, data = to_binary(_event(body, "m-2"))
    assert client.post("/", headers=headers, data=data).status_code == 200
    store = runtime().store
    (record,) = store.list_deployments()
    assert record.deployment_id == "gemma-a"
    assert record.generation == 1
    command = store.get_command(body["command_id"])
    assert command is not None and command.status == "applied"


def test_a_poison_message_is_acked_and_recorded(local_env: Path) -> None:
    client = _client("provision").test_client()
    headers, data = to_structured(_event(b'{"kind": "deployment.create", "spec": 7}', "poison"))
    assert client.post("/", headers=headers, data=data).status_code == 200
    (rejected,) = runtime().store.list_rejections()
    assert rejected.message_id == "poison"
    assert runtime().store.list_deployments() == []


def test_a_raw_pubsub_push_reaches_the_function_and_a_tick_reconciles(local_env: Path, tpu_sim: TpuSimHandle) -> None:
    client = _client("provision").test_client()
    body = command_dict(issued_at=_now_iso(), spec={**command_dict()["spec"], "zones": ["us-east5-b"]})
    encoded = base64.b64encode(json.dumps(body).encode()).decode()
    push = {  # the body the Pub/Sub emulator POSTs to a push endpoint (docs/reference/gcp-local.md §3.2)
        "subscription": "projects/demo-tpuctl/subscriptions/push-sub",
        "message": {"data": encoded, "attributes": {}, "messageId": "2", "publishTime": _now_iso()},
    }
    response = client.post("/projects/demo-tpuctl/topics/tpuctl-commands", json=push)
    assert response.status_code == 200
    tick = command_dict("reconcile.tick", command_id=new_command_id())
    headers, data = to_structured(_event(tick, "t-1"))
    assert client.post("/", headers=headers, data=data).status_code == 200
    record = runtime().store.get_deployment("gemma-a")
    assert record is not None
    assert record.status.resources, "the tick should have asked the simulator for capacity"
    assert {r.zone for r in record.status.resources} == {"us-east5-b"}


def test_the_monitor_ignores_what_is_not_a_monitor_tick(local_env: Path) -> None:
    client = _client("monitor").test_client()
    headers, data = to_structured(_event(command_dict(issued_at=_now_iso()), "c-1"))
    assert client.post("/", headers=headers, data=data).status_code == 200
    assert runtime().store.list_deployments() == []

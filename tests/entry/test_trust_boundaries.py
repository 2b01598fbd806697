"""Holes at the controller's boundary, reproduced against the real function entries and now refused.

Each delivery is the raw push body Pub/Sub POSTs to ``/projects/P/topics/T`` (the push path Terraform sets per
trigger), so the function knows the topic from Pub/Sub, not from anything the publisher wrote.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from functions_framework import create_app

from shared.config import get_settings
from shared.domain.models import DeploymentRecord, DeploymentSpec, DeploymentStatus, Phase
from shared.domain.node_seal import EVENT_SEAL_ATTRIBUTE, seal
from shared.messages import SCHEDULED_JOB_ATTRIBUTE, new_command_id
from shared.wiring import runtime
from tests.support.builders import command_dict, spec_dict
from tests.support.fixtures_tpu_sim import TpuSimHandle

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "demo-tpuctl"
NODE_SUBSCRIPTION = "test-node-victim"


@pytest.fixture
def local_env(tmp_path: Path, tpu_sim: TpuSimHandle, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("TPUCTL_BACKEND", "local")
    monkeypatch.setenv("TPUCTL_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("TPUCTL_PROJECT", tpu_sim.project)
    monkeypatch.setenv("TPUCTL_TPU_ENDPOINT", tpu_sim.base_url)
    get_settings.cache_clear()
    runtime.cache_clear()
    rt = runtime()
    rt.bus.ensure_topic(rt.settings.topic_node_tasks)
    rt.bus.ensure_subscription(
        rt.settings.topic_node_tasks, NODE_SUBSCRIPTION, filter='attributes.deployment_id = "victim"'
    )
    yield tmp_path
    runtime().close()
    get_settings.cache_clear()
    runtime.cache_clear()


def _client(name: str) -> Any:
    return create_app(target=name, source=str(ROOT / "functions" / name / "main.py"), signature_type="cloudevent")


def _push(
    name: str,
    topic: str,
    body: dict[str, Any] | None,
    *,
    message_id: str = "m-1",
    attributes: dict[str, str] | None = None,
    published: str | None = None,
) -> int:
    """POST one Pub/Sub push delivery of ``body`` (None: an attribute-only message) from ``topic``."""
    message: dict[str, Any] = {
        "messageId": message_id,
        "publishTime": published or runtime().clock.now().isoformat().replace("+00:00", "Z"),
        "attributes": {"kind": body["kind"]} if body and attributes is None else (attributes or {}),
    }
    if body is not None:
        message["data"] = base64.b64encode(json.dumps(body).encode()).decode()
    push = {"subscription": f"projects/{PROJECT}/subscriptions/tpuctl-{name}-x", "message": message}
    response = _client(name).test_client().post(f"/projects/{PROJECT}/topics/tpuctl-{topic}", json=push)
    return int(response.status_code)


def _serving(deployment_id: str) -> None:
    rt = runtime()
    now = rt.clock.now()
    rt.store.put_deployment(
        DeploymentRecord(
            deployment_id=deployment_id,
            spec=DeploymentSpec.model_validate(spec_dict(deployment_id)),
            status=DeploymentStatus(phase=Phase.SERVING),
            created_at=now,
            updated_at=now,
        ),
        expected_version=None,
    )


def _now() -> str:
    return runtime().clock.now().isoformat()


def _nothing_dispatched() -> bool:
    seen: list[Any] = []
    runtime().bus.pull(NODE_SUBSCRIPTION, seen.append, max_messages=10, timeout_s=0)
    return seen == []


def test_a_vm_cannot_restart_another_deployment_by_posting_the_command_as_an_event(local_env: Path) -> None:
    _serving("victim")
    restart = command_dict("serving.restart", "victim", issued_at=_now(), reason="injected")
    assert _push("benchmark", "events", restart) == 200
    rt = runtime()
    assert rt.store.get_command(restart["command_id"]) is None, "not even recorded as a command"
    assert rt.store.list_node_tasks("victim") == []
    assert _nothing_dispatched()
    (rejected,) = rt.store.list_rejections()
    assert rejected.field == "kind" and "events topic" in rejected.reason
    assert rejected.source.endswith("/topics/tpuctl-events")


def test_a_vm_cannot_create_a_scheduler_job_by_posting_a_schedule_as_an_event(local_env: Path) -> None:
    _serving("victim")
    benchmark = {"concurrency": [1024, 1024, 1024], "num_prompts": 10_000}
    schedule = command_dict("benchmark.schedule", "victim", issued_at=_now(), cron="* * * * *", benchmark=benchmark)
    assert _push("benchmark", "events", schedule) == 200
    assert runtime().scheduler.list_jobs() == []
    assert runtime().store.get_command(schedule["command_id"]) is None
    assert [r.field for r in runtime().store.list_rejections()] == ["kind"]


def test_the_same_schedule_on_the_commands_topic_still_works(local_env: Path) -> None:
    _serving("victim")
    schedule = command_dict("benchmark.schedule", "victim", issued_at=_now(), cron="0 3 * * *")
    assert _push("benchmark", "commands", schedule) == 200
    assert [job.schedule for job in runtime().scheduler.list_jobs()] == ["0 3 * * *"]


def test_a_delivery_from_a_topic_that_does_not_trigger_the_function_is_refused(local_env: Path) -> None:
    create = command_dict(issued_at=_now(), spec={**spec_dict("gemma-a"), "zones": ["us-east5-b"]})
    assert _push("provision", "node-tasks", create) == 200
    assert runtime().store.list_deployments() == []
    assert [r.field for r in runtime().store.list_rejections()] == ["topic"]


def test_an_attribute_only_message_is_recorded_and_acked_not_redelivered(local_env: Path) -> None:
    assert _push("benchmark", "events", None, message_id="attrs-only", attributes={"kind": "node.booted"}) == 204
    (rejected,) = runtime().store.list_rejections()
    assert rejected.message_id == "attrs-only" and rejected.field == "<message>"


def test_a_kind_attribute_that_contradicts_the_body_is_refused(local_env: Path) -> None:
    delete = command_dict("deployment.delete", "victim", issued_at=_now())
    assert _push("benchmark", "commands", delete, attributes={"kind": "benchmark.run"}) == 200
    assert runtime().store.get_command(delete["command_id"]) is None
    assert [r.field for r in runtime().store.list_rejections()] == ["attributes.kind"]


def test_the_scheduled_job_attribute_cannot_rename_another_command(local_env: Path) -> None:
    delete = command_dict("deployment.delete", "victim", issued_at=_now())
    assert (
        _push("provision", "commands", delete, attributes={"kind": "deployment.delete", SCHEDULED_JOB_ATTRIBUTE: "j"})
        == 200
    )
    assert runtime().store.get_command(delete["command_id"]) is None
    assert [r.field for r in runtime().store.list_rejections()] == [f"attributes.{SCHEDULED_JOB_ATTRIBUTE}"]


def test_a_reused_command_id_of_another_kind_is_refused_not_taken_for_a_duplicate(local_env: Path) -> None:
    _serving("victim")
    first = command_dict("serving.logs", "victim", issued_at=_now(), lines=10)
    assert _push("benchmark", "commands", first, message_id="a") == 200
    second = command_dict("serving.restart", "victim", issued_at=_now(), command_id=first["command_id"])
    assert _push("benchmark", "commands", second, message_id="b") == 200
    stored = runtime().store.get_command(first["command_id"])
    assert stored is not None and stored.kind == "serving.logs" and stored.status == "applied"
    (rejected,) = runtime().store.list_rejections()
    assert rejected.message_id == "b" and rejected.field == "command_id" and "serving.logs" in rejected.reason
    assert [task.action for task in runtime().store.list_node_tasks("victim")] == ["logs"]


def test_a_command_from_a_slow_workstation_clock_is_aged_by_its_publish_time(local_env: Path) -> None:
    slow = (runtime().clock.now() - timedelta(minutes=61)).isoformat()
    create = command_dict(issued_at=slow, spec={**spec_dict("gemma-a"), "zones": ["us-east5-b"]})
    assert _push("provision", "commands", create) == 200
    stored = runtime().store.get_command(create["command_id"])
    assert stored is not None and stored.status == "applied"
    assert runtime().store.get_deployment("gemma-a") is not None


def test_a_command_issued_in_the_year_9999_is_refused_by_name(local_env: Path) -> None:
    create = command_dict(issued_at="9999-01-01T00:00:00Z", spec=spec_dict("gemma-a"))
    assert _push("provision", "commands", create) == 200
    assert runtime().store.get_command(create["command_id"]) is None
    (rejected,) = runtime().store.list_rejections()
    assert rejected.field == "issued_at" and "clock" in rejected.reason


def test_a_command_published_long_ago_is_dropped_whatever_its_issued_at_says(local_env: Path) -> None:
    now = runtime().clock.now()
    published = (now - timedelta(hours=3)).isoformat().replace("+00:00", "Z")
    create = command_dict(issued_at=(now - timedelta(hours=3)).isoformat(), spec=spec_dict("gemma-a"))
    assert _push("provision", "commands", create, published=published) == 200
    assert runtime().store.list_deployments() == []
    assert runtime().store.get_command(create["command_id"]) is None


def test_permission_denied_on_every_tpu_call_ends_the_create_as_failed_instead_of_retrying(
    local_env: Path, tpu_sim: TpuSimHandle
) -> None:
    tpu_sim.world.inject_fault({"endpoint": "*", "status": 403, "times": 1000, "message": "caller lacks tpu.nodes"})
    create = command_dict(
        issued_at=_now(), command_id=new_command_id(), spec={**spec_dict("gemma-a"), "zones": ["us-east5-b"]}
    )
    assert _push("provision", "commands", create) == 200, "acked: a redelivery would meet the same refusal"
    stored = runtime().store.get_command(create["command_id"])
    assert stored is not None and stored.status == "failed"
    assert "caller lacks tpu.nodes" in stored.outcome, "the record says why"


def _booted(deployment_id: str) -> dict[str, Any]:
    return command_dict("node.booted", deployment_id, issued_at=_now(), node="n-1", system={"python": "3.11"})


def _sealed_push(body: dict[str, Any], key_of: str, message_id: str = "e-1") -> int:
    """Publish ``body`` on the events topic as the VMs of ``key_of`` would: sealed with their event key."""
    raw = json.dumps(body).encode()
    key = runtime().event_seals.event_key(key_of, create=True)
    attributes = {"kind": body["kind"], EVENT_SEAL_ATTRIBUTE: seal(key, raw)}
    return _push("benchmark", "events", body, message_id=message_id, attributes=attributes)


def test_a_vm_speaks_for_its_own_deployment(local_env: Path) -> None:
    _serving("victim")
    assert _sealed_push(_booted("victim"), key_of="victim") == 200
    record = runtime().store.get_deployment("victim")
    assert record is not None and record.status.node_system.get("node") == "n-1"


def test_a_vm_cannot_report_for_another_deployment(local_env: Path) -> None:
    _serving("victim")
    _serving("attacker")
    assert _sealed_push(_booted("victim"), key_of="attacker") == 200
    record = runtime().store.get_deployment("victim")
    assert record is not None and not record.status.node_system, "nothing written"
    (rejected,) = runtime().store.list_rejections()
    assert rejected.field == f"attributes.{EVENT_SEAL_ATTRIBUTE}" and "victim" in rejected.reason


def test_an_unsealed_node_event_is_refused(local_env: Path) -> None:
    _serving("victim")
    runtime().event_seals.event_key("victim", create=True)
    assert _push("benchmark", "events", _booted("victim")) == 200
    record = runtime().store.get_deployment("victim")
    assert record is not None and not record.status.node_system
    assert [r.field for r in runtime().store.list_rejections()] == [f"attributes.{EVENT_SEAL_ATTRIBUTE}"]


def test_a_forged_result_for_another_deployment_is_refused(local_env: Path) -> None:
    _serving("victim")
    forged = command_dict(
        "benchmark.completed", "victim", issued_at=_now(), run_id=new_command_id(), status="completed", result={}
    )
    assert _sealed_push(forged, key_of="attacker") == 200
    assert runtime().store.get_benchmark_run(forged["run_id"]) is None

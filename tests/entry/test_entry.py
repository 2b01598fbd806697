"""From a delivery to ack or retry: duplicates, poison, stale and failing commands."""

from __future__ import annotations

import base64
import json
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.adapters.clock import ManualClock
from shared.adapters.sqlite_store import SqliteStateStore
from shared.domain.errors import PermanentError, TransientError
from shared.entry import Outcome, PubSubPayload, handle_payload, payload_from_cloud_event
from shared.messages.routing import Trigger
from tests.support.builders import ISSUED_AT, command_bytes, command_dict

COMMANDS = "//pubsub.googleapis.com/projects/demo-proj/topics/tpuctl-commands"


class CountingHandler:
    """Records the command ids it applied; can be told to fail."""

    def __init__(self, fail_with: Exception | None = None, gate: threading.Event | None = None) -> None:
        self.applied: list[str] = []
        self.fail_with = fail_with
        self.gate = gate
        self._lock = threading.Lock()

    def __call__(self, message: Any) -> str:
        if self.gate is not None:
            self.gate.wait(5)
        if self.fail_with is not None:
            raise self.fail_with
        with self._lock:
            self.applied.append(message.command_id)
        return f"did {message.kind}"


@pytest.fixture
def store(tmp_path: Path) -> SqliteStateStore:
    return SqliteStateStore(tmp_path / "state.sqlite")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(ISSUED_AT + timedelta(seconds=5))


def _deliver(raw: bytes, handler: Any, store: SqliteStateStore, clock: ManualClock, **kwargs: Any) -> Any:
    payload = PubSubPayload(
        data=raw,
        message_id=kwargs.pop("message_id", "m-1"),
        publish_time=kwargs.pop("at", None),
        attributes=kwargs.pop("attributes", {}),
        source=kwargs.pop("source", ""),
    )
    return handle_payload(payload, handler, store=store, clock=clock, max_age_s=3600, **kwargs)


def test_a_command_delivered_twice_has_one_record_and_one_effect(store: SqliteStateStore, clock: ManualClock) -> None:
    handler = CountingHandler()
    raw = command_bytes()
    first = _deliver(raw, handler, store, clock)
    second = _deliver(raw, handler, store, clock, message_id="m-2")
    assert (first.outcome, second.outcome) == (Outcome.APPLIED, Outcome.DUPLICATE)
    assert second.detail == "did deployment.create"
    assert len(handler.applied) == 1
    stored = store.get_command(handler.applied[0])
    assert stored is not None and stored.status == "applied"


def test_the_same_command_from_two_threads_has_one_effect(store: SqliteStateStore, clock: ManualClock) -> None:
    gate = threading.Event()
    handler = CountingHandler(gate=gate)
    raw = command_bytes()
    outcomes: list[str] = []

    def deliver() -> None:
        try:
            outcomes.append(_deliver(raw, handler, store, clock).outcome.value)
        except TransientError:
            outcomes.append("retry")

    threads = [threading.Thread(target=deliver) for _ in range(2)]
    for thread in threads:
        thread.start()
    gate.set()
    for thread in threads:
        thread.join(10)
    assert sorted(outcomes) in (["applied", "retry"], ["applied", "duplicate"])
    assert len(handler.applied) == 1
    # The redelivery the platform makes after "retry" is a duplicate with no effect.
    assert _deliver(raw, handler, store, clock).outcome is Outcome.DUPLICATE
    assert len(handler.applied) == 1


def test_a_poison_message_is_acked_and_stored_as_rejected_and_nothing_else(
    store: SqliteStateStore, clock: ManualClock
) -> None:
    body = command_dict()
    body["spec"]["accelerator"] = "v7-1000"
    handler = CountingHandler()
    result = _deliver(json.dumps(body).encode(), handler, store, clock, message_id="poison-1")
    assert result.outcome is Outcome.REJECTED
    assert "spec.accelerator" in result.detail
    (rejected,) = store.list_rejections()
    assert (rejected.message_id, rejected.field) == ("poison-1", "spec.accelerator")
    assert store.get_command(body["command_id"]) is None
    assert handler.applied == []


def test_a_command_older_than_the_limit_is_dropped(store: SqliteStateStore, clock: ManualClock) -> None:
    clock.advance(7200)
    handler = CountingHandler()
    raw = command_bytes()
    assert _deliver(raw, handler, store, clock).outcome is Outcome.DROPPED
    assert handler.applied == []
    assert store.get_command(json.loads(raw)["command_id"]) is None


def test_a_permanent_failure_is_acked_recorded_and_not_repeated(store: SqliteStateStore, clock: ManualClock) -> None:
    raw = command_bytes("deployment.delete")
    failing = CountingHandler(fail_with=PermanentError("no such deployment"))
    assert _deliver(raw, failing, store, clock).outcome is Outcome.FAILED
    healthy = CountingHandler()
    again = _deliver(raw, healthy, store, clock)
    assert (again.outcome, again.detail) == (Outcome.DUPLICATE, "no such deployment")
    assert healthy.applied == []


def test_a_transient_failure_raises_and_a_later_redelivery_applies(store: SqliteStateStore, clock: ManualClock) -> None:
    raw = command_bytes("deployment.stop")
    with pytest.raises(TransientError):
        _deliver(raw, CountingHandler(fail_with=TransientError("api down")), store, clock)
    # Within the claim window a redelivery waits: the first attempt may still be running.
    with pytest.raises(TransientError, match="still being handled"):
        _deliver(raw, CountingHandler(), store, clock, claim_s=600)
    clock.advance(601)
    handler = CountingHandler()
    assert _deliver(raw, handler, store, clock, claim_s=600).outcome is Outcome.APPLIED
    assert len(handler.applied) == 1


def test_ticks_skip_the_ledger_and_age_by_publish_time(store: SqliteStateStore, clock: ManualClock) -> None:
    raw = command_bytes("reconcile.tick")  # Scheduler publishes the same body every minute
    clock.advance(86400)
    handler = CountingHandler()
    for _ in range(3):
        result = _deliver(raw, handler, store, clock, at=clock.now() - timedelta(seconds=3))
        assert result.outcome is Outcome.APPLIED
    assert len(handler.applied) == 3
    stale = _deliver(raw, handler, store, clock, at=clock.now() - timedelta(hours=2))
    assert stale.outcome is Outcome.DROPPED


def test_a_kind_this_function_does_not_handle_is_acked_without_effect(
    store: SqliteStateStore, clock: ManualClock
) -> None:
    handler = CountingHandler()
    accept = {"tpuctl-commands": Trigger("commands", frozenset({"deployment.create"}))}
    result = _deliver(command_bytes("benchmark.run"), handler, store, clock, accept=accept, source=COMMANDS)
    assert result.outcome is Outcome.DROPPED
    assert handler.applied == []
    assert store.get_command(json.loads(command_bytes("benchmark.run"))["command_id"]) is None, "nothing recorded"


class _Event(dict[str, Any]):
    def __init__(self, data: Any, **attrs: Any) -> None:
        super().__init__(attrs)
        self.data = data


def test_a_cloud_event_in_either_push_shape_yields_the_payload() -> None:
    body = command_bytes()
    message = {"data": base64.b64encode(body).decode(), "attributes": {"kind": "x"}, "messageId": "42"}
    structured = payload_from_cloud_event(_Event({"message": message, "subscription": "s"}, id="42"))
    raw_push = payload_from_cloud_event(
        _Event({"message": {**message, "publishTime": "2026-12-02T12:00:05Z"}}, id="42", source="//pubsub/x")
    )
    assert structured.data == raw_push.data == body
    assert structured.attributes == {"kind": "x"}
    assert raw_push.publish_time is not None and raw_push.publish_time.tzinfo is not None
    assert payload_from_cloud_event(_Event("not a dict", id="7")).data == b""


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_fuzzed_deliveries_are_rejected_cleanly_and_write_only_a_rejection(
    tmp_path_factory: pytest.TempPathFactory, raw: bytes
) -> None:
    store = SqliteStateStore(tmp_path_factory.mktemp("fuzz") / "s.sqlite")
    clock = ManualClock(ISSUED_AT)
    handler = CountingHandler()
    result = _deliver(raw, handler, store, clock)
    assert result.outcome is Outcome.REJECTED
    assert handler.applied == []
    assert len(store.list_rejections()) == 1
    assert store.list_deployments(include_deleted=True) == []

"""One deploy, one trace: a ``tpuctl deploy`` span, the provision function that applies ``deployment.create``, a later
reconcile tick's pass for the deployment (the tick itself is a trace of its own), the node the pass created (its
``tpuctl-traceparent`` instance metadata), the node agent's boot and the function that takes its ``node.booted``.

The real pieces: the ``LocalBus``, ``shared.entry`` with the real ``Provisioner`` (on the TPU simulator through the real
TPU adapter) and ``Benchmarker``, the node agent. Spans are read back from the file exporter, as in
``test_trace_propagation.py`` (one tracer provider per process, so the same file)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from node_agent.agent import NodeAgent, RunJournal, Target, VllmRunner
from node_agent.boot_trace import read_boot_trace
from shared.adapters.clock import SystemClock
from shared.adapters.local_bus import LocalBus
from shared.domain.models import Phase
from shared.entry import handle_payload
from shared.messages import CreateDeployment, encode_message, message_attributes, new_command_id
from shared.ports import Delivery
from shared.services.benchmarker import Benchmarker
from shared.services.provisioner import reconcile_tick_job
from shared.tracing import TRACEPARENT, TRACEPARENT_METADATA, current_traceparent, traced
from tests.adapters.test_node_agent import _MetadataServer
from tests.adapters.test_trace_propagation import _payload, _pull_one, _spans, spans_file
from tests.service.test_monitor import monitor_world
from tests.support.fixtures_provisioner import HarnessFactory, spot, world
from tests.support.provisioner_harness import Harness, make_spec

__all__ = ["spans_file"]  # fixture used by name below

COMMANDS, TICKS, EVENTS = "tpuctl-commands", "tpuctl-ticks", "tpuctl-events"
ZONE = "us-central1-b"
LEASE = "deployment/gemma"


@pytest.fixture
def plant(harness_factory: HarnessFactory, tmp_path: Path) -> Iterator[tuple[Harness, LocalBus]]:
    h = harness_factory(world({ZONE: spot(8)}))
    bus = LocalBus(tmp_path / "bus.sqlite")
    for topic, subscription in ((COMMANDS, "provision-commands"), (TICKS, "provision-ticks"), (EVENTS, "events")):
        bus.ensure_topic(topic)
        bus.ensure_subscription(topic, subscription)
    try:
        yield h, bus
    finally:
        bus.close()


def _deliver(h: Harness, bus: LocalBus, subscription: str, topic: str, handler: Any) -> str:
    handled = handle_payload(
        _payload(_pull_one(bus, subscription), topic), handler, store=h.store, clock=SystemClock(), max_age_s=600
    )
    assert handled.outcome.value == "applied", handled
    return handled.detail


def _create_and_tick(h: Harness, bus: LocalBus) -> str:
    """``tpuctl deploy``, its command applied while another reconciler holds the lease (so the command's own pass is
    deferred), then one Scheduler tick; returns the deploy's trace id."""
    spec = make_spec(zones=(ZONE,))
    command = CreateDeployment(
        command_id=new_command_id(), issued_at=datetime.now(UTC), deployment_id="gemma", spec=spec
    )
    lease = h.store.acquire_lease(LEASE, "elsewhere", 60, h.clock.now())
    assert lease is not None
    with traced("tpuctl deploy") as root:
        bus.publish(COMMANDS, encode_message(command), message_attributes(command), ordering_key="gemma")
    detail = _deliver(h, bus, "provision-commands", COMMANDS, h.provisioner.handle)
    assert "another reconciler holds the lease" in detail, detail
    h.store.release_lease(LEASE, "elsewhere", lease.epoch)
    job = reconcile_tick_job(TICKS)  # what Cloud Scheduler publishes: no trace context of its own
    bus.publish(TICKS, job.data, job.attributes)
    _deliver(h, bus, "provision-ticks", TICKS, h.provisioner.handle)
    return f"{root.get_span_context().trace_id:032x}"


def _node_metadata(h: Harness) -> tuple[str, dict[str, str]]:
    """The created node's name and instance metadata, once the simulator has made it."""
    [ref] = h.record().status.resources
    for _ in range(30):
        node = h.world.node(ref.zone, ref.name)
        if node is not None:
            return ref.name, dict(node.get("metadata") or {})
        h.world.advance(60)
    raise AssertionError(f"no node {ref.name} after 30 minutes")


def _boot(h: Harness, bus: LocalBus, node: str, boot_trace: str, journal: Path) -> None:
    """The node agent starts (``node.booted``) and the benchmark function takes its report."""
    agent = NodeAgent(
        bus,
        deployment_id="gemma",
        node_name=node,
        journal=RunJournal(journal),
        runner=VllmRunner(Target("http://127.0.0.1:9")),
        clock=SystemClock(),
        events_topic=EVENTS,
        system=lambda: {"cpu_model": "test cpu", "cpus": 2, "accelerator": None},
        boot=lambda: "boot-1",
        boot_trace=boot_trace,
    )
    assert agent.publish_booted()
    _deliver(h, bus, "events", EVENTS, Benchmarker(h.store, bus, SystemClock()).handle)


def test_a_deploy_is_one_trace_from_the_command_to_the_node_s_boot(
    spans_file: Path, plant: tuple[Harness, LocalBus], tmp_path: Path
) -> None:
    h, bus = plant
    trace_id = _create_and_tick(h, bus)
    assert (h.record().traceparent or "").split("-")[1] == trace_id, "the record keeps the command's trace"
    node, metadata = _node_metadata(h)
    assert metadata[TRACEPARENT_METADATA].split("-")[1] == trace_id, "the node is told the pass that made it"
    server = _MetadataServer(metadata)
    try:
        boot_trace = read_boot_trace(server.host)
    finally:
        server.close()
    _boot(h, bus, node, boot_trace, tmp_path / "node")
    assert h.record().status.node_system["node"] == node

    spans = {span["name"]: span for span in _spans(spans_file, trace_id)}
    assert set(spans) >= {"tpuctl deploy", "handle deployment.create", "reconcile", "node-agent boot"}
    assert "handle node.booted" in spans and "handle reconcile.tick" not in spans, "a tick is a trace of its own"
    assert spans["handle deployment.create"]["parent_span_id"] == spans["tpuctl deploy"]["span_id"]
    assert spans["reconcile"]["parent_span_id"] == spans["handle deployment.create"]["span_id"]
    assert spans["node-agent boot"]["parent_span_id"] == spans["reconcile"]["span_id"]
    assert spans["handle node.booted"]["parent_span_id"] == spans["node-agent boot"]["span_id"]
    assert spans["reconcile"]["attributes"]["deployment_id"] == "gemma"
    [tick] = [s for s in _all(spans_file) if s["span_id"] == spans["reconcile"]["links"][0]["span_id"]]
    assert tick["name"] == "handle reconcile.tick" and tick["trace_id"] != trace_id, "linked to the tick's trace"


def test_a_malformed_traceparent_on_the_record_or_from_the_vm_starts_a_trace_and_breaks_nothing(
    spans_file: Path, plant: tuple[Harness, LocalBus], tmp_path: Path
) -> None:
    h, bus = plant
    trace_id = _create_and_tick(h, bus)
    since = time.time_ns()
    record = h.record()
    hostile = record.model_copy(update={"traceparent": "00-zzzz-not-a-trace-01"})
    h.store.put_deployment(hostile, expected_version=record.version)
    job = reconcile_tick_job(TICKS)
    bus.publish(TICKS, job.data, job.attributes)
    _deliver(h, bus, "provision-ticks", TICKS, h.provisioner.handle)
    node, _ = _node_metadata(h)
    _boot(h, bus, node, "00-" + "f" * 32 + "-" + "e" * 16 + "-01\r\nx: y", tmp_path / "node")
    assert h.record().status.node_system["node"] == node, "the boot report was taken"

    names = ("reconcile", "node-agent boot", "handle node.booted")
    mine = [s for s in _all(spans_file) if s["name"] in names and s["start_ns"] >= since]
    assert not [s for s in mine if s["trace_id"] == trace_id], "nothing after the hostile values joins the deploy"
    assert {s["name"] for s in mine} >= {"reconcile", "node-agent boot", "handle node.booted"}
    [reconcile] = [s for s in mine if s["name"] == "reconcile"]
    [tick] = [s for s in _all(spans_file) if s["span_id"] == reconcile["parent_span_id"]]
    assert tick["name"] == "handle reconcile.tick", "a malformed record trace: the pass stays in the tick's trace"
    assert reconcile["links"] == []
    [boot] = [s for s in mine if s["name"] == "node-agent boot"]
    assert boot["parent_span_id"] is None and boot["trace_id"] != "f" * 32, "the VM's malformed trace is ignored"


def _all(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_without_a_traceparent_in_its_metadata_a_node_reads_none() -> None:
    server = _MetadataServer({})
    try:
        assert read_boot_trace(server.host) == ""
    finally:
        server.close()
    assert read_boot_trace("127.0.0.1:9", timeout_s=0.5) == "", "a silent metadata server costs only the link"


def test_the_monitor_s_pass_joins_the_deploy_until_it_serves_then_runs_in_its_tick_linked(
    spans_file: Path, tmp_path: Path
) -> None:
    with traced("handle deployment.create") as command:
        traceparent = current_traceparent()
    trace_id = f"{command.get_span_context().trace_id:032x}"
    with monitor_world(tmp_path) as w:
        record = w.add("gemma")
        w.store.put_deployment(record.model_copy(update={"traceparent": traceparent}), expected_version=record.version)
        since = time.time_ns()
        with traced("handle reconcile.tick") as tick:  # the monitor function's delivery span of a Scheduler tick
            w.tick()
        assert w.record("gemma").status.phase is Phase.SERVING
        changed = [d for d in _drain(w.bus, "events-probe") if d.attributes.get("kind") == "deployment.phase_changed"]
        assert [d.attributes[TRACEPARENT].split("-")[1] for d in changed] == [trace_id], "BOOTING -> SERVING"
        with traced("handle reconcile.tick") as later_tick:
            w.tick()
    monitor = [s for s in _all(spans_file) if s["name"] == "monitor" and s["start_ns"] >= since]
    booting, settled = monitor
    assert booting["trace_id"] == trace_id, "booting: the command's work, linked to the tick"
    assert booting["links"] == [_ids(tick)]
    assert settled["trace_id"] == f"{later_tick.get_span_context().trace_id:032x}", "serving: the tick's own"
    assert settled["links"] == [_ids(command)]


def _drain(bus: LocalBus, subscription: str) -> list[Delivery]:
    seen: list[Delivery] = []
    bus.pull(subscription, seen.append, max_messages=100, timeout_s=0)
    return seen


def _ids(span: Any) -> dict[str, str]:
    context = span.get_span_context()
    return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}

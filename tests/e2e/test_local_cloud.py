"""End to end: the local cloud with the real functions, bus, store and a real vLLM, driven through the gateway.

One story, in order, with the invariants checked at the end (docs/reference/DESIGN.md §6, tier 6):

1. ``deployment.create`` through the gateway core hunts for v6e capacity in ``scarce-v6e`` (two zones, hedged);
2. the node boots a real vLLM (CPU, tiny model): BOOTING, then SERVING; a timed query and a short benchmark run
   through the gateway, and vLLM refuses a request without the API key;
3. the same create is delivered again by the bus (at-least-once): the ledger and the logs show it applied once;
4. a spot preemption mid-serving: the controller re-provisions and the deployment returns to SERVING;
5. ``deployment.delete`` until DELETED with every TPU resource gone;
6. invariants: no orphans, at most one ACTIVE slice per deployment at every sample, every command applied once,
   no secret value in any log, record, node metadata, process argv/env or tool output, spend within budget;
   after ``stop()`` no process the stack started survives.

Skipped, with the reason, when the vLLM CPU tier is not built here (``make vllm-env tiny-model``). Virtual time
runs at 60x, so the hunt takes tens of seconds and the whole test about three minutes on two cores.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from localcloud.demo import DemoSpec, LocalDemo
from localcloud.emulators import EMULATORS, find_emulator
from localcloud.runner import LocalCloud, LocalCloudOptions
from localcloud.vllm_cpu import VllmCpuTier, default_cache_dir
from mcp_client_gateway.composition import build_ports
from mcp_client_gateway.core import GatewayCore
from shared.domain.models import Phase
from shared.messages import CreateDeployment, encode_message, message_attributes

pytestmark = [pytest.mark.slow]

SPEC = DemoSpec(
    deployment_id="e2e-gemma",
    zones=("us-east5-b", "us-east5-a"),
    tiers=("spot",),
    hedge=2,
    valid_until_minutes=None,
    budget_usd=150.0,
)
STEP_TIMEOUT_S = 150.0


@pytest.fixture(scope="module")
def tier() -> VllmCpuTier:
    found = VllmCpuTier(default_cache_dir())
    reason = found.unavailable_reason()
    if reason:
        pytest.skip(f"the local cloud needs the vLLM CPU tier: {reason}")
    return found


@pytest.fixture
def stack(tier: VllmCpuTier, tmp_path: Path) -> Iterator[tuple[LocalCloud, LocalDemo]]:
    cloud = LocalCloud(LocalCloudOptions(data_dir=tmp_path / "cloud", cache_dir=tier.cache_dir, time_scale=60.0))
    transcript: list[str] = []
    try:
        cloud.start()
        gateway = GatewayCore(build_ports(cloud.settings))
        demo = LocalDemo(cloud, gateway, SPEC, emit=transcript.append)
        yield cloud, demo
    finally:
        report = cloud.stop()
        print("\n".join(transcript))
    assert report.survivors == (), f"process groups alive after stop: {report.survivors}"


@pytest.mark.vllm
@pytest.mark.timeout(480)
def test_a_deployment_hunts_serves_survives_preemption_and_tears_down_clean(
    stack: tuple[LocalCloud, LocalDemo],
) -> None:
    cloud, demo = stack
    demo.save_canary_token()
    create_id = demo.deploy()

    demo.wait_until_serving(STEP_TIMEOUT_S)
    record = cloud.store.get_deployment(SPEC.deployment_id)
    assert record is not None and record.status.phase is Phase.SERVING
    assert record.status.zone in SPEC.zones
    assert record.status.endpoint and record.status.endpoint.startswith("http://127.0.0.1:")
    requested = [line for line in demo.tracker.transcript if "requested" in line.text]
    assert len(requested) >= 2, "the hedge keeps two requests outstanding"

    answer = demo.ask(max_tokens=16)
    assert answer.completion_tokens and answer.completion_tokens > 0
    assert answer.ttft_ms is not None and 0 < answer.ttft_ms < answer.total_ms
    refused = httpx.get(record.status.endpoint + "/v1/models", timeout=10)
    assert refused.status_code == 401, "vLLM must require the API key"

    run = demo.run_benchmark(STEP_TIMEOUT_S)
    assert run.status == "completed"
    points = run.result["points"]
    assert [point["level"] for point in points] == [1, 4]
    assert all(point["completed"] > 0 and point["failed"] == 0 for point in points)

    # Container control end to end: gateway -> commands -> benchmark function -> node-tasks -> node agent ->
    # the container API over the real vLLM -> events -> benchmark function -> store -> gateway.
    gateway = demo.gateway
    assert isinstance(gateway, GatewayCore)
    tail = gateway.tail_serving_logs(SPEC.deployment_id, lines=50)
    deadline = time.monotonic() + 60
    while not tail.done and time.monotonic() < deadline:
        time.sleep(0.5)
        tail = gateway.tail_serving_logs(SPEC.deployment_id, task_id=tail.task_id)
    assert tail.status == "completed", tail.detail
    assert 0 < len(tail.lines) <= 50
    assert any("/v1/completions" in line for line in tail.lines), tail.lines[-5:]  # the benchmark's requests

    # The bus delivers the same create again (at-least-once): the ledger keeps the first outcome.
    first = cloud.store.get_command(create_id)
    assert first is not None and first.status == "applied"
    again = CreateDeployment.model_validate(
        {
            "command_id": create_id,
            "issued_at": cloud.world.now(),
            "deployment_id": SPEC.deployment_id,
            "spec": record.spec.model_dump(mode="json"),
        }
    )
    cloud.bus.publish(
        cloud.settings.topic_commands,
        encode_message(again),
        message_attributes(again),
        ordering_key=SPEC.deployment_id,
    )

    # Capacity stays available in both zones, then a spot preemption takes the serving node away.
    for zone in SPEC.zones:
        cloud.world.set_capacity(zone, "spot", 8)
    lost = demo.preempt()
    demo.wait_for_phase([Phase.DOWN, Phase.SEARCHING, Phase.PROVISIONING, Phase.BOOTING], 60, label="preemption")
    demo.wait_until_serving(STEP_TIMEOUT_S)
    record = cloud.store.get_deployment(SPEC.deployment_id)
    assert record is not None and record.status.phase is Phase.SERVING
    assert lost not in {ref.name for ref in record.status.resources if ref.state.value == "ACTIVE"}
    assert any("PREEMPTED" in line.text or "preempted" in line.text for line in demo.tracker.transcript)
    assert demo.ask(max_tokens=8).completion_tokens

    demo.teardown(STEP_TIMEOUT_S)
    record = cloud.store.get_deployment(SPEC.deployment_id)
    assert record is not None and record.status.phase is Phase.DELETED
    assert demo.resources_left() == 0

    report, applied = demo.check()
    assert report.orphans == [] and report.stale_leftovers == []
    assert report.duplicate_active_now == {} and report.duplicate_active_seen == []
    assert report.secret_leaks == [], report.secret_leaks
    assert report.places_scanned > 10
    assert report.over_budget == [] and 0 < report.spend_usd[SPEC.deployment_id] <= SPEC.budget_usd
    assert applied and all(count == 1 for count in applied.values()), applied
    ledger = cloud.store.get_command(create_id)
    assert ledger is not None and ledger.status == "applied"
    assert record.generation == 1, "the redelivered create made no new generation"


@pytest.mark.timeout(180)
def test_without_vllm_the_stack_still_hunts_tears_down_and_catches_a_planted_leak(tmp_path: Path) -> None:
    """The wiring alone (functions, bus, ticker, store, simulator), fast: no node boots a server here."""
    cloud = LocalCloud(LocalCloudOptions(data_dir=tmp_path / "cloud", boot_nodes=False, time_scale=60.0))
    transcript: list[str] = []
    try:
        cloud.start()
        assert set(cloud.functions) >= {"provision", "monitor"}
        demo = LocalDemo(cloud, GatewayCore(build_ports(cloud.settings)), SPEC, emit=transcript.append)
        demo.save_canary_token()
        demo.deploy()
        demo.wait_for_phase([Phase.SEARCHING, Phase.PROVISIONING], 60, label="first reconcile")
        demo.wait_for_phase([Phase.SEARCHING, Phase.PROVISIONING], 5, label="still hunting")
        requested = {line.text.split(":")[0] for line in demo.tracker.transcript if "requested" in line.text}
        assert requested == {"us-east5-b spot", "us-east5-a spot"}, "two hedged requests, one per zone"
        demo.teardown(90)
        assert demo.resources_left() == 0
        report, applied = demo.check()
        assert report.ok, report.lines()
        assert list(applied.values()) == [1, 1], applied

        api_key = cloud.secrets.get(cloud.settings.vllm_api_key_secret)
        assert api_key
        (cloud.log_dir / "leaky.jsonl").write_text(f'{{"message": "oops {api_key}"}}\n', encoding="utf-8")
        leaked, _ = demo.check()
        assert any("vLLM API key" in item and "leaky.jsonl" in item for item in leaked.secret_leaks)
        assert not leaked.ok
    finally:
        stopped = cloud.stop()
        print("\n".join(transcript))
    assert stopped.survivors == ()
    assert stopped.stopped_groups == len(cloud.functions)


@pytest.mark.emulator
@pytest.mark.timeout(180)
def test_with_emulators_the_commands_flow_through_firestore_and_pubsub(tmp_path: Path) -> None:
    missing = [found for kind in EMULATORS if isinstance(found := find_emulator(kind), str)]
    if missing:
        pytest.skip("--emulators needs both emulators: " + "; ".join(missing))
    before = os.environ.get("FIRESTORE_EMULATOR_HOST")
    cloud = LocalCloud(
        LocalCloudOptions(data_dir=tmp_path / "cloud", boot_nodes=False, emulators=True, time_scale=60.0)
    )
    try:
        cloud.start()
        assert type(cloud.store).__name__ == "FirestoreStateStore"
        assert type(cloud.bus).__name__ == "PubSubBus"
        assert set(cloud.client_env()) >= {"FIRESTORE_EMULATOR_HOST", "PUBSUB_EMULATOR_HOST", "TPUCTL_EMULATORS"}
        demo = LocalDemo(cloud, GatewayCore(build_ports(cloud.settings)), SPEC, emit=lambda line: None)
        demo.save_canary_token()
        demo.deploy()
        demo.wait_for_phase([Phase.SEARCHING, Phase.PROVISIONING], 90, label="first reconcile")
        assert sum("requested" in line.text for line in demo.tracker.transcript) == 2
        demo.teardown(90)
        report, applied = demo.check()
        assert report.ok, report.lines()
        assert list(applied.values()) == [1, 1], applied
    finally:
        stopped = cloud.stop()
    assert stopped.survivors == ()
    assert os.environ.get("FIRESTORE_EMULATOR_HOST") == before, "the runner restores the emulator variables"

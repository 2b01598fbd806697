"""The production-path twin end to end: ``TPUCTL_BACKEND=gcp`` everywhere, every Google API on a local endpoint.

The three functions, the gateway and the node agent run the Google Cloud wiring (Firestore, Pub/Sub, Secret
Manager, Cloud Scheduler, Cloud TPU, Billing Catalog clients) against the Firestore and Pub/Sub emulators, the TPU
simulator and the local stand-ins; every TPU VM boots from its rendered startup script in a VM twin. One story:
deploy, SERVING, a query, a benchmark written back by the node agent the script installed from the Cloud Storage
bundle, vLLM's lines in Cloud Logging with the severities parsed from vLLM's format (read back by
``tpu_observe`` logs), the plan's fp8 KV cache found running in the weights' dtype, a frozen engine called STALLED
and restarted by the monitor after the node kept a debug bundle of it in Cloud Storage, ``serving.restart`` (a
new vLLM process), a log tail, a spot preemption whose replacement restores the weights from the region's
cache bucket, delete, zero orphans and no secret anywhere.

Skipped with the reason where the emulators (google-cloud-cli), the vLLM CPU tier or namespaces are missing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from benchmarks.startup import reported_stages
from localcloud.demo import DemoSpec, LocalDemo
from localcloud.runner import LocalCloud
from localcloud.vm_twin.tpu_device import write_devices
from localcloud.vm_twin.vm import TwinVm
from mcp_client_gateway.composition import build_ports
from mcp_client_gateway.core import GatewayCore
from mcp_client_gateway.models import LogsView
from shared.domain.debug_bundle import bundle_object_name
from shared.domain.models import NodeTask, Phase, RejectedMessage
from shared.domain.serving_key import deployment_api_key
from shared.domain.sli_metrics import METRIC_PREFIX
from shared.messages import NodeBooted, RestartServing, encode_message, message_attributes, new_command_id
from tests.support.production_twin import production_twin

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.emulator]

# fp8 KV planned; the twin's image runs vLLM without the KV dtype flag (a CPU build of the TPU argv, as the published
# TPU run whose banner said fp8 while it allocated bf16), so the engine runs the weights' dtype: a finding.
SPEC = DemoSpec(
    deployment_id="twin-gemma",
    zones=("us-east5-a",),
    tiers=("spot",),
    hedge=1,
    valid_until_minutes=None,
    kv_cache_dtype="fp8",
)
STEP_TIMEOUT_S = 240.0


@pytest.fixture
def twin(tmp_path: Path) -> Iterator[tuple[LocalCloud, LocalDemo]]:
    transcript: list[str] = []
    try:
        with production_twin(tmp_path / "cloud") as cloud:
            yield cloud, LocalDemo(cloud, GatewayCore(build_ports(cloud.settings)), SPEC, emit=transcript.append)
    finally:
        print("\n".join(transcript))


def demo_endpoint(cloud: LocalCloud) -> str:
    record = cloud.store.get_deployment(SPEC.deployment_id)
    assert record is not None and record.status.endpoint
    return record.status.endpoint


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _logs_with(gateway: GatewayCore, text: str, timeout_s: float) -> LogsView:
    """vLLM's lines as tpu_observe(show='logs') reads them from Cloud Logging, once one contains ``text``."""
    deadline = time.monotonic() + timeout_s
    while True:
        logs = gateway.get_logs(deployment_id=SPEC.deployment_id, source="node", limit=200, minutes=60)
        if any(text in line.message for line in logs.entries) or time.monotonic() > deadline:
            return logs
        time.sleep(1)


def _a_vm_can_report_about_itself_but_never_command(cloud: LocalCloud, vm: TwinVm) -> None:
    """What a taken-over VM may publish on the events topic (it holds publisher there): a restart of its
    deployment's vLLM posted as an event, and an unsealed boot report. Both are refused and recorded; nothing
    happens to the node and nothing is written about it."""
    before_pid = vm.view().vllm_pid
    now = cloud.world.clock.now()
    restart = RestartServing(
        command_id=new_command_id(), issued_at=now, deployment_id=SPEC.deployment_id, reason="wedged"
    )
    forged = NodeBooted(command_id=new_command_id(), issued_at=now, deployment_id=SPEC.deployment_id, node="intruder")
    published = {
        cloud.bus.publish(cloud.settings.topic_events, encode_message(message), message_attributes(message))
        for message in (restart, forged)
    }
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(_rejections_of(cloud, published)) < 2:
        time.sleep(0.5)
    fields = sorted(r.field for r in _rejections_of(cloud, published))
    assert fields == ["attributes.event_seal", "kind"], fields
    assert cloud.store.get_command(restart.command_id) is None, "never taken for a command"
    assert cloud.store.list_node_tasks(SPEC.deployment_id) == [], "nothing dispatched to the node"
    record = cloud.store.get_deployment(SPEC.deployment_id)
    assert record is not None and record.status.node_system.get("node") != "intruder"
    assert vm.view().vllm_pid == before_pid, "vLLM was not restarted"


def _the_monitor_s_slis_reach_cloud_monitoring(cloud: LocalCloud) -> None:
    """The monitor function's google-cloud-monitoring client wrote the deployment's SLIs to the gRPC stand-in."""
    serving = f"{METRIC_PREFIX}serving"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        points = [p for p in cloud.monitoring_api.series(serving) if p.labels["deployment_id"] == SPEC.deployment_id]
        if points and points[-1].value == 1.0:
            break
        time.sleep(0.5)
    assert points and points[-1].value == 1.0, "the monitor wrote the deployment as SERVING"
    assert points[-1].labels["zone"] and points[-1].labels["tier"], "labelled with where its slice was granted"
    assert cloud.monitoring_api.series(f"{METRIC_PREFIX}health_latency_s"), "with the SLIs of its samples"
    assert cloud.monitoring_api.refusals == [], "nothing the real API would refuse"


def _every_boot_stage_is_timed_on_the_record(cloud: LocalCloud, demo: LocalDemo) -> None:
    """The script timed the image pull, the weights (with their source and size), the engine (container start
    to health 200, the compile cache cold on a new disk) and the first one-token completion in ``tpuctl/stages``;
    the monitor kept them on the record, and the dashboard shows them."""
    deadline = time.monotonic() + 120
    stages = None
    while time.monotonic() < deadline:
        record = cloud.store.get_deployment(SPEC.deployment_id)
        boot = record.status.boot if record is not None else None
        stages = boot.stages if boot is not None else None
        if stages is not None and "first_token" in stages.seconds:
            break
        time.sleep(1)
    expected = {"image", "weights", "compile_restore", "engine", "first_token"}
    assert stages is not None and set(stages.seconds) == expected, stages
    assert stages.weights_source == "hub" and stages.seconds["engine"] > 0, stages  # a first boot: an empty cache
    assert stages.compile_cache == "cold" and stages.seconds["first_token"] > 0, stages  # and an empty disk
    assert stages.compile_restore == "miss", stages  # nothing prewarmed this plan: the shared cache has no entry
    assert all(0 <= seconds < STEP_TIMEOUT_S for seconds in stages.seconds.values()), stages
    assert stages.weights_bytes is None or stages.weights_bytes >= 0
    gateway = demo.gateway
    assert isinstance(gateway, GatewayCore)
    view = gateway.get_deployment(SPEC.deployment_id).boot
    assert view is not None and view.stages is not None and "engine" in view.stages.text, view
    _the_first_boot_filled_its_regions_weights_cache(cloud, gateway)


def _the_first_boot_filled_its_regions_weights_cache(cloud: LocalCloud, gateway: GatewayCore) -> None:
    """The restore took each file from the Hub stand-in once, checked it, and filled the region's cache bucket; the
    plan now reports that cache (the twin's "weights" are the tiny model's files, so it is partial) and its price."""
    assert cloud.fleet is not None
    tiny = {path.name: path.stat().st_size for path in cloud.tier.model_dir.iterdir() if path.is_file()}
    record = cloud.store.get_deployment(SPEC.deployment_id)
    assert record is not None
    hub_id = next(iter({repo for repo, _path in cloud.fleet.hub.downloads}))
    assert {path: count for (_repo, path), count in cloud.fleet.hub.downloads.items()} == dict.fromkeys(tiny, 1)
    plan = gateway.plan(model=record.spec.model, accelerator=record.spec.accelerator, zones=list(SPEC.zones))
    (cache,) = plan.weights_cache
    assert (cache.region, cache.bucket) == ("us-east5", cloud.weights_caches["us-east5"]), cache
    assert cache.state == "partial" and cache.cached_bytes == sum(tiny.values()), (hub_id, cache)
    assert cache.usd_per_month is not None and cache.usd_per_month > 0


def _a_preempted_slice_is_replaced_from_the_regions_weights_cache(cloud: LocalCloud, demo: LocalDemo) -> None:
    """A spot preemption: the controller gets a new slice, and its VM, on a new empty disk, restores every weight
    from the bucket the first boot filled (the Hub serves nothing more); its compile cache starts cold."""
    assert cloud.fleet is not None
    hub_downloads = dict(cloud.fleet.hub.downloads)
    before = {vm.node_id for vm in cloud.fleet.vms()}
    cloud.world.set_capacity(SPEC.zones[0], "spot", 8)  # room for the replacement in the deployment's one zone
    demo.preempt()
    deadline = time.monotonic() + STEP_TIMEOUT_S
    stages = None
    while time.monotonic() < deadline and stages is None:
        for vm in cloud.fleet.vms():
            if vm.node_id not in before and (found := reported_stages(cloud.world, vm.zone, vm.node_id)) is not None:
                stages = found[1]  # this boot's stages, once its first token is in
        time.sleep(1)
    assert stages is not None, "the replacement VM never reported its first token"
    assert stages.weights_source == "bucket" and stages.compile_cache == "cold", stages
    assert dict(cloud.fleet.hub.downloads) == hub_downloads, "the replacement downloaded from the Hub"
    demo.wait_for_phase([Phase.SERVING], STEP_TIMEOUT_S, label="serving again on the replacement slice")


def _the_planned_fp8_kv_cache_is_found_running_bf16(cloud: LocalCloud, demo: LocalDemo) -> None:
    """What vLLM reports in ``vllm:cache_config_info`` is diffed against the plan: fp8 asked, the weights' dtype
    served. The finding names both and reaches the dashboard."""
    deadline = time.monotonic() + 60
    finding = None
    while time.monotonic() < deadline and finding is None:
        record = cloud.store.get_deployment(SPEC.deployment_id)
        assert record is not None
        finding = next((text for text in record.status.findings if text.startswith("effective config")), None)
        time.sleep(1)
    assert finding is not None, "no effective-config finding for a plan of fp8 KV served in bf16"
    assert "planned fp8 KV cache" in finding and "vLLM runs auto" in finding, finding
    gateway = demo.gateway
    assert isinstance(gateway, GatewayCore)
    shown = gateway.get_deployment(SPEC.deployment_id).findings
    assert any("planned fp8 KV cache" in text for text in shown), shown
    _what_vllm_printed_at_start_up_reaches_the_deployment(cloud, gateway)


def _what_vllm_printed_at_start_up_reaches_the_deployment(cloud: LocalCloud, gateway: GatewayCore) -> None:
    """The node agent reads the engine's config line from the log it ships and writes ``tpuctl/engine``; the
    monitor keeps it and diffs it: the twin's CPU vLLM serves a capped context on one rank, which the plan did not
    say, and the finding names both figures."""
    deadline = time.monotonic() + 180
    engine: dict[str, object] | None = None
    while time.monotonic() < deadline and not engine:
        record = cloud.store.get_deployment(SPEC.deployment_id)
        engine = record.status.engine if record is not None else None
        time.sleep(2)
    assert engine, "the node agent's start-up facts never reached the deployment"
    assert engine.get("version", "").startswith("v0.") and engine.get("tensor_parallel") == 1, engine
    served = engine.get("max_model_len")
    assert isinstance(served, int) and isinstance(engine.get("kv_cache_tokens"), int), engine
    deadline = time.monotonic() + 120
    finding = ""
    while time.monotonic() < deadline and f"vLLM serves {served:,}" not in finding:
        record = cloud.store.get_deployment(SPEC.deployment_id)
        assert record is not None
        finding = next((text for text in record.status.findings if text.startswith("effective config")), "")
        time.sleep(2)
    assert f"vLLM serves {served:,}" in finding and "vLLM runs 1" in finding, finding
    summary = gateway.get_deployment(SPEC.deployment_id).engine_summary
    assert summary is not None and summary.startswith("vLLM v0.") and f"context {served:,}" in summary, summary


def _the_tpu_is_seen_through_the_node_agent(cloud: LocalCloud, vm: TwinVm, result: dict[str, object]) -> None:
    """libtpu's runtime metrics (the stand-in answers from the VM's device file) reach the agent through the
    serving container's relay: a summary beside the benchmark result, and the monitor's samples through the guest
    attribute, where an injected near-full HBM shows with its own figures."""
    summary = result.get("tpu")
    assert isinstance(summary, dict) and summary.get("samples", 0) >= 1, summary
    assert "tensorcore_util_pct_mean" in summary, summary  # through the libtpu SDK stand-in, in the agent's child
    gib = 1 << 30
    chip = {"chip": 0, "hbm_total_bytes": 32 * gib, "hbm_used_bytes": 31 * gib, "duty_cycle_pct": 97.0}
    write_devices(vm.tpu_device_path, [{**chip, "hbm_bandwidth_pct": 61.0, "tensorcore_util_pct": 43.5}], pinned=True)
    deadline = time.monotonic() + 240
    slis: dict[str, float] = {}
    while time.monotonic() < deadline and slis.get("tpu_duty_cycle_pct") != 97.0:
        since = cloud.world.clock.now() - timedelta(hours=12)
        samples = cloud.store.list_samples(SPEC.deployment_id, since=since, limit=1)
        slis = dict(samples[0].slis) if samples else {}
        time.sleep(2)
    assert slis.get("tpu_hbm_used_frac_max") == round(31 / 32, 4), slis
    assert slis.get("tpu_hbm_bandwidth_pct") == 61.0, slis
    assert slis.get("tpu_tensorcore_util_pct") == 43.5, slis
    write_devices(vm.tpu_device_path, [chip], pinned=False)  # the updater follows vLLM's load again


def _engine_core_host_pid() -> int:
    """The VM's EngineCore process as this host sees it (the VM has a PID namespace of its own)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            nspids = next(
                line.split()[1:] for line in (proc / "status").read_text().splitlines() if line.startswith("NSpid:")
            )
            if len(nspids) > 1 and "EngineCore" in (proc / "cmdline").read_text():
                return int(proc.name)
        except (OSError, StopIteration):
            continue
    raise AssertionError("no EngineCore process inside a VM")


def _long_completions(cloud: LocalCloud, started: threading.Event, count: int = 4) -> list[threading.Thread]:
    """``count`` streamed completions long enough to be in flight when the engine freezes; ``started`` is set at
    the first token. Their errors (the restart ends them) are expected and ignored."""
    master = cloud.secrets.get(cloud.settings.vllm_api_key_secret) or ""
    headers = {"Authorization": f"Bearer {deployment_api_key(master, SPEC.deployment_id)}"}
    base = demo_endpoint(cloud)
    model = httpx.get(f"{base}/v1/models", headers=headers, timeout=10).json()["data"][0]["id"]
    body = {"model": model, "prompt": "Count slowly:", "max_tokens": 450, "stream": True, "ignore_eos": True}

    def stream() -> None:
        url = f"{base}/v1/completions"
        with (
            contextlib.suppress(httpx.HTTPError),
            httpx.Client(timeout=300) as client,
            client.stream("POST", url, json=body, headers=headers) as response,
        ):
            for _chunk in response.iter_bytes():
                started.set()

    threads = [threading.Thread(target=stream, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads


def _a_frozen_engine_is_restarted_after_its_bundle_is_kept(cloud: LocalCloud, gateway: GatewayCore, vm: TwinVm) -> None:
    """EngineCore frozen (SIGSTOP) under load: /health still answers, the monitor calls it STALLED and, past the
    grace period, restarts vLLM; the node keeps a debug bundle first, holding the frozen process's stacks, and the
    restart task links it."""
    before = vm.view().vllm_pid
    started = threading.Event()
    threads = _long_completions(cloud, started)
    assert started.wait(60), "no streamed token within 60 s"
    engine = _engine_core_host_pid()
    os.kill(engine, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + STEP_TIMEOUT_S
        healed: list[NodeTask] = []
        while time.monotonic() < deadline and not healed:
            time.sleep(1)
            healed = [
                task
                for task in cloud.store.list_node_tasks(SPEC.deployment_id)
                if task.action == "restart" and task.reason.startswith("STALLED") and task.finished
            ]
        assert healed, f"no restart of the stalled engine: {cloud.store.get_deployment(SPEC.deployment_id)}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(engine, signal.SIGCONT)
    (task,) = healed
    assert task.status == "completed" and task.bundle, task
    assert task.bundle == bundle_object_name(SPEC.deployment_id, task.task_id)
    view = gateway.debug_bundle(SPEC.deployment_id)
    assert view.status == "ready" and view.task_id == task.task_id, view
    frozen = [p for p in view.processes if p.state.startswith("T")]
    assert frozen and any(thread.frames for p in frozen for thread in p.threads), view.processes
    assert f"pid {before}," in view.container, ("captured from the process the restart replaced", view.container)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and vm.view().vllm_pid in (None, before):
        time.sleep(0.5)
    assert vm.view().vllm_pid not in (None, before), "the monitor's restart started a new vLLM process"
    for thread in threads:
        thread.join(timeout=60)


def _rejections_of(cloud: LocalCloud, message_ids: set[str]) -> list[RejectedMessage]:
    return [r for r in cloud.store.list_rejections() if r.message_id in message_ids]


def _poll(read: object, timeout_s: float) -> object:
    assert callable(read)
    deadline = time.monotonic() + timeout_s
    answer = read()
    while not getattr(answer, "done", True) and time.monotonic() < deadline:
        time.sleep(0.5)
        answer = read()
    return answer


@pytest.mark.timeout(600)
def test_deploy_serve_benchmark_restart_tail_and_delete_on_the_google_cloud_wiring(
    twin: tuple[LocalCloud, LocalDemo],
) -> None:
    cloud, demo = twin
    env = cloud.client_env()
    assert env["TPUCTL_BACKEND"] == "gcp" and "TPUCTL_EMULATORS" not in env
    assert {"FIRESTORE_EMULATOR_HOST", "PUBSUB_EMULATOR_HOST", "TPUCTL_SECRETMANAGER_ENDPOINT"} <= set(env)
    assert type(cloud.store).__name__ == "FirestoreStateStore" and type(cloud.bus).__name__ == "PubSubBus"

    demo.save_canary_token()  # through the gateway's Secret Manager client, into the stand-in
    project = cloud.scenario.project
    assert ("POST", f"/v1/projects/{project}/secrets/tpuctl-hf-token:addVersion") in cloud.controller_apis.calls
    demo.deploy()
    demo.wait_until_serving(STEP_TIMEOUT_S)
    assert demo.ask(max_tokens=8).completion_tokens
    _the_monitor_s_slis_reach_cloud_monitoring(cloud)
    _every_boot_stage_is_timed_on_the_record(cloud, demo)
    _the_planned_fp8_kv_cache_is_found_running_bf16(cloud, demo)

    assert cloud.fleet is not None
    vm = cloud.fleet.vms()[0]
    node = cloud.world.node(vm.zone, vm.node_id)
    assert node is not None
    assert vm.script_path.read_bytes() == node["metadata"]["startup-script"].encode(), "the VM ran its metadata"
    bundle = str(cloud.settings.node_agent_bundle)
    bucket, _, name = bundle.removeprefix("gs://").partition("/")
    assert ("GET", f"/storage/v1/b/{bucket}/o/{name.replace('/', '%2F')}") in cloud.google_apis.calls
    installed = vm.node_dir / "disk" / "var-lib" / "tpuctl" / "node-agent" / "lib"
    assert (installed / "node_agent" / "agent.py").is_file(), "the agent runs from the bundle the script installed"
    assert (installed / "loadgen" / "generator.py").is_file(), "with the load generator it runs"

    run = demo.run_benchmark(STEP_TIMEOUT_S)
    assert run.status == "completed"
    _the_tpu_is_seen_through_the_node_agent(cloud, vm, run.result or {})
    _a_vm_can_report_about_itself_but_never_command(cloud, vm)

    gateway = demo.gateway
    assert isinstance(gateway, GatewayCore)
    _a_frozen_engine_is_restarted_after_its_bundle_is_kept(cloud, gateway, vm)
    demo.wait_for_phase([Phase.SERVING], STEP_TIMEOUT_S, label="serving again after the monitor's restart")

    before = vm.view().vllm_pid
    restart = gateway.request_confirmation("restart", SPEC.deployment_id)  # the test is the user who agrees
    gateway.restart_serving(SPEC.deployment_id, confirm=restart.confirm, reason="twin e2e")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and vm.view().vllm_pid in (None, before):
        time.sleep(0.5)
    assert vm.view().vllm_pid not in (None, before), "serving.restart started a new vLLM process"
    # The phase may still read SERVING from before the restart: wait for the new server itself to answer.
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while time.monotonic() < deadline and not _answers(f"{demo_endpoint(cloud)}/health"):
        time.sleep(1)
    demo.wait_for_phase([Phase.SERVING], STEP_TIMEOUT_S, label="serving again after the restart")

    refused = httpx.get(f"{demo_endpoint(cloud)}/v1/models", timeout=10)
    assert refused.status_code == 401, "vLLM requires the API key"
    refused_line = '/v1/models HTTP/1.1" 401'  # the access line itself, not a port or a stamp holding "401"
    logs = _logs_with(gateway, refused_line, 90)
    assert logs.counts.get("INFO", 0) > 0, "vLLM's own INFO lines reached Cloud Logging"
    assert any(refused_line in line.message and line.severity == "WARNING" for line in logs.entries), logs.counts

    tail = gateway.tail_serving_logs(SPEC.deployment_id, lines=30)
    tail = _poll(lambda: gateway.tail_serving_logs(SPEC.deployment_id, task_id=tail.task_id), 60)  # type: ignore[assignment]
    assert tail.status == "completed" and tail.lines, tail

    _a_preempted_slice_is_replaced_from_the_regions_weights_cache(cloud, demo)
    demo.teardown(STEP_TIMEOUT_S)
    assert demo.resources_left() == 0
    report, applied = demo.check()
    assert report.orphans == [] and report.secret_leaks == [], report.lines()
    assert applied and all(count == 1 for count in applied.values()), applied

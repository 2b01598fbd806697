"""Serving flags changed on a local-cloud node running a REAL vLLM on CPU (issue 22, item 5).

The node boots as every node does: a VM twin executes the startup script rendered from a serving plan, which
starts vLLM in its container (``--net=none``, both wrappers, the key file) and the node agent. Then:

1. through the VM's Docker Engine socket, ``reconfigure`` recreates the container with ``max_num_seqs`` doubled:
   the process the engine reports runs ``--max-num-seqs`` with the new value, vLLM answers ``/health`` again, and
   everything but the vllm words is as the script made it (the time of the recreation and of the new engine's
   first ``/health`` 200 are printed);
2. a ``benchmark.run`` with ``tune_trials=2`` goes over the bus to the node agent, which puts the planned flags
   back for the baseline, runs the trial, measures both with the max-rate search and restores the planned argv
   exactly; its ``benchmark.completed`` carries the ``tune`` section the controller's check accepts.

Five real vLLM starts: several minutes on two cores.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from localcloud.tpu_sim import World, load_scenario
from localcloud.vllm_cpu import VllmCpuTier, default_cache_dir, health_ok
from localcloud.vm_twin.agent_bundle import publish_node_agent
from localcloud.vm_twin.docker_cli import inspect
from localcloud.vm_twin.google_apis import GoogleApis
from localcloud.vm_twin.metadata_server import TokenIssuer
from localcloud.vm_twin.vm import TwinVm, VmFleet, unshare_available
from shared.adapters.docker_engine import OVERRIDES_LABEL, PLANNED_CMD_LABEL, DockerEngineContainer
from shared.adapters.file_secrets import FileSecretStore
from shared.adapters.local_bus import LocalBus
from shared.adapters.node_channels import LocalBusNodeChannels
from shared.domain.autotune import check_tune_result
from shared.domain.models import DeploymentSpec
from shared.domain.serving_overrides import apply_to_argv
from shared.domain.serving_plan import ServingEnvironment, build_serving_plan
from shared.messages import (
    BenchmarkCompleted,
    BenchmarkRequest,
    NodeBooted,
    RunBenchmark,
    decode_message,
    encode_message,
    message_attributes,
    new_command_id,
)
from shared.ports import Delivery
from tests.support.builders import spec_dict

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ZONE, NODE, DEPLOYMENT = "us-east5-b", "tune-1", "gemma-a"
EVENTS, NODE_TASKS = "tpuctl-events", "tpuctl-node-tasks"
BOOT_TIMEOUT_S = 180.0
TUNE_TIMEOUT_S = 900.0


def _wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.25)
    raise AssertionError(f"{what}: not within {timeout_s} s")


def _events(bus: LocalBus, seen: list[object]) -> list[object]:
    deliveries: list[Delivery] = []
    bus.pull("test-events", deliveries.append, max_messages=50, timeout_s=0)
    seen += [decode_message(delivery.data) for delivery in deliveries]
    return seen


def _argv_in_vm(vm_pid: int) -> list[str]:
    """The argv of the process that is ``vm_pid`` in a VM's PID namespace (read from this side's /proc)."""
    for status in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError, StopIteration, ValueError):
            line = next(row for row in status.read_text().splitlines() if row.startswith("NSpid:"))
            pids = line.split()[1:]
            if len(pids) > 1 and int(pids[-1]) == vm_pid:
                return [word.decode() for word in (status.parent / "cmdline").read_bytes().split(b"\0")[:-1]]
    raise AssertionError(f"no process is pid {vm_pid} in a VM")


def _flag(argv: list[str] | tuple[str, ...], flag: str) -> str:
    return argv[list(argv).index(flag) + 1]


def _boot(tmp_path: Path, tier: VllmCpuTier) -> tuple[World, VmFleet, GoogleApis, LocalBus]:
    data_dir = tmp_path / "cloud"
    data_dir.mkdir()
    scenario = load_scenario("scarce-v6e").model_copy(update={"start_time": datetime.now(UTC).replace(microsecond=0)})
    world = World(scenario)
    world.set_capacity(ZONE, "spot", 8)
    secret_store = FileSecretStore(data_dir / "secrets")
    secret_store.put("tpuctl-vllm-api-key", "node-key-" + secrets.token_hex(12))
    secret_store.put("tpuctl-hf-token", "hf-" + secrets.token_hex(16))
    tokens = TokenIssuer()
    apis = GoogleApis(scenario.project, secret_store, data_dir / "storage", tokens)
    apis.start()
    bundle = publish_node_agent(apis, tier.cache_dir, "sources")
    environment = ServingEnvironment(
        project=scenario.project,
        node_agent_bundle=bundle.uri,
        node_agent_bundle_sha256=bundle.sha256,
        bind_host="0.0.0.0",
    )
    spec = DeploymentSpec.model_validate(spec_dict(DEPLOYMENT, model="gemma-4-e2b", accelerator="v6e-1", zones=[ZONE]))
    bus = LocalBus(data_dir / "bus.sqlite")
    for topic in (EVENTS, NODE_TASKS):
        bus.ensure_topic(topic)
    bus.ensure_subscription(EVENTS, "test-events")
    LocalBusNodeChannels(bus, NODE_TASKS).open(DEPLOYMENT)
    fleet = VmFleet(
        world,
        tier,
        apis=apis,
        tokens=tokens,
        work_dir=data_dir / "nodes",
        log_dir=data_dir / "logs",
        container_env={
            "TPUCTL_BACKEND": "local",
            "TPUCTL_PROJECT": scenario.project,
            "TPUCTL_DATA_DIR": str(data_dir),
            "TPUCTL_NODE_POLL_S": "0.2",
            "TPUCTL_NODE_TUNE_POLL_S": "0.5",
        },
        max_model_len=256,
        ready_timeout_s=BOOT_TIMEOUT_S,
    )
    fleet.attach()
    body = {
        "acceleratorType": "v6e-1",
        "runtimeVersion": "v2-alpha-tpuv6e",
        "schedulingConfig": {"spot": True},
        "labels": {"tpuctl-deployment": DEPLOYMENT},
        "metadata": {"startup-script": build_serving_plan(spec, environment).startup_script()},
    }
    world.create_node(scenario.project, ZONE, NODE, body)
    world.advance(900)  # capacity check and boot: the node turns READY and the fleet boots it
    return world, fleet, apis, bus


def _reconfigure_doubles_max_num_seqs(vm: TwinVm, engine: DockerEngineContainer) -> tuple[str, ...]:
    """Step 1; returns the planned Cmd."""
    before = engine.inspect()
    before_doc = inspect(str(vm.socket_dir / "docker.sock"), "tpuctl-vllm") or {}
    planned = before.command
    doubled = int(_flag(planned, "--max-num-seqs")) * 2
    began = time.monotonic()
    after = engine.reconfigure({"max_num_seqs": doubled}, timeout_s=30)
    recreated = time.monotonic() - began
    _wait_for(vm.healthy, BOOT_TIMEOUT_S, "/health 200 from the reconfigured vLLM")
    healthy = time.monotonic() - began
    print(f"\nreconfigure: container recreated in {recreated:.1f} s, vLLM healthy after {healthy:.1f} s")
    assert after.pid is not None and after.pid != before.pid
    assert after.command == tuple(apply_to_argv(planned, {"max_num_seqs": doubled}))
    running = _argv_in_vm(after.pid)
    assert "serve" in running and _flag(running, "--max-num-seqs") == str(doubled), running
    after_doc = inspect(str(vm.socket_dir / "docker.sock"), "tpuctl-vllm") or {}
    assert after_doc["HostConfig"] == before_doc["HostConfig"]  # --net=none, mounts, device flags, restart policy
    kept = ("Image", "Entrypoint", "Env")
    assert {key: after_doc["Config"][key] for key in kept} == {key: before_doc["Config"][key] for key in kept}
    labels = after_doc["Config"]["Labels"]
    assert {key: labels[key] for key in before_doc["Config"]["Labels"]} == before_doc["Config"]["Labels"]
    assert PLANNED_CMD_LABEL in labels and OVERRIDES_LABEL in labels
    return planned


def _tune_over_the_bus(bus: LocalBus, world: World) -> tuple[BenchmarkRequest, dict[str, Any]]:
    """Step 2: the node agent's tune; returns the request and the completed run's result."""
    request = BenchmarkRequest(
        tune_trials=2,
        slo_ttft_ms=20000,
        input_len=16,
        output_len=8,
        num_prompts=2,
        warmup_requests=1,
        mode="rate",
        request_rate=(0.5, 1.0),
        duration_s=2.0,
    )
    run = RunBenchmark(
        command_id=new_command_id(), issued_at=world.clock.now(), deployment_id=DEPLOYMENT, benchmark=request
    )
    bus.publish(NODE_TASKS, encode_message(run), message_attributes(run), ordering_key=DEPLOYMENT)
    seen: list[object] = []

    def done() -> BenchmarkCompleted | None:
        found = [e for e in _events(bus, seen) if isinstance(e, BenchmarkCompleted) and e.run_id == run.command_id]
        return found[0] if found else None

    began = time.monotonic()
    _wait_for(lambda: done() is not None, TUNE_TIMEOUT_S, "the tune's benchmark.completed")
    print(f"tune of 2 trials: {time.monotonic() - began:.0f} s")
    event = done()
    assert event is not None and event.status == "completed", event and event.error
    return request, event.result or {}


def test_a_real_vllm_is_reconfigured_and_tuned_and_its_planned_flags_come_back(tmp_path: Path) -> None:
    tier = VllmCpuTier(default_cache_dir())
    reason = tier.unavailable_reason() or unshare_available()
    if reason:
        pytest.skip(reason)
    world, fleet, apis, bus = _boot(tmp_path, tier)
    try:
        _wait_for(lambda: bool(fleet.nodes()) and fleet.nodes()[0].state == "serving", BOOT_TIMEOUT_S, "serving")
        _wait_for(
            lambda: any(isinstance(e, NodeBooted) for e in _events(bus, [])), 60, "the agent's node.booted"
        )  # the agent is up and pulling
        vm = fleet.vms()[0]
        engine = DockerEngineContainer(f"unix://{vm.socket_dir / 'docker.sock'}", "tpuctl-vllm", timeout_s=30)
        try:
            planned = _reconfigure_doubles_max_num_seqs(vm, engine)
            request, result = _tune_over_the_bus(bus, world)
            tune = result["tune"]
            for trial in tune["trials"]:
                print(f"trial {trial['overrides']}: {trial['max_rate_at_slo']} req/s ({trial['stop_reason']})")
            assert [trial["overrides"] for trial in tune["trials"]] == [
                {},
                {"max_num_seqs": int(_flag(planned, "--max-num-seqs")) * 2},
            ]
            checked = check_tune_result(request, tune)
            assert checked["trials"][0]["max_rate_at_slo"] is not None, tune["trials"][0]["stop_reason"]
            assert checked["image"] == tune["image"] and checked["baseline"]["max_num_seqs"] == int(
                _flag(planned, "--max-num-seqs")
            )
            final = engine.inspect()
            assert final.command == planned and final.overrides == {}  # exactly the planned argv again
            assert final.pid is not None and _flag(_argv_in_vm(final.pid), "--max-num-seqs") == _flag(
                planned, "--max-num-seqs"
            )
            assert health_ok(f"http://127.0.0.1:{vm.port}")
        finally:
            engine.close()
    finally:
        fleet.close()
        bus.close()
        apis.stop()

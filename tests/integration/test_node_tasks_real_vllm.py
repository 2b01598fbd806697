"""``serving.restart`` and ``serving.logs`` end to end on a local-cloud node running a REAL vLLM on CPU.

The node boots as every node does, in a VM twin that executes the startup script rendered from a serving plan:
the script reads the API key from Secret Manager, installs the node agent from the bundle in Cloud Storage and
starts vLLM and the agent with ``docker``. Through the bus, a restart must replace the vLLM process (new pid,
``/health`` 200 again) and be answered with ``node.task_completed``; a log tail must return vLLM's own lines with
the API key redacted. Two real vLLM boots: about a minute on two cores.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from localcloud.tpu_sim import World, load_scenario
from localcloud.vllm_cpu import VllmCpuTier, default_cache_dir, health_ok
from localcloud.vm_twin.agent_bundle import publish_node_agent
from localcloud.vm_twin.google_apis import GoogleApis
from localcloud.vm_twin.metadata_server import TokenIssuer
from localcloud.vm_twin.vm import NodeView, VmFleet, unshare_available
from shared.adapters.file_secrets import FileSecretStore
from shared.adapters.local_bus import LocalBus
from shared.adapters.node_channels import LocalBusNodeChannels
from shared.domain.models import DeploymentSpec
from shared.domain.serving_plan import ServingEnvironment, build_serving_plan
from shared.messages import (
    NodeBooted,
    NodeTaskCompleted,
    RestartServing,
    TailServingLogs,
    decode_message,
    encode_message,
    message_attributes,
    new_command_id,
)
from shared.ports import Delivery
from tests.support.builders import spec_dict

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ZONE, NODE = "us-east5-b", "node-tasks-1"
EVENTS, NODE_TASKS = "tpuctl-events", "tpuctl-node-tasks"
BOOT_TIMEOUT_S = 180.0


def _wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.25)
    raise AssertionError(f"{what}: not within {timeout_s} s")


class EventLog:
    """Everything the test subscription received, decoded."""

    def __init__(self, bus: LocalBus) -> None:
        self.bus = bus
        self.seen: list[object] = []

    def refresh(self) -> list[object]:
        deliveries: list[Delivery] = []
        self.bus.pull("test-events", deliveries.append, max_messages=50, timeout_s=0)
        self.seen += [decode_message(delivery.data) for delivery in deliveries]
        return self.seen

    def answer(self, task_id: str) -> NodeTaskCompleted | None:
        found = [e for e in self.refresh() if isinstance(e, NodeTaskCompleted) and e.task_id == task_id]
        return found[0] if found else None


def _live_members(group: int) -> list[int]:
    """Processes of ``group`` that still run (zombies waiting for a reaper do not count)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == group and fields[0] != "Z":
                members.append(int(stat.parent.name))
    return members


def _node(runtime: VmFleet) -> NodeView | None:
    nodes = runtime.nodes()
    return nodes[0] if nodes else None


def test_restart_and_log_tail_reach_a_real_vllm_on_a_local_node(tmp_path: Path) -> None:
    tier = VllmCpuTier(default_cache_dir())
    reason = tier.unavailable_reason() or unshare_available()
    if reason:
        pytest.skip(reason)
    data_dir = tmp_path / "cloud"
    data_dir.mkdir()
    scenario = load_scenario("scarce-v6e").model_copy(update={"start_time": datetime.now(UTC).replace(microsecond=0)})
    world = World(scenario)
    world.set_capacity(ZONE, "spot", 8)
    api_key = "node-key-" + secrets.token_hex(12)
    secret_store = FileSecretStore(data_dir / "secrets")
    secret_store.put("tpuctl-vllm-api-key", api_key)
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
    spec = DeploymentSpec.model_validate(spec_dict("gemma-a", model="gemma-4-e2b", accelerator="v6e-1", zones=[ZONE]))
    script = build_serving_plan(spec, environment).startup_script()
    bus = LocalBus(data_dir / "bus.sqlite")
    bus.ensure_topic(EVENTS)
    bus.ensure_topic(NODE_TASKS)
    bus.ensure_subscription(EVENTS, "test-events")
    LocalBusNodeChannels(bus, NODE_TASKS).open("gemma-a")  # as the provisioner does before it creates the node
    events = EventLog(bus)
    runtime = VmFleet(
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
        },
        max_model_len=256,
        ready_timeout_s=BOOT_TIMEOUT_S,
    )
    runtime.attach()
    try:
        world.create_node(
            scenario.project,
            ZONE,
            NODE,
            {
                "acceleratorType": "v6e-1",
                "runtimeVersion": "v2-alpha-tpuv6e",
                "schedulingConfig": {"spot": True},
                "labels": {"tpuctl-deployment": "gemma-a"},
                "metadata": {"startup-script": script},
            },
        )
        world.advance(900)  # capacity check and boot: the node turns READY and the runtime boots it
        _wait_for(lambda: (_node(runtime) or _NONE).state == "serving", BOOT_TIMEOUT_S, "vLLM serving")
        _wait_for(lambda: any(isinstance(e, NodeBooted) for e in events.refresh()), 60, "the agent's node.booted")
        before = _node(runtime)
        assert before is not None and before.vllm_pid is not None
        vm = runtime.vms()[0]
        assert (vm.socket_dir / "docker.sock").stat().st_mode & 0o777 == 0o600
        assert vm.script_path.read_bytes() == script.encode(), "the VM ran the rendered script, byte for byte"
        bundle_object = bundle.uri.removeprefix("gs://sources/")
        assert ("GET", f"/storage/v1/b/sources/o/{bundle_object.replace('/', '%2F')}") in apis.calls

        # in the local cloud the control plane stamps commands on the simulator's clock, as the node's StartedAt
        restart = RestartServing(
            command_id=new_command_id(), issued_at=world.clock.now(), deployment_id="gemma-a", reason="integration"
        )
        bus.publish(NODE_TASKS, encode_message(restart), message_attributes(restart), ordering_key="gemma-a")
        _wait_for(lambda: events.answer(restart.command_id) is not None, 60, "the restart's answer")
        answer = events.answer(restart.command_id)
        assert answer is not None and (answer.action, answer.status) == ("restart", "completed"), answer
        after = _node(runtime)
        assert after is not None and after.vllm_pid not in (None, before.vllm_pid)
        assert f"(pid {before.vllm_pid})" in answer.detail and f"(pid {after.vllm_pid})" in answer.detail
        base_url = f"http://127.0.0.1:{after.port}"
        _wait_for(lambda: health_ok(base_url), BOOT_TIMEOUT_S, "/health 200 after the restart")

        logs = TailServingLogs(command_id=new_command_id(), issued_at=world.clock.now(), deployment_id="gemma-a")
        bus.publish(NODE_TASKS, encode_message(logs), message_attributes(logs), ordering_key="gemma-a")
        _wait_for(lambda: events.answer(logs.command_id) is not None, 30, "the log tail's answer")
        tail = events.answer(logs.command_id)
        assert tail is not None and (tail.action, tail.status) == ("logs", "completed"), tail
        assert 0 < len(tail.lines) <= 100
        text = "\n".join(tail.lines)
        assert "Application startup complete" in text  # vLLM's own line, from the restarted server
        assert api_key not in text
    finally:
        runtime.close()
        bus.close()
        apis.stop()
    groups = runtime.process_groups()
    _wait_for(lambda: not any(_live_members(group) for group in groups), 15, "every process group gone with the node")


_NONE = NodeView(
    zone="",
    node_id="",
    deployment_id="",
    port=0,
    state="",
    vllm_pid=None,
    agent_pid=None,
    boot_s=None,
    detail="",
)

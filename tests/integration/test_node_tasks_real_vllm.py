"""``serving.restart`` and ``serving.logs`` end to end on a local-cloud node running a REAL vLLM on CPU.

The node is booted by the local cloud's own ``NodeRuntime`` (a simulated TPU node turns READY): vLLM with its
key file, the Docker Engine API twin on the node's socket, and ``python -m shared.bench.node_agent`` started with
``TPUCTL_NODE_DOCKER_HOST`` / ``TPUCTL_NODE_CONTAINER``. Through the bus, a restart must replace the vLLM
process (new pid, ``/health`` 200 again) and be answered with ``node.task_completed``; a log tail must return
vLLM's own lines with the API key redacted. Two real vLLM boots: about a minute on two cores.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from localcloud.node_runtime import NodeRuntime, NodeView

from localcloud.tpu_sim import World, load_scenario
from localcloud.vllm_cpu import VllmCpuTier, default_cache_dir, health_ok
from shared.adapters.file_secrets import FileSecretStore
from shared.adapters.local_bus import LocalBus
from shared.adapters.sqlite_store import SqliteStateStore
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


def _node(runtime: NodeRuntime) -> NodeView | None:
    nodes = runtime.nodes()
    return nodes[0] if nodes else None


def test_restart_and_log_tail_reach_a_real_vllm_on_a_local_node(tmp_path: Path) -> None:
    tier = VllmCpuTier(default_cache_dir())
    reason = tier.unavailable_reason()
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
    bus = LocalBus(data_dir / "bus.sqlite")
    bus.ensure_topic(EVENTS)
    bus.ensure_topic(NODE_TASKS)
    bus.ensure_subscription(EVENTS, "test-events")
    events = EventLog(bus)
    runtime = NodeRuntime(
        world,
        tier,
        store=SqliteStateStore(data_dir / "state.sqlite"),
        secrets=secret_store,
        api_key_secret="tpuctl-vllm-api-key",
        project=scenario.project,
        work_dir=data_dir / "nodes",
        log_dir=data_dir / "logs",
        agent_env={
            "TPUCTL_BACKEND": "local",
            "TPUCTL_PROJECT": scenario.project,
            "TPUCTL_DATA_DIR": str(data_dir),
            "TPUCTL_NODE_POLL_S": "0.2",
        },
        max_model_len_cap=256,
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
            },
        )
        world.advance(900)  # capacity check and boot: the node turns READY and the runtime boots it
        _wait_for(lambda: (_node(runtime) or _NONE).state == "serving", BOOT_TIMEOUT_S, "vLLM serving")
        _wait_for(lambda: any(isinstance(e, NodeBooted) for e in events.refresh()), 60, "the agent's node.booted")
        before = _node(runtime)
        assert before is not None and before.vllm_pid is not None
        socket_path = data_dir / "nodes" / f"{ZONE}-{NODE}" / "docker.sock"
        if len(str(socket_path)) <= 100:
            assert socket_path.stat().st_mode & 0o777 == 0o600

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
        old_group = before.vllm_pid
        _wait_for(lambda: not _live_members(old_group), 15, "the old server's process group gone")
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
    groups = runtime.process_groups()
    _wait_for(lambda: not any(_live_members(group) for group in groups), 15, "every process group gone with the node")


_NONE = NodeView(
    zone="",
    node_id="",
    deployment_id="",
    port=0,
    served_model="",
    state="",
    vllm_pid=None,
    agent_pid=None,
    boot_s=None,
    detail="",
)

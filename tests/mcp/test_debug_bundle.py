"""Debug bundles through the gateway: read the one a restart kept, capture one now, refuse what is not a bundle.

The bundle store is a small in-memory ``DebugBundles`` (names written once, as the real stores do); the store, bus
and secrets are the embedded adapters of ``tests.mcp.conftest``. For the capture round trip the controller and
the node agent are played by the real ``NodeTasks`` service, as in ``test_node_task_tools``.
"""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.types import TextContent

from localcloud.runner import BENCHMARK_COMMAND_FILTER
from mcp_client_gateway import cli
from mcp_client_gateway.capabilities.debug import metric_gauges
from mcp_client_gateway.cli import run
from mcp_client_gateway.cli_debug import EXIT_OF_STATUS
from mcp_client_gateway.composition import build_ports
from mcp_client_gateway.core import GatewayCore, GatewayError
from mcp_client_gateway.interface_words import cli_text
from shared.adapters.clock import SystemClock
from shared.config import Settings
from shared.domain.debug_bundle import MAX_BUNDLE_BYTES, bundle_object_name
from shared.domain.errors import CloudError, ErrorClass, PermanentError
from shared.domain.models import NodeTask, Phase
from shared.messages import CaptureDebugBundle, NodeTaskCompleted, decode_message, new_command_id
from shared.ports import Delivery
from shared.services.node_tasks import NodeTasks, NodeTaskSettings
from tests.mcp.conftest import API_KEY, GatewayWorld

CONTROLLER = "test-benchmark-fn"
NODE = "test-node-gemma-a"
ENGINE_FRAME = {"function": "wait", "file": "/usr/lib/python3.12/threading.py", "line": 355}


class MemoryBundles:
    """``DebugBundles`` in a dict: a name is written once; an unknown name is NOT_FOUND."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}

    def put(self, name: str, data: bytes) -> str:
        if name in self.objects:
            raise PermanentError(f"{name} exists")
        self.objects[name] = data
        return self.location(name)

    def get(self, name: str) -> bytes:
        if name not in self.objects:
            raise CloudError(ErrorClass.NOT_FOUND, f"no object {name}")
        return self.objects[name]

    def location(self, name: str) -> str:
        return f"memory://bundles/{name}"


@pytest.fixture
def bundles(world: GatewayWorld) -> MemoryBundles:
    store = MemoryBundles()
    world.ports.debug_bundles = store
    return store


def a_bundle(task_id: str, **changes: Any) -> dict[str, Any]:
    """A version-1 bundle of a hung engine: the EngineCore process stopped, its busy thread in a collective."""
    bundle: dict[str, Any] = {
        "version": 1,
        "deployment_id": "gemma-a",
        "bundle_id": task_id,
        "reason": "monitor: STALLED for 6 min",
        "node": "gemma-a-g1-a1",
        "captured_at": "2026-12-05T06:00:00+00:00",
        "container": {"name": "tpuctl-vllm", "status": "running", "pid": 4242, "started_at": "2026-12-05T05:00:00Z"},
        "processes": [
            {
                "pid": 4242,
                "ppid": 1,
                "state": "S (sleeping)",
                "command": "python3 -m vllm.entrypoints.openai.api_server --model google/gemma-4",
                "threads": [{"thread_id": 1, "name": "MainThread", "active": False, "frames": [ENGINE_FRAME]}],
                "stacks_error": None,
            },
            {
                "pid": 4300,
                "ppid": 4242,
                "state": "T (stopped)",
                "command": "VLLM::EngineCore",
                "threads": [
                    {
                        "thread_id": 7,
                        "name": "EngineCoreThread",
                        "active": True,
                        "owns_gil": True,
                        "frames": [
                            {"function": "all_reduce", "file": "/vllm/distributed/tpu.py", "line": 88},
                            {"function": "execute_model", "file": "/vllm/v1/worker/tpu_worker.py", "line": 310},
                            {"function": "run_busy_loop", "file": "/vllm/v1/engine/core.py", "line": 512},
                        ],
                    }
                ],
                "stacks_error": None,
            },
        ],
        "stacks_note": None,
        "log_tail": [f"INFO step {n}" for n in range(80)] + ["ERROR collective timed out"],
        "metrics": {
            "ok": True,
            "text": "# TYPE vllm:num_requests_running gauge\n"
            'vllm:num_requests_running{engine="0",model_name="g"} 3.0\n'
            'vllm:num_requests_waiting{engine="0",model_name="g"} 17\n'
            'vllm:kv_cache_usage_perc{engine="0",model_name="g"} 0.93\n',
            "error": None,
        },
        "tpu_info": {
            "ok": True,
            "text": "TPU Chips\nchip 0  v6e  HBM 31.2/32 GiB\nchip 1  v6e  HBM 31.0/32 GiB",
            "error": None,
        },
        "boot": {"ok": True, "attributes": {"stage": "serving", "stage_at": "2026-12-05T05:02:00Z"}, "error": None},
        "timings_s": {"stacks": 1.2},
        "trimmed": [],
    }
    bundle.update(changes)
    return bundle


def kept_by_restart(world: GatewayWorld, bundles: MemoryBundles, data: bytes | None, *, age_s: float = 20) -> str:
    """A finished task of gemma-a whose node stored ``data`` as its bundle (None: names a bundle never stored)."""
    task_id = new_command_id()
    name = bundle_object_name("gemma-a", task_id)
    if data is not None:
        bundles.put(name, data)
    now = datetime.now(UTC) - timedelta(seconds=age_s)
    world.store.create_node_task(
        NodeTask(
            task_id=task_id,
            deployment_id="gemma-a",
            action="restart",
            status="completed",
            reason="monitor: STALLED",
            requested_at=now,
            dispatched_at=now + timedelta(seconds=1),
            finished_at=now + timedelta(seconds=15),
            detail="container tpuctl-vllm restarted",
            bundle=name,
        )
    )
    return task_id


def encoded(bundle: dict[str, Any]) -> bytes:
    return json.dumps(bundle).encode()


def tpuctl(world: GatewayWorld, *argv: str) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    code = run(list(argv), ports=world.ports, stdout=stdout, stderr=stderr)
    return code, stdout.getvalue(), stderr.getvalue()


class TestReading:
    def test_the_bundle_a_restart_kept_shows_the_frozen_engine_its_frames_and_its_log(
        self, world: GatewayWorld, bundles: MemoryBundles
    ) -> None:
        world.seed("gemma-a", phase=Phase.SERVING)
        older = kept_by_restart(world, bundles, encoded(a_bundle("older", reason="older")), age_s=600)
        task_id = kept_by_restart(world, bundles, encoded(a_bundle("newest")))

        view = world.core.debug_bundle("gemma-a")

        assert view.status == "ready" and view.task_id == task_id != older and view.reason != "older"
        assert view.notice.startswith("Untrusted data")
        main, engine = view.processes
        assert (engine.pid, engine.state, engine.command) == (4300, "T (stopped)", "VLLM::EngineCore")
        (thread,) = engine.threads
        assert thread.name == "EngineCoreThread" and thread.active is True
        assert thread.frames[0] == "all_reduce (/vllm/distributed/tpu.py:88)", "innermost first"
        assert thread.frames[-1] == "run_busy_loop (/vllm/v1/engine/core.py:512)"
        assert main.threads[0].frames == ["wait (/usr/lib/python3.12/threading.py:355)"]
        assert len(view.log_tail) == 50 and view.log_tail[-1] == "ERROR collective timed out"
        assert any("older log line" in note for note in view.trimmed)
        assert view.metrics == {"num_requests_running": 3.0, "num_requests_waiting": 17.0, "kv_cache_usage_perc": 0.93}
        assert view.tpu_info.splitlines()[1] == "chip 0  v6e  HBM 31.2/32 GiB", "columns kept"
        assert view.boot == {"stage": "serving", "stage_at": "2026-12-05T05:02:00Z"}
        assert view.captured_at == datetime(2026, 12, 5, 6, 0, tzinfo=UTC)
        assert view.container == "tpuctl-vllm, running, pid 4242, started 2026-12-05T05:00:00Z"
        assert view.location == f"memory://bundles/debug-bundles/gemma-a/{task_id}.json"

    @pytest.mark.anyio
    async def test_a_task_id_reads_that_tasks_bundle_over_mcp(
        self, world: GatewayWorld, bundles: MemoryBundles
    ) -> None:
        world.seed("gemma-a", phase=Phase.DOWN)
        first = kept_by_restart(world, bundles, encoded(a_bundle("x", reason="the first one")), age_s=600)
        kept_by_restart(world, bundles, encoded(a_bundle("x", reason="the newest one")))

        async with Client(world.server()) as session:
            result = await session.call_tool(
                "tpu_observe", {"show": "debug_bundle", "deployment_id": "gemma-a", "command_id": first}
            )

        assert not result.is_error
        assert result.structured_content["reason"] == "the first one"
        assert result.structured_content["processes"][1]["state"] == "T (stopped)"
        summary = " ".join(block.text for block in result.content if isinstance(block, TextContent))
        assert "4300 T (stopped)" in summary and "untrusted data" in summary

    def test_the_task_id_of_a_log_tail_is_refused_naming_task_id(
        self, world: GatewayWorld, bundles: MemoryBundles
    ) -> None:
        world.seed("gemma-a")
        tail = NodeTask(
            task_id=new_command_id(), deployment_id="gemma-a", action="logs", requested_at=datetime.now(UTC)
        )
        world.store.create_node_task(tail)

        with pytest.raises(GatewayError) as refused:
            world.core.debug_bundle("gemma-a", task_id=tail.task_id)

        assert refused.value.code == "invalid_argument" and refused.value.field == "task_id"
        assert "logs task" in refused.value.problem and "restart" in refused.value.fix
        assert world.published() == []

    def test_a_deployment_without_bundles_says_none_and_how_to_get_one(
        self, world: GatewayWorld, bundles: MemoryBundles
    ) -> None:
        world.seed("gemma-a")
        world.store.create_node_task(
            NodeTask(task_id=new_command_id(), deployment_id="gemma-a", action="logs", requested_at=datetime.now(UTC))
        )

        view = world.core.debug_bundle("gemma-a")

        assert view.status == "none" and view.task_id is None and view.processes == []
        assert "tpu_control(action='capture_bundle', deployment_id='gemma-a')" in view.next_step
        assert "before every restart" in view.next_step
        assert "tpuctl debug gemma-a --capture" in cli_text(view.next_step)
        assert world.published() == []

    @pytest.mark.parametrize(
        ("data", "said"),
        [
            (b"\x89PNG not json at all", "not JSON"),
            (b'["a", "list"]', "not a JSON object"),
        ],
    )
    def test_an_unreadable_bundle_reads_failed_without_an_exception(
        self, world: GatewayWorld, bundles: MemoryBundles, data: bytes, said: str
    ) -> None:
        world.seed("gemma-a")
        task_id = kept_by_restart(world, bundles, data)

        view = world.core.debug_bundle("gemma-a", task_id=task_id)

        assert view.status == "failed" and "unreadable" in view.detail and said in view.detail
        assert view.location.endswith(f"{task_id}.json")

    def test_fields_of_the_wrong_type_are_left_out_not_raised(
        self, world: GatewayWorld, bundles: MemoryBundles
    ) -> None:
        world.seed("gemma-a")
        wrong = {
            "version": "one",
            "processes": [7, {"pid": "x", "state": 3, "threads": "none", "command": None}],
            "log_tail": "not a list",
            "metrics": [],
            "tpu_info": {"text": 12},
            "boot": {"attributes": ["stage"]},
            "captured_at": "yesterday",
            "container": "tpuctl-vllm",
            "trimmed": [None, 5, "metrics text (9000 characters)"],
        }
        task_id = kept_by_restart(world, bundles, encoded(wrong))

        view = world.core.debug_bundle("gemma-a", task_id=task_id)

        assert view.status == "ready" and view.captured_at is None and view.log_tail == [] and view.metrics == {}
        assert [(p.pid, p.state, p.threads) for p in view.processes] == [(None, "", []), (None, "", [])]
        assert "node left out: metrics text (9000 characters)" in view.trimmed
        assert any("version" in note for note in view.trimmed)

    def test_a_bundle_the_lifecycle_removed_reads_failed_and_says_so(
        self, world: GatewayWorld, bundles: MemoryBundles
    ) -> None:
        world.seed("gemma-a")
        task_id = kept_by_restart(world, bundles, None)
        view = world.core.debug_bundle("gemma-a", task_id=task_id)
        assert view.status == "failed" and "removed" in view.detail and "lifecycle" in view.detail

    def test_escapes_and_registered_secrets_are_cleaned_from_every_part(
        self, world: GatewayWorld, bundles: MemoryBundles
    ) -> None:
        world.seed("gemma-a")
        world.secrets.put(world.settings.vllm_api_key_secret, API_KEY)
        hostile = f"\x1b[31mboom\x1b[0m\x07 key={API_KEY}\u202e"
        bundle = a_bundle("x", reason=hostile, log_tail=[hostile])
        bundle["processes"][1]["state"] = "\x1b]0;owned\x07T (stopped)"
        bundle["processes"][1]["command"] = f"vllm --api-key {API_KEY}"
        bundle["processes"][1]["threads"][0]["frames"][0]["function"] = hostile
        bundle["tpu_info"]["text"] = hostile + "\nchip 0"
        bundle["boot"]["attributes"] = {"stage\x1b[2J": hostile}
        task_id = kept_by_restart(world, bundles, encoded(bundle))

        view = world.core.debug_bundle("gemma-a", task_id=task_id)

        dumped = view.model_dump_json()
        assert API_KEY not in dumped and "[REDACTED]" in view.log_tail[0]
        for control in ("\x1b", "\x07", "\u202e", "\\u001b", "\\u0007", "\\u202e"):
            assert control not in dumped
        assert view.reason.startswith("boom ") and view.processes[1].command == "vllm --api-key [REDACTED]"
        assert view.processes[1].threads[0].frames[0].startswith("boom key=[REDACTED]")
        assert view.processes[1].state.endswith("T (stopped)")

    @pytest.mark.parametrize("char", ["x", '"'], ids=["plain", "escape-heavy"])
    def test_a_huge_hostile_bundle_stays_bounded(self, world: GatewayWorld, bundles: MemoryBundles, char: str) -> None:
        world.seed("gemma-a")
        frame = {"function": char * 60, "file": "/x/" + char * 60, "line": 1}
        thread = {"name": char * 300, "active": True, "frames": [frame] * 40}
        process = {"pid": 1, "state": char * 5000, "command": char * 50_000, "threads": [thread] * 40}
        small = {"pid": 2, "state": "S (sleeping)", "command": "python3", "threads": [thread] * 10}
        bundle = a_bundle(
            "x",
            processes=[process] * 2 + [small] * 8,
            log_tail=[char * 1000] * 200,
            tpu_info={"text": (char * 300 + "\n") * 400},
            boot={"attributes": {f"k{n}": char * 1000 for n in range(100)}},
            trimmed=[char * 1000] * 20,
        )
        data = encoded(bundle)
        assert 1_000_000 < len(data) < MAX_BUNDLE_BYTES
        task_id = kept_by_restart(world, bundles, data)

        view = world.core.debug_bundle("gemma-a", task_id=task_id)

        assert view.status == "ready"
        assert len(view.model_dump_json()) < 60_000
        assert len(view.processes) == 8 and all(len(t.frames) <= 15 for p in view.processes for t in p.threads)
        assert sum(len(p.threads) for p in view.processes) <= 64 and len(view.processes[0].command) <= 300
        assert len(view.tpu_info) <= 4000 and len(view.log_tail) <= 50
        assert any("thread(s) beyond" in note for note in view.trimmed)
        assert any("process(es) beyond the first 8" in note for note in view.trimmed)


class TestCapture:
    def test_capture_publishes_one_serving_debug_and_returns_pending_with_the_task_id(
        self, world: GatewayWorld, bundles: MemoryBundles
    ) -> None:
        world.seed("gemma-a", phase=Phase.STALLED)
        world.core.debugging.capture_wait_s = 0.0

        view = world.core.debug_bundle("gemma-a", capture=True)

        (published,) = world.published()
        assert isinstance(published, CaptureDebugBundle)
        assert published.deployment_id == "gemma-a" and published.reason == "requested by a user"
        assert view.status == "pending" and view.task_id == published.command_id
        poll = f"tpu_control(action='capture_bundle', deployment_id='gemma-a', task_id='{published.command_id}')"
        assert poll in view.next_step
        assert f"tpuctl debug gemma-a --task-id {published.command_id}" in cli_text(view.next_step)
        again = world.core.debug_bundle("gemma-a", task_id=view.task_id)
        assert again.status == "pending" and world.published() == []

    @pytest.mark.anyio
    async def test_capture_over_mcp_publishes_once_and_polling_with_the_task_id_publishes_nothing(
        self, world: GatewayWorld, bundles: MemoryBundles
    ) -> None:
        world.seed("gemma-a", phase=Phase.STALLED)
        world.core.debugging.capture_wait_s = 0.0

        async with Client(world.server()) as session:
            captured = await session.call_tool("tpu_control", {"action": "capture_bundle", "deployment_id": "gemma-a"})
            (published,) = world.published()
            task_id = captured.structured_content["task_id"]
            polled = await session.call_tool(
                "tpu_control", {"action": "capture_bundle", "deployment_id": "gemma-a", "task_id": task_id}
            )
            read = await session.call_tool(
                "tpu_observe", {"show": "debug_bundle", "deployment_id": "gemma-a", "command_id": task_id}
            )

        assert not captured.is_error and captured.structured_content["status"] == "pending"
        assert isinstance(published, CaptureDebugBundle) and task_id == published.command_id
        assert polled.structured_content["status"] == "pending" and polled.structured_content["task_id"] == task_id
        assert read.structured_content["status"] == "pending" and read.structured_content["task_id"] == task_id
        assert world.published() == [], "a poll and a read publish nothing"

    def test_capture_with_a_task_id_is_refused_naming_the_flag_on_the_cli(
        self, world: GatewayWorld, bundles: MemoryBundles
    ) -> None:
        world.seed("gemma-a")
        code, _, stderr = tpuctl(world, "debug", "gemma-a", "--capture", "--task-id", new_command_id())
        assert code == cli.EXIT_USAGE and "[invalid_argument] --task-id" in stderr and "--capture" in stderr
        assert world.published() == []

    def test_a_stopped_deployment_is_refused_and_nothing_is_published(
        self, world: GatewayWorld, bundles: MemoryBundles
    ) -> None:
        world.seed("gemma-a", phase=Phase.STOPPED)
        with pytest.raises(GatewayError) as refused:
            world.core.debug_bundle("gemma-a", capture=True)
        assert refused.value.code == "failed_precondition" and refused.value.field == "deployment_id"
        assert "STOPPED" in refused.value.problem
        assert world.published() == []

    def test_the_node_answer_is_read_back_through_the_controller(
        self, world: GatewayWorld, bundles: MemoryBundles
    ) -> None:
        settings = world.settings
        world.bus.ensure_subscription(settings.topic_commands, CONTROLLER, filter=BENCHMARK_COMMAND_FILTER)
        world.bus.ensure_topic(settings.topic_node_tasks)
        world.bus.ensure_subscription(settings.topic_node_tasks, NODE, filter='attributes.deployment_id = "gemma-a"')
        service = NodeTasks(
            world.store, world.bus, SystemClock(), NodeTaskSettings(topic_node_tasks=settings.topic_node_tasks)
        )
        world.seed("gemma-a", phase=Phase.DEGRADED)
        world.core.debugging.capture_wait_s = 0.0
        pending = world.core.debug_bundle("gemma-a", capture=True)

        def node(delivery: Delivery) -> None:
            request = decode_message(delivery.data)
            assert isinstance(request, CaptureDebugBundle)
            name = bundle_object_name("gemma-a", request.command_id)
            bundles.put(name, encoded(a_bundle(request.command_id, reason=request.reason)))
            service.handle(
                NodeTaskCompleted(
                    command_id=new_command_id(),
                    issued_at=datetime.now(UTC),
                    deployment_id="gemma-a",
                    task_id=request.command_id,
                    action="debug",
                    status="completed",
                    detail="bundle kept",
                    bundle=name,
                )
            )

        def controller(delivery: Delivery) -> None:
            service.handle(decode_message(delivery.data))

        assert world.bus.pull(CONTROLLER, controller, timeout_s=0) == 1
        assert world.bus.pull(NODE, node, timeout_s=0) == 1

        assert pending.task_id is not None
        view = world.core.debug_bundle("gemma-a", task_id=pending.task_id)
        assert view.status == "ready" and view.reason == "requested by a user"
        operation = world.core.get_operation(pending.task_id)
        assert operation.done and operation.stage.startswith("completed: a debug bundle kept")
        read = f"tpu_observe(show='debug_bundle', deployment_id='gemma-a', command_id='{pending.task_id}')"
        assert read in operation.next_step
        assert world.core.debug_bundle("gemma-a").task_id == pending.task_id, "the newest bundle"
        (listed,) = world.core.get_deployment("gemma-a").node_tasks
        assert (listed.task_id, listed.action, listed.status) == (pending.task_id, "debug", "completed")


class TestWithoutAStore:
    def test_reading_without_a_bundle_store_names_the_setting(self, world: GatewayWorld) -> None:
        world.seed("gemma-a")
        task_id = kept_by_restart(world, MemoryBundles(), b"{}")
        with pytest.raises(GatewayError) as refused:
            world.core.debug_bundle("gemma-a", task_id=task_id)
        assert refused.value.code == "unavailable" and "TPUCTL_DEBUG_BUNDLE_BUCKET" in refused.value.fix

    def test_a_capture_without_a_bundle_store_is_refused_before_anything_is_published(
        self, world: GatewayWorld
    ) -> None:
        world.seed("gemma-a", phase=Phase.STALLED)
        with pytest.raises(GatewayError) as refused:
            world.core.debug_bundle("gemma-a", capture=True)
        assert refused.value.code == "unavailable" and "debug_bundle_bucket" in refused.value.fix
        assert world.published() == []


class TestCli:
    def test_debug_prints_each_process_state_and_its_innermost_frames(
        self, world: GatewayWorld, bundles: MemoryBundles
    ) -> None:
        world.seed("gemma-a")
        kept_by_restart(world, bundles, encoded(a_bundle("x")))

        code, stdout, stderr = tpuctl(world, "debug", "gemma-a")

        assert code == cli.EXIT_OK, stderr
        assert "pid 4300  T (stopped)  VLLM::EngineCore" in stdout
        assert "      all_reduce (/vllm/distributed/tpu.py:88)" in stdout
        assert "ERROR collective timed out" in stdout and "kv_cache_usage_perc=0.93" in stdout
        assert "chip 0  v6e  HBM 31.2/32 GiB" in stdout and "whole bundle: memory://bundles/" in stdout
        assert "untrusted" in stderr

    def test_json_output_and_the_cli_words_of_a_missing_bundle(
        self, world: GatewayWorld, bundles: MemoryBundles
    ) -> None:
        world.seed("gemma-a")
        code, _, stderr = tpuctl(world, "debug", "gemma-a")
        assert code == cli.EXIT_NOT_FOUND and "tpuctl debug gemma-a --capture" in stderr
        assert "tpu_" not in stderr, "the CLI names its own commands, not MCP tools"

        task_id = kept_by_restart(world, bundles, encoded(a_bundle("x")))
        code, stdout, _ = tpuctl(world, "--format", "json", "debug", "gemma-a", "--task-id", task_id)
        assert code == cli.EXIT_OK and json.loads(stdout)["processes"][1]["state"] == "T (stopped)"

    def test_a_capture_that_times_out_says_how_to_read_it_later(
        self, world: GatewayWorld, bundles: MemoryBundles
    ) -> None:
        world.seed("gemma-a")
        world.core.debugging.capture_wait_s = 0.0
        code, _, stderr = tpuctl(world, "debug", "gemma-a", "--capture", "--timeout", "0")
        (published,) = world.published()
        assert code == cli.EXIT_TIMEOUT and f"--task-id {published.command_id}" in stderr

    def test_the_exit_codes_are_the_clis(self) -> None:
        expected = {"ready": cli.EXIT_OK, "none": cli.EXIT_NOT_FOUND, "failed": cli.EXIT_FAILED}
        assert {**expected, "pending": cli.EXIT_TIMEOUT} == EXIT_OF_STATUS


def test_gauges_are_read_leniently() -> None:
    page = (
        "garbage line\n"
        'vllm:num_requests_running{engine="0"} 2\n'
        'vllm:num_requests_running{engine="1"} 3\n'
        "vllm:gpu_cache_usage_perc 0.5\n"
        'vllm:kv_cache_usage_perc{engine="1"} 0.7\n'
        "vllm:num_requests_waiting NaN\n"
        "vllm:num_requests_waiting{x} notanumber\n"
    )
    assert metric_gauges(page) == {"num_requests_running": 5.0, "kv_cache_usage_perc": 0.7}
    assert metric_gauges(None) == {}


class TestComposition:
    def test_the_embedded_default_reads_bundles_from_the_data_dir(self, world: GatewayWorld, tmp_path: Path) -> None:
        ports = build_ports(Settings(backend="local", data_dir=tmp_path))  # the world's store and bus live here
        try:
            assert ports.debug_bundles is not None
            world.seed("gemma-a")
            task_id = new_command_id()
            written = ports.debug_bundles.put(bundle_object_name("gemma-a", task_id), encoded(a_bundle(task_id)))
            now = datetime.now(UTC)
            world.store.create_node_task(
                NodeTask(
                    task_id=task_id,
                    deployment_id="gemma-a",
                    action="debug",
                    status="completed",
                    requested_at=now,
                    finished_at=now,
                    bundle=bundle_object_name("gemma-a", task_id),
                )
            )

            view = GatewayCore(ports).debug_bundle("gemma-a")

            assert view.status == "ready" and view.location == written and Path(written).is_file()
            assert view.processes[1].state == "T (stopped)"
        finally:
            ports.close()

    def test_google_cloud_without_a_bucket_has_no_bundle_store(self, tmp_path: Path) -> None:
        settings = Settings(backend="gcp", project="tpuctl-test", data_dir=tmp_path, debug_bundle_bucket=None)
        assert build_ports(settings).debug_bundles is None
        with_bucket = Settings(
            backend="gcp", project="tpuctl-test", data_dir=tmp_path, debug_bundle_bucket="tpuctl-test-debug-bundles"
        )
        assert build_ports(with_bucket).debug_bundles is not None

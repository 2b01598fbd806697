"""Container control over the in-memory MCP client: tail the vLLM log, follow a restart, see node tasks.

The controller and the node agent are played by the real ``NodeTasks`` service on the same SQLite store and
local bus: it takes the gateway's command off the commands topic, dispatches it on the node-tasks topic, and
the "node" answers with ``node.task_completed`` through the same service.
"""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from mcp import Client

from localcloud.runner import BENCHMARK_COMMAND_FILTER
from mcp_client_gateway.cli import EXIT_OK, EXIT_REFUSED, EXIT_TIMEOUT, EXIT_USAGE, run
from shared.adapters.clock import SystemClock
from shared.domain.models import NodeTask, Phase
from shared.messages import NodeTaskCompleted, RestartServing, TailServingLogs, decode_message, new_command_id
from shared.ports import Delivery
from shared.services.node_tasks import NodeTasks, NodeTaskSettings
from tests.mcp.conftest import GatewayWorld, refusal_confirmation, text

pytestmark = pytest.mark.anyio

CONTROLLER = "test-benchmark-fn"
NODE = "test-node-gemma-a"
VLLM_LINES = (
    "INFO 12-02 12:00:00 [api_server.py:1] Starting vLLM API server on http://0.0.0.0:8000",
    "WARNING 12-02 12:00:01 [tpu.py:2] \x1b[33mcompile cache miss\x1b[0m\x07",
    "INFO 12-02 12:00:02 [engine.py:3] Application startup complete.",
)


class Cloud:
    """The benchmark function and the node agent, driven by hand or from a thread."""

    def __init__(self, world: GatewayWorld) -> None:
        self.world = world
        settings = world.settings
        world.bus.ensure_subscription(settings.topic_commands, CONTROLLER, filter=BENCHMARK_COMMAND_FILTER)
        world.bus.ensure_topic(settings.topic_node_tasks)
        world.bus.ensure_subscription(settings.topic_node_tasks, NODE, filter='attributes.deployment_id = "gemma-a"')
        self.service = NodeTasks(
            world.store, world.bus, SystemClock(), NodeTaskSettings(topic_node_tasks=settings.topic_node_tasks)
        )
        self.answered: list[NodeTaskCompleted] = []

    def step(self) -> int:
        """Dispatch what the gateway published, then answer what reached the node; returns messages handled."""
        handled = self.world.bus.pull(CONTROLLER, self._dispatch, timeout_s=0)
        return handled + self.world.bus.pull(NODE, self._answer, timeout_s=0)

    def _dispatch(self, delivery: Delivery) -> None:
        self.service.handle(decode_message(delivery.data))

    def _answer(self, delivery: Delivery) -> None:
        request = decode_message(delivery.data)
        logs = isinstance(request, TailServingLogs)
        assert logs or isinstance(request, RestartServing)
        answer = NodeTaskCompleted(
            command_id=new_command_id(),
            issued_at=datetime.now(UTC),
            deployment_id=request.deployment_id,
            task_id=request.command_id,
            action="logs" if logs else "restart",
            status="completed",
            detail=f"{len(VLLM_LINES)} lines" if logs else "container tpuctl-vllm restarted",
            lines=VLLM_LINES if logs else (),
        )
        self.answered.append(answer)
        self.service.handle(answer)


@pytest.fixture
def cloud(world: GatewayWorld) -> Cloud:
    return Cloud(world)


@pytest.fixture
def node_running(cloud: Cloud) -> Iterator[Cloud]:
    """The cloud answering on its own in a thread, as the deployed controller and node would."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            if not cloud.step():
                time.sleep(0.05)

    thread = threading.Thread(target=loop, name="fake-cloud", daemon=True)
    thread.start()
    yield cloud
    stop.set()
    thread.join(timeout=5)
    assert not thread.is_alive()


async def call(world: GatewayWorld, tool: str, arguments: dict[str, Any], **kwargs: Any) -> Any:
    async with Client(world.server(**kwargs)) as session:
        return await session.call_tool(tool, arguments)


class TestSchema:
    async def test_the_control_tool_bounds_log_tail_lines_and_shapes_task_id(self, world: GatewayWorld) -> None:
        async with Client(world.server()) as session:
            tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        schema = tools["tpu_control"].input_schema
        assert schema["required"] == ["action", "deployment_id"]
        assert "log_tail" in schema["properties"]["action"]["enum"]
        assert schema["properties"]["lines"]["default"] == 100
        enforced = world.enforced_schemas()["tpu_control"]["properties"]  # the published schema leaves bounds out
        assert (enforced["lines"]["minimum"], enforced["lines"]["maximum"]) == (1, 500)
        assert "pattern" in str(enforced["task_id"])
        output = tools["tpu_control"].output_schema
        assert output is not None and {"$ref": "#/$defs/ServingLogsView"} in output["anyOf"]
        tail_view = output["$defs"]["ServingLogsView"]
        assert {"notice", "task_id", "status", "lines"} <= set(tail_view["properties"])

    async def test_read_only_mode_leaves_control_out_because_the_tail_publishes(self, world: GatewayWorld) -> None:
        async with Client(world.server(read_only=True)) as session:
            names = {tool.name for tool in (await session.list_tools()).tools}
        assert "tpu_control" not in names and "tpu_observe" in names


class TestTail:
    async def test_the_node_answer_within_the_wait_comes_back_sanitised_and_untrusted(
        self, world: GatewayWorld, node_running: Cloud
    ) -> None:
        world.seed("gemma-a", phase=Phase.SERVING)

        result = await call(world, "tpu_control", {"action": "log_tail", "deployment_id": "gemma-a", "lines": 3})

        assert not result.is_error, text(result)
        body = result.structured_content
        assert body["status"] == "completed" and body["done"] is True
        assert body["notice"].startswith("Untrusted data")
        assert body["lines"][0] == VLLM_LINES[0]
        assert body["lines"][1] == "WARNING 12-02 12:00:01 [tpu.py:2] compile cache miss"
        assert "\x1b" not in "".join(body["lines"]) and "\x07" not in "".join(body["lines"])
        assert "untrusted data" in text(result)
        (answer,) = node_running.answered
        assert answer.task_id == body["task_id"]

    async def test_without_an_answer_it_returns_the_task_id_and_a_later_call_reads_it(
        self, world: GatewayWorld, cloud: Cloud
    ) -> None:
        world.seed("gemma-a", phase=Phase.DOWN)
        world.core.tail_wait_s = 0.3
        started = time.monotonic()

        pending = await call(world, "tpu_control", {"action": "log_tail", "deployment_id": "gemma-a", "lines": 50})

        assert time.monotonic() - started < 3
        body = pending.structured_content
        assert body["status"] == "pending" and body["done"] is False and body["lines"] == []
        assert body["task_id"] in body["next_step"] and body["task_id"] in text(pending)
        again = f"tpu_control(action='log_tail', deployment_id='gemma-a', task_id='{body['task_id']}')"
        assert again in body["next_step"], "the next step names the call that reads the answer"
        (published,) = [m for m in world.published() if isinstance(m, TailServingLogs)]
        assert published.command_id == body["task_id"] and published.lines == 50

        assert cloud.step() == 2
        read = await call(
            world, "tpu_control", {"action": "log_tail", "deployment_id": "gemma-a", "task_id": body["task_id"]}
        )

        assert read.structured_content["status"] == "completed"
        assert len(read.structured_content["lines"]) == 3
        assert world.published() == [], "reading an answer publishes nothing"

    async def test_a_task_the_controller_has_not_recorded_yet_reads_pending(self, world: GatewayWorld) -> None:
        world.seed("gemma-a")
        world.core.tail_wait_s = 0.0
        first = await call(world, "tpu_control", {"action": "log_tail", "deployment_id": "gemma-a"})
        task_id = first.structured_content["task_id"]
        again = await call(world, "tpu_control", {"action": "log_tail", "deployment_id": "gemma-a", "task_id": task_id})
        assert again.structured_content["status"] == "pending"

    async def test_a_deployment_without_a_node_is_refused_naming_its_phase(self, world: GatewayWorld) -> None:
        world.seed("gemma-a", phase=Phase.PROVISIONING)
        result = await call(world, "tpu_control", {"action": "log_tail", "deployment_id": "gemma-a"})
        assert result.is_error
        assert "[failed_precondition] deployment_id" in text(result) and "PROVISIONING" in text(result)
        assert world.published() == []

    @pytest.mark.parametrize(
        ("arguments", "expected"),
        [
            ({"deployment_id": "gemma-a", "lines": 0}, "lines"),
            ({"deployment_id": "gemma-a", "lines": 501}, "lines"),
            ({"deployment_id": "Gemma_A"}, "deployment_id"),
            ({"deployment_id": "gemma-a", "task_id": "not-a-uuid"}, "task_id"),
            ({"deployment_id": "gemma-zz"}, "[not_found] deployment_id"),
            ({"deployment_id": "gemma-a", "task_id": "00000000-0000-4000-8000-00000000abcd"}, "[not_found] task_id"),
        ],
    )
    async def test_bad_input_is_refused_naming_the_field(
        self, world: GatewayWorld, arguments: dict[str, Any], expected: str
    ) -> None:
        world.seed("gemma-a")
        result = await call(world, "tpu_control", {"action": "log_tail", **arguments})
        assert result.is_error and expected in text(result)
        assert world.published() == []

    async def test_the_task_id_of_a_restart_is_not_a_log_tail(self, world: GatewayWorld) -> None:
        world.seed("gemma-a")
        restart = NodeTask(
            task_id=new_command_id(), deployment_id="gemma-a", action="restart", requested_at=datetime.now(UTC)
        )
        world.store.create_node_task(restart)
        result = await call(
            world, "tpu_control", {"action": "log_tail", "deployment_id": "gemma-a", "task_id": restart.task_id}
        )
        assert result.is_error and "[invalid_argument] task_id" in text(result) and "restart" in text(result)


class TestFollowingNodeTasks:
    async def test_a_restart_reads_completed_with_its_time_and_the_dashboard_lists_it(
        self, world: GatewayWorld, cloud: Cloud
    ) -> None:
        world.seed("gemma-a", phase=Phase.STALLED)
        refused = await call(world, "tpu_control", {"action": "restart", "deployment_id": "gemma-a"})
        token = refusal_confirmation(refused)["confirm"]
        accepted = await call(world, "tpu_control", {"action": "restart", "deployment_id": "gemma-a", "confirm": token})
        command_id = accepted.structured_content["command_id"]

        queued = await call(world, "tpu_status", {"command_id": command_id})
        assert queued.structured_content["done"] is False and queued.structured_content["node_task"] is None

        assert cloud.step() == 2
        done = await call(world, "tpu_status", {"command_id": command_id})

        body = done.structured_content
        assert body["done"] is True and body["kind"] == "serving.restart"
        assert body["stage"].startswith("completed: restarted at 20")
        assert "container tpuctl-vllm restarted" in body["stage"]
        assert body["node_task"]["status"] == "completed" and body["node_task"]["action"] == "restart"
        dashboard = await call(world, "tpu_status", {"deployment_id": "gemma-a"})
        (listed,) = dashboard.structured_content["node_tasks"]
        assert listed["task_id"] == command_id and listed["status"] == "completed"

    async def test_an_unanswered_task_reads_failed_after_the_timeout(self, world: GatewayWorld) -> None:
        world.seed("gemma-a")
        long_ago = datetime.now(UTC) - timedelta(seconds=world.settings.node_task_timeout_s + 60)
        task = NodeTask(
            task_id=new_command_id(),
            deployment_id="gemma-a",
            action="logs",
            requested_at=long_ago,
            dispatched_at=long_ago,
        )
        world.store.create_node_task(task)

        view = await call(world, "tpu_status", {"command_id": task.task_id})
        tail = await call(
            world, "tpu_control", {"action": "log_tail", "deployment_id": "gemma-a", "task_id": task.task_id}
        )

        assert view.structured_content["done"] is True and view.structured_content["kind"] == "serving.logs"
        assert "failed: the node agent did not answer within 300 s" in view.structured_content["stage"]
        assert tail.structured_content["status"] == "failed" and "did not answer" in tail.structured_content["detail"]


def tpuctl(world: GatewayWorld, *argv: str) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    code = run(list(argv), ports=world.ports, stdout=stdout, stderr=stderr)
    return code, stdout.getvalue(), stderr.getvalue()


class TestCli:
    def test_logs_tail_prints_the_node_lines_literally(self, world: GatewayWorld, node_running: Cloud) -> None:
        world.seed("gemma-a")
        code, stdout, stderr = tpuctl(world, "logs", "gemma-a", "--tail", "3")
        assert code == EXIT_OK, stderr
        assert stdout.splitlines()[0] == VLLM_LINES[0] and "\x1b" not in stdout
        assert "untrusted" in stderr

    def test_a_tail_without_an_answer_times_out_with_the_task_id_then_reads_it(
        self, world: GatewayWorld, cloud: Cloud
    ) -> None:
        world.seed("gemma-a")
        world.core.tail_wait_s = 0.0
        code, _, stderr = tpuctl(world, "logs", "gemma-a", "--tail", "3", "--timeout", "0")
        assert code == EXIT_TIMEOUT
        (published,) = [m for m in world.published() if isinstance(m, TailServingLogs)]
        assert f"--task-id {published.command_id}" in stderr

        cloud.step()
        code, stdout, _ = tpuctl(world, "--format", "json", "logs", "gemma-a", "--task-id", published.command_id)
        assert code == EXIT_OK and json.loads(stdout)["lines"][2] == VLLM_LINES[2]

    def test_tail_needs_a_deployment_and_a_sane_line_count(self, world: GatewayWorld) -> None:
        world.seed("gemma-a")
        assert tpuctl(world, "logs", "--tail", "5")[0] == EXIT_USAGE
        code, _, stderr = tpuctl(world, "logs", "gemma-a", "--tail", "0")
        assert code == EXIT_USAGE and "[invalid_argument] --tail: 0 is below the minimum of 1" in stderr
        assert world.published() == []

    def test_restart_needs_confirmation_then_publishes(self, world: GatewayWorld) -> None:
        world.seed("gemma-a")
        assert tpuctl(world, "--quiet", "restart", "gemma-a")[0] == EXIT_REFUSED
        assert world.published() == []
        code, _, stderr = tpuctl(world, "restart", "gemma-a", "--confirm", "gemma-a")
        assert code == EXIT_OK, stderr
        (message,) = world.published()
        assert isinstance(message, RestartServing) and message.reason == "user_request"

    def test_restart_wait_follows_the_node_answer(self, world: GatewayWorld, node_running: Cloud) -> None:
        world.seed("gemma-a", phase=Phase.DEGRADED)
        code, stdout, stderr = tpuctl(
            world, "restart", "gemma-a", "--confirm", "gemma-a", "--wait", "--timeout", "20", "--poll-seconds", "0.1"
        )
        assert code == EXIT_OK, stderr
        assert "completed: restarted at" in stdout

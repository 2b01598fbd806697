"""The node agent's log-shipping thread (``ship_serving_logs``) beside the agent's own calls on the serving container.

The container is a real process behind the VM twin's Engine API socket; the sink hangs in ``write`` as a Cloud
Logging that accepts connections and never answers would, until the test lets it go.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from node_agent.agent import NodeAgentSettings, ship_serving_logs
from shared.adapters.docker_engine import DockerEngineContainer
from shared.ports import NodeLogLine
from tests.support.serving_container import serve_stand_in


class HangingSink:
    """Takes nothing until released; remembers what it was given and whether it was closed."""

    def __init__(self) -> None:
        self.called = threading.Event()
        self.release = threading.Event()
        self.taken: list[NodeLogLine] = []
        self.closed = False

    def write(self, lines: Sequence[NodeLogLine]) -> None:
        self.called.set()
        self.release.wait(30)
        self.taken.extend(lines)

    def close(self) -> None:
        self.closed = True


def test_a_hanging_sink_never_holds_up_the_agents_container_calls(tmp_path: Path) -> None:
    lines = ("(APIServer pid=1) WARNING 12-03 19:32:07 [cpu.py:224] Triton is not installed.", "plain line")
    with serve_stand_in(tmp_path / "node", lines=lines) as stand_in:
        settings = NodeAgentSettings(
            deployment_id="gemma-a", node_docker_host=stand_in.docker_host, node_log_flush_s=0.1
        )
        agent_side = DockerEngineContainer(stand_in.docker_host, "tpuctl-vllm", timeout_s=5)
        deadline = time.monotonic() + 10
        while not any("plain line" in line for line in agent_side.tail(10)):  # the container wrote its lines
            assert time.monotonic() < deadline
            time.sleep(0.05)
        sink, stop = HangingSink(), threading.Event()
        shipping = threading.Thread(
            target=ship_serving_logs,
            args=(sink, settings),
            kwargs={"api_key": None, "journal_dir": tmp_path / "journal", "stop": stop},
            daemon=True,
        )
        shipping.start()
        try:
            assert sink.called.wait(10), "the shipper reached the sink"
            started = time.monotonic()
            assert any("plain line" in line for line in agent_side.tail(10))
            assert agent_side.restart(timeout_s=5).status == "running"
            assert time.monotonic() - started < 8, "tail and restart did not wait for the shipper"
        finally:
            stop.set()
            sink.release.set()
            shipping.join(timeout=30)
            agent_side.close()
    assert not shipping.is_alive() and sink.closed
    assert [(line.severity, line.text) for line in sink.taken[:3]] == [
        ("DEFAULT", "boot 1"), ("WARNING", lines[0]), ("DEFAULT", lines[1]),
    ]  # fmt: skip
    state = json.loads((tmp_path / "journal" / "log-shipper.json").read_text(encoding="utf-8"))
    assert state["container"] == "tpuctl-vllm" and state["time_ns"] == sink.taken[-1].time_ns

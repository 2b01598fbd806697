"""A debug bundle of a REAL vLLM on CPU whose engine core is frozen: what the node agent keeps before a restart.

The session server runs in production's process layout (API server, EngineCore in a child process). The engine
core is frozen with SIGSTOP, as a hung engine is; the capture starts from the API server's pid (what ``docker
inspect`` reports as the container's process) and must find the engine core among its descendants, stopped, with
the Python frames of its busy loop read by py-spy without letting it run. Thawed in ``finally``.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from node_agent.forensics import STEPS, ForensicsSources, capture_bundle, encode_bundle
from shared.domain.debug_bundle import MAX_BUNDLE_BYTES
from shared.ports import ContainerState
from tests.integration.test_real_vllm import engine_core_pid
from tests.support.fixtures_vllm import VllmSession

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PY_SPY = Path(sys.executable).parent / "py-spy"  # requirements-dev.txt installs it into the venv
ENGINE_LOOP_FUNCTIONS = ("run_engine_core", "run_busy_loop")  # vllm/v1/engine/core.py, EngineCoreProc


class ServerAsContainer:
    """The session's vLLM as the node agent's ServingContainer sees it: its pid and its log."""

    def __init__(self, session: VllmSession) -> None:
        self.session = session

    def inspect(self) -> ContainerState:
        server = self.session.server
        return ContainerState(name="tpuctl-vllm", status="running", started_at=None, pid=server.pid)

    def restart(self, timeout_s: float) -> ContainerState:
        raise AssertionError("a capture never restarts the container")

    def tail(self, lines: int) -> list[str]:
        return self.session.server.log_tail(lines).splitlines()


def _wait_stopped(pid: int) -> None:
    for _ in range(100):
        if "State:\tT" in Path(f"/proc/{pid}/status").read_text():
            return
        time.sleep(0.02)
    raise AssertionError(f"EngineCore {pid} did not stop")


def test_a_frozen_engine_core_is_found_stopped_with_its_busy_loop_frames(vllm_server: VllmSession) -> None:
    server = vllm_server.ensure_running()
    engine = engine_core_pid(vllm_server)
    sources = ForensicsSources(
        container=ServerAsContainer(vllm_server),
        vllm_url=server.base_url,
        api_key=None,
        metadata_url=None,
        py_spy=PY_SPY,
        tpu_info=("tpuctl-no-such-tpu-info",),
    )
    started = time.monotonic()
    os.kill(engine, signal.SIGSTOP)
    try:
        _wait_stopped(engine)
        bundle = capture_bundle(
            sources,
            deployment_id="tiny-cpu",
            bundle_id="task-forensics",
            reason="serving.restart: STALLED",
            node="local",
            captured_at=datetime.now(UTC),
            log_lines=50,
            deadline_s=50.0,
        )
    finally:
        os.kill(engine, signal.SIGCONT)
    assert time.monotonic() - started < 60
    assert bundle["skipped"] == [] and set(bundle["timings_s"]) == set(STEPS)

    processes = {process["pid"]: process for process in bundle["processes"]}
    assert server.pid in processes and engine in processes, sorted(processes)
    core = processes[engine]
    assert core["state"] == "T (stopped)" and "EngineCore" in core["command"]
    assert core["stacks_error"] is None and core["threads"], core["stacks_error"]
    frames = [frame for thread in core["threads"] for frame in thread["frames"]]
    loop = [f for f in frames if f["file"].endswith("vllm/v1/engine/core.py")]
    assert any(f["function"].endswith(ENGINE_LOOP_FUNCTIONS) for f in loop), sorted({f["function"] for f in frames})

    api_server = processes[server.pid]
    assert api_server["threads"] and api_server["state"] != "T (stopped)"
    assert bundle["metrics"]["ok"] is True and "vllm:" in bundle["metrics"]["text"]  # the API server still answers
    assert bundle["log_tail"], "the server's own log lines"
    assert len(encode_bundle(bundle)) <= MAX_BUNDLE_BYTES

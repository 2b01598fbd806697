"""The node agent's debug bundle (``node_agent.forensics``) against real processes, a real py-spy and real HTTP.

The engine is a child Python process with named threads and a non-Python grandchild, frozen with SIGSTOP as a hung
engine would be; the container is a small stateful fake that reports its pid; vLLM's ``/metrics`` and the metadata
server's guest attributes come from an ``http.server`` on loopback. The API key is planted in the child's command
line, a thread name, the log lines, the metrics page and tpu-info's output, and must come out nowhere.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import node_agent
from node_agent.forensics import (
    PY_SPY_MISSING,
    STEPS,
    TPU_INFO_MISSING,
    ForensicsSources,
    capture_bundle,
    encode_bundle,
    find_py_spy,
)
from shared.domain.debug_bundle import BUNDLE_VERSION, MAX_BUNDLE_BYTES
from shared.ports import ContainerState

API_KEY = "forensic-key-7f3a9c2e"
PY_SPY = Path(sys.executable).parent / "py-spy"  # requirements-dev.txt installs it into the venv
CAPTURED_AT = datetime(2026, 12, 5, 6, 30, tzinfo=UTC)

ENGINE_SCRIPT = """
import subprocess, sys, threading, time

def wait_for_work_forever():
    while True:
        time.sleep(0.05)

def spin_the_engine_loop():
    while True:
        time.sleep(0.05)

threading.Thread(target=wait_for_work_forever, name="forensics-waiter", daemon=True).start()
threading.Thread(target=spin_the_engine_loop, name="forensics-spinner", daemon=True).start()
threading.Thread(target=wait_for_work_forever, name="holder-" + sys.argv[1], daemon=True).start()
helper = subprocess.Popen(["sleep", "120"])
print(helper.pid, flush=True)
spin_the_engine_loop()
"""

LOG_LINES = [
    "INFO 12-05 06:29:58 [core.py:100] EngineCore started",
    f"DEBUG request headers: Authorization: Bearer {API_KEY}",
    f"WARNING 12-05 06:30:01 [core.py:200] key {API_KEY} \x1b[31min red\x1b[0m",
]


class FakeContainer:
    """The serving container as a ServingContainer: a fixed state and log, or a failure for every call."""

    def __init__(self, pid: int | None, status: str = "running", fail: Exception | None = None) -> None:
        self.state = ContainerState(name="tpuctl-vllm", status=status, started_at=CAPTURED_AT, pid=pid)
        self.fail = fail
        self.tailed: list[int] = []

    def inspect(self) -> ContainerState:
        if self.fail is not None:
            raise self.fail
        return self.state

    def restart(self, timeout_s: float) -> ContainerState:
        raise AssertionError("a capture never restarts the container")

    def tail(self, lines: int) -> list[str]:
        self.tailed.append(lines)
        if self.fail is not None:
            raise self.fail
        return LOG_LINES[-lines:]


class _Handler(BaseHTTPRequestHandler):
    """vLLM's /metrics (Bearer required) and the metadata server's ``tpuctl`` guest attributes."""

    guest = {"phase": "serving", "detail": "health 200 after 41s", "boot": "1764915000"}
    seen_authorization: list[str | None] = []

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        prefix = "/computeMetadata/v1/instance/guest-attributes/tpuctl/"
        if self.path == "/metrics":
            self.seen_authorization.append(self.headers.get("Authorization"))
            if self.headers.get("Authorization") != f"Bearer {API_KEY}":
                return self._send(401, "unauthorized")
            return self._send(
                200, f'# HELP vllm:num_requests_running x\nvllm:num_requests_running{{k="{API_KEY}"}} 3\n'
            )
        if not self.path.startswith(prefix):
            return self._send(404, "not found")
        if self.headers.get("Metadata-Flavor") != "Google":
            return self._send(403, 'Missing required header "Metadata-Flavor": "Google"')
        key = self.path.removeprefix(prefix)
        if key == "":
            return self._send(200, "".join(f"{name}\n" for name in self.guest))
        return self._send(200, self.guest[key]) if key in self.guest else self._send(404, "not found")

    def _send(self, status: int, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def local_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Handler.seen_authorization = []
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def frozen_engine(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """(engine pid, its non-Python helper's pid), the engine SIGSTOPped; thawed and killed (group) afterwards."""
    script = tmp_path / "engine.py"
    script.write_text(ENGINE_SCRIPT, encoding="utf-8")
    child = subprocess.Popen(
        [sys.executable, str(script), API_KEY], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert child.stdout is not None
        helper = int(child.stdout.readline())
        time.sleep(0.3)  # the threads are started before the line; let them reach their loops
        os.kill(child.pid, signal.SIGSTOP)
        _wait_for_state(child.pid, "T")
        yield child.pid, helper
    finally:
        os.kill(child.pid, signal.SIGCONT)
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
        if child.stdout is not None:
            child.stdout.close()


def _wait_for_state(pid: int, letter: str) -> None:
    for _ in range(100):
        if f"State:\t{letter}" in Path(f"/proc/{pid}/status").read_text():
            return
        time.sleep(0.02)
    raise AssertionError(f"process {pid} never reached state {letter}")


def _tpu_info_script(tmp_path: Path) -> Path:
    script = tmp_path / "fake-tpu-info"
    script.write_text(f"#!{sys.executable}\nprint('TPU v6e chips: 1')\nprint('HBM used 12 GiB {API_KEY}')\n")
    script.chmod(0o755)
    return script


def _sources(container: FakeContainer, base_url: str, **changes: Any) -> ForensicsSources:
    fields: dict[str, Any] = {
        "container": container,
        "vllm_url": base_url,
        "api_key": API_KEY,
        "metadata_url": f"{base_url}/computeMetadata/v1",
        "py_spy": PY_SPY,
        "tpu_info": ("tpuctl-no-such-tpu-info",),
    }
    return ForensicsSources(**{**fields, **changes})


def _capture(sources: ForensicsSources, **changes: Any) -> dict[str, Any]:
    arguments: dict[str, Any] = {
        "deployment_id": "tiny-cpu",
        "bundle_id": "task-0001",
        "reason": "serving.restart: STALLED for 120 s",
        "node": "node-1",
        "captured_at": CAPTURED_AT,
    }
    return capture_bundle(sources, **{**arguments, **changes})


def _closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_a_frozen_engine_is_captured_with_its_threads_state_children_logs_metrics_and_boot(
    frozen_engine: tuple[int, int], local_server: str, tmp_path: Path
) -> None:
    engine, helper = frozen_engine
    container = FakeContainer(pid=engine)
    sources = _sources(container, local_server, tpu_info=(str(_tpu_info_script(tmp_path)),))
    bundle = _capture(sources, log_lines=2)

    assert bundle["version"] == BUNDLE_VERSION and bundle["captured_at"] == CAPTURED_AT.isoformat()
    assert bundle["container"] == {
        "name": "tpuctl-vllm",
        "status": "running",
        "pid": engine,
        "started_at": CAPTURED_AT.isoformat(),
        "error": None,
    }
    processes = {p["pid"]: p for p in bundle["processes"]}
    assert set(processes) == {engine, helper}
    main = processes[engine]
    assert main["state"] == "T (stopped)" and main["stacks_error"] is None
    assert "engine.py [REDACTED]" in main["command"]
    names = {thread["name"] for thread in main["threads"]}
    assert {"MainThread", "forensics-waiter", "forensics-spinner", "holder-[REDACTED]"} <= names
    functions = {frame["function"] for thread in main["threads"] for frame in thread["frames"]}
    assert {"wait_for_work_forever", "spin_the_engine_loop"} <= functions
    assert all(isinstance(frame["line"], int) for thread in main["threads"] for frame in thread["frames"])
    assert processes[helper]["ppid"] == engine and processes[helper]["threads"] == []
    assert "python" in processes[helper]["stacks_error"].lower()  # not a Python process: py-spy says why
    assert bundle["stacks_note"] is None

    assert container.tailed == [2]
    assert bundle["log_tail"] == [
        "DEBUG request headers: Authorization: Bearer [REDACTED]",
        "WARNING 12-05 06:30:01 [core.py:200] key [REDACTED] in red",
    ]
    assert bundle["metrics"]["ok"] is True and "vllm:num_requests_running" in bundle["metrics"]["text"]
    assert _Handler.seen_authorization == [f"Bearer {API_KEY}"]
    assert bundle["tpu_info"] == {"ok": True, "text": "TPU v6e chips: 1\nHBM used 12 GiB [REDACTED]", "error": None}
    assert bundle["boot"]["ok"] is True
    assert bundle["boot"]["attributes"] == {"phase": "serving", "detail": "health 200 after 41s", "boot": "1764915000"}
    assert set(bundle["timings_s"]) == set(STEPS) and bundle["skipped"] == []

    data = encode_bundle(bundle)
    assert API_KEY.encode() not in data and API_KEY not in json.dumps(bundle)
    assert json.loads(data) == bundle


def test_a_container_without_a_process_gives_no_processes_and_says_so(local_server: str) -> None:
    bundle = _capture(_sources(FakeContainer(pid=None, status="exited"), local_server))
    assert bundle["processes"] == []
    assert "no process" in bundle["stacks_note"]
    assert bundle["container"]["status"] == "exited"
    assert len(bundle["log_tail"]) == 3  # the dead container's log is the evidence that is left


def test_without_py_spy_the_processes_are_listed_and_the_note_gives_the_fix(
    frozen_engine: tuple[int, int], local_server: str
) -> None:
    engine, _ = frozen_engine
    bundle = _capture(_sources(FakeContainer(pid=engine), local_server, py_spy=None))
    assert bundle["stacks_note"] == PY_SPY_MISSING and "node_agent_requirements.txt" in PY_SPY_MISSING
    main = next(p for p in bundle["processes"] if p["pid"] == engine)
    assert main["state"] == "T (stopped)" and main["threads"] == []
    assert main["stacks_error"] == "py-spy not installed"


def test_a_pid_outside_the_agents_pid_namespace_is_recorded_with_the_fix(local_server: str) -> None:
    invisible = int(Path("/proc/sys/kernel/pid_max").read_text()) + 7  # no process can have it
    bundle = _capture(_sources(FakeContainer(pid=invisible), local_server))
    assert f"process {invisible} is not visible" in bundle["stacks_note"] and "--pid=host" in bundle["stacks_note"]
    assert [(p["pid"], p["state"]) for p in bundle["processes"]] == [(invisible, "gone (no /proc entry)")]
    assert bundle["processes"][0]["stacks_error"]  # py-spy's own account of it


def test_a_missing_tpu_info_is_recorded_with_how_to_install_it(local_server: str) -> None:
    bundle = _capture(_sources(FakeContainer(pid=None), local_server))
    assert bundle["tpu_info"] == {"ok": False, "text": "", "error": TPU_INFO_MISSING}
    assert "pip install tpu-info" in TPU_INFO_MISSING


def test_a_refused_metrics_and_metadata_server_are_recorded_not_raised() -> None:
    dead = _closed_port_url()
    bundle = _capture(_sources(FakeContainer(pid=None), dead, metadata_url=f"{dead}/computeMetadata/v1"))
    assert bundle["metrics"]["ok"] is False and "ConnectError" in bundle["metrics"]["error"]
    assert bundle["boot"]["ok"] is False and bundle["boot"]["attributes"] == {}
    assert bundle["boot"]["error"]


def test_metrics_answering_an_error_is_not_ok(local_server: str) -> None:
    bundle = _capture(_sources(FakeContainer(pid=None), local_server, api_key="another-key-0001"))
    assert bundle["metrics"] == {"ok": False, "text": "", "error": "HTTP 401: unauthorized"}


def test_a_failing_container_is_recorded_in_the_bundle(local_server: str) -> None:
    failing = FakeContainer(pid=None, fail=RuntimeError(f"engine socket gone ({API_KEY})"))
    bundle = _capture(_sources(failing, local_server))
    assert bundle["container"]["error"] == "inspect failed: RuntimeError: engine socket gone ([REDACTED])"
    assert bundle["log_tail"] == [] and "tail failed: RuntimeError" in bundle["log_error"]
    assert bundle["processes"] == [] and bundle["metrics"]["ok"] is True


def test_a_spent_deadline_records_every_step_as_skipped(frozen_engine: tuple[int, int], local_server: str) -> None:
    engine, _ = frozen_engine
    container = FakeContainer(pid=engine)
    bundle = _capture(_sources(container, local_server), deadline_s=0)
    assert bundle["skipped"] == list(STEPS)
    assert container.tailed == [] and _Handler.seen_authorization == []
    assert bundle["processes"] == [] and "skipped" in bundle["stacks_note"]
    for part in ("metrics", "tpu_info", "boot"):
        assert bundle[part]["ok"] is False and bundle[part]["error"].startswith("skipped: ")


def _oversized_bundle() -> dict[str, Any]:
    frames = [{"function": f"f{i}", "file": "/x.py", "line": i} for i in range(400)]
    threads = [
        {"thread_id": n, "name": f"t{n}", "active": False, "owns_gil": False, "frames": frames} for n in range(50)
    ]
    return {
        "version": BUNDLE_VERSION,
        "bundle_id": "task-0001",
        "processes": [{"pid": 1, "threads": threads, "stacks_error": None}],
        "log_tail": [f"{n:06d} " + "x" * 200 for n in range(20_000)],
        "metrics": {"ok": True, "text": "m" * (3 * 1024 * 1024), "error": None},
        "trimmed": [],
    }


def test_an_oversized_bundle_is_trimmed_in_order_below_the_limit_and_says_what_went() -> None:
    bundle = _oversized_bundle()
    data = encode_bundle(bundle)
    assert len(data) <= MAX_BUNDLE_BYTES
    decoded = json.loads(data)
    assert decoded["trimmed"][0] == f"metrics text ({3 * 1024 * 1024} characters)"
    assert decoded["trimmed"][1].endswith("oldest log lines")
    assert decoded["metrics"]["text"] == "" and decoded["log_tail"][-1].startswith("019999 ")
    assert 0 < len(decoded["log_tail"]) < 20_000
    assert len(bundle["log_tail"]) == 20_000 and bundle["trimmed"] == []  # the caller's bundle is left as it was


def test_deep_stacks_are_cut_to_the_innermost_frames_when_logs_are_not_enough() -> None:
    bundle = _oversized_bundle()
    deep = [{"function": f"frame_{i}_" + "y" * 100, "file": "/x.py", "line": i} for i in range(2000)]
    bundle["processes"][0]["threads"] = [{"thread_id": n, "name": "t", "frames": deep} for n in range(40)]
    decoded = json.loads(encode_bundle(bundle))
    assert decoded["log_tail"] == []
    assert decoded["trimmed"][2] == f"{40 * (2000 - 60)} frames beyond the 60 innermost of each thread"
    kept = decoded["processes"][0]["threads"][0]["frames"]
    assert len(kept) == 60 and kept[0]["function"].startswith("frame_0_")


def test_find_py_spy_takes_path_first_then_the_bundle_s_bin_then_the_interpreter_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    on_path = tmp_path / "path"
    on_path.mkdir()
    target = tmp_path / "lib"
    (target / "node_agent").mkdir(parents=True)
    (target / "bin").mkdir()
    for folder in (on_path, target / "bin"):
        (folder / "py-spy").write_text("#!/bin/sh\n")
        (folder / "py-spy").chmod(0o755)
    monkeypatch.setattr(node_agent, "__file__", str(target / "node_agent" / "__init__.py"))
    monkeypatch.setenv("PATH", str(on_path))
    assert find_py_spy() == on_path / "py-spy"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert find_py_spy() == target / "bin" / "py-spy"
    (target / "bin" / "py-spy").unlink()
    interpreter_bin = tmp_path / "venv" / "bin"
    interpreter_bin.mkdir(parents=True)
    monkeypatch.setattr(sys, "executable", str(interpreter_bin / "python"))
    assert find_py_spy() is None
    (interpreter_bin / "py-spy").write_text("#!/bin/sh\n")
    (interpreter_bin / "py-spy").chmod(0o755)
    assert find_py_spy() == interpreter_bin / "py-spy", "a virtual environment's own py-spy"

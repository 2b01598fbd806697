"""Logs as a new user meets them on the local stack (#18 item 3): the window is wall time even when the
controller's clock is a simulator running ahead, vLLM's own WARNING lines count as warnings, and the monitor's
probe access lines are left out unless asked for."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from mcp_client_gateway.cli import run
from mcp_client_gateway.core import GatewayCore
from shared.adapters.clock import ManualClock
from shared.domain.vllm_logs import is_probe_access
from tests.mcp.conftest import GatewayWorld

PROBES = [
    'INFO:     127.0.0.1:53956 - "GET /health HTTP/1.1" 200 OK',
    'INFO:      - "GET /v1/models HTTP/1.1" 200 OK',
    'INFO:      - "GET /metrics HTTP/1.1" 200 OK',
]
VLLM = [
    "(APIServer pid=8814) WARNING 12-03 19:49:02 [system_utils.py:255] Found ulimit of 20000",
    *PROBES * 40,
    'INFO:     127.0.0.1:1 - "POST /v1/completions HTTP/1.1" 200 OK',
    'INFO:      - "GET /health HTTP/1.1" 503 Service Unavailable',
]


def _write(folder: Path, name: str, lines: list[Any]) -> None:
    with (folder / name).open("a", encoding="utf-8") as handle:
        for line in lines:
            handle.write((json.dumps(line) if isinstance(line, dict) else line) + "\n")


def _ahead(world: GatewayWorld, days: float) -> GatewayCore:
    """The gateway as the local stack builds it: its clock follows a simulator far ahead of the wall."""
    clock = ManualClock(datetime.now(UTC) + timedelta(days=days))
    return GatewayCore(replace(world.ports, clock=clock))


def test_lines_written_now_are_read_when_the_controller_clock_runs_days_ahead(world: GatewayWorld) -> None:
    now = datetime.now(UTC).isoformat()
    _write(world.log_dir, "provision.jsonl", [{"severity": "INFO", "message": "requested", "time": now}])
    _write(world.log_dir, "vllm-gemma-a.log", VLLM[:1])
    view = _ahead(world, days=3).get_logs(minutes=10)
    assert {e.message for e in view.entries} >= {"requested"}
    assert any("Found ulimit" in e.message for e in view.entries)


def test_vllm_warning_lines_pass_a_warning_filter(world: GatewayWorld) -> None:
    _write(world.log_dir, "vllm-gemma-a.log", VLLM)
    view = world.core.get_logs(deployment_id="gemma-a", min_severity="WARNING")
    assert [e.severity for e in view.entries if "Found ulimit" in e.message] == ["WARNING"]
    assert [e.severity for e in view.entries if "503" in e.message] == ["ERROR"]


def test_probe_lines_are_left_out_by_default_and_counted(world: GatewayWorld) -> None:
    _write(world.log_dir, "vllm-gemma-a.log", VLLM)
    view = world.core.get_logs(deployment_id="gemma-a", limit=10)
    messages = [e.message for e in view.entries]
    assert not [m for m in messages if is_probe_access(m)], "no successful probe line by default"
    assert any("POST /v1/completions" in m for m in messages) and any("503" in m for m in messages)
    assert any("Found ulimit" in m for m in messages), "the limit is filled past the probe lines"
    assert view.probe_lines_hidden == len(PROBES) * 40

    shown = world.core.get_logs(deployment_id="gemma-a", limit=10, include_probes=True)
    assert shown.probe_lines_hidden == 0 and [e.message for e in shown.entries if is_probe_access(e.message)]


def test_the_cli_says_what_it_left_out_and_shows_it_with_probes(world: GatewayWorld) -> None:
    _write(world.log_dir, "vllm-gemma-a.log", VLLM)

    def tpuctl(*argv: str) -> tuple[int, str, str]:
        stdout, stderr = io.StringIO(), io.StringIO()
        code = run(list(argv), ports=world.ports, stdout=stdout, stderr=stderr)
        return code, stdout.getvalue(), stderr.getvalue()

    code, out, err = tpuctl("logs", "gemma-a")
    assert code == 0 and 'GET /health HTTP/1.1" 200' not in out and "POST /v1/completions" in out
    assert "120 line(s) of the monitor's own probes left out; --probes shows them" in err
    code, out, _ = tpuctl("logs", "gemma-a", "--probes")
    assert code == 0 and 'GET /health HTTP/1.1" 200' in out

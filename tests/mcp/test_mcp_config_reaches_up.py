"""The shipped ``mcp_config.json`` reaches the stack ``make up`` runs, and says what to do when none runs.

``python -m localcloud up`` is started the way ``make up`` starts it (only its publication root is a temporary
``var``, and vLLM is off); the gateway is then started from the shipped config's ``tpuctl`` entry, unchanged,
in the folder that holds that ``var``, and spoken to over stdio. It must read live quota from the stack's
simulator and publish on the stack's bus, so the stack's provisioner writes the deployment into the store the
gateway reads. After the stack stops, the same entry's ``tpuctl zones`` says to start it, not to log in to Google.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from shared.adapters.local_stack import NO_LOCAL_STACK, connection_path, read_connection

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[2]
TPUCTL = Path(sys.executable).parent / "tpuctl"
UP = (sys.executable, "-m", "localcloud", "up")  # what `make up` runs


def _shipped_entry() -> tuple[str, list[str]]:
    entry = json.loads((REPO_ROOT / "mcp_config.json").read_text(encoding="utf-8"))["mcpServers"]["tpuctl"]
    assert not entry.get("disabled"), "the local entry is the one enabled"
    return entry["command"], list(entry["args"])


def _clean_env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("TPUCTL_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    return env


@pytest.fixture
def up(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """``make up ARGS=--no-vllm``, publishing under ``tmp_path/var`` instead of the checkout's ``var``."""
    root = str(tmp_path / "var")
    with (tmp_path / "up.out").open("w", encoding="utf-8") as output:
        process = subprocess.Popen(
            [*UP, "--no-vllm", "--sim-port", "0", "--ui-port", "0", "--data-dir", "run", "--publish-root", root],
            cwd=tmp_path,
            env=_clean_env(),
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        deadline = time.monotonic() + 120
        while read_connection(connection_path(tmp_path / "var")) is None:
            assert process.poll() is None, (tmp_path / "up.out").read_text(encoding="utf-8")
            assert time.monotonic() < deadline, "make up published nothing within 120 s"
            time.sleep(0.2)
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


async def test_the_shipped_local_entry_serves_the_running_stack_and_names_make_up_once_it_stops(
    up: subprocess.Popen[str], tmp_path: Path
) -> None:
    command, args = _shipped_entry()
    assert command == "tpuctl" and args[0] == "mcp"
    connection = read_connection(connection_path(tmp_path / "var"))
    assert connection is not None and connection.data_dir == tmp_path / "run"
    params = StdioServerParameters(command=str(TPUCTL), args=args, env=_clean_env(), cwd=str(tmp_path))
    with (tmp_path / "gateway.stderr").open("w", encoding="utf-8") as errlog:
        async with Client(stdio_client(params, errlog=errlog)) as client:
            zones = await client.call_tool("tpu_plan", {"show": "zones", "accelerator": "v6e-1"})
            created = await client.call_tool(
                "tpu_deploy",
                {"deployment_id": "via-config", "model": "tiny-llama", "accelerator": "v6e-1", "zones": ["us-east5-b"]},
            )
            listed = await _until_listed(client, "via-config")

    assert not zones.is_error, zones.content
    live = zones.structured_content["live_quota"]
    assert live["read"] is True and live["limits"] > 0 and live["usage_source"] == "tpu_api", live
    assert not created.is_error, created.content
    assert [d["deployment_id"] for d in listed["deployments"]] == ["via-config"]
    assert (tmp_path / "run" / "state.sqlite").exists() and not (tmp_path / "var" / "state.sqlite").exists()
    page_url = re.search(r"status page: (http://127\.0\.0\.1:\d+/)", (tmp_path / "up.out").read_text(encoding="utf-8"))
    assert page_url, "make up serves the status page too"
    page = httpx.get(f"{page_url.group(1)}deployments/via-config", timeout=30)
    assert page.status_code == 200 and 'data-phase="' in page.text, "the deployment, read from the stack's store"

    up.send_signal(signal.SIGTERM)
    assert up.wait(timeout=60) == 0, (tmp_path / "up.out").read_text(encoding="utf-8")
    assert not connection_path(tmp_path / "var").exists(), "up removes its connection file on the way out"
    done = subprocess.run(
        [str(TPUCTL), *args[1:], "zones", "--format", "json"],
        cwd=tmp_path,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    stopped = json.loads(done.stdout)["live_quota"]
    assert stopped["read"] is False and NO_LOCAL_STACK in stopped["problem"], stopped
    assert "credentials" not in json.dumps(stopped)


async def _until_listed(client: Client, deployment_id: str, timeout_s: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        listed = await client.call_tool("tpu_status", {})
        assert not listed.is_error, listed.content
        content = listed.structured_content
        if any(d["deployment_id"] == deployment_id for d in content["deployments"]) or time.monotonic() > deadline:
            return content
        await anyio.sleep(0.5)

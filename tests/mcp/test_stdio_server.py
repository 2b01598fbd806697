"""The real thing: ``python -m mcp_client_gateway`` as a subprocess, spoken to over stdio by the SDK client."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.mcp.conftest import HF_TOKEN
from tests.mcp.test_tool_contract import EXPECTED

pytestmark = pytest.mark.anyio

REPO_ROOT = Path(__file__).resolve().parents[2]


async def test_the_gateway_serves_over_stdio_and_logs_json_to_stderr_only(tmp_path: Path) -> None:
    data_dir = tmp_path / "var"
    env = {key: value for key, value in os.environ.items() if not key.startswith("TPUCTL_")}
    env.update({"TPUCTL_BACKEND": "local", "TPUCTL_LOG_LEVEL": "DEBUG", "PYTHONPATH": str(REPO_ROOT)})
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "mcp_client_gateway", "--data-dir", str(data_dir)],
        env=env,
        cwd=str(REPO_ROOT),
    )
    stderr_path = tmp_path / "gateway.stderr"
    with stderr_path.open("w", encoding="utf-8") as errlog:
        async with Client(stdio_client(params, errlog=errlog)) as client:
            tools = await client.list_tools()
            listed = await client.call_tool("tpu_status", {})
            planned = await client.call_tool("tpu_plan", {"model": "gemma-4-e4b", "accelerator": "v6e-1"})
            saved = await client.call_tool("tpu_save_hf_token", {"token": HF_TOKEN})
            refused = await client.call_tool("tpu_control", {"action": "delete", "deployment_id": "ghost"})

    assert sorted(tool.name for tool in tools.tools) == sorted(EXPECTED)
    assert not listed.is_error and listed.structured_content["total"] == 0
    assert not planned.is_error and planned.structured_content["fits"] is True
    assert not saved.is_error and saved.structured_content["version"].endswith("/versions/1")
    assert (data_dir / "secrets" / "tpuctl-hf-token" / "v1").read_text(encoding="utf-8") == HF_TOKEN
    assert refused.is_error and "[not_found]" in refused.content[0].text

    lines = [line for line in stderr_path.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert lines, "the gateway logged nothing at DEBUG"
    for line in lines:
        record = json.loads(line)  # every stderr line is one JSON log object
        assert {"severity", "message", "logger"} <= set(record)
        assert HF_TOKEN not in line

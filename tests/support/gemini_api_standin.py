"""A stand-in of the Gemini API (``generateContent``, ``streamGenerateContent``) that keeps every request body.

Why: the extension test drives the real Gemini CLI headless, and what matters is what the CLI sends the model (the
function declarations it built from our MCP server's tool list, the context it loaded), not what a model answers.
Every call is answered with a one-word text reply and no function call, so the CLI ends its turn at once.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["GeminiApiStandIn"]

_REPLY = {
    "candidates": [{"content": {"role": "model", "parts": [{"text": "ok"}]}, "finishReason": "STOP", "index": 0}],
    "usageMetadata": {"promptTokenCount": 1, "candidatesTokenCount": 1, "totalTokenCount": 2},
}


class GeminiApiStandIn:
    """Serves on 127.0.0.1 (``base_url``) until ``close``; ``requests`` holds (path, parsed body) in arrival order."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, name="gemini-api-standin", daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def declared_functions(self) -> dict[str, dict[str, Any]]:
        """The function declarations of the last request that carried tools, by name."""
        for _, body in reversed(self.requests):
            declared = [f for tool in body.get("tools", []) for f in tool.get("functionDeclarations", [])]
            if declared:
                return {f["name"]: f for f in declared}
        return {}

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def _keep(self, path: str, body: dict[str, Any]) -> None:
        with self._lock:
            self.requests.append((path, body))

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        keep = self._keep

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                keep(self.path, json.loads(raw or b"{}"))
                if "streamGenerateContent" in self.path:
                    self._send("text/event-stream", f"data: {json.dumps(_REPLY)}\r\n\r\n".encode())
                elif "countTokens" in self.path:
                    self._send("application/json", json.dumps({"totalTokens": 1}).encode())
                else:
                    self._send("application/json", json.dumps(_REPLY).encode())

            def do_GET(self) -> None:
                self.send_error(404)

            def _send(self, content_type: str, data: bytes) -> None:
                self.send_response(200)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return

        return Handler

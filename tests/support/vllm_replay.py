"""A local HTTP endpoint that replays real vLLM 0.32.0 answers (captured in tests/fixtures/vllm/).

Why: the probe and the monitor are tested over real HTTP (httpx, sockets, status codes, timeouts) without
starting vLLM for every case, and the monitor benchmark needs 200 "servers" on 2 cores. Each deployment is a
path prefix (``/d/<name>``) on one port, with its own behaviour and its own ``/metrics`` text, so a test can
script a sequence (load, stall, crash) by changing them between ticks.

Behaviours per prefix: ``ok`` (default), ``engine_dead`` (``/health`` 503), ``hang`` (accepts, never answers),
``models_unavailable`` (``/v1/models`` 503), ``no_metrics`` (``/metrics`` 404). With ``api_key`` set, ``/v1/*``
answers 401 ``{"error":"Unauthorized"}`` without ``Authorization: Bearer <key>``, exactly as vLLM does.
"""

from __future__ import annotations

import re
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

__all__ = ["FIXTURES", "ReplayVllm", "real_metrics_text", "with_values"]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"
BEHAVIOURS = ("ok", "engine_dead", "hang", "models_unavailable", "no_metrics")


def real_metrics_text(name: str = "real_vllm_metrics.txt") -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def with_values(text: str, **values: float) -> str:
    """The capture with some samples replaced, by sample name (labels kept), e.g. ``running=2``.

    Short names: running, waiting, kv_cache_usage, generation_tokens, prompt_tokens, iterations,
    success_length (the ``finished_reason="length"`` series), preemptions.
    """
    names: dict[str, tuple[str, str | None]] = {
        "running": ("vllm:num_requests_running", None),
        "waiting": ("vllm:num_requests_waiting", None),
        "kv_cache_usage": ("vllm:kv_cache_usage_perc", None),
        "generation_tokens": ("vllm:generation_tokens_total", None),
        "prompt_tokens": ("vllm:prompt_tokens_total", None),
        "iterations": ("vllm:iteration_tokens_total_count", None),
        "preemptions": ("vllm:num_preemptions_total", None),
        "success_length": ("vllm:request_success_total", 'finished_reason="length"'),
    }
    for short, value in values.items():
        metric, label = names[short]
        pattern = re.compile(r"^(" + re.escape(metric) + r"(\{[^}]*\})? )\S+$", re.MULTILINE)
        replaced = 0

        def put(match: re.Match[str], value: float = value, label: str | None = label) -> str:
            nonlocal replaced
            if label is not None and label not in (match.group(2) or ""):
                return match.group(0)
            replaced += 1
            return f"{match.group(1)}{float(value)!r}"

        text = pattern.sub(put, text)
        if replaced == 0:
            raise KeyError(f"{short}: no sample {metric} in the metrics text")
    return text


@dataclass
class _Endpoint:
    behaviour: str = "ok"
    metrics: str = ""


@dataclass
class ReplayVllm:
    """A threaded HTTP server on 127.0.0.1 (``start()``/``stop()``, or a context manager)."""

    metrics: str = field(default_factory=real_metrics_text)
    models: str = field(default_factory=lambda: (FIXTURES / "real_vllm_models.json").read_text().strip())
    version: str = field(default_factory=lambda: (FIXTURES / "real_vllm_version.json").read_text().strip())
    api_key: str | None = field(default=None, repr=False)
    any_name: bool = False  # serve every /d/<name> prefix with the default behaviour (the benchmark's 200)
    record_requests: bool = True
    requests: list[tuple[str, bool]] = field(default_factory=list)  # (path, carried an Authorization header)
    _endpoints: dict[str, _Endpoint] = field(default_factory=dict)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None
    _release: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def port(self) -> int:
        assert self._server is not None, "start() the replay server first"
        return int(self._server.server_address[1])

    def base_url(self, name: str) -> str:
        """The base URL of deployment ``name`` (created on first use with the default behaviour)."""
        with self._lock:
            self._endpoints.setdefault(name, _Endpoint(metrics=self.metrics))
        return f"http://127.0.0.1:{self.port}/d/{name}"

    def set(self, name: str, *, behaviour: str | None = None, metrics: str | None = None) -> None:
        if behaviour is not None and behaviour not in BEHAVIOURS:
            raise ValueError(f"behaviour: {behaviour!r} is not one of {BEHAVIOURS}")
        with self._lock:
            endpoint = self._endpoints.setdefault(name, _Endpoint(metrics=self.metrics))
            if behaviour is not None:
                endpoint.behaviour = behaviour
            if metrics is not None:
                endpoint.metrics = metrics

    def start(self) -> ReplayVllm:
        replay = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                return

            def do_GET(self) -> None:
                replay._answer(self)

        class Server(ThreadingHTTPServer):
            request_queue_size = 256  # the default backlog of 5 refuses a monitor probing 32 at once

        self._server = Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="vllm-replay", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._release.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> ReplayVllm:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _answer(self, handler: BaseHTTPRequestHandler) -> None:
        match = re.match(r"^/d/([^/]+)(/.*)$", handler.path)
        if match is None:
            self._send(handler, 404, '{"detail":"Not Found"}', "application/json")
            return
        name, route = match.groups()
        with self._lock:
            endpoint = self._endpoints.get(name)
            if endpoint is None and self.any_name:
                endpoint = self._endpoints.setdefault(name, _Endpoint(metrics=self.metrics))
            if self.record_requests:
                self.requests.append((route, "Authorization" in handler.headers))
        if endpoint is None:
            self._send(handler, 404, '{"detail":"Not Found"}', "application/json")
            return
        if endpoint.behaviour == "hang":
            self._release.wait(30)
            return
        if route == "/health":
            if endpoint.behaviour == "engine_dead":
                self._send(handler, 503, "", "text/plain")
            else:
                self._send(handler, 200, "", "text/plain")
        elif route == "/version":
            self._send(handler, 200, self.version, "application/json")
        elif route == "/v1/models":
            if self.api_key and handler.headers.get("Authorization") != f"Bearer {self.api_key}":
                self._send(handler, 401, '{"error":"Unauthorized"}', "application/json")
            elif endpoint.behaviour == "models_unavailable":
                self._send(handler, 503, '{"detail":"Service Unavailable"}', "application/json")
            else:
                self._send(handler, 200, self.models, "application/json")
        elif route == "/metrics":
            if endpoint.behaviour == "no_metrics":
                self._send(handler, 404, '{"detail":"Not Found"}', "application/json")
            else:
                self._send(handler, 200, endpoint.metrics, "text/plain; version=0.0.4; charset=utf-8")
        else:
            self._send(handler, 404, '{"detail":"Not Found"}', "application/json")

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, status: int, body: str, content_type: str) -> None:
        data = body.encode("utf-8")
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)


def main() -> int:
    """Serve every ``/d/<name>`` prefix from the real capture until stdin closes; print the port first."""
    replay = ReplayVllm(any_name=True, record_requests=False).start()
    print(replay.port, flush=True)
    try:
        sys.stdin.read()
    finally:
        replay.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

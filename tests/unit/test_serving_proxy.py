"""The serving proxy in front of a real HTTP server on a unix socket, as vLLM listens on a TPU VM.

The upstream here checks no key and answers every path, so whatever a test sees refused was refused by the
proxy; it records every request it receives, so "never reached vLLM" is a fact, not an assumption.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest

from node_agent.serving_proxy import EXIT_NO_KEY, ROUTES, Access, ServingProxy
from shared.domain.serving_key import deployment_api_key

MASTER = "sk-proxy-test-master-0123456789"  # what vLLM is started with (the key file)
DEPLOYMENT = "gemma-a"
KEY = deployment_api_key(MASTER, DEPLOYMENT)  # what this deployment's clients send
OTHER = deployment_api_key(MASTER, "gemma-b")  # another deployment's key
WRONG = "sk-wrong-key-9876543210abc"
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Upstream:
    """A vLLM stand-in on a unix socket: answers everything, checks nothing, remembers all."""

    socket_path: Path
    seen: list[Seen] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    first_event_sent: threading.Event = field(default_factory=threading.Event)

    def paths(self) -> list[str]:
        return [f"{seen.method} {seen.path}" for seen in self.seen]


def _handler(upstream: Upstream) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return

        def _record(self) -> Seen:
            length = int(self.headers.get("Content-Length") or 0)
            seen = Seen(self.command, self.path, dict(self.headers.items()), self.rfile.read(length) if length else b"")
            upstream.seen.append(seen)
            return seen

        def _json(self, payload: object) -> None:
            body = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            seen = self._record()
            self._json({"reached": seen.path, "method": "GET"})

        def do_POST(self) -> None:
            seen = self._record()
            if seen.path == "/v1/completions" and seen.body.startswith(b"{") and json.loads(seen.body).get("stream"):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                upstream.first_event_sent.set()  # before the write: the client may read the event before we return
                self._chunk(b'data: {"text": "first"}\n\n')
                upstream.release.wait(10)  # the test reads the first event through the proxy before this returns
                self._chunk(b'data: {"text": "second"}\n\n')
                self._chunk(b"data: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
                return
            self._json({"reached": seen.path, "method": "POST", "bytes": len(seen.body)})

        do_DELETE = do_GET
        do_PUT = do_POST

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    return Handler


class _UnixServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[Upstream]:
    fake = Upstream(tmp_path / "vllm.sock")
    server = _UnixServer(str(fake.socket_path), _handler(fake))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield fake
    fake.release.set()
    server.shutdown()
    server.server_close()


@dataclass
class Running:
    url: str
    port: int
    proxy: ServingProxy


def _run_proxy(proxy: ServingProxy) -> Iterator[Running]:
    """The proxy on its own loop in a thread; on exit its server closes and ``asyncio.run`` ends every task."""
    started: list[int] = []
    ready = threading.Event()
    loop_box: list[asyncio.AbstractEventLoop] = []
    stop_box: list[asyncio.Event] = []

    async def serve() -> None:
        stop = asyncio.Event()
        loop_box.append(asyncio.get_running_loop())
        stop_box.append(stop)
        server = await proxy.start("127.0.0.1", 0)
        started.append(int(server.sockets[0].getsockname()[1]))
        ready.set()
        async with server:
            await stop.wait()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(10), "the proxy did not start"
    try:
        yield Running(f"http://127.0.0.1:{started[0]}", started[0], proxy)
    finally:
        loop_box[0].call_soon_threadsafe(stop_box[0].set)
        thread.join(10)


@pytest.fixture
def proxy(upstream: Upstream) -> Iterator[Running]:
    yield from _run_proxy(
        ServingProxy(
            master_key=MASTER, deployment_id=DEPLOYMENT, upstream_socket=upstream.socket_path, max_body_bytes=4096
        )
    )


def _auth(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _raw(port: int, data: bytes, *, timeout_s: float = 5.0) -> bytes:
    """Send raw bytes, read until the proxy closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _wait_for(condition: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)


class TestAllowList:
    def test_every_listed_pair_reaches_vllm_with_the_key(self, proxy: Running, upstream: Upstream) -> None:
        for (method, path), _ in ROUTES.items():
            body = {"model": "m", "prompt": "hi"} if method == "POST" else None
            answer = httpx.request(method, proxy.url + path, json=body, headers=_auth(), timeout=5)
            assert answer.status_code == 200, (method, path)
            assert (answer.json()["reached"], answer.json()["method"]) == (path, method)
        assert upstream.paths() == [f"{method} {path}" for method, path in ROUTES]

    @pytest.mark.parametrize(
        "target",
        [
            "/v1/load_lora_adapter",
            "/v1/unload_lora_adapter",
            "/reset_prefix_cache",
            "/sleep",
            "/collective_rpc",
            "/server_info",
            "/v1/models?limit=1",
            "/health/",
            "//health",
            "/v1/../tokenize",
            "/v1/%2e%2e/tokenize",
            "/HEALTH",
            "http://127.0.0.1:8000/health",
            "*",
        ],
    )
    def test_any_other_path_is_404_and_never_reaches_vllm(
        self, proxy: Running, upstream: Upstream, target: str
    ) -> None:
        answer = _raw(proxy.port, f"POST {target} HTTP/1.1\r\nHost: x\r\n{_header()}Content-Length: 0\r\n\r\n".encode())
        assert answer.startswith(b"HTTP/1.1 404 "), answer[:80]
        assert upstream.seen == []

    def test_another_method_on_a_served_path_is_405_naming_the_allowed_one(
        self, proxy: Running, upstream: Upstream
    ) -> None:
        for method, path, allowed in (("POST", "/health", "GET"), ("DELETE", "/v1/models", "GET")):
            answer = httpx.request(method, proxy.url + path, headers=_auth(), timeout=5)
            assert answer.status_code == 405 and answer.headers["allow"] == allowed
        assert upstream.seen == []

    def test_the_open_routes_are_exactly_what_the_monitor_probes_without_a_key(self) -> None:
        assert {pair for pair, access in ROUTES.items() if access is Access.OPEN} == {
            ("GET", "/health"),
            ("GET", "/metrics"),
            ("GET", "/version"),
        }


def _header() -> str:
    return f"Authorization: Bearer {KEY}\r\n"


class TestKey:
    @pytest.mark.parametrize(
        "headers",
        [
            {},
            {"Authorization": f"Bearer {WRONG}"},
            {"Authorization": f"Bearer {MASTER}"},
            {"Authorization": f"Bearer {OTHER}"},
            {"Authorization": f"Basic {KEY}"},
            {"Authorization": KEY},
            {"Authorization": f"Bearer {KEY}x"},
            {"X-Api-Key": KEY},
        ],
    )
    def test_a_keyed_route_without_the_key_is_401_from_the_proxy(
        self, proxy: Running, upstream: Upstream, headers: dict[str, str]
    ) -> None:
        for method, path in (("POST", "/tokenize"), ("POST", "/v1/chat/completions")):
            answer = httpx.request(method, proxy.url + path, json={"prompt": "x"}, headers=headers, timeout=5)
            assert answer.status_code == 401 and answer.headers["www-authenticate"].startswith("Bearer")
        assert all(seen.body == b"" and "Authorization" not in seen.headers for seen in upstream.seen)

    def test_two_authorization_headers_are_refused(self, proxy: Running, upstream: Upstream) -> None:
        head = f"POST /tokenize HTTP/1.1\r\nHost: x\r\n{_header()}{_header()}Content-Length: 0\r\n\r\n"
        answer = _raw(proxy.port, head.encode())
        assert answer.startswith(b"HTTP/1.1 401 ")
        assert upstream.seen == []

    def test_the_open_routes_answer_without_a_key(self, proxy: Running, upstream: Upstream) -> None:
        for path in ("/health", "/metrics", "/version"):
            assert httpx.get(proxy.url + path, timeout=5).status_code == 200
        assert upstream.paths() == ["GET /health", "GET /metrics", "GET /version"]

    def test_the_key_is_compared_in_constant_time(
        self, proxy: Running, upstream: Upstream, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        calls: list[tuple[int, int]] = []
        real = hmac.compare_digest

        def spy(a: bytes, b: bytes) -> bool:
            calls.append((len(a), len(b)))
            return real(a, b)

        monkeypatch.setattr(hmac, "compare_digest", spy)
        assert httpx.get(proxy.url + "/v1/models", headers=_auth(), timeout=5).status_code == 200
        assert httpx.get(proxy.url + "/v1/models", headers=_auth("short"), timeout=5).status_code == 401
        assert calls == [(32, 32), (32, 32)], "SHA-256 of both sides, so not even the length is compared early"

    def test_the_deployment_key_is_derived_from_the_master_and_the_deployment(self) -> None:
        assert KEY != OTHER and KEY != MASTER and len(KEY) == 64
        expected = hmac.new(MASTER.encode(), b"tpuctl vllm api key v1\x00" + DEPLOYMENT.encode(), "sha256")
        assert expected.hexdigest() == KEY, "HMAC-SHA256 of the master over the context and the deployment id"
        with pytest.raises(ValueError, match="master"):
            deployment_api_key("", DEPLOYMENT)

    def test_vllm_gets_the_master_in_place_of_the_callers_key(self, proxy: Running, upstream: Upstream) -> None:
        assert httpx.get(proxy.url + "/v1/models", headers=_auth(), timeout=5).status_code == 200
        assert httpx.post(proxy.url + "/tokenize", json={"prompt": "x"}, headers=_auth(), timeout=5).status_code == 200
        assert [seen.headers["Authorization"] for seen in upstream.seen] == [f"Bearer {MASTER}"] * 2

    def test_an_open_route_reaches_vllm_with_no_key_at_all(self, proxy: Running, upstream: Upstream) -> None:
        assert httpx.get(proxy.url + "/health", headers=_auth(), timeout=5).status_code == 200
        assert "Authorization" not in upstream.seen[0].headers

    def test_an_empty_key_is_refused_at_construction(self, tmp_path: Path) -> None:
        with pytest.raises(ValueError, match="empty key"):
            ServingProxy(master_key="", deployment_id=DEPLOYMENT, upstream_socket=tmp_path / "s")

    @pytest.mark.parametrize("deployment_id", ["", "Gemma-A", "a", "gemma a", "gemma-a\n", "-gemma"])
    def test_a_malformed_deployment_id_is_refused_at_construction(self, tmp_path: Path, deployment_id: str) -> None:
        with pytest.raises(ValueError, match="deployment_id"):
            ServingProxy(master_key=MASTER, deployment_id=deployment_id, upstream_socket=tmp_path / "s")


class TestRefusalReport:
    def test_a_refused_v1_request_reaches_vllm_as_method_and_path_only(
        self, proxy: Running, upstream: Upstream
    ) -> None:
        answer = httpx.post(
            proxy.url + "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "secret prompt"}]},
            headers={"Authorization": f"Bearer {WRONG}", "X-Canary": "canary", "X-Forwarded-For": "6.6.6.6"},
            timeout=5,
        )
        assert answer.status_code == 401
        _wait_for(lambda: upstream.seen)
        [report] = upstream.seen
        assert (report.method, report.path, report.body) == ("POST", "/v1/chat/completions", b"")
        assert set(report.headers) == {"Host", "X-Forwarded-For", "Content-Length", "Connection"}
        assert report.headers["X-Forwarded-For"].startswith("127.0.0.1:"), "the caller's real address, not its claim"

    def test_refusals_outside_v1_and_unknown_paths_are_not_reported(self, proxy: Running, upstream: Upstream) -> None:
        assert httpx.post(proxy.url + "/tokenize", json={}, timeout=5).status_code == 401
        assert httpx.post(proxy.url + "/v1/load_lora_adapter", json={}, timeout=5).status_code == 404
        time.sleep(0.3)
        assert upstream.seen == []


class TestBodies:
    def test_a_body_over_the_bound_is_413_and_never_forwarded(self, proxy: Running, upstream: Upstream) -> None:
        big = httpx.post(proxy.url + "/v1/completions", content=b"x" * 4097, headers=_auth(), timeout=5)
        assert big.status_code == 413
        fits = httpx.post(proxy.url + "/v1/completions", content=b"y" * 4096, headers=_auth(), timeout=5)
        assert fits.status_code == 200 and fits.json()["bytes"] == 4096
        assert [len(seen.body) for seen in upstream.seen] == [4096]

    def test_a_declared_length_over_the_bound_is_refused_before_the_body_is_read(
        self, proxy: Running, upstream: Upstream
    ) -> None:
        head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\n{_header()}Content-Length: 99999999\r\n\r\n"
        assert _raw(proxy.port, head.encode()).startswith(b"HTTP/1.1 413 ")
        assert upstream.seen == []

    @pytest.mark.parametrize(
        ("extra", "status"),
        [
            ("Transfer-Encoding: chunked\r\n", b"411"),
            ("Content-Length: 3\r\nContent-Length: 4\r\n", b"400"),
            ("Content-Length: -1\r\n", b"400"),
            ("Content-Length: 3\r\nTransfer-Encoding: chunked\r\n", b"411"),
        ],
    )
    def test_bodies_need_one_plain_content_length(
        self, proxy: Running, upstream: Upstream, extra: str, status: bytes
    ) -> None:
        head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\n{_header()}{extra}\r\nabc"
        assert _raw(proxy.port, head.encode()).startswith(b"HTTP/1.1 " + status)
        assert upstream.seen == []

    def test_expect_continue_gets_its_100_before_the_body(self, proxy: Running, upstream: Upstream) -> None:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
            sock.sendall(
                f"POST /v1/completions HTTP/1.1\r\nHost: x\r\n{_header()}Expect: 100-continue\r\n"
                "Content-Length: 5\r\n\r\n".encode()
            )
            assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
            sock.sendall(b"hello")
            answer = b"".join(iter(lambda: sock.recv(65536), b""))
        assert answer.startswith(b"HTTP/1.1 200 ")
        assert upstream.seen[0].body == b"hello" and "Expect" not in upstream.seen[0].headers


class TestHeads:
    def test_an_oversized_head_is_431(self, proxy: Running, upstream: Upstream) -> None:
        head = f"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: {'a' * 20000}\r\n\r\n"
        assert _raw(proxy.port, head.encode()).startswith(b"HTTP/1.1 431 ")
        assert upstream.seen == []

    @pytest.mark.parametrize(
        "head",
        [
            b"GET /health\r\n\r\n",
            b"GET /health HTTP/2.0\r\nHost: x\r\n\r\n",
            b"get /health HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET /health HTTP/1.1\r\nHost: x\r\n folded: value\r\n\r\n",
            b"GET /health HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
            b"GET /health HTTP/1.1\r\nBad Name: x\r\n\r\n",
        ],
    )
    def test_a_malformed_head_is_400(self, proxy: Running, upstream: Upstream, head: bytes) -> None:
        assert _raw(proxy.port, head).startswith(b"HTTP/1.1 400 ")
        assert upstream.seen == []

    def test_forwarding_headers_are_the_proxys_own(self, proxy: Running, upstream: Upstream) -> None:
        httpx.get(
            proxy.url + "/v1/models",
            headers={**_auth(), "X-Forwarded-For": "1.2.3.4", "Forwarded": "for=1.2.3.4", "X-Kept": "yes"},
            timeout=5,
        )
        headers = upstream.seen[0].headers
        assert headers["X-Forwarded-For"].startswith("127.0.0.1:") and "Forwarded" not in headers
        assert headers["Connection"] == "close" and headers["X-Kept"] == "yes"


class TestStreaming:
    def test_server_sent_events_pass_as_they_are_written(self, proxy: Running, upstream: Upstream) -> None:
        body = {"model": "m", "prompt": "hi", "stream": True}
        with httpx.stream("POST", proxy.url + "/v1/completions", json=body, headers=_auth(), timeout=10) as answer:
            assert answer.status_code == 200 and answer.headers["content-type"] == "text/event-stream"
            lines = answer.iter_lines()
            assert next(lines) == 'data: {"text": "first"}', "the first event arrives while vLLM still holds the rest"
            assert upstream.first_event_sent.is_set() and not upstream.release.is_set()
            upstream.release.set()
            rest = [line for line in lines if line]
        assert rest == ['data: {"text": "second"}', "data: [DONE]"]


class TestUpstreamDown:
    def test_without_vllm_the_connection_closes_unanswered_as_a_closed_port_would(self, tmp_path: Path) -> None:
        gen = _run_proxy(
            ServingProxy(master_key=MASTER, deployment_id=DEPLOYMENT, upstream_socket=tmp_path / "absent.sock")
        )
        running = next(gen)
        try:
            with pytest.raises(httpx.RemoteProtocolError):
                httpx.get(running.url + "/health", timeout=5)
            assert _raw(running.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n") == b"", "no 5xx: not 'engine dead'"
        finally:
            gen.close()


class TestLogs:
    def test_no_key_offered_or_configured_ever_reaches_a_log_line(
        self, proxy: Running, upstream: Upstream, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.DEBUG)
        httpx.get(proxy.url + "/v1/models", headers=_auth(), timeout=5)
        httpx.get(proxy.url + "/v1/models", headers=_auth(WRONG), timeout=5)
        httpx.get(proxy.url + "/v1/models", headers=_auth(MASTER), timeout=5)
        httpx.get(proxy.url + "/v1/models", headers=_auth(OTHER), timeout=5)
        httpx.post(proxy.url + "/v1/load_lora_adapter", headers=_auth(WRONG), json={}, timeout=5)
        _raw(proxy.port, f"GET /health HTTP/1.1\r\nAuthorization: Bearer {WRONG}\r\n folded\r\n\r\n".encode())
        text = caplog.text
        assert "refused GET /v1/models from 127.0.0.1:" in text and "401" in text
        assert "refused POST /v1/load_lora_adapter" in text
        assert KEY not in text and WRONG not in text and "Authorization" not in text
        assert MASTER not in text and OTHER not in text

    def test_the_entry_point_reads_the_key_from_a_file_and_never_prints_it(
        self, upstream: Upstream, tmp_path: Path
    ) -> None:
        key_file = tmp_path / "vllm-api-key"
        key_file.write_text(MASTER + "\n")
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        argv = [sys.executable, "-m", "node_agent.serving_proxy", "--listen", f"127.0.0.1:{port}"]
        argv += ["--upstream-socket", str(upstream.socket_path), "--key-file", str(key_file)]
        argv += ["--deployment-id", DEPLOYMENT]
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp_path)
        try:
            _wait_for(lambda: _answers(f"http://127.0.0.1:{port}/health"), 20)
            assert httpx.get(f"http://127.0.0.1:{port}/v1/models", headers=_auth(), timeout=5).status_code == 200
            assert httpx.get(f"http://127.0.0.1:{port}/v1/models", headers=_auth(WRONG), timeout=5).status_code == 401
            assert httpx.get(f"http://127.0.0.1:{port}/v1/models", headers=_auth(MASTER), timeout=5).status_code == 401
            keyed = [seen.headers.get("Authorization") for seen in upstream.seen if seen.path == "/v1/models"]
            assert keyed[0] == f"Bearer {MASTER}" and not any(keyed[1:]), "refusals reported without a key"
            assert MASTER not in Path(f"/proc/{process.pid}/cmdline").read_text()
        finally:
            process.terminate()
            out, err = process.communicate(timeout=20)
        assert process.returncode == 0, "SIGTERM stops it cleanly (it is process 1 of its container)"
        output = (out + err).decode()
        assert "serving proxy on 127.0.0.1" in output and "refused GET /v1/models" in output
        assert KEY not in output and WRONG not in output and MASTER not in output

    def test_the_entry_point_refuses_to_serve_without_a_key(self, tmp_path: Path) -> None:
        (tmp_path / "empty").write_text("\n")
        for key_file in (tmp_path / "missing", tmp_path / "empty"):
            argv = [sys.executable, "-m", "node_agent.serving_proxy", "--listen", "127.0.0.1:9"]
            done = subprocess.run(
                [*argv, "--upstream-socket", str(tmp_path / "s"), "--key-file", str(key_file), "--deployment-id", "g1"],
                capture_output=True,
                text=True,
                timeout=30,
                env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                check=False,
            )
            assert done.returncode == EXIT_NO_KEY, done.stderr
            assert "not serving without it" in done.stderr


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False

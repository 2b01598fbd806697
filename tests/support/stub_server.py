"""A streaming OpenAI-compatible stub whose first-token delay is known, to calibrate load generators against.

Why: a client's TTFT is only as good as its clock discipline, and a real model's first-token time is unknown.
This stub sends the first token a fixed delay after it has read the request, so ``measured TTFT - delay`` is
the client's own error (plus loopback transit). It also sends vLLM's chat role chunk at once, so a client that
takes TTFT at the first SSE chunk instead of the first token shows a TTFT near zero.

What it speaks (vLLM 0.32 shapes, ``docs/reference/vllm.md`` §2-§3): HTTP/1.1 with keep-alive and chunked responses;
``GET /health``, ``GET /version``, ``GET /v1/models``, ``POST /tokenize``, ``POST /v1/completions`` and
``POST /v1/chat/completions`` (streamed with a usage chunk and ``[DONE]``, or as one JSON body). Every
whitespace-separated word of a prompt is one token; a completion is always ``max_tokens`` tokens long (as with
``ignore_eos``). ``GET /stub/stats`` reports how late the stub itself sent first tokens.

Timing: a request's time of arrival is the kernel's receive stamp of its last bytes (``SO_TIMESTAMPNS``), and
its first token is sent by a dedicated timer thread (``threading.Condition`` waits are microsecond-precise; the
event loop's epoll timeout is rounded up to a whole millisecond) straight onto the socket. ``GET /stub/stats``
reports how late the stub itself was, and with ``?detail=1`` each response id's (received, first token sent)
times on the machine-wide monotonic clock, so a client's own error can be separated from the stub's.
The stub runs as its own process in measurements (``python -m tests.support.stub_server``, which prints
``READY <base url>``, or :func:`spawn_stub`); tests may run it on a thread with :meth:`StubServer.start_in_thread`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from loadgen.transport import enable_receive_times, read_with_time

__all__ = ["StubBehaviour", "StubProcess", "StubServer", "main", "spawn_stub"]

FailureKind = Literal["status_500", "status_429", "disconnect", "midstream"]
_MAX_HEADER_BYTES = 64 * 1024
_MAX_BODY_BYTES = 16 * 1024 * 1024
_FINGERPRINT = "vllm-0.32.0-stub0000"
_STATUS_TEXT = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 429: "Too Many Requests"}
_STATUS_TEXT[500] = "Internal Server Error"


@dataclass(frozen=True)
class StubBehaviour:
    """How the stub answers generation requests."""

    first_token_delay_s: float = 0.0
    """From reading the whole request to writing the first content chunk."""
    inter_token_s: float = 0.0
    """Between content chunks; 0 writes the rest of the stream at once."""
    model: str = "stub-model"
    max_model_len: int = 8192
    fail_every: int = 0
    """Every Nth generation request fails (0: none) in the way ``failure`` says."""
    failure: FailureKind = "status_500"
    api_key: str | None = field(default=None, repr=False)
    """When set, ``/v1/*`` and ``/tokenize`` require ``Authorization: Bearer <key>`` (401 otherwise)."""

    def __post_init__(self) -> None:
        if self.first_token_delay_s < 0 or self.inter_token_s < 0:
            raise ValueError("first_token_delay_s, inter_token_s: must be >= 0 seconds")
        if self.fail_every < 0:
            raise ValueError(f"fail_every: {self.fail_every} must be >= 0 (0 turns failures off)")


class _PreciseTimer:
    """Runs callbacks at ``perf_counter`` deadlines on its own thread (``Condition`` waits are microsecond-precise,
    the event loop's epoll timeout is rounded up to a whole millisecond)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._counter = itertools.count()
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="stub-timer", daemon=True)
        self._thread.start()

    def call_at(self, deadline: float, callback: Callable[[], None]) -> None:
        with self._cond:
            heapq.heappush(self._heap, (deadline, next(self._counter), callback))
            self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join(timeout=2)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and (not self._heap or self._heap[0][0] > time.perf_counter()):
                    timeout = None if not self._heap else self._heap[0][0] - time.perf_counter()
                    self._cond.wait(timeout)
                if self._stopped:
                    return
                due: list[Callable[[], None]] = []
                now = time.perf_counter()
                while self._heap and self._heap[0][0] <= now:
                    due.append(heapq.heappop(self._heap)[2])
            for callback in due:
                with contextlib.suppress(RuntimeError, OSError):  # loop or socket closed while shutting down
                    callback()


@dataclass
class _Stats:
    generation_requests: int = 0
    first_token_lateness_s: list[float] = field(default_factory=list)
    first_tokens: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Per response id: (request received, first token sent), ``perf_counter`` seconds (CLOCK_MONOTONIC)."""

    def as_dict(self, *, detail: bool = False) -> dict[str, Any]:
        late = sorted(self.first_token_lateness_s)
        summary: dict[str, Any] = {
            "generation_requests": self.generation_requests,
            "first_tokens": len(late),
            "first_token_lateness_ms_p50": round(late[len(late) // 2] * 1000, 4) if late else None,
            "first_token_lateness_ms_max": round(late[-1] * 1000, 4) if late else None,
        }
        if detail:
            summary["requests"] = {key: list(times) for key, times in self.first_tokens.items()}
        return summary


@dataclass
class _Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    received_at: float
    """When the request's last bytes reached the socket (kernel stamp, ``perf_counter`` scale)."""
    query: str = ""


class _Connection:
    """One client connection on a non-blocking socket, read with kernel receive stamps; one request at a time."""

    def __init__(self, server: StubServer, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        self._server = server
        self._loop = loop
        self._sock = sock
        self._buffer = bytearray()
        self._pending = bytearray()
        self._busy = False
        self._stamp = 0.0
        self.closed = False
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        enable_receive_times(sock)
        loop.add_reader(sock.fileno(), self._on_readable)

    def _on_readable(self) -> None:
        try:
            data, stamp = read_with_time(self._sock, 65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.abort()
            return
        if not data:
            self.abort()
            return
        self._buffer += data
        self._stamp = stamp
        self._next_request()

    def _next_request(self) -> None:
        if self._busy or self.closed:
            return
        head_end = self._buffer.find(b"\r\n\r\n")
        if head_end < 0:
            if len(self._buffer) > _MAX_HEADER_BYTES:
                self.abort()
            return
        lines = bytes(self._buffer[:head_end]).decode("latin-1").split("\r\n")
        try:
            method, target, _version = lines[0].split(" ", 2)
        except ValueError:
            self.abort()
            return
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0") or 0)
        if length > _MAX_BODY_BYTES:
            self.abort()
            return
        if len(self._buffer) < head_end + 4 + length:
            return
        body = bytes(self._buffer[head_end + 4 : head_end + 4 + length])
        del self._buffer[: head_end + 4 + length]
        self._busy = True
        path, _, query = target.partition("?")
        self._server.dispatch(self, _Request(method, path, headers, body, self._stamp, query))

    def write(self, data: bytes) -> None:
        """Send now if the socket takes it, else queue it for the loop (loop thread only)."""
        if self.closed:
            return
        if self._pending:
            self._pending += data
            return
        try:
            sent = self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self.abort()
            return
        if sent < len(data):
            self._pending += data[sent:]
            self._loop.add_writer(self._sock.fileno(), self._on_writable)

    def send_from_timer(self, data: bytes) -> bool:
        """Send ``data`` at once from the timer thread; False when it must go through the loop instead.

        Safe because nothing else writes to this connection between a stream's head and its first token.
        """
        if self.closed or self._pending:
            return False
        try:
            sent = self._sock.send(data)
        except OSError:
            return False
        if sent < len(data):
            rest = data[sent:]
            self._loop.call_soon_threadsafe(self.write, rest)
        return True

    def _on_writable(self) -> None:
        try:
            sent = self._sock.send(self._pending)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.abort()
            return
        del self._pending[:sent]
        if not self._pending:
            self._loop.remove_writer(self._sock.fileno())

    def respond(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        head = (
            f"HTTP/1.1 {status} {_STATUS_TEXT.get(status, 'Error')}\r\ncontent-type: {content_type}\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode("latin-1")
        self.write(head + body)
        self.finish()

    def finish(self) -> None:
        self._busy = False
        if self._buffer:
            self._next_request()

    def abort(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._loop.remove_reader(self._sock.fileno())
        if self._pending:
            self._loop.remove_writer(self._sock.fileno())
        self._sock.close()


def _sse(payload: dict[str, Any] | str) -> bytes:
    text = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    event = f"data: {text}\n\n".encode()
    return f"{len(event):x}\r\n".encode() + event + b"\r\n"


_STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"
)
_STREAM_END = _sse("[DONE]") + b"0\r\n\r\n"


class StubServer:
    """The stub's state and request handling; serve it with :meth:`serve` or :meth:`start_in_thread`."""

    def __init__(self, behaviour: StubBehaviour | None = None, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.behaviour = behaviour or StubBehaviour()
        self.host = host
        self.port = port
        self.stats = _Stats()
        self._ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: _PreciseTimer | None = None
        self._listener: socket.socket | None = None
        self._connections: list[_Connection] = []
        self._thread: threading.Thread | None = None
        self._stopping: asyncio.Event | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # --- lifecycle -------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind and start accepting on the running loop (``port`` 0 picks a free port)."""
        self._loop = asyncio.get_running_loop()
        self._timer = _PreciseTimer()
        self._stopping = asyncio.Event()
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, self.port))
        listener.listen(1024)
        listener.setblocking(False)
        self._listener = listener
        self.port = int(listener.getsockname()[1])
        self._loop.add_reader(listener.fileno(), self._accept)

    def _accept(self) -> None:
        assert self._loop is not None and self._listener is not None
        while True:
            try:
                sock, _address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            self._connections.append(_Connection(self, self._loop, sock))
            self._connections = [conn for conn in self._connections if not conn.closed]

    async def serve(self, ready: Callable[[str], None] | None = None) -> None:
        """Start, report the base URL, and serve until :meth:`request_stop`."""
        await self.start()
        if ready is not None:
            ready(self.base_url)
        assert self._stopping is not None
        await self._stopping.wait()
        self._shutdown()

    def request_stop(self) -> None:
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)

    def _shutdown(self) -> None:
        if self._loop is not None and self._listener is not None:
            self._loop.remove_reader(self._listener.fileno())
            self._listener.close()
        for conn in self._connections:
            conn.abort()
        if self._timer is not None:
            self._timer.stop()

    def start_in_thread(self) -> str:
        """Serve on a daemon thread with its own loop; returns the base URL once listening."""
        started = threading.Event()

        def run() -> None:
            asyncio.run(self.serve(lambda _url: started.set()))

        self._thread = threading.Thread(target=run, name="stub-server", daemon=True)
        self._thread.start()
        if not started.wait(timeout=10):
            raise RuntimeError("stub server did not start within 10 s")
        return self.base_url

    def stop_thread(self) -> None:
        self.request_stop()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # --- requests --------------------------------------------------------------------------------------------

    def dispatch(self, conn: _Connection, request: _Request) -> None:
        route = (request.method, request.path)
        if route in (("GET", "/health"), ("GET", "/ping")):
            conn.respond(200, b"")
            return
        if route == ("GET", "/stub/stats"):
            conn.respond(200, json.dumps(self.stats.as_dict(detail="detail=1" in request.query)).encode())
            return
        if route == ("POST", "/stub/reset"):
            self.stats = _Stats()
            conn.respond(200, b"{}")
            return
        if route == ("GET", "/version"):
            conn.respond(200, b'{"version":"0.32.0"}')
            return
        protected = request.path.startswith("/v1/") or request.path == "/tokenize"
        expected = f"Bearer {self.behaviour.api_key}"
        if protected and self.behaviour.api_key is not None and request.headers.get("authorization") != expected:
            conn.respond(401, b'{"error":"Unauthorized"}')
            return
        if route == ("GET", "/v1/models"):
            conn.respond(200, self._models())
            return
        if request.method == "POST" and request.path in ("/tokenize", "/v1/completions", "/v1/chat/completions"):
            try:
                payload = json.loads(request.body or b"{}")
                if not isinstance(payload, dict):
                    raise ValueError("not an object")
            except ValueError:
                conn.respond(400, _error("body is not a JSON object", "BadRequestError", 400))
                return
            if request.path == "/tokenize":
                count = _prompt_tokens(payload)
                body = {"count": count, "max_model_len": self.behaviour.max_model_len, "tokens": list(range(count))}
                conn.respond(200, json.dumps({**body, "token_strs": None}).encode())
                return
            self._generate(conn, payload, request.received_at, chat=request.path.endswith("/chat/completions"))
            return
        conn.respond(404, b'{"detail":"Not Found"}')

    def _models(self) -> bytes:
        card = {
            "id": self.behaviour.model,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "vllm",
            "root": self.behaviour.model,
            "parent": None,
            "max_model_len": self.behaviour.max_model_len,
        }
        return json.dumps({"object": "list", "data": [card]}, separators=(",", ":")).encode()

    def _generate(self, conn: _Connection, payload: dict[str, Any], received: float, *, chat: bool) -> None:
        behaviour = self.behaviour
        if payload.get("model") not in (None, behaviour.model):
            message = f"The model `{payload.get('model')}` does not exist. Valid aliases: {behaviour.model}."
            conn.respond(404, _error(message, "NotFoundError", 404))
            return
        limit = payload.get("max_completion_tokens") if chat else None
        max_tokens = limit if isinstance(limit, int) else payload.get("max_tokens", 16)
        if not isinstance(max_tokens, int) or max_tokens < 1:
            conn.respond(400, _error("max_tokens must be a positive integer", "BadRequestError", 400))
            return
        prompt_tokens = _prompt_tokens(payload)
        if prompt_tokens + max_tokens > behaviour.max_model_len:
            message = f"max_tokens={max_tokens} cannot be greater than max_model_len={behaviour.max_model_len}."
            conn.respond(400, _error(message, "BadRequestError", 400))
            return
        self.stats.generation_requests += 1
        number = next(self._ids)
        failing = behaviour.fail_every > 0 and number % behaviour.fail_every == 0
        if failing and behaviour.failure in ("status_500", "status_429"):
            status = 500 if behaviour.failure == "status_500" else 429
            conn.respond(status, _error("injected failure", "InternalServerError", status))
            return
        if failing and behaviour.failure == "disconnect":
            conn.abort()
            return
        stream = _Stream(
            conn=conn,
            chat=chat,
            request_id=f"{'chatcmpl' if chat else 'cmpl'}-{number:016x}",
            model=behaviour.model,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            include_usage=bool((payload.get("stream_options") or {}).get("include_usage")),
            cut_after=max(1, max_tokens // 2) if failing else None,
        )
        if not payload.get("stream"):
            total = behaviour.first_token_delay_s + behaviour.inter_token_s * (max_tokens - 1)
            assert self._loop is not None
            self._loop.call_later(total, stream.respond_whole)
            return
        stream.start()
        deadline = received + behaviour.first_token_delay_s
        loop = self._loop
        assert loop is not None

        def record_first(sent_at: float) -> None:
            self.stats.first_token_lateness_s.append(sent_at - deadline)
            self.stats.first_tokens[stream.request_id] = (received, sent_at)

        def first_token_from_timer() -> None:  # on the timer thread: send directly, continue on the loop
            if stream.conn.closed:
                return
            data = stream.next_bytes()
            if stream.conn.send_from_timer(data):
                record_first(time.perf_counter())
                loop.call_soon_threadsafe(self._continue, stream)
            else:
                loop.call_soon_threadsafe(first_token_on_loop, data)

        def first_token_on_loop(data: bytes | None = None) -> None:
            stream.conn.write(data if data is not None else stream.next_bytes())
            record_first(time.perf_counter())
            self._continue(stream)

        if behaviour.first_token_delay_s > 0:
            assert self._timer is not None
            self._timer.call_at(deadline, first_token_from_timer)
        else:
            first_token_on_loop()

    def _continue(self, stream: _Stream) -> None:
        """After the first token: the rest at once, or one token per ``inter_token_s``."""
        if stream.conn.closed:
            return
        if stream.sent >= stream.max_tokens or (stream.cut_after is not None and stream.sent >= stream.cut_after):
            stream.end()
            return
        if self.behaviour.inter_token_s <= 0:
            stream.send_rest()
            return
        assert self._loop is not None
        self._loop.call_later(self.behaviour.inter_token_s, self._next_token, stream)

    def _next_token(self, stream: _Stream) -> None:
        if stream.conn.closed:
            return
        stream.conn.write(stream.next_bytes())
        self._continue(stream)


@dataclass
class _Stream:
    conn: _Connection
    chat: bool
    request_id: str
    model: str
    prompt_tokens: int
    max_tokens: int
    include_usage: bool
    cut_after: int | None
    sent: int = 0
    created: int = field(default_factory=lambda: int(time.time()))

    def _chunk(self, index: int) -> dict[str, Any]:
        last = index == self.max_tokens - 1
        word = f" w{index % 97}"
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "delta": {"content": word}, "logprobs": None}
            choice["finish_reason"] = "length" if last else None
            if last:
                choice["stop_reason"] = None
            choice["token_ids"] = None
            kind = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": word, "logprobs": None, "finish_reason": "length" if last else None}
            choice.update(stop_reason=None, prompt_token_ids=None, token_ids=None)
            kind = "text_completion"
        return {
            "id": self.request_id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }

    def _usage(self) -> dict[str, Any]:
        usage = {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + self.max_tokens,
            "completion_tokens": self.max_tokens,
        }
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {
            "id": self.request_id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": usage,
            "system_fingerprint": _FINGERPRINT,
        }

    def start(self) -> None:
        data = _STREAM_HEAD
        if self.chat:
            role = {
                "id": self.request_id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [
                    {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
                ],
                "prompt_token_ids": None,
                "prompt_text": None,
            }
            data += _sse(role)
        self.conn.write(data)

    def next_bytes(self) -> bytes:
        """The next token's SSE chunk (counts it as sent)."""
        data = _sse(self._chunk(self.sent))
        self.sent += 1
        return data

    def send_rest(self) -> None:
        stop = self.max_tokens if self.cut_after is None else self.cut_after
        data = b"".join(_sse(self._chunk(index)) for index in range(self.sent, stop))
        self.sent = stop
        self.conn.write(data)
        self.end()

    def end(self) -> None:
        """Finish the stream: usage and ``[DONE]``, or a dropped connection for a failing request."""
        if self.cut_after is not None:
            self.conn.abort()
            return
        tail = _sse(self._usage()) if self.include_usage else b""
        self.conn.write(tail + _STREAM_END)
        self.conn.finish()

    def respond_whole(self) -> None:
        text = "".join(f" w{index % 97}" for index in range(self.max_tokens))
        usage = self._usage()["usage"]
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
            kind = "chat.completion"
        else:
            choice = {"index": 0, "text": text}
            kind = "text_completion"
        choice.update(logprobs=None, finish_reason="length", stop_reason=None)
        body = {"id": self.request_id, "object": kind, "created": self.created, "model": self.model}
        body.update(choices=[choice], usage=usage, system_fingerprint=_FINGERPRINT)
        self.conn.respond(200, json.dumps(body, separators=(",", ":")).encode())


def _error(message: str, kind: str, code: int) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()


def _prompt_tokens(payload: dict[str, Any]) -> int:
    prompt = payload.get("prompt")
    if isinstance(prompt, str):
        return len(prompt.split())
    messages = payload.get("messages")
    if isinstance(messages, list):
        return sum(len(str(m.get("content", "")).split()) for m in messages if isinstance(m, dict))
    return 0


@dataclass
class StubProcess:
    """A stub running as its own process (so its timing never shares a GIL with the client under test)."""

    process: subprocess.Popen[str]
    base_url: str

    def stats(self, *, detail: bool = False) -> dict[str, Any]:
        """The stub's own first-token figures (``GET /stub/stats``; per response id with ``detail``)."""
        import urllib.request

        url = self.base_url + "/stub/stats" + ("?detail=1" if detail else "")
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 (a loopback URL we built)
            return dict(json.loads(response.read()))

    def reset(self) -> None:
        """Forget the figures so far (``POST /stub/reset``)."""
        import urllib.request

        request = urllib.request.Request(self.base_url + "/stub/reset", data=b"{}", method="POST")  # noqa: S310
        with urllib.request.urlopen(request, timeout=5):  # noqa: S310 (a loopback URL we built)
            pass

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        if self.process.stdout is not None:
            self.process.stdout.close()


def spawn_stub(behaviour: StubBehaviour, *, python: str = sys.executable, timeout_s: float = 20.0) -> StubProcess:
    """Start ``python -m tests.support.stub_server`` on a free loopback port; returns once it listens."""
    argv = [
        python,
        "-m",
        "tests.support.stub_server",
        "--first-token-delay-ms",
        repr(behaviour.first_token_delay_s * 1000),
        "--inter-token-ms",
        repr(behaviour.inter_token_s * 1000),
        "--model",
        behaviour.model,
        "--max-model-len",
        str(behaviour.max_model_len),
        "--fail-every",
        str(behaviour.fail_every),
        "--failure",
        behaviour.failure,
    ]
    env = {key: value for key, value in os.environ.items() if key in ("PATH", "HOME", "LANG", "PYTHONPATH")}
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=env, start_new_session=True
    )
    assert process.stdout is not None
    deadline = time.monotonic() + timeout_s
    line = ""
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if line.startswith("READY ") or process.poll() is not None:
            break
    if not line.startswith("READY "):
        process.kill()
        process.wait(timeout=5)
        raise RuntimeError(f"the stub server did not start (exit {process.poll()}): {line.strip()}")
    return StubProcess(process, line.split(" ", 1)[1].strip())


def main(argv: list[str] | None = None) -> int:
    """Run the stub in the foreground; prints ``READY <base url>`` once listening, stops on SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m tests.support.stub_server", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--first-token-delay-ms", type=float, default=0.0)
    parser.add_argument("--inter-token-ms", type=float, default=0.0)
    parser.add_argument("--model", default="stub-model")
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--fail-every", type=int, default=0)
    parser.add_argument(
        "--failure", choices=["status_500", "status_429", "disconnect", "midstream"], default="status_500"
    )
    args = parser.parse_args(argv)
    sys.setswitchinterval(0.0002)  # let the timer thread take the GIL promptly
    server = StubServer(
        StubBehaviour(
            first_token_delay_s=args.first_token_delay_ms / 1000,
            inter_token_s=args.inter_token_ms / 1000,
            model=args.model,
            max_model_len=args.max_model_len,
            fail_every=args.fail_every,
            failure=args.failure,
        ),
        host=args.host,
        port=args.port,
    )

    async def run() -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, server.request_stop)
        await server.serve(lambda url: print(f"READY {url}", flush=True))

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

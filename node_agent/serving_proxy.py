"""The serving proxy: the only listener on a TPU VM's serving port, in front of vLLM's unix socket.

Why: vLLM checks its API key only under ``/v1``. Everything else it serves (``/tokenize``, ``/pooling``,
``/reset_prefix_cache``, ``/sleep``, ``/collective_rpc``, ``/server_info``, ...) answers whoever can connect, so a
firewall rule was the only guard. On a TPU VM vLLM now listens on a unix socket only, in a container with no
network, and this proxy (``python -m node_agent.serving_proxy``, shipped in the node-agent bundle and started by
the startup script in a container of its own on the VM's network) is what the serving port reaches:

* only the method and path pairs of :data:`ROUTES` pass, compared exactly (no query string, no normalisation): any
  other path is 404 and another method on a known path 405, before anything reaches vLLM;
* every route but ``GET /health``, ``/metrics`` and ``/version`` needs ``Authorization: Bearer <key>`` with this
  deployment's own key (``--deployment-id``): :func:`shared.domain.serving_key.deployment_api_key` of the master key,
  which is read from a file (never argv or the environment), the same file vLLM is started with. The offered key is
  compared in constant time (SHA-256 of both sides, then ``hmac.compare_digest``), 401 otherwise: the master itself
  and another deployment's key are refused here. The three open ones are what the monitor probes without a key
  (``shared/adapters/vllm_probe.py`` sends one to ``/v1/*`` only); they take no body and change nothing;
* the caller's ``Authorization`` never reaches vLLM: a keyed route is forwarded with ``Bearer <master>``, so vLLM's
  own check under ``/v1`` passes, and an open route with none;
* a request head is at most 16 KiB and 100 header lines and must arrive within 30 s; a body needs a
  ``Content-Length`` no larger than ``--max-body-bytes`` (413; a chunked request body is 411) and must arrive
  within 60 s. The caller's forwarding headers are dropped and replaced by its real address;
* the answer streams back as vLLM writes it (server-sent events are never held back), one request per connection;
* while vLLM is not listening (starting, restarting, crashed) a connection is closed without an answer, as the
  closed port was before: the monitor tells "not up" from "engine dead" (a 5xx on ``/health``) by that;
* no header is ever logged (both keys are registered for redaction): a line names the method, the path, the status
  and the caller's address;
* vLLM's access log is the one the node agent ships to Cloud Logging, so a ``/v1`` request refused here is
  reported to vLLM as what it was, at most 10 a second: the same method and path, no key, no body, no header of
  the caller's, and vLLM writes its own 401 line for it. Nothing else of a refused request reaches vLLM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import re
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from shared.domain.models import DEPLOYMENT_ID_PATTERN
from shared.domain.serving_key import deployment_api_key
from shared.logging import configure_logging, register_secret, scrub_untrusted

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "EXIT_NO_KEY",
    "ROUTES",
    "Access",
    "ServingProxy",
    "main",
    "read_api_key",
]

log = logging.getLogger("tpuctl.serving_proxy")


class Access(StrEnum):
    OPEN = "open"  # the monitor probes it without the key
    KEY = "key"  # Authorization: Bearer <this deployment's key>


ROUTES: Mapping[tuple[str, str], Access] = {
    ("GET", "/health"): Access.OPEN,
    ("GET", "/metrics"): Access.OPEN,
    ("GET", "/version"): Access.OPEN,
    ("GET", "/v1/models"): Access.KEY,
    ("POST", "/v1/completions"): Access.KEY,
    ("POST", "/v1/chat/completions"): Access.KEY,
    ("POST", "/tokenize"): Access.KEY,  # the benchmark's token counter; vLLM itself does not check the key here
}
"""Every method and path the proxy forwards: what the monitor, the gateway and the benchmark call (nothing else)."""

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024  # a long prompt with a few images as data URLs
EXIT_NO_KEY = 78  # as the vLLM container's key wrapper: configuration missing, do not serve
VLLM_GUARDED_PREFIX = "/v1"  # where vLLM checks the key itself (a refusal there is reported to its log)

_HEAD_LIMIT = 16 * 1024
_RESPONSE_HEAD_LIMIT = 64 * 1024
_MAX_HEADERS = 100
_CHUNK = 64 * 1024
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_METHOD = re.compile(r"^[A-Z]{1,16}$")
_VERSIONS = ("HTTP/1.1", "HTTP/1.0")
# Hop-by-hop headers and what the proxy sets itself; never forwarded.
_DROPPED_REQUEST = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "expect",
        "content-length",
        "forwarded",
        "x-forwarded-for",
        "x-forwarded-host",
        "x-forwarded-proto",
        "x-real-ip",
        "authorization",  # the proxy sets its own: the master on a keyed route, none on an open one
    }
)
_DROPPED_RESPONSE = frozenset({"connection", "keep-alive", "proxy-connection"})
_REASONS = {
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    411: "Length Required",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
}


class KeyFileError(Exception):
    """The API key file is missing, unreadable or empty."""


def read_api_key(path: Path) -> str:
    """The key in ``path`` without surrounding whitespace (as the node agent reads it)."""
    try:
        key = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyFileError(f"cannot read the API key file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if not key:
        raise KeyFileError(f"the API key file {path} is empty")
    return key


class _Refusal(Exception):
    def __init__(self, status: int, reason: str, *, allow: str | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.allow = allow


@dataclass(frozen=True)
class _Request:
    method: str
    target: str
    version: str
    headers: tuple[tuple[str, str], ...]

    def values(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key.lower() == name]


def _parse_head(head: bytes) -> _Request:
    """The request line and headers of one request head (ending in CRLF CRLF); strict, bounded."""
    lines = head[:-4].decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not _METHOD.fullmatch(parts[0]) or parts[2] not in _VERSIONS or not parts[1]:
        raise _Refusal(400, "malformed request line")
    if len(lines) - 1 > _MAX_HEADERS:
        raise _Refusal(431, "too many header lines")
    headers = []
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not _TOKEN.fullmatch(name):
            raise _Refusal(400, "malformed header line")
        value = value.strip(" \t")
        if any(char in value for char in "\r\n\x00"):
            raise _Refusal(400, "malformed header value")
        headers.append((name, value))
    if sum(name.lower() == "host" for name, _ in headers) > 1:
        raise _Refusal(400, "more than one Host header")
    return _Request(parts[0], parts[1], parts[2], tuple(headers))


def _route(request: _Request) -> Access:
    access = ROUTES.get((request.method, request.target))
    if access is not None:
        return access
    methods = sorted(method for method, path in ROUTES if path == request.target)
    if methods:
        raise _Refusal(405, f"{request.method} is not allowed here", allow=", ".join(methods))
    raise _Refusal(404, "not a served path")


def _content_length(request: _Request, limit: int) -> int:
    if request.values("transfer-encoding"):
        raise _Refusal(411, "a request body needs a Content-Length (chunked bodies are not taken)")
    lengths = set(request.values("content-length"))
    if not lengths:
        return 0
    if len(lengths) > 1 or not next(iter(lengths)).isdigit():
        raise _Refusal(400, "malformed Content-Length")
    length = int(next(iter(lengths)))
    if length > limit:
        raise _Refusal(413, f"the request body exceeds {limit} bytes")
    if length and request.method == "GET":
        raise _Refusal(400, "a GET takes no body")
    return length


def _peer(writer: asyncio.StreamWriter) -> str:
    """The caller as ``host:port`` (``[v6]:port``), the form uvicorn reads from X-Forwarded-For."""
    address = writer.get_extra_info("peername")
    if not isinstance(address, tuple) or len(address) < 2:
        return "unknown"
    host, port = str(address[0]), int(address[1])
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _printable(target: str) -> str:
    return scrub_untrusted(target, 200)[0]


@dataclass
class _Budget:
    """At most ``per_s`` events a second, ``per_s`` at once: a token bucket."""

    per_s: float
    tokens: float = 0.0
    stamp: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.tokens = self.per_s

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.per_s, self.tokens + (now - self.stamp) * self.per_s)
        self.stamp = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class ServingProxy:
    """Key-checking, allow-listing reverse proxy from a TCP port to vLLM's unix socket (asyncio, one loop).

    ``master_key`` is what vLLM was started with; callers must offer ``deployment_api_key(master_key,
    deployment_id)``, and the proxy forwards a keyed request to vLLM with the master in their stead."""

    def __init__(
        self,
        *,
        master_key: str,
        deployment_id: str,
        upstream_socket: Path,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        head_timeout_s: float = 30.0,
        body_timeout_s: float = 60.0,
        connect_timeout_s: float = 5.0,
        max_connections: int = 512,
        reports_per_s: float = 10.0,
    ) -> None:
        if not master_key:
            raise ValueError("master_key: an empty key would let anyone in")
        if not re.fullmatch(DEPLOYMENT_ID_PATTERN, deployment_id):
            raise ValueError(f"deployment_id: {deployment_id!r} does not match {DEPLOYMENT_ID_PATTERN}")
        self._key_digest = hashlib.sha256(deployment_api_key(master_key, deployment_id).encode("utf-8")).digest()
        self._upstream_auth = f"Bearer {master_key}"
        self.deployment_id = deployment_id
        self._socket = str(upstream_socket)
        self._max_body = max_body_bytes
        self._head_timeout_s = head_timeout_s
        self._body_timeout_s = body_timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._max_connections = max_connections
        self._reports = _Budget(reports_per_s)
        self._open = 0
        self._tasks: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return (
            f"ServingProxy(deployment_id={self.deployment_id}, upstream=unix:{self._socket}, "
            f"max_body_bytes={self._max_body})"
        )

    @property
    def upstream(self) -> str:
        return self._socket

    async def start(self, host: str, port: int) -> asyncio.Server:
        """Listen on ``host:port`` (port 0 picks one); serve until the returned server is closed."""
        return await asyncio.start_server(self._serve, host, port, limit=_HEAD_LIMIT, reuse_address=True)

    def authorized(self, request_headers: Sequence[str]) -> bool:
        """True when exactly one ``Authorization: Bearer <key>`` carries this deployment's key (constant-time)."""
        if len(request_headers) != 1:
            return False
        scheme, _, token = request_headers[0].partition(" ")
        if scheme.lower() != "bearer":
            return False
        offered = hashlib.sha256(token.strip().encode("utf-8")).digest()
        return hmac.compare_digest(offered, self._key_digest)

    # ------------------------------------------------------------------ one connection

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._open >= self._max_connections:
            writer.close()
            return
        self._open += 1
        try:
            await self._one_request(reader, writer, _peer(writer))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the caller went away
        except Exception:  # a bug must cost one connection, never the listener
            log.exception("serving proxy: unexpected error")
        finally:
            self._open -= 1
            writer.close()  # not awaited: a cancelled task (the proxy stopping) must not wait in its finally

    async def _one_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self._head_timeout_s)
        except asyncio.LimitOverrunError:
            log.info("refused a request from %s: 431 the request head is too large", peer)
            await self._answer(writer, 431, "the request head is too large")
            await self._linger(reader, writer)
            return
        except TimeoutError:
            await self._answer(writer, 408, "the request head did not arrive in time")
            return
        except asyncio.IncompleteReadError:
            return  # closed before a whole head: nothing to answer
        request: _Request | None = None
        try:
            request = _parse_head(head)
            access = _route(request)
            if access is Access.KEY and not self.authorized(request.values("authorization")):
                self._report(request, peer)
                raise _Refusal(401, "no valid API key (a Bearer token)")
            length = _content_length(request, self._max_body)
            body = await self._body(reader, writer, request, length)
        except _Refusal as refused:
            what = f"{request.method} {_printable(request.target)}" if request else "a malformed request"
            log.info("refused %s from %s: %d %s", what, peer, refused.status, refused.reason)
            await self._answer(writer, refused.status, refused.reason, allow=refused.allow)
            await self._linger(reader, writer)
            return
        await self._forward(request, body, writer, peer, self._upstream_auth if access is Access.KEY else None)

    async def _linger(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Half-close, then read and drop what the caller still sends (2 s at most): closing a socket with unread
        input resets the connection, and the caller could lose the answer it was just given."""
        if writer.can_write_eof():
            with contextlib.suppress(OSError):
                writer.write_eof()
        deadline = time.monotonic() + 2.0
        budget = self._max_body + _HEAD_LIMIT
        with contextlib.suppress(ConnectionError, TimeoutError, OSError):
            while budget > 0 and (left := deadline - time.monotonic()) > 0:
                data = await asyncio.wait_for(reader.read(_CHUNK), left)
                if not data:
                    return
                budget -= len(data)

    async def _body(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: _Request, length: int
    ) -> bytes:
        if not length:
            return b""
        if any(value.lower() == "100-continue" for value in request.values("expect")):
            writer.write(f"{request.version} 100 Continue\r\n\r\n".encode("latin-1"))
            await writer.drain()
        try:
            return await asyncio.wait_for(reader.readexactly(length), self._body_timeout_s)
        except TimeoutError:
            raise _Refusal(408, "the request body did not arrive in time") from None

    async def _forward(
        self, request: _Request, body: bytes, writer: asyncio.StreamWriter, peer: str, authorization: str | None
    ) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.wait_for(
                asyncio.open_unix_connection(self._socket, limit=_RESPONSE_HEAD_LIMIT), self._connect_timeout_s
            )
        except (OSError, TimeoutError) as exc:
            # vLLM is not listening: close without an answer, as its closed port did before the proxy.
            log.warning("vLLM is not answering on %s (%s); %s closed unanswered", self._socket, exc, peer)
            return
        try:
            upstream_writer.write(_upstream_head(request, len(body), peer, authorization) + body)
            await upstream_writer.drain()
            try:
                head = await upstream_reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
                log.warning("vLLM ended %s %s without a whole answer (%s)", request.method, request.target, exc)
                return
            response_head, length = _response_head(head)
            writer.write(response_head)
            await writer.drain()
            while length is None or length > 0:
                chunk = await upstream_reader.read(_CHUNK if length is None else min(_CHUNK, length))
                if not chunk:
                    break
                writer.write(chunk)
                await writer.drain()
                if length is not None:
                    length -= len(chunk)
        finally:
            upstream_writer.close()

    async def _answer(
        self, writer: asyncio.StreamWriter, status: int, message: str, *, allow: str | None = None
    ) -> None:
        body = json.dumps({"error": _REASONS.get(status, "Error"), "detail": message}).encode()
        lines = [
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
            "Connection: close",
        ]
        if status == 401:
            lines.append('WWW-Authenticate: Bearer realm="vllm"')
        if allow:
            lines.append(f"Allow: {allow}")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        with contextlib.suppress(ConnectionError):
            await writer.drain()

    # ------------------------------------------------------------------ refusals in vLLM's own log

    def _report(self, request: _Request, peer: str) -> None:
        if not request.target.startswith(VLLM_GUARDED_PREFIX + "/") or not self._reports.take():
            return
        task = asyncio.ensure_future(self._send_report(request.method, request.target, peer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send_report(self, method: str, path: str, peer: str) -> None:
        """``method path`` (an allow-listed pair) with no key, no body and no header of the caller's."""
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nX-Forwarded-For: {peer}\r\n"
            "Content-Length: 0\r\nConnection: close\r\n\r\n"
        )
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(self._socket), self._connect_timeout_s)
        except (OSError, TimeoutError):
            return  # vLLM down: the proxy's own line is all there is
        try:
            writer.write(head.encode("latin-1"))
            await writer.drain()
            deadline = time.monotonic() + self._connect_timeout_s
            left = _RESPONSE_HEAD_LIMIT
            while left > 0 and (data := await asyncio.wait_for(reader.read(left), deadline - time.monotonic())):
                left -= len(data)  # read to the end, so vLLM is not cut off while it answers (it logs the line)
        except (OSError, TimeoutError):
            pass
        finally:
            writer.close()


def _upstream_head(request: _Request, length: int, peer: str, authorization: str | None) -> bytes:
    named_hop = {
        name.strip().lower() for value in request.values("connection") for name in value.split(",") if name.strip()
    }
    lines = [f"{request.method} {request.target} {request.version}"]
    lines += [
        f"{name}: {value}"
        for name, value in request.headers
        if name.lower() not in _DROPPED_REQUEST and name.lower() not in named_hop
    ]
    if not request.values("host"):
        lines.append("Host: localhost")
    if authorization is not None:
        lines.append(f"Authorization: {authorization}")
    lines += [f"X-Forwarded-For: {peer}", "Connection: close"]
    if length or request.method == "POST":
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _response_head(head: bytes) -> tuple[bytes, int | None]:
    """vLLM's status line and headers with hop-by-hop ones replaced by ``Connection: close``, and the body's
    length when it has a ``Content-Length`` (None: it ends when vLLM closes, chunked bodies included). The body
    itself passes untouched, chunk framing and all."""
    lines = head[:-4].decode("latin-1").split("\r\n")
    kept = [lines[0]]
    lengths, chunked = set(), False
    for line in lines[1:]:
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if name in _DROPPED_RESPONSE:
            continue
        if name == "content-length":
            lengths.add(value.strip())
        chunked = chunked or name == "transfer-encoding"
        kept.append(line)
    length = None
    if not chunked and len(lengths) == 1 and next(iter(lengths)).isdigit():
        length = int(next(iter(lengths)))
    return ("\r\n".join([*kept, "Connection: close"]) + "\r\n\r\n").encode("latin-1"), length


def _listen_address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def _deployment_id(text: str) -> str:
    if not re.fullmatch(DEPLOYMENT_ID_PATTERN, text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a deployment id ({DEPLOYMENT_ID_PATTERN})")
    return text


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m node_agent.serving_proxy",
        description="Key-checking, allow-listing reverse proxy in front of vLLM's unix socket.",
    )
    parser.add_argument("--listen", type=_listen_address, required=True, help="HOST:PORT, e.g. 0.0.0.0:8000")
    parser.add_argument("--upstream-socket", type=Path, required=True, help="vLLM's unix socket (vllm serve --uds)")
    parser.add_argument("--key-file", type=Path, required=True, help="file holding the master API key (never argv)")
    parser.add_argument(
        "--deployment-id", type=_deployment_id, required=True, help="the deployment whose derived key is accepted"
    )
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    parser.add_argument("--log-level", default="INFO")
    return parser


async def _run(proxy: ServingProxy, host: str, port: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)  # as process 1 of a container, SIGTERM needs a handler
    server = await proxy.start(host, port)
    log.info("serving proxy on %s:%d for unix:%s (deployment %s)", host, port, proxy.upstream, proxy.deployment_id)
    async with server:
        await stop.wait()
    log.info("serving proxy stopped")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m node_agent.serving_proxy``."""
    args = _parser().parse_args(argv)
    configure_logging(args.log_level)
    try:
        key = read_api_key(args.key_file)
    except KeyFileError as exc:
        log.error("%s: not serving without it", exc)
        return EXIT_NO_KEY
    register_secret(key)
    register_secret(deployment_api_key(key, args.deployment_id))
    host, port = args.listen
    proxy = ServingProxy(
        master_key=key,
        deployment_id=args.deployment_id,
        upstream_socket=args.upstream_socket,
        max_body_bytes=args.max_body_bytes,
    )
    asyncio.run(_run(proxy, host, port))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A lean HTTP/1.1 transport for httpx, built for measuring streams: keep-alive, TCP_NODELAY, receipt times.

Why not httpx's default transport: httpcore's connection pool rescans every connection for every request
(quadratic in the pool size), so at 64 streams the client, not the server, sets the pace, and its TTFT is
taken when a coroutine resumes, well after the bytes arrived. This transport plugs into httpx's single
extension point (``httpx.AsyncBaseTransport``) and keeps idle connections on a stack per origin.

Receipt times: on ``http://`` a connection reads with ``recvmsg`` and asks the kernel for each read's receive
time (``SO_TIMESTAMPNS``, Linux), so a stamp says when the bytes reached the socket, however busy this event
loop was with 63 other streams. Without kernel stamps (TLS, other systems) the stamp is taken in
``data_received``, the first Python code that runs once the loop sees the bytes. :class:`ResponseStream`'s
``received_at`` is the stamp of the piece last yielded (``time.perf_counter`` scale).

Scope: plain ``http://`` and ``https://`` origins, request bodies given as bytes, responses framed by
``Content-Length``, ``Transfer-Encoding: chunked`` or connection close; no HTTP/2, no proxies, no 1xx.
Idle connections are reused for at most 4 s (below uvicorn's 5 s keep-alive timeout) and only while open, and a
request is never sent twice: a server that drops a request is a failure to count, not to hide. Errors are
httpx's own exception types.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
import sys
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import AsyncIterator

import httpx

__all__ = [
    "RECEIPT_CLOCK",
    "ResponseStream",
    "StreamingTransport",
    "enable_receive_times",
    "read_with_time",
    "receive_time",
]

RECEIPT_CLOCK = "tpuctl_receipt_clock"
"""``response.extensions[RECEIPT_CLOCK]`` is the :class:`ResponseStream`, whose ``received_at`` stamps each piece."""

_HEAD = "tpuctl_request_head"
_MAX_HEAD_BYTES = 64 * 1024
_IDLE_LIMIT_S = 4.0  # below uvicorn's 5 s keep-alive timeout, so vLLM never closes a connection we reuse
_READ_BYTES = 256 * 1024
# SO_TIMESTAMPNS (Linux; the socket module does not export it): receive times as struct timespec in a cmsg.
_SO_TIMESTAMPNS = 35 if sys.platform == "linux" else -1
_TIMESPEC = struct.Struct("@qq")
_ANCILLARY_BYTES = socket.CMSG_SPACE(_TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 64


def enable_receive_times(sock: socket.socket) -> bool:
    """Ask the kernel to stamp every read of ``sock`` with its receive time; False where it cannot."""
    if _SO_TIMESTAMPNS < 0:
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


def read_with_time(sock: socket.socket, size: int = _READ_BYTES) -> tuple[bytes, float]:
    """One ``recvmsg``: the bytes and when they reached the socket (``perf_counter`` scale; now if unstamped)."""
    data, ancillary, _flags, _address = sock.recvmsg(size, _ANCILLARY_BYTES)
    return data, receive_time(ancillary)


def receive_time(ancillary: list[tuple[int, int, bytes]]) -> float:
    """The kernel's receive stamp in a ``recvmsg`` result, moved to ``perf_counter``; now when there is none."""
    now = time.perf_counter()
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(payload) >= _TIMESPEC.size:
            seconds, nanoseconds = _TIMESPEC.unpack_from(payload)
            # kernel CLOCK_REALTIME -> perf_counter (CLOCK_MONOTONIC, shared by every process on the machine)
            return min(now, seconds + nanoseconds / 1e9 - (time.time() - time.perf_counter()))
    return now


class _Connection(ABC):
    """What a response reads from: a buffer, EOF and error flags, the receipt time of the last read, a waiter."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.received_at = 0.0
        self.eof = False
        self.error: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.idle_since = 0.0
        self.requests = 0
        self.kernel_stamps = False

    def _arrived(self, data: bytes, stamp: float) -> None:
        self.received_at = stamp
        self.buffer += data
        self._wake()

    def _ended(self, exc: BaseException | None) -> None:
        self.eof = True
        self.error = self.error or exc
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self) -> None:
        """Until more bytes, EOF or an error arrive."""
        if self.eof:
            return
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None

    @property
    @abstractmethod
    def usable(self) -> bool:
        """True while the connection can take another request."""

    @abstractmethod
    def write(self, data: bytes) -> None:
        """Implemented by each connection."""

    @abstractmethod
    def close(self) -> None:
        """Implemented by each connection."""


class _KernelStampedConnection(_Connection):
    """Plain TCP read with ``recvmsg``: each read carries the kernel's receive time (``SO_TIMESTAMPNS``).

    The stamp is taken when the packet reached the socket, so it does not depend on how busy this event loop
    was. (For TCP the kernel reports the time of the last segment the read consumed.)
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        super().__init__()
        self._loop = loop
        self._sock = sock
        self._pending = bytearray()
        self._closed = False
        self.kernel_stamps = enable_receive_times(sock)
        loop.add_reader(sock.fileno(), self._on_readable)

    def _on_readable(self) -> None:
        try:
            data, ancillary, _flags, _address = self._sock.recvmsg(_READ_BYTES, _ANCILLARY_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._stop_reading()
            self._ended(exc)
            return
        if not data:
            self._stop_reading()
            self._ended(None)
            return
        self._arrived(data, receive_time(ancillary))

    def _stop_reading(self) -> None:
        if not self._closed:
            self._loop.remove_reader(self._sock.fileno())

    @property
    def usable(self) -> bool:
        return not self.eof and not self._closed

    def write(self, data: bytes) -> None:
        if self._pending:
            self._pending += data
            return
        try:
            sent = self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._ended(exc)
            return
        if sent < len(data):
            self._pending += data[sent:]
            self._loop.add_writer(self._sock.fileno(), self._on_writable)

    def _on_writable(self) -> None:
        try:
            sent = self._sock.send(self._pending)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._loop.remove_writer(self._sock.fileno())
            self._ended(exc)
            return
        del self._pending[:sent]
        if not self._pending:
            self._loop.remove_writer(self._sock.fileno())

    def close(self) -> None:
        if self._closed:
            return
        self._stop_reading()
        if self._pending:
            self._loop.remove_writer(self._sock.fileno())
        self._closed = True
        self.eof = True
        self._sock.close()
        self._wake()


class _ProtocolConnection(_Connection, asyncio.Protocol):
    """The asyncio-transport path (used for TLS): stamped in ``data_received``."""

    def __init__(self) -> None:
        super().__init__()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._arrived(data, time.perf_counter())

    def eof_received(self) -> bool | None:
        self._ended(None)
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._ended(exc)

    @property
    def usable(self) -> bool:
        return not self.eof and self.transport is not None and not self.transport.is_closing()

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class ResponseStream(httpx.AsyncByteStream):
    """A response body read from one connection; hands the connection back when fully read."""

    def __init__(self, owner: StreamingTransport, key: tuple[str, str, int], conn: _Connection) -> None:
        self._owner = owner
        self._key = key
        self._conn = conn
        self._length: int | None = None
        self._chunked = False
        self._keep_alive = True
        self._done = False
        self.received_at = conn.received_at
        """``perf_counter`` when the bytes last yielded arrived (stamped in ``data_received``)."""

    def _frame(self, headers: list[tuple[bytes, bytes]], version: bytes) -> None:
        connection = b""
        for name, value in headers:
            lower = name.lower()
            if lower == b"content-length":
                self._length = int(value)
            elif lower == b"transfer-encoding" and b"chunked" in value.lower():
                self._chunked = True
            elif lower == b"connection":
                connection = value.lower()
        self._keep_alive = b"close" not in connection and (version == b"HTTP/1.1" or b"keep-alive" in connection)
        if self._chunked:
            self._length = None
        if self._length is None and not self._chunked:
            self._keep_alive = False  # the body runs until the server closes
        if self._length == 0:
            self._finish()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn = self._conn
        while not self._done:
            piece = self._chunked_piece() if self._chunked else self._plain_piece()
            if piece:
                self.received_at = conn.received_at
                yield piece
                continue
            if self._done:
                return
            if conn.eof:
                if self._length is None and not self._chunked:
                    self._finish()
                    return
                raise httpx.RemoteProtocolError("peer closed the connection before the response body was complete")
            await conn.wait()

    def _plain_piece(self) -> bytes:
        buffer = self._conn.buffer
        if not buffer:
            return b""
        if self._length is None:
            piece = bytes(buffer)
            buffer.clear()
            return piece
        take = min(self._length, len(buffer))
        piece = bytes(buffer[:take])
        del buffer[:take]
        self._length -= take
        if self._length == 0:
            self._finish()
        return piece

    def _chunked_piece(self) -> bytes:
        """Every complete chunk now in the buffer, de-framed; the terminating chunk ends the body."""
        buffer = self._conn.buffer
        out = bytearray()
        position = 0
        while True:
            line_end = buffer.find(b"\r\n", position)
            if line_end < 0:
                break
            size_text = bytes(buffer[position:line_end]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise httpx.RemoteProtocolError(f"bad chunk size {size_text[:20]!r}") from None
            if size == 0:
                trailer_end = buffer.find(b"\r\n\r\n", line_end)
                if trailer_end < 0 and buffer[line_end : line_end + 4] != b"\r\n\r\n":
                    break
                end = line_end + 4 if buffer[line_end : line_end + 4] == b"\r\n\r\n" else trailer_end + 4
                del buffer[:end]
                self._finish()
                return bytes(out)
            data_start = line_end + 2
            data_end = data_start + size
            if len(buffer) < data_end + 2:
                break
            out += buffer[data_start:data_end]
            position = data_end + 2
        if position:
            del buffer[:position]
        return bytes(out)

    def _finish(self) -> None:
        if self._done:
            return
        self._done = True
        if self._keep_alive and not self._conn.buffer and self._conn.usable:
            self._owner.release(self._key, self._conn)
        else:
            self._conn.close()

    async def aclose(self) -> None:
        if not self._done:
            self._done = True
            self._conn.close()  # unread body: the connection cannot be reused


class StreamingTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 with keep-alive for ``httpx.AsyncClient(transport=StreamingTransport())``."""

    def __init__(self, *, connect_timeout_s: float = 10.0, ssl_context: ssl.SSLContext | None = None) -> None:
        if connect_timeout_s <= 0:
            raise ValueError(f"connect_timeout_s: {connect_timeout_s} must be > 0")
        self._connect_timeout_s = connect_timeout_s
        self._ssl_context = ssl_context
        self._idle: dict[tuple[str, str, int], deque[_Connection]] = {}
        self.connections_opened = 0

    @staticmethod
    def prepare(request: httpx.Request) -> httpx.Request:
        """Serialise the request head now (outside a measured interval); returns the same request."""
        request.extensions[_HEAD] = _request_head(request, len(request.content))
        return request

    def release(self, key: tuple[str, str, int], conn: _Connection) -> None:
        conn.idle_since = time.monotonic()
        self._idle.setdefault(key, deque()).append(conn)

    def _take_idle(self, key: tuple[str, str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.usable and now - conn.idle_since < _IDLE_LIMIT_S:
                return conn
            conn.close()
        return None

    async def _open(self, key: tuple[str, str, int]) -> _Connection:
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                if scheme == "https":
                    context = self._ssl_context or ssl.create_default_context()
                    _transport, conn = await loop.create_connection(
                        _ProtocolConnection, host, port, ssl=context, server_hostname=host
                    )
                    sock = conn.transport.get_extra_info("socket") if conn.transport else None
                    if sock is not None:
                        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    connection: _Connection = conn
                else:
                    connection = await self._open_plain(loop, host, port)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {host}:{port} took over {self._connect_timeout_s:g} s") from None
        except OSError as exc:
            raise httpx.ConnectError(f"cannot connect to {host}:{port}: {exc}") from exc
        self.connections_opened += 1
        return connection

    @staticmethod
    async def _open_plain(loop: asyncio.AbstractEventLoop, host: str, port: int) -> _Connection:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
        last: OSError | None = None
        for family, kind, proto, _name, address in infos:
            sock = socket.socket(family, kind, proto)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                await loop.sock_connect(sock, address)
            except OSError as exc:
                sock.close()
                last = exc
                continue
            return _KernelStampedConnection(loop, sock)
        raise last or OSError(f"no address for {host}")

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        scheme = url.scheme
        if scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"url: scheme {scheme!r} is not supported (use http or https)")
        port = url.port or (443 if scheme == "https" else 80)
        key = (scheme, url.host, port)
        try:
            body = request.content
        except httpx.RequestNotRead:
            body = await request.aread()
        head = request.extensions.get(_HEAD) or _request_head(request, len(body))
        conn = self._take_idle(key) or await self._open(key)
        conn.requests += 1
        conn.write(head + body)
        try:
            status, version, reason, headers = await _read_head(conn)
        except _StaleConnection:
            conn.close()
            raise httpx.RemoteProtocolError("server closed the connection without sending a response") from None
        stream = ResponseStream(self, key, conn)
        stream._frame(headers, version)
        return httpx.Response(
            status,
            headers=headers,
            stream=stream,
            extensions={"http_version": version, "reason_phrase": reason, RECEIPT_CLOCK: stream},
            request=request,
        )

    async def aclose(self) -> None:
        for idle in self._idle.values():
            while idle:
                idle.pop().close()
        self._idle.clear()


class _StaleConnection(Exception):
    """EOF before the first response byte."""


def _request_head(request: httpx.Request, length: int) -> bytes:
    target = request.url.raw_path
    lines = [request.method.encode("ascii") + b" " + target + b" HTTP/1.1"]
    has_length = False
    for name, value in request.headers.raw:
        lower = name.lower()
        if lower in (b"content-length", b"transfer-encoding"):
            has_length = has_length or lower == b"content-length"
            if lower == b"transfer-encoding":
                continue
        lines.append(name + b": " + value)
    if not has_length and (length or request.method in ("POST", "PUT", "PATCH")):
        lines.append(b"Content-Length: " + str(length).encode("ascii"))
    return b"\r\n".join(lines) + b"\r\n\r\n"


async def _read_head(conn: _Connection) -> tuple[int, bytes, bytes, list[tuple[bytes, bytes]]]:
    while True:
        end = conn.buffer.find(b"\r\n\r\n")
        if end >= 0:
            break
        if len(conn.buffer) > _MAX_HEAD_BYTES:
            conn.close()
            raise httpx.RemoteProtocolError("response head is over 64 KiB")
        if conn.eof:
            if not conn.buffer:
                raise _StaleConnection
            raise httpx.RemoteProtocolError("peer closed the connection in the middle of the response head")
        await conn.wait()
    head = bytes(conn.buffer[:end])
    del conn.buffer[: end + 4]
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    try:
        version, status = parts[0], int(parts[1])
    except (IndexError, ValueError):
        raise httpx.RemoteProtocolError(f"bad status line {lines[0][:60]!r}") from None
    reason = parts[2] if len(parts) > 2 else b""
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise httpx.RemoteProtocolError(f"bad header line {line[:60]!r}")
        headers.append((name.strip(), value.strip()))
    return status, version, reason, headers

"""The local cloud's Docker Engine API: the subset the node agent uses, on a unix socket per node.

Why: on a TPU VM the node agent restarts and tails the vLLM container through ``/var/run/docker.sock``
(``shared.adapters.docker_engine``). Here the "container" is the real vLLM process the node runtime started, so
this module serves the same three calls over that process, and the agent runs the very same adapter:

* ``GET /containers/{name}/json``: ``State.Status`` (running, restarting, exited, created), ``State.StartedAt``
  (on the node's clock: the simulator's virtual time in the local cloud, as the commands' ``issued_at``),
  ``State.Pid``, ``Config.Tty`` false;
* ``POST /containers/{name}/restart?t=N``: stop the process group (SIGTERM, SIGKILL after N s) and start the
  process again with the same start function (same port, same arguments, same key file); 204 once started;
* ``GET /containers/{name}/logs?stdout=1&stderr=1&tail=N&timestamps=1``: the newest lines of the process's log
  file in Docker's multiplexed framing (stream 2, as vLLM logs on stderr). A plain file keeps no time per
  line, so with ``timestamps=1`` every line carries the file's modification time.

Unknown containers answer 404 ``{"message": "No such container: ..."}`` as the engine does. The socket is 0600
inside the node's 0700 folder.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import socketserver
import struct
import tempfile
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, unquote, urlsplit

from shared.ports import Clock

__all__ = [
    "ContainerApiServer",
    "ContainerProcess",
    "ProcessContainer",
    "docker_time",
    "frame",
    "serve_node_container",
    "tail_file",
]

log = logging.getLogger("tpuctl.localcloud.container_api")

_HEADER = struct.Struct(">BxxxL")
_ROUTE = re.compile(r"^/(?:v[0-9.]+/)?containers/([^/]+)/(json|restart|logs)$")
_MAX_TAIL = 10_000
_READ_BLOCK = 64 * 1024
MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes with the NUL; keep a margin


class ContainerProcess(Protocol):
    """What a started process offers (``localcloud.vllm_cpu.VllmProcess`` fits)."""

    @property
    def pid(self) -> int: ...

    def alive(self) -> bool: ...

    def stop(self, timeout_s: float = 10.0) -> int | None: ...


def docker_time(moment: datetime) -> str:
    """RFC 3339 with nanoseconds in UTC, as the engine writes ``StartedAt``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"


def frame(stream: int, payload: bytes) -> bytes:
    """One frame of Docker's multiplexed stream."""
    return _HEADER.pack(stream, len(payload)) + payload


def tail_file(path: Path, lines: int) -> list[bytes]:
    """The last ``lines`` lines of ``path`` (read backwards in blocks; a missing file has none)."""
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return []
    with handle:
        handle.seek(0, os.SEEK_END)
        position = handle.tell()
        data = b""
        while position > 0 and data.count(b"\n") <= lines:
            step = min(_READ_BLOCK, position)
            position -= step
            handle.seek(position)
            data = handle.read(step) + data
    found = data.split(b"\n")
    if found and found[-1] == b"":
        found.pop()
    return found[-lines:]


class ProcessContainer:
    """A process standing in for a container: restart = stop the group, call ``start`` again."""

    def __init__(
        self,
        name: str,
        start: Callable[[], ContainerProcess],
        *,
        log_path: Path,
        clock: Clock,
        process: ContainerProcess | None = None,
    ) -> None:
        self.name = name
        self.log_path = log_path
        self._start = start
        self._clock = clock
        self._process = process
        self._started_at: datetime | None = clock.now() if process is not None else None
        self._finished_at: datetime | None = None
        self._restarting = False
        self._closed = False
        self._lock = threading.Lock()
        self.restarts = 0

    @property
    def process(self) -> ContainerProcess | None:
        return self._process

    def start(self) -> None:
        """Start the process if none runs (the first start, when no process was adopted)."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"container {self.name}: the node is shutting down")
            if self._process is None or not self._process.alive():
                self._process = self._start()
                self._started_at = self._clock.now()

    def inspect(self) -> dict[str, Any]:
        process = self._process
        running = process is not None and process.alive()
        if self._restarting:
            status = "restarting"
        elif process is None:
            status = "created"
        else:
            status = "running" if running else "exited"
        return {
            "Id": f"local-{self.name}",
            "Name": f"/{self.name}",
            "RestartCount": self.restarts,
            "State": {
                "Status": status,
                "Running": running,
                "Restarting": self._restarting,
                "Pid": process.pid if running and process is not None else 0,
                "StartedAt": docker_time(self._started_at) if self._started_at else "0001-01-01T00:00:00Z",
                "FinishedAt": docker_time(self._finished_at) if self._finished_at else "0001-01-01T00:00:00Z",
            },
            "Config": {"Tty": False, "Labels": {}},
        }

    def restart(self, timeout_s: float) -> None:
        """Stop the running process (its whole group) and start it again; one restart at a time."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"container {self.name}: the node is shutting down")
            self._restarting = True
            try:
                if self._process is not None:
                    self._process.stop(timeout_s=max(timeout_s, 0.1))
                    self._finished_at = self._clock.now()
                self._process = self._start()
                self._started_at = self._clock.now()
                self.restarts += 1
            finally:
                self._restarting = False
        log.info("container %s restarted (pid %s)", self.name, self._process.pid)

    def log_lines(self, tail: int) -> list[bytes]:
        return tail_file(self.log_path, tail)

    def log_time(self) -> datetime:
        try:
            return datetime.fromtimestamp(self.log_path.stat().st_mtime, UTC)
        except OSError:
            return self._clock.now()

    def close(self) -> None:
        """No restart after this (the node is going away); waits for a restart in progress."""
        with self._lock:
            self._closed = True


class _Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    containers: Mapping[str, ProcessContainer]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("container api: " + format, *args)

    def address_string(self) -> str:
        return "local"

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self._route("POST")

    def _route(self, method: str) -> None:
        url = urlsplit(self.path)
        query = {key: values[-1] for key, values in parse_qs(url.query).items()}
        if url.path == "/_ping":
            self._send(200, b"OK", "text/plain; charset=utf-8")
            return
        match = _ROUTE.match(url.path)
        if match is None:
            self._error(404, "page not found")
            return
        name, action = unquote(match.group(1)).lstrip("/"), match.group(2)
        container = self.server.containers.get(name)
        if container is None:
            self._error(404, f"No such container: {name}")
            return
        expected = "POST" if action == "restart" else "GET"
        if method != expected:
            self._error(405, f"{method} is not allowed on /containers/{{name}}/{action}")
            return
        try:
            if action == "json":
                self._send(200, json.dumps(container.inspect()).encode(), "application/json")
            elif action == "restart":
                self._restart(container, query)
            else:
                self._logs(container, query)
        except (RuntimeError, OSError) as exc:
            self._error(500, f"{action} failed: {exc}")

    def _restart(self, container: ProcessContainer, query: Mapping[str, str]) -> None:
        try:
            timeout_s = float(query.get("t", "10"))
        except ValueError:
            self._error(400, f"t: {query.get('t')!r} is not a number of seconds")
            return
        container.restart(timeout_s)
        self._send(204, b"", None)

    def _logs(self, container: ProcessContainer, query: Mapping[str, str]) -> None:
        wants_stdout, wants_stderr = _flag(query.get("stdout")), _flag(query.get("stderr"))
        if not (wants_stdout or wants_stderr):
            self._error(400, "Bad parameters: you must choose at least one stream")
            return
        tail = query.get("tail", "all")
        if tail == "all":
            count = _MAX_TAIL
        elif tail.isdigit():
            count = min(int(tail), _MAX_TAIL)
        else:
            self._error(400, f"tail: {tail!r} must be a number of lines or 'all'")
            return
        lines = container.log_lines(count) if count > 0 and wants_stderr else []
        prefix = (docker_time(container.log_time()) + " ").encode() if _flag(query.get("timestamps")) else b""
        body = b"".join(frame(2, prefix + line + b"\n") for line in lines)
        self._send(200, body, None)

    def _error(self, code: int, message: str) -> None:
        self._send(code, json.dumps({"message": message}).encode(), "application/json")

    def _send(self, code: int, body: bytes, content_type: str | None) -> None:
        self.send_response(code)
        if content_type:
            self.send_header("Content-Type", content_type)
        self.send_header("Api-Version", "1.43")
        if code != 204:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and code != 204:
            self.wfile.write(body)


def _flag(value: str | None) -> bool:
    return (value or "").lower() in ("1", "true", "yes")


class ContainerApiServer:
    """Serves ``containers`` on ``socket_path`` (0600) from a daemon thread until :meth:`stop`."""

    def __init__(self, socket_path: Path, containers: Mapping[str, ProcessContainer]) -> None:
        if len(str(socket_path)) > MAX_SOCKET_PATH:
            raise ValueError(
                f"socket_path: {socket_path} is {len(str(socket_path))} characters; a unix socket path must stay "
                f"under {MAX_SOCKET_PATH} (use a shorter work folder)"
            )
        self.socket_path = socket_path
        self.containers = dict(containers)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.private_dir: Path | None = None  # a folder made only for the socket, removed on stop

    @property
    def docker_host(self) -> str:
        """The value for ``TPUCTL_NODE_DOCKER_HOST``."""
        return f"unix://{self.socket_path}"

    def start(self) -> ContainerApiServer:
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        server = _Server(str(self.socket_path), _Handler)  # inside a 0700 folder: nobody else can reach it
        os.chmod(self.socket_path, 0o600)
        server.containers = self.containers
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="container-api", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and remove the socket; idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        if self.private_dir is not None:
            shutil.rmtree(self.private_dir, ignore_errors=True)
            self.private_dir = None


def serve_node_container(
    work_dir: Path,
    container: ProcessContainer,
) -> ContainerApiServer:
    """Serve one node's container on ``<work_dir>/docker.sock`` (what the node runtime gives each node).

    A work folder too deep for a unix socket path gets a private (0700) folder under the system's temporary
    directory instead; :meth:`ContainerApiServer.stop` removes it.
    """
    socket_path = work_dir / "docker.sock"
    private: Path | None = None
    if len(str(socket_path)) > MAX_SOCKET_PATH:
        private = Path(tempfile.mkdtemp(prefix="tpuctl-node-"))  # mkdtemp makes it 0700
        socket_path = private / "docker.sock"
    server = ContainerApiServer(socket_path, {container.name: container})
    server.private_dir = private
    try:
        return server.start()
    except BaseException:
        server.stop()
        raise

"""The VM twin's container runtime: the Docker Engine API subset a TPU VM's script and node agent use.

Why: the startup script runs vLLM and the node agent with ``docker``; the agent restarts and tails vLLM through
``/var/run/docker.sock``. Inside the VM twin this runtime serves that socket, so the same script and the same
agent adapter (``shared.adapters.docker_engine``) run unchanged. A container is a process group inside the VM;
with ``--net=host`` its network is the VM's, with ``--net=none`` a network namespace of its own with loopback only
(nothing of the VM's network, its metadata server included, is reachable; a unix socket in a bound folder is the
only way in). ``--device`` paths must exist on the VM, as the engine checks; ``Privileged``, ``NetworkMode`` and
``Devices`` (and ``PidMode``, ``CapAdd``) show in ``inspect``. Calls served (paths with or without ``/v1.NN``):

* ``POST /images/create?fromImage=&tag=`` (pull): known image references only (:class:`ImageStore`);
* ``POST /containers/create?name=`` (409 on a taken name), ``POST /containers/{id}/start``,
  ``POST /containers/{id}/wait`` (blocks until the process exits; ``{"StatusCode"}``),
  ``POST /containers/{id}/restart?t=``, ``POST /containers/{id}/stop?t=`` (304 when not running),
  ``DELETE /containers/{id}?force=1``;
* ``GET /containers/{id}/json`` (``State``, ``RestartCount``; ``Config`` and ``HostConfig`` as create got them,
  with Docker's own ``Config.Hostname``, so a body built from an inspect creates the same container again) and
  ``GET /containers/{id}/logs`` (multiplexed frames on stream 2, ``tail``, ``timestamps``, ``since``; each line is
  stamped when the runtime first sees it, see :mod:`log_times`).

Restart policies ``always`` and ``unless-stopped`` restart an exited process with backoff (1 s doubling to 30 s),
counting ``RestartCount``; ``AutoRemove`` removes it when it exits. Binds are honoured by the image stand-in
(:meth:`ImageStore.command`), which maps container paths to the VM paths they are bound from.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socketserver
import struct
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, unquote, urlsplit

from localcloud.vm_twin.log_times import log_times

__all__ = [
    "Container",
    "ContainerRuntime",
    "ContainerSpec",
    "EngineApiServer",
    "ImageStore",
    "Launch",
    "docker_time",
    "frame",
    "tail_file",
]

log = logging.getLogger("tpuctl.localcloud.vm.containers")

_MAX_TAIL = 10_000
_HEADER = struct.Struct(">BxxxL")
_READ_BLOCK = 64 * 1024
_BACKOFF_MAX_S = 30.0


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


class ContainerError(Exception):
    """An Engine API error: ``status`` is the HTTP status the engine would answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ContainerSpec:
    """What ``POST /containers/create`` carries (the fields this runtime honours)."""

    name: str
    image: str
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    env: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    binds: tuple[str, ...] = ()
    restart_policy: str = "no"
    auto_remove: bool = False
    network_mode: str = "host"
    privileged: bool = False
    devices: tuple[str, ...] = ()  # PathOnHost of each device: checked to exist; the container process sees /dev
    pid_mode: str = ""  # "host": the VM's process ids (the twin's containers always share them; shown in inspect)
    cap_add: tuple[str, ...] = ()
    config: Mapping[str, Any] = field(default_factory=dict)  # the create body but HostConfig, as given (inspect)
    host_config: Mapping[str, Any] = field(default_factory=dict)  # its HostConfig as given (inspect)

    @classmethod
    def from_create(cls, name: str, body: Mapping[str, Any]) -> ContainerSpec:
        host = body.get("HostConfig") or {}
        return cls(
            config={key: value for key, value in body.items() if key != "HostConfig"},
            host_config=dict(host),
            name=name,
            image=str(body.get("Image") or ""),
            entrypoint=tuple(body.get("Entrypoint") or ()),
            cmd=tuple(body.get("Cmd") or ()),
            env=tuple(body.get("Env") or ()),
            labels=dict(body.get("Labels") or {}),
            binds=tuple(host.get("Binds") or ()),
            restart_policy=str((host.get("RestartPolicy") or {}).get("Name") or "no"),
            auto_remove=bool(host.get("AutoRemove")),
            network_mode=str(host.get("NetworkMode") or "host"),
            privileged=bool(host.get("Privileged")),
            devices=tuple(str(device.get("PathOnHost") or "") for device in host.get("Devices") or ()),
            pid_mode=str(host.get("PidMode") or ""),
            cap_add=tuple(str(cap) for cap in host.get("CapAdd") or ()),
        )


@dataclass(frozen=True)
class Launch:
    """How the image stand-in runs a container: argv and environment of the process, and its log file."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    log_path: Path


class ImageStore(Protocol):
    """The image stand-in: which references exist and how a container of one runs as a process."""

    def has(self, reference: str) -> bool: ...

    def command(self, spec: ContainerSpec) -> Launch: ...


@dataclass
class Container:
    """One container and its current process."""

    id: str
    spec: ContainerSpec
    launch: Launch
    status: str = "created"  # created, running, restarting, exited, removing
    process: subprocess.Popen[bytes] | None = None
    exit_code: int = 0
    restart_count: int = 0
    started_at: datetime | None = None
    finished_at: datetime | None = None
    stopped_by_user: bool = False
    exited: threading.Event = field(default_factory=threading.Event)

    def inspect(self) -> dict[str, Any]:
        running = self.status in ("running", "restarting") and self.process is not None
        return {
            "Id": self.id,
            "Name": f"/{self.spec.name}",
            "RestartCount": self.restart_count,
            "State": {
                "Status": self.status,
                "Running": self.status == "running",
                "Restarting": self.status == "restarting",
                "Pid": self.process.pid if running and self.process is not None else 0,
                "ExitCode": self.exit_code,
                "StartedAt": docker_time(self.started_at) if self.started_at else "0001-01-01T00:00:00Z",
                "FinishedAt": docker_time(self.finished_at) if self.finished_at else "0001-01-01T00:00:00Z",
            },
            "Config": {
                "Hostname": self.id[:12],
                **self.spec.config,
                "Tty": False,
                "Image": self.spec.image,
                "Labels": dict(self.spec.labels),
                "Entrypoint": list(self.spec.entrypoint) or None,
                "Cmd": list(self.spec.cmd) or None,
                "Env": list(self.spec.env),
            },
            "HostConfig": {  # Docker's defaults for what create left out, then what it gave, as given
                "Binds": list(self.spec.binds),
                "AutoRemove": self.spec.auto_remove,
                "NetworkMode": self.spec.network_mode,
                "Privileged": self.spec.privileged,
                "Devices": [{"PathOnHost": path, "PathInContainer": path} for path in self.spec.devices],
                "PidMode": self.spec.pid_mode,
                "CapAdd": list(self.spec.cap_add),
                **self.spec.host_config,
                "RestartPolicy": {"MaximumRetryCount": 0, **(self.spec.host_config.get("RestartPolicy") or {})}
                | {"Name": self.spec.restart_policy},
            },
        }


class ContainerRuntime:
    """Containers of one VM, by name; thread-safe. ``shutdown()`` stops them all (the VM powers off)."""

    def __init__(self, images: ImageStore, *, now: Callable[[], datetime] | None = None) -> None:
        self._images = images
        self._now = now or (lambda: datetime.now(UTC))
        self._containers: dict[str, Container] = {}
        self._lock = threading.RLock()
        self._closed = False

    # ------------------------------------------------------------------ images and lifecycle

    def pull(self, reference: str) -> None:
        if not self._images.has(reference):
            raise ContainerError(404, f"pull access denied for {reference}, repository does not exist")

    def create(self, spec: ContainerSpec) -> Container:
        if not self._images.has(spec.image):
            raise ContainerError(404, f"No such image: {spec.image}")
        if spec.network_mode not in ("host", "none"):
            raise ContainerError(400, f"network {spec.network_mode}: the VM twin has host and none only")
        for device in spec.devices:
            if not os.path.exists(device):
                raise ContainerError(
                    500, f'error gathering device information while adding custom device "{device}": no such file'
                )
        with self._lock:
            if spec.name in self._containers:
                raise ContainerError(409, f'Conflict. The container name "/{spec.name}" is already in use')
            container = Container(id=uuid.uuid4().hex, spec=spec, launch=self._images.command(spec))
            self._containers[spec.name] = container
            return container

    def start(self, name: str) -> None:
        container = self.get(name)
        with self._lock:
            if container.status == "running":
                return
            container.stopped_by_user = False
            self._spawn(container)
        threading.Thread(target=self._watch, args=(container,), name=f"watch-{name}", daemon=True).start()

    def wait(self, name: str, timeout_s: float | None = None) -> int:
        container = self.get(name)
        container.exited.wait(timeout_s)
        return container.exit_code

    def restart(self, name: str, timeout_s: float) -> None:
        container = self.get(name)
        with self._lock:
            self._stop_process(container, timeout_s)
            container.restart_count += 1
            container.stopped_by_user = False
            self._spawn(container)
        threading.Thread(target=self._watch, args=(container,), name=f"watch-{name}", daemon=True).start()

    def stop(self, name: str, timeout_s: float) -> bool:
        """Stop the process (SIGTERM, SIGKILL after ``timeout_s``) for good; False when it was not running."""
        container = self.get(name)
        with self._lock:
            if container.status not in ("running", "restarting"):
                return False
            container.stopped_by_user = True
            self._stop_process(container, timeout_s)
            container.status, container.finished_at = "exited", self._now()
            container.exited.set()
        return True

    def remove(self, name: str, *, force: bool) -> None:
        container = self.get(name)
        with self._lock:
            if container.status in ("running", "restarting") and not force:
                raise ContainerError(409, f"You cannot remove a running container {container.id}. Stop it first")
            container.stopped_by_user = True
            self._stop_process(container, 1.0)
            self._containers.pop(container.spec.name, None)

    def get(self, name: str) -> Container:
        with self._lock:
            found = self._containers.get(name) or next(
                (c for c in self._containers.values() if c.id == name or c.id.startswith(name)), None
            )
        if found is None:
            raise ContainerError(404, f"No such container: {name}")
        return found

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._containers)

    def now_ns(self) -> int:
        """The VM's clock in nanoseconds: log lines are stamped on it."""
        moment = self._now()
        return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1000

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            containers = list(self._containers.values())
        for container in containers:
            container.stopped_by_user = True
            self._stop_process(container, 5.0)

    # ------------------------------------------------------------------ processes

    def _spawn(self, container: Container) -> None:
        if self._closed:
            raise ContainerError(500, "the VM is shutting down")
        launch = container.launch
        launch.log_path.parent.mkdir(parents=True, exist_ok=True)
        with launch.log_path.open("ab") as sink:
            try:
                container.process = subprocess.Popen(
                    list(launch.argv),
                    stdin=subprocess.DEVNULL,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    env=dict(launch.env),
                    cwd="/",
                    start_new_session=True,  # its own group: a restart stops the whole tree
                )
            except OSError as exc:
                container.status, container.exit_code = "exited", 127
                container.exited.set()
                raise ContainerError(
                    400, f"failed to create task for container: exec {launch.argv[0]}: {exc}"
                ) from None
        container.exited.clear()
        container.status, container.started_at = "running", self._now()

    def _stop_process(self, container: Container, timeout_s: float) -> None:
        process = container.process
        if process is None or process.poll() is not None:
            return
        for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(wait_s, 0.1))
                return

    def _watch(self, container: Container) -> None:
        """Record the exit; restart per policy with backoff; remove when AutoRemove."""
        process = container.process
        backoff = 1.0
        while process is not None:
            code = process.wait()
            with self._lock:
                if container.process is not process:
                    return  # restarted meanwhile: that start has its own watcher
                container.exit_code, container.finished_at = code, self._now()
                policy = container.spec.restart_policy
                again = policy in ("always", "unless-stopped") and not container.stopped_by_user and not self._closed
                container.status = "restarting" if again else "exited"
                if not again:
                    container.exited.set()
                    if container.spec.auto_remove:
                        self._containers.pop(container.spec.name, None)
                    return
            time.sleep(backoff)
            backoff = min(backoff * 2, _BACKOFF_MAX_S)
            with self._lock:
                if container.stopped_by_user or self._closed or container.process is not process:
                    container.exited.set()
                    return
                container.restart_count += 1
                try:
                    self._spawn(container)
                except ContainerError:
                    return
                process = container.process


class _Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    runtime: ContainerRuntime


class EngineApiServer:
    """The runtime on a unix socket (0600), from a daemon thread until :meth:`stop`."""

    def __init__(self, runtime: ContainerRuntime, socket_path: Path) -> None:
        self.runtime = runtime
        self.socket_path = socket_path
        with contextlib.suppress(FileNotFoundError):
            socket_path.unlink()
        socket_path.parent.mkdir(parents=True, exist_ok=True)
        self._server = _Server(str(socket_path), _Handler)
        os.chmod(socket_path, 0o600)
        self._server.runtime = runtime

    def start(self) -> EngineApiServer:
        threading.Thread(target=self._server.serve_forever, name="engine-api", daemon=True).start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("engine api: " + format, *args)

    def address_string(self) -> str:
        return "vm"

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_HEAD(self) -> None:
        self._send(200, b"", "text/plain")

    def _dispatch(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        url = urlsplit(self.path)
        path = url.path
        if path.startswith("/v1."):
            path = "/" + path.split("/", 2)[2]
        query = {key: values[-1] for key, values in parse_qs(url.query).items()}
        try:
            code, body = self._route(method, path, query, json.loads(raw) if raw else {})
        except ContainerError as exc:
            code, body = exc.status, {"message": str(exc)}
        except (ValueError, OSError) as exc:
            code, body = 500, {"message": str(exc)}
        if isinstance(body, bytes):
            self._send(code, body, None)
        else:
            self._send(code, b"" if code in (204, 304) else json.dumps(body).encode(), "application/json")

    def _route(self, method: str, path: str, query: Mapping[str, str], body: Any) -> tuple[int, Any]:
        runtime = self.server.runtime
        if path == "/_ping":
            return 200, b"OK"
        if (method, path) == ("POST", "/images/create"):
            reference = query.get("fromImage", "") + (f":{query['tag']}" if query.get("tag") else "")
            runtime.pull(reference)
            return 200, {"status": f"Status: Image is up to date for {reference}"}
        if (method, path) == ("POST", "/containers/create"):
            container = runtime.create(ContainerSpec.from_create(query.get("name") or uuid.uuid4().hex[:12], body))
            return 201, {"Id": container.id, "Warnings": []}
        parts = path.split("/")
        if len(parts) < 3 or parts[1] != "containers":
            return 404, {"message": "page not found"}
        name = unquote(parts[2])
        action = parts[3] if len(parts) > 3 else ""
        return self._container_call(runtime, method, name, action, query)

    def _container_call(
        self, runtime: ContainerRuntime, method: str, name: str, action: str, query: Mapping[str, str]
    ) -> tuple[int, Any]:
        if method == "DELETE" and action == "":
            runtime.remove(name, force=query.get("force") in ("1", "true"))
            return 204, {}
        if method == "GET" and action == "json":
            return 200, runtime.get(name).inspect()
        if method == "GET" and action == "logs":
            return 200, _logs(runtime.get(name), query, runtime.now_ns)
        if method == "POST" and action == "start":
            runtime.start(name)
            return 204, {}
        if method == "POST" and action == "wait":
            return 200, {"StatusCode": runtime.wait(name)}
        if method == "POST" and action == "stop":
            return (204 if runtime.stop(name, float(query.get("t", "10"))) else 304), {}
        if method == "POST" and action == "restart":
            runtime.restart(name, float(query.get("t", "10")))
            return 204, {}
        return 404, {"message": f"page not found: {method} /containers/{{id}}/{action}"}

    def _send(self, code: int, body: bytes, content_type: str | None) -> None:
        self.send_response(code)
        if content_type:
            self.send_header("Content-Type", content_type)
        self.send_header("Api-Version", "1.43")
        if code not in (204, 304):  # no body, as HTTP has it for these
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and code not in (204, 304):
            self.wfile.write(body)


def _logs(container: Container, query: Mapping[str, str], now_ns: Callable[[], int]) -> bytes:
    """The Engine API's logs: ``tail`` (a count or ``all``), ``since`` (UNIX seconds, ``S`` or ``S.NNNNNNNNN``;
    lines stamped at or after it), ``timestamps`` (RFC 3339 with nanoseconds before each line)."""
    if query.get("stdout") not in ("1", "true") and query.get("stderr") not in ("1", "true"):
        raise ContainerError(400, "Bad parameters: you must choose at least one stream")
    tail = query.get("tail", "all")
    if tail != "all" and not tail.isdigit():
        raise ContainerError(400, f"tail: {tail!r} must be a number of lines or 'all'")
    since_ns = _since_ns(query.get("since", ""))
    count = None if tail == "all" else min(int(tail), _MAX_TAIL)
    lines = log_times(container.launch.log_path, now_ns).lines(since_ns, count)
    stamped = query.get("timestamps") in ("1", "true")
    return b"".join(frame(2, (f"{_nano_time(ns)} ".encode() if stamped else b"") + line + b"\n") for ns, line in lines)


def _since_ns(value: str) -> int:
    """Docker's ``since``: empty or 0 for everything, else seconds with an optional fraction of up to 9 digits."""
    seconds, _, fraction = value.partition(".")
    if not value or value == "0":
        return 0
    if not seconds.isdigit() or (fraction and not (fraction.isdigit() and len(fraction) <= 9)):
        raise ContainerError(400, f"since: {value!r} is not a UNIX timestamp (seconds[.nanoseconds])")
    return int(seconds) * 1_000_000_000 + int(fraction.ljust(9, "0") or 0)


def _nano_time(ns: int) -> str:
    """RFC 3339 with nine fraction digits in UTC, as ``docker logs --timestamps`` writes it."""
    whole = datetime.fromtimestamp(ns // 1_000_000_000, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{whole}.{ns % 1_000_000_000:09d}Z"

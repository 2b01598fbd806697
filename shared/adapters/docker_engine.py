"""The serving container through the Docker Engine API on a unix socket (``shared.ports.ServingContainer``).

Why the raw API and not the ``docker`` CLI or docker-py: the node agent runs inside a container of the pinned
vLLM image, which has neither; httpx speaks HTTP over the mounted ``/var/run/docker.sock`` with three calls:

* ``GET /containers/{name}/json``: ``State.Status``, ``State.StartedAt`` (RFC 3339 with nanoseconds; the zero
  time ``0001-01-01T00:00:00Z`` means never started), ``State.Pid``;
* ``POST /containers/{name}/restart?t=N``: stop (SIGTERM, SIGKILL after N s) and start; 204 once started;
* ``GET /containers/{name}/logs?stdout=1&stderr=1&tail=N&timestamps=1``: without a TTY the body is Docker's
  multiplexed stream (frames behind an 8-byte header: stream type 0/1/2, three zero bytes, big-endian uint32
  length); with a TTY it is the plain output. The logs endpoint does not reliably set ``Content-Type``, so
  :class:`LogStreamDecoder` looks at the first header instead. ``since=S`` (whole UNIX seconds, as the API
  documents it) reads forward for the log shipper, which drops the lines of that second before its own time.

``reconfigure`` (an auto-tune trial, issue 22 item 5) recreates the container from its own inspect: ``Config`` as it
is (image, entrypoint, env, labels, ...; the old ``Hostname`` dropped) and ``HostConfig`` as it is (mounts, devices,
``--net=none``, restart policy, shm, ulimits), with only the vllm words of ``Cmd`` changed
(``shared.domain.serving_overrides.apply_to_argv``): ``POST /containers/{name}/stop?t=N`` (304 when already
stopped), ``DELETE /containers/{name}?force=1``, ``POST /containers/create?name=`` and ``POST .../start``. The
first reconfigure keeps the startup script's ``Cmd`` in the label ``tpuctl.planned-cmd`` (JSON) and the overrides in
``tpuctl.serving-overrides``; ``{}`` creates it with that ``Cmd`` again and without either label, so the container
is once more exactly what the script made. If the new config cannot be created, the old one is created again.

The VM twin's container runtime serves the same subset (``localcloud.vm_twin.containers``), so the node agent
has one code path on a TPU VM and on a laptop. Errors are classified once, here: no such container, no socket,
no permission and bad requests are ``PermanentError``; a refused connection (engine down), timeouts and 5xx
are ``TransientError``.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import httpx

from shared.domain.errors import ControllerError, InvalidMessage, PermanentError, TransientError
from shared.domain.serving_overrides import apply_to_argv, check_overrides
from shared.ports import ContainerLogLine, ContainerState

__all__ = [
    "OVERRIDES_LABEL",
    "PLANNED_CMD_LABEL",
    "DockerEngineContainer",
    "LogStreamDecoder",
    "parse_docker_time",
    "split_stamp",
]

_HEADER = struct.Struct(">BxxxL")
_STREAM_TYPES = frozenset({0, 1, 2})
_CONTAINER_NAME = re.compile(r"^/?[a-zA-Z0-9][a-zA-Z0-9_.-]{0,254}$")
_DOCKER_TIME = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(?:\.(\d+))?(Z|[+-]\d{2}:\d{2})$")
_STAMPED = re.compile(rb"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d) ")
_MAX_TAIL = 10_000
_START_ALLOWANCE_S = 60.0  # a restart answers once the new process started; give the start this long
MULTIPLEXED_CONTENT_TYPE = "application/vnd.docker.multiplexed-stream"
PLANNED_CMD_LABEL = "tpuctl.planned-cmd"
"""The startup script's ``Cmd`` (JSON), kept by the first reconfigure so ``{}`` can give it back."""
OVERRIDES_LABEL = "tpuctl.serving-overrides"
"""The serving overrides (JSON) a reconfigured container runs with; absent when it runs the planned argv."""


def parse_docker_time(text: str) -> datetime | None:
    """Docker's RFC 3339 time (nanoseconds cut to microseconds), or None for the zero time or an empty value."""
    if not text or text.startswith("0001-01-01"):
        return None
    match = _DOCKER_TIME.match(text)
    if match is None:
        raise ValueError(f"StartedAt: {text!r} is not an RFC 3339 time")
    whole, fraction, zone = match.groups()
    micros = (fraction or "0")[:6].ljust(6, "0")
    parsed = datetime.fromisoformat(f"{whole}.{micros}{'+00:00' if zone == 'Z' else zone}")
    return parsed.astimezone(UTC)


def split_stamp(line: bytes) -> tuple[int | None, bytes]:
    """``timestamps=1`` puts an RFC 3339 time with nanoseconds before each line: (nanoseconds since the epoch, text)."""
    match = _STAMPED.match(line)
    if match is None:
        return None, line
    whole, fraction, zone = match.groups()
    moment = datetime.fromisoformat(whole.decode() + ("+00:00" if zone == b"Z" else zone.decode()))
    nanos = int((fraction or b"0").decode().ljust(9, "0"))
    return int(moment.timestamp()) * 1_000_000_000 + nanos, line[match.end() :]


class LogStreamDecoder:
    """Splits a logs body back into lines, fed chunk by chunk; frames and lines may break anywhere.

    Multiplexed or plain is decided on the first 8 bytes: a valid header (type 0-2, three zero bytes) means
    frames, anything else the plain output of a TTY container. Lines come out in the order they complete.
    """

    def __init__(self, content_type: str = "") -> None:
        self._mode: Literal["unknown", "multiplexed", "raw"] = (
            "multiplexed" if content_type.startswith(MULTIPLEXED_CONTENT_TYPE) else "unknown"
        )
        self._buffer = bytearray()
        self._partial: dict[int, bytearray] = {}
        self._lines: list[tuple[int, bytes]] = []

    @property
    def mode(self) -> str:
        return self._mode

    def feed(self, chunk: bytes) -> list[tuple[int, bytes]]:
        """Take more of the body; returns the (stream, line) pairs completed so far (without the newline)."""
        self._buffer += chunk
        if self._mode == "unknown":
            if len(self._buffer) < _HEADER.size:
                return self._take()
            self._mode = "multiplexed" if _looks_like_header(bytes(self._buffer[: _HEADER.size])) else "raw"
        if self._mode == "raw":
            self._append(1, bytes(self._buffer))
            self._buffer.clear()
            return self._take()
        while len(self._buffer) >= _HEADER.size:
            stream, length = _HEADER.unpack_from(self._buffer)
            if stream not in _STREAM_TYPES:
                raise TransientError(f"docker logs: a frame header names stream {stream}; the stream is corrupt")
            if len(self._buffer) < _HEADER.size + length:
                break
            payload = bytes(self._buffer[_HEADER.size : _HEADER.size + length])
            del self._buffer[: _HEADER.size + length]
            self._append(stream, payload)
        return self._take()

    def close(self) -> list[tuple[int, bytes]]:
        """The end of the body: unterminated lines come out; a frame cut short is an error."""
        if self._mode == "unknown" or self._mode == "raw":
            if self._buffer:
                self._append(1, bytes(self._buffer))
                self._buffer.clear()
        elif self._buffer:
            raise TransientError(f"docker logs: the body ended inside a frame ({len(self._buffer)} bytes left over)")
        for stream, rest in sorted(self._partial.items()):
            if rest:
                self._lines.append((stream, bytes(rest)))
        self._partial.clear()
        return self._take()

    def _append(self, stream: int, data: bytes) -> None:
        pending = self._partial.setdefault(stream, bytearray())
        pending += data
        while True:
            cut = pending.find(b"\n")
            if cut < 0:
                return
            self._lines.append((stream, bytes(pending[:cut]).rstrip(b"\r")))
            del pending[: cut + 1]

    def _take(self) -> list[tuple[int, bytes]]:
        lines, self._lines = self._lines, []
        return lines


def _looks_like_header(head: bytes) -> bool:
    return head[0] in _STREAM_TYPES and head[1:4] == b"\x00\x00\x00"


class DockerEngineContainer:
    """One named container through the Docker Engine API at ``host`` (``unix:///path`` or ``http://host:port``)."""

    def __init__(self, host: str, container: str, *, timeout_s: float = 10.0) -> None:
        if not _CONTAINER_NAME.fullmatch(container):
            raise ValueError(
                f"node_container: {container!r} is not a container name (letters, digits, _ . -; e.g. tpuctl-vllm)"
            )
        self.container = container.lstrip("/")
        self.host = host
        self.timeout_s = timeout_s
        self._socket_path: Path | None = None
        if host.startswith("unix://"):
            path = host.removeprefix("unix://")
            if not path.startswith("/"):
                raise ValueError(f"node_docker_host: {host!r} needs an absolute path (unix:///var/run/docker.sock)")
            self._socket_path = Path(path)
            transport = httpx.HTTPTransport(uds=path)
            self._client = httpx.Client(transport=transport, base_url="http://docker", timeout=timeout_s)
        elif host.startswith(("http://", "https://")):
            self._client = httpx.Client(base_url=host.rstrip("/"), timeout=timeout_s)
        else:
            raise ValueError(
                f"node_docker_host: {host!r} must be unix:///path/to/docker.sock or http://host:port "
                "(default unix:///var/run/docker.sock)"
            )
        self._path = f"/containers/{quote(self.container, safe='')}"

    def close(self) -> None:
        self._client.close()

    def inspect(self) -> ContainerState:
        return self._state(self._json("GET", f"{self._path}/json", "inspect"))

    def _state(self, body: Mapping[str, Any], *, strict: bool = False) -> ContainerState:
        """The state an inspect body tells; a malformed tune label is read as absent unless ``strict`` (a
        reconfigure), so a restart or a tail never fails on it."""
        state = body.get("State") or {}
        config = body.get("Config") or {}
        labels = config.get("Labels") or {}
        try:
            started = parse_docker_time(str(state.get("StartedAt") or ""))
        except ValueError as exc:
            raise TransientError(f"docker inspect {self.container}: {exc}") from None
        pid = state.get("Pid")
        command = tuple(str(word) for word in config.get("Cmd") or ())
        planned = self._label_json(labels, PLANNED_CMD_LABEL, list, strict)
        overrides = self._label_json(labels, OVERRIDES_LABEL, dict, strict)
        try:
            overrides = check_overrides(overrides, OVERRIDES_LABEL) if overrides is not None else {}
        except InvalidMessage:
            if strict:
                raise
            overrides = {}
        return ContainerState(
            name=self.container,
            status=str(state.get("Status") or "unknown"),
            started_at=started,
            pid=int(pid) if isinstance(pid, int) and pid > 0 else None,
            image=str(config["Image"]) if config.get("Image") else None,
            command=command,
            planned_command=tuple(planned) if planned is not None else command,
            overrides=overrides,
        )

    def _label_json(self, labels: Mapping[str, Any], name: str, kind: type, strict: bool) -> Any:
        if name not in labels:
            return None
        try:
            value: Any = json.loads(str(labels[name]))
        except ValueError:
            value = None
        if not isinstance(value, kind) or (isinstance(value, list) and not all(isinstance(w, str) for w in value)):
            if not strict:
                return None
            raise PermanentError(
                f"docker inspect {self.container}: the label {name} is not a JSON {kind.__name__}; recreate the "
                "container from the startup script (sudo google_metadata_script_runner startup)"
            )
        return value

    def reconfigure(self, overrides: Mapping[str, Any], timeout_s: float) -> ContainerState:
        if not 0 <= timeout_s <= 3600:
            raise ValueError(f"timeout_s: {timeout_s!r} must be 0-3600 seconds")
        wanted = check_overrides(overrides)
        body = self._json("GET", f"{self._path}/json", "inspect")
        current = self._state(body, strict=True)
        planned = list(current.planned_command)
        command = apply_to_argv(planned, wanted) if wanted else planned
        if current.status == "running" and command == list(current.command) and dict(current.overrides) == wanted:
            return current
        config = {key: value for key, value in (body.get("Config") or {}).items() if key != "Hostname"}
        labels = {
            key: value
            for key, value in (config.get("Labels") or {}).items()
            if key not in (PLANNED_CMD_LABEL, OVERRIDES_LABEL)
        }
        if wanted:
            labels[PLANNED_CMD_LABEL] = json.dumps(planned)
            labels[OVERRIDES_LABEL] = json.dumps(wanted, sort_keys=True)
        before = {**config, "HostConfig": body.get("HostConfig") or {}}
        wait = int(timeout_s)
        self._request(
            "POST", f"{self._path}/stop", "stop", params={"t": str(wait)}, timeout=self.timeout_s + wait, ok=(304,)
        )
        self._request("DELETE", self._path, "remove", params={"force": "1"})
        try:
            self._create({**before, "Cmd": command, "Labels": labels})
        except ControllerError:
            self._create(before)  # what ran before, so a refused config never leaves the node without its engine
            self._request("POST", f"{self._path}/start", "start", timeout=self.timeout_s + _START_ALLOWANCE_S)
            raise
        self._request("POST", f"{self._path}/start", "start", timeout=self.timeout_s + _START_ALLOWANCE_S)
        return self.inspect()

    def _create(self, config: Mapping[str, Any]) -> None:
        self._request("POST", "/containers/create", "create", params={"name": self.container}, body=config)

    def restart(self, timeout_s: float) -> ContainerState:
        if not 0 <= timeout_s <= 3600:
            raise ValueError(f"timeout_s: {timeout_s!r} must be 0-3600 seconds")
        wait = int(timeout_s)
        self._request(
            "POST",
            f"{self._path}/restart",
            "restart",
            params={"t": str(wait)},
            timeout=self.timeout_s + wait + _START_ALLOWANCE_S,
        )
        return self.inspect()

    def tail(self, lines: int) -> list[str]:
        if not 1 <= lines <= _MAX_TAIL:
            raise ValueError(f"lines: {lines!r} must be 1-{_MAX_TAIL}")
        params = {"stdout": "1", "stderr": "1", "tail": str(lines), "timestamps": "1"}
        out: list[str] = []
        with self._call("logs"), self._client.stream("GET", f"{self._path}/logs", params=params) as response:
            if response.status_code != 200:
                response.read()
                self._raise_for(response, "logs")
            decoder = LogStreamDecoder(response.headers.get("content-type", ""))
            for chunk in response.iter_bytes():
                out.extend(line.decode("utf-8", "replace") for _, line in decoder.feed(chunk))
            out.extend(line.decode("utf-8", "replace") for _, line in decoder.close())
        return out[-lines:]

    def read_since(self, since_ns: int, *, max_lines: int) -> list[ContainerLogLine]:
        """Lines stamped at or after ``since_ns``, oldest first; stops reading after ``max_lines`` of them.

        The API takes whole seconds, so the lines of ``since_ns``'s second before it are skipped here. A line
        without a stamp (none should lack one) takes the time of the line before it.
        """
        if max_lines < 1:
            raise ValueError(f"max_lines: {max_lines!r} must be at least 1")
        params = {"stdout": "1", "stderr": "1", "timestamps": "1", "since": str(max(0, since_ns) // 1_000_000_000)}
        taken = _Taken(since_ns, max_lines)
        with self._call("logs"), self._client.stream("GET", f"{self._path}/logs", params=params) as response:
            if response.status_code != 200:
                response.read()
                self._raise_for(response, "logs")
            decoder = LogStreamDecoder(response.headers.get("content-type", ""))
            for chunk in response.iter_bytes():
                if taken.add(decoder.feed(chunk)):
                    return taken.lines  # closing the response ends the read: the rest stays in the engine
            taken.add(decoder.close())
        return taken.lines

    # ------------------------------------------------------------------ plumbing

    def _json(self, method: str, path: str, action: str) -> dict[str, Any]:
        response = self._request(method, path, action)
        try:
            body = response.json()
        except ValueError:
            raise TransientError(f"docker {action} {self.container}: the engine answered with non-JSON") from None
        if not isinstance(body, dict):
            raise TransientError(f"docker {action} {self.container}: the engine answered with a {type(body).__name__}")
        return body

    def _request(
        self,
        method: str,
        path: str,
        action: str,
        *,
        params: dict[str, str] | None = None,
        timeout: float | None = None,
        body: Mapping[str, Any] | None = None,
        ok: tuple[int, ...] = (),
    ) -> httpx.Response:
        with self._call(action):
            response = self._client.request(
                method,
                path,
                params=params,
                json=dict(body) if body is not None else None,
                timeout=timeout if timeout is not None else self.timeout_s,
            )
        if response.status_code >= 300 and response.status_code not in ok:
            self._raise_for(response, action)
        return response

    def _call(self, action: str) -> _EngineCall:
        if self._socket_path is not None and not self._socket_path.exists():
            # checked before connecting: httpcore leaves the socket of a failed unix connect unclosed
            raise self._describe_connect_error(httpx.ConnectError("no such file"))
        return _EngineCall(self, action)

    def _raise_for(self, response: httpx.Response, action: str) -> None:
        try:
            message = str(response.json().get("message", ""))
        except (ValueError, AttributeError):
            message = response.text[:300]
        code = response.status_code
        text = f"docker {action} {self.container}: HTTP {code}: {message or response.reason_phrase}"
        if code == 404 and action != "create":  # create's 404 is a missing image
            raise PermanentError(
                f"node_container: no container named {self.container!r} on this node ({message or 'not found'}); "
                "check TPUCTL_NODE_CONTAINER against the startup script's container name"
            )
        if code in (408, 429) or code >= 500:
            raise TransientError(text)
        if code == 409:
            raise TransientError(text + " (the container is busy; try again)")
        raise PermanentError(text)

    def _describe_connect_error(self, exc: httpx.TransportError) -> Exception:
        if self._socket_path is not None:
            if not self._socket_path.exists():
                return PermanentError(
                    f"node_docker_host: no Docker Engine socket at {self._socket_path} (mount it into the node agent "
                    f"with -v {self._socket_path}:{self._socket_path}, or set TPUCTL_NODE_DOCKER_HOST)"
                )
            if isinstance(exc.__cause__, PermissionError) or "Permission denied" in str(exc):
                return PermanentError(
                    f"node_docker_host: no permission to use {self._socket_path} (run the agent as root or in the "
                    "docker group)"
                )
        return TransientError(f"docker engine at {self.host}: {type(exc).__name__}: {exc or 'unreachable'}")


class _Taken:
    """The stamped lines kept by :meth:`DockerEngineContainer.read_since`; ``add`` says when enough were kept."""

    def __init__(self, since_ns: int, max_lines: int) -> None:
        self.since_ns, self.max_lines = since_ns, max_lines
        self.lines: list[ContainerLogLine] = []
        self._last = 0

    def add(self, pairs: list[tuple[int, bytes]]) -> bool:
        for _, raw in pairs:
            stamp, text = split_stamp(raw)
            self._last = stamp if stamp is not None else self._last
            if self._last >= self.since_ns:
                self.lines.append(ContainerLogLine(self._last, text.decode("utf-8", "replace")))
            if len(self.lines) >= self.max_lines:
                return True
        return False


class _EngineCall:
    """Turns httpx's transport errors into classified errors, naming the call."""

    def __init__(self, owner: DockerEngineContainer, action: str) -> None:
        self._owner = owner
        self._action = action

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, _tb: object) -> None:
        if isinstance(exc, httpx.TimeoutException):
            raise TransientError(
                f"docker {self._action} {self._owner.container}: the engine did not answer in time"
            ) from None
        if isinstance(exc, httpx.TransportError):
            raise self._owner._describe_connect_error(exc) from None

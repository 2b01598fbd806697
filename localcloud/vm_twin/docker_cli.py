"""The VM twin's ``docker`` command: the CLI subset the startup script uses, over the Engine API socket.

Why: the startup script calls ``docker pull``, ``run`` (attached with ``--rm``, or ``-d``), ``inspect --format``,
``rm -f``, ``restart`` and ``logs``. Inside the VM twin this command stands in for the docker CLI and speaks the
same Engine API calls the real CLI makes (``/images/create``, ``/containers/create``, ``start``, ``wait``,
``logs``, ``json``, ``DELETE``) to ``DOCKER_HOST`` (default ``unix:///var/run/docker.sock``). Exit codes follow
the CLI: 125 for a daemon error, the container's status for an attached ``run``, 1 for ``inspect`` of nothing.
Only the standard library is used, so it starts fast under any Python.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import struct
import sys
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, urlencode

__all__ = ["inspect", "main", "parse_run", "render_format"]

_VALUE_FLAGS = {
    "--name": "name",
    "--label": "label",
    "-l": "label",
    "--net": "network",
    "--network": "network",
    "--restart": "restart",
    "--shm-size": "shm_size",
    "-v": "volume",
    "--volume": "volume",
    "-e": "env",
    "--env": "env",
    "--entrypoint": "entrypoint",
    "--device": "device",
    "--ulimit": "ulimit",
    "--cap-drop": "cap_drop",
    "--cap-add": "cap_add",
    "--pid": "pid_mode",
}
_BOOL_FLAGS = {"-d": "detach", "--detach": "detach", "--rm": "rm", "--privileged": "privileged", "-q": "quiet"}
_TEMPLATE = re.compile(r"\{\{\s*(.*?)\s*\}\}")


class DockerError(Exception):
    def __init__(self, message: str, code: int = 125) -> None:
        super().__init__(message)
        self.code = code


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=None)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self._path)


def inspect(socket_path: str, name: str) -> dict[str, Any] | None:
    """``GET /containers/{name}/json`` on an Engine API socket; None when there is no such container or socket."""
    try:
        status, data = _call("GET", f"/containers/{quote(name)}/json", host=f"unix://{socket_path}")
    except DockerError:
        return None
    return json.loads(data) if status == 200 else None


def _call(method: str, path: str, body: Any = None, host: str | None = None) -> tuple[int, bytes]:
    host = host or os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not host.startswith("unix://"):
        raise DockerError(f"DOCKER_HOST: {host!r} is not a unix:// socket")
    connection = _UnixConnection(host.removeprefix("unix://"))
    try:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        connection.request(method, "/v1.41" + path, body=data, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    except OSError as exc:
        raise DockerError(
            f"Cannot connect to the Docker daemon at {host}. Is the docker daemon running? ({exc})"
        ) from None
    finally:
        connection.close()


def _checked(method: str, path: str, body: Any = None) -> bytes:
    status, data = _call(method, path, body)
    if status >= 400:
        try:
            message = json.loads(data).get("message", "")
        except ValueError:
            message = data.decode(errors="replace")
        raise DockerError(f"Error response from daemon: {message}", 1 if status == 404 and method == "GET" else 125)
    return data


def parse_run(args: Sequence[str]) -> tuple[dict[str, Any], str, list[str]]:
    """``docker run`` flags, the image, and the command after it."""
    options: dict[str, Any] = {
        "label": [],
        "volume": [],
        "env": [],
        "device": [],
        "ulimit": [],
        "cap_drop": [],
        "cap_add": [],
    }
    index = 0
    while index < len(args):
        word = args[index]
        if not word.startswith("-"):
            return options, word, list(args[index + 1 :])
        flag, eq, inline = word.partition("=")
        if flag in _BOOL_FLAGS and not eq:
            options[_BOOL_FLAGS[flag]] = True
        elif flag in _VALUE_FLAGS:
            if not eq:
                index += 1
                if index >= len(args):
                    raise DockerError(f"flag needs an argument: {flag}")
                inline = args[index]
            key = _VALUE_FLAGS[flag]
            if isinstance(options.get(key), list):
                options[key].append(inline)
            else:
                options[key] = inline
        else:
            raise DockerError(f"unknown flag: {flag} (the VM twin's docker knows only what the startup script uses)")
        index += 1
    raise DockerError('"docker run" requires at least 1 argument')


def _run(args: Sequence[str]) -> int:
    options, image, command = parse_run(args)
    network = options.get("network", "host")
    if network not in ("host", "none"):
        raise DockerError(f"--net={network}: the VM twin's containers use the VM's network (host) or none")
    entrypoint = [options["entrypoint"]] if options.get("entrypoint") else []
    body = {
        "Image": image,
        "Entrypoint": entrypoint or None,
        "Cmd": command,
        "Env": options["env"],
        "Labels": dict(label.partition("=")[::2] for label in options["label"]),
        "HostConfig": {
            "Binds": options["volume"],
            "NetworkMode": network,
            "Privileged": bool(options.get("privileged")),
            "Devices": [_device(device) for device in options["device"]],
            "Ulimits": [_ulimit(limit) for limit in options["ulimit"]],
            "CapDrop": options["cap_drop"],
            "CapAdd": options["cap_add"],
            "PidMode": options.get("pid_mode", ""),
            "ShmSize": _size(options["shm_size"]) if options.get("shm_size") else 0,
            # An attached --rm run is removed by this command once its output is shown (as the CLI's attach
            # streams it before the engine removes the container); a detached one by the engine.
            "AutoRemove": bool(options.get("rm")) and bool(options.get("detach")),
            "RestartPolicy": {"Name": options.get("restart", "no")},
        },
    }
    name = options.get("name")
    query = "?" + urlencode({"name": name}) if name else ""
    created = json.loads(_checked("POST", "/containers/create" + query, body))
    ident = created["Id"]
    _checked("POST", f"/containers/{ident}/start")
    if options.get("detach"):
        print(ident)
        return 0
    status = json.loads(_checked("POST", f"/containers/{ident}/wait"))["StatusCode"]
    _print_logs(ident, "all")
    if options.get("rm"):
        _call("DELETE", f"/containers/{ident}?force=1")
    return int(status)


def _device(flag: str) -> dict[str, str]:
    """``--device HOST[:CONTAINER[:PERMISSIONS]]`` as the Engine API's ``HostConfig.Devices`` entry."""
    parts = flag.split(":")
    return {
        "PathOnHost": parts[0],
        "PathInContainer": parts[1] if len(parts) > 1 and parts[1] else parts[0],
        "CgroupPermissions": parts[2] if len(parts) > 2 else "rwm",
    }


def _size(flag: str) -> int:
    """``--shm-size 16g`` in bytes (the CLI's binary units: b, k, m, g)."""
    match = re.fullmatch(r"(\d+)([bkmg]?)b?", flag.strip().lower())
    if match is None:
        raise DockerError(f'invalid argument {flag!r} for "--shm-size" flag')
    return int(match.group(1)) * 1024 ** "bkmg".index(match.group(2) or "b")


def _ulimit(flag: str) -> dict[str, Any]:
    """``--ulimit NAME=SOFT[:HARD]`` as a ``HostConfig.Ulimits`` entry."""
    name, _, values = flag.partition("=")
    soft, _, hard = values.partition(":")
    try:
        return {"Name": name, "Soft": int(soft), "Hard": int(hard or soft)}
    except ValueError:
        raise DockerError(f'invalid argument {flag!r} for "--ulimit" flag') from None


def _print_logs(name: str, tail: str) -> None:
    status, data = _call("GET", f"/containers/{quote(name)}/logs?stdout=1&stderr=1&tail={tail}")
    if status >= 400:
        return
    header = struct.Struct(">BxxxL")
    offset = 0
    while offset + header.size <= len(data):
        stream, size = header.unpack_from(data, offset)
        offset += header.size
        target = sys.stderr if stream == 2 else sys.stdout
        target.write(data[offset : offset + size].decode(errors="replace"))
        offset += size
    sys.stdout.flush()
    sys.stderr.flush()


def render_format(template: str, document: dict[str, Any]) -> str:
    """The Go-template subset the script uses: ``{{.A.B}}`` and ``{{ index .A.B "key" }}``."""

    def lookup(path: str) -> Any:
        value: Any = document
        for part in path.strip(".").split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return value

    def evaluate(match: re.Match[str]) -> str:
        expression = match.group(1)
        indexed = re.fullmatch(r'index\s+(\.[\w.]+)\s+"([^"]*)"', expression)
        if indexed:
            found = lookup(indexed.group(1))
            value = found.get(indexed.group(2)) if isinstance(found, dict) else None
        elif re.fullmatch(r"\.[\w.]+", expression):
            value = lookup(expression)
        else:
            raise DockerError(f"template: {expression!r} is not supported by the VM twin's docker", 1)
        if value is None:
            return "<no value>"
        return str(value).lower() if isinstance(value, bool) else str(value)

    return _TEMPLATE.sub(evaluate, template)


def _inspect(args: Sequence[str]) -> int:
    template, names = None, []
    index = 0
    while index < len(args):
        word = args[index]
        if word in ("--format", "-f"):
            template, index = args[index + 1], index + 2
            continue
        if word.startswith("--format="):
            template = word.partition("=")[2]
        else:
            names.append(word)
        index += 1
    for name in names:
        status, data = _call("GET", f"/containers/{quote(name)}/json")
        if status == 404:
            print(f"Error: No such object: {name}", file=sys.stderr)
            return 1
        document = json.loads(data)
        print(render_format(template, document) if template else json.dumps([document], indent=4))
    return 0


def _simple(command: str, args: Sequence[str]) -> int:
    flags = [word for word in args if word.startswith("-")]
    names = [word for word in args if not word.startswith("-")]
    if command == "pull":
        reference = names[0]
        repository, _, tag = reference.rpartition(":") if ":" in reference.split("/")[-1] else (reference, "", "")
        _checked("POST", "/images/create?" + urlencode({"fromImage": repository or reference, "tag": tag}))
        if "-q" not in flags:
            print(f"Status: Image is up to date for {reference}")
        return 0
    if command == "rm":
        force = any(flag in ("-f", "--force") for flag in flags)
        for name in names:
            _checked("DELETE", f"/containers/{quote(name)}" + ("?force=1" if force else ""))
            print(name)
        return 0
    if command == "restart":
        seconds = next((args[i + 1] for i, word in enumerate(args) if word in ("-t", "--time")), "10")
        for name in [word for word in names if word != seconds]:
            _checked("POST", f"/containers/{quote(name)}/restart?t={seconds}")
            print(name)
        return 0
    if command == "logs":
        tail = next((args[i + 1] for i, word in enumerate(args) if word in ("--tail", "-n")), "all")
        _print_logs(next(word for word in names if word != tail), tail)
        return 0
    raise DockerError(f"docker: '{command}' is not a docker command the VM twin knows", 1)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: docker COMMAND", file=sys.stderr)
        return 1
    command, rest = args[0], args[1:]
    try:
        if command == "run":
            return _run(rest)
        if command == "inspect":
            return _inspect(rest)
        return _simple(command, rest)
    except DockerError as exc:
        print(f"docker: {exc}", file=sys.stderr)
        return exc.code


if __name__ == "__main__":
    sys.exit(main())

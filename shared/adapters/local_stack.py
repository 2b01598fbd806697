"""Where a running local stack (``make up``) says how to reach it, and what a client does when none runs.

``make up`` writes one small JSON file, ``<root>/localcloud/current.json`` (``root`` is the repository's ``var``),
atomically, once the stack serves, and removes it when it stops. It holds the ``TPUCTL_*`` variables a client
needs (the run's data folder, the simulator's endpoint, ``TPUCTL_CLOCK=simulator``, the project, the scaled
limits, and the emulator hosts when there are any) and the pid of the process that wrote it, so a file left by
a killed run reads as no stack at all.

A gateway or CLI configured with ``--backend local --data-dir var`` (the shipped ``mcp_config.json``) reads the
file under its data folder and takes those settings (:func:`attach`). With no stack up, the TPU API and the
Cloud Quotas API have no endpoint to reach, and :class:`NoLocalStack` stands in for both: every call fails with
a ``failed_precondition`` that says to start the stack, instead of a Google credentials error.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.config import Settings
from shared.domain.errors import CloudError, ErrorClass

__all__ = [
    "NO_LOCAL_STACK",
    "NoLocalStack",
    "StackConnection",
    "attach",
    "connection_path",
    "needs_local_stack",
    "publish",
    "read_connection",
    "withdraw",
]

NO_LOCAL_STACK = "no local stack is running: start it with `make up`"
_FORMAT = 1
# Settings a client keeps as it configured them (how it logs and reaches vLLM are the client's own choice).
_CLIENT_OWN = frozenset({"TPUCTL_LOG_LEVEL", "TPUCTL_ENDPOINT_ACCESS"})


def connection_path(root: Path | str) -> Path:
    """The connection file of the stack serving under ``root`` (``var`` for ``make up``)."""
    return Path(root) / "localcloud" / "current.json"


@dataclass(frozen=True)
class StackConnection:
    """What ``make up`` published: the variables that point a client at it, and who published them."""

    pid: int
    env: Mapping[str, str]
    started_at: str

    @property
    def data_dir(self) -> Path:
        return Path(self.env["TPUCTL_DATA_DIR"])

    @property
    def tpu_endpoint(self) -> str:
        return self.env["TPUCTL_TPU_ENDPOINT"]


def publish(path: Path, env: Mapping[str, str], *, pid: int, started_at: str) -> None:
    """Write the connection file atomically (a reader sees the old file, no file, or the whole new one)."""
    if "TPUCTL_DATA_DIR" not in env or "TPUCTL_TPU_ENDPOINT" not in env:
        raise ValueError("a stack connection needs TPUCTL_DATA_DIR and TPUCTL_TPU_ENDPOINT")
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"format": _FORMAT, "pid": pid, "started_at": started_at, "env": dict(env)}
    handle, temporary = tempfile.mkstemp(prefix=".current-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            json.dump(body, stream, indent=2, sort_keys=True)
            stream.write("\n")
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def withdraw(path: Path, *, pid: int) -> bool:
    """Remove the connection file if ``pid`` published it (a newer stack's file stays); True if removed."""
    current = _load(path)
    if current is None or current.pid != pid:
        return False
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return True


def read_connection(path: Path) -> StackConnection | None:
    """The published connection, or None when there is none, it is unreadable, or its stack is gone."""
    connection = _load(path)
    if connection is None or not _alive(connection.pid):
        return None
    return connection


def _load(path: Path) -> StackConnection | None:
    try:
        body: Any = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(body, dict) or body.get("format") != _FORMAT:
        return None
    env, pid = body.get("env"), body.get("pid")
    if not isinstance(env, dict) or not isinstance(pid, int) or pid <= 0:
        return None
    if not all(isinstance(key, str) and isinstance(value, str) for key, value in env.items()):
        return None
    if "TPUCTL_DATA_DIR" not in env or "TPUCTL_TPU_ENDPOINT" not in env:
        return None
    return StackConnection(pid=pid, env=env, started_at=str(body.get("started_at", "")))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, someone else's
    return True


def attach(settings: Settings) -> Settings:
    """``settings`` pointed at the stack published under its data folder, if one serves there; else unchanged.

    Only a ``local`` backend with no TPU endpoint of its own attaches: a client given explicit variables (the
    ones ``make up`` prints) keeps them. Emulator hosts (``FIRESTORE_EMULATOR_HOST``, ...) are set in this
    process's environment unless already set, since the Google clients read them from there.
    """
    if settings.backend != "local" or settings.tpu_endpoint:
        return settings
    connection = read_connection(connection_path(settings.data_dir))
    if connection is None:
        return settings
    fields = {
        name.removeprefix("TPUCTL_").lower(): value
        for name, value in connection.env.items()
        if name.startswith("TPUCTL_") and name not in _CLIENT_OWN
    }
    for name, value in connection.env.items():
        if not name.startswith("TPUCTL_"):
            os.environ.setdefault(name, value)
    return Settings(**{**settings.model_dump(), **fields})


def needs_local_stack(settings: Settings) -> bool:
    """True when the TPU and quota reads would have nowhere to go: a local backend with no endpoint or project."""
    return settings.backend == "local" and not settings.tpu_endpoint and not settings.project


class NoLocalStack:
    """The TPU API, the Cloud Quotas API and calendar advice when no local stack runs: every call says to start one."""

    def _refuse(self) -> CloudError:
        return CloudError(ErrorClass.FAILED_PRECONDITION, NO_LOCAL_STACK)

    def create(self, request: object) -> Any:
        raise self._refuse()

    def get_operation(self, name: str) -> Any:
        raise self._refuse()

    def get(self, zone: str, resource_id: str) -> Any:
        raise self._refuse()

    def list(self, zone: str = "-") -> Any:
        raise self._refuse()

    def delete(self, *args: object, **kwargs: object) -> Any:
        raise self._refuse()

    def stop_node(self, zone: str, node_id: str) -> Any:
        raise self._refuse()

    def start_node(self, zone: str, node_id: str) -> Any:
        raise self._refuse()

    def guest_attributes(self, zone: str, node_id: str, query_path: str) -> Sequence[Any]:
        raise self._refuse()

    def list_limits(self, service: str = "") -> Any:
        raise self._refuse()

    def earliest_window(self, *args: object, **kwargs: object) -> Any:
        raise self._refuse()

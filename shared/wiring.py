"""Build the ports from settings, lazily: SDK clients are created on first use, once per process.

``TPUCTL_BACKEND=local`` (the default) gives the embedded stack under ``TPUCTL_DATA_DIR``: SQLite
store and bus, file secrets, the local scheduler, and the TPU adapter pointed at the simulator
(``TPUCTL_TPU_ENDPOINT``). ``TPUCTL_BACKEND=gcp`` gives Firestore, Pub/Sub, Secret Manager, Cloud
Scheduler and the Cloud TPU API.
"""

from __future__ import annotations

from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

from shared.config import Settings, get_settings
from shared.ports import Clock, CommandBus, SchedulerApi, SecretStore, StateStore, TpuApi

__all__ = ["LOCAL_PROJECT", "Runtime", "runtime"]

LOCAL_PROJECT = "tpuctl-local"


class Runtime:
    """The process's ports, each built on first use."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @property
    def _data(self) -> Path:
        path = Path(self.settings.data_dir)
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def project(self) -> str:
        return self.settings.project or LOCAL_PROJECT

    @cached_property
    def clock(self) -> Clock:
        from shared.adapters.clock import SystemClock

        return SystemClock()

    @cached_property
    def store(self) -> StateStore:
        if self.settings.backend == "gcp":
            from google.cloud import firestore

            from shared.adapters.firestore_store import FirestoreStateStore

            client = firestore.Client(project=self.project, database=self.settings.firestore_database)
            return FirestoreStateStore(client)
        from shared.adapters.sqlite_store import SqliteStateStore

        return SqliteStateStore(self._data / "state.sqlite")

    @cached_property
    def bus(self) -> CommandBus:
        if self.settings.backend == "gcp":
            from shared.adapters.pubsub_bus import PubSubBus

            return PubSubBus(self.project)
        from shared.adapters.local_bus import LocalBus

        return LocalBus(self._data / "bus.sqlite")

    @cached_property
    def secrets(self) -> SecretStore:
        if self.settings.backend == "gcp":
            from shared.adapters.secret_manager import SecretManagerStore

            return SecretManagerStore(self.project)
        from shared.adapters.file_secrets import FileSecretStore

        return FileSecretStore(self._data / "secrets")

    @cached_property
    def tpu(self) -> TpuApi:
        from shared.adapters.gcp_tpu import GcpTpuApi

        return GcpTpuApi(self.project, endpoint=self.settings.tpu_endpoint)

    @cached_property
    def scheduler(self) -> SchedulerApi:
        if self.settings.backend == "gcp":
            from shared.adapters.cloud_scheduler import CloudSchedulerApi

            return CloudSchedulerApi(self.project, self.settings.region)
        from shared.adapters.local_scheduler import LocalScheduler

        return LocalScheduler(self._data / "scheduler.sqlite")

    def topic(self, logical: str) -> str:
        """Map a logical topic (commands, ticks, events, node-tasks) to its configured name."""
        names: dict[str, Any] = {
            "commands": self.settings.topic_commands,
            "ticks": self.settings.topic_ticks,
            "events": self.settings.topic_events,
            "node-tasks": self.settings.topic_node_tasks,
        }
        return str(names[logical])


@lru_cache(maxsize=1)
def runtime() -> Runtime:
    """The process-wide runtime (one per function instance)."""
    return Runtime(get_settings())

"""The local cloud: the whole controller on one machine, with no Google Cloud account.

What runs, and what it stands in for:

=====================================  =============================================================
here                                   on Google Cloud
=====================================  =============================================================
``tpu_sim`` World + SimServer          the Cloud TPU API (real REST wire format, virtual time)
3 functions-framework HTTP servers     the ``provision``, ``monitor``, ``benchmark`` Cloud Functions
LocalBus + push dispatchers            Pub/Sub topics and push subscriptions (filters, dead letters)
SQLite store, 0600 file secrets        Firestore, Secret Manager
the ticker (LocalScheduler.run_due)    Cloud Scheduler
the node runtime                       the TPU VM: vLLM (real, on CPU) and the node agent
=====================================  =============================================================

The functions are the production entry points, unchanged, started as subprocesses on loopback ports; each
subscription's dispatcher POSTs every delivery as a Pub/Sub push body to ``/projects/P/topics/T``, which
functions-framework turns into the same CloudEvent Cloud Run delivers; a non-2xx answer is a nack (the bus
redelivers with backoff, then dead-letters). Routes and filters are the routing table's
(``shared/messages/routing.py``), the same Terraform reads from ``terraform/envs/default/routes.json``.

Time: the scenario runs at ``time_scale`` virtual seconds per wall second (60 by default: a 40-minute capacity
wait takes 40 s, a one-minute Scheduler tick fires every second). Every process follows the simulator's clock
(``TPUCTL_CLOCK=simulator``), so ledgers, leases, cooldowns, bus timestamps and bills agree. Limits that guard
wall-clock things (lease expiry after a crash, the age at which a command is stale, the bus's ack deadline and
backoff) are scaled so they keep their wall-clock meaning.

Shutdown (``stop()``, Ctrl-C or SIGTERM) stops the ticker, dispatchers, node processes and functions, each by
process group, then checks that no process it started survives.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from localcloud.emulators import EMULATORS, Emulator, find_emulator, start_emulator
from localcloud.monitoring_api import MonitoringStandIn
from localcloud.options import LocalCloudOptions
from localcloud.process_groups import ReapedGroup, reap_orphans, spawn_group
from localcloud.scheduler_fake import SchedulerFake
from localcloud.tpu_sim import SimServer, World, load_scenario
from localcloud.vllm_cpu import REPO_ROOT, VllmCpuTier, free_loopback_port, stop_group
from localcloud.vm_twin.agent_bundle import PublishedBundle, publish_node_agent
from localcloud.vm_twin.google_apis import GoogleApis
from localcloud.vm_twin.image_vllm import TWIN_COMPILE
from localcloud.vm_twin.metadata_server import TokenIssuer
from localcloud.vm_twin.vm import VmFleet, builder_service_account, unshare_available
from shared.adapters.file_secrets import FileSecretStore
from shared.adapters.local_bus import LocalBus
from shared.adapters.local_scheduler import LocalScheduler
from shared.adapters.sqlite_store import SqliteStateStore
from shared.config import Settings
from shared.domain.compile_cache import COMPILE_PREFIX
from shared.domain.weights_cache import regions_of
from shared.logging import JsonFormatter, RedactingFilter, register_secret
from shared.messages.routing import FUNCTION_TRIGGERS, push_routes, subscription_filter
from shared.ports import CommandBus, Delivery, SchedulerApi, SchedulerJob, StateStore
from shared.wiring import Runtime

__all__ = ["FUNCTIONS", "ROUTES", "LocalCloud", "LocalCloudOptions", "Route", "StopReport"]

log = logging.getLogger("tpuctl.localcloud")

FUNCTIONS = tuple(FUNCTION_TRIGGERS)  # provision, monitor, benchmark
TICKS_FILE = REPO_ROOT / "terraform" / "envs" / "default" / "ticks.json"
# Scheduler jobs of ticks.json, as tick_schedules in Terraform; the provisioner owns the reconcile job itself.
RUNNER_JOBS = {"monitor": "* * * * *", "janitor": "*/15 * * * *"}
NAME_PREFIX = "tpuctl"
DEBUG_BUNDLE_BUCKET = f"{NAME_PREFIX}-debug-bundles"  # as Terraform's, in the Storage stand-in
MAX_DELIVERY_ATTEMPTS = 5
_SCALED_LIMITS: tuple[str, ...] = ("lease_ttl_s", "max_event_age_s", "command_claim_s", "node_task_timeout_s")
_SCALED_LIMITS += ("monitor_telemetry_max_age_s",)  # _scaled_limits: wall-clock lengths in virtual time
_FUNCTION_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "TZ")
_TWIN_SETTINGS: tuple[str, ...] = ("secretmanager_endpoint", "scheduler_endpoint", "logging_endpoint")
_TWIN_SETTINGS += ("storage_endpoint", "debug_bundle_bucket", "monitoring_endpoint")  # stand-ins, bundle bucket
_TWIN_SETTINGS += ("weights_cache_buckets",)


@dataclass(frozen=True)
class Route:
    """One push subscription: ``function`` receives ``topic`` (a logical topic) through ``filter``."""

    function: str
    trigger: str
    topic: str
    filter: str | None

    @property
    def subscription(self) -> str:
        return f"{NAME_PREFIX}-{self.function}-{self.trigger.replace('_', '-')}"


# Routing: Terraform's push subscriptions and routes.json filters, both from shared/messages/routing.py.
ROUTES: tuple[Route, ...] = tuple(
    Route(route.function, route.trigger, route.topic, route.filter) for route in push_routes()
)
BENCHMARK_COMMAND_FILTER = subscription_filter("benchmark", "commands")
"""Benchmark commands and node tasks (the benchmark function dispatches both to the node agent)."""


@dataclass
class FunctionProcess:
    """One function under functions-framework on a loopback port."""

    name: str
    port: int
    log_path: Path
    process: subprocess.Popen[bytes] = field(repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid


@dataclass(frozen=True)
class StopReport:
    """What ``stop()`` found: process groups still alive after the stop (must be empty)."""

    survivors: tuple[int, ...]
    stopped_groups: int
    wall_s: float


class PushRejected(RuntimeError):
    """The function answered a push with a non-2xx status: a nack, as Pub/Sub push treats it."""


class LocalCloud:
    """Start with ``start()`` (or ``with LocalCloud(options) as cloud:``); ``stop()`` leaves nothing running."""

    def __init__(self, options: LocalCloudOptions) -> None:
        self.options = options
        self.data_dir = options.data_dir.resolve()
        self.log_dir = self.data_dir / "logs"
        self.tier = VllmCpuTier(options.cache_dir)
        scenario = load_scenario(options.scenario)
        # Virtual time starts at the wall clock, so a client on the system clock is never "in the future".
        start = datetime.now(UTC).replace(microsecond=0)
        self.scenario = scenario.model_copy(update={"start_time": start})
        self.world = World(self.scenario, time_scale=options.time_scale, seed=options.seed)
        self.sim = SimServer(self.world, port=options.sim_port)
        self.functions: dict[str, FunctionProcess] = {}
        self.fleet: VmFleet | None = None  # the TPU VMs: every READY node boots from its startup script
        self.no_boot_reason: str | None = None if options.boot_nodes else "--no-vllm"
        self.delivery_failures: list[str] = []
        self.duplicate_active_seen: list[dict[str, Any]] = []
        self._stop_event = threading.Event()
        self._threads: list[threading.Thread] = []
        self._started = False
        self._stopped: StopReport | None = None
        self.reaped_at_start: list[ReapedGroup] = []  # groups a killed earlier run left behind, stopped by start()
        self._settings: Settings | None = None
        self._bus: CommandBus | None = None
        self._store: StateStore | None = None
        self._runtime: Runtime | None = None
        self.emulators: list[Emulator] = []
        self._saved_environ: dict[str, str | None] = {}
        self._log_handler: logging.Handler | None = None
        self._clients: list[httpx.Client] = []
        self._scheduler: SchedulerApi | None = None
        self._secrets = FileSecretStore(self.data_dir / "secrets")
        # What a TPU VM reaches besides the controller: its metadata server's tokens, Secret Manager, Storage.
        self.tokens = TokenIssuer()
        self.builder_account = builder_service_account(self.scenario.project)  # alone writes compile/, as in Terraform
        self.google_apis = GoogleApis(
            self.scenario.project, self._secrets, self.data_dir / "storage", self.tokens,
            prefix_writers={COMPILE_PREFIX: {self.builder_account}},
        )  # fmt: skip
        # The production-path twin's controller side: Secret Manager (anonymous, as the emulators) and Scheduler.
        self.controller_apis = GoogleApis(
            self.scenario.project, self._secrets, self.data_dir / "storage", self.tokens, require_token=False
        )
        self.scheduler_api = SchedulerFake()
        self.monitoring_api = MonitoringStandIn(self.scenario.project)  # the monitor's custom-metric writes
        self._scheduler_url: str | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> LocalCloud:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> LocalCloud:
        """Simulator, store, bus, secrets, scheduler jobs, functions, dispatchers, ticker, node runtime."""
        if self._started:
            return self
        self._started = True
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        """The start steps in order; each later step relies on what the earlier ones set up."""
        self._open_run_log()
        self._reap_left_overs()
        sim_url = self._start_fakes()
        self._settings = self._build_settings(sim_url)
        settings = self._settings
        self._ensure_secret(settings.vllm_api_key_secret, "tpk-")
        self._ensure_secret(settings.hf_token_secret, "hf_")
        self.google_apis.start()
        self._open_store_and_bus(settings)
        self._create_topology()
        self._create_jobs()
        self._start_functions()
        self._attach_fleet()
        self._serve_routes()
        self._spawn(self._tick_loop, "localcloud-ticker")
        self._spawn(self._watch_active, "localcloud-active-watch")
        log.info(
            "local cloud up: simulator %s, data %s, time scale %g", sim_url, self.data_dir, self.options.time_scale
        )

    def _open_run_log(self) -> None:
        """The data and log folders, and the runner's own JSON-lines log (secrets redacted)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._log_handler = logging.FileHandler(self.log_dir / "runner.jsonl", encoding="utf-8")
        self._log_handler.addFilter(RedactingFilter())
        self._log_handler.setFormatter(JsonFormatter())
        log.addHandler(self._log_handler)
        log.setLevel(logging.INFO)

    def _reap_left_overs(self) -> None:
        """Stop the process groups a killed earlier run left behind, and say so."""
        self.reaped_at_start = reap_orphans()
        for group in self.reaped_at_start:
            log.warning(
                "stopped %s (process group %d), left running by a killed run (pid %d)",
                group.what,
                group.pgid,
                group.owner,
            )

    def _start_fakes(self) -> str:
        """The emulators and Google API stand-ins the options ask for, then the simulator; returns its URL."""
        if self.uses_emulators:
            self._start_emulators()
        if self.options.gcp:
            self.controller_apis.create_bucket(DEBUG_BUNDLE_BUCKET)
            for region, bucket in self.weights_caches.items():  # Terraform's regional caches, with their location
                self.controller_apis.create_bucket(bucket, location=region)
            self.controller_apis.start()
            self._scheduler_url = self.scheduler_api.start()
            self.monitoring_api.start()
        return self.sim.start()

    def _build_settings(self, sim_url: str) -> Settings:
        """The ``Settings`` the functions and the runner share: back end, endpoints, scaled limits, bundle."""
        limits = self._scaled_limits()
        bundle = self._publish_node_agent()
        return Settings.model_validate(
            {
                **({"node_agent_bundle": bundle.uri, "node_agent_bundle_sha256": bundle.sha256} if bundle else {}),
                "backend": "gcp" if self.options.gcp else "local",
                "project": self.scenario.project,
                "builder_service_account": self.builder_account,  # prewarm builder VMs run as it
                **(
                    {
                        "secretmanager_endpoint": self.controller_apis.base_url,
                        "scheduler_endpoint": self._scheduler_url,
                        "logging_endpoint": self.google_apis.base_url,  # where the VMs' agents write vLLM's lines
                        "storage_endpoint": self.controller_apis.base_url,  # debug bundles, read by the gateway
                        "debug_bundle_bucket": DEBUG_BUNDLE_BUCKET,
                        "weights_cache_buckets": self.weights_caches,
                        "monitoring_endpoint": self.monitoring_api.endpoint,
                    }
                    if self.options.gcp
                    else {}
                ),
                "data_dir": self.data_dir,
                "tpu_endpoint": sim_url,
                "clock": "simulator",
                "log_level": self.options.log_level,
                "emulators": self.options.emulators and not self.options.gcp,
                **limits,
            }
        )

    def _open_store_and_bus(self, settings: Settings) -> None:
        """Store, bus and scheduler: on the emulators and fakes, or the embedded SQLite ones."""
        clock = self.world.clock
        scale = self.options.time_scale
        if self.uses_emulators:
            self._runtime = Runtime(settings)  # Firestore and Pub/Sub through their adapters, on the emulators
            self._store = self._runtime.store
            self._bus = self._runtime.bus
        else:
            self._store = SqliteStateStore(self.data_dir / "state.sqlite")
            # The dispatchers lease and nack on this bus: deadline and backoff keep their wall-clock lengths.
            self._bus = LocalBus(
                self.data_dir / "bus.sqlite",
                ack_deadline_s=120.0 * scale,
                backoff_min_s=0.5 * scale,
                backoff_max_s=30.0 * scale,
                clock=clock,
            )
        if self.options.gcp:
            self._scheduler = self._runtime.scheduler if self._runtime else None  # Cloud Scheduler, on the fake
        else:
            self._scheduler = LocalScheduler(self.data_dir / "scheduler.sqlite", clock=clock)

    def _start_functions(self) -> None:
        """Every function whose source is present, each in its own process; returns once all listen."""
        for name in FUNCTIONS:
            if (REPO_ROOT / "functions" / name / "main.py").is_file():
                self.functions[name] = self._start_function(name)
            else:
                log.warning("functions/%s/main.py is missing: its subscriptions wait without a consumer", name)
        for function in self.functions.values():
            self._wait_listening(function)

    def _attach_fleet(self) -> None:
        """The VM fleet that boots nodes, when asked for and this machine can; otherwise the reason it cannot."""
        if not self.options.boot_nodes:
            return
        reason = self.tier.unavailable_reason() or unshare_available()
        if reason:
            self.no_boot_reason = reason
            log.warning("nodes will not boot: %s", reason)
            return
        self.fleet = VmFleet(
            self.world,
            self.tier,
            apis=self.google_apis,
            tokens=self.tokens,
            work_dir=self.data_dir / "nodes",
            log_dir=self.log_dir,
            container_env={**self.client_env(), **({TWIN_COMPILE: "1"} if self.options.twin_compile else {})},
            routes=(self.sim.port, *self._emulator_ports()),
            clock_endpoint=self.sim_url,
        )
        self.fleet.attach()

    def _serve_routes(self) -> None:
        """One dispatcher per route whose function runs: the embedded bus serves it, the emulator is pulled."""
        for route in ROUTES:
            target = self.functions.get(route.function)
            if target is None:
                continue
            handler = self._push_handler(route, target)
            if isinstance(self._bus, LocalBus):
                served = self._bus.serve(
                    route.subscription, handler, stop_event=self._stop_event, poll_interval_s=0.05, max_messages=1
                )
                self._threads.append(served)
            else:
                self._spawn(self._pull_loop(route.subscription, handler), f"dispatch-{route.subscription}")

    def stop(self) -> StopReport:
        """Stop everything this instance started; idempotent. The report lists any process group still alive."""
        if self._stopped is not None:
            return self._stopped
        began = time.monotonic()
        self._stop_event.set()
        groups: list[int] = []
        if self.fleet is not None:
            self.fleet.close()
            groups += self.fleet.process_groups()
        for function in self.functions.values():
            stop_group(function.process)
            groups.append(function.pid)
        for thread in self._threads:
            thread.join(timeout=10)
        for client in self._clients:
            client.close()
        # LocalBus.serve threads end on the stop event; give an in-flight push a moment, then close the files.
        time.sleep(0.2)
        for closable in (self._bus, self._store, self._scheduler):
            closer = getattr(closable, "close", None)
            if callable(closer):
                with contextlib.suppress(Exception):
                    closer()
        for emulator in self.emulators:
            emulator.stop()
            groups.append(emulator.pid)
        for name, value in self._saved_environ.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self.sim.stop()
        for service in (self.google_apis, self.controller_apis, self.scheduler_api, self.monitoring_api):
            with contextlib.suppress(Exception):
                service.stop()
        survivors = _surviving_groups(groups)
        self._stopped = StopReport(tuple(survivors), len(groups), round(time.monotonic() - began, 2))
        if survivors:
            log.error("process groups still alive after stop: %s", survivors)
        else:
            log.info("stopped %d process group(s); nothing left running", len(groups))
        if self._log_handler is not None:
            log.removeHandler(self._log_handler)
            self._log_handler.close()
        return self._stopped

    @property
    def settings(self) -> Settings:
        """The settings every process of the stack runs with (also what a client should use)."""
        if self._settings is None:
            raise RuntimeError("LocalCloud: call start() first")
        return self._settings

    @property
    def weights_caches(self) -> dict[str, str]:
        """Terraform's regional weights caches for the scenario's regions (``{region: bucket}``)."""
        return {region: f"{NAME_PREFIX}-weights-{region}" for region in regions_of(self.scenario.zones)}

    @property
    def uses_emulators(self) -> bool:
        return self.options.emulators or self.options.gcp

    @property
    def sim_url(self) -> str:
        return self.sim.base_url

    @property
    def store(self) -> StateStore:
        if self._store is None:
            raise RuntimeError("LocalCloud: call start() first")
        return self._store

    @property
    def bus(self) -> CommandBus:
        if self._bus is None:
            raise RuntimeError("LocalCloud: call start() first")
        return self._bus

    @property
    def scheduler(self) -> SchedulerApi:
        """Cloud Scheduler as the functions see it (its stand-in, or the embedded one)."""
        if self._scheduler is None:
            raise RuntimeError("LocalCloud: call start() first")
        return self._scheduler

    @property
    def secrets(self) -> FileSecretStore:
        return self._secrets

    def client_env(self) -> dict[str, str]:
        """``TPUCTL_*`` variables that point a gateway, the CLI or a node agent at this stack (no secrets)."""
        settings = self.settings
        return {
            "TPUCTL_BACKEND": settings.backend,
            "TPUCTL_PROJECT": self.scenario.project,
            **{
                f"TPUCTL_{name.upper()}": _env_value(getattr(settings, name))
                for name in _TWIN_SETTINGS
                if settings.backend == "gcp"
            },
            "TPUCTL_DATA_DIR": str(self.data_dir),
            "TPUCTL_TPU_ENDPOINT": self.sim_url,
            "TPUCTL_CLOCK": "simulator",
            **{f"TPUCTL_{name.upper()}": f"{getattr(settings, name):.0f}" for name in _SCALED_LIMITS},
            **({"TPUCTL_BOOT_BUDGET_S": f"{settings.boot_budget_s:.0f}"} if settings.boot_budget_s else {}),
            "TPUCTL_LOG_LEVEL": settings.log_level,
            "TPUCTL_BUILDER_SERVICE_ACCOUNT": self.builder_account,  # prewarm builder VMs, as Terraform sets it
            **(
                {
                    "TPUCTL_NODE_AGENT_BUNDLE": settings.node_agent_bundle,
                    "TPUCTL_NODE_AGENT_BUNDLE_SHA256": settings.node_agent_bundle_sha256 or "",
                }
                if settings.node_agent_bundle
                else {}
            ),
            **({"TPUCTL_EMULATORS": "true"} if settings.emulators else {}),
            **{emulator.kind.env_var: emulator.host_port for emulator in self.emulators},
        }

    def process_groups(self) -> list[int]:
        """Every process group started so far (functions, vLLM servers, node agents, emulators)."""
        groups = [function.pid for function in self.functions.values()]
        groups += [emulator.pid for emulator in self.emulators]
        if self.fleet is not None:
            groups += self.fleet.process_groups()
        return groups

    # ------------------------------------------------------------------ setup steps

    def _scaled_limits(self) -> dict[str, float]:
        """Limits that protect wall-clock things, stretched so they keep their wall-clock length."""
        scale = self.options.time_scale
        stale_wall_s = 24 * 3600.0 if self.uses_emulators else 600.0  # the Pub/Sub emulator stamps wall time
        return {
            "lease_ttl_s": max(120.0, 30.0 * scale),  # a crashed reconciler's lease frees after 30 wall s
            "max_event_age_s": max(3600.0, stale_wall_s * scale),  # a command is stale after 10 wall min
            "command_claim_s": max(600.0, 60.0 * scale),  # a stuck first delivery is taken over after 1 wall min
            # a VM twin boots vLLM on CPU in wall time (40-120 s here): DOWN only after 5 wall minutes of silence
            "boot_budget_s": min(86400.0, max(3600.0, 300.0 * scale)),
            "node_task_timeout_s": max(300.0, 120.0 * scale),  # a node's restart, with its debug bundle, in wall time
            "monitor_telemetry_max_age_s": max(180.0, 180.0 * scale),  # the agent samples the TPU every 30 wall s
        }

    def _start_emulators(self) -> None:
        """Both emulators, or a RuntimeError saying what is missing; their hosts go into this process too."""
        found = {kind: find_emulator(kind) for kind in EMULATORS}
        missing = [reason for reason in found.values() if isinstance(reason, str)]
        if missing:
            raise RuntimeError("--emulators: " + "; ".join(missing))
        for kind, launcher in found.items():
            assert isinstance(launcher, Path)
            self.emulators.append(start_emulator(kind, launcher, self.data_dir / "emulators"))
        for emulator in self.emulators:
            # The google-cloud clients of this process (the runner's store and bus, an in-process gateway) read it.
            self._saved_environ[emulator.kind.env_var] = os.environ.get(emulator.kind.env_var)
            os.environ[emulator.kind.env_var] = emulator.host_port

    def _ensure_secret(self, name: str, prefix: str) -> None:
        """A secret made once per data folder, kept in the 0600 secret store, registered for redaction.

        The vLLM API key, and a Hugging Face token the VMs read as on Google Cloud (no Hub is reached here: the
        VM's disk holds the stand-in weights)."""
        value = self._secrets.get(name)
        if value is None:
            value = prefix + secrets.token_urlsafe(32)
            self._secrets.put(name, value)
        register_secret(value)

    def _publish_node_agent(self) -> PublishedBundle | None:
        """The node-agent bundle in the Storage stand-in, as ``make package`` and Terraform put it in a bucket."""
        if not self.options.boot_nodes:
            return None
        try:
            return publish_node_agent(self.google_apis, self.options.cache_dir, f"{self.scenario.project}-sources")
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            log.warning("VMs get no node agent (no benchmarks, restarts or tails): %s; run make setup-local", exc)
            return None

    def _emulator_ports(self) -> list[int]:
        """The Pub/Sub emulator's port, which a VM's node agent reaches (a VM has no business with Firestore)."""
        return [int(e.host_port.rsplit(":", 1)[1]) for e in self.emulators if e.kind.env_var == "PUBSUB_EMULATOR_HOST"]

    def _create_topology(self) -> None:
        bus = self.bus
        settings = self.settings
        names = {
            "commands": settings.topic_commands,
            "ticks": settings.topic_ticks,
            "events": settings.topic_events,
            "node-tasks": settings.topic_node_tasks,
        }
        for topic in names.values():
            bus.ensure_topic(topic)
            dead = f"{topic}-dead-letter"
            bus.ensure_topic(dead)
            bus.ensure_subscription(dead, f"{dead}-sub")  # a dead-letter topic somebody reads
        for route in ROUTES:
            bus.ensure_subscription(
                names[route.topic],
                route.subscription,
                filter=route.filter,
                dead_letter_topic=f"{names[route.topic]}-dead-letter",
                max_delivery_attempts=MAX_DELIVERY_ATTEMPTS,
            )

    def _topic_name(self, logical: str) -> str:
        settings = self.settings
        return {
            "commands": settings.topic_commands,
            "ticks": settings.topic_ticks,
            "events": settings.topic_events,
            "node-tasks": settings.topic_node_tasks,
        }[logical]

    def _create_jobs(self) -> None:
        """The monitor and janitor Scheduler jobs, with the bodies Terraform gives them (ticks.json)."""
        ticks = json.loads(TICKS_FILE.read_text(encoding="utf-8"))
        scheduler = self._scheduler
        assert scheduler is not None
        for key, schedule in RUNNER_JOBS.items():
            entry = ticks[key]
            message = entry["message"]
            attributes = {
                "kind": str(message["kind"]),
                "schema_version": str(message["schema_version"]),
                "command_id": str(message["command_id"]),
                "purpose": str(message["purpose"]),
            }
            scheduler.upsert_job(
                SchedulerJob(
                    name=str(entry["job"]),
                    schedule=schedule,
                    topic=self.settings.topic_ticks,
                    data=json.dumps(message, separators=(",", ":")).encode(),
                    attributes=attributes,
                )
            )

    def _function_env(self) -> dict[str, str]:
        env = {name: os.environ[name] for name in _FUNCTION_ENV if name in os.environ}
        env.update(self.client_env())
        env.update(
            PYTHONUNBUFFERED="1",
            PYTHONPATH=str(REPO_ROOT),
            WORKERS="1",
            THREADS="1",  # one request at a time per instance, as Cloud Functions' default concurrency
            GUNICORN_LOG_LEVEL="warning",
        )
        return env

    def _start_function(self, name: str) -> FunctionProcess:
        port = free_loopback_port()
        log_path = self.log_dir / f"{name}.jsonl"
        argv = [
            sys.executable,
            "-m",
            "functions_framework",
            f"--target={name}",
            f"--source={REPO_ROOT / 'functions' / name / 'main.py'}",
            "--signature-type=cloudevent",
            "--host=127.0.0.1",
            f"--port={port}",
        ]
        with log_path.open("ab") as sink:
            # gunicorn runs a parent and a worker: its own group stops them as one
            process = spawn_group(argv, what=f"function {name}", stdout=sink, env=self._function_env(), cwd=REPO_ROOT)
        return FunctionProcess(name=name, port=port, log_path=log_path, process=process)

    def _wait_listening(self, function: FunctionProcess) -> None:
        deadline = time.monotonic() + self.options.function_start_timeout_s
        while time.monotonic() < deadline:
            if function.process.poll() is not None:
                raise RuntimeError(
                    f"function {function.name} exited with {function.process.returncode} at start; "
                    f"log {function.log_path}:\n{_tail(function.log_path)}"
                )
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.settimeout(0.5)
                if sock.connect_ex(("127.0.0.1", function.port)) == 0:
                    return
            time.sleep(0.2)
        raise RuntimeError(
            f"function {function.name} did not listen on port {function.port} within "
            f"{self.options.function_start_timeout_s:.0f} s; log {function.log_path}:\n{_tail(function.log_path)}"
        )

    # ------------------------------------------------------------------ running parts

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _push_handler(self, route: Route, function: FunctionProcess) -> Callable[[Delivery], None]:
        """POST a delivery as Pub/Sub push does; any non-2xx answer (or no answer) raises: a nack."""
        project = self.scenario.project
        topic = self._topic_name(route.topic)
        url = f"{function.url}/projects/{project}/topics/{topic}"
        client = httpx.Client(timeout=httpx.Timeout(600.0, connect=5.0))
        self._clients.append(client)

        def push(delivery: Delivery) -> None:
            published = self._virtual_publish_time(delivery.publish_time)
            body = {
                "message": {
                    "data": base64.b64encode(delivery.data).decode("ascii"),
                    "attributes": dict(delivery.attributes),
                    "messageId": delivery.message_id,
                    "publishTime": published.isoformat().replace("+00:00", "Z"),
                },
                "subscription": f"projects/{project}/subscriptions/{delivery.subscription}",
                "deliveryAttempt": delivery.attempt,
            }
            try:
                response = client.post(url, json=body, headers={"User-Agent": "tpuctl-localcloud-push"})
            except httpx.HTTPError as exc:
                self._note_failure(f"{route.subscription}: {type(exc).__name__}")
                raise PushRejected(f"{route.function} did not answer ({type(exc).__name__})") from None
            if not 200 <= response.status_code < 300:
                self._note_failure(f"{route.subscription}: HTTP {response.status_code}")
                raise PushRejected(f"{route.function} answered HTTP {response.status_code}: a nack")

        return push

    def _virtual_publish_time(self, stamped: datetime | None) -> datetime:
        """The publish time as Pub/Sub would stamp it in this world. The embedded bus stamps on the simulator's
        clock already; the Pub/Sub emulator stamps wall time, which virtual time leaves behind, so its stamp is
        moved to the same age in virtual time (wall age x time scale) before virtual now."""
        now = self.world.clock.now()
        if stamped is None:
            return now
        if not self.uses_emulators:
            return stamped
        wall_age_s = max(0.0, (datetime.now(UTC) - stamped).total_seconds())
        return now - timedelta(seconds=wall_age_s * self.options.time_scale)

    def _note_failure(self, text: str) -> None:
        with self._lock:
            self.delivery_failures.append(text)
            del self.delivery_failures[:-200]

    def _pull_loop(self, subscription: str, handler: Callable[[Delivery], None]) -> Callable[[], None]:
        """Push delivery over a pulling bus (the Pub/Sub emulator): pull one message at a time, hand it on."""
        bus = self.bus

        def loop() -> None:
            while not self._stop_event.is_set():
                try:
                    bus.pull(subscription, handler, max_messages=1, timeout_s=0.5)
                except Exception:  # the emulator going away at shutdown, or a transient error: try again
                    if self._stop_event.wait(0.5):
                        return
                    log.warning("pull from %s failed; retrying", subscription, exc_info=True)

        return loop

    def _tick_loop(self) -> None:
        """Cloud Scheduler's stand-in: publish every job that fell due, a few times per wall second."""
        scheduler, bus = self._scheduler, self._bus
        assert scheduler is not None and bus is not None
        while not self._stop_event.wait(self.options.ticker_interval_s):
            try:
                if isinstance(scheduler, LocalScheduler):
                    scheduler.run_due(bus)
                else:  # Cloud Scheduler's stand-in fires its own jobs, on the simulator's clock
                    self.scheduler_api.fire_due(self.world.clock.now(), bus.publish)
            except Exception:  # a locked database or a closed bus at shutdown: try again next round
                if self._stop_event.is_set():
                    return
                log.exception("ticker round failed")

    def _watch_active(self) -> None:
        """Sample the simulator for two ACTIVE slices of one deployment (the invariant the tests assert)."""
        while not self._stop_event.wait(0.5):
            try:
                duplicates = self.world.invariants(None)["duplicate_active"]
            except Exception:  # the world is being torn down
                return
            if duplicates:
                with self._lock:
                    self.duplicate_active_seen.append({"time": self.world.now().isoformat(), **duplicates})


def _surviving_groups(groups: list[int], grace_s: float = 3.0) -> list[int]:
    """Process groups with a member still alive after ``grace_s`` (orphans are reaped by init meanwhile)."""
    deadline = time.monotonic() + grace_s
    while True:
        alive = [group for group in groups if _group_alive(group)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.1)


def _group_alive(group: int) -> bool:
    """A member of the group still runs (zombies waiting for init to reap them do not count)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited while we looked
        if int(fields[2]) == group and fields[0] not in ("Z", "X"):
            return True
    return False


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "<no log>"


def _env_value(value: object) -> str:
    """A setting as its environment variable holds it: JSON for a mapping (pydantic-settings reads it so)."""
    return json.dumps(value) if isinstance(value, dict) else str(value or "")

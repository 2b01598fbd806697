"""Build the ports from settings, lazily: SDK clients are created on first use, once per process.

``TPUCTL_BACKEND=local`` (the default) gives the embedded stack under ``TPUCTL_DATA_DIR``: SQLite
store and bus, file secrets, the local scheduler, and the TPU adapter pointed at the simulator
(``TPUCTL_TPU_ENDPOINT``). ``TPUCTL_BACKEND=gcp`` gives Firestore, Pub/Sub, Secret Manager, Cloud
Scheduler and the Cloud TPU API.
"""

from __future__ import annotations

import os
import socket
from functools import cached_property, lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shared.config import Settings, get_settings
from shared.ports import (
    CalendarReservations,
    CapacityAdvice,
    Clock,
    CommandBus,
    DebugBundles,
    LogSink,
    MetricWriter,
    NodeChannels,
    SchedulerApi,
    SecretStore,
    StateStore,
    TpuApi,
    WeightsCacheState,
)

if TYPE_CHECKING:
    from shared.adapters.billing_catalog import PriceBook
    from shared.domain.models import DeploymentSpec, Tier
    from shared.domain.serving_plan import ServingEnvironment
    from shared.services.benchmarker import Benchmarker
    from shared.services.event_seals import EventSeals
    from shared.services.monitor import Monitor
    from shared.services.node_tasks import NodeTasks
    from shared.services.provisioner import Provisioner

__all__ = ["LOCAL_PROJECT", "Runtime", "runtime", "serving_environment"]

LOCAL_PROJECT = "tpuctl-local"


def serving_environment(settings: Settings) -> ServingEnvironment:
    """The one environment plans are built in: the controller deploys with it, the gateway previews with it.

    Secrets by name only; vLLM bound for the firewalled port (the monitor probes it from the VPC); the node-agent
    bundle the TPU VMs install. Anything that differs between a preview and a deployment would live here.
    """
    from shared.domain.serving_plan import ServingEnvironment

    return ServingEnvironment(
        project=settings.project or LOCAL_PROJECT,
        hf_token_secret=settings.hf_token_secret,
        api_key_secret=settings.vllm_api_key_secret,
        node_agent_bundle=settings.node_agent_bundle or "",
        node_agent_bundle_sha256=settings.node_agent_bundle_sha256 or "",
        debug_bundle_bucket=settings.debug_bundle_bucket or "",
        weights_cache_buckets=tuple(sorted(settings.weights_cache_buckets.items())),
        weights_cache_cross_region=settings.weights_cache_cross_region,
        trace_export=settings.trace_export,  # the node agents export where the controller does (Cloud Trace)
        bind_host="0.0.0.0",  # reachable by the monitor; the VPC firewall limits who may connect
    )


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
        if self.settings.clock == "simulator" and self.settings.tpu_endpoint:
            from shared.adapters.sim_clock import SimulatorClock

            return SimulatorClock(self.settings.tpu_endpoint)
        from shared.adapters.clock import SystemClock

        return SystemClock()

    @cached_property
    def store(self) -> StateStore:
        if self.settings.backend == "gcp" or self.settings.emulators:
            from google.cloud import firestore

            from shared.adapters.firestore_store import FirestoreStateStore

            client = firestore.Client(project=self.project, database=self.settings.firestore_database)
            return FirestoreStateStore(client)
        from shared.adapters.sqlite_store import SqliteStateStore

        return SqliteStateStore(self._data / "state.sqlite")

    @cached_property
    def bus(self) -> CommandBus:
        if self.settings.backend == "gcp" or self.settings.emulators:
            from shared.adapters.pubsub_bus import PubSubBus

            return PubSubBus(self.project)
        from shared.adapters.local_bus import LocalBus

        return LocalBus(self._data / "bus.sqlite", clock=self.clock)

    @cached_property
    def node_channels(self) -> NodeChannels:
        """Each deployment's subscription on the node-tasks topic, made by the controller. On Pub/Sub the TPU VMs'
        account (``node_service_account``) is granted subscriber on it through Pub/Sub's IAM endpoint
        (``pubsub_iam_endpoint``); with no account configured the VMs run as the project's default account and
        nothing is granted. The embedded bus has no identities."""
        topic = self.topic("node-tasks")
        if self.settings.backend == "gcp" or self.settings.emulators:
            from shared.adapters.node_channels import PubSubNodeChannels
            from shared.adapters.pubsub_iam import PubSubSubscriptionIam

            account = self.settings.node_service_account
            return PubSubNodeChannels(
                self.project,
                topic,
                iam=PubSubSubscriptionIam(self.project, endpoint=self.settings.pubsub_iam_endpoint),
                readers=(f"serviceAccount:{account}",) if account else (),
            )
        from shared.adapters.local_bus import LocalBus
        from shared.adapters.node_channels import LocalBusNodeChannels

        bus = self.bus
        assert isinstance(bus, LocalBus)
        return LocalBusNodeChannels(bus, topic)

    @cached_property
    def secrets(self) -> SecretStore:
        if self.settings.backend == "gcp":
            from shared.adapters.secret_manager import SecretManagerStore

            return SecretManagerStore(self.project, endpoint=self.settings.secretmanager_endpoint)
        from shared.adapters.file_secrets import FileSecretStore

        return FileSecretStore(self._data / "secrets")

    @cached_property
    def event_seals(self) -> EventSeals:
        """Node event keys and seal checks (shared/domain/node_seal.py)."""
        from shared.services.event_seals import EventSeals

        return EventSeals(self.secrets, self.settings.event_key_secret)

    @cached_property
    def tpu(self) -> TpuApi:
        """Both provisioning back ends behind one port; the simulator serves both on one endpoint."""
        from shared.adapters.compute_engine_tpu import ComputeEngineTpu
        from shared.adapters.gcp_tpu import GcpTpuApi
        from shared.adapters.multi_backend_tpu import MultiBackendTpu
        from shared.domain.models import Backend

        endpoint = self.settings.tpu_endpoint
        placement = self.settings.node_placement()  # the VMs' service account, network and firewall tag
        return MultiBackendTpu(
            {
                Backend.TPU_API: GcpTpuApi(self.project, endpoint=endpoint, placement=placement),
                Backend.COMPUTE_ENGINE: ComputeEngineTpu(self.project, endpoint=endpoint, placement=placement),
            }
        )

    @cached_property
    def prices(self) -> PriceBook:
        """Live TPU prices from the Billing Catalog, cached with a date; the dated table when it is unreachable."""
        from shared.adapters.billing_catalog import BillingCatalog

        # A function instance's disk is read-only outside /tmp: there the cache is the instance itself.
        cache = None if self.settings.backend == "gcp" else self._data / "prices.json"
        catalog = BillingCatalog(endpoint=self.settings.tpu_endpoint, clock=self.clock, cache_path=cache)
        try:
            return catalog.prices()
        finally:
            catalog.close()

    @cached_property
    def scheduler(self) -> SchedulerApi:
        if self.settings.backend == "gcp":
            from shared.adapters.cloud_scheduler import CloudSchedulerApi

            return CloudSchedulerApi(self.project, self.settings.region, endpoint=self.settings.scheduler_endpoint)
        from shared.adapters.local_scheduler import LocalScheduler

        return LocalScheduler(self._data / "scheduler.sqlite", clock=self.clock)

    @cached_property
    def provisioner(self) -> Provisioner:
        """The provisioner service (shared/services/provisioner.py) on this runtime's ports."""
        from shared.domain.spot_probe import ProbePolicy
        from shared.services.provisioner import Provisioner, ProvisionerSettings, reconcile_tick_job

        settings = ProvisionerSettings(
            lease_ttl_s=self.settings.lease_ttl_s,
            tick_job=reconcile_tick_job(self.topic("ticks")),
            holder=f"provisioner-{socket.gethostname()}-{os.getpid()}",  # who holds a lease, in logs and records
            probe=ProbePolicy() if self.settings.spot_probe else None,
            builder_service_account=self.settings.builder_service_account,
        )
        return Provisioner(
            self.store,
            self.tpu,
            self.clock,
            scheduler=self.scheduler,
            settings=settings,
            startup_script=self.startup_script,
            price=self.prices,
            channels=self.node_channels,
            node_metadata=self.node_metadata,
            advice=self.capacity_advice,
            calendar=self.calendar,
        )

    @cached_property
    def capacity_advice(self) -> CapacityAdvice:
        """Compute Engine's capacity advice (fail soft: without it the search runs as before)."""
        from shared.adapters.compute_advice import ComputeCapacityAdvice

        return ComputeCapacityAdvice(self.project, self.clock, endpoint=self.settings.tpu_endpoint)

    @cached_property
    def calendar(self) -> CalendarReservations:
        """Compute Engine's calendar-mode future reservations (book, watch, release a deployment's window)."""
        from shared.adapters.compute_calendar import ComputeCalendarReservations

        return ComputeCalendarReservations(self.project, endpoint=self.settings.tpu_endpoint)

    def weights_cache_state(self) -> WeightsCacheState:
        """What the regional weights caches hold (the plan's cache state), read as the caller's identity."""
        from shared.adapters.weights_cache_bucket import CloudStorageCacheState

        return CloudStorageCacheState(endpoint=self.settings.storage_endpoint)

    def node_metadata(self, deployment_id: str) -> dict[str, str]:
        """Instance metadata every node of a deployment gets beside its startup script: its event key."""
        from shared.domain.node_seal import EVENT_KEY_METADATA

        return {EVENT_KEY_METADATA: self.event_seals.event_key(deployment_id, create=True)}

    def startup_script(self, spec: DeploymentSpec) -> str:
        """The TPU VM startup script for a spec, in the one serving environment (``serving_environment``)."""
        from shared.domain.serving_plan import build_serving_plan

        return str(build_serving_plan(spec, serving_environment(self.settings)).startup_script())

    @cached_property
    def monitor(self) -> Monitor:
        """The monitor service on this runtime's ports, probing each deployment with its own vLLM API key (derived
        from the master in the secret store) and reading booting nodes' progress through the TPU port."""
        from shared.adapters.vllm_probe import VllmProbe
        from shared.services.monitor import Monitor, MonitorSettings

        settings = MonitorSettings(
            sample_ttl_days=self.settings.sample_ttl_days,
            canary_interval_s=self.settings.monitor_canary_interval_s,
            telemetry_max_age_s=self.settings.monitor_telemetry_max_age_s,
            topic_commands=self.settings.topic_commands,
            topic_events=self.settings.topic_events,
            topic_ticks=self.settings.topic_ticks,
        )
        probe = VllmProbe(api_key=self.secrets.get(self.settings.vllm_api_key_secret))
        return Monitor(self.store, probe, self.bus, self.clock, settings, tpu=self.tpu, metrics=self.metric_writer)

    @cached_property
    def metric_writer(self) -> MetricWriter:
        """Where the monitor's SLIs go as time series: Cloud Monitoring's custom metrics (Terraform's dashboard and
        SLO alerts read them), or a JSON-lines file under the data directory."""
        if self.settings.backend == "gcp":
            from shared.adapters.cloud_monitoring import CloudMonitoringWriter

            return CloudMonitoringWriter(self.project, endpoint=self.settings.monitoring_endpoint)
        from shared.adapters.local_metrics import JsonLinesMetricWriter

        return JsonLinesMetricWriter(self._data / "metrics.jsonl")

    @cached_property
    def benchmarker(self) -> Benchmarker:
        """The benchmark service: records runs, dispatches them to the node agent, ingests results (each level
        priced at the live catalog's price for the deployment's tier, read when the first result arrives)."""
        from shared.services.benchmarker import Benchmarker, BenchmarkerSettings

        settings = BenchmarkerSettings(
            project=self.project,
            topic_commands=self.settings.topic_commands,
            topic_node_tasks=self.settings.topic_node_tasks,
        )

        def price(zone: str, tier: Tier, family: str) -> tuple[float, str] | None:
            return self.prices.lookup(zone, tier, family)

        return Benchmarker(self.store, self.bus, self.clock, scheduler=self.scheduler, settings=settings, price=price)

    @cached_property
    def node_tasks(self) -> NodeTasks:
        """The node-task service: records restart and log-tail requests, dispatches them, stores the answers."""
        from shared.services.node_tasks import NodeTasks, NodeTaskSettings

        settings = NodeTaskSettings(
            topic_node_tasks=self.settings.topic_node_tasks, answer_timeout_s=self.settings.node_task_timeout_s
        )
        return NodeTasks(self.store, self.bus, self.clock, settings)

    def log_sink(self, deployment_id: str, container: str) -> LogSink:
        """Where the node agent ships its serving container's lines: Cloud Logging as the VM on ``gcp``; on the
        embedded default nowhere, since the container's own log file is the local log store."""
        if self.settings.backend == "gcp":
            from shared.adapters.cloud_logging_sink import CloudLoggingSink

            return CloudLoggingSink(
                self.project, deployment_id=deployment_id, container=container, endpoint=self.settings.logging_endpoint
            )
        from shared.adapters.local_log_sink import LocalFilesLogSink

        return LocalFilesLogSink()

    def debug_bundles(self, *, as_node: bool = False) -> DebugBundles | None:
        """Where debug bundles are kept: the installation's bucket on ``gcp`` (None when it has none), written by a
        node agent (``as_node``: as the VM, with its metadata server's tokens) and read by the gateway as the user;
        on the embedded default a directory under the data dir."""
        if self.settings.backend == "gcp":
            if not self.settings.debug_bundle_bucket:
                return None
            from shared.adapters.cloud_storage_bundles import CloudStorageBundles

            credentials = None
            if as_node:
                from google.auth.compute_engine import Credentials as VmCredentials

                credentials = VmCredentials()
            return CloudStorageBundles(
                self.settings.debug_bundle_bucket, endpoint=self.settings.storage_endpoint, credentials=credentials
            )
        from shared.adapters.directory_bundles import DirectoryBundles

        return DirectoryBundles(self._data / "debug-bundles")

    def close(self) -> None:
        """Close every port built so far that holds connections (tests and the local runner call it)."""
        for name in ("tpu", "store", "bus", "scheduler", "secrets"):
            port = self.__dict__.get(name)
            closer = getattr(port, "close", None)
            if callable(closer):
                closer()
        channels_closer = getattr(self.__dict__.get("node_channels"), "close_client", None)  # close() is the port's
        if callable(channels_closer):
            channels_closer()

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

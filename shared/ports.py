"""One ``Protocol`` per outside dependency. Services depend on these, adapters implement them.

Every port has a Google Cloud adapter and an embedded default (docs/reference/DESIGN.md §5); both pass the
same contract test suite in ``tests/adapters``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol, get_args, runtime_checkable

from shared.domain.boot_progress import GuestAttribute
from shared.domain.canary import CanaryCheck
from shared.domain.cloud import ObservedResource, OperationStatus, ProvisionRequest
from shared.domain.errors import CloudError, ErrorClass, PermanentError
from shared.domain.health import ProbeResult
from shared.domain.models import (
    Backend,
    BenchmarkRun,
    CalendarWindow,
    CommandRecord,
    DeploymentRecord,
    Lease,
    MonitorSample,
    NodeTask,
    RejectedMessage,
    Tier,
    ZoneMemoryEntry,
)
from shared.domain.quota import TPU_QUOTA_SERVICE, QuotaLimit
from shared.domain.sli_metrics import MetricPoint

__all__ = [
    "NODE_CHANNEL_PREFIX",
    "CalendarReservations",
    "CapacityAdvice",
    "Clock",
    "CommandBus",
    "ContainerLogLine",
    "ContainerLogs",
    "ContainerState",
    "DebugBundles",
    "Delivery",
    "EndpointAccess",
    "EndpointAccessError",
    "EndpointTarget",
    "Fence",
    "Handler",
    "LogEntry",
    "LogQuery",
    "LogReader",
    "LogSink",
    "MetricWriter",
    "MissingSubscription",
    "ModelChat",
    "ModelChatRequest",
    "ModelClient",
    "ModelEndpointCheck",
    "NodeChannels",
    "NodeLogLine",
    "QuotaApi",
    "SchedulerApi",
    "SchedulerJob",
    "SecretStore",
    "ServingContainer",
    "ServingProbe",
    "StateStore",
    "SubscriptionIam",
    "TpuApi",
    "WeightsCacheState",
    "node_channel",
    "node_channel_filter",
]


@runtime_checkable
class Clock(Protocol):
    """Wall time for records (UTC-aware) and a monotonic reading for durations."""

    def now(self) -> datetime: ...

    def monotonic(self) -> float: ...


@dataclass(frozen=True)
class Fence:
    """A lease epoch a write must still hold: the store rejects the write if the lease moved on."""

    lease_name: str
    epoch: int


class StateStore(Protocol):
    """Deployments, the command ledger, leases, samples, benchmark runs, node tasks and zone memory.

    Writes that change a deployment are compare-and-set on ``version``; a lost race raises
    :class:`~shared.domain.errors.ConflictError`, a stale fence raises
    :class:`~shared.domain.errors.LeaseHeld`.
    """

    # Deployments
    def get_deployment(self, deployment_id: str) -> DeploymentRecord | None: ...

    def list_deployments(self, *, include_deleted: bool = False) -> list[DeploymentRecord]: ...

    def put_deployment(
        self, record: DeploymentRecord, *, expected_version: int | None, fence: Fence | None = None
    ) -> DeploymentRecord:
        """Create (``expected_version=None``: must not exist) or replace (version must match).

        Returns the stored record with its new ``version``.
        """
        ...

    # Command ledger (idempotency)
    def record_command(self, record: CommandRecord) -> tuple[bool, CommandRecord]:
        """Create-if-absent. Returns ``(created, stored)``; a duplicate returns ``(False, first)``."""
        ...

    def finish_command(self, command_id: str, status: str, outcome: str) -> None: ...

    def get_command(self, command_id: str) -> CommandRecord | None: ...

    def record_rejection(self, rejected: RejectedMessage) -> None: ...

    def list_rejections(self, limit: int = 100) -> list[RejectedMessage]: ...

    # Leases with fencing epochs
    def acquire_lease(self, name: str, holder: str, ttl_s: float, now: datetime) -> Lease | None:
        """Take the lease if free, expired or already ours; the epoch grows on every acquisition."""
        ...

    def release_lease(self, name: str, holder: str, epoch: int) -> None: ...

    # Monitor samples
    def write_samples(self, samples: Sequence[MonitorSample]) -> None:
        """All samples of one tick in one batched write."""
        ...

    def list_samples(
        self, deployment_id: str, *, since: datetime | None = None, limit: int = 100
    ) -> list[MonitorSample]:
        """Newest first."""
        ...

    # Benchmark runs
    def create_benchmark_run(self, run: BenchmarkRun) -> tuple[bool, BenchmarkRun]: ...

    def update_benchmark_run(self, run: BenchmarkRun) -> None: ...

    def get_benchmark_run(self, run_id: str) -> BenchmarkRun | None: ...

    def list_benchmark_runs(self, deployment_id: str | None = None, limit: int = 100) -> list[BenchmarkRun]: ...

    # Node tasks (container control: restart, log tail)
    def create_node_task(self, task: NodeTask) -> tuple[bool, NodeTask]:
        """Create-if-absent on ``task_id``: ``(True, task)`` the first time, ``(False, stored)`` after."""
        ...

    def update_node_task(self, task: NodeTask, *, expected_status: str | None = None) -> bool:
        """Replace a stored task; with ``expected_status`` only while the stored one still has that status.

        Returns whether it was written; LookupError if the task was never created.
        """
        ...

    def get_node_task(self, task_id: str) -> NodeTask | None: ...

    def list_node_tasks(self, deployment_id: str, limit: int = 20) -> list[NodeTask]:
        """The deployment's tasks, newest ``requested_at`` first."""
        ...

    # Zone memory (shared by all deployments)
    def list_zone_memory(self) -> list[ZoneMemoryEntry]: ...

    def put_zone_memory(self, entry: ZoneMemoryEntry) -> None: ...

    def delete_zone_memory(self, key: str) -> None: ...


@dataclass(frozen=True)
class Delivery:
    """One delivery of one message to one subscription; ``attempt`` starts at 1."""

    message_id: str
    data: bytes
    attributes: Mapping[str, str]
    attempt: int
    subscription: str
    ordering_key: str = ""
    publish_time: datetime | None = None
    extra: Mapping[str, str] = field(default_factory=dict)


Handler = Callable[[Delivery], None]
"""Return to acknowledge; raise to have the message delivered again (with backoff)."""


class CommandBus(Protocol):
    """Topics and subscriptions with at-least-once delivery, redelivery on failure and dead letters."""

    def ensure_topic(self, topic: str) -> None: ...

    def ensure_subscription(
        self,
        topic: str,
        subscription: str,
        *,
        filter: str | None = None,
        dead_letter_topic: str | None = None,
        max_delivery_attempts: int = 5,
    ) -> None: ...

    def publish(
        self, topic: str, data: bytes, attributes: Mapping[str, str], *, ordering_key: str | None = None
    ) -> str:
        """Publish one message; returns the bus's message id once it is durable."""
        ...

    def pull(self, subscription: str, handler: Handler, *, max_messages: int = 10, timeout_s: float = 1.0) -> int:
        """Deliver up to ``max_messages`` to ``handler``: ack on return, nack on raise. Returns how many were acked."""
        ...


class MissingSubscription(PermanentError):
    """A pull named a subscription that does not exist (yet): the bus raises it instead of a bare PermanentError."""


NODE_CHANNEL_PREFIX = "tpuctl-node-"
"""Every node channel's subscription name starts with this (Terraform's docs and the teardown checks use it)."""


def node_channel(deployment_id: str) -> str:
    """A deployment's node channel: its own subscription on the node-tasks topic, ``tpuctl-node-<deployment>``."""
    return f"{NODE_CHANNEL_PREFIX}{deployment_id}"


def node_channel_filter(deployment_id: str) -> str:
    """The channel's subscription filter: only the messages addressed to that deployment."""
    return f'attributes.deployment_id = "{deployment_id}"'


class NodeChannels(Protocol):
    """Each deployment's way to its TPU VMs' node agents: a subscription on the node-tasks topic that only the
    VMs' service account may read (``roles/pubsub.subscriber`` on that one subscription).

    The controller opens a deployment's channel before it creates a node and closes it once the deployment is
    gone; the node agent only pulls from it. Both calls are idempotent. Errors are classified ``CloudError``s.
    """

    def open(self, deployment_id: str) -> str:
        """Create the subscription if absent (topic and filter checked if present), grant the VMs' account
        subscriber on it; returns the subscription's short name."""
        ...

    def close(self, deployment_id: str) -> bool:
        """Delete the subscription; returns whether it existed (a missing one is not an error)."""
        ...


class SubscriptionIam(Protocol):
    """The allow policy of one Pub/Sub subscription (read-modify-write with its etag)."""

    def grant(self, subscription: str, role: str, member: str) -> bool:
        """Add ``member`` to ``role`` on ``subscription``; returns False when it already held it. ``CloudError``s."""
        ...


class SecretStore(Protocol):
    """Secret values by name (Secret Manager; a 0600 file store locally). Values are never logged."""

    def get(self, name: str) -> str | None: ...

    def put(self, name: str, value: str) -> str:
        """Store a new version; returns its version name (never the value)."""
        ...


@dataclass(frozen=True)
class SchedulerJob:
    """A cron job that publishes a message on a topic."""

    name: str
    schedule: str
    topic: str
    data: bytes
    paused: bool = False
    attributes: Mapping[str, str] = field(default_factory=dict)


class SchedulerApi(Protocol):
    """Cloud Scheduler (or the local ticker): jobs that publish on a cron."""

    def upsert_job(self, job: SchedulerJob) -> None: ...

    def get_job(self, name: str) -> SchedulerJob | None: ...

    def list_jobs(self, prefix: str = "") -> list[SchedulerJob]: ...

    def delete_job(self, name: str) -> None: ...

    def pause_job(self, name: str) -> None: ...

    def resume_job(self, name: str) -> None: ...


class TpuApi(Protocol):
    """Queued resources and nodes in one project. Every error is a classified ``CloudError``."""

    def create(self, request: ProvisionRequest) -> OperationStatus:
        """Ask for a slice; returns the (usually not done) operation. ALREADY_EXISTS raises CloudError."""
        ...

    def get_operation(self, name: str) -> OperationStatus: ...

    def get(self, zone: str, resource_id: str) -> ObservedResource | None:
        """None when the resource does not exist."""
        ...

    def list(self, zone: str = "-") -> list[ObservedResource]:
        """Every queued resource and bare node in ``zone`` (``-`` = all zones)."""
        ...

    def delete(
        self, zone: str, resource_id: str, *, force: bool, request_id: str | None = None
    ) -> OperationStatus | None:
        """Delete a resource (and with ``force`` its nodes). None when it was already gone."""
        ...

    def stop_node(self, zone: str, node_id: str) -> OperationStatus: ...

    def start_node(self, zone: str, node_id: str) -> OperationStatus: ...

    def guest_attributes(self, zone: str, node_id: str, query_path: str) -> Sequence[GuestAttribute]:
        """What the node's VM wrote under ``query_path`` (``tpuctl/``), every worker; [] when nothing yet.

        Untrusted text: read it through ``shared.domain.boot_progress``. NOT_FOUND raises when the node is gone.
        The service allows about 10 reads a minute per VM: read booting nodes only, once a tick.
        """
        ...


class CapacityAdvice(Protocol):
    """Compute Engine's capacity advice: where a request of this slice and tier is likely to be granted now."""

    def obtainability(self, accelerator: str, tier: Tier, zones: Sequence[str]) -> dict[str, float]:
        """Zone -> obtainability in [0, 1] for the zones the source scored. Never raises: when advice is
        unavailable (permission, API off, a beta error) the answer is ``{}`` and the search runs as without it."""
        ...


class WeightsCacheState(Protocol):
    """What a regional weights cache holds (Cloud Storage): the plan reports it and what keeping it costs."""

    def cached_bytes(self, bucket: str, repo_id: str) -> int:
        """Bytes of ``repo_id``'s files in ``bucket`` (0: none); a ``CloudError`` when the bucket cannot be read."""
        ...

    def compiled_bytes(self, bucket: str, repo_id: str, key: str) -> int | None:
        """Bytes of the compile cache entry ``key`` (shared.domain.compile_cache) of ``repo_id`` in ``bucket``;
        None when there is none a boot would restore; a ``CloudError`` when it cannot be read."""
        ...


class CalendarReservations(Protocol):
    """Calendar-mode future reservations (Compute Engine): where and when a window is free, booking it, its state
    and its release. Errors are classified ``CloudError``s (a refused booking names the field)."""

    def earliest_window(
        self, accelerator: str, zones: Sequence[str], *, days: int, not_before: datetime
    ) -> CalendarWindow | None:
        """The allowed zone with the earliest ``days``-long window for one slice of ``accelerator`` starting at or
        after ``not_before`` (within 120 days); None when no zone has one."""
        ...

    def book(self, name: str, accelerator: str, window: CalendarWindow, *, request_id: str) -> None:
        """Submit the future reservation ``name`` (its reservation has the same name) for ``window``. Booking a name
        that already exists with the same window is success (a retried insert); with another window it is refused."""
        ...

    def procurement(self, zone: str, name: str) -> str | None:
        """The booking's ``procurementStatus`` (PENDING_APPROVAL, APPROVED, FULFILLED, DECLINED, ...); None: gone."""
        ...

    def release(self, zone: str, name: str) -> None:
        """Delete the booking (and with it its reservation); a booking already gone is success."""
        ...

    def list_names(self, zones: Sequence[str]) -> list[tuple[str, str]]:
        """(zone, name) of every future reservation in ``zones`` (the janitor's orphan sweep)."""
        ...


class QuotaApi(Protocol):
    """Quota limits (the Cloud Quotas API). Usage is not here: it is counted from ``TpuApi.list``."""

    def list_limits(self, service: str = TPU_QUOTA_SERVICE) -> list[QuotaLimit]:
        """Every limit of ``service`` per zone, region or ``global``; errors are classified ``CloudError``s."""
        ...


LogSeverity = Literal["DEFAULT", "DEBUG", "INFO", "NOTICE", "WARNING", "ERROR", "CRITICAL", "ALERT", "EMERGENCY"]
LOG_SEVERITIES: tuple[str, ...] = get_args(LogSeverity)
LogSource = Literal["any", "controller", "node"]


@dataclass(frozen=True)
class LogQuery:
    """A bounded log read. Every field is a closed value, so no caller text ever reaches a filter expression."""

    deployment_id: str | None = None
    since: datetime | None = None
    min_severity: LogSeverity = "DEFAULT"
    source: LogSource = "any"  # controller: the functions; node: the TPU VM (vLLM, node agent, startup)
    limit: int = 50


@dataclass(frozen=True)
class LogEntry:
    """One log line as stored: untrusted text, to be sanitised before anyone reads it."""

    time: datetime | None
    severity: str
    source: str
    message: str
    deployment_id: str | None = None


class LogReader(Protocol):
    """Cloud Logging (google-cloud-logging), or the local stack's JSON-lines files."""

    def read(self, query: LogQuery) -> list[LogEntry]:
        """Newest first, at most ``query.limit`` entries."""
        ...


@dataclass(frozen=True)
class ModelChatRequest:
    """One chat completion against a deployment's OpenAI-compatible endpoint (vLLM)."""

    endpoint: str
    messages: tuple[tuple[str, str], ...]  # (role, content)
    max_tokens: int
    temperature: float = 0.0
    model: str | None = None  # None: the first model the endpoint lists
    api_key: str | None = field(default=None, repr=False)
    timeout_s: float = 30.0


@dataclass(frozen=True)
class ModelChat:
    """What a streamed chat returned, timed by the client.

    ``ttft_s`` runs from sending the request to the first chunk that carries content (the role chunk
    does not count); token counts come from the server's ``usage``, never from counting chunks.
    """

    model: str
    text: str
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    ttft_s: float | None
    last_token_s: float | None
    total_s: float
    content_chunks: int


@dataclass(frozen=True)
class ModelEndpointCheck:
    """A deep look at an endpoint: liveness, the served models, the server version, with latencies."""

    health_status: int | None
    health_ms: float | None
    models: tuple[str, ...] = ()
    max_model_len: int | None = None
    models_ms: float | None = None
    version: str | None = None
    problems: tuple[str, ...] = ()


class ModelClient(Protocol):
    """An OpenAI-compatible client for the deployed model. Errors are classified ``CloudError``s."""

    def chat(self, request: ModelChatRequest) -> ModelChat: ...

    def check(self, endpoint: str, api_key: str | None, timeout_s: float = 5.0) -> ModelEndpointCheck: ...


class ServingProbe(Protocol):
    """Looks at one vLLM server: ``/health``, ``/v1/models``, ``/version``, ``/metrics`` (parsed), and sends the
    monitor's canary completion when asked.

    Never raises for network trouble: refused, timeout, 401 and 5xx come back as outcomes in the result.
    Sends an API key to ``/v1/*`` only: ``deployment_id``'s own key (``shared.domain.serving_key``) when one is
    named, else the key it was built with (a vLLM reached directly, not through a serving proxy).
    """

    async def probe(self, base_url: str, deployment_id: str | None = None) -> ProbeResult: ...

    async def canary(self, base_url: str, model: str, deployment_id: str | None = None) -> CanaryCheck:
        """One tiny completion (``shared.domain.canary.canary_request``) with the same key rule as ``probe``;
        what the answer held, unjudged. Never raises for network trouble: it becomes the check's outcome."""
        ...


@dataclass(frozen=True)
class ContainerState:
    """The serving container as the engine sees it: ``status`` is Docker's (running, restarting, exited, ...)."""

    name: str
    status: str
    started_at: datetime | None  # None: never started
    pid: int | None = None
    image: str | None = None  # Config.Image: the reference it was created from
    command: tuple[str, ...] = ()  # Config.Cmd as it runs (the vllm argv after the startup script's wrappers)
    planned_command: tuple[str, ...] = ()  # the Cmd the startup script created it with (before any overrides)
    overrides: Mapping[str, Any] = field(default_factory=dict)  # the serving overrides it runs with ({}: planned)


class ServingContainer(Protocol):
    """The vLLM container on a node (Docker Engine API on a TPU VM, the local cloud's twin of it locally).

    Errors are classified: ``PermanentError`` when retrying cannot help (no such container, no engine socket),
    ``TransientError`` when it may (engine busy or failing).
    """

    def inspect(self) -> ContainerState: ...

    def restart(self, timeout_s: float) -> ContainerState:
        """Stop (SIGTERM, SIGKILL after ``timeout_s``) and start again; returns the state after the start."""
        ...

    def tail(self, lines: int) -> list[str]:
        """The newest ``lines`` lines of the container's log (stdout and stderr), oldest first."""
        ...

    def reconfigure(self, overrides: Mapping[str, Any], timeout_s: float) -> ContainerState:
        """Recreate the container with the serving ``overrides`` (``shared.domain.serving_overrides``) applied to
        the vllm argv it was planned with, everything else (image, entrypoint, env, labels, mounts, devices,
        network, restart policy) as it is; ``{}`` gives back exactly the planned argv. Stops the running one
        (SIGTERM, SIGKILL after ``timeout_s``) first; returns the state after the start (the engine may still be
        loading). Nothing is done when it already runs with that argv."""
        ...


@dataclass(frozen=True)
class EndpointTarget:
    """A deployment's vLLM as the controller recorded it, and the VM it runs on, for a way in from elsewhere.

    ``endpoint`` is reachable inside the VPC only (TPU VMs have no external IP). ``node`` is the slice's
    resource name: the TPU node id (Cloud TPU API) or the instance name (Compute Engine).
    """

    deployment_id: str
    endpoint: str
    zone: str
    node: str
    backend: Backend


class EndpointAccessError(CloudError):
    """The way to an endpoint could not be opened: ``field`` is what is at fault, ``fix`` what the operator does."""

    def __init__(self, error_class: ErrorClass, field: str, message: str, fix: str) -> None:
        super().__init__(error_class, message)
        self.field = field
        self.fix = fix


class EndpointAccess(Protocol):
    """How the gateway reaches a deployment's vLLM from where it runs (``TPUCTL_ENDPOINT_ACCESS``).

    Not configured (``direct``): the recorded URL as it is. ``iap``: an IAP TCP forwarding tunnel
    (``shared.adapters.iap_tunnel``). The API key never passes through here: it stays in the HTTP
    Authorization header the model client sends over whatever connection this opens.
    """

    def base_url(self, target: EndpointTarget) -> str:
        """A base URL that reaches ``target``'s vLLM from this process; raises ``EndpointAccessError``."""
        ...

    def close(self) -> None:
        """Stop whatever this opened (tunnel processes); safe to call twice."""
        ...


@dataclass(frozen=True)
class ContainerLogLine:
    """One line of a container's log as the engine stamped it: ``time_ns`` is nanoseconds since the epoch (UTC)."""

    time_ns: int
    text: str


class ContainerLogs(Protocol):
    """A container's log read forward (the Engine API's ``logs`` with ``since`` and ``timestamps``)."""

    def read_since(self, since_ns: int, *, max_lines: int) -> list[ContainerLogLine]:
        """Lines stamped at or after ``since_ns`` (0: from the start), oldest first, the oldest ``max_lines``."""
        ...


@dataclass(frozen=True)
class NodeLogLine:
    """A serving-container line ready to ship: cleaned and redacted text, its parsed severity, the engine's time."""

    time_ns: int
    severity: LogSeverity
    text: str


class LogSink(Protocol):
    """Where the node agent ships its serving container's lines, bound to one deployment and container.

    Cloud Logging on Google Cloud; on the embedded default nothing, since the container's log file is the log store
    there. ``write`` takes a whole batch or raises a classified ``CloudError``: ``INVALID`` means this batch will
    never be taken; anything else may pass later.
    """

    def write(self, lines: Sequence[NodeLogLine]) -> None: ...


class MetricWriter(Protocol):
    """Where the monitor's SLIs go as time series (``shared.domain.sli_metrics``): Cloud Monitoring's custom metrics on
    Google Cloud, a JSON-lines file under the data directory on the embedded default.

    ``write`` takes a batch of gauge points and raises a classified ``CloudError`` when they were not all taken:
    ``INVALID`` for points the API will never take (the same series written again within its sampling period,
    labels that are not the descriptor's), anything else may pass later. The monitor never lets a failure here
    stop a tick: the samples in the store stay the record.
    """

    def write(self, points: Sequence[MetricPoint]) -> None: ...


class DebugBundles(Protocol):
    """Where debug bundles are kept (``shared.domain.debug_bundle``): the installation's Cloud Storage bucket on
    Google Cloud, a directory on the embedded default. Names are ``bundle_object_name(...)``; a name is written
    once (a second write of the same name raises ``PermanentError``), so a bundle linked from a task never changes.

    Errors are classified ``CloudError``s: ``NOT_FOUND`` for a name with no object, ``PERMISSION`` when the caller's
    identity may not read or write the bucket, ``INVALID`` for a bundle over ``MAX_BUNDLE_BYTES``, ``TRANSIENT``
    for anything retrying may cure.
    """

    def put(self, name: str, data: bytes) -> str:
        """Store ``data`` (JSON) under ``name``; returns where a person finds it (``gs://bucket/name`` or a path)."""
        ...

    def get(self, name: str) -> bytes: ...

    def location(self, name: str) -> str:
        """Where ``name`` is, in the words a person uses for this store (no call is made)."""
        ...

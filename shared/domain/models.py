"""Typed values the whole controller shares: deployment specs, records kept in the state store.

Pure: no I/O, no clock. Every timestamp is passed in by the caller and is timezone-aware UTC.
Validation here is the single source of the allow-lists that commands are checked against.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, model_validator

from shared.domain.attempts import Step
from shared.domain.errors import ErrorClass

__all__ = [
    "ACCELERATOR_TYPES",
    "FINDING_LOG_KIND",
    "MODEL_PRESET_NAMES",
    "RUN_ID_PATTERN",
    "AcceleratorType",
    "AttemptLog",
    "Backend",
    "BenchmarkRun",
    "BootProgress",
    "BootStages",
    "CommandRecord",
    "DeploymentId",
    "DeploymentRecord",
    "DeploymentSpec",
    "DeploymentStatus",
    "Desired",
    "HealthThresholds",
    "Lease",
    "MonitorSample",
    "NodeState",
    "NodeTask",
    "Phase",
    "ProbeVerdict",
    "QueuedResourceState",
    "RejectedMessage",
    "ResourceRef",
    "ServingOptions",
    "SpotProbe",
    "Tier",
    "Zone",
    "ZoneMemoryEntry",
    "region_of",
    "utc",
]

ProbeVerdict = Literal["capacity", "quota", "inconclusive"]
"""What a spot probe found: no spot capacity (the wait is for capacity), spot granted at once (capacity exists, so the
wait is held by quota or entitlement), or neither (another error, or no answer in time)."""

_STRICT = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=False)

# Short enough that "{id}-g{generation}-a{attempt}" still fits TPU resource names (63 chars).
DEPLOYMENT_ID_PATTERN = r"^[a-z][-a-z0-9]{0,38}[a-z0-9]$"
ZONE_PATTERN = r"^[a-z]+-[a-z]+[0-9]+-[a-z0-9]{1,8}$"

RUN_ID_PATTERN = r"^[0-9a-f]{8}-[0-9a-f]{4}-[1-8][0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$"
"""A benchmark run's id: its command's id, a lower-case UUID (``shared.messages.contracts.UUID_PATTERN`` is this)."""

DeploymentId = Annotated[str, StringConstraints(pattern=DEPLOYMENT_ID_PATTERN)]
Zone = Annotated[str, StringConstraints(pattern=ZONE_PATTERN, max_length=40)]

ACCELERATOR_TYPES: tuple[str, ...] = (
    "v6e-1",
    "v6e-4",
    "v6e-8",
    "v5litepod-1",
    "v5litepod-4",
    "v5litepod-8",
    "v5p-8",
)
AcceleratorType = Literal["v6e-1", "v6e-4", "v6e-8", "v5litepod-1", "v5litepod-4", "v5litepod-8", "v5p-8"]

# Model presets the controller knows how to serve (the serving-plan catalog holds their details).
MODEL_PRESET_NAMES: tuple[str, ...] = (
    "gemma-4-e2b",
    "gemma-4-e4b",
    "gemma-4-12b",
    "gemma-4-26b-a4b",
    "gemma-4-31b",
    "tiny-llama",
)
ModelPreset = Literal["gemma-4-e2b", "gemma-4-e4b", "gemma-4-12b", "gemma-4-26b-a4b", "gemma-4-31b", "tiny-llama"]


def utc(value: datetime) -> datetime:
    """Reject naive datetimes: every time in the controller is UTC-aware."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("must be timezone-aware (UTC), e.g. 2026-12-02T15:00:00Z")
    return value


UtcDateTime = Annotated[datetime, AfterValidator(utc)]


def region_of(zone: str) -> str:
    """``us-east5-b`` -> ``us-east5``."""
    return zone.rsplit("-", 1)[0]


FINDING_LOG_KIND = "deployment.finding"
"""``jsonPayload.kind`` of the monitor's log entry when a finding appears (Terraform's finding alert matches it)."""


class Tier(StrEnum):
    """How capacity is bought, cheapest-to-lose first in Google's ladder."""

    RESERVATION = "reservation"
    FLEX_START = "flex_start"
    SPOT = "spot"
    ON_DEMAND = "on_demand"


class Backend(StrEnum):
    """Which Google API provisions the TPU VM. ``any`` is a spec choice only: the planner tries both
    (``shared.domain.backends.candidate_backends``); every resource and request names a concrete one."""

    TPU_API = "tpu-api"
    COMPUTE_ENGINE = "compute-engine"
    ANY = "any"


class Desired(StrEnum):
    """What the user asked for; only the command path writes it."""

    PRESENT = "present"
    STOPPED = "stopped"
    ABSENT = "absent"


class Phase(StrEnum):
    """Where a deployment is, as the controller last saw it; only reconcilers and monitors write it."""

    PENDING = "PENDING"
    SEARCHING = "SEARCHING"  # hunting for capacity: queued resources requested, none ACTIVE
    PROVISIONING = "PROVISIONING"  # capacity found, nodes being created
    BOOTING = "BOOTING"  # node READY, vLLM not answering yet
    COMPILING = "COMPILING"  # vLLM answering but not ready (load, XLA compile)
    SERVING = "SERVING"
    DEGRADED = "DEGRADED"
    STALLED = "STALLED"
    DOWN = "DOWN"
    STOPPING = "STOPPING"
    STOPPED = "STOPPED"
    DELETING = "DELETING"
    DELETED = "DELETED"
    FAILED = "FAILED"


LIVE_PHASES = frozenset(
    {
        Phase.PENDING,
        Phase.SEARCHING,
        Phase.PROVISIONING,
        Phase.BOOTING,
        Phase.COMPILING,
        Phase.SERVING,
        Phase.DEGRADED,
        Phase.STALLED,
        Phase.DOWN,
        Phase.STOPPING,
        Phase.DELETING,
    }
)


class QueuedResourceState(StrEnum):
    """Provider queued-resource states, normalised by the adapter (G6)."""

    CREATING = "CREATING"
    ACCEPTED = "ACCEPTED"
    WAITING = "WAITING_FOR_RESOURCES"
    PROVISIONING = "PROVISIONING"
    ACTIVE = "ACTIVE"
    FAILED = "FAILED"
    SUSPENDING = "SUSPENDING"
    SUSPENDED = "SUSPENDED"
    DELETING = "DELETING"
    UNKNOWN = "UNKNOWN"


class NodeState(StrEnum):
    """Provider node (TPU VM) states, normalised by the adapter."""

    CREATING = "CREATING"
    READY = "READY"
    RESTARTING = "RESTARTING"
    REPAIRING = "REPAIRING"
    STOPPING = "STOPPING"
    STOPPED = "STOPPED"
    STARTING = "STARTING"
    PREEMPTED = "PREEMPTED"
    TERMINATED = "TERMINATED"
    DELETING = "DELETING"
    UNKNOWN = "UNKNOWN"


class ServingOptions(BaseModel):
    """The vLLM knobs a user may set: structured values only, never a raw argument string. None: the plan's choice.

    The batching and caching knobs are the ones an auto-tune varies (``shared.domain.serving_overrides.TUNABLE``);
    ``preset`` names the tune run whose verified values they are (``shared.domain.autotune.VerifiedPreset``).
    """

    model_config = _STRICT

    max_model_len: int | None = Field(default=None, ge=256, le=131072, description="Context length in tokens.")
    max_num_seqs: int | None = Field(default=None, ge=1, le=1024, description="Concurrent sequences per engine.")
    kv_cache_dtype: Literal["auto", "fp8"] = Field(default="auto", description="KV cache element type.")
    gpu_memory_utilization: float = Field(default=0.90, ge=0.5, le=0.98, description="Share of HBM vLLM may use.")
    dtype: Literal["bfloat16", "fp8"] = Field(default="bfloat16", description="Weight dtype.")
    max_num_batched_tokens: int | None = Field(
        default=None, ge=64, le=131072, description="Tokens one engine step may schedule (the prefill chunk)."
    )
    block_size: Literal[16, 32, 64, 128] | None = Field(default=None, description="Tokens per KV-cache block.")
    prefix_caching: bool | None = Field(
        default=None, strict=True, description="vLLM's automatic prefix caching on or off."
    )
    preset: str | None = Field(
        default=None, pattern=RUN_ID_PATTERN, description="The tune run (its id) these values were verified by."
    )


class HealthThresholds(BaseModel):
    """When the monitor calls a deployment degraded, stalled or down, and when it heals (shared.domain.health)."""

    model_config = _STRICT

    boot_budget_s: float = Field(default=3600.0, gt=0, le=86400, description="No answer yet is BOOTING this long.")
    stall_after_s: float = Field(default=120.0, gt=0, le=3600, description="Running but no progress this long.")
    heal_after_s: float = Field(default=300.0, ge=0, le=86400, description="STALLED or DOWN this long: restart.")
    ttft_p90_max_s: float = Field(default=2.0, gt=0, le=600, description="TTFT p90 SLO of one interval.")
    itl_p90_max_s: float = Field(default=0.2, gt=0, le=60, description="Inter-token latency p90 SLO.")
    kv_cache_usage_max: float = Field(default=0.9, gt=0, le=1, description="KV cache share counted as saturated.")
    kv_saturated_after_s: float = Field(default=300.0, ge=0, le=86400, description="Saturated this long: DEGRADED.")
    queued_after_s: float = Field(default=120.0, ge=0, le=86400, description="Requests waiting this long: DEGRADED.")
    error_share_max: float = Field(default=0.05, ge=0, le=1, description="Share of error/abort finishes allowed.")
    headroom_min: float = Field(
        default=0.15, ge=0, le=1, description="Headroom (1 - max(KV use, running share)) under this: short of room."
    )
    headroom_ticks: int = Field(
        default=3, ge=1, le=60, description="Short of room or queueing this many samples in a row: a finding."
    )


class CalendarWindow(BaseModel):
    """A calendar-mode reservation's zone and period (shared.domain.calendar_mode)."""

    model_config = _STRICT

    zone: Zone
    start: UtcDateTime
    end: UtcDateTime

    @model_validator(mode="after")
    def _ordered(self) -> CalendarWindow:
        if self.end <= self.start:
            raise ValueError("calendar.end: must be after calendar.start")
        return self


class CalendarBooking(BaseModel):
    """The controller's booking of the spec's calendar window; kept until it is released or its period ended."""

    model_config = ConfigDict(extra="forbid")

    name: str  # the future reservation's and its reservation's name (calendar_mode.booking_name)
    window: CalendarWindow
    procurement: str = ""  # Compute Engine's procurementStatus as last read; GONE once it is not found
    booked_at: UtcDateTime
    checked_at: UtcDateTime | None = None
    released_at: UtcDateTime | None = None
    release_reason: str = ""


class DeploymentSpec(BaseModel):
    """What the user wants running. Immutable; a change is a new generation."""

    model_config = _STRICT

    deployment_id: DeploymentId
    model: ModelPreset = Field(description="Model preset name from the catalog.")
    accelerator: AcceleratorType = Field(description="TPU slice type, e.g. v6e-4.")
    alternative_accelerators: tuple[AcceleratorType, ...] = Field(
        default=(),
        max_length=4,
        description="Other slices the search may widen to, in order, when the first is scarce (each must fit "
        "the model at the chosen context; shared.domain.slice_ladder).",
    )
    zones: tuple[Zone, ...] = Field(min_length=1, max_length=32, description="Zones the search may use.")
    tiers: tuple[Tier, ...] = Field(
        default=(Tier.FLEX_START, Tier.SPOT, Tier.ON_DEMAND),
        min_length=1,
        max_length=4,
        description="Capacity tiers in priority order.",
    )
    backend: Backend = Backend.TPU_API
    hedge: int = Field(default=2, ge=1, le=4, description="Queued resources kept outstanding at once.")
    valid_until_minutes: int = Field(default=240, ge=5, le=1440, description="How long one request may wait.")
    max_run_hours: float = Field(default=4.0, gt=0, le=168, description="Flex-start run cap.")
    ttl_hours: float | None = Field(default=None, gt=0, le=720, description="Tear down after this long.")
    budget_usd: float | None = Field(default=None, gt=0, le=1_000_000, description="Tear down past this spend.")
    idle_minutes: int | None = Field(default=None, ge=5, le=10080, description="No requests for this long is idle.")
    on_idle: Literal["stop", "delete"] = "stop"
    reservation_name: str | None = Field(default=None, pattern=r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
    calendar: CalendarWindow | None = Field(
        default=None, description="A calendar-mode window the controller books and then consumes (confirmed)."
    )
    serving: ServingOptions = Field(default_factory=ServingOptions)
    health: HealthThresholds = Field(default_factory=HealthThresholds, description="Monitor thresholds.")
    prewarm: bool = Field(
        default=False,
        description="A builder, not a server: boot, compile, fill the region's compile cache, then tear down "
        "(shared.domain.compile_cache).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> DeploymentSpec:
        if len(set(self.zones)) != len(self.zones):
            raise ValueError("zones: each zone may appear once")
        if len(set(self.tiers)) != len(self.tiers):
            raise ValueError("tiers: each tier may appear once")
        ladder = (self.accelerator, *self.alternative_accelerators)
        if len(set(ladder)) != len(ladder):
            raise ValueError("alternative_accelerators: each slice may appear once, and not the accelerator itself")
        if Tier.RESERVATION in self.tiers and not self.reservation_name:
            raise ValueError("reservation_name: required when tiers include 'reservation'")
        if self.calendar is not None and (Tier.RESERVATION not in self.tiers or self.calendar.zone not in self.zones):
            raise ValueError("calendar: needs the 'reservation' tier and the window's zone among zones")
        if self.prewarm and (self.alternative_accelerators or self.ttl_hours is None):
            raise ValueError("prewarm: fills one slice's cache; give a ttl_hours backstop and no alternative slices")
        return self

    @property
    def chips(self) -> int:
        """Chips in one slice (v6e-4 -> 4). v5p names count TensorCores, two per chip (v5p-8 -> 4)."""
        family, count = self.accelerator.rsplit("-", 1)
        return int(count) // 2 if family == "v5p" else int(count)


class ResourceRef(BaseModel):
    """One provider resource the controller created or observed for a deployment."""

    model_config = ConfigDict(extra="forbid")

    name: str
    zone: str
    tier: Tier
    backend: Backend = Backend.TPU_API
    generation: int = Field(ge=0)
    attempt: int = Field(ge=0)
    state: QueuedResourceState = QueuedResourceState.UNKNOWN
    node_state: NodeState | None = None
    operation: str | None = None
    endpoint: str | None = None
    created_at: UtcDateTime | None = None
    active_at: UtcDateTime | None = None
    state_since: UtcDateTime | None = None  # when ``state`` last changed (stuck-provisioning detection)
    delete_requested_at: UtcDateTime | None = None  # set before the delete call; the ref leaves once gone
    wait_until: UtcDateTime | None = None  # capacity-check deadline while WAITING (None: its own valid-until)
    advice: float | None = None  # capacity advice's obtainability when it was asked for (None: no advice)
    probe: ProbeVerdict | None = None  # what a spot probe found holds this waiting request (shared.domain.spot_probe)
    accelerator: str | None = None  # the slice asked for (None: the spec's accelerator; shared.domain.slice_ladder)


class SpotProbe(BaseModel):
    """A spot create sent to tell what holds one of the deployment's waiting requests (shared.domain.spot_probe).

    Recorded before the create call (``confirmed`` False until the call returned), kept until the probe node is
    confirmed gone: ``verdict`` is set once the create failed or was granted, then the node is deleted at once.
    """

    model_config = ConfigDict(extra="forbid")

    name: str
    zone: str
    backend: Backend = Backend.TPU_API
    of: str  # the waiting request (ResourceRef.name) it probes for
    sent_at: UtcDateTime
    confirmed: bool = False
    operation: str | None = None
    verdict: ProbeVerdict | None = None
    delete_requested_at: UtcDateTime | None = None


class AttemptLog(BaseModel):
    """One step of the capacity search, kept for the status dashboard."""

    model_config = ConfigDict(extra="forbid")

    at: UtcDateTime
    zone: str
    tier: Tier
    outcome: Step | ErrorClass  # shared.domain.attempts: a planner step, or the error class that ended it
    detail: str = ""
    advice: float | None = None  # the request's capacity-advice obtainability (shared.domain.capacity_advice)


class BootStages(BaseModel):
    """How long each finished boot stage took on the VM's own clock (``tpuctl/stages``, shared.domain.boot_stages).

    ``seconds`` maps ``image``, ``weights``, ``engine`` (container start to health 200) and ``first_token`` (the
    first one-token completion after health) to seconds; the weights' source is ``cached`` (on the boot disk
    already), ``bucket`` (the region's weights cache), ``hub`` (downloaded) or ``mixed``, their size in bytes if
    known; ``compile_cache`` says whether compiled artefacts were on the disk when the engine started (``warm``);
    ``compile_restore`` what the shared compile cache gave before it (``hit``, ``miss``, ``refused``, ``local``,
    ``off``) and ``compile_fill`` what a prewarm builder put there after its first token.
    """

    model_config = ConfigDict(extra="forbid")

    seconds: dict[str, float] = Field(default_factory=dict)
    weights_source: Literal["cached", "bucket", "hub", "mixed"] | None = None
    weights_bytes: int | None = Field(default=None, ge=0)
    compile_cache: Literal["cold", "warm"] | None = None
    compile_restore: Literal["hit", "miss", "refused", "local", "off"] | None = None
    compile_fill: Literal["filled", "present", "empty", "denied", "off"] | None = None


class BootProgress(BaseModel):
    """What a booting node's startup script last reported (guest attributes ``tpuctl/*``), as the monitor read it.

    ``stage`` is one of the script's phases and ``detail`` its cleaned, bounded text (shared.domain.boot_progress);
    ``boot`` is the script run's start stamp (VM clock, ms), only ever compared with other stamps of ``node``.
    """

    model_config = ConfigDict(extra="forbid")

    node: str = Field(max_length=63)
    stage: str = Field(max_length=16)
    detail: str = Field(default="", max_length=300)
    boot: int = Field(default=0, ge=0)
    stage_since: UtcDateTime
    seen_at: UtcDateTime
    stages: BootStages | None = None  # this run's finished stages and their times (None: none reported yet)


class DeploymentStatus(BaseModel):
    """What the reconciler and monitor last observed."""

    model_config = ConfigDict(extra="forbid")

    phase: Phase = Phase.PENDING
    observed_generation: int = 0
    zone: str | None = None
    tier: Tier | None = None
    backend: Backend | None = None
    accelerator: str | None = None  # the slice granted (the spec's or an alternative: shared.domain.slice_ladder)
    search_since: UtcDateTime | None = None  # when this generation's search began (the slice ladder's clock)
    endpoint: str | None = None
    message: str = ""
    resources: list[ResourceRef] = Field(default_factory=list)
    attempts: list[AttemptLog] = Field(default_factory=list)
    next_attempt: int = 0
    probes: list[SpotProbe] = Field(default_factory=list)  # spot probes in flight (shared.domain.spot_probe)
    slis: dict[str, float] = Field(default_factory=dict)
    spend_usd: float = 0.0
    billed_until: UtcDateTime | None = None  # spend_usd covers ACTIVE time up to here
    phase_since: UtcDateTime | None = None
    serving_since: UtcDateTime | None = None
    last_request_at: UtcDateTime | None = None
    node_system: dict[str, Any] | None = None  # what the node agent reported at boot (OS, CPU, RAM, accelerator)
    boot: BootProgress | None = None  # the startup script's progress on the booting node (monitor-owned)
    findings: list[str] = Field(default_factory=list)  # monitor-owned warnings "<tag>: <text>" (FINDING_LOG_KIND)
    engine: dict[str, Any] | None = None  # what vLLM printed at start-up (shared.domain.engine_facts), monitor-owned
    calendar: CalendarBooking | None = None  # the booked calendar window (shared.domain.calendar_mode)


class DeploymentRecord(BaseModel):
    """The stored deployment: spec (command path) plus status (reconciler), versioned for CAS."""

    model_config = ConfigDict(extra="forbid")

    deployment_id: DeploymentId
    spec: DeploymentSpec
    generation: int = Field(default=1, ge=1)
    desired: Desired = Desired.PRESENT
    status: DeploymentStatus = Field(default_factory=DeploymentStatus)
    version: int = Field(default=0, ge=0, description="Bumped by the store on every write (compare-and-set).")
    created_at: UtcDateTime
    updated_at: UtcDateTime
    traceparent: str | None = Field(
        default=None,
        max_length=64,
        description="W3C trace context of the last command applied: the ticks' work for it joins its trace.",
    )

    @property
    def ttl_ends_at(self) -> datetime | None:
        """When the TTL tears it down: TTL hours from the create, or from a booked calendar window's start."""
        if self.spec.ttl_hours is None:
            return None
        began = self.created_at if self.spec.calendar is None else max(self.created_at, self.spec.calendar.start)
        return began + timedelta(hours=self.spec.ttl_hours)

    @property
    def live(self) -> bool:
        """True while the deployment may hold or be seeking paid resources."""
        return self.status.phase in LIVE_PHASES or (
            self.desired is not Desired.ABSENT and self.status.phase is not Phase.DELETED
        )


class CommandRecord(BaseModel):
    """The idempotency ledger entry for one command id."""

    model_config = ConfigDict(extra="forbid")

    command_id: str
    kind: str
    deployment_id: str | None
    status: Literal["accepted", "applied", "rejected", "failed"] = "accepted"
    outcome: str = ""
    received_at: UtcDateTime
    expire_at: UtcDateTime | None = None


class RejectedMessage(BaseModel):
    """A poison message, kept so an operator can see what was refused and why."""

    model_config = ConfigDict(extra="forbid")

    message_id: str
    field: str
    reason: str
    received_at: UtcDateTime
    size_bytes: int = 0
    source: str = ""


class Lease(BaseModel):
    """A lease on one name; ``epoch`` grows on every acquisition and fences stale holders."""

    model_config = ConfigDict(extra="forbid")

    name: str
    holder: str
    epoch: int = Field(ge=1)
    expires_at: UtcDateTime


class MonitorSample(BaseModel):
    """One probe of one deployment at one tick; expires via ``expire_at`` (Firestore TTL)."""

    model_config = ConfigDict(extra="forbid")

    deployment_id: str
    taken_at: UtcDateTime
    phase: Phase
    probe: str = ""  # ok | refused | timeout | unauthorized | server_error | ...
    slis: dict[str, float] = Field(default_factory=dict)
    counters: dict[str, Any] = Field(default_factory=dict)
    detail: str = ""
    expire_at: UtcDateTime | None = None


class BenchmarkRun(BaseModel):
    """One benchmark request and, once the node agent reports, its result."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    deployment_id: str
    status: Literal["requested", "dispatched", "running", "completed", "failed"] = "requested"
    request: dict[str, Any] = Field(default_factory=dict)
    result: dict[str, Any] | None = None
    plan: dict[str, Any] = Field(default_factory=dict)
    error: str = ""
    created_at: UtcDateTime
    updated_at: UtcDateTime


class NodeTask(BaseModel):
    """One container-control request to a deployment's node agent (restart vLLM, tail its log, capture a debug
    bundle) and its answer.

    ``task_id`` is the request's ``command_id``. ``dispatched_at`` stays None until the request is on the
    node-tasks topic, so a redelivery after a crash in between knows to publish it; ``lines`` hold the log tail
    (already scrubbed of control characters and secrets) for ``logs`` tasks; ``bundle`` names the debug bundle the
    node stored before a restart or on request (``shared.domain.debug_bundle``), empty when none was.
    """

    model_config = ConfigDict(extra="forbid")

    task_id: str = Field(min_length=1, max_length=100)
    deployment_id: str
    action: Literal["restart", "logs", "debug"]
    status: Literal["dispatched", "completed", "failed"] = "dispatched"
    reason: str = Field(default="", max_length=500)
    requested_at: UtcDateTime
    dispatched_at: UtcDateTime | None = None
    finished_at: UtcDateTime | None = None
    detail: str = Field(default="", max_length=2000)
    lines: tuple[str, ...] = Field(default=(), max_length=500)
    bundle: str = Field(default="", max_length=200)

    @property
    def finished(self) -> bool:
        """True once the node answered or the task was refused or timed out."""
        return self.status != "dispatched"


class ZoneMemoryEntry(BaseModel):
    """Learned availability for one (scope, key): cooldowns after stockouts, blocks after quota or permission.

    ``key`` is built by the planner, e.g. ``stockout/us-east5-b/v6e/spot`` or
    ``quota/region/us-east5/TPUV6EPreemptiblePerProjectPerRegionForTPUAPI``. Shared by all deployments.
    """

    model_config = ConfigDict(extra="forbid")

    key: str = Field(min_length=1, max_length=300)
    kind: Literal["cooldown", "block", "unsupported", "trust"]  # trust: how often an advice source was right
    error_class: str
    zone: str | None = None
    region: str | None = None
    tier: Tier | None = None
    quota_id: str | None = None
    reason: str = ""
    failures: int = Field(default=1, ge=0)
    successes: int = Field(default=0, ge=0)  # trust entries: calls the source got right
    until: UtcDateTime | None = None  # None = until cleared
    updated_at: UtcDateTime

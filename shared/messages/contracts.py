"""The message models and their codec.

Every message carries ``schema_version``, ``command_id`` (the idempotency key, a UUID made by the
sender), ``deployment_id`` and ``issued_at``. Models are closed (``extra="forbid"``) because agent
CLIs strip ``additionalProperties`` from schemas: the consumer enforces it.
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from shared.domain.errors import InvalidMessage
from shared.domain.models import RUN_ID_PATTERN, DeploymentId, DeploymentSpec, Phase, Tier, UtcDateTime

SCHEMA_VERSION: Literal["1"] = "1"
MAX_MESSAGE_BYTES = 64 * 1024
UUID_PATTERN = RUN_ID_PATTERN  # a command id: a lower-case UUID (a benchmark run's id is its command's)

_CLOSED = ConfigDict(extra="forbid", frozen=True)


def new_command_id() -> str:
    """A fresh idempotency key (UUIDv4, lower case)."""
    return str(uuid.uuid4())


SCHEDULED_JOB_ATTRIBUTE = "scheduled_job"
"""Attribute a Scheduler job puts on the command it publishes (its body repeats on every firing)."""
_SCHEDULED_NAMESPACE = uuid.UUID("3d6f2b1e-7c4a-4f5e-8b9d-2a1c0e6f4b37")


def scheduled_command_id(job: str, fired_at: datetime) -> str:
    """The command id of one firing of a Scheduler job: the same for every delivery within that minute."""
    minute = fired_at.astimezone(UTC).replace(second=0, microsecond=0)
    return str(uuid.uuid5(_SCHEDULED_NAMESPACE, f"{job}/{minute.isoformat()}"))


class _Envelope(BaseModel):
    model_config = _CLOSED

    schema_version: Literal["1"] = SCHEMA_VERSION
    command_id: str = Field(pattern=UUID_PATTERN, description="Idempotency key: a lower-case UUID.")
    issued_at: UtcDateTime


class _DeploymentMessage(_Envelope):
    deployment_id: DeploymentId


class CreateDeployment(_DeploymentMessage):
    """Store a new deployment's desired state (generation 1) and nudge the reconciler."""

    kind: Literal["deployment.create"] = "deployment.create"
    spec: DeploymentSpec

    @model_validator(mode="after")
    def _same_id(self) -> CreateDeployment:
        if self.spec.deployment_id != self.deployment_id:
            raise ValueError("spec.deployment_id: must equal deployment_id")
        return self


class UpdateDeployment(_DeploymentMessage):
    """Replace the spec (a new generation: make-before-break)."""

    kind: Literal["deployment.update"] = "deployment.update"
    spec: DeploymentSpec
    expected_generation: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _same_id(self) -> UpdateDeployment:
        if self.spec.deployment_id != self.deployment_id:
            raise ValueError("spec.deployment_id: must equal deployment_id")
        return self


class DeleteDeployment(_DeploymentMessage):
    """Desired state becomes absent: every resource is force-deleted and verified gone."""

    kind: Literal["deployment.delete"] = "deployment.delete"
    expected_generation: int | None = Field(default=None, ge=1)


class StopDeployment(_DeploymentMessage):
    """Release the TPU but keep the deployment record (a later start re-provisions)."""

    kind: Literal["deployment.stop"] = "deployment.stop"


class StartDeployment(_DeploymentMessage):
    """Bring a stopped deployment back."""

    kind: Literal["deployment.start"] = "deployment.start"


class RestartServing(_DeploymentMessage):
    """Restart the vLLM container on the node (healing, or a user's request)."""

    kind: Literal["serving.restart"] = "serving.restart"
    reason: str = Field(default="", max_length=500)


class TailServingLogs(_DeploymentMessage):
    """Ask the node for the last lines of the vLLM container's log (answered by ``node.task_completed``)."""

    kind: Literal["serving.logs"] = "serving.logs"
    lines: int = Field(default=100, ge=1, le=500, description="How many of the newest lines to return.")


class CaptureDebugBundle(_DeploymentMessage):
    """Ask the node for a debug bundle of the serving engine now, without restarting it (``shared.domain.debug_bundle``;
    answered by ``node.task_completed`` with the bundle's name). Every ``serving.restart`` captures one first too."""

    kind: Literal["serving.debug"] = "serving.debug"
    reason: str = Field(default="", max_length=500)


NODE_TASK_KINDS: tuple[str, ...] = ("serving.restart", "serving.logs", "serving.debug")
"""Commands the benchmark function records and dispatches to the deployment's node agent."""


MAX_TRACE_REQUESTS = 1000  # a benchmark.run command must stay under MAX_MESSAGE_BYTES
WORKLOADS = ("random", "shared_prefix", "multi_turn", "trace")


class TraceRequest(BaseModel):
    """One request of a replayed trace: when it arrives (seconds from any origin) and its lengths in tokens."""

    model_config = _CLOSED

    timestamp: float = Field(ge=0, le=1e10, description="Arrival time, seconds (only differences matter).")
    input_len: int = Field(ge=1, le=131072)
    output_len: int = Field(ge=1, le=32768)


class BenchmarkRequest(BaseModel):
    """What to measure. Bounded so a typo cannot run for hours."""

    model_config = _CLOSED

    mode: Literal["concurrency", "rate"] = "concurrency"
    concurrency: tuple[Annotated[int, Field(ge=1, le=1024)], ...] = Field(
        default=(1, 4, 16), min_length=1, max_length=16
    )
    request_rate: tuple[Annotated[float, Field(gt=0, le=10000)], ...] = Field(default=(), max_length=16)
    arrival: Literal["poisson", "constant"] = "poisson"
    endpoint: Literal["chat", "completions"] = "completions"
    num_prompts: int = Field(default=64, ge=1, le=10000)
    input_len: int = Field(default=256, ge=1, le=131072)
    output_len: int = Field(default=64, ge=1, le=32768)
    warmup_requests: int = Field(default=2, ge=0, le=100)
    duration_s: float | None = Field(default=None, gt=0, le=3600)
    slo_ttft_ms: float | None = Field(default=None, gt=0, le=600000)
    slo_tpot_ms: float | None = Field(default=None, gt=0, le=600000)
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    # Added for the load generator (loadgen); all optional with defaults, so older senders stay valid.
    max_concurrency: int | None = Field(
        default=None, ge=1, le=4096, description="Rate mode: cap on requests in flight (None: no cap)."
    )
    dataset: Literal["random", "prompts"] = Field(
        default="random", description="random: exact input_len tokens; prompts: the texts in 'prompts'."
    )
    prompts: tuple[Annotated[str, Field(min_length=1, max_length=32768)], ...] = Field(
        default=(), max_length=1000, description="Prompt texts for dataset 'prompts', used in order and cycled."
    )
    slo_e2el_ms: float | None = Field(default=None, gt=0, le=3600000)
    percentiles: tuple[Annotated[float, Field(gt=0, le=100)], ...] = Field(
        default=(50.0, 90.0, 95.0, 99.0), min_length=1, max_length=8
    )
    ignore_eos: bool = Field(default=True, description="Generate exactly output_len tokens (vLLM's ignore_eos).")
    temperature: float | None = Field(default=None, ge=0, le=2, description="None: the server's default.")
    request_timeout_s: float = Field(default=600.0, gt=0, le=3600)
    # Workloads (issue 22): all optional with defaults, so older senders stay valid.
    workload: Literal["random", "shared_prefix", "multi_turn", "trace"] = Field(
        default="random",
        description="random: distinct prompts; shared_prefix: a common prefix on prefix_share of the requests; "
        "multi_turn: sessions of 'turns' requests, each resending its history; trace: replay 'trace'.",
    )
    prefix_len: int = Field(default=0, ge=0, le=131072, description="shared_prefix: tokens of the common prefix.")
    prefix_share: float = Field(
        default=1.0, ge=0, le=1, description="shared_prefix: fraction of requests that carry the common prefix."
    )
    turns: int = Field(default=4, ge=2, le=64, description="multi_turn: requests per session, sent in order.")
    trace: tuple[TraceRequest, ...] = Field(
        default=(), max_length=MAX_TRACE_REQUESTS, description="trace: the requests to replay at their timestamps."
    )
    # Auto-tune (issue 22, item 5): trials of serving flags, each a max-rate-at-the-SLO search on a recreated vLLM.
    tune_trials: int = Field(
        default=0,
        ge=0,
        le=12,
        description="0: a plain run. N: the baseline then up to N-1 trials of serving flags (shared.domain.autotune).",
    )

    @model_validator(mode="after")
    def _mode_has_levels(self) -> BenchmarkRequest:
        self._check_workload()
        self._check_tune()
        if self.workload == "trace":
            return self  # one level at the trace's own timestamps: mode, levels and num_prompts do not apply
        if self.mode == "rate" and not self.request_rate:
            raise ValueError("request_rate: give at least one rate when mode is 'rate'")
        if self.dataset == "prompts" and not self.prompts:
            raise ValueError("prompts: give at least one prompt when dataset is 'prompts'")
        levels = len(self.request_rate) if self.mode == "rate" else len(self.concurrency)
        if levels * self.num_prompts > 50000:
            raise ValueError(
                f"num_prompts: {self.num_prompts} prompts x {levels} levels is over 50000 requests; lower num_prompts"
            )
        if self.mode == "rate" and self.duration_s is None:
            slowest = min(self.request_rate)
            if self.num_prompts / slowest > 3600:
                raise ValueError(
                    f"num_prompts: {self.num_prompts} requests at {slowest:g} req/s take over an hour; "
                    "lower num_prompts or set duration_s"
                )
        return self

    def _check_tune(self) -> None:
        """A tune judges each trial by its max rate at the SLO, so it needs an SLO and arrivals it can set."""
        if not self.tune_trials:
            return
        if self.slo_ttft_ms is None and self.slo_tpot_ms is None:
            raise ValueError("slo_ttft_ms: a tune needs an SLO (slo_ttft_ms and/or slo_tpot_ms) to judge trials by")
        if self.tune_trials < 2:
            raise ValueError("tune_trials: give at least 2 (the baseline and one trial)")
        if self.workload == "trace":
            raise ValueError("workload: a trace sets its own arrivals; tune with random, shared_prefix or multi_turn")

    def _check_workload(self) -> None:
        """Each workload's own settings: present where needed, absent where they would be ignored."""
        if self.workload != "random" and self.dataset == "prompts":
            raise ValueError(f"dataset: workload '{self.workload}' builds its own prompts; use dataset 'random'")
        if self.workload == "shared_prefix" and not 1 <= self.prefix_len < self.input_len:
            raise ValueError(
                f"prefix_len: {self.prefix_len} must be at least 1 and below input_len {self.input_len} "
                "(the rest of each prompt is its own text)"
            )
        if self.workload != "shared_prefix" and self.prefix_len:
            raise ValueError("prefix_len: only the shared_prefix workload has a prefix; set workload 'shared_prefix'")
        if self.workload == "trace":
            if not self.trace:
                raise ValueError(
                    "trace: give the trace's requests (timestamp, input_len, output_len) for workload 'trace'"
                )
            if self.request_rate or self.mode == "rate":
                raise ValueError("request_rate: a trace sets its own arrivals; leave mode and request_rate unset")
            span = max(entry.timestamp for entry in self.trace) - min(entry.timestamp for entry in self.trace)
            if span > 3600:
                raise ValueError(f"trace: its timestamps span {span:.0f} s, over an hour; replay a shorter window")
        elif self.trace:
            raise ValueError("trace: requests to replay need workload 'trace'")

    def trace_span_s(self) -> float:
        """Seconds from the trace's first arrival to its last (0 without a trace)."""
        if not self.trace:
            return 0.0
        return max(entry.timestamp for entry in self.trace) - min(entry.timestamp for entry in self.trace)

    def context_problem(self, max_model_len: int, owner: str) -> str | None:
        """Why this workload cannot fit ``owner``'s context of ``max_model_len`` tokens (field first), or None."""
        needed = self.needed_tokens()
        if self.dataset != "random" or needed <= max_model_len:
            return None
        if self.workload == "multi_turn":
            return (
                f"benchmark.turns: a session's last turn holds {self.turns} x (input_len {self.input_len} + "
                f"output_len {self.output_len}) = {needed} tokens, over {owner} max_model_len {max_model_len} "
                "(lower turns, input_len or output_len)"
            )
        if self.workload == "trace":
            return (
                f"benchmark.trace: its longest request needs {needed} tokens, over {owner} max_model_len "
                f"{max_model_len} (shorten that request in the trace)"
            )
        return (
            f"benchmark.input_len: input_len {self.input_len} + output_len {self.output_len} = {needed} tokens "
            f"exceed {owner} max_model_len {max_model_len} (lower one of them)"
        )

    def needed_tokens(self) -> int:
        """The most tokens (prompt and output) one request of this workload needs; a multi-turn session's last
        turn holds its history: every earlier turn's text and answer."""
        if self.workload == "trace":
            return max(entry.input_len + entry.output_len for entry in self.trace)
        if self.workload == "multi_turn":
            return self.turns * (self.input_len + self.output_len)
        return self.input_len + self.output_len


class RunBenchmark(_DeploymentMessage):
    """Run a benchmark on the deployment's node; ``command_id`` is the run id."""

    kind: Literal["benchmark.run"] = "benchmark.run"
    benchmark: BenchmarkRequest = Field(default_factory=BenchmarkRequest)


class ScheduleBenchmark(_DeploymentMessage):
    """Create, replace or (``cron`` = None) delete a deployment's scheduled benchmark."""

    kind: Literal["benchmark.schedule"] = "benchmark.schedule"
    cron: str | None = Field(default=None, pattern=r"^[0-9*/,\- ]{9,100}$")
    benchmark: BenchmarkRequest = Field(default_factory=BenchmarkRequest)


class ReconcileTick(_Envelope):
    """A Scheduler tick: reconcile every live deployment (or one, when ``deployment_id`` is set)."""

    kind: Literal["reconcile.tick"] = "reconcile.tick"
    deployment_id: DeploymentId | None = None
    purpose: Literal["reconcile", "monitor", "janitor"] = "reconcile"


class DeploymentObserved(_DeploymentMessage):
    """The reconciler recorded a new observation of a deployment."""

    kind: Literal["deployment.observed"] = "deployment.observed"
    phase: Phase
    zone: str | None = Field(default=None, max_length=40)
    tier: Tier | None = None
    detail: str = Field(default="", max_length=2000)


class PhaseChanged(_DeploymentMessage):
    """The monitor moved a deployment to another phase."""

    kind: Literal["deployment.phase_changed"] = "deployment.phase_changed"
    previous: Phase
    phase: Phase
    reason: str = Field(default="", max_length=2000)


class BenchmarkCompleted(_DeploymentMessage):
    """The node agent finished (or failed) a run; ``run_id`` is the request's command id."""

    kind: Literal["benchmark.completed"] = "benchmark.completed"
    run_id: str = Field(pattern=UUID_PATTERN)
    status: Literal["completed", "failed"]
    result: dict[str, Any] | None = None
    error: str = Field(default="", max_length=4000)


class NodeTaskCompleted(_DeploymentMessage):
    """The node agent carried out (or could not carry out) a node task; ``task_id`` is the request's command id."""

    kind: Literal["node.task_completed"] = "node.task_completed"
    task_id: str = Field(pattern=UUID_PATTERN)
    action: Literal["restart", "logs", "debug"]
    status: Literal["completed", "failed"]
    detail: str = Field(default="", max_length=2000)
    lines: tuple[Annotated[str, Field(max_length=2000)], ...] = Field(default=(), max_length=500)
    bundle: str = Field(
        default="", max_length=200, description="The debug bundle stored for this task (restart, debug), if any."
    )


class NodeBooted(_DeploymentMessage):
    """The node agent reports the machine it runs on (shown by the gateway's node details)."""

    kind: Literal["node.booted"] = "node.booted"
    node: str = Field(max_length=200)
    system: dict[str, Any] = Field(default_factory=dict)


Command = Annotated[
    CreateDeployment
    | UpdateDeployment
    | DeleteDeployment
    | StopDeployment
    | StartDeployment
    | RestartServing
    | TailServingLogs
    | CaptureDebugBundle
    | RunBenchmark
    | ScheduleBenchmark
    | ReconcileTick,
    Field(discriminator="kind"),
]
Event = Annotated[
    DeploymentObserved | PhaseChanged | BenchmarkCompleted | NodeTaskCompleted | NodeBooted,
    Field(discriminator="kind"),
]
Message = Annotated[
    CreateDeployment
    | UpdateDeployment
    | DeleteDeployment
    | StopDeployment
    | StartDeployment
    | RestartServing
    | TailServingLogs
    | CaptureDebugBundle
    | RunBenchmark
    | ScheduleBenchmark
    | ReconcileTick
    | DeploymentObserved
    | PhaseChanged
    | BenchmarkCompleted
    | NodeTaskCompleted
    | NodeBooted,
    Field(discriminator="kind"),
]

_MESSAGE_ADAPTER: TypeAdapter[Any] = TypeAdapter(Message)
KINDS: tuple[str, ...] = tuple(sorted(_MESSAGE_ADAPTER.json_schema()["discriminator"]["mapping"]))

_TOPICS = {
    "reconcile.tick": "ticks",
    "benchmark.run": "commands",
    "deployment.observed": "events",
    "deployment.phase_changed": "events",
    "benchmark.completed": "events",
    "node.task_completed": "events",
    "node.booted": "events",
}


def topic_for(message: BaseModel) -> str:
    """The logical topic a message travels on: commands, ticks or events."""
    return _TOPICS.get(str(getattr(message, "kind", "")), "commands")


def encode_message(message: BaseModel) -> bytes:
    """Compact UTF-8 JSON, the body published on the bus."""
    return message.model_dump_json(exclude_none=False).encode("utf-8")


def message_attributes(message: BaseModel) -> dict[str, str]:
    """Routing attributes (Pub/Sub filters and logs read these, never the body)."""
    attrs = {
        "kind": str(getattr(message, "kind", "")),
        "schema_version": str(getattr(message, "schema_version", SCHEMA_VERSION)),
        "command_id": str(getattr(message, "command_id", "")),
    }
    deployment_id = getattr(message, "deployment_id", None)
    if deployment_id:
        attrs["deployment_id"] = str(deployment_id)
    return attrs


def decode_message(data: bytes | str, *, max_bytes: int = MAX_MESSAGE_BYTES) -> Any:
    """Parse one message or raise exactly one :class:`InvalidMessage`; never anything else."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if len(raw) > max_bytes:
        raise InvalidMessage("<message>", f"is {len(raw)} bytes, over the {max_bytes}-byte limit", "send less data")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidMessage("<message>", "is not valid UTF-8", "encode the JSON body as UTF-8") from None
    try:
        payload = json.loads(text)
    except (ValueError, RecursionError):
        raise InvalidMessage("<message>", "is not valid JSON", "send one JSON object") from None
    if not isinstance(payload, dict):
        raise InvalidMessage("<message>", "is not a JSON object", "send one JSON object with a 'kind'")
    kind = payload.get("kind")
    if kind not in KINDS:
        raise InvalidMessage("kind", f"{_short(kind)} is not a known kind", "one of: " + ", ".join(KINDS))
    version = payload.get("schema_version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        raise InvalidMessage("schema_version", f"{_short(version)} is not supported", f"use {SCHEMA_VERSION!r}")
    try:
        return _MESSAGE_ADAPTER.validate_python(payload)
    except ValidationError as exc:
        raise _first_problem(exc, str(kind)) from None
    except (ValueError, TypeError, RecursionError) as exc:
        raise InvalidMessage("<message>", f"could not be validated: {type(exc).__name__}") from None


def _first_problem(exc: ValidationError, kind: str) -> InvalidMessage:
    error = exc.errors(include_url=False, include_input=False)[0]
    loc = [str(part) for part in error.get("loc", ())]
    if loc and loc[0] == kind:
        loc = loc[1:]
    field = ".".join(loc) or "<message>"
    problem = str(error.get("msg", "is invalid"))
    if problem.startswith("Value error, "):
        problem = problem[len("Value error, ") :]
    named = _NAMED_FIELD.match(problem)
    if named:  # our validators say "field: problem" for cross-field rules
        field = ".".join([*loc, named.group(1)])
        problem = named.group(2)
    fix = _FIXES.get(str(error.get("type", "")), "")
    return InvalidMessage(field, problem, fix)


_NAMED_FIELD = re.compile(r"^([a-z_][a-z0-9_.]*): (.+)$", re.DOTALL)


_FIXES = {
    "missing": "add the field",
    "extra_forbidden": "remove the field: messages are closed",
    "literal_error": "use one of the allowed values",
    "string_pattern_mismatch": "match the pattern shown",
    "greater_than_equal": "raise the value",
    "less_than_equal": "lower the value",
    "timezone_aware": "add a UTC offset, e.g. 2026-12-02T15:00:00Z",
}


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."

"""What several capabilities share: the ports, reading records, publishing commands, node tasks, redaction.

Each helper keeps the ``GatewayPorts`` and reads a port when it is used, not when it is built: the CLI, the
server and tests may rewire a port (``endpoint_access``, a store) after the core exists.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from mcp_client_gateway import bounds
from mcp_client_gateway.errors import GatewayError
from mcp_client_gateway.models import CommandAccepted
from shared.config import Settings
from shared.domain.catalog import ACCELERATORS
from shared.domain.cloud import accelerator_family
from shared.domain.errors import ControllerError, InvalidMessage, PermanentError
from shared.domain.models import DeploymentRecord, NodeTask, Phase, Tier
from shared.domain.node_task_rules import as_read
from shared.domain.prices import PRICE_TABLE_DATE, price_per_chip_hour, price_row
from shared.logging import register_secret
from shared.messages import decode_message, encode_message, message_attributes, new_command_id, topic_for
from shared.ports import (
    CalendarReservations,
    Clock,
    CommandBus,
    DebugBundles,
    EndpointAccess,
    LogReader,
    ModelClient,
    QuotaApi,
    SecretStore,
    StateStore,
    TpuApi,
    WeightsCacheState,
)

__all__ = [
    "SERVING_PHASES",
    "CommandPublisher",
    "GatewayPorts",
    "NodeTaskReader",
    "PriceLookup",
    "Pricing",
    "Published",
    "Records",
    "SecretRedaction",
    "clock_warning",
    "hourly_usd",
    "log",
    "pricing",
    "slice_chips",
]

log = logging.getLogger("mcp_client_gateway.core")  # the gateway's log lines keep the logger name they had

SERVING_PHASES = frozenset({Phase.SERVING, Phase.DEGRADED, Phase.STALLED})
_PUBLISHED_MEMORY = 1000
_NODE_TASKS_SHOWN = 10


class PriceLookup(Protocol):
    """The controller's price source (``shared.adapters.billing_catalog.PriceBook``, ``Runtime.prices``)."""

    source: str  # catalog | cache | table
    read_at: datetime | None
    warnings: list[str]

    def lookup(self, zone_or_region: str, tier: Tier, family: str = "v6e") -> tuple[float, str] | None: ...


@dataclass
class GatewayPorts:
    """What the gateway runs on. ``logs`` and ``model_client`` may be absent (those tools then say so);
    without ``endpoint_access`` live calls use the recorded endpoint URL as it is (``direct``)."""

    settings: Settings
    store: StateStore
    bus: CommandBus
    secrets: SecretStore
    clock: Clock
    logs: LogReader | None = None
    model_client: ModelClient | None = None
    quotas: QuotaApi | None = None
    tpu: TpuApi | None = None
    endpoint_access: EndpointAccess | None = None
    prices: PriceLookup | None = None
    """The Billing Catalog prices the controller uses; None: the dated table (said so in every result)."""
    debug_bundles: DebugBundles | None = None
    """Where node agents keep debug bundles; None: none is configured (tpu_observe(show='debug_bundle') then says
    so)."""
    calendar: CalendarReservations | None = None
    """Calendar-mode windows for the plan's quote and a confirmed booking; None: the plan says there is none."""
    weights_cache: WeightsCacheState | None = None
    """What the regional weights caches hold, for the plan; None: no cache is installed (TPUCTL_WEIGHTS_CACHE_*)."""
    closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        """Close what the ports builder opened (database files, clients)."""
        while self.closers:
            closer = self.closers.pop()
            try:
                closer()
            except Exception:  # closing must not hide the real outcome
                log.warning("closing a port failed", exc_info=True)


@dataclass(frozen=True)
class Published:
    kind: str
    deployment_id: str
    at: datetime


class Records:
    """Deployment records from the state store, refused by name when absent or not serving."""

    def __init__(self, ports: GatewayPorts) -> None:
        self.ports = ports

    def get(self, deployment_id: str, *, include_deleted: bool = False) -> DeploymentRecord:
        deployment_id = bounds.deployment_id(deployment_id)
        record = self.ports.store.get_deployment(deployment_id)
        if record is None or (not include_deleted and record.status.phase is Phase.DELETED):
            raise GatewayError(
                "not_found", "deployment_id", f"no deployment '{deployment_id}'", "list them with tpu_status"
            )
        return record

    def serving(self, deployment_id: str) -> DeploymentRecord:
        record = self.get(deployment_id)
        if record.status.phase not in SERVING_PHASES or not record.status.endpoint:
            raise GatewayError(
                "failed_precondition",
                "deployment_id",
                f"'{deployment_id}' is not serving (phase {record.status.phase.value})",
                f"wait until tpu_status(deployment_id='{deployment_id}') shows SERVING, or poll its command with "
                "tpu_status(command_id=ID)",
            )
        return record


class CommandPublisher:
    """Commands validated with the wire models, published with the deployment id as ordering key, and
    remembered (the last 1000) so a follow-up call can tell a published command from an unknown one."""

    def __init__(self, ports: GatewayPorts) -> None:
        self.ports = ports
        self._published: OrderedDict[str, Published] = OrderedDict()
        self._lock = threading.Lock()

    def published(self, command_id: str) -> Published | None:
        with self._lock:
            return self._published.get(command_id)

    def validated(self, body: dict[str, Any], command_id: str | None = None) -> Any:
        payload = {
            "command_id": command_id or new_command_id(),
            "issued_at": self.ports.clock.now().isoformat(),
            **body,
        }
        try:
            return decode_message(json.dumps(payload))
        except InvalidMessage as exc:
            field = exc.field[len("spec.") :] if exc.field.startswith("spec.") else exc.field
            field = field[len("benchmark.") :] if field.startswith("benchmark.") else field
            raise GatewayError(
                "invalid_argument", field, exc.problem, exc.fix or "see the tool's input schema"
            ) from None

    def publish(self, message: Any, next_step: str) -> CommandAccepted:
        settings = self.ports.settings
        logical = topic_for(message)
        topic = {
            "commands": settings.topic_commands,
            "ticks": settings.topic_ticks,
            "events": settings.topic_events,
        }[logical]
        try:
            message_id = self.ports.bus.publish(
                topic, encode_message(message), message_attributes(message), ordering_key=message.deployment_id
            )
        except PermanentError as exc:
            raise GatewayError(
                "unavailable",
                None,
                f"the command bus refused the publish ({type(exc).__name__})",
                "check that the controller is deployed (terraform) or the local stack is running",
            ) from None
        now = self.ports.clock.now()
        with self._lock:
            self._published[message.command_id] = Published(message.kind, message.deployment_id, now)
            while len(self._published) > _PUBLISHED_MEMORY:
                self._published.popitem(last=False)
        log.info(
            "published a command",
            extra={"command_id": message.command_id, "deployment_id": message.deployment_id, "kind": message.kind},
        )
        return CommandAccepted(
            command_id=message.command_id,
            kind=message.kind,
            deployment_id=message.deployment_id,
            topic=topic,
            message_id=message_id,
            published_at=now,
            next_step=next_step,
        )

    def command_id(self, command_id: str | None) -> str:
        if command_id is None:
            return new_command_id()
        return bounds.command_id(command_id, fix="omit it, or reuse one a tool returned")

    def duplicate(self, command_id: str, kind: str, deployment_id: str) -> CommandAccepted | None:
        """A retried command whose first delivery the controller already recorded: report it, publish nothing."""
        ledger = self.ports.store.get_command(command_id)
        if ledger is None:
            return None
        if ledger.kind != kind or ledger.deployment_id != deployment_id:
            raise GatewayError(
                "invalid_argument",
                "command_id",
                f"was already used for {ledger.kind} on {ledger.deployment_id}",
                "omit command_id to get a fresh one",
            )
        return CommandAccepted(
            command_id=command_id,
            kind=kind,
            deployment_id=deployment_id,
            topic=self.ports.settings.topic_commands,
            message_id="",
            published_at=ledger.received_at,
            duplicate=True,
            next_step=f"Already received by the controller; poll tpu_status(command_id='{command_id}').",
        )


class SecretRedaction:
    """Reads the two secrets once so their values are redacted from every log line the gateway returns."""

    def __init__(self, ports: GatewayPorts) -> None:
        self.ports = ports
        self._registered = False

    def register_known(self) -> None:
        """Read the two secrets once so their values are redacted from every log line we return."""
        if self._registered:
            return
        settings = self.ports.settings
        for name in (settings.hf_token_secret, settings.vllm_api_key_secret):
            try:
                register_secret(self.ports.secrets.get(name))
            except ControllerError:
                log.warning("could not read a secret for redaction", extra={"secret": name})
        self._registered = True


class NodeTaskReader:
    """Node tasks as read now: one unanswered past the node-task timeout reads as failed."""

    def __init__(self, ports: GatewayPorts) -> None:
        self.ports = ports

    def get(self, task_id: str) -> NodeTask | None:
        """A node task as read now: one unanswered past the node-task timeout reads as failed."""
        task = self.ports.store.get_node_task(task_id)
        return as_read(task, self.ports.clock.now(), self.ports.settings.node_task_timeout_s) if task else None

    def wait(self, task_id: str, seconds: float, poll_s: float = 0.2) -> NodeTask | None:
        """The task once the node answered it, or as it stands after ``seconds`` (None: not recorded yet)."""
        deadline = time.monotonic() + seconds
        task = self.get(task_id)
        while (task is None or not task.finished) and time.monotonic() < deadline:
            time.sleep(poll_s)
            task = self.get(task_id)
        return task

    def of(self, deployment_id: str) -> list[NodeTask]:
        now = self.ports.clock.now()
        timeout = self.ports.settings.node_task_timeout_s
        tasks = self.ports.store.list_node_tasks(deployment_id, limit=_NODE_TASKS_SHOWN)
        return [as_read(task, now, timeout) for task in tasks]


def slice_chips(accelerator: str) -> int:
    spec = ACCELERATORS.get(accelerator)
    if spec is None:
        raise GatewayError(
            "invalid_argument",
            "accelerator",
            f"'{accelerator}' is not in the catalog",
            "use one of " + ", ".join(ACCELERATORS),
        )
    return spec.chips


def hourly_usd(record: DeploymentRecord, prices: Pricing | None = None) -> float | None:
    """The slice's price per hour where it runs: at ``prices`` (``pricing(ports)``), else the dated table."""
    zone = record.status.zone
    tier = record.status.tier
    if not zone or tier is None:
        return None
    family = accelerator_family(record.spec.accelerator)
    price = prices.per_chip_hour(zone, tier, family) if prices else price_per_chip_hour(zone, tier, family)
    granted = record.status.accelerator or record.spec.accelerator  # a step-down's slice when one was granted
    return round(price * slice_chips(granted), 4) if price is not None else None


@dataclass(frozen=True)
class Pricing:
    """Prices from the controller's source, and the label results carry (``dated price table (...)`` when the
    Billing Catalog could not be read)."""

    label: str
    lookup: Callable[[str, Tier, str], tuple[float, str] | None]

    def per_chip_hour(self, zone_or_region: str, tier: Tier, family: str) -> float | None:
        found = self.lookup(zone_or_region, tier, family)
        return found[0] if found else None


def _dated(zone_or_region: str, tier: Tier, family: str) -> tuple[float, str] | None:
    row = price_row(zone_or_region, tier, family)
    return (row.usd_per_chip_hour, f"dated price table ({PRICE_TABLE_DATE.isoformat()}): {row.source}") if row else None


def pricing(ports: GatewayPorts) -> Pricing:
    """The prices the controller plans with (the Billing Catalog, ``Runtime.prices``), else the dated table."""
    dated = f"dated price table ({PRICE_TABLE_DATE.isoformat()})"
    if ports.prices is None:
        return Pricing(f"{dated}: this gateway has no Billing Catalog port", _dated)
    book = ports.prices
    try:
        source, read_at, warnings = book.source, book.read_at, list(book.warnings)
    except Exception as exc:  # a price source that cannot even be built must not fail a plan: the table answers
        log.warning("the Billing Catalog could not be read: %s", exc)
        return Pricing(f"{dated}: the Billing Catalog could not be read ({type(exc).__name__})", _dated)
    if source == "table" or read_at is None:
        return Pricing(f"{dated}: " + (warnings[0] if warnings else "the Billing Catalog was not read"), book.lookup)
    label = f"Cloud Billing Catalog (read {read_at:%Y-%m-%d %H:%M} UTC{', cached' if source == 'cache' else ''})"
    return Pricing(label + "".join(f"; {warning}" for warning in warnings), book.lookup)


def clock_warning(ports: GatewayPorts, ttl_hours: float | None) -> str | None:
    """A warning when the controller's clock runs faster than wall time (``time_scale`` above 1, e.g. the local
    stack's x60): a TTL then ends after ``ttl / scale`` wall time. None at wall-clock speed."""
    try:
        scale = float(getattr(ports.clock, "time_scale", 1.0))
    except Exception:  # a clock that cannot say its rate runs at wall speed as far as a warning goes
        return None
    if scale <= 1.0:
        return None
    text = f"the controller's clock runs x{scale:g} wall time"
    if ttl_hours is None:
        return text + ": TTLs, valid-until windows and run caps end that much sooner in wall time"
    wall_minutes = ttl_hours * 60 / scale
    wall = f"{wall_minutes:.3g} wall minutes" if wall_minutes < 120 else f"{wall_minutes / 60:.3g} wall hours"
    return f"{text}: a {ttl_hours:g} h TTL ends in {wall}"

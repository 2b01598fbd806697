"""The planner's vocabulary: the actions a plan is made of, the knobs it takes, how its requests are named.

Why separate from :mod:`shared.domain.planner`: this is the contract between the planner and whoever
executes or inspects a plan (the provisioner, the janitor, the benchmarks, the tests). It changes when
the provider's API or the record format does, not when a search rule does, and it reads without the
rules. Everything here is re-exported by :mod:`shared.domain.planner`.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field

from shared.domain.capacity_advice import AdvicePolicy
from shared.domain.cloud import (
    LABEL_DEPLOYMENT,
    LABEL_GENERATION,
    LABEL_MANAGED_BY,
    ProvisionRequest,
)
from shared.domain.models import DeploymentSpec, DeploymentStatus, ResourceRef, Tier, ZoneMemoryEntry
from shared.domain.slice_ladder import StepPolicy
from shared.domain.zone_memory import CloudFailure, MemoryPolicy

__all__ = [
    "LABEL_ATTEMPT",
    "MANAGED_BY",
    "Action",
    "CreateQueuedResource",
    "DeleteResource",
    "ForgetZone",
    "OperationOutcome",
    "PlannerPolicy",
    "RememberZone",
    "WriteStatus",
    "parse_resource_name",
    "provision_request",
    "request_id",
    "resource_name",
]

MANAGED_BY = "tpuctl"
LABEL_ATTEMPT = "tpuctl-attempt"
_REQUEST_NAMESPACE = uuid.UUID("6f1c5d1e-6b0e-4d59-9a57-3c1f4e0b7a21")
_NAME_SUFFIX = re.compile(r"-g([0-9]+)-a([0-9]+)$")


# ---------------------------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class RememberZone:
    """Store (create or replace) one zone-memory entry."""

    entry: ZoneMemoryEntry


@dataclass(frozen=True)
class ForgetZone:
    """Delete one zone-memory entry."""

    key: str


@dataclass(frozen=True)
class WriteStatus:
    """The deployment's new status; written (compare-and-set, fenced) before any API call."""

    status: DeploymentStatus


@dataclass(frozen=True)
class CreateQueuedResource:
    """Ask for one slice; the id and request id are deterministic, so repeating it is harmless."""

    request: ProvisionRequest
    reissue: bool = False


@dataclass(frozen=True)
class DeleteResource:
    """Force-delete one of our resources (observed with our label); gone is confirmed on a later tick."""

    zone: str
    name: str
    request_id: str
    reason: str
    force: bool = True


Action = RememberZone | ForgetZone | WriteStatus | CreateQueuedResource | DeleteResource


@dataclass(frozen=True)
class OperationOutcome:
    """What became of a create: its long-running operation, or the synchronous error of the call."""

    done: bool
    failure: CloudFailure | None = None


@dataclass(frozen=True)
class PlannerPolicy:
    """Knobs of the search. Durations in seconds."""

    memory: MemoryPolicy = field(default_factory=MemoryPolicy)
    advice: AdvicePolicy = field(default_factory=AdvicePolicy)
    """How far capacity advice may reorder the search (shared.domain.capacity_advice)."""
    step: StepPolicy = field(default_factory=StepPolicy)
    """When the search widens to the spec's alternative slices (shared.domain.slice_ladder)."""
    expectation_timeout_s: float = 900.0
    """A create recorded but never confirmed nor observed is dropped after this."""
    list_grace_s: float = 180.0
    """A create whose operation finished may take this long to show up in a list."""
    provisioning_stuck_s: float = 1200.0
    """PROVISIONING this long is "stuck" (not "waiting for chips"): it stops counting toward the hedge."""
    provisioning_give_up_s: float = 2700.0
    """PROVISIONING this long is abandoned: force-deleted and the pair cooled down."""
    capacity_check_minutes: float | None = 5.0
    """How long a request may sit in WAITING_FOR_RESOURCES before the search tries elsewhere: doubled for
    each time the pair came up empty, capped by the spec's valid_until_minutes. A request that found
    capacity (PROVISIONING) is never cut short. None: every request waits its full valid-until. With
    parking the check only paces how fast the search spreads over the pairs, so it is short (5 min: on
    the scarce-v6e benchmark the median time to ACTIVE is minutes lower than with 10, docs/benchmarks.md)."""
    park_after_check: int = 16
    """Up to this many requests past their capacity check stay queued ("parked": free while they wait, no
    longer counted toward the hedge) instead of being force-deleted, until their own valid-until or the
    first ACTIVE slice; the search moves on to the next pair meanwhile. 16 covers every pair of a typical
    spec (6 zones x 3 tiers) while bounding what one deployment keeps queued (where the provider counts
    waiting requests against quota, they hold it; a refusal then blocks that quota as usual).
    0: every checked request is force-deleted and its pair asked again after its cooldown."""
    waiting_overdue_s: float = 600.0
    """A request still queued this long past its own valid-until is given up (force-deleted)."""
    handover_s: float = 1800.0
    """Make-before-break: the old generation is deleted once the new one serves, or after this long."""
    tick_interval_s: float = 60.0
    """How often reconcile ticks come (the budget stop looks this far ahead)."""
    max_attempts: int = 500
    max_creates_per_plan: int = 4
    attempt_log_limit: int = 60
    runtime_version: str = "v2-alpha-tpuv6e"


# ------------------------------------------------------------------------------------------------ names


def resource_name(deployment_id: str, generation: int, attempt: int) -> str:
    """``{deployment}-g{generation}-a{attempt}``: deterministic, so a retried create finds its own slice."""
    return f"{deployment_id}-g{generation}-a{attempt}"


def parse_resource_name(name: str) -> tuple[int, int] | None:
    """``gemma-g2-a7`` -> (2, 7); None for names we did not make."""
    match = _NAME_SUFFIX.search(name)
    return (int(match.group(1)), int(match.group(2))) if match else None


def request_id(deployment_id: str, generation: int, attempt: int, verb: str) -> str:
    """UUIDv5 of (deployment, generation, attempt, verb): the same call always carries the same id."""
    return str(uuid.uuid5(_REQUEST_NAMESPACE, f"{deployment_id}/{generation}/{attempt}/{verb}"))


def provision_request(
    spec: DeploymentSpec, deployment: str, ref: ResourceRef, *, runtime_version: str, startup_script: str
) -> ProvisionRequest:
    """The create call for one ref: named, labelled and id'd so a repeat finds (or is) the same request."""
    return ProvisionRequest(
        resource_id=ref.name,
        node_id=ref.name,
        zone=ref.zone,
        accelerator=ref.accelerator or spec.accelerator,
        runtime_version=runtime_version,
        tier=ref.tier,
        request_id=request_id(deployment, ref.generation, ref.attempt, "create"),
        labels={
            LABEL_DEPLOYMENT: deployment,
            LABEL_GENERATION: str(ref.generation),
            LABEL_ATTEMPT: str(ref.attempt),
            LABEL_MANAGED_BY: MANAGED_BY,
        },
        valid_until_s=spec.valid_until_minutes * 60,
        max_run_s=int(spec.max_run_hours * 3600) if ref.tier is Tier.FLEX_START else None,
        reservation_name=spec.reservation_name if ref.tier is Tier.RESERVATION else None,
        startup_script=startup_script,
        backend=ref.backend,
    )

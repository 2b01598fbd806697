"""The provisioner's settings, its per-deployment result and the Scheduler job that ticks it (kept apart so the
provisioner module holds only its behaviour)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime

from shared.domain.models import Phase
from shared.domain.planner import PlannerPolicy
from shared.domain.ratelimit import TokenBucket
from shared.domain.spot_probe import ProbePolicy
from shared.messages import ReconcileTick, encode_message, message_attributes
from shared.ports import SchedulerJob

__all__ = ["TICK_JOB_NAME", "ProvisionerSettings", "ReconcileResult", "reconcile_tick_job"]

TICK_JOB_NAME = "tpuctl-reconcile-tick"
# Scheduler publishes the same body every time; ticks skip the command ledger and are aged by publish time.
_TICK_COMMAND_ID = "00000000-0000-4000-8000-7469636b0001"
_TICK_ISSUED_AT = datetime(2026, 1, 1, tzinfo=UTC)


def reconcile_tick_job(topic: str, *, name: str = TICK_JOB_NAME, schedule: str = "* * * * *") -> SchedulerJob:
    """The Scheduler job that publishes ``reconcile.tick`` on ``topic`` every minute."""
    tick = ReconcileTick(command_id=_TICK_COMMAND_ID, issued_at=_TICK_ISSUED_AT)
    return SchedulerJob(
        name=name, schedule=schedule, topic=topic, data=encode_message(tick), attributes=message_attributes(tick)
    )


@dataclass(frozen=True)
class ProvisionerSettings:
    """How the provisioner behaves; defaults suit Cloud Functions (540 s limit, one-minute ticks)."""

    holder: str = field(default_factory=lambda: f"provisioner-{uuid.uuid4().hex[:8]}")
    lease_ttl_s: float = 120.0
    create_bucket: TokenBucket = field(default_factory=lambda: TokenBucket.per_minute(60, burst=10))
    rate_limit_hold_s: float = 60.0
    tick_budget_s: float = 420.0
    """Stop starting deployment reconciles after this long in one tick (the function dies at 540 s)."""
    max_rounds: int = 3
    """Plans per reconcile: a synchronous refusal is failed over in the same invocation."""
    write_retries: int = 3
    planner: PlannerPolicy = field(default_factory=PlannerPolicy)
    janitor_grace_s: float = 900.0
    tick_job: SchedulerJob | None = None
    """The Scheduler job that publishes reconcile ticks; paused when nothing is live."""
    probe: ProbePolicy | None = None
    """Spot probes of waiting requests (shared.domain.spot_probe); None: no probes."""
    builder_service_account: str | None = None
    """The account prewarm builders run as, the only one that may write the compile cache; None: no prewarm."""


@dataclass
class ReconcileResult:
    """What one reconcile of one deployment did (for logs, tests and the tick summary)."""

    deployment_id: str
    phase: Phase | None = None
    created: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    skipped: str = ""
    message: str = ""

    def summary(self) -> str:
        if self.skipped:
            return f"{self.deployment_id}: skipped ({self.skipped})"
        parts = [f"{self.deployment_id}: {self.phase.value if self.phase else '?'}"]
        if self.created:
            parts.append(f"created {','.join(self.created)}")
        if self.deleted:
            parts.append(f"deleting {','.join(self.deleted)}")
        if self.failures:
            parts.append(f"refused {','.join(self.failures)}")
        return " ".join(parts)

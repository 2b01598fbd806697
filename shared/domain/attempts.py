"""What became of one capacity request, as the planner logs it: an enum and the one text table people read.

An attempt's outcome is either a ``Step`` (something the planner did or saw: requested, ACTIVE, preempted, ...)
or the ``ErrorClass`` of the provider error that ended it (stockout, quota, ...). The stored value is the
member's string, so records written before the enum existed read back unchanged.
"""

from __future__ import annotations

from enum import StrEnum

from shared.domain.errors import ErrorClass

__all__ = ["OUTCOME_TEXT", "AttemptOutcome", "Step", "outcome_text"]


class Step(StrEnum):
    """A step of the capacity search that is not a provider error."""

    REQUESTED = "requested"  # a create was sent
    ADOPTED = "adopted"  # found by label with no record of it
    ACTIVE = "active"  # capacity granted
    CHECKED = "checked"  # a capacity check found nothing
    PARKED = "parked"  # waiting out a backoff or a rate budget
    DELETING = "deleting"  # a delete was sent (hedge loser, teardown, replacement)
    DELETED = "deleted"  # confirmed gone
    CANCELLED = "cancelled"  # an unconfirmed create dropped
    EXPIRED = "expired"  # still queued at its valid-until
    GAVE_UP = "gave_up"  # still queued past its valid-until
    STUCK = "stuck"  # PROVISIONING for too long
    VANISHED = "vanished"  # no longer listed
    FAILED = "failed"  # failed after ACTIVE
    ENDED = "ended"  # a flex-start run reached its max run duration
    SUSPENDED = "suspended"  # suspended by a user action
    PREEMPTED = "preempted"  # spot capacity taken back
    HEDGE_LOST = "hedge_lost"  # a second slice came up; the first one is kept
    PROBE_SENT = "probe_sent"  # a spot probe was sent for a waiting request (shared.domain.spot_probe)
    PROBE_CAPACITY = "probe_capacity"  # the probe stocked out: the request waits for capacity
    PROBE_QUOTA = "probe_quota"  # the probe was granted: capacity exists, the request is held by quota
    PROBE_INCONCLUSIVE = "probe_inconclusive"  # another error, or no answer in time


AttemptOutcome = Step | ErrorClass

OUTCOME_TEXT: dict[Step | ErrorClass, str] = {
    Step.REQUESTED: "requested",
    Step.ADOPTED: "adopted",
    Step.ACTIVE: "ACTIVE",
    Step.CHECKED: "no capacity in a capacity check",
    Step.PARKED: "parked",
    Step.DELETING: "deleting",
    Step.DELETED: "deleted",
    Step.CANCELLED: "cancelled",
    Step.EXPIRED: "gave up: still queued at its valid-until (stockout)",
    Step.GAVE_UP: "gave up: still queued past its valid-until (stockout)",
    Step.STUCK: "stuck provisioning",
    Step.VANISHED: "vanished",
    Step.FAILED: "failed",
    Step.ENDED: "flex-start run ended",
    Step.SUSPENDED: "suspended",
    Step.PREEMPTED: "PREEMPTED",
    Step.HEDGE_LOST: "hedge lost",
    Step.PROBE_SENT: "spot probe sent",
    Step.PROBE_CAPACITY: "spot probe stocked out: waiting for capacity",
    Step.PROBE_QUOTA: "spot probe granted: held by quota, not capacity",
    Step.PROBE_INCONCLUSIVE: "spot probe inconclusive",
    ErrorClass.STOCKOUT: "stockout",
    ErrorClass.QUOTA_ZONE: "zone quota exhausted",
    ErrorClass.QUOTA_REGION: "region quota exhausted",
    ErrorClass.UNSUPPORTED: "not offered here",
    ErrorClass.PERMISSION: "permission denied",
    ErrorClass.RATE_LIMIT: "rate limited",
    ErrorClass.TRANSIENT: "transient error",
    ErrorClass.NOT_FOUND: "not found",
    ErrorClass.ALREADY_EXISTS: "already exists",
    ErrorClass.FAILED_PRECONDITION: "failed precondition",
    ErrorClass.INVALID: "invalid request",
    ErrorClass.UNKNOWN: "unknown error",
}


def outcome_text(outcome: Step | ErrorClass) -> str:
    """The words for an outcome (every member has a row: tests/unit/test_attempts.py)."""
    return OUTCOME_TEXT[outcome]

"""The demo's hunt summary: one line per zone and tier, saying how each request ended."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from localcloud.progress import describe_attempt, hunt_summary
from shared.domain.models import AttemptLog, Tier

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def attempt(minute: int, zone: str, tier: Tier, outcome: str, detail: str = "") -> AttemptLog:
    return AttemptLog(at=T0 + timedelta(minutes=minute), zone=zone, tier=tier, outcome=outcome, detail=detail)


def test_each_pair_says_why_it_ended_in_the_order_it_was_first_tried() -> None:
    attempts = [
        attempt(0, "us-central1-b", Tier.SPOT, "requested", "d-g1-a0"),
        attempt(0, "us-east5-b", Tier.SPOT, "requested", "d-g1-a1"),
        attempt(15, "us-central1-b", Tier.SPOT, "expired", "no more capacity in the zone"),
        attempt(15, "us-central1-b", Tier.SPOT, "deleting", "queued resource FAILED"),
        attempt(15, "us-central1-b", Tier.FLEX_START, "requested", "d-g1-a2"),
        attempt(16, "us-central1-b", Tier.FLEX_START, "unsupported", "FLEX_START is not supported"),
        attempt(16, "us-east5-a", Tier.SPOT, "requested", "d-g1-a3"),
        attempt(40, "us-east5-b", Tier.SPOT, "active", "ACTIVE after 40.0 min"),
        attempt(40, "us-east5-a", Tier.SPOT, "deleting", "capacity found in us-east5-b (spot)"),
        attempt(41, "us-east5-a", Tier.SPOT, "deleted", "confirmed gone"),
    ]
    assert hunt_summary(attempts) == [
        ("us-central1-b spot", 1, ["gave up: still queued at its valid-until (stockout)"]),
        ("us-east5-b spot", 1, ["ACTIVE"]),
        ("us-central1-b flex_start", 1, ["not offered here"]),
        ("us-east5-a spot", 1, ["hedge: dropped, capacity found in us-east5-b (spot)"]),
    ]


def test_an_attempt_reads_as_zone_tier_outcome_and_detail() -> None:
    assert describe_attempt(attempt(0, "us-east5-b", Tier.SPOT, "requested", "d-g1-a0")) == (
        "us-east5-b spot: requested d-g1-a0"
    )
    assert describe_attempt(attempt(5, "us-east5-b", Tier.SPOT, "preempted", "node PREEMPTED")) == (
        "us-east5-b spot: PREEMPTED (node PREEMPTED)"
    )

"""Capacity advice in the search: order candidates by where Compute Engine says a request is likely granted.

Why bounded: advice can be stale or wrong (docs/reference/capacity-advice.md), so it never excludes a pair and
never outranks zone memory's sweep order (pairs that already came up empty stay last). Within a sweep it
discounts a pair's ranking price by ``weight x obtainability``, where the weight grows only as far as the
source has earned: each attempt asked with advice teaches a hit (likely and granted, unlikely and empty) or a
miss, kept in zone memory under ``trust/advice/{source}``. At even odds or worse the weight is 0 and the
order is exactly today's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from shared.domain.backends import BackendCandidate
from shared.domain.models import Tier, ZoneMemoryEntry

__all__ = [
    "ADVICE_SOURCE",
    "AdvicePolicy",
    "AdviceScores",
    "advice_trust",
    "advice_weight",
    "learn_advice_trust",
    "order_by_advice",
    "trust_key",
]

ADVICE_SOURCE = "compute-advice"

AdviceScores = Mapping[tuple[str, Tier], float]
"""(zone, tier) -> obtainability in [0, 1] as the source gave it; a pair it did not score is absent."""


@dataclass(frozen=True)
class AdvicePolicy:
    """How far advice may move the order, and the prior a source starts with (hits and misses, pseudo-counts)."""

    max_weight: float = 0.8
    prior_hits: float = 2.0
    prior_misses: float = 1.0
    likely: float = 0.5
    """An obtainability at or above this is advice that the request will be granted."""


def trust_key(source: str = ADVICE_SOURCE) -> str:
    return f"trust/advice/{source}"


def advice_trust(memory: Mapping[str, ZoneMemoryEntry], policy: AdvicePolicy, source: str = ADVICE_SOURCE) -> float:
    """Share of the source's past calls that were right, with the prior mixed in."""
    entry = memory.get(trust_key(source))
    hits = (entry.successes if entry else 0) + policy.prior_hits
    misses = (entry.failures if entry else 0) + policy.prior_misses
    return hits / (hits + misses)


def advice_weight(memory: Mapping[str, ZoneMemoryEntry], policy: AdvicePolicy, source: str = ADVICE_SOURCE) -> float:
    """0 at even odds or worse (today's order), ``max_weight`` when the source has always been right."""
    edge = 2.0 * advice_trust(memory, policy, source) - 1.0
    return policy.max_weight * min(1.0, max(0.0, edge))


def order_by_advice(ranked: Sequence[BackendCandidate], advice: AdviceScores, weight: float) -> list[BackendCandidate]:
    """Reorder within each sweep (same remembered failures) by price discounted by trusted obtainability."""
    if weight <= 0.0 or not advice:
        return list(ranked)

    def key(item: BackendCandidate) -> tuple[int, float]:
        obtainability = advice.get((item.zone, item.tier), 0.5)
        return item.candidate.remembered_failures, round(item.score * (1.0 - weight * obtainability), 9)

    return sorted(ranked, key=key)


def learn_advice_trust(
    memory: Mapping[str, ZoneMemoryEntry],
    *,
    obtainability: float,
    granted: bool,
    now: datetime,
    policy: AdvicePolicy,
    source: str = ADVICE_SOURCE,
) -> ZoneMemoryEntry:
    """The source's trust entry after one attempt it scored was granted chips or came up empty."""
    key = trust_key(source)
    entry = memory.get(key)
    hits, misses = (entry.successes, entry.failures) if entry else (0, 0)
    if (obtainability >= policy.likely) == granted:
        hits += 1
    else:
        misses += 1
    return ZoneMemoryEntry(
        key=key,
        kind="trust",
        error_class="advice",
        reason=f"{source}: {hits} calls right, {misses} wrong",
        failures=misses,
        successes=hits,
        until=None,
        updated_at=now,
    )

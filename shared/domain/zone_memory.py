"""Zone memory: how provider errors become cooldowns and blocks, and how (zone, tier) pairs are ranked.

Pure: every function takes the memory (a mapping key -> entry) and ``now`` and returns new entries
or keys to forget; the caller stores them. Memory is shared by all deployments, so what one search
learns (a stockout in us-east5-b spot, a regional quota of 0) spares the others a failed attempt.

Scopes follow tpu-api.md §5.4:

=============  ==========================================  ===============================================
error class    key                                         effect
=============  ==========================================  ===============================================
stockout       ``stockout/{zone}/{family}/{tier}``         cooldown, doubling per failure, capped, expires
quota (zone)   ``quota/zone/{zone}/{pool}``                block that quota pool in the zone; rechecked
quota (region) ``quota/region/{region}/{pool}``            block every zone of the region for that pool
unsupported    ``unsupported/zone|accelerator|tier/...``   a catalogue fact: the pair is dropped for days
permission     ``permission/zone/{zone}`` or ``/project``  blocked until the configuration changes
rate limit     ``ratelimit/project``                       no creates anywhere for a minute; zones untouched
preemption     ``preempted/{region}/{family}/{tier}``      "eager next region": skip the region a while
unparsed       ``unknown/{zone}/{family}/{tier}``          one free retry, then a short cooldown
=============  ==========================================  ===============================================

Transient errors (5xx, timeouts) teach nothing: the same request is simply retried on the next tick.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from shared.domain.cloud import accelerator_family
from shared.domain.errors import CloudError, ErrorClass
from shared.domain.models import Tier, ZoneMemoryEntry, region_of
from shared.domain.prices import price_per_chip_hour

__all__ = [
    "RATE_LIMIT_KEY",
    "Candidate",
    "CloudFailure",
    "MemoryPolicy",
    "PriceFn",
    "blocking_entry",
    "estimated_price",
    "forget_on_success",
    "is_active",
    "learn",
    "learn_preemption",
    "learn_stuck",
    "prune",
    "quota_pool",
    "quota_released",
    "rank",
    "rate_limited_until",
    "remembered_failures",
    "stockout_key",
]

RATE_LIMIT_KEY = "ratelimit/project"

PriceFn = Callable[[str, Tier, str], float | None]
"""(zone or region, tier, accelerator or family) -> USD per chip-hour, or None when unknown."""

# When the table has no price for a pair, rank it as this share of the region's on-demand price
# (flex-start and spot list at roughly half and a quarter to a half of on-demand; tpu-api.md §8).
_TIER_PRICE_FACTOR = {Tier.RESERVATION: 0.7, Tier.FLEX_START: 0.5, Tier.SPOT: 0.45, Tier.ON_DEMAND: 1.0}
_DEFAULT_ON_DEMAND = 2.70
_QUOTA_SUFFIX = re.compile(r"PerProjectPer(Zone|Region)ForTPUAPI$", re.IGNORECASE)
_IN_REGION = re.compile(r"in region ([a-z]+-[a-z]+[0-9]+)\b")
_IN_ZONE = re.compile(r"in zone ([a-z]+-[a-z]+[0-9]+-[a-z0-9]+)\b")


@dataclass(frozen=True)
class MemoryPolicy:
    """How long each lesson lasts. Durations in seconds; ``None`` means until cleared."""

    stockout_base_s: float = 300.0
    stockout_max_s: float = 7200.0
    quota_recheck_s: float = 600.0
    quota_max_s: float = 3600.0
    unsupported_s: float = 7 * 86400.0
    invalid_s: float = 3600.0
    permission_s: float | None = None
    rate_limit_s: float = 60.0
    preempted_s: float = 1800.0
    stuck_base_s: float = 1800.0
    unknown_s: float = 300.0
    forget_after_s: float = 86400.0
    """An expired entry is kept this long (its failure count still ranks the pair lower), then dropped."""
    availability_penalty: float = 0.25
    """Each remembered failure of a pair raises its ranking price by this share."""


@dataclass(frozen=True)
class CloudFailure:
    """A classified provider error, as the planner needs it (a ``CloudError`` without the exception)."""

    error_class: ErrorClass
    message: str = ""
    quota_id: str | None = None
    location: str | None = None
    code: int | None = None
    surfaced: str = "sync"

    @classmethod
    def from_error(cls, error: CloudError) -> CloudFailure:
        return cls(
            error_class=error.error_class,
            message=error.message,
            quota_id=error.quota_id,
            location=error.location,
            code=error.code,
            surfaced=error.surfaced,
        )


@dataclass(frozen=True)
class Candidate:
    """One allowed (zone, tier) pair with the price it is ranked by."""

    zone: str
    tier: Tier
    price: float
    price_known: bool
    score: float
    remembered_failures: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)


def stockout_key(zone: str, family: str, tier: Tier) -> str:
    return f"stockout/{zone}/{family}/{tier.value}"


def quota_pool(quota_id: str) -> str:
    """``TPUV6EPreemptiblePerProjectPerRegionForTPUAPI`` -> ``TPUV6EPreemptible`` (zone and region share it)."""
    return _QUOTA_SUFFIX.sub("", quota_id.strip())


def _pools_for(family: str, tier: Tier) -> frozenset[str]:
    """Quota pools a request of this family and tier draws on (flex-start uses preemptible quota)."""
    base = "TPU" + family.upper()
    if tier in (Tier.SPOT, Tier.FLEX_START):
        return frozenset({(base + "Preemptible").lower()})
    if tier is Tier.ON_DEMAND:
        return frozenset({base.lower()})
    return frozenset()


def is_active(entry: ZoneMemoryEntry, now: datetime) -> bool:
    """True while the entry still blocks or cools its scope."""
    return entry.until is None or entry.until > now


def _entry(
    key: str,
    kind: Literal["cooldown", "block", "unsupported"],
    failure_class: str,
    now: datetime,
    duration_s: float | None,
    *,
    failures: int = 1,
    zone: str | None = None,
    region: str | None = None,
    tier: Tier | None = None,
    quota_id: str | None = None,
    reason: str = "",
) -> ZoneMemoryEntry:
    return ZoneMemoryEntry(
        key=key,
        kind=kind,
        error_class=failure_class,
        zone=zone,
        region=region,
        tier=tier,
        quota_id=quota_id,
        reason=reason[:500],
        failures=failures,
        until=None if duration_s is None else now + timedelta(seconds=duration_s),
        updated_at=now,
    )


def _next_failures(memory: Mapping[str, ZoneMemoryEntry], key: str) -> int:
    previous = memory.get(key)
    return previous.failures + 1 if previous is not None else 1


def _backoff(base_s: float, cap_s: float, failures: int) -> float:
    return float(min(cap_s, base_s * (2 ** min(failures - 1, 30))))


def learn(
    failure: CloudFailure,
    *,
    zone: str,
    tier: Tier,
    accelerator: str,
    memory: Mapping[str, ZoneMemoryEntry],
    now: datetime,
    policy: MemoryPolicy | None = None,
) -> ZoneMemoryEntry | None:
    """The memory entry a failed request in (zone, tier) teaches, or None when it teaches nothing."""
    policy = policy or MemoryPolicy()
    family = accelerator_family(accelerator)
    region = region_of(zone)
    cls = failure.error_class
    text = failure.message
    if cls in (ErrorClass.STOCKOUT, ErrorClass.FAILED_PRECONDITION):
        key = stockout_key(zone, family, tier)
        failures = _next_failures(memory, key)
        duration = _backoff(policy.stockout_base_s, policy.stockout_max_s, failures)
        return _entry(
            key,
            "cooldown",
            ErrorClass.STOCKOUT.value,
            now,
            duration,
            failures=failures,
            zone=zone,
            region=region,
            tier=tier,
            reason=text,
        )
    if cls in (ErrorClass.QUOTA_ZONE, ErrorClass.QUOTA_REGION):
        scope = "zone" if cls is ErrorClass.QUOTA_ZONE else "region"
        location = _quota_location(failure, scope, zone)
        pool = quota_pool(failure.quota_id) if failure.quota_id else f"tier-{tier.value}"
        key = f"quota/{scope}/{location}/{pool}"
        failures = _next_failures(memory, key)
        duration = _backoff(policy.quota_recheck_s, policy.quota_max_s, failures)
        return _entry(
            key,
            "block",
            cls.value,
            now,
            duration,
            failures=failures,
            zone=location if scope == "zone" else None,
            region=region_of(location) if scope == "zone" else location,
            tier=tier,
            quota_id=failure.quota_id,
            reason=text,
        )
    if cls is ErrorClass.UNSUPPORTED:
        lowered = text.lower()
        if "provisioning model" in lowered or "flex_start" in lowered:
            key = f"unsupported/tier/{zone}/{accelerator}/{tier.value}"
        elif "zone" in lowered and "not supported" in lowered:
            key = f"unsupported/zone/{zone}"
        else:
            key = f"unsupported/accelerator/{zone}/{accelerator}"
        return _entry(
            key, "unsupported", cls.value, now, policy.unsupported_s, zone=zone, region=region, tier=tier, reason=text
        )
    if cls is ErrorClass.INVALID:
        key = f"invalid/{zone}/{accelerator}/{tier.value}"
        return _entry(
            key,
            "block",
            cls.value,
            now,
            policy.invalid_s,
            failures=_next_failures(memory, key),
            zone=zone,
            region=region,
            tier=tier,
            reason=text,
        )
    if cls is ErrorClass.PERMISSION:
        if _is_location_permission(text, zone):
            key = f"permission/zone/{zone}"
            return _entry(key, "block", cls.value, now, policy.permission_s, zone=zone, region=region, reason=text)
        return _entry("permission/project", "block", cls.value, now, policy.permission_s, reason=text)
    if cls is ErrorClass.RATE_LIMIT:
        return _entry(
            RATE_LIMIT_KEY,
            "cooldown",
            cls.value,
            now,
            policy.rate_limit_s,
            failures=_next_failures(memory, RATE_LIMIT_KEY),
            reason=text,
        )
    if cls is ErrorClass.UNKNOWN:
        key = f"unknown/{zone}/{family}/{tier.value}"
        failures = _next_failures(memory, key)
        duration = 0.0 if failures == 1 else policy.unknown_s
        return _entry(
            key,
            "cooldown",
            cls.value,
            now,
            duration,
            failures=failures,
            zone=zone,
            region=region,
            tier=tier,
            reason=text,
        )
    return None  # TRANSIENT, NOT_FOUND, ALREADY_EXISTS: nothing to learn about the zone


def learn_preemption(
    *,
    zone: str,
    tier: Tier,
    accelerator: str,
    memory: Mapping[str, ZoneMemoryEntry],
    now: datetime,
    policy: MemoryPolicy | None = None,
) -> ZoneMemoryEntry:
    """A spot slice was preempted: skip its whole region for a while (SkyPilot's EAGER_NEXT_REGION)."""
    policy = policy or MemoryPolicy()
    family = accelerator_family(accelerator)
    region = region_of(zone)
    key = f"preempted/{region}/{family}/{tier.value}"
    failures = _next_failures(memory, key)
    duration = _backoff(policy.preempted_s, policy.stockout_max_s, failures)
    return _entry(
        key,
        "cooldown",
        "preempted",
        now,
        duration,
        failures=failures,
        zone=zone,
        region=region,
        tier=tier,
        reason=f"{tier.value} slice preempted in {zone}",
    )


def learn_stuck(
    *,
    zone: str,
    tier: Tier,
    accelerator: str,
    memory: Mapping[str, ZoneMemoryEntry],
    now: datetime,
    minutes: float,
    policy: MemoryPolicy | None = None,
) -> ZoneMemoryEntry:
    """Capacity was granted but nodes never came up (PROVISIONING cycling): cool the pair like a stockout."""
    policy = policy or MemoryPolicy()
    key = stockout_key(zone, accelerator_family(accelerator), tier)
    failures = _next_failures(memory, key)
    duration = _backoff(policy.stuck_base_s, policy.stockout_max_s, failures)
    return _entry(
        key,
        "cooldown",
        "stuck_provisioning",
        now,
        duration,
        failures=failures,
        zone=zone,
        region=region_of(zone),
        tier=tier,
        reason=f"stuck in PROVISIONING for {minutes:.0f} min",
    )


def _quota_location(failure: CloudFailure, scope: str, zone: str) -> str:
    if failure.location:
        location = failure.location
        if scope == "region" and location.count("-") >= 2:
            return region_of(location)
        return location
    match = (_IN_ZONE if scope == "zone" else _IN_REGION).search(failure.message)
    if match:
        return match.group(1)
    return zone if scope == "zone" else region_of(zone)


def _is_location_permission(text: str, zone: str) -> bool:
    """A denied location blocks one zone; a missing IAM permission (``Permission 'x' denied``) the project."""
    if re.search(r"permission '[a-z0-9_.]+' denied", text, re.IGNORECASE):
        return False
    lowered = text.lower()
    return "location_policy_violated" in lowered or "locations/" in lowered or "location " in lowered or zone in lowered


def _blocks(entry: ZoneMemoryEntry, zone: str, tier: Tier, accelerator: str) -> bool:
    parts = entry.key.split("/")
    family = accelerator_family(accelerator)
    region = region_of(zone)
    head = parts[0]
    if head in ("stockout", "unknown") and len(parts) == 4:
        return parts[1] == zone and parts[2] == family and parts[3] == tier.value
    if head == "preempted" and len(parts) == 4:
        return parts[1] == region and parts[2] == family and parts[3] == tier.value
    if head == "quota" and len(parts) == 4:
        scope, location, pool = parts[1], parts[2], parts[3]
        if (scope == "zone" and location != zone) or (scope == "region" and location != region):
            return False
        return pool.lower() in _pools_for(family, tier) or entry.tier == tier
    if head == "unsupported" and len(parts) >= 3:
        if parts[1] == "zone":
            return parts[2] == zone
        if parts[1] == "accelerator" and len(parts) == 4:
            return parts[2] == zone and parts[3] == accelerator
        if parts[1] == "tier" and len(parts) == 5:
            return parts[2] == zone and parts[3] == accelerator and parts[4] == tier.value
        return False
    if head == "invalid" and len(parts) == 4:
        return parts[1] == zone and parts[2] == accelerator and parts[3] == tier.value
    if head == "permission":
        return parts[1] == "project" or (len(parts) == 3 and parts[2] == zone)
    return False


def blocking_entry(
    memory: Mapping[str, ZoneMemoryEntry], zone: str, tier: Tier, accelerator: str, now: datetime
) -> ZoneMemoryEntry | None:
    """The active entry that keeps (zone, tier) out of the search, or None when the pair is allowed.

    When several apply, the one that lasts longest wins (it is the one worth reporting).
    """
    found: ZoneMemoryEntry | None = None
    for entry in memory.values():
        if not is_active(entry, now) or not _blocks(entry, zone, tier, accelerator):
            continue
        if found is None or (found.until is not None and (entry.until is None or entry.until > found.until)):
            found = entry
    return found


def rate_limited_until(memory: Mapping[str, ZoneMemoryEntry], now: datetime) -> datetime | None:
    """When creates may resume after a 429 rate limit, or None when they may go now."""
    entry = memory.get(RATE_LIMIT_KEY)
    if entry is None or not is_active(entry, now):
        return None
    return entry.until


def estimated_price(
    zone: str, tier: Tier, accelerator: str, price: PriceFn = price_per_chip_hour
) -> tuple[float, bool]:
    """USD per chip-hour for ranking, and whether it came from the table (False: estimated)."""
    family = accelerator_family(accelerator)
    known = price(zone, tier, family)
    if known is not None:
        return known, True
    on_demand = price(zone, Tier.ON_DEMAND, family)
    base = on_demand if on_demand is not None else _DEFAULT_ON_DEMAND
    return base * _TIER_PRICE_FACTOR[tier], False


def remembered_failures(memory: Mapping[str, ZoneMemoryEntry], zone: str, tier: Tier, accelerator: str) -> int:
    """Stockouts, unparsed errors and preemptions remembered for the pair (expired ones too, until pruned)."""
    total = 0
    for entry in memory.values():
        if entry.key.split("/")[0] in ("stockout", "unknown", "preempted") and _blocks(entry, zone, tier, accelerator):
            total += entry.failures
    return total


def rank(
    zones: Iterable[str],
    tiers: Iterable[Tier],
    accelerator: str,
    memory: Mapping[str, ZoneMemoryEntry],
    now: datetime,
    *,
    price: PriceFn = price_per_chip_hour,
    policy: MemoryPolicy | None = None,
) -> list[Candidate]:
    """Allowed pairs, best first: fewest remembered failures, then cheapest, then the user's order.

    Failures come first so the search sweeps every allowed pair before it asks again where it already
    came up empty (and each new sweep waits longer: see the planner's capacity check); within a sweep the
    cheapest pair goes first. Deterministic for the same memory.
    """
    policy = policy or MemoryPolicy()
    zone_list = list(zones)
    tier_list = list(tiers)
    ranked: list[tuple[int, float, int, int, Candidate]] = []
    for tier_index, tier in enumerate(tier_list):
        for zone_index, zone in enumerate(zone_list):
            if blocking_entry(memory, zone, tier, accelerator, now) is not None:
                continue
            usd, known = estimated_price(zone, tier, accelerator, price)
            failures = remembered_failures(memory, zone, tier, accelerator)
            score = usd * (1 + policy.availability_penalty * failures)
            notes = () if known else ("price estimated",)
            candidate = Candidate(zone, tier, usd, known, score, failures, notes)
            ranked.append((failures, round(score, 9), tier_index, zone_index, candidate))
    ranked.sort(key=lambda item: item[:4])
    return [item[4] for item in ranked]


def forget_on_success(memory: Mapping[str, ZoneMemoryEntry], zone: str, tier: Tier, accelerator: str) -> list[str]:
    """Capacity was granted in (zone, tier): its stockout and unparsed-error cooldowns no longer hold."""
    family = accelerator_family(accelerator)
    keys = (stockout_key(zone, family, tier), f"unknown/{zone}/{family}/{tier.value}")
    return [key for key in keys if key in memory]


def quota_released(memory: Mapping[str, ZoneMemoryEntry], zone: str) -> list[str]:
    """One of our slices in ``zone`` was deleted: quota blocks on its zone and region may have lifted."""
    region = region_of(zone)
    keys = []
    for key in memory:
        parts = key.split("/")
        if (
            parts[0] == "quota"
            and len(parts) == 4
            and ((parts[1] == "zone" and parts[2] == zone) or (parts[1] == "region" and parts[2] == region))
        ):
            keys.append(key)
    return keys


def prune(memory: Mapping[str, ZoneMemoryEntry], now: datetime, policy: MemoryPolicy | None = None) -> list[str]:
    """Keys of entries that expired long enough ago to be forgotten (their failure counts reset)."""
    policy = policy or MemoryPolicy()
    horizon = timedelta(seconds=policy.forget_after_s)
    return [key for key, entry in memory.items() if entry.until is not None and entry.until + horizon < now]

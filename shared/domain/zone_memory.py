"""Zone memory: how provider errors become cooldowns and blocks, and how (zone, tier) pairs are ranked.

Pure: every function takes the memory (a mapping key -> entry) and ``now`` and returns new entries
or keys to forget; the caller stores them. Memory is shared by all deployments, so what one search
learns (a stockout in us-east5-b spot, a regional quota of 0) spares the others a failed attempt.

Scopes follow docs/reference/tpu-api.md §5.4:

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
quota-bound    ``quotabound/{region}/{family}/{tier}``     a spot probe found a wait held by quota: ask
                                                           that tier elsewhere for a while (spot_probe)
unparsed       ``unknown/{zone}/{family}/{tier}``          one free retry, then a short cooldown
=============  ==========================================  ===============================================

Transient errors (5xx, timeouts) teach nothing: the same request is simply retried on the next tick.

What each error class teaches is one row of ``_LESSONS``; where a lesson depends on what the error is
about (which quota, which location, a zone vs an accelerator vs a tier), it reads the fields the adapter
set when it classified the error (``CloudFailure.scope``, ``quota_id``, ``location``), never message text.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from shared.domain.cloud import OperationStatus, accelerator_family
from shared.domain.errors import CloudError, ErrorClass, ErrorScope
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
    "learn_quota_bound",
    "learn_stuck",
    "prune",
    "quota_bound_key",
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
# (flex-start and spot list at roughly half and a quarter to a half of on-demand; docs/reference/tpu-api.md §8).
_TIER_PRICE_FACTOR = {Tier.RESERVATION: 0.7, Tier.FLEX_START: 0.5, Tier.SPOT: 0.45, Tier.ON_DEMAND: 1.0}
_DEFAULT_ON_DEMAND = 2.70
_QUOTA_SUFFIXES = ("perprojectperzonefortpuapi", "perprojectperregionfortpuapi")


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
    """A classified provider error, as the planner needs it (a ``CloudError`` without the exception).

    ``message`` is kept for people (it becomes the memory entry's ``reason``); what the planner acts on is
    ``error_class`` and the fields the adapter read from the error: ``scope``, ``quota_id``, ``location``.
    """

    error_class: ErrorClass
    message: str = ""
    quota_id: str | None = None
    location: str | None = None
    code: int | None = None
    surfaced: str = "sync"
    scope: ErrorScope | None = None

    @classmethod
    def from_error(cls, error: CloudError) -> CloudFailure:
        return cls(
            error_class=error.error_class,
            message=error.message,
            quota_id=error.quota_id,
            location=error.location,
            code=error.code,
            surfaced=error.surfaced,
            scope=error.scope,
        )

    @classmethod
    def from_operation(cls, op: OperationStatus) -> CloudFailure:
        """The failure of a finished operation (``op.error_class`` set), with the fields its adapter read."""
        assert op.error_class is not None
        return cls(
            error_class=op.error_class,
            message=op.error_message,
            location=op.error_location,
            code=op.error_code,
            surfaced="operation",
            scope=op.error_scope,
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
    name = quota_id.strip()
    for suffix in _QUOTA_SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name


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


@dataclass(frozen=True)
class _Situation:
    """A failed request, as a lesson reads it: the failure and the (zone, tier, accelerator) it hit."""

    failure: CloudFailure
    zone: str
    tier: Tier
    accelerator: str
    family: str
    region: str


@dataclass(frozen=True)
class _Place:
    """What a memory entry records about where it applies (beside its key)."""

    zone: str | None = None
    region: str | None = None
    tier: Tier | None = None
    quota_id: str | None = None


@dataclass(frozen=True)
class _Lesson:
    """What one error class teaches: the key it is remembered under, the kind of entry, how long it lasts
    (from the policy and the failure count), where it applies, and whether repeats are counted."""

    kind: Literal["cooldown", "block", "unsupported"]
    key: Callable[[_Situation], str]
    duration: Callable[[MemoryPolicy, int], float | None]
    place: Callable[[_Situation], _Place]
    counted: bool = True
    recorded_as: ErrorClass | None = None
    """The class the entry records; None: the failure's own."""


def _the_pair(s: _Situation) -> _Place:
    return _Place(zone=s.zone, region=s.region, tier=s.tier)


def _nowhere(s: _Situation) -> _Place:
    return _Place()


def _stockout_key(s: _Situation) -> str:
    return stockout_key(s.zone, s.family, s.tier)


def _quota_scope(s: _Situation) -> str:
    return "zone" if s.failure.error_class is ErrorClass.QUOTA_ZONE else "region"


def _quota_location(s: _Situation) -> str:
    """The zone or region the quota error names (the adapter's ``location``), else the request's own."""
    scope, location = _quota_scope(s), s.failure.location
    if location:
        return region_of(location) if scope == "region" and location.count("-") >= 2 else location
    return s.zone if scope == "zone" else s.region


def _quota_key(s: _Situation) -> str:
    pool = quota_pool(s.failure.quota_id) if s.failure.quota_id else f"tier-{s.tier.value}"
    return f"quota/{_quota_scope(s)}/{_quota_location(s)}/{pool}"


def _quota_place(s: _Situation) -> _Place:
    location = _quota_location(s)
    if _quota_scope(s) == "zone":
        return _Place(zone=location, region=region_of(location), tier=s.tier, quota_id=s.failure.quota_id)
    return _Place(region=location, tier=s.tier, quota_id=s.failure.quota_id)


# An unsupported error drops the pair its scope names: the zone, the accelerator in it, or one tier of it.
_UNSUPPORTED_KEYS: Mapping[ErrorScope | None, Callable[[_Situation], str]] = {
    ErrorScope.TIER: lambda s: f"unsupported/tier/{s.zone}/{s.accelerator}/{s.tier.value}",
    ErrorScope.ZONE: lambda s: f"unsupported/zone/{s.zone}",
}


def _unsupported_key(s: _Situation) -> str:
    default = f"unsupported/accelerator/{s.zone}/{s.accelerator}"
    make = _UNSUPPORTED_KEYS.get(s.failure.scope)
    return make(s) if make is not None else default


def _location_denied(s: _Situation) -> bool:
    return s.failure.scope is ErrorScope.ZONE


def _permission_key(s: _Situation) -> str:
    return f"permission/zone/{s.zone}" if _location_denied(s) else "permission/project"


def _permission_place(s: _Situation) -> _Place:
    return _Place(zone=s.zone, region=s.region) if _location_denied(s) else _Place()


_STOCKOUT = _Lesson(
    "cooldown",
    _stockout_key,
    lambda p, n: _backoff(p.stockout_base_s, p.stockout_max_s, n),
    _the_pair,
    recorded_as=ErrorClass.STOCKOUT,
)
_QUOTA = _Lesson("block", _quota_key, lambda p, n: _backoff(p.quota_recheck_s, p.quota_max_s, n), _quota_place)

_LESSONS: Mapping[ErrorClass, _Lesson | None] = {
    ErrorClass.STOCKOUT: _STOCKOUT,
    ErrorClass.FAILED_PRECONDITION: _STOCKOUT,
    ErrorClass.QUOTA_ZONE: _QUOTA,
    ErrorClass.QUOTA_REGION: _QUOTA,
    ErrorClass.UNSUPPORTED: _Lesson(
        "unsupported", _unsupported_key, lambda p, n: p.unsupported_s, _the_pair, counted=False
    ),
    ErrorClass.INVALID: _Lesson(
        "block", lambda s: f"invalid/{s.zone}/{s.accelerator}/{s.tier.value}", lambda p, n: p.invalid_s, _the_pair
    ),
    ErrorClass.PERMISSION: _Lesson(
        "block", _permission_key, lambda p, n: p.permission_s, _permission_place, counted=False
    ),
    ErrorClass.RATE_LIMIT: _Lesson("cooldown", lambda s: RATE_LIMIT_KEY, lambda p, n: p.rate_limit_s, _nowhere),
    ErrorClass.UNKNOWN: _Lesson(
        "cooldown",
        lambda s: f"unknown/{s.zone}/{s.family}/{s.tier.value}",
        lambda p, n: 0.0 if n == 1 else p.unknown_s,  # one free retry, then a short cooldown
        _the_pair,
    ),
    # The same request may pass next tick, or the error is bookkeeping: nothing to learn about the zone.
    ErrorClass.TRANSIENT: None,
    ErrorClass.NOT_FOUND: None,
    ErrorClass.ALREADY_EXISTS: None,
}


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
    situation = _Situation(failure, zone, tier, accelerator, accelerator_family(accelerator), region_of(zone))
    lesson = _LESSONS.get(failure.error_class)
    if lesson is None:
        return None
    key = lesson.key(situation)
    failures = _next_failures(memory, key) if lesson.counted else 1
    place = lesson.place(situation)
    return _entry(
        key,
        lesson.kind,
        (lesson.recorded_as or failure.error_class).value,
        now,
        lesson.duration(policy, failures),
        failures=failures,
        zone=place.zone,
        region=place.region,
        tier=place.tier,
        quota_id=place.quota_id,
        reason=failure.message,
    )


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


def learn_quota_bound(
    *, zone: str, tier: Tier, accelerator: str, now: datetime, duration_s: float, reason: str
) -> ZoneMemoryEntry:
    """A request of ``tier`` waits in ``zone`` although a spot probe there was granted: the wait is held by quota or
    entitlement, which a new request of that tier in the same region would share. Block the tier in the region."""
    key = quota_bound_key(zone, tier, accelerator)
    region = region_of(zone)
    return _entry(key, "block", "quota_bound", now, duration_s, region=region, zone=zone, tier=tier, reason=reason)


def quota_bound_key(zone: str, tier: Tier, accelerator: str) -> str:
    """The quota-bound block that covers (zone, tier): it is kept per region."""
    return f"quotabound/{region_of(zone)}/{accelerator_family(accelerator)}/{tier.value}"


def _blocks(entry: ZoneMemoryEntry, zone: str, tier: Tier, accelerator: str) -> bool:
    parts = entry.key.split("/")
    family = accelerator_family(accelerator)
    region = region_of(zone)
    head = parts[0]
    if head in ("stockout", "unknown") and len(parts) == 4:
        return parts[1] == zone and parts[2] == family and parts[3] == tier.value
    if head in ("preempted", "quotabound") and len(parts) == 4:
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
        ) or (parts[0] == "quotabound" and len(parts) == 4 and parts[1] == region):
            keys.append(key)
    return keys


def prune(memory: Mapping[str, ZoneMemoryEntry], now: datetime, policy: MemoryPolicy | None = None) -> list[str]:
    """Keys of entries that expired long enough ago to be forgotten (their failure counts reset)."""
    policy = policy or MemoryPolicy()
    horizon = timedelta(seconds=policy.forget_after_s)
    return [key for key, entry in memory.items() if entry.until is not None and entry.until + horizon < now]

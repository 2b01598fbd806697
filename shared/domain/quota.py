"""Which quota a TPU request spends, per back end: pure tables and the "all alternatives blocked" rule.

Why a module of its own: the two back ends count chips against different quotas, and learning about
one must not block the other (docs/reference/reference-agent.md §11: TPU API quota does not carry over to Compute
Engine).

==============  ==================================================  ======================================
back end        tier                                                pools spent, in order (any one will do)
==============  ==================================================  ======================================
tpu-api         spot, flex-start (preemptible per Google's docs)    ``TPUV6EPreemptible`` (zone and region)
tpu-api         on-demand                                           ``TPUV6E``
compute-engine  spot                                                ``PREEMPTIBLE-TPU-V6E-per-project-region``
compute-engine  flex-start                                          the preemptible pool first, then
                                                                    ``TPUS-PER-TPU-FAMILY-per-project-region``
                                                                    (tpu_family CT6E)
compute-engine  standard (on-demand)                                the TPU family pool
both            reservation                                         none (the reservation holds the chips)
==============  ==================================================  ======================================

Pools are the last part of a zone-memory quota key (``quota/region/us-east5/<pool>``). TPU API pools keep
the names :func:`shared.domain.zone_memory.quota_pool` gives them; Compute Engine pools carry a ``ce-``
prefix, so a TPU API quota block never matches a Compute Engine request and the other way round.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from shared.domain.catalog import ACCELERATORS
from shared.domain.cloud import ObservedResource, accelerator_family
from shared.domain.models import (
    Backend,
    DeploymentRecord,
    NodeState,
    QueuedResourceState,
    Tier,
    ZoneMemoryEntry,
    region_of,
)

__all__ = [
    "COMPUTE_FAMILY_QUOTA",
    "COMPUTE_POOL_PREFIX",
    "SLICE_CHIPS",
    "TPU_QUOTA_SERVICE",
    "UNLIMITED",
    "QuotaBound",
    "QuotaHeadroom",
    "QuotaLimit",
    "ScopeExclusion",
    "SearchScope",
    "compute_pool",
    "compute_quota_ids",
    "holds_tpu_quota",
    "parse_tpu_quota_id",
    "quota_alternatives",
    "quota_blocking_entry",
    "quota_headroom",
    "search_scope",
    "slice_chips",
    "tpu_family_of",
    "tpu_quota_id",
    "tpu_quota_usage",
    "usage_from_records",
    "zones_with_zone_limits",
]

COMPUTE_POOL_PREFIX = "ce-"
COMPUTE_FAMILY_QUOTA = "TPUS-PER-TPU-FAMILY-per-project-region"
_TPU_FAMILY = {"v6e": "CT6E", "v5litepod": "CT5LP", "v5e": "CT5LP", "v5p": "CT5P"}
_QUOTA_FAMILY = {"v5litepod": "V5E"}


def tpu_family_of(accelerator: str) -> str:
    """``v6e-4`` -> ``CT6E``: the ``tpu_family`` dimension of Compute Engine's TPU family quota."""
    family = accelerator_family(accelerator)
    return _TPU_FAMILY.get(family, f"CT{family.upper().lstrip('V')}")


def _preemptible_quota(accelerator: str) -> str:
    family = accelerator_family(accelerator)
    return f"PREEMPTIBLE-TPU-{_QUOTA_FAMILY.get(family, family.upper())}-per-project-region"


def compute_quota_ids(accelerator: str, tier: Tier) -> tuple[str, ...]:
    """Compute Engine quota limit names a request spends, in the order Compute Engine tries them."""
    if tier is Tier.SPOT:
        return (_preemptible_quota(accelerator),)
    if tier is Tier.FLEX_START:
        return (_preemptible_quota(accelerator), COMPUTE_FAMILY_QUOTA)
    if tier is Tier.ON_DEMAND:
        return (COMPUTE_FAMILY_QUOTA,)
    return ()


def compute_pool(quota_id: str | None, accelerator: str, tier: Tier) -> str:
    """The zone-memory pool for a Compute Engine quota error; an unnamed quota blocks the whole tier."""
    if not quota_id:
        return f"{COMPUTE_POOL_PREFIX}tier-{tier.value}"
    name = quota_id.strip()
    if name.upper().startswith("TPUS-PER-TPU-FAMILY"):
        return f"{COMPUTE_POOL_PREFIX}tpus-per-tpu-family-{tpu_family_of(accelerator).lower()}"
    name = name.removesuffix("-per-project-region").removesuffix("-per-project-zone")
    return f"{COMPUTE_POOL_PREFIX}{name.lower()}"


def quota_alternatives(backend: Backend, accelerator: str, tier: Tier) -> tuple[str, ...]:
    """Pools a request may spend (any one with headroom will do), lower-case; empty: never quota-blocked."""
    if backend is Backend.COMPUTE_ENGINE:
        return tuple(compute_pool(quota_id, accelerator, tier) for quota_id in compute_quota_ids(accelerator, tier))
    base = "tpu" + accelerator_family(accelerator)
    if tier in (Tier.SPOT, Tier.FLEX_START):
        return (base + "preemptible",)
    if tier is Tier.ON_DEMAND:
        return (base,)
    return ()


def _active(entry: ZoneMemoryEntry, now: datetime) -> bool:
    return entry.until is None or entry.until > now


def quota_blocking_entry(
    memory: Mapping[str, ZoneMemoryEntry], zone: str, tier: Tier, accelerator: str, backend: Backend, now: datetime
) -> ZoneMemoryEntry | None:
    """The quota block that keeps a request out, or None.

    A request is blocked only when every pool it may spend is blocked in its zone or region (flex-start
    on Compute Engine falls back from the preemptible pool to the family pool); the block reported is
    the one that lifts last.
    """
    alternatives = quota_alternatives(backend, accelerator, tier)
    if not alternatives:
        return None
    whole_tier = f"{COMPUTE_POOL_PREFIX}tier-{tier.value}" if backend is Backend.COMPUTE_ENGINE else None
    region = region_of(zone)
    blocked: dict[str, ZoneMemoryEntry] = {}
    for entry in memory.values():
        parts = entry.key.split("/")
        if parts[0] != "quota" or len(parts) != 4 or not _active(entry, now):
            continue
        scope, location, pool = parts[1], parts[2], parts[3].lower()
        if (scope == "zone" and location != zone) or (scope == "region" and location != region):
            continue
        if pool == whole_tier:
            return entry
        if pool in alternatives:
            current = blocked.get(pool)
            if current is None or (current.until is not None and (entry.until is None or entry.until > current.until)):
                blocked[pool] = entry
    if len(blocked) < len(alternatives):
        return None
    entries = list(blocked.values())
    forever = [entry for entry in entries if entry.until is None]
    if forever:
        return forever[0]
    return max(entries, key=lambda entry: entry.until or now)


# ---------------------------------------------------------------------------------------------- live quota
#
# The Cloud Quotas API gives each TPU API quota's *limit* per zone or region; usage is not in it (Google serves
# that from Cloud Monitoring), so it is counted here from the TPU API's own list of nodes and queued resources.
# A zone's headroom for a tier is the smaller of its zone headroom and its region headroom: the two limits
# bind independently (docs/reference/tpu-api.md §5.2: zone headroom with a region limit of 0 still gets a 429).

TPU_QUOTA_SERVICE = "tpu.googleapis.com"
UNLIMITED = -1  # the Cloud Quotas API's value for "no limit"

# Slice shapes per family, in chips (v6e: 1 chip per host up to 8, then multi-host pods).
SLICE_CHIPS: Mapping[str, tuple[int, ...]] = {
    "v6e": (1, 4, 8, 16, 32, 64, 128, 256),
    "v5litepod": (1, 4, 8, 16, 32, 64, 128, 256),
}
_QUOTA_ID_PREFIX = {"v6e": "TPUV6E", "v5litepod": "TPUV5sLitepod", "v5p": "TPUV5P", "v4": "TPUV4"}
_CORES_PER_CHIP = {"v2": 2, "v3": 2, "v4": 2, "v5p": 2}
_TPU_QUOTA_ID = re.compile(
    r"^(?P<prefix>TPU[A-Za-z0-9]+?)(?P<preemptible>Preemptible)?PerProjectPer(?P<scope>Zone|Region)ForTPUAPI$"
)
# A node holds its chips from creation until it is gone; a preempted spot node is kept and still holds them
# (docs/reference/tpu-api.md §3.4). A queued resource without a node holds nothing until it provisions.
_HOLDING_QR_STATES = frozenset({QueuedResourceState.PROVISIONING, QueuedResourceState.ACTIVE})


@dataclass(frozen=True)
class QuotaLimit:
    """One limit read from the Cloud Quotas API: a quota id at one zone, region or ``global``.

    ``value`` is in chips (``UNLIMITED`` = -1 means no limit). ``default`` marks a dimensions entry without
    its own location (it applies wherever no specific entry exists), so a specific entry wins over it.
    """

    quota_id: str
    location: str
    value: int
    default: bool = False


@dataclass(frozen=True)
class QuotaBound:
    """A limit that applies to one zone and tier, with the chips in use against it."""

    quota_id: str
    scope: str  # zone | region
    location: str
    limit: int  # chips; UNLIMITED = no limit
    in_use: int | None  # None: usage could not be read

    @property
    def headroom(self) -> int | None:
        """Chips still free under this limit; None when unlimited or usage is unknown."""
        if self.limit == UNLIMITED or self.in_use is None:
            return None
        return max(self.limit - self.in_use, 0)


@dataclass(frozen=True)
class QuotaHeadroom:
    """What the live quota leaves for one zone and tier.

    ``listed`` is False when the API lists no limit for either quota id here (the tier's quota is then
    unknown, not free). ``headroom_chips`` is None when every listed limit is unlimited or usage is unknown.
    """

    zone: str
    tier: Tier
    quota_ids: tuple[str, ...]
    bounds: tuple[QuotaBound, ...]
    headroom_chips: int | None
    slices_that_fit: tuple[str, ...]
    usage_known: bool

    @property
    def listed(self) -> bool:
        return bool(self.bounds)

    def fits(self, chips: int) -> bool | None:
        """Whether a slice of ``chips`` fits: None when the quota is not listed or usage is unknown."""
        if not self.listed or not self.usage_known:
            return None
        return self.headroom_chips is None or self.headroom_chips >= chips


def slice_chips(accelerator: str) -> int:
    """Chips in a slice: ``v6e-8`` -> 8; ``v5p-8`` -> 4 (v2-v5p names count TensorCores, two per chip)."""
    known = ACCELERATORS.get(accelerator)
    if known is not None:
        return known.chips
    family, _, size = accelerator.rpartition("-")
    if not family or not size.isdigit() or int(size) <= 0:
        raise ValueError(f"accelerator: {accelerator!r} is not a slice name like v6e-4")
    return max(int(size) // _CORES_PER_CHIP.get(family, 1), 1)


def tpu_quota_id(family: str, *, preemptible: bool, scope: str) -> str:
    """The TPU API quota id: ``tpu_quota_id("v6e", preemptible=True, scope="zone")`` ->
    ``TPUV6EPreemptiblePerProjectPerZoneForTPUAPI``."""
    if scope not in ("zone", "region"):
        raise ValueError(f"scope: {scope!r} is not zone or region")
    prefix = _QUOTA_ID_PREFIX.get(family, f"TPU{family.upper()}")
    return f"{prefix}{'Preemptible' if preemptible else ''}PerProjectPer{scope.capitalize()}ForTPUAPI"


def parse_tpu_quota_id(quota_id: str) -> tuple[str, bool, str] | None:
    """``TPUV6EPreemptiblePerProjectPerRegionForTPUAPI`` -> (``v6e``, True, ``region``); None for other ids."""
    match = _TPU_QUOTA_ID.match(quota_id.strip())
    if match is None:
        return None
    prefix = match["prefix"]
    family = next((name for name, known in _QUOTA_ID_PREFIX.items() if known == prefix), prefix[3:].lower())
    return family, bool(match["preemptible"]), match["scope"].lower()


def _preemptible(tier: Tier | None) -> bool | None:
    """Which TPU API pool a tier spends: preemptible (spot, flex-start), regular (on-demand), none (reservation)."""
    if tier is Tier.RESERVATION:
        return None
    return tier in (Tier.SPOT, Tier.FLEX_START)


def holds_tpu_quota(resource: ObservedResource) -> bool:
    """True when a TPU API resource holds chips of quota now (its node exists, or it is provisioning)."""
    if resource.backend is not Backend.TPU_API:
        return False
    if resource.node_state is not None:
        return resource.node_state is not NodeState.TERMINATED
    return resource.state in _HOLDING_QR_STATES


def tpu_quota_usage(resources: Iterable[ObservedResource]) -> dict[tuple[str, str], int]:
    """Chips in use per (quota id, location), zone and region ids both, from the TPU API's resource list.

    A resource with no tier is counted as on-demand (a node created without spot or flex-start flags is).
    """
    usage: dict[tuple[str, str], int] = {}
    for resource in resources:
        if not holds_tpu_quota(resource) or not resource.accelerator:
            continue
        preemptible = _preemptible(resource.tier or Tier.ON_DEMAND)
        if preemptible is None:
            continue
        try:
            chips = slice_chips(resource.accelerator)
        except ValueError:
            continue
        family = accelerator_family(resource.accelerator)
        for scope, location in (("zone", resource.zone), ("region", region_of(resource.zone))):
            key = (tpu_quota_id(family, preemptible=preemptible, scope=scope), location)
            usage[key] = usage.get(key, 0) + chips
    return usage


def usage_from_records(records: Iterable[DeploymentRecord]) -> dict[tuple[str, str], int]:
    """The same count from the controller's records: only tpuctl's own slices (a fallback, said so by callers)."""
    observed = [
        ObservedResource(
            name=ref.name,
            zone=ref.zone,
            backend=ref.backend,
            state=ref.state,
            tier=ref.tier,
            accelerator=record.spec.accelerator,
            node_state=ref.node_state,
        )
        for record in records
        for ref in record.status.resources
    ]
    return tpu_quota_usage(observed)


def _index(limits: Iterable[QuotaLimit]) -> dict[tuple[str, str], QuotaLimit]:
    """(quota id, location) -> the limit in effect there; a specific entry wins over a default one."""
    index: dict[tuple[str, str], QuotaLimit] = {}
    for limit in limits:
        key = (limit.quota_id, limit.location)
        current = index.get(key)
        if current is None or (current.default and not limit.default):
            index[key] = limit
    return index


def _limit_for(index: Mapping[tuple[str, str], QuotaLimit], quota_id: str, zone: str, scope: str) -> QuotaLimit | None:
    region = region_of(zone)
    places = (zone, region, "global") if scope == "zone" else (region, "global")
    for place in places:
        found = index.get((quota_id, place))
        if found is not None:
            return found
    return None


def quota_headroom(
    limits: Iterable[QuotaLimit],
    usage: Mapping[tuple[str, str], int] | None,
    zones: Sequence[str],
    tiers: Sequence[Tier],
    family: str = "v6e",
) -> list[QuotaHeadroom]:
    """Join limits with usage into headroom per (zone, tier) and the slice shapes that still fit.

    ``usage`` None means it could not be read: limits are still shown, headroom is unknown. Tiers that
    spend no quota (reservation) are left out.
    """
    index = _index(limits)
    shapes = SLICE_CHIPS.get(family, ())
    rows: list[QuotaHeadroom] = []
    for zone in zones:
        for tier in tiers:
            preemptible = _preemptible(tier)
            if preemptible is None:
                continue
            ids = tuple(tpu_quota_id(family, preemptible=preemptible, scope=s) for s in ("zone", "region"))
            bounds: list[QuotaBound] = []
            for quota_id, scope in zip(ids, ("zone", "region"), strict=True):
                limit = _limit_for(index, quota_id, zone, scope)
                if limit is None:
                    continue
                location = zone if scope == "zone" else region_of(zone)
                in_use = None if usage is None else usage.get((quota_id, location), 0)
                bounds.append(QuotaBound(quota_id, scope, location, limit.value, in_use))
            known = [bound.headroom for bound in bounds if bound.headroom is not None]
            headroom = min(known) if known else None
            usage_known = usage is not None
            if not bounds or not usage_known:
                fit: tuple[str, ...] = ()
            else:
                fit = tuple(f"{family}-{chips}" for chips in shapes if headroom is None or chips <= headroom)
            rows.append(QuotaHeadroom(zone, tier, ids, tuple(bounds), headroom, fit, usage_known))
    return rows


def zones_with_zone_limits(limits: Iterable[QuotaLimit], family: str = "v6e") -> set[str]:
    """Zones the API lists a zone-scoped TPU API limit above 0 for, for this family."""
    zones: set[str] = set()
    for limit in limits:
        parsed = parse_tpu_quota_id(limit.quota_id)
        if parsed is None or parsed[0] != family or parsed[2] != "zone" or limit.value == 0:
            continue
        if limit.location.count("-") == 2:
            zones.add(limit.location)
    return zones


# ---------------------------------------------------------------------------------------------- search scope
#
# With no zones given, the capacity search may use every catalog zone where the slice fits the live quota in
# at least one requested tier (zone and region limits both); a zone whose quota is not listed is left out
# (unknown is not free). Cheapest first, so the planner's zone order follows the price.


@dataclass(frozen=True)
class ScopeExclusion:
    """A catalog zone left out of the default search scope, and why."""

    zone: str
    reason: str


@dataclass(frozen=True)
class SearchScope:
    """The zones a search may use when the user names none: ``source`` live_quota, or catalog with ``problem``."""

    accelerator: str
    zones: tuple[str, ...]
    excluded: tuple[ScopeExclusion, ...]
    source: str  # live_quota | catalog
    problem: str | None = None

    def summary(self) -> str:
        """``search scope: 3 zones where v6e-4 fits your quota: a, b, c; excluded: d (quota 0 spot chips)``."""
        if self.source != "live_quota":
            return (
                f"search scope: the {len(self.zones)} catalog zone(s) offering {self.accelerator} "
                f"(live quota not used: {self.problem}): {', '.join(self.zones)}"
            )
        text = f"search scope: {len(self.zones)} zone(s) where {self.accelerator} fits your quota: "
        text += ", ".join(self.zones) if self.zones else "none"
        grouped: dict[str, list[str]] = {}
        for item in self.excluded:
            grouped.setdefault(item.reason, []).append(item.zone)
        if grouped:
            text += "; excluded: " + ", ".join(f"{', '.join(zones)} ({reason})" for reason, zones in grouped.items())
        return text


def _shortfall(rows: Sequence[QuotaHeadroom], family: str) -> str:
    """Why a zone's quota has no room for the slice in any tier asked about."""
    listed = [row for row in rows if row.listed]
    if not listed:
        return f"no {family} quota listed"
    parts = []
    for row in listed:
        bound = min(
            (b for b in row.bounds if b.headroom is not None), key=lambda b: b.headroom or 0, default=row.bounds[0]
        )
        free = bound.headroom if bound.headroom is not None else "unknown"
        parts.append(f"{free} {row.tier.value} chips in {bound.scope} {bound.location}")
    return "quota " + ", ".join(parts)


def search_scope(
    accelerator: str,
    catalog: Sequence[str],
    headroom: Sequence[QuotaHeadroom] | None,
    price: Callable[[str], float | None],
    problem: str | None = None,
) -> SearchScope:
    """The default zones for ``accelerator``: catalog zones whose live ``headroom`` fits one slice, cheapest first.

    ``headroom`` None (the quota could not be read) or listing no limit at all falls back to every catalog zone,
    with ``problem`` saying why. ``price`` is the slice's cheapest hourly price in a zone (None: unpriced, last).
    """

    def order(zones: Iterable[str]) -> tuple[str, ...]:
        return tuple(sorted(zones, key=lambda zone: (price(zone) is None, price(zone) or 0.0, zone)))

    if headroom is None or not any(row.listed for row in headroom):
        reason = problem or f"the live quota lists no {accelerator_family(accelerator)} limit"
        return SearchScope(accelerator, order(catalog), (), "catalog", reason)
    chips = slice_chips(accelerator)
    rows: dict[str, list[QuotaHeadroom]] = {}
    for row in headroom:
        rows.setdefault(row.zone, []).append(row)
    fits = [zone for zone in catalog if any(row.fits(chips) for row in rows.get(zone, ()))]
    excluded = tuple(
        ScopeExclusion(zone, _shortfall(rows.get(zone, ()), accelerator_family(accelerator)))
        for zone in catalog
        if zone not in fits
    )
    return SearchScope(accelerator, order(fits), excluded, "live_quota")

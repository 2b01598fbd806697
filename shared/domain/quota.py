"""Which quota a TPU request spends, per back end: pure tables and the "all alternatives blocked" rule.

Why a module of its own: the two back ends count chips against different quotas, and learning about
one must not block the other (reference-agent.md §11: TPU API quota does not carry over to Compute Engine).

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

from collections.abc import Mapping
from datetime import datetime

from shared.domain.cloud import accelerator_family
from shared.domain.models import Backend, Tier, ZoneMemoryEntry, region_of

__all__ = [
    "COMPUTE_FAMILY_QUOTA",
    "COMPUTE_POOL_PREFIX",
    "compute_pool",
    "compute_quota_ids",
    "quota_alternatives",
    "quota_blocking_entry",
    "tpu_family_of",
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

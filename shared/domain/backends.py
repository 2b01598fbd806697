"""Two provisioning back ends behind one capacity search: machine types, choice, memory and ranking per back end.

Why: a zone may be offered through the Cloud TPU API, through Compute Engine, or both, and what the
search learns means different things per back end (docs/reference/tpu-api.md §1, docs/reference/reference-agent.md §11):

- a **stockout**, a preemption, a stuck slice, an unparsed error or a denied location is about the zone's
  hardware or the project's access: it holds for both back ends (shared keys, unchanged);
- an **unsupported** or **invalid** request is a fact of one API's catalogue: Compute Engine's carry an
  ``@compute-engine`` tag in the key head (``unsupported@compute-engine/zone/asia-east1-a``) that the
  TPU API's view ignores, and TPU API facts (untagged, as before) are hidden from Compute Engine's view;
- **quota** pools differ (``shared.domain.quota``): Compute Engine's carry a ``ce-`` prefix and are
  turned into per-tier blocks in Compute Engine's view only when every pool the tier may spend is blocked.

``memory_view(memory, backend, accelerator, now)`` gives each back end the memory as the existing
zone-memory functions (``rank``, ``blocking_entry``) expect it, so they are reused unchanged;
``learn_for_backend`` tags what Compute Engine teaches; ``rank_backends`` merges the per-back-end rankings.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from shared.domain.errors import ErrorClass
from shared.domain.models import Backend, Tier, ZoneMemoryEntry, region_of
from shared.domain.prices import price_per_chip_hour
from shared.domain.quota import COMPUTE_POOL_PREFIX, compute_pool, quota_blocking_entry
from shared.domain.zone_memory import Candidate, CloudFailure, MemoryPolicy, PriceFn, blocking_entry, learn, rank

__all__ = [
    "BACKEND_TAG",
    "MACHINE_TYPES",
    "BackendCandidate",
    "accelerator_of_machine_type",
    "blocking_entry_for",
    "candidate_backends",
    "learn_for_backend",
    "machine_type_of",
    "memory_view",
    "rank_backends",
]

BACKEND_TAG = "@compute-engine"

# Slice type -> Compute Engine machine type (one VM holds the whole slice).
MACHINE_TYPES: Mapping[str, str] = {
    "v6e-1": "ct6e-standard-1t",
    "v6e-4": "ct6e-standard-4t",
    "v6e-8": "ct6e-standard-8t",
    "v5litepod-1": "ct5lp-hightpu-1t",
    "v5litepod-4": "ct5lp-hightpu-4t",
    "v5litepod-8": "ct5lp-hightpu-8t",
    "v5p-8": "ct5p-hightpu-4t",
}
_ACCELERATORS = {machine: accelerator for accelerator, machine in MACHINE_TYPES.items()}
_SHARED_HEADS = frozenset({"stockout", "unknown", "preempted", "permission", "ratelimit"})
_TAGGED_HEADS = frozenset({"unsupported", "invalid"})
# Compute Engine first: Google develops that path, and it reaches zones the TPU API does not serve.
_ANY_ORDER = (Backend.COMPUTE_ENGINE, Backend.TPU_API)
# Which back end wins a tie, per tier. A flex-start VM waits for chips (PENDING) like a queued resource and
# is where Google takes DWS; a spot, standard or reserved VM does not wait: with no chips its insert fails
# at once and only cools the pair down, while a queued resource keeps its place until chips come.
_TIE_ORDER: Mapping[Tier, tuple[Backend, ...]] = {
    Tier.FLEX_START: (Backend.COMPUTE_ENGINE, Backend.TPU_API),
    Tier.SPOT: (Backend.TPU_API, Backend.COMPUTE_ENGINE),
    Tier.ON_DEMAND: (Backend.TPU_API, Backend.COMPUTE_ENGINE),
    Tier.RESERVATION: (Backend.TPU_API, Backend.COMPUTE_ENGINE),
}


def machine_type_of(accelerator: str) -> str | None:
    """``v6e-4`` -> ``ct6e-standard-4t``; None when Compute Engine sells no single VM of that slice."""
    return MACHINE_TYPES.get(accelerator)


def accelerator_of_machine_type(machine_type: str) -> str | None:
    """``ct6e-standard-4t`` (or its URL) -> ``v6e-4``; None for a machine type that is not a TPU slice."""
    return _ACCELERATORS.get(machine_type.rsplit("/", 1)[-1])


def candidate_backends(choice: Backend | str) -> tuple[Backend, ...]:
    """The back ends a spec allows, in tie-break order: ``any`` means both (Compute Engine first)."""
    value = Backend(choice)
    return _ANY_ORDER if value is Backend.ANY else (value,)


@dataclass(frozen=True)
class BackendCandidate:
    """One allowed (zone, tier, back end) with the ranking the zone memory gave it."""

    zone: str
    tier: Tier
    backend: Backend
    candidate: Candidate

    @property
    def score(self) -> float:
        return self.candidate.score


def _head(key: str) -> tuple[str, str]:
    """``unsupported@compute-engine/zone/x`` -> (``unsupported``, ``@compute-engine``)."""
    first = key.split("/", 1)[0]
    name, at, tag = first.partition("@")
    return name, (at + tag) if at else ""


def memory_view(
    memory: Mapping[str, ZoneMemoryEntry], backend: Backend, accelerator: str, now: datetime
) -> dict[str, ZoneMemoryEntry]:
    """The zone memory as one back end should see it, in the shape ``rank``/``blocking_entry`` expect.

    The TPU API view is the memory itself (Compute Engine's tagged keys and ``ce-`` pools match nothing
    there); Compute Engine's view keeps the shared lessons, untags its own and adds one per-tier quota
    block wherever all the pools a tier may spend are blocked.
    """
    if backend is Backend.TPU_API:
        return dict(memory)
    view: dict[str, ZoneMemoryEntry] = {}
    quota_places: set[tuple[str, str]] = set()
    for key, entry in memory.items():
        head, tag = _head(key)
        if head in _SHARED_HEADS and not tag:
            view[key] = entry
        elif head in _TAGGED_HEADS and tag == BACKEND_TAG:
            plain = head + key[len(head) + len(tag) :]
            view[plain] = entry.model_copy(update={"key": plain})
        elif head == "quota":
            parts = key.split("/")
            if len(parts) == 4 and parts[3].lower().startswith(COMPUTE_POOL_PREFIX):
                quota_places.add((parts[1], parts[2]))
    for scope, location in sorted(quota_places):
        probe_zone = location if scope == "zone" else f"{location}-a"
        for tier in Tier:
            blocked = quota_blocking_entry(memory, probe_zone, tier, accelerator, Backend.COMPUTE_ENGINE, now)
            if blocked is None:
                continue
            key = f"quota/{scope}/{location}/{COMPUTE_POOL_PREFIX}all-{tier.value}"
            view[key] = blocked.model_copy(update={"key": key, "tier": tier})
    return view


def blocking_entry_for(
    memory: Mapping[str, ZoneMemoryEntry], zone: str, tier: Tier, accelerator: str, backend: Backend, now: datetime
) -> ZoneMemoryEntry | None:
    """``blocking_entry`` for one back end: the entry that keeps (zone, tier) out of its search, or None."""
    return blocking_entry(memory_view(memory, backend, accelerator, now), zone, tier, accelerator, now)


def _failures(memory: Mapping[str, ZoneMemoryEntry], key: str) -> int:
    previous = memory.get(key)
    return previous.failures + 1 if previous is not None else 1


def learn_for_backend(
    failure: CloudFailure,
    *,
    backend: Backend,
    zone: str,
    tier: Tier,
    accelerator: str,
    memory: Mapping[str, ZoneMemoryEntry],
    now: datetime,
    policy: MemoryPolicy | None = None,
) -> ZoneMemoryEntry | None:
    """``zone_memory.learn`` for a failure seen on ``backend``; Compute Engine's catalogue and quota lessons
    are kept apart from the TPU API's (see the module docstring)."""
    policy = policy or MemoryPolicy()
    entry = learn(failure, zone=zone, tier=tier, accelerator=accelerator, memory=memory, now=now, policy=policy)
    if backend is Backend.TPU_API or entry is None:
        return entry
    cls = failure.error_class
    if cls in (ErrorClass.QUOTA_ZONE, ErrorClass.QUOTA_REGION):
        parts = entry.key.split("/")
        location = parts[2] if len(parts) == 4 else region_of(zone)
        key = f"quota/{parts[1]}/{location}/{compute_pool(failure.quota_id, accelerator, tier)}"
        failures = _failures(memory, key)
        duration = min(policy.quota_max_s, policy.quota_recheck_s * (2 ** min(failures - 1, 30)))
        return entry.model_copy(
            update={"key": key, "tier": None, "failures": failures, "until": now + timedelta(seconds=duration)}
        )
    if cls in (ErrorClass.UNSUPPORTED, ErrorClass.INVALID):
        head, rest = entry.key.split("/", 1)  # the zone, accelerator or tier the adapter's scope named
        key = f"{head}{BACKEND_TAG}/{rest}"
        return entry.model_copy(update={"key": key, "failures": _failures(memory, key)})
    return entry


def rank_backends(
    zones: Iterable[str],
    tiers: Iterable[Tier],
    backends: Sequence[Backend],
    accelerator: str,
    memory: Mapping[str, ZoneMemoryEntry],
    now: datetime,
    *,
    price: PriceFn = price_per_chip_hour,
    policy: MemoryPolicy | None = None,
) -> list[BackendCandidate]:
    """Allowed (zone, tier, back end) triples, best first: the zone memory's score, then the user's tier
    and zone order, then the back end that suits the tier (``_TIE_ORDER``: one that waits for chips).
    Deterministic."""
    zone_list = list(zones)
    tier_list = list(tiers)
    ranked: list[tuple[float, int, int, int, BackendCandidate]] = []
    for backend_index, backend in enumerate(backends):
        view = memory_view(memory, backend, accelerator, now)
        for candidate in rank(zone_list, tier_list, accelerator, view, now, price=price, policy=policy):
            item = BackendCandidate(candidate.zone, candidate.tier, backend, candidate)
            preferred = [b for b in _TIE_ORDER[candidate.tier] if b in backends]
            key = (
                round(candidate.score, 9),
                tier_list.index(candidate.tier),
                zone_list.index(candidate.zone),
                preferred.index(backend) if backend in preferred else len(preferred) + backend_index,
            )
            ranked.append((*key, item))
    ranked.sort(key=lambda entry: entry[:4])
    return [entry[4] for entry in ranked]

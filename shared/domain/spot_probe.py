"""The spot probe: tell what holds a waiting request, capacity or quota, with a spot create that never queues.

Why: a flex-start request that waits (ACCEPTED or WAITING_FOR_RESOURCES, "PENDING") looks the same whether the
zone has no chips or the project's quota or entitlement holds it (docs/reference/capacity-advice.md A5). A spot
create that does not queue (the TPU API's ``nodes.create``; on Compute Engine every spot insert) answers in
seconds, and spot and flex-start draw on the same preemptible pool:

* it stocks out (code 8): the wait is for capacity, and zone memory handles it as without a probe (the request
  keeps its capacity check, whose end teaches the pair's stockout). The probe teaches no spot stockout: it is one
  sample of a pool that comes and goes, and counting it against the spot pair would push spot behind in the
  search where the pool may refill minutes later (on ``scarce-v6e`` it cost a 19-minute search 21 minutes);
* it is granted: chips exist, so the wait is held by quota or entitlement. The request is parked at once (it stays
  queued, free) and that tier is blocked in the region for a while (``quotabound/...`` in zone memory), so the search
  widens to other regions now instead of after the capacity check;
* anything else (a quota refusal, a permission error, no answer in time) is inconclusive; zone memory learns what
  the error teaches as for any create.

A granted probe is deleted at once, never adopted as the deployment's slice: it is a bare node with no startup
script, no node metadata and no channel (adopting it would serve nothing and bypass the boot path); its tier may not
be the one the user ranked first; and keeping it would hold chips a waiting request of the deployment may get. A
probe whose create has not failed ``granted_after_s`` after it was sent has passed the capacity check (seconds) and
is deleted while it boots, before it bills; a node seen READY earlier bills until the delete lands. A failed probe
costs nothing.

Only flex-start waits are probed by default: on-demand draws on another pool, so a spot grant does not prove an
on-demand wait is quota-bound (``ProbePolicy.tiers`` can add it). Probes are rate-limited per zone across
deployments (a ``probe/{zone}/{family}`` entry in zone memory), per deployment (one in flight, a minimum
interval, one probe per waiting request) and globally (``ProbePolicy.per_tick``, a token bucket in the service);
a zone where the deployment's own spot request waits, or where spot is blocked or cooling down, or a wait whose
region and tier are already known quota-bound, is not probed (its answer is known).

Pure: :func:`plan_probes` takes the record, the probe nodes observed, the probes' operation outcomes and zone
memory, and returns the new status, the memory lessons and the calls; ``shared.services.spot_prober`` runs it.
Every probe is written into the status before its create is sent (``SpotProbe.confirmed`` False), and stays there
until its node is confirmed gone, so a crash leaves a record; the janitor deletes any probe node no status holds.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from shared.domain.attempts import Step
from shared.domain.backends import blocking_entry_for, learn_for_backend
from shared.domain.cloud import (
    LABEL_DEPLOYMENT,
    LABEL_GENERATION,
    LABEL_MANAGED_BY,
    LABEL_PROBE,
    ObservedResource,
    ProvisionRequest,
    accelerator_family,
)
from shared.domain.errors import ErrorClass
from shared.domain.models import (
    AttemptLog,
    DeploymentRecord,
    DeploymentStatus,
    Desired,
    NodeState,
    ProbeVerdict,
    QueuedResourceState,
    ResourceRef,
    SpotProbe,
    Tier,
    ZoneMemoryEntry,
    region_of,
)
from shared.domain.planner_actions import MANAGED_BY, DeleteResource, OperationOutcome, request_id
from shared.domain.zone_memory import (
    CloudFailure,
    MemoryPolicy,
    forget_on_success,
    is_active,
    learn_quota_bound,
    quota_bound_key,
    rate_limited_until,
)

__all__ = [
    "ProbePlan",
    "ProbePolicy",
    "is_probe",
    "janitor_reason",
    "plan_probes",
    "probe_delete_request_id",
    "probe_name",
    "verdict_of",
    "zone_probe_key",
]

_WAITING = (QueuedResourceState.ACCEPTED, QueuedResourceState.WAITING)
_PENDING = (*_WAITING, QueuedResourceState.UNKNOWN, QueuedResourceState.CREATING)
_STEP: Mapping[str, Step] = {
    "capacity": Step.PROBE_CAPACITY,
    "quota": Step.PROBE_QUOTA,
    "inconclusive": Step.PROBE_INCONCLUSIVE,
}
_RELIST_S = 30.0
"""A delete asked this long ago is asked again while its node is still listed, and confirmed once it is not: the
list it is judged by was taken after the delete (reconciles are a tick apart; the two passes of one are not)."""
_NAMESPACE = uuid.UUID("0b6f2f0e-3c55-4f7e-9d1e-5a0c2f1b7e44")


@dataclass(frozen=True)
class ProbePolicy:
    """When and how often to probe. Durations in seconds."""

    after_s: float = 60.0
    """A request is probed once it has waited this long (well before its first 5-minute capacity check ends)."""
    tiers: tuple[Tier, ...] = (Tier.FLEX_START,)
    """Waits of these tiers are probed; flex-start shares spot's pool, on-demand does not."""
    zone_interval_s: float = 900.0
    """At most one probe per zone (and accelerator family) this often, across every deployment."""
    deployment_interval_s: float = 120.0
    """At most one probe per deployment this often (one answer takes about two ticks)."""
    max_in_flight: int = 1
    """Probes of one deployment awaiting their answer at once."""
    per_tick: int = 2
    """Probes sent by one provisioner per minute (one tick), over all deployments (a token bucket)."""
    granted_after_s: float = 60.0
    """A probe node still listed this long after its create, its operation not failed, passed the capacity check
    (which takes seconds) and is booting: granted. It is deleted then (the next tick), before it boots and bills."""
    confirm_timeout_s: float = 300.0
    """A probe recorded but neither confirmed by its create call nor listed is dropped after this (inconclusive)."""
    answer_timeout_s: float = 600.0
    """A probe with no answer after this is inconclusive, and its node is deleted."""
    quota_bound_s: float = 1800.0
    """How long a quota-bound verdict keeps new requests of that tier out of the region."""
    max_age_s: float = 900.0
    """The janitor deletes a probe node older than this even when a status still holds it."""

    def __post_init__(self) -> None:
        if self.per_tick < 1 or self.max_in_flight < 1:
            raise ValueError("per_tick, max_in_flight: at least 1 (leave the probe policy out to probe nothing)")
        if self.max_age_s <= self.answer_timeout_s:
            raise ValueError("max_age_s: longer than answer_timeout_s, so the janitor never deletes a probe in flight")


@dataclass
class ProbePlan:
    """What one probe pass decided: the new status, memory lessons, and the calls to make (after the write)."""

    status: DeploymentStatus
    remember: list[ZoneMemoryEntry] = field(default_factory=list)
    forget: list[str] = field(default_factory=list)
    deletes: list[DeleteResource] = field(default_factory=list)
    creates: list[ProvisionRequest] = field(default_factory=list)


def probe_name(ref_name: str) -> str:
    """The probe node of one waiting request: one probe per request, so the name is fixed (a repeat is ours)."""
    return f"{ref_name}-p"


def is_probe(resource: ObservedResource) -> bool:
    return LABEL_PROBE in resource.labels


def probe_delete_request_id(deployment_id: str, name: str) -> str:
    return str(uuid.uuid5(_NAMESPACE, f"{deployment_id}/{name}/delete"))


def zone_probe_key(zone: str, accelerator: str) -> str:
    return f"probe/{zone}/{accelerator_family(accelerator)}"


def verdict_of(failure: CloudFailure | None) -> ProbeVerdict:
    """Granted (no failure): quota-bound; a stockout: capacity-bound; anything else says neither."""
    if failure is None:
        return "quota"
    if failure.error_class in (ErrorClass.STOCKOUT, ErrorClass.FAILED_PRECONDITION):
        return "capacity"
    return "inconclusive"


def janitor_reason(
    resource: ObservedResource, record: DeploymentRecord | None, now: datetime, max_age_s: float
) -> str | None:
    """Why the janitor deletes a probe node: no status holds it, or it outlived any answer."""
    if record is None or not any(probe.name == resource.name for probe in record.status.probes):
        return "a spot probe no deployment holds"
    if resource.created_at is not None and now - resource.created_at >= timedelta(seconds=max_age_s):
        return f"a spot probe older than {max_age_s / 60:.0f} min"
    return None


def plan_probes(
    record: DeploymentRecord,
    observed: Sequence[ObservedResource],
    outcomes: Mapping[str, OperationOutcome],
    memory: Mapping[str, ZoneMemoryEntry],
    now: datetime,
    policy: ProbePolicy,
    *,
    allowance: int,
    runtime_version: str,
    memory_policy: MemoryPolicy | None = None,
    log_limit: int = 60,
) -> ProbePlan:
    """Resolve the probes in flight (verdict, lessons, delete, drop once gone), then send new ones, at most
    ``allowance``. ``observed`` are this deployment's probe nodes, ``outcomes`` their create results by name."""
    probing = _ProbePass(record, observed, outcomes, memory, now, policy, memory_policy or MemoryPolicy())
    probing.resolve()
    probing.send(allowance, runtime_version)
    status = probing.status
    if probing.attempts:
        status.attempts = (status.attempts + probing.attempts)[-log_limit:]
    status.resources = list(probing.refs.values())
    status.probes = probing.kept
    return ProbePlan(status, probing.remember, probing.forget, probing.deletes, probing.creates)


class _ProbePass:
    """One pass over a deployment's probes: scratch state, like the planner's."""

    def __init__(
        self,
        record: DeploymentRecord,
        observed: Sequence[ObservedResource],
        outcomes: Mapping[str, OperationOutcome],
        memory: Mapping[str, ZoneMemoryEntry],
        now: datetime,
        policy: ProbePolicy,
        memory_policy: MemoryPolicy,
    ) -> None:
        self.record = record
        self.accelerator = record.spec.accelerator
        self.observed = {o.name: o for o in observed if is_probe(o) and o.owned_by == record.deployment_id}
        self.outcomes = outcomes
        self.memory = dict(memory)
        self.now = now
        self.policy = policy
        self.memory_policy = memory_policy
        self.status = record.status.model_copy(update={"resources": [r.model_copy() for r in record.status.resources]})
        self.refs: dict[str, ResourceRef] = {r.name: r for r in self.status.resources}
        self.kept: list[SpotProbe] = []
        self.attempts: list[AttemptLog] = []
        self.remember: list[ZoneMemoryEntry] = []
        self.forget: list[str] = []
        self.deletes: list[DeleteResource] = []
        self.creates: list[ProvisionRequest] = []

    def age_s(self, since: datetime | None) -> float:
        return (self.now - since).total_seconds() if since is not None else 0.0

    def learned(self, entry: ZoneMemoryEntry | None) -> None:
        if entry is not None:
            self.memory[entry.key] = entry
            self.remember.append(entry)

    # -- probes in flight ----------------------------------------------------------------------------

    def resolve(self) -> None:
        for original in self.record.status.probes:
            probe = original.model_copy()
            seen = self.observed.get(probe.name)
            outcome = self.outcomes.get(probe.name)
            if probe.verdict is None:
                self.answer(probe, seen, outcome)
            if probe.verdict is not None and not self.gone(probe, seen, outcome):
                self.delete(probe, seen)
                self.kept.append(probe)
            elif probe.verdict is None:
                self.kept.append(probe)

    def answer(self, probe: SpotProbe, seen: ObservedResource | None, outcome: OperationOutcome | None) -> None:
        """Read the probe's answer: its create's outcome, a READY node, or the timeouts."""
        if outcome is not None and outcome.done:
            self.decide(probe, outcome.failure)
        elif seen is not None and (
            seen.node_state is NodeState.READY or self.age_s(probe.sent_at) >= self.policy.granted_after_s
        ):
            self.decide(probe, None)
        elif not probe.confirmed and seen is None and self.age_s(probe.sent_at) > self.policy.confirm_timeout_s:
            self.decide(probe, CloudFailure(ErrorClass.TRANSIENT, "the probe's create was never confirmed"))
        elif self.age_s(probe.sent_at) > self.policy.answer_timeout_s:
            minutes = self.age_s(probe.sent_at) / 60
            self.decide(probe, CloudFailure(ErrorClass.TRANSIENT, f"no answer after {minutes:.0f} min"))

    def gone(self, probe: SpotProbe, seen: ObservedResource | None, outcome: OperationOutcome | None) -> bool:
        """Nothing of the probe is left: its create failed and no node is listed, or its delete was confirmed."""
        if seen is not None:
            return False
        failed = outcome is not None and outcome.failure is not None
        return (
            failed
            or not probe.confirmed
            or (probe.delete_requested_at is not None and self.age_s(probe.delete_requested_at) >= _RELIST_S)
        )

    def delete(self, probe: SpotProbe, seen: ObservedResource | None) -> None:
        """Delete the probe node at once (by name, listed or not); repeated until it is gone."""
        if seen is not None and (seen.state is QueuedResourceState.DELETING or seen.node_state is NodeState.DELETING):
            return
        if probe.delete_requested_at is None:
            probe.delete_requested_at = self.now
        elif seen is None or self.age_s(probe.delete_requested_at) < _RELIST_S:
            return  # asked in this reconcile already, or asked before and waiting for the list to confirm it gone
        self.deletes.append(
            DeleteResource(
                zone=probe.zone,
                name=probe.name,
                request_id=probe_delete_request_id(self.record.deployment_id, probe.name),
                reason=f"spot probe answered ({probe.verdict})",
            )
        )

    def decide(self, probe: SpotProbe, failure: CloudFailure | None) -> None:
        """The verdict, next to the waiting request and in its attempts; what zone memory learns from it."""
        verdict = verdict_of(failure)
        probe.verdict = verdict
        ref = self.refs.get(probe.of)
        tier = ref.tier if ref is not None else Tier.FLEX_START
        if ref is not None and ref.probe is None:
            ref.probe = verdict
        detail = {
            "capacity": f"spot stocked out in {probe.zone}: {probe.of} waits for capacity",
            "quota": f"spot granted in {probe.zone} while {probe.of} waits: held by quota or entitlement; parked, "
            f"{tier.value} asked in other regions",
            "inconclusive": f"spot probe in {probe.zone} for {probe.of}: "
            f"{failure.error_class.value if failure else ''} {failure.message if failure else ''}",
        }[verdict]
        self.attempts.append(
            AttemptLog(at=self.now, zone=probe.zone, tier=tier, outcome=_STEP[verdict], detail=detail[:300])
        )
        zone_entry = self.memory.get(zone_probe_key(probe.zone, self.accelerator))
        if zone_entry is not None:
            self.learned(
                zone_entry.model_copy(update={"reason": f"last spot probe: {verdict}", "updated_at": self.now})
            )
        if verdict == "quota":
            for key in forget_on_success(self.memory, probe.zone, Tier.SPOT, self.accelerator):
                self.memory.pop(key, None)
                self.forget.append(key)
            reason = f"spot granted in {probe.zone} while a {tier.value} request waited"
            self.learned(
                learn_quota_bound(
                    zone=probe.zone,
                    tier=tier,
                    accelerator=self.accelerator,
                    now=self.now,
                    duration_s=self.policy.quota_bound_s,
                    reason=reason,
                )
            )
        elif verdict == "inconclusive" and failure is not None:  # a quota refusal, say: what any create teaches
            self.learned(
                learn_for_backend(
                    failure,
                    backend=probe.backend,
                    zone=probe.zone,
                    tier=Tier.SPOT,
                    accelerator=self.accelerator,
                    memory=self.memory,
                    now=self.now,
                    policy=self.memory_policy,
                )
            )

    # -- new probes ------------------------------------------------------------------------------------

    def send(self, allowance: int, runtime_version: str) -> None:
        if allowance <= 0 or self.record.desired is not Desired.PRESENT or not self.may_send():
            return
        in_flight = sum(1 for probe in self.kept if probe.verdict is None)
        for ref in self.candidates():
            if allowance <= 0 or in_flight >= self.policy.max_in_flight:
                return
            if zone_probe_key(ref.zone, self.accelerator) in self.probed_zones():
                continue
            self.start(ref, runtime_version)
            allowance -= 1
            in_flight += 1

    def may_send(self) -> bool:
        """Creates allowed, no slice of this generation ACTIVE, and the deployment's own interval passed."""
        generation = self.record.generation
        if rate_limited_until(self.memory, self.now) is not None:
            return False
        if any(r.generation == generation and r.state is QueuedResourceState.ACTIVE for r in self.refs.values()):
            return False
        sent = [p.sent_at for p in self.kept]
        sent += [a.at for a in self.status.attempts if a.outcome == Step.PROBE_SENT]
        return not sent or self.age_s(max(sent)) >= self.policy.deployment_interval_s

    def probed_zones(self) -> set[str]:
        return {key for key, entry in self.memory.items() if key.startswith("probe/") and is_active(entry, self.now)}

    def candidates(self) -> list[ResourceRef]:
        """Waiting requests worth a probe, longest waiting first."""
        probed = {p.of for p in self.kept}
        spot_waiting = {
            r.zone
            for r in self.refs.values()
            if r.tier is Tier.SPOT and r.state in _PENDING and r.delete_requested_at is None
        }
        found = []
        for ref in self.refs.values():
            if (
                ref.generation != self.record.generation
                or ref.delete_requested_at is not None
                or ref.tier not in self.policy.tiers
                or ref.state not in _WAITING
                or ref.probe is not None
                or ref.name in probed
                or self.age_s(ref.created_at) < self.policy.after_s
                or ref.zone in spot_waiting
            ):
                continue
            blocked = blocking_entry_for(self.memory, ref.zone, Tier.SPOT, self.accelerator, ref.backend, self.now)
            bound = self.memory.get(quota_bound_key(ref.zone, ref.tier, self.accelerator))
            if blocked is None and (bound is None or not is_active(bound, self.now)):  # not known quota-bound yet
                found.append(ref)
        return sorted(found, key=lambda r: (r.created_at or self.now, r.attempt))

    def start(self, ref: ResourceRef, runtime_version: str) -> None:
        """Record the probe (before its create is sent), the zone's rate-limit entry and the attempt."""
        deployment = self.record.deployment_id
        name = probe_name(ref.name)
        self.kept.append(SpotProbe(name=name, zone=ref.zone, backend=ref.backend, of=ref.name, sent_at=self.now))
        self.creates.append(
            ProvisionRequest(
                resource_id=name,
                node_id=name,
                zone=ref.zone,
                accelerator=self.accelerator,
                runtime_version=runtime_version,
                tier=Tier.SPOT,
                request_id=request_id(deployment, ref.generation, ref.attempt, "probe"),
                labels={
                    LABEL_DEPLOYMENT: deployment,
                    LABEL_GENERATION: str(ref.generation),
                    LABEL_MANAGED_BY: MANAGED_BY,
                    LABEL_PROBE: ref.name,
                },
                backend=ref.backend,
                queued=False,
            )
        )
        self.learned(
            ZoneMemoryEntry(
                key=zone_probe_key(ref.zone, self.accelerator),
                kind="cooldown",
                error_class="probe",
                zone=ref.zone,
                region=region_of(ref.zone),
                tier=Tier.SPOT,
                reason=f"spot probe sent for a waiting {ref.tier.value} request",
                until=self.now + timedelta(seconds=self.policy.zone_interval_s),
                updated_at=self.now,
            )
        )
        detail = f"{name}: is {ref.name} waiting for capacity or held by quota?"
        self.attempts.append(
            AttemptLog(at=self.now, zone=ref.zone, tier=ref.tier, outcome=Step.PROBE_SENT, detail=detail)
        )

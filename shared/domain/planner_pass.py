"""The scratch state of one planning pass and its primitive edits: remember, log, delete, create.

Why separate from :mod:`shared.domain.planner`: the rules there (hedging, failover, teardown) decide
*when* to delete or create; this base class holds *how* each edit is recorded so that a crash after any
API call leaves a trace (expectation refs, deterministic names and request ids, delete-once). Keeping
the mechanics apart lets the rules read as rules.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from shared.domain.attempts import AttemptOutcome, Step
from shared.domain.backends import blocking_entry_for, candidate_backends
from shared.domain.capacity_advice import AdviceScores, learn_advice_trust
from shared.domain.cloud import LABEL_PROBE, ObservedResource, ProvisionRequest
from shared.domain.errors import ErrorClass
from shared.domain.models import (
    AttemptLog,
    Backend,
    DeploymentRecord,
    DeploymentSpec,
    Phase,
    QueuedResourceState,
    ResourceRef,
    Tier,
    ZoneMemoryEntry,
)
from shared.domain.planner_actions import (
    Action,
    CreateQueuedResource,
    DeleteResource,
    ForgetZone,
    OperationOutcome,
    PlannerPolicy,
    RememberZone,
    provision_request,
    request_id,
    resource_name,
)
from shared.domain.slice_ladder import ref_slice, spec_for_slice, step_reason
from shared.domain.zone_memory import CloudFailure, PriceFn, learn, rate_limited_until, remembered_failures

__all__ = ["PlanningPass"]


class PlanningPass:
    """One planning pass's mutable scratch state and the edits every rule is made of."""

    def __init__(
        self,
        *,
        record: DeploymentRecord,
        observed: Sequence[ObservedResource],
        memory: dict[str, ZoneMemoryEntry],
        now: datetime,
        outcomes: Mapping[str, OperationOutcome],
        create_tokens: int,
        reissue: bool,
        startup_script: str,
        startup_scripts: Mapping[str, str],
        price: PriceFn,
        policy: PlannerPolicy,
        advice: AdviceScores,
    ) -> None:
        self.record = record
        self.spec: DeploymentSpec = record.spec
        self.generation = record.generation
        self.now = now
        self.memory = memory
        self.outcomes = outcomes
        self.tokens = max(0, create_tokens)
        self.reissue = reissue
        self.startup_script = startup_script
        self.startup_scripts = startup_scripts  # per slice of the ladder (shared.domain.slice_ladder)
        self.price = price
        self.policy = policy
        self.advice = advice
        self.before = record.status
        # Refs are edited in place, so they are copied; attempt logs are only appended to.
        self.status = record.status.model_copy(
            update={"resources": [ref.model_copy() for ref in record.status.resources]}
        )
        self.observed = {
            o.name: o for o in observed if o.owned_by == record.deployment_id and LABEL_PROBE not in o.labels
        }  # a spot probe's node is never a slice (shared.domain.spot_probe)
        self.refs: dict[str, ResourceRef] = {r.name: r for r in self.status.resources}
        self.memory_actions: list[Action] = []
        self.calls: list[Action] = []
        self.attempts: list[AttemptLog] = []
        self.notes: list[str] = []
        self.deleting: set[str] = set()
        # Requests name a concrete back end; "any" ranks both (shared.domain.backends), Compute Engine first on ties.
        self.backends = candidate_backends(self.spec.backend)
        self.backend = self.backends[0]

    # -- bookkeeping helpers ------------------------------------------------------------------------

    def remember(self, entry: ZoneMemoryEntry | None) -> None:
        if entry is None:
            return
        self.memory[entry.key] = entry
        self.memory_actions.append(RememberZone(entry))

    def forget(self, keys: Sequence[str]) -> None:
        for key in keys:
            if key in self.memory:
                del self.memory[key]
                self.memory_actions.append(ForgetZone(key))

    def log(self, ref: ResourceRef, outcome: AttemptOutcome, detail: str = "") -> None:
        self.attempts.append(
            AttemptLog(
                at=self.now, zone=ref.zone, tier=ref.tier, outcome=outcome, detail=detail[:300], advice=ref.advice
            )
        )

    def age_s(self, since: datetime | None) -> float:
        return (self.now - since).total_seconds() if since is not None else 0.0

    def drop(self, ref: ResourceRef, outcome: AttemptOutcome, detail: str = "") -> None:
        self.refs.pop(ref.name, None)
        self.log(ref, outcome, detail)

    def request_delete(self, ref: ResourceRef, reason: str) -> None:
        """Delete a resource we observed with our label, unless it is already on its way out."""
        seen = self.observed.get(ref.name)
        if seen is None or ref.name in self.deleting:
            return
        if ref.delete_requested_at is None:
            ref.delete_requested_at = self.now
            self.log(ref, Step.DELETING, reason)
        if seen.state is QueuedResourceState.DELETING:
            return
        self.deleting.add(ref.name)
        self.calls.append(
            DeleteResource(
                zone=ref.zone,
                name=ref.name,
                request_id=request_id(self.record.deployment_id, ref.generation, ref.attempt, "delete"),
                reason=reason,
            )
        )

    def learn_advice(self, ref: ResourceRef, *, granted: bool) -> None:
        """An attempt asked with advice was granted or came up empty: the advice source's trust learns it."""
        if ref.advice is None:
            return
        self.remember(
            learn_advice_trust(
                self.memory, obtainability=ref.advice, granted=granted, now=self.now, policy=self.policy.advice
            )
        )

    def learn_empty(self, ref: ResourceRef, detail: str) -> None:
        """A request that waited without chips teaches the pair a stockout (cooldown and ranking)."""
        self.learn_advice(ref, granted=False)
        self.remember(
            learn(
                CloudFailure(ErrorClass.STOCKOUT, detail),
                zone=ref.zone,
                tier=ref.tier,
                accelerator=ref_slice(self.spec, ref),
                memory=self.memory,
                now=self.now,
                policy=self.policy.memory,
            )
        )

    def capacity_window_s(self, zone: str, tier: Tier) -> float | None:
        """Seconds this request may wait for chips before the search moves on; None: its full valid-until."""
        check = self.policy.capacity_check_minutes
        if check is None:
            return None
        failures = remembered_failures(self.memory, zone, tier, self.spec.accelerator)
        window = check * 60 * 2 ** min(failures, 16)
        return window if window < self.spec.valid_until_minutes * 60 else None

    def create(
        self,
        zone: str,
        tier: Tier,
        backend: Backend | None = None,
        advice: float | None = None,
        accelerator: str | None = None,
    ) -> None:
        accelerator = accelerator or self.spec.accelerator
        attempt = self.status.next_attempt
        self.status.next_attempt += 1
        name = resource_name(self.record.deployment_id, self.generation, attempt)
        window = self.capacity_window_s(zone, tier)
        ref = ResourceRef(
            name=name,
            zone=zone,
            tier=tier,
            backend=backend or self.backend,
            generation=self.generation,
            attempt=attempt,
            state=QueuedResourceState.UNKNOWN,
            created_at=self.now,
            state_since=self.now,
            wait_until=self.now + timedelta(seconds=window) if window is not None else None,
            advice=advice,
            accelerator=accelerator if accelerator != self.spec.accelerator else None,
        )
        self.refs[name] = ref
        self.tokens -= 1
        detail = name if ref.backend is Backend.TPU_API else f"{name} via {ref.backend.value}"
        why = step_reason(self.spec, accelerator, self.status.search_since, self.now)
        self.log(ref, Step.REQUESTED, f"{detail} ({why})" if why else detail)
        self.calls.append(CreateQueuedResource(self.build_request(ref)))

    def reissue_create(self, ref: ResourceRef) -> None:
        """A create recorded but not confirmed (a crash, a timeout): send the very same request again."""
        if not self.reissue or self.tokens <= 0 or rate_limited_until(self.memory, self.now) is not None:
            return
        entry = blocking_entry_for(self.memory, ref.zone, ref.tier, self.spec.accelerator, ref.backend, self.now)
        if entry is not None:
            return
        self.tokens -= 1
        self.calls.append(CreateQueuedResource(self.build_request(ref), reissue=True))

    def build_request(self, ref: ResourceRef) -> ProvisionRequest:
        accelerator = ref_slice(self.spec, ref)
        return provision_request(
            spec_for_slice(self.spec, accelerator),
            self.record.deployment_id,
            ref,
            runtime_version=self.policy.runtime_version,
            startup_script=self.startup_scripts.get(accelerator, self.startup_script),
        )

    def set_phase(self, phase: Phase) -> None:
        self.status.phase = phase

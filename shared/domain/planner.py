"""The reconcile planner: ``plan(record, observed, memory, now) -> [Action]``, pure and deterministic.

Why pure: every rule of the capacity search (hedging, failover, make-before-break, teardown) is
decided here from values passed in, so it is tested with tables and replayed exactly; the
provisioner service only executes the actions through ports.

The plan always contains one :class:`WriteStatus` (the record's new status, including an
"expectation" ref for every create about to be issued, so a crash after the API call leaves a
record of it), preceded by zone-memory updates and followed by the API calls. Resources are only
ever deleted when they were observed carrying this deployment's label.

The search keeps ``hedge`` requests outstanding in the best allowed (zone, tier) pairs (fewest
remembered failures, then cheapest). WAITING_FOR_RESOURCES is not failure: a request waits its
capacity check (``PlannerPolicy.capacity_check_minutes``, doubled each time that pair came up empty,
capped by the spec's ``valid_until_minutes``), after which the pair cools down and the next one is
asked, so the search sweeps every pair before asking again where it already waited, and waits longer
on each sweep. A checked request is not thrown away: up to ``PlannerPolicy.park_after_check`` of them
stay queued ("parked") until their own valid-until, no longer counted toward the hedge, because a
waiting request costs nothing and the provider hands chips to it the moment they appear; so the
search soon has a request waiting in every pair, as the issue asks of WAITING_FOR_RESOURCES. A
request that found capacity (PROVISIONING) is never cut short; the first ACTIVE slice wins and every
other request (parked ones too) is force-deleted and verified gone. Capacity advice, when given, reorders the
pairs within a sweep as far as its source has earned trust (:mod:`shared.domain.capacity_advice`); it never
excludes one. A generation whose boot failed (the
monitor read ``failed`` from its node's startup script and set FAILED) has every slice deleted and stays FAILED.

This module holds the rules; the actions, policy and naming are in :mod:`shared.domain.planner_actions`
(re-exported here) and the scratch state with its primitive edits in :mod:`shared.domain.planner_pass`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from shared.domain.attempts import Step
from shared.domain.backends import BackendCandidate, blocking_entry_for, learn_for_backend, rank_backends
from shared.domain.boot_progress import BOOT_FAILED
from shared.domain.capacity_advice import AdviceScores, advice_weight, order_by_advice
from shared.domain.cloud import LABEL_GENERATION, ObservedResource, accelerator_family
from shared.domain.errors import ErrorClass
from shared.domain.models import (
    Backend,
    DeploymentRecord,
    DeploymentStatus,
    Desired,
    NodeState,
    Phase,
    QueuedResourceState,
    ResourceRef,
    Tier,
    ZoneMemoryEntry,
)
from shared.domain.planner_actions import (
    LABEL_ATTEMPT,
    MANAGED_BY,
    Action,
    CreateQueuedResource,
    DeleteResource,
    ForgetZone,
    OperationOutcome,
    PlannerPolicy,
    RememberZone,
    WriteStatus,
    parse_resource_name,
    request_id,
    resource_name,
)
from shared.domain.planner_pass import PlanningPass
from shared.domain.prices import price_per_chip_hour
from shared.domain.slice_ladder import allowed_slices, chips_of, ref_slice
from shared.domain.zone_catalog import offering_zones
from shared.domain.zone_memory import (
    CloudFailure,
    PriceFn,
    estimated_price,
    forget_on_success,
    is_active,
    learn,
    learn_preemption,
    learn_stuck,
    quota_bound_key,
    quota_released,
    rate_limited_until,
    stockout_key,
)

__all__ = [
    "LABEL_ATTEMPT",
    "MANAGED_BY",
    "Action",
    "CreateQueuedResource",
    "DeleteResource",
    "ForgetZone",
    "OperationOutcome",
    "PlannerPolicy",
    "RememberZone",
    "WriteStatus",
    "needs_ticks",
    "parse_resource_name",
    "plan",
    "request_id",
    "resource_name",
]

# Phases the provisioner owns; the monitor owns the serving ones (BOOTING onwards) once a slice is up.
_PROVISIONER_PHASES = frozenset(
    {
        Phase.PENDING,
        Phase.SEARCHING,
        Phase.PROVISIONING,
        Phase.STOPPING,
        Phase.STOPPED,
        Phase.DELETING,
        Phase.DELETED,
        Phase.FAILED,
    }
)
_PENDING_STATES = frozenset(
    {
        QueuedResourceState.UNKNOWN,
        QueuedResourceState.CREATING,
        QueuedResourceState.ACCEPTED,
        QueuedResourceState.WAITING,
        QueuedResourceState.PROVISIONING,
    }
)
_DEAD_STATES = frozenset({QueuedResourceState.FAILED, QueuedResourceState.SUSPENDING, QueuedResourceState.SUSPENDED})
_DEAD_NODES = frozenset({NodeState.PREEMPTED, NodeState.TERMINATED})


def needs_ticks(record: DeploymentRecord) -> bool:
    """True while reconcile ticks still have work for this deployment (the tick job must stay on)."""
    booking = record.status.calendar
    if record.status.resources or record.status.probes or (booking is not None and booking.released_at is None):
        return True  # a held calendar booking too: the booker releases it on a tick once nothing needs it
    phase = record.status.phase
    if record.desired is Desired.ABSENT:
        return phase is not Phase.DELETED
    if record.desired is Desired.STOPPED:
        return phase is not Phase.STOPPED
    return phase not in (Phase.DELETED, Phase.FAILED)


# ------------------------------------------------------------------------------------------------- plan


def plan(
    record: DeploymentRecord,
    observed: Sequence[ObservedResource],
    memory: Sequence[ZoneMemoryEntry] | Mapping[str, ZoneMemoryEntry],
    now: datetime,
    *,
    outcomes: Mapping[str, OperationOutcome] | None = None,
    create_tokens: int = 4,
    reissue: bool = True,
    startup_script: str = "",
    price: PriceFn = price_per_chip_hour,
    policy: PlannerPolicy | None = None,
    advice: AdviceScores | None = None,
    startup_scripts: Mapping[str, str] | None = None,
) -> list[Action]:
    """Decide the next safe steps for one deployment.

    ``observed`` are the provider's resources carrying this deployment's label (others are ignored);
    ``outcomes`` the results of creates by resource name; ``create_tokens`` how many creates the
    project's token bucket allows now; ``advice`` the capacity advice per (zone, tier), which only orders the
    candidates (shared.domain.capacity_advice); ``startup_scripts`` one script per slice of the spec's ladder
    (shared.domain.slice_ladder; ``startup_script`` serves any slice missing from it). Returns memory updates,
    one ``WriteStatus``, then API calls.
    """
    planning = _Planning(
        record=record,
        observed=observed,
        memory=dict(memory) if isinstance(memory, Mapping) else {e.key: e for e in memory},
        now=now,
        outcomes=outcomes or {},
        create_tokens=create_tokens,
        reissue=reissue,
        startup_script=startup_script,
        startup_scripts=startup_scripts or {},
        price=price,
        policy=policy or PlannerPolicy(),
        advice=advice or {},
    )
    return planning.run()


class _Planning(PlanningPass):
    """One planning pass: the rules, applied to the scratch state of :class:`PlanningPass`."""

    # -- the pass -----------------------------------------------------------------------------------

    def run(self) -> list[Action]:
        self.adopt_unknown()
        self.refresh()
        for ref in list(self.refs.values()):
            if ref.delete_requested_at is not None:
                self.request_delete(ref, "delete not confirmed yet")  # level-triggered: repeat until gone
        absent_reason = self.teardown_reason()
        if self.boot_failed():
            self.release_failed_boot()
        elif self.record.desired is Desired.PRESENT and absent_reason is None:
            self.reconcile_present()
        else:
            self.reconcile_release(absent_reason)
        self.account_spend()
        self.status.resources = sorted(self.refs.values(), key=lambda r: (r.generation, r.attempt, r.name))
        if self.attempts:
            self.status.attempts = (self.status.attempts + self.attempts)[-self.policy.attempt_log_limit :]
        if self.status.phase != self.before.phase:
            self.status.phase_since = self.now
        return [*self.memory_actions, WriteStatus(self.status), *self.calls]

    def adopt_unknown(self) -> None:
        """A labelled resource we have no ref for (a crash after create, a lagging list): take it over."""
        for seen in self.observed.values():
            if seen.name in self.refs:
                continue
            parsed = parse_resource_name(seen.name)
            generation = parsed[0] if parsed else _int_label(seen.labels.get(LABEL_GENERATION), 0)
            attempt = parsed[1] if parsed else 0
            ref = ResourceRef(
                name=seen.name,
                zone=seen.zone,
                tier=seen.tier or Tier.ON_DEMAND,
                backend=seen.backend,
                generation=generation,
                attempt=attempt,
                state=seen.state,
                node_state=seen.node_state,
                endpoint=seen.endpoint,
                created_at=seen.created_at or self.now,
                state_since=self.now,
                accelerator=seen.accelerator if seen.accelerator in self.spec.alternative_accelerators else None,
            )
            self.refs[ref.name] = ref
            self.status.next_attempt = max(self.status.next_attempt, attempt + 1)
            self.log(ref, Step.ADOPTED, "found by label with no record of it")

    def refresh(self) -> None:
        """Fold observations and operation outcomes into the refs; drop the ones that are gone."""
        for ref in list(self.refs.values()):
            seen = self.observed.get(ref.name)
            outcome = self.outcomes.get(ref.name)
            if seen is not None:
                if seen.state != ref.state:
                    ref.state_since = self.now
                ref.state = seen.state
                ref.node_state = seen.node_state
                ref.endpoint = seen.endpoint
                ref.tier = seen.tier or ref.tier
                if seen.state is QueuedResourceState.ACTIVE and ref.active_at is None:
                    ref.active_at = self.now
                    self.learn_advice(ref, granted=True)
                    self.log(ref, Step.ACTIVE, f"ACTIVE after {self.age_s(ref.created_at) / 60:.1f} min")
            if outcome is not None and outcome.done:
                ref.operation = None
                if outcome.failure is not None and self.create_failed(ref, outcome.failure, seen):
                    continue
            if seen is None:
                self.refresh_unseen(ref)

    def create_failed(self, ref: ResourceRef, failure: CloudFailure, seen: ObservedResource | None) -> bool:
        """Learn from a failed create. Returns True when the ref was dropped."""
        cls = failure.error_class
        if cls in (ErrorClass.RATE_LIMIT, ErrorClass.TRANSIENT) and failure.surfaced == "sync":
            # Nothing learned about the zone; the same create (same id and request id) goes again later.
            self.remember(
                learn(
                    failure,
                    zone=ref.zone,
                    tier=ref.tier,
                    accelerator=self.spec.accelerator,
                    memory=self.memory,
                    now=self.now,
                    policy=self.policy.memory,
                )
            )
            self.notes.append(f"{cls.value} on create in {ref.zone}: retrying")
            return False
        if cls in (ErrorClass.STOCKOUT, ErrorClass.FAILED_PRECONDITION):
            self.learn_advice(ref, granted=False)
        self.remember(
            learn_for_backend(
                failure,
                backend=ref.backend,
                zone=ref.zone,
                tier=ref.tier,
                accelerator=self.spec.accelerator,
                memory=self.memory,
                now=self.now,
                policy=self.policy.memory,
            )
        )
        detail = failure.message[:200]
        if seen is not None:
            # The request lingers (e.g. FAILED after an operation error): delete it, keep the ref until gone.
            self.log(ref, cls, detail)
            ref.state = QueuedResourceState.FAILED
            self.request_delete(ref, f"create failed: {cls.value}")
            return False
        self.drop(ref, cls, detail)
        return True

    def refresh_unseen(self, ref: ResourceRef) -> None:
        if ref.delete_requested_at is not None and ref.state is not QueuedResourceState.UNKNOWN:
            self.drop(ref, Step.DELETED, "confirmed gone")
            self.forget(quota_released(self.memory, ref.zone))
            return
        if ref.state is QueuedResourceState.UNKNOWN:
            if self.age_s(ref.created_at) > self.policy.expectation_timeout_s:
                self.drop(ref, Step.EXPIRED, "create never confirmed")
            return
        confirmed_recently = ref.operation is not None or self.age_s(ref.created_at) <= self.policy.list_grace_s
        if ref.state is QueuedResourceState.CREATING and confirmed_recently:
            return
        self.drop(ref, Step.VANISHED, f"last seen {ref.state.value}; no longer listed")
        self.forget(quota_released(self.memory, ref.zone))

    def teardown_reason(self) -> str | None:
        """Why the deployment must go even though nobody asked: TTL or budget."""
        spec = self.spec
        if self.record.desired is Desired.PRESENT and self.before.phase in (Phase.DELETING, Phase.DELETED):
            # Only a TTL or budget teardown leaves a wanted deployment deleting; it stays torn down.
            return re.split(r"[:;]", self.before.message, maxsplit=1)[0] or "torn down"
        ends = self.record.ttl_ends_at
        if ends is not None and self.now >= ends:
            return f"ttl of {spec.ttl_hours:g} h reached"
        if spec.budget_usd is not None:
            # Stop early: a slice bills from READY (seen up to a tick late) until the delete lands (a tick or two).
            ahead = self.burn_usd_per_hour() * 3 * self.policy.tick_interval_s / 3600
            if self.status.spend_usd + ahead >= spec.budget_usd:
                return f"budget of ${spec.budget_usd:,.2f} reached (spent ${self.status.spend_usd:,.2f})"
        return None

    def burn_usd_per_hour(self) -> float:
        """What the ACTIVE slices of this deployment cost per hour right now."""
        total = 0.0
        for ref in self.refs.values():
            if ref.state is QueuedResourceState.ACTIVE and ref.node_state not in _DEAD_NODES:
                accelerator = ref_slice(self.spec, ref)
                usd, _ = estimated_price(ref.zone, ref.tier, accelerator, self.price)
                total += usd * chips_of(accelerator)
        return total

    def boot_failed(self) -> bool:
        """The monitor read ``failed`` from a node of this generation and ended it (FAILED): it stays ended."""
        boot = self.before.boot
        if self.record.desired is not Desired.PRESENT or self.before.phase is not Phase.FAILED or boot is None:
            return False
        parsed = parse_resource_name(boot.node)
        return boot.stage == BOOT_FAILED and parsed is not None and parsed[0] == self.generation

    def release_failed_boot(self) -> None:
        """Delete every slice (a serving older generation too: nothing bills on), keep FAILED and its reason.
        A new generation (``deployment.update``) or a delete and create starts again."""
        for ref in list(self.refs.values()):
            if ref.name in self.observed:
                self.request_delete(ref, "the boot failed")
            elif ref.state is QueuedResourceState.UNKNOWN:
                self.drop(ref, Step.CANCELLED, "create never confirmed")
        if not self.refs:
            self.status.endpoint = None

    # -- desired absent or stopped --------------------------------------------------------------------

    def reconcile_release(self, reason: str | None) -> None:
        stopping = self.record.desired is Desired.STOPPED and reason is None
        why = reason or ("stop requested" if stopping else "delete requested")
        for ref in list(self.refs.values()):
            if ref.name in self.observed:
                self.request_delete(ref, why)
            elif ref.state is QueuedResourceState.UNKNOWN:
                self.drop(ref, Step.CANCELLED, "create never confirmed")
        if self.refs:
            self.set_phase(Phase.STOPPING if stopping else Phase.DELETING)
            self.status.message = f"{why}: waiting for {len(self.refs)} resource(s) to be gone"
            return
        self.set_phase(Phase.STOPPED if stopping else Phase.DELETED)
        self.status.endpoint = None
        self.status.message = f"{why}; nothing left running; spend ${self.status.spend_usd:,.2f}"

    # -- desired present --------------------------------------------------------------------------------

    def reconcile_present(self) -> None:
        self.handle_dead()
        current = [r for r in self.refs.values() if r.generation == self.generation and r.delete_requested_at is None]
        older = [r for r in self.refs.values() if r.generation != self.generation and r.delete_requested_at is None]
        # Two hedged slices of an older generation can turn ACTIVE in the tick an update lands: one serves on.
        old_active = sorted(
            (r for r in older if r.state is QueuedResourceState.ACTIVE),
            key=lambda r: ((r.active_at or self.now).timestamp(), r.attempt),
        )
        for extra in old_active[1:]:
            self.request_delete(
                extra, f"a second ACTIVE slice of generation {extra.generation}; {old_active[0].name} serves"
            )
        older = [r for r in older if r.name not in {extra.name for extra in old_active[1:]}]
        active = sorted(
            (r for r in current if r.state is QueuedResourceState.ACTIVE),
            key=lambda r: ((r.active_at or self.now).timestamp(), r.attempt),
        )
        if active:
            self.settle_on(active[0], current, older)
            return
        for ref in older:
            if ref.state is not QueuedResourceState.ACTIVE:
                self.request_delete(ref, f"generation {ref.generation} superseded by {self.generation}")
        self.search(current, serving_old=[r for r in older if r.state is QueuedResourceState.ACTIVE])

    def handle_dead(self) -> None:
        """FAILED, SUSPENDED and preempted slices: learn what they mean, delete them."""
        accelerator = self.spec.accelerator
        for ref in list(self.refs.values()):
            if ref.delete_requested_at is not None or ref.name not in self.observed:
                continue
            seen = self.observed[ref.name]
            preempted = ref.node_state in _DEAD_NODES
            if ref.state not in _DEAD_STATES and not preempted:
                continue
            if ref.state is QueuedResourceState.FAILED and not preempted:
                if ref.active_at is None:
                    detail = seen.error_message or "no capacity before valid-until"
                    self.learn_empty(ref, detail)
                    self.log(ref, Step.EXPIRED, detail)
                else:
                    self.log(ref, Step.FAILED, seen.error_message or "failed after ACTIVE")
                self.request_delete(ref, "queued resource FAILED")
            elif ref.tier is Tier.FLEX_START and not preempted and seen.state_initiator != "USER":
                self.log(ref, Step.ENDED, "flex-start run reached its max run duration")
                self.notes.append(f"flex-start run in {ref.zone} ended normally")
                self.request_delete(ref, "flex-start run ended (SUSPENDED by the service)")
            elif seen.state_initiator == "USER" and not preempted:
                self.log(ref, Step.SUSPENDED, "suspended by a user action")
                self.request_delete(ref, "suspended by a user action")
            else:
                if ref.tier in (Tier.SPOT, Tier.FLEX_START):
                    self.remember(
                        learn_preemption(
                            zone=ref.zone,
                            tier=ref.tier,
                            accelerator=accelerator,
                            memory=self.memory,
                            now=self.now,
                            policy=self.policy.memory,
                        )
                    )
                self.log(ref, Step.PREEMPTED, f"node {ref.node_state.value if ref.node_state else 'gone'}")
                self.notes.append(f"preempted in {ref.zone}")
                self.request_delete(ref, "preempted")

    def settle_on(self, winner: ResourceRef, current: list[ResourceRef], older: list[ResourceRef]) -> None:
        """A slice is ACTIVE: keep it, force-delete every other request of this generation."""
        granted = ref_slice(self.spec, winner)
        self.forget(forget_on_success(self.memory, winner.zone, winner.tier, granted))
        for ref in current:
            if ref is not winner:
                self.request_delete(ref, f"capacity found in {winner.zone} ({winner.tier.value})")
                if ref.state is QueuedResourceState.ACTIVE:
                    self.log(ref, Step.HEDGE_LOST, "a second slice came up; the first one is kept")
        previous_winner = _winner_of(self.before, self.generation)
        handed_over = self.status.phase is Phase.SERVING and self.status.observed_generation == self.generation
        for ref in older:
            if ref.state is not QueuedResourceState.ACTIVE or handed_over:
                self.request_delete(ref, f"generation {ref.generation} replaced by {self.generation}")
            elif self.age_s(winner.active_at) >= self.policy.handover_s:
                self.request_delete(ref, f"generation {ref.generation} replaced (handover timed out)")
        new_slice = previous_winner != winner.name or self.before.observed_generation != self.generation
        if new_slice or self.status.phase in _PROVISIONER_PHASES:
            self.set_phase(Phase.BOOTING)
        self.status.observed_generation = self.generation
        self.status.zone = winner.zone
        self.status.tier = winner.tier
        self.status.backend = winner.backend
        self.status.accelerator = granted
        self.status.search_since = None
        self.status.endpoint = winner.endpoint
        waiting_old = [r for r in older if r.delete_requested_at is None]
        handover = f"; generation {waiting_old[0].generation} serves until this one does" if waiting_old else ""
        via = f" via {winner.backend.value}" if len(self.backends) > 1 or winner.backend is not Backend.TPU_API else ""
        size = f" on {granted}" if granted != self.spec.accelerator else ""
        self.status.message = f"ACTIVE in {winner.zone} ({winner.tier.value}){via}{size} as {winner.name}{handover}"

    def search(self, current: list[ResourceRef], serving_old: list[ResourceRef]) -> None:
        """No slice of this generation is ACTIVE: keep up to ``hedge`` requests outstanding."""
        outstanding, parked, waiting_notes = self.sort_pending(current)
        if self.status.search_since is None:
            self.status.search_since = self.now  # the slice ladder's clock (shared.domain.slice_ladder)
        paused_until = rate_limited_until(self.memory, self.now)
        created = 0
        if paused_until is None:
            created = self.ask_for_more(outstanding, parked)
        else:
            self.notes.append(f"create rate limit: no new requests before {paused_until:%H:%M:%S}")

        if serving_old and self.status.phase not in _PROVISIONER_PHASES:
            self.status.message = (
                f"generation {self.generation}: searching; generation {serving_old[0].generation} serves"
            )
            return
        provisioning = any(r.state is QueuedResourceState.PROVISIONING for r in outstanding)
        if outstanding or created or parked:
            self.set_phase(Phase.PROVISIONING if provisioning else Phase.SEARCHING)
            self.status.message = "; ".join(self.notes + waiting_notes) or "requests sent"
            return
        self.explain_nothing_to_try(waiting_notes)

    def sort_pending(self, current: list[ResourceRef]) -> tuple[list[ResourceRef], list[ResourceRef], list[str]]:
        """Split this generation's pending requests into outstanding (counted toward the hedge) and parked,
        giving up the overdue ones; returns both and a note per request for the status message."""
        outstanding: list[ResourceRef] = []
        parked: list[ResourceRef] = []
        waiting_notes: list[str] = []
        for ref in sorted(current, key=lambda r: r.attempt):
            if ref.state not in _PENDING_STATES:
                continue
            if self.checked_out(ref) and len(parked) < self.policy.park_after_check:
                self.park(ref)
                parked.append(ref)
                waiting_notes.append(f"{ref.zone} {ref.tier.value}: parked {self.age_s(ref.created_at) / 60:.0f} min")
                continue
            if self.give_up_if_overdue(ref):
                continue
            stuck_for = self.age_s(ref.state_since) if ref.state is QueuedResourceState.PROVISIONING else 0.0
            if stuck_for >= self.policy.provisioning_stuck_s:
                waiting_notes.append(f"stuck provisioning in {ref.zone} for {stuck_for / 60:.0f} min")
                continue
            outstanding.append(ref)
            if ref.state is QueuedResourceState.UNKNOWN and ref.name not in self.observed:
                self.reissue_create(ref)
            label = "waiting for chips" if ref.state is QueuedResourceState.WAITING else ref.state.value.lower()
            waiting_notes.append(f"{ref.zone} {ref.tier.value}: {label} {self.age_s(ref.created_at) / 60:.0f} min")
        return outstanding, parked, waiting_notes

    def ask_for_more(self, outstanding: list[ResourceRef], parked: list[ResourceRef]) -> int:
        """Create requests in the best free pairs until the hedge is full; returns how many were created.
        Each slice the ladder allows now (shared.domain.slice_ladder) is a candidate, the spec's own first."""
        created = 0
        parked_names = {r.name for r in parked}
        busy_zones = {
            r.zone
            for r in self.refs.values()
            if r.generation == self.generation
            and r.delete_requested_at is None
            and r.state in _PENDING_STATES
            and r.name not in parked_names
        }
        parked_pairs = {(r.zone, r.tier, ref_slice(self.spec, r)) for r in parked}
        need = self.spec.hedge - len(outstanding)
        ranked = self.ranked_candidates()
        advised = ranked[0][0] if ranked else self.spec.accelerator  # the slice the advice was asked for
        for accelerator, candidate in ranked:
            if need <= 0 or self.tokens <= 0 or created >= self.policy.max_creates_per_plan:
                break
            if self.status.next_attempt >= self.policy.max_attempts:
                break
            if candidate.zone in busy_zones or (candidate.zone, candidate.tier, accelerator) in parked_pairs:
                continue
            advice = self.advice.get((candidate.zone, candidate.tier)) if accelerator == advised else None
            self.create(candidate.zone, candidate.tier, candidate.backend, advice, accelerator)
            busy_zones.add(candidate.zone)
            need -= 1
            created += 1
        return created

    def ranked_candidates(self) -> list[tuple[str, BackendCandidate]]:
        """(slice, candidate) pairs, best first. The slice the ladder widened to last comes first (its pairs were
        never asked; the earlier slices' requests stay queued), each slice's pairs swept before asking again where
        the search came up empty; advice (asked for that newest slice) reorders within its sweep. A pair cooling
        down after a stockout of a bigger slice is still asked for a smaller one, after the rest."""
        ranked: list[tuple[str, BackendCandidate]] = []
        slices = allowed_slices(self.spec, self.status.search_since, self.now, self.policy.step)
        for accelerator in reversed(slices):
            per_slice = self.rank_slice(accelerator, self.memory)
            per_slice.sort(key=lambda item: item.candidate.remembered_failures)
            if accelerator == slices[-1]:
                per_slice = order_by_advice(per_slice, self.advice, advice_weight(self.memory, self.policy.advice))
            if accelerator != self.spec.accelerator:
                asked = {(c.zone, c.tier, c.backend) for c in per_slice}
                cooling = {k: v for k, v in self.memory.items() if not k.startswith("stockout/")}
                later = self.rank_slice(accelerator, cooling)
                per_slice += [c for c in later if (c.zone, c.tier, c.backend) not in asked]
            ranked.extend((accelerator, item) for item in per_slice)
        return ranked

    def rank_slice(self, accelerator: str, memory: dict[str, ZoneMemoryEntry]) -> list[BackendCandidate]:
        return rank_backends(
            self.spec.zones,
            self.spec.tiers,
            self.backends,
            accelerator,
            memory,
            self.now,
            price=self.price,
            policy=self.policy.memory,
        )

    def checked_out(self, ref: ResourceRef) -> bool:
        """Still queued past its capacity check (and not yet past its own valid-until)."""
        queued = ref.state in (QueuedResourceState.WAITING, QueuedResourceState.ACCEPTED)
        quota_bound = self.quota_bound(ref)  # a spot probe found the wait held by quota: no capacity check to wait out
        unchecked = ref.wait_until is None or self.now < ref.wait_until
        if not queued or (unchecked and not quota_bound) or ref.created_at is None:
            return False
        return self.now < ref.created_at + timedelta(minutes=self.spec.valid_until_minutes)

    def park(self, ref: ResourceRef) -> None:
        """Keep a checked request queued; the pair's empty check is learned once (it ranks and times the pair)."""
        if self.quota_bound(ref):
            return  # not a capacity check: the probe's verdict and the region's quota-bound block were learned
        key = stockout_key(ref.zone, accelerator_family(self.spec.accelerator), ref.tier)
        entry = self.memory.get(key)
        if entry is not None and ref.wait_until is not None and entry.updated_at >= ref.wait_until:
            return
        minutes = self.age_s(ref.created_at) / 60
        detail = f"no capacity after a {minutes:.0f}-minute capacity check; the request stays queued"
        self.learn_empty(ref, detail)
        self.log(ref, Step.PARKED, detail)

    def quota_bound(self, ref: ResourceRef) -> bool:
        """A spot probe found this wait, or another of its tier in its region, held by quota (shared.domain.spot_probe):
        the region's quota holds them all, so none has a capacity check to wait out."""
        entry = self.memory.get(quota_bound_key(ref.zone, ref.tier, self.spec.accelerator))
        return ref.probe == "quota" or (entry is not None and is_active(entry, self.now))

    def give_up_if_overdue(self, ref: ResourceRef) -> bool:
        """Past its capacity check or its own valid-until, or PROVISIONING too long: force-delete, cool the pair."""
        accelerator = self.spec.accelerator
        queued = ref.state in (QueuedResourceState.WAITING, QueuedResourceState.ACCEPTED)
        if queued and ref.wait_until is not None and self.now >= ref.wait_until:
            minutes = self.age_s(ref.created_at) / 60
            detail = f"no capacity after a {minutes:.0f}-minute capacity check"
            self.learn_empty(ref, detail)
            self.log(ref, Step.CHECKED, detail)
            self.request_delete(ref, "capacity check over; trying elsewhere")
            return True
        if queued and ref.created_at is not None:
            deadline = ref.created_at + timedelta(minutes=self.spec.valid_until_minutes)
            if self.now >= deadline + timedelta(seconds=self.policy.waiting_overdue_s):
                self.learn_empty(ref, "still queued past valid-until")
                self.log(ref, Step.GAVE_UP, "still queued past its valid-until")
                self.request_delete(ref, "queued past valid-until")
                return True
        if ref.state is QueuedResourceState.PROVISIONING:
            minutes = self.age_s(ref.state_since) / 60
            if minutes * 60 >= self.policy.provisioning_give_up_s:
                self.remember(
                    learn_stuck(
                        zone=ref.zone,
                        tier=ref.tier,
                        accelerator=accelerator,
                        memory=self.memory,
                        now=self.now,
                        minutes=minutes,
                        policy=self.policy.memory,
                    )
                )
                self.log(ref, Step.STUCK, f"PROVISIONING for {minutes:.0f} min without becoming ACTIVE")
                self.request_delete(ref, "stuck provisioning")
                return True
        return False

    def explain_nothing_to_try(self, waiting_notes: list[str]) -> None:
        """Nothing outstanding and nothing allowed: say why, and fail only when nothing will ever change."""
        accelerator = self.spec.accelerator
        reasons: list[str] = []
        permanent = True
        for zone in self.spec.zones:
            for tier in self.spec.tiers:
                blocks = [blocking_entry_for(self.memory, zone, tier, accelerator, b, self.now) for b in self.backends]
                entry = blocks[0] if all(block is not None for block in blocks) else None
                if entry is None:
                    permanent = False
                    continue
                until = "until cleared" if entry.until is None else f"until {entry.until:%Y-%m-%d %H:%M}"
                note = _unknown_zone_note(zone, accelerator) if entry.error_class == ErrorClass.PERMISSION else ""
                reasons.append(f"{zone}/{tier.value}: {entry.error_class} {until}{note}")
                if entry.until is not None and entry.kind != "unsupported":
                    permanent = False
        if self.status.next_attempt >= self.policy.max_attempts:
            self.set_phase(Phase.FAILED)
            self.status.message = f"gave up after {self.status.next_attempt} attempts"
            return
        if reasons and permanent:
            self.set_phase(Phase.FAILED)
            self.status.message = "no allowed zone and tier: " + "; ".join(reasons[:8])
            return
        self.set_phase(Phase.SEARCHING)
        head = self.notes + waiting_notes
        self.status.message = "; ".join(
            head
            + (
                ["every pair is cooling down: " + "; ".join(reasons[:6])]
                if reasons
                else ["waiting for the create rate limit"]
            )
        )

    def account_spend(self) -> None:
        """Charge ACTIVE time since the last plan (a slice bills while its nodes are up)."""
        start = self.before.billed_until
        billing = any(ref.state is QueuedResourceState.ACTIVE for ref in [*self.before.resources, *self.refs.values()])
        if not billing:
            return  # nothing to charge: leave the status untouched so an idle tick writes nothing
        for ref in self.before.resources:
            if ref.state is not QueuedResourceState.ACTIVE or ref.active_at is None or ref.node_state in _DEAD_NODES:
                continue
            since = max(start, ref.active_at) if start is not None else ref.active_at
            until = min(self.now, ref.delete_requested_at) if ref.delete_requested_at else self.now
            hours = max(0.0, (until - since).total_seconds() / 3600)
            accelerator = ref_slice(self.spec, ref)
            usd, _ = estimated_price(ref.zone, ref.tier, accelerator, self.price)
            self.status.spend_usd = round(self.status.spend_usd + hours * usd * chips_of(accelerator), 6)
        self.status.billed_until = self.now


def _winner_of(status: DeploymentStatus, generation: int) -> str | None:
    """The slice a status was serving from: the earliest ACTIVE of the generation not being deleted."""
    active = sorted(
        (
            r
            for r in status.resources
            if r.generation == generation and r.state is QueuedResourceState.ACTIVE and r.delete_requested_at is None
        ),
        key=lambda r: (r.active_at is None, r.active_at.timestamp() if r.active_at else 0.0, r.attempt),
    )
    return active[0].name if active else None


def _unknown_zone_note(zone: str, accelerator: str) -> str:
    """The TPU API answers an unknown zone as a denied location (permission); say what it more likely is."""
    family = accelerator_family(accelerator)
    known = offering_zones(family)
    if not known or zone in known:
        return ""
    return f" (unknown zone: {zone} is not a zone that offers {family}; check its spelling)"


def _int_label(value: str | None, default: int) -> int:
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default

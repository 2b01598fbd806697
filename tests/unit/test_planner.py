"""The pure reconcile planner, driven with tables of records, observations and outcomes."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shared.domain.cloud import LABEL_DEPLOYMENT, LABEL_GENERATION, ObservedResource
from shared.domain.errors import ErrorClass
from shared.domain.models import (
    CalendarWindow,
    DeploymentRecord,
    DeploymentSpec,
    DeploymentStatus,
    Desired,
    NodeState,
    Phase,
    QueuedResourceState,
    ResourceRef,
    Tier,
    ZoneMemoryEntry,
)
from shared.domain.planner import (
    Action,
    CreateQueuedResource,
    DeleteResource,
    ForgetZone,
    OperationOutcome,
    PlannerPolicy,
    RememberZone,
    WriteStatus,
    needs_ticks,
    parse_resource_name,
    plan,
    request_id,
    resource_name,
)
from shared.domain.zone_memory import RATE_LIMIT_KEY, CloudFailure, learn

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
ZONES = ("us-central1-b", "us-east1-d", "europe-west4-a")
QR = QueuedResourceState
SERVING_PHASES = (Phase.BOOTING, Phase.COMPILING, Phase.SERVING, Phase.DEGRADED, Phase.STALLED, Phase.DOWN)


def make_spec(**overrides: Any) -> DeploymentSpec:
    values: dict[str, Any] = {
        "deployment_id": "gemma",
        "model": "gemma-4-26b-a4b",
        "accelerator": "v6e-4",
        "zones": ZONES,
        "tiers": (Tier.SPOT,),
    }
    values.update(overrides)
    return DeploymentSpec(**values)


def make_record(
    resources: Sequence[ResourceRef] = (),
    *,
    generation: int = 1,
    desired: Desired = Desired.PRESENT,
    phase: Phase = Phase.PENDING,
    next_attempt: int = 0,
    created_at: datetime = NOW,
    observed_generation: int | None = None,
    **spec: Any,
) -> DeploymentRecord:
    if observed_generation is None:
        observed_generation = generation if phase in SERVING_PHASES else 0
    status = DeploymentStatus(
        phase=phase, resources=list(resources), next_attempt=next_attempt, observed_generation=observed_generation
    )
    return DeploymentRecord(
        deployment_id="gemma",
        spec=make_spec(**spec),
        generation=generation,
        desired=desired,
        status=status,
        created_at=created_at,
        updated_at=created_at,
    )


def ref(
    attempt: int,
    zone: str = "us-central1-b",
    state: QueuedResourceState = QR.WAITING,
    *,
    tier: Tier = Tier.SPOT,
    generation: int = 1,
    age_min: float = 5,
    **extra: Any,
) -> ResourceRef:
    return ResourceRef(
        name=resource_name("gemma", generation, attempt),
        zone=zone,
        tier=tier,
        generation=generation,
        attempt=attempt,
        state=state,
        created_at=NOW - timedelta(minutes=age_min),
        state_since=NOW - timedelta(minutes=age_min),
        **extra,
    )


def seen(
    resource: ResourceRef,
    state: QueuedResourceState | None = None,
    *,
    owner: str = "gemma",
    node_state: NodeState | None = None,
    initiator: str = "",
) -> ObservedResource:
    return ObservedResource(
        name=resource.name,
        zone=resource.zone,
        state=state or resource.state,
        tier=resource.tier,
        accelerator="v6e-4",
        labels={LABEL_DEPLOYMENT: owner, LABEL_GENERATION: str(resource.generation)},
        node_state=node_state,
        endpoint=f"10.0.0.{resource.attempt + 1}:8000" if (state or resource.state) is QR.ACTIVE else None,
        state_initiator=initiator,
        created_at=resource.created_at,
    )


def status_of(actions: list[Action]) -> DeploymentStatus:
    writes = [a for a in actions if isinstance(a, WriteStatus)]
    assert len(writes) == 1
    return writes[0].status


def creates(actions: list[Action]) -> list[CreateQueuedResource]:
    return [a for a in actions if isinstance(a, CreateQueuedResource)]


def deletes(actions: list[Action]) -> list[DeleteResource]:
    return [a for a in actions if isinstance(a, DeleteResource)]


def remembered(actions: list[Action]) -> list[ZoneMemoryEntry]:
    return [a.entry for a in actions if isinstance(a, RememberZone)]


class TestNames:
    def test_names_are_deterministic_and_parse_back(self) -> None:
        name = resource_name("gemma", 3, 12)
        assert name == "gemma-g3-a12"
        assert parse_resource_name(name) == (3, 12)
        assert parse_resource_name("someone-elses-tpu") is None

    def test_the_longest_deployment_id_still_fits_a_tpu_name(self) -> None:
        assert len(resource_name("a" * 40, 9999, 9999)) <= 63

    def test_request_ids_are_stable_per_verb(self) -> None:
        assert request_id("gemma", 1, 0, "create") == request_id("gemma", 1, 0, "create")
        assert request_id("gemma", 1, 0, "create") != request_id("gemma", 1, 0, "delete")
        assert request_id("gemma", 1, 0, "create") != request_id("gemma", 2, 0, "create")


class TestFirstSearch:
    def test_a_new_deployment_asks_for_hedge_slices_in_the_best_distinct_zones(self) -> None:
        actions = plan(make_record(), [], [], NOW)
        made = creates(actions)
        assert [c.request.zone for c in made] == ["us-central1-b", "us-east1-d"]  # spot 0.648 both, zone order
        first = made[0].request
        assert first.resource_id == "gemma-g1-a0"
        assert first.request_id == request_id("gemma", 1, 0, "create")
        assert first.labels[LABEL_DEPLOYMENT] == "gemma"
        assert first.labels[LABEL_GENERATION] == "1"
        assert first.valid_until_s == 240 * 60
        status = status_of(actions)
        assert status.phase is Phase.SEARCHING
        assert [r.name for r in status.resources] == ["gemma-g1-a0", "gemma-g1-a1"]
        assert all(r.state is QR.UNKNOWN for r in status.resources)  # expectations, written before the calls
        assert status.next_attempt == 2
        assert actions.index(next(a for a in actions if isinstance(a, WriteStatus))) < actions.index(made[0])

    def test_the_same_inputs_give_the_same_plan(self) -> None:
        assert plan(make_record(), [], [], NOW) == plan(make_record(), [], [], NOW)

    def test_creates_stop_when_the_token_bucket_is_empty(self) -> None:
        assert len(creates(plan(make_record(), [], [], NOW, create_tokens=1))) == 1
        actions = plan(make_record(), [], [], NOW, create_tokens=0)
        assert creates(actions) == []
        assert status_of(actions).phase is Phase.SEARCHING

    def test_a_flex_start_request_carries_the_run_cap(self) -> None:
        record = make_record(tiers=(Tier.FLEX_START,), zones=("us-east5-b",), max_run_hours=2)
        request = creates(plan(record, [], [], NOW))[0].request
        assert request.tier is Tier.FLEX_START
        assert request.max_run_s == 7200

    def test_an_active_rate_limit_sends_no_creates(self) -> None:
        entry = learn(
            CloudFailure(ErrorClass.RATE_LIMIT, "429"),
            zone="us-central1-b",
            tier=Tier.SPOT,
            accelerator="v6e-4",
            memory={},
            now=NOW,
        )
        assert entry is not None and entry.key == RATE_LIMIT_KEY
        actions = plan(make_record(), [], [entry], NOW)
        assert creates(actions) == []
        assert "rate limit" in status_of(actions).message


class TestWaiting:
    def test_waiting_for_resources_is_not_failure(self) -> None:
        a, b = ref(0, "us-central1-b", age_min=90), ref(1, "us-east1-d", age_min=90)
        actions = plan(make_record([a, b], next_attempt=2), [seen(a), seen(b)], [], NOW)
        assert creates(actions) == []
        assert deletes(actions) == []
        status = status_of(actions)
        assert status.phase is Phase.SEARCHING
        assert "waiting for chips" in status.message

    def test_a_request_queued_past_its_own_valid_until_is_given_up(self) -> None:
        late = ref(0, "us-central1-b", age_min=240 + 11)
        actions = plan(make_record([late], next_attempt=1), [seen(late)], [], NOW)
        assert [d.name for d in deletes(actions)] == [late.name]
        assert any(e.key == "stockout/us-central1-b/v6e/spot" for e in remembered(actions))
        assert [c.request.zone for c in creates(actions)] == ["us-east1-d", "europe-west4-a"]


class TestCapacityCheck:
    def test_a_new_pair_gets_a_short_capacity_check_that_doubles_with_each_empty_check(self) -> None:
        actions = plan(make_record(), [], [], NOW)
        assert status_of(actions).resources[0].wait_until == NOW + timedelta(minutes=5)
        assert creates(actions)[0].request.valid_until_s == 240 * 60  # the request's own valid-until is the user's
        memory: dict[str, ZoneMemoryEntry] = {}
        for _ in range(2):
            entry = learn(
                CloudFailure(ErrorClass.STOCKOUT),
                zone="us-central1-b",
                tier=Tier.SPOT,
                accelerator="v6e-4",
                memory=memory,
                now=NOW - timedelta(hours=5),
            )
            assert entry is not None
            memory[entry.key] = entry
        later = status_of(plan(make_record(zones=("us-central1-b",), hedge=1), [], memory, NOW))
        assert later.resources[0].wait_until == NOW + timedelta(minutes=20)

    def test_no_capacity_check_when_the_window_reaches_valid_until_or_is_switched_off(self) -> None:
        short = status_of(plan(make_record(valid_until_minutes=5), [], [], NOW))
        assert all(r.wait_until is None for r in short.resources)
        off = status_of(plan(make_record(), [], [], NOW, policy=PlannerPolicy(capacity_check_minutes=None)))
        assert all(r.wait_until is None for r in off.resources)

    def test_a_request_still_waiting_after_its_check_makes_room_for_the_next_pair(self) -> None:
        a = ref(0, "us-central1-b", QR.WAITING, age_min=11, wait_until=NOW - timedelta(minutes=1))
        no_parking = PlannerPolicy(park_after_check=0)
        actions = plan(make_record([a], next_attempt=1, hedge=1), [seen(a)], [], NOW, policy=no_parking)
        assert [d.name for d in deletes(actions)] == [a.name]
        assert [e.key for e in remembered(actions)] == ["stockout/us-central1-b/v6e/spot"]
        assert [c.request.zone for c in creates(actions)] == ["us-east1-d"]
        assert any(log.outcome == "checked" for log in status_of(actions).attempts)

    def test_the_search_sweeps_untried_pairs_before_asking_again_where_it_waited(self) -> None:
        memory: dict[str, ZoneMemoryEntry] = {}
        for zone in ("us-central1-b", "us-east1-d"):
            entry = learn(
                CloudFailure(ErrorClass.STOCKOUT),
                zone=zone,
                tier=Tier.SPOT,
                accelerator="v6e-4",
                memory=memory,
                now=NOW - timedelta(hours=1),
            )
            assert entry is not None
            memory[entry.key] = entry  # expired cooldowns: allowed again, but already tried
        record = make_record(zones=("us-central1-b", "us-east1-d", "us-east5-b"), tiers=(Tier.SPOT, Tier.ON_DEMAND))
        made = [(c.request.zone, c.request.tier) for c in creates(plan(record, [], memory, NOW))]
        assert made == [("us-east5-b", Tier.SPOT), ("us-central1-b", Tier.ON_DEMAND)]

    def test_a_checked_request_is_parked_learned_once_and_the_search_moves_on(self) -> None:
        a = ref(0, "us-central1-b", QR.WAITING, age_min=11, wait_until=NOW - timedelta(minutes=1))
        actions = plan(make_record([a], next_attempt=1, hedge=1), [seen(a)], [], NOW)
        assert deletes(actions) == []  # still queued: it may yet get the chips
        assert [e.key for e in remembered(actions)] == ["stockout/us-central1-b/v6e/spot"]
        assert [c.request.zone for c in creates(actions)] == ["us-east1-d"]  # not counted toward the hedge
        status = status_of(actions)
        assert [log.outcome for log in status.attempts].count("parked") == 1
        memory = {e.key: e for e in remembered(actions)}
        again = plan(
            make_record(status.resources, next_attempt=status.next_attempt, hedge=1),
            [seen(r.model_copy(update={"state": QR.WAITING})) for r in status.resources],
            memory,
            NOW + timedelta(minutes=1),
        )
        assert remembered(again) == [] and deletes(again) == [] and creates(again) == []

    def test_parking_is_capped_and_a_parked_pair_is_never_asked_twice(self) -> None:
        checked = [
            ref(i, zone, QR.WAITING, age_min=11, wait_until=NOW - timedelta(minutes=1)) for i, zone in enumerate(ZONES)
        ]
        record = make_record(checked, next_attempt=3, hedge=1)
        actions = plan(record, [seen(r) for r in checked], [], NOW, policy=PlannerPolicy(park_after_check=2))
        assert [d.name for d in deletes(actions)] == [checked[2].name]  # the third is over the cap
        parked = ref(0, "us-central1-b", QR.WAITING, age_min=30, wait_until=NOW - timedelta(minutes=20))
        learned = learn(
            CloudFailure(ErrorClass.STOCKOUT),
            zone="us-central1-b",
            tier=Tier.SPOT,
            accelerator="v6e-4",
            memory={},
            now=NOW - timedelta(minutes=15),
        )
        assert learned is not None  # its cooldown is over: only the parked request keeps the pair from a second one
        record = make_record(
            [parked], next_attempt=1, hedge=1, zones=("us-central1-b",), tiers=(Tier.SPOT, Tier.ON_DEMAND)
        )
        made = [(c.request.zone, c.request.tier) for c in creates(plan(record, [seen(parked)], [learned], NOW))]
        assert made == [("us-central1-b", Tier.ON_DEMAND)]

    def test_a_parked_request_is_deleted_when_another_slice_turns_active(self) -> None:
        parked = ref(0, "us-central1-b", QR.WAITING, age_min=30, wait_until=NOW - timedelta(minutes=20))
        winner = ref(1, "us-east1-d", QR.ACTIVE, active_at=NOW)
        actions = plan(make_record([parked, winner], next_attempt=2), [seen(parked), seen(winner)], [], NOW)
        assert [d.name for d in deletes(actions)] == [parked.name]

    def test_a_request_that_found_capacity_is_never_cut_short(self) -> None:
        a = ref(0, "us-central1-b", QR.PROVISIONING, age_min=11, wait_until=NOW - timedelta(minutes=1))
        actions = plan(make_record([a], next_attempt=1, hedge=1), [seen(a)], [], NOW)
        assert deletes(actions) == [] and creates(actions) == []

    def test_a_delete_that_did_not_land_is_sent_again(self) -> None:
        winner = ref(0, "us-central1-b", QR.ACTIVE, active_at=NOW - timedelta(minutes=5))
        loser = ref(1, "us-east1-d", QR.WAITING, delete_requested_at=NOW - timedelta(minutes=2))
        record = make_record([winner, loser], next_attempt=2, phase=Phase.SERVING)
        actions = plan(record, [seen(winner), seen(loser)], [], NOW)
        assert [d.name for d in deletes(actions)] == [loser.name]
        assert status_of(actions).resources[1].delete_requested_at == loser.delete_requested_at


class TestFailover:
    def test_a_stockout_fails_over_to_another_zone_in_the_same_plan(self) -> None:
        a = ref(0, "us-central1-b", QR.CREATING, operation="op-0")
        failure = CloudFailure(ErrorClass.STOCKOUT, "There is no more capacity in the zone", surfaced="operation")
        actions = plan(
            make_record([a], next_attempt=1, hedge=1),
            [],
            [],
            NOW,
            outcomes={a.name: OperationOutcome(done=True, failure=failure)},
        )
        [entry] = remembered(actions)
        assert entry.key == "stockout/us-central1-b/v6e/spot"
        assert entry.until is not None and entry.until > NOW
        assert [c.request.zone for c in creates(actions)] == ["us-east1-d"]
        status = status_of(actions)
        assert [r.name for r in status.resources] == ["gemma-g1-a1"]
        assert status.attempts[0].outcome == "stockout"

    def test_a_failed_request_that_lingers_is_deleted_and_kept_until_gone(self) -> None:
        a = ref(0, "us-central1-b", QR.CREATING, operation="op-0")
        failure = CloudFailure(
            ErrorClass.UNSUPPORTED, "FLEX_START provisioning model is not supported", surfaced="operation"
        )
        actions = plan(
            make_record([a], next_attempt=1, hedge=1),
            [seen(a, QR.FAILED)],
            [],
            NOW,
            outcomes={a.name: OperationOutcome(done=True, failure=failure)},
        )
        assert [d.name for d in deletes(actions)] == [a.name]
        assert all(d.force for d in deletes(actions))
        status = status_of(actions)
        kept = next(r for r in status.resources if r.name == a.name)
        assert kept.delete_requested_at == NOW
        gone = plan(make_record(status.resources, next_attempt=status.next_attempt, hedge=1), [], [], NOW)
        assert a.name not in [r.name for r in status_of(gone).resources]
        assert any(log.outcome == "deleted" for log in status_of(gone).attempts)

    def test_a_queued_resource_failed_at_valid_until_counts_as_a_stockout(self) -> None:
        a = ref(0, "us-central1-b", QR.WAITING, age_min=241)
        actions = plan(make_record([a], next_attempt=1, hedge=1), [seen(a, QR.FAILED)], [], NOW)
        assert [d.name for d in deletes(actions)] == [a.name]
        assert [e.key for e in remembered(actions)] == ["stockout/us-central1-b/v6e/spot"]
        assert [c.request.zone for c in creates(actions)] == ["us-east1-d"]

    def test_a_transient_create_error_keeps_the_request_for_the_same_retry(self) -> None:
        a = ref(0, "us-central1-b", QR.UNKNOWN, age_min=0)
        failure = CloudFailure(ErrorClass.TRANSIENT, "503", surfaced="sync")
        actions = plan(
            make_record([a], next_attempt=1, hedge=1),
            [],
            [],
            NOW,
            reissue=False,
            outcomes={a.name: OperationOutcome(done=True, failure=failure)},
        )
        assert creates(actions) == []
        assert [r.name for r in status_of(actions).resources] == [a.name]
        again = plan(make_record([a], next_attempt=1, hedge=1), [], [], NOW + timedelta(minutes=1))
        [retry] = creates(again)
        assert retry.reissue
        assert retry.request.resource_id == a.name
        assert retry.request.request_id == request_id("gemma", 1, 0, "create")

    def test_an_unconfirmed_create_is_dropped_after_its_timeout(self) -> None:
        a = ref(0, "us-central1-b", QR.UNKNOWN, age_min=16)
        actions = plan(make_record([a], next_attempt=1, hedge=1), [], [], NOW)
        assert a.name not in [r.name for r in status_of(actions).resources]
        assert [c.request.resource_id for c in creates(actions)] == ["gemma-g1-a1"]


class TestCapacityFound:
    def test_the_first_active_slice_wins_and_the_rest_are_force_deleted(self) -> None:
        a = ref(0, "us-central1-b", QR.WAITING)
        b = ref(1, "us-east1-d", QR.WAITING)
        stockout = learn(
            CloudFailure(ErrorClass.STOCKOUT),
            zone="us-east1-d",
            tier=Tier.SPOT,
            accelerator="v6e-4",
            memory={},
            now=NOW - timedelta(hours=3),
        )
        assert stockout is not None
        actions = plan(
            make_record([a, b], next_attempt=2, phase=Phase.SEARCHING), [seen(a), seen(b, QR.ACTIVE)], [stockout], NOW
        )
        assert [d.name for d in deletes(actions)] == [a.name]
        assert creates(actions) == []
        assert ForgetZone(stockout.key) in actions
        status = status_of(actions)
        assert status.phase is Phase.BOOTING
        assert (status.zone, status.tier, status.endpoint) == ("us-east1-d", Tier.SPOT, "10.0.0.2:8000")
        assert status.observed_generation == 1

    def test_two_active_slices_keep_the_earlier_one(self) -> None:
        a = ref(0, "us-central1-b", QR.ACTIVE, active_at=NOW - timedelta(minutes=3))
        b = ref(1, "us-east1-d", QR.WAITING)
        actions = plan(make_record([a, b], next_attempt=2, phase=Phase.SERVING), [seen(a), seen(b, QR.ACTIVE)], [], NOW)
        assert [d.name for d in deletes(actions)] == [b.name]
        status = status_of(actions)
        assert status.phase is Phase.SERVING  # the monitor's phase is kept
        assert any(log.outcome == "hedge_lost" for log in status.attempts)

    def test_spend_accrues_for_active_time(self) -> None:
        a = ref(0, "us-central1-b", QR.ACTIVE, active_at=NOW - timedelta(hours=1))
        record = make_record([a], next_attempt=1, phase=Phase.SERVING)
        record.status.billed_until = NOW - timedelta(hours=1)
        status = status_of(plan(record, [seen(a)], [], NOW))
        assert status.spend_usd == pytest.approx(4 * 0.648)
        assert status.billed_until == NOW


class TestPreemptionAndEndOfRun:
    def test_a_preempted_spot_slice_is_deleted_and_the_search_moves_to_another_region(self) -> None:
        a = ref(0, "us-central1-b", QR.ACTIVE, active_at=NOW - timedelta(hours=1))
        record = make_record(
            [a], next_attempt=1, phase=Phase.SERVING, hedge=1, zones=("us-central1-b", "us-central1-c", "us-east1-d")
        )
        actions = plan(record, [seen(a, QR.SUSPENDED, node_state=NodeState.PREEMPTED, initiator="SERVICE")], [], NOW)
        assert [d.name for d in deletes(actions)] == [a.name]
        assert [e.key for e in remembered(actions)] == ["preempted/us-central1/v6e/spot"]
        assert [c.request.zone for c in creates(actions)] == ["us-east1-d"]
        status = status_of(actions)
        assert status.phase is Phase.SEARCHING
        assert any(log.outcome == "preempted" for log in status.attempts)

    def test_a_flex_start_run_that_ends_is_not_an_error_and_is_replaced(self) -> None:
        a = ref(0, "us-east5-b", QR.ACTIVE, tier=Tier.FLEX_START, active_at=NOW - timedelta(hours=4))
        record = make_record(
            [a], next_attempt=1, phase=Phase.SERVING, tiers=(Tier.FLEX_START,), zones=("us-east5-b",), hedge=1
        )
        actions = plan(record, [seen(a, QR.SUSPENDED, initiator="SERVICE")], [], NOW)
        assert remembered(actions) == []
        assert [d.name for d in deletes(actions)] == [a.name]
        assert [c.request.zone for c in creates(actions)] == ["us-east5-b"]
        assert any(log.outcome == "ended" for log in status_of(actions).attempts)


class TestStuckProvisioning:
    def test_stuck_provisioning_is_told_apart_and_hedged_around(self) -> None:
        a = ref(0, "us-central1-b", QR.PROVISIONING, age_min=25)
        actions = plan(make_record([a], next_attempt=1, hedge=1), [seen(a)], [], NOW)
        assert deletes(actions) == []
        assert [c.request.zone for c in creates(actions)] == ["us-east1-d"]
        assert "stuck provisioning in us-central1-b" in status_of(actions).message

    def test_provisioning_that_never_ends_is_abandoned(self) -> None:
        a = ref(0, "us-central1-b", QR.PROVISIONING, age_min=46)
        actions = plan(make_record([a], next_attempt=1, hedge=1), [seen(a)], [], NOW)
        assert [d.name for d in deletes(actions)] == [a.name]
        [entry] = remembered(actions)
        assert entry.error_class == "stuck_provisioning"

    def test_a_short_provisioning_is_waiting_not_stuck(self) -> None:
        a = ref(0, "us-central1-b", QR.PROVISIONING, age_min=3)
        actions = plan(make_record([a], next_attempt=1, hedge=1), [seen(a)], [], NOW)
        assert creates(actions) == [] and deletes(actions) == []
        assert status_of(actions).phase is Phase.PROVISIONING


class TestTeardown:
    def test_delete_force_deletes_everything_of_ours_and_then_reports_deleted(self) -> None:
        a = ref(0, "us-central1-b", QR.ACTIVE, active_at=NOW - timedelta(hours=1))
        b = ref(1, "us-east1-d", QR.WAITING)
        foreign = ObservedResource(name="not-ours", zone="us-central1-b", state=QR.ACTIVE, labels={})
        record = make_record([a, b], next_attempt=2, desired=Desired.ABSENT, phase=Phase.SERVING)
        actions = plan(record, [seen(a), seen(b), foreign], [], NOW)
        assert sorted(d.name for d in deletes(actions)) == [a.name, b.name]
        assert status_of(actions).phase is Phase.DELETING
        after = make_record(status_of(actions).resources, desired=Desired.ABSENT, phase=Phase.DELETING)
        done = plan(after, [foreign], [], NOW + timedelta(minutes=2))
        assert deletes(done) == []
        assert status_of(done).phase is Phase.DELETED
        assert status_of(done).resources == []

    def test_a_resource_already_deleting_is_not_deleted_again(self) -> None:
        a = ref(0, "us-central1-b", QR.WAITING, delete_requested_at=NOW - timedelta(minutes=1))
        record = make_record([a], desired=Desired.ABSENT, phase=Phase.DELETING)
        assert deletes(plan(record, [seen(a, QR.DELETING)], [], NOW)) == []
        assert [d.name for d in deletes(plan(record, [seen(a, QR.WAITING)], [], NOW))] == [a.name]

    def test_stop_releases_the_slice_and_start_searches_again(self) -> None:
        a = ref(0, "us-central1-b", QR.ACTIVE, active_at=NOW - timedelta(hours=1))
        stopping = plan(
            make_record([a], next_attempt=1, desired=Desired.STOPPED, phase=Phase.SERVING), [seen(a)], [], NOW
        )
        assert [d.name for d in deletes(stopping)] == [a.name]
        assert status_of(stopping).phase is Phase.STOPPING
        stopped = plan(make_record(status_of(stopping).resources, next_attempt=1, desired=Desired.STOPPED), [], [], NOW)
        assert status_of(stopped).phase is Phase.STOPPED
        started = plan(make_record([], next_attempt=1, phase=Phase.STOPPED), [], [], NOW)
        assert [c.request.resource_id for c in creates(started)] == ["gemma-g1-a1", "gemma-g1-a2"]

    def test_the_ttl_tears_the_deployment_down(self) -> None:
        a = ref(0, "us-central1-b", QR.ACTIVE, active_at=NOW - timedelta(hours=1))
        record = make_record(
            [a], next_attempt=1, phase=Phase.SERVING, ttl_hours=1, created_at=NOW - timedelta(hours=1, minutes=1)
        )
        actions = plan(record, [seen(a)], [], NOW)
        assert [d.name for d in deletes(actions)] == [a.name]
        assert "ttl" in status_of(actions).message

    def test_a_booked_window_starts_the_ttl_clock_at_its_start(self) -> None:
        zone = ZONES[0]
        window = CalendarWindow(zone=zone, start=NOW - timedelta(minutes=30), end=NOW + timedelta(days=1))
        booked = {"tiers": (Tier.RESERVATION,), "reservation_name": "tpuctl-cal-gemma", "calendar": window}
        a = ref(0, zone, QR.ACTIVE, active_at=NOW - timedelta(minutes=20))
        created = NOW - timedelta(days=2)  # created two days before its window: the TTL has not run
        kept = plan(
            make_record([a], next_attempt=1, phase=Phase.SERVING, ttl_hours=1, created_at=created, **booked),
            [seen(a)],
            [],
            NOW,
        )
        assert deletes(kept) == []
        later = NOW + timedelta(minutes=31)
        gone = plan(
            make_record([a], next_attempt=1, phase=Phase.SERVING, ttl_hours=1, created_at=created, **booked),
            [seen(a)],
            [],
            later,
        )
        assert [d.name for d in deletes(gone)] == [a.name] and "ttl" in status_of(gone).message

    def test_the_budget_tears_the_deployment_down(self) -> None:
        a = ref(0, "us-central1-b", QR.ACTIVE, active_at=NOW - timedelta(hours=1))
        record = make_record([a], next_attempt=1, phase=Phase.SERVING, budget_usd=5)
        record.status.spend_usd = 5.5
        actions = plan(record, [seen(a)], [], NOW)
        assert [d.name for d in deletes(actions)] == [a.name]
        assert "budget" in status_of(actions).message

    def test_a_resource_without_our_label_is_never_deleted(self) -> None:
        theirs = ref(0, "us-central1-b", QR.ACTIVE)
        record = make_record([], desired=Desired.ABSENT, phase=Phase.DELETING)
        actions = plan(record, [seen(theirs, owner="someone-else")], [], NOW)
        assert deletes(actions) == []
        assert status_of(actions).phase is Phase.DELETED


class TestUpdate:
    def test_a_new_generation_is_made_before_the_old_one_is_broken(self) -> None:
        old = ref(0, "us-central1-b", QR.ACTIVE, active_at=NOW - timedelta(hours=2))
        record = make_record([old], generation=2, next_attempt=1, phase=Phase.SERVING, hedge=1, observed_generation=1)
        searching = plan(record, [seen(old)], [], NOW)
        assert deletes(searching) == []
        [made] = creates(searching)
        assert made.request.resource_id == "gemma-g2-a1"
        assert status_of(searching).phase is Phase.SERVING

        new = ref(1, "us-east1-d", QR.ACTIVE, generation=2)
        both = make_record(
            [old, new], generation=2, next_attempt=2, phase=Phase.SERVING, hedge=1, observed_generation=1
        )
        booting = plan(both, [seen(old), seen(new)], [], NOW)
        assert deletes(booting) == []  # the old one serves until the new one does
        status = status_of(booting)
        assert status.phase is Phase.BOOTING
        assert status.zone == "us-east1-d"

        served = make_record(status.resources, generation=2, next_attempt=2, phase=Phase.SERVING, hedge=1)
        handover = plan(served, [seen(old), seen(new)], [], NOW + timedelta(minutes=5))
        assert [d.name for d in deletes(handover)] == [old.name]


class TestAdoption:
    def test_a_labelled_slice_without_a_record_is_adopted_not_duplicated(self) -> None:
        lost = ref(4, "us-central1-b", QR.WAITING)
        actions = plan(make_record([], next_attempt=0, hedge=1), [seen(lost)], [], NOW)
        assert creates(actions) == []
        status = status_of(actions)
        assert [r.name for r in status.resources] == [lost.name]
        assert status.next_attempt == 5
        assert status.attempts[0].outcome == "adopted"


class TestNothingLeft:
    def test_when_every_pair_is_unsupported_the_deployment_fails_and_says_why(self) -> None:
        memory: dict[str, ZoneMemoryEntry] = {}
        for zone in ZONES:
            entry = learn(
                CloudFailure(ErrorClass.UNSUPPORTED, f"The requested zone {zone!r} is not supported."),
                zone=zone,
                tier=Tier.SPOT,
                accelerator="v6e-4",
                memory=memory,
                now=NOW,
            )
            assert entry is not None
            memory[entry.key] = entry
        status = status_of(plan(make_record(), [], memory, NOW))
        assert status.phase is Phase.FAILED
        assert "unsupported" in status.message

    def test_when_every_pair_is_cooling_the_search_waits(self) -> None:
        memory: dict[str, ZoneMemoryEntry] = {}
        for zone in ZONES:
            entry = learn(
                CloudFailure(ErrorClass.STOCKOUT),
                zone=zone,
                tier=Tier.SPOT,
                accelerator="v6e-4",
                memory=memory,
                now=NOW,
            )
            assert entry is not None
            memory[entry.key] = entry
        status = status_of(plan(make_record(), [], memory, NOW))
        assert status.phase is Phase.SEARCHING
        assert "cooling down" in status.message

    @pytest.mark.parametrize(
        ("desired", "phase", "resources", "expected"),
        [
            (Desired.PRESENT, Phase.SERVING, False, True),
            (Desired.PRESENT, Phase.FAILED, False, False),
            (Desired.ABSENT, Phase.DELETED, False, False),
            (Desired.ABSENT, Phase.DELETED, True, True),
            (Desired.STOPPED, Phase.STOPPED, False, False),
            (Desired.PRESENT, Phase.STOPPED, False, True),
        ],
    )
    def test_ticks_are_needed_while_work_remains(
        self, desired: Desired, phase: Phase, resources: bool, expected: bool
    ) -> None:
        record = make_record([ref(0)] if resources else [], desired=desired, phase=phase)
        assert needs_ticks(record) is expected

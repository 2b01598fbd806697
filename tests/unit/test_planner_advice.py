"""Capacity advice in the planner: it orders candidates within a sweep, never excludes one, and weighs only
as much as its source has earned (shared.domain.capacity_advice)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

import pytest

from shared.domain.attempts import Step
from shared.domain.capacity_advice import (
    AdvicePolicy,
    AdviceScores,
    advice_trust,
    advice_weight,
    learn_advice_trust,
    trust_key,
)
from shared.domain.errors import ErrorClass
from shared.domain.models import Tier, ZoneMemoryEntry
from shared.domain.planner import Action, OperationOutcome, RememberZone, plan
from shared.domain.zone_memory import CloudFailure, learn
from tests.unit.test_planner import NOW, QR, ZONES, creates, make_record, ref, seen, status_of

POLICY = AdvicePolicy()
EAST, EUROPE = "us-east1-d", "europe-west4-a"


def flat_price(zone: str, tier: Tier, family: str) -> float:
    return 1.0  # every pair costs the same: the order is the user's zone order unless advice moves it


def created_zones(actions: list[Action]) -> list[str]:
    return [c.request.zone for c in creates(actions)]


def search(advice: AdviceScores, memory: Mapping[str, ZoneMemoryEntry] | None = None, hedge: int = 1) -> list[Action]:
    return plan(make_record(hedge=hedge), [], memory or {}, NOW, price=flat_price, advice=advice)


def trust_after(rights: int, wrongs: int) -> dict[str, ZoneMemoryEntry]:
    memory: dict[str, ZoneMemoryEntry] = {}
    for granted in [True] * rights + [False] * wrongs:
        entry = learn_advice_trust(memory, obtainability=0.9, granted=granted, now=NOW, policy=POLICY)
        memory[entry.key] = entry
    return memory


def trust_entry(actions: list[Action]) -> ZoneMemoryEntry:
    [entry] = [a.entry for a in actions if isinstance(a, RememberZone) and a.entry.key == trust_key()]
    return entry


class TestOrdering:
    def test_without_advice_the_order_is_the_users(self) -> None:
        assert created_zones(search({}, hedge=3)) == list(ZONES)

    def test_trusted_advice_puts_the_likely_zone_first(self) -> None:
        advice = {(EUROPE, Tier.SPOT): 0.95, (ZONES[0], Tier.SPOT): 0.0, (EAST, Tier.SPOT): 0.0}
        assert created_zones(search(advice)) == [EUROPE]

    def test_advice_never_excludes_a_pair(self) -> None:
        advice = {(zone, Tier.SPOT): 0.0 for zone in ZONES}
        assert sorted(created_zones(search(advice, hedge=3))) == sorted(ZONES)

    def test_distrusted_advice_leaves_todays_order(self) -> None:
        advice = {(EUROPE, Tier.SPOT): 0.95}
        assert created_zones(search(advice, trust_after(rights=0, wrongs=4), hedge=3)) == list(ZONES)

    def test_a_pair_that_came_up_empty_stays_behind_however_likely_advice_calls_it(self) -> None:
        stockout = learn(
            CloudFailure(ErrorClass.STOCKOUT), zone=ZONES[0], tier=Tier.SPOT, accelerator="v6e-4", memory={}, now=NOW
        )
        assert stockout is not None
        memory = {stockout.key: stockout.model_copy(update={"until": NOW - timedelta(minutes=1)})}
        advice = {(ZONES[0], Tier.SPOT): 0.95, (EAST, Tier.SPOT): 0.0, (EUROPE, Tier.SPOT): 0.0}
        assert created_zones(search(advice, memory, hedge=3)) == [EAST, EUROPE, ZONES[0]]


class TestRecording:
    def test_the_advice_seen_is_kept_on_the_request_and_its_attempt_log(self) -> None:
        status = status_of(search({(ZONES[0], Tier.SPOT): 0.6}, hedge=2))
        assert [(r.zone, r.advice) for r in status.resources] == [(ZONES[0], 0.6), (EAST, None)]
        assert [(a.zone, a.outcome, a.advice) for a in status.attempts] == [
            (ZONES[0], Step.REQUESTED, 0.6),
            (EAST, Step.REQUESTED, None),
        ]


class TestTrust:
    def test_the_prior_gives_a_modest_weight_and_wrong_calls_take_it_to_zero(self) -> None:
        assert advice_weight({}, POLICY) == pytest.approx(POLICY.max_weight / 3)
        assert advice_weight(trust_after(rights=0, wrongs=1), POLICY) == 0.0
        assert advice_weight(trust_after(rights=40, wrongs=0), POLICY) > 0.9 * POLICY.max_weight

    def test_likely_and_granted_raises_trust(self) -> None:
        asked = ref(0, EUROPE, QR.WAITING, advice=0.9)
        record = make_record([asked], next_attempt=1, hedge=1)
        entry = trust_entry(plan(record, [seen(asked, QR.ACTIVE)], {}, NOW))
        assert (entry.successes, entry.failures) == (1, 0)
        assert advice_trust({entry.key: entry}, POLICY) > advice_trust({}, POLICY)

    def test_likely_but_stocked_out_lowers_trust(self) -> None:
        asked = ref(0, EUROPE, QR.CREATING, advice=0.9, operation="op-0")
        failure = CloudFailure(ErrorClass.STOCKOUT, "no more capacity", surfaced="operation")
        record = make_record([asked], next_attempt=1, hedge=1)
        entry = trust_entry(plan(record, [], {}, NOW, outcomes={asked.name: OperationOutcome(True, failure)}))
        assert (entry.successes, entry.failures) == (0, 1)
        assert advice_trust({entry.key: entry}, POLICY) < advice_trust({}, POLICY)

    def test_unlikely_and_empty_is_a_right_call(self) -> None:
        entry = learn_advice_trust({}, obtainability=0.1, granted=False, now=NOW, policy=POLICY)
        assert (entry.successes, entry.failures) == (1, 0)

    def test_a_request_asked_without_advice_teaches_nothing(self) -> None:
        asked = ref(0, EUROPE, QR.WAITING)
        actions = plan(make_record([asked], next_attempt=1, hedge=1), [seen(asked, QR.ACTIVE)], {}, NOW)
        assert not [a for a in actions if isinstance(a, RememberZone) and a.entry.key == trust_key()]

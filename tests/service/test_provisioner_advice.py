"""The provisioner asks capacity advice while it searches, records it next to each attempt, and searches as
before when advice is unavailable. On the simulator through the real TPU adapter."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from shared.adapters.compute_advice import ComputeCapacityAdvice
from shared.domain.capacity_advice import trust_key
from shared.domain.models import Phase, Tier, ZoneMemoryEntry
from shared.ports import CapacityAdvice
from shared.services.provisioner import Provisioner
from tests.support.fixtures_provisioner import HarnessFactory, spot, world
from tests.support.provisioner_harness import Harness

FIRST, SECOND = "europe-west4-a", "us-east5-b"  # the harness's zones in today's order (cheapest first)
ONLY_SECOND_HAS_CHIPS = world({FIRST: spot(0), SECOND: spot(8)})


class KnownAdvice:
    """Advice as a table: (accelerator, tier) -> zone -> obtainability; a missing row is no advice."""

    def __init__(self, table: dict[tuple[str, Tier], dict[str, float]]) -> None:
        self.table = table

    def obtainability(self, accelerator: str, tier: Tier, zones: Sequence[str]) -> dict[str, float]:
        row = self.table.get((accelerator, tier), {})
        return {zone: score for zone, score in row.items() if zone in zones}


def _with_advice(h: Harness, advice: CapacityAdvice | None) -> Harness:
    h.provisioner = Provisioner(h.store, h.tpu, h.clock, settings=h.settings, advice=advice)
    return h


def _search(h: Harness) -> list[tuple[str, float | None]]:
    h.create()
    h.run_until_phase(Phase.BOOTING, minutes=30)
    return [(log.zone, log.advice) for log in h.record().status.attempts if log.outcome == "requested"]


@pytest.fixture
def h(harness_factory: HarnessFactory) -> Harness:
    return harness_factory(ONLY_SECOND_HAS_CHIPS)


def test_without_advice_the_search_asks_the_cheapest_zone_first(h: Harness) -> None:
    assert _search(_with_advice(h, None))[0] == (FIRST, None)


def test_trusted_advice_sends_the_first_request_where_it_says_and_is_recorded_with_it(h: Harness) -> None:
    trusted = ZoneMemoryEntry(
        key=trust_key(), kind="trust", error_class="advice", failures=0, successes=20, updated_at=h.clock.now()
    )
    h.store.put_zone_memory(trusted)
    advice = KnownAdvice({("v6e-4", Tier.SPOT): {FIRST: 0.0, SECOND: 0.95}})
    assert _search(_with_advice(h, advice)) == [(SECOND, 0.95)]
    assert h.record().status.zone == SECOND
    assert h.memory()[trust_key()].successes == 21  # likely and granted: a right call


def test_unreachable_advice_leaves_the_search_as_it_was(harness_factory: HarnessFactory) -> None:
    baseline = _search(_with_advice(harness_factory(ONLY_SECOND_HAS_CHIPS), None))
    dead = ComputeCapacityAdvice(
        "demo-proj", harness_factory(ONLY_SECOND_HAS_CHIPS).clock, endpoint="http://127.0.0.1:9"
    )
    h = _with_advice(harness_factory(ONLY_SECOND_HAS_CHIPS), dead)
    assert _search(h) == baseline
    assert h.record().status.zone == SECOND

"""``ComputeCapacityAdvice`` against the simulator's Compute Engine wire, through the real ``AdviceClient``."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from localcloud.tpu_sim import SimServer, World
from shared.adapters.compute_advice import ComputeCapacityAdvice
from shared.domain.models import Tier
from tests.support.fixtures_compute_sim import lab_world

PROJECT = "demo-proj"
ZONE_A, ZONE_B = "us-east5-a", "us-east5-b"


class SteppedClock:
    """A clock that moves only when told (the adapter's cache reads ``monotonic``)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def now(self) -> datetime:
        return datetime.fromtimestamp(1_800_000_000 + self.seconds, tz=UTC)

    def monotonic(self) -> float:
        return self.seconds


def _world() -> World:
    """Spot chips in us-east5-b until 30 min, then in us-east5-a; on-demand only in us-east5-a."""
    zones = {
        ZONE_A: {"capacity": {"v6e": {"on_demand": 8, "spot": {"chips": 0, "timeline": [{"at_s": 1800, "chips": 8}]}}}},
        ZONE_B: {"capacity": {"v6e": {"on_demand": 0, "spot": {"chips": 8, "timeline": [{"at_s": 1800, "chips": 0}]}}}},
    }
    return World(lab_world(zones, project=PROJECT))


@pytest.fixture
def sim() -> Iterator[tuple[World, str]]:
    world = _world()
    server = SimServer(world)
    yield world, server.start()
    server.stop()


def test_scores_each_zone_per_tier(sim: tuple[World, str]) -> None:
    _, url = sim
    advice = ComputeCapacityAdvice(PROJECT, SteppedClock(), endpoint=url)
    assert advice.obtainability("v6e-4", Tier.SPOT, [ZONE_A, ZONE_B]) == {ZONE_A: 0.0, ZONE_B: 0.95}
    assert advice.obtainability("v6e-4", Tier.ON_DEMAND, [ZONE_A, ZONE_B]) == {ZONE_A: 0.95, ZONE_B: 0.0}


def test_answers_from_its_cache_until_the_ttl_passes(sim: tuple[World, str]) -> None:
    world, url = sim
    clock = SteppedClock()
    advice = ComputeCapacityAdvice(PROJECT, clock, endpoint=url, ttl_s=300)
    assert advice.obtainability("v6e-4", Tier.SPOT, [ZONE_A, ZONE_B])[ZONE_A] == 0.0
    world.advance(1900)  # spot moved to us-east5-a
    clock.seconds = 299
    assert advice.obtainability("v6e-4", Tier.SPOT, [ZONE_A, ZONE_B])[ZONE_A] == 0.0
    clock.seconds = 301
    assert advice.obtainability("v6e-4", Tier.SPOT, [ZONE_A, ZONE_B])[ZONE_A] == 0.95


def test_a_tier_without_advice_gets_none(sim: tuple[World, str]) -> None:
    _, url = sim
    advice = ComputeCapacityAdvice(PROJECT, SteppedClock(), endpoint=url)
    assert advice.obtainability("v6e-4", Tier.FLEX_START, [ZONE_A]) == {}
    assert advice.obtainability("v9-unknown", Tier.SPOT, [ZONE_A]) == {}


def test_a_refused_call_is_no_advice_and_is_logged_once(
    sim: tuple[World, str], caplog: pytest.LogCaptureFixture
) -> None:
    _, url = sim
    clock = SteppedClock()
    advice = ComputeCapacityAdvice(PROJECT, clock, endpoint=url, ttl_s=60)
    with caplog.at_level(logging.WARNING, logger="shared.adapters.compute_advice"):
        assert advice.obtainability("v6e-4", Tier.SPOT, ["us-east5-z"]) == {}  # 400: not a zone of the region
        clock.seconds = 120
        assert advice.obtainability("v6e-4", Tier.ON_DEMAND, ["us-east5-z"]) == {}
    assert len([r for r in caplog.records if "capacity advice unavailable" in r.message]) == 1


def test_a_failing_region_does_not_hide_the_others(sim: tuple[World, str]) -> None:
    _, url = sim
    advice = ComputeCapacityAdvice(PROJECT, SteppedClock(), endpoint=url)
    assert advice.obtainability("v6e-4", Tier.SPOT, [ZONE_B, "europe-west4-a"]) == {ZONE_B: 0.95}

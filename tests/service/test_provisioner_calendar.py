"""Calendar-mode windows as a tier: the provisioner books the spec's window, waits for it, consumes it through the
``reservation`` tier, and releases it once nothing needs it. On the simulator through the real google-cloud-tpu
and google-cloud-compute clients (``GcpTpuApi``, ``ComputeCalendarReservations``)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from shared.adapters.compute_calendar import ComputeCalendarReservations
from shared.domain.calendar_mode import booking_name
from shared.domain.models import CalendarWindow, Phase, Tier
from shared.services.provisioner import ProvisionerSettings
from tests.support.fixtures_provisioner import world
from tests.support.fixtures_tpu_sim import TpuSimFactory
from tests.support.provisioner_harness import Harness, make_spec

ZONE = "us-east5-a"
NAME = booking_name("gemma")


class Calendar:
    """A harness whose provisioner books through the real Compute Engine client, and that client for checks."""

    def __init__(self, h: Harness, calendar: ComputeCalendarReservations) -> None:
        self.h, self.calendar = h, calendar

    def spec(self, starts_in: timedelta, *, tiers: tuple[Tier, ...] = (Tier.RESERVATION,)) -> Any:
        start = self.h.clock.now().replace(microsecond=0) + starts_in
        window = CalendarWindow(zone=ZONE, start=start, end=start + timedelta(days=1))
        return make_spec(zones=(ZONE,), tiers=tiers, reservation_name=NAME, calendar=window)

    def booked(self) -> list[str]:
        return [name for _, name in self.calendar.list_names([ZONE])]

    def on_demand_free(self) -> int:
        return self.h.world.kernel.pool(ZONE, "v6e", "on_demand").free


def _pools(on_demand: int, spot: int = 0) -> dict[str, Any]:
    return world({ZONE: {"capacity": {"v6e": {"on_demand": on_demand, "spot": spot}}}})


@pytest.fixture
def make(tpu_sim_factory: TpuSimFactory, tmp_path: Path) -> Iterator[Any]:
    made: list[Harness] = []

    def build(scenario: dict[str, Any]) -> Calendar:
        sim = tpu_sim_factory(scenario)
        calendar = ComputeCalendarReservations(sim.project, endpoint=sim.base_url)
        settings = ProvisionerSettings(holder="test-provisioner")
        h = Harness(sim.world, sim.api, tmp_path / f"state-{len(made)}.db", settings=settings, calendar=calendar)
        made.append(h)
        return Calendar(h, calendar)

    yield build
    for h in made:
        h.close()


def _serving(h: Harness) -> None:
    """What the monitor does once vLLM answers."""
    record = h.record()
    status = record.status.model_copy(update={"phase": Phase.SERVING})
    h.store.put_deployment(record.model_copy(update={"status": status}), expected_version=record.version)


def test_the_window_is_booked_waited_for_consumed_and_released_on_delete(make: Any) -> None:
    c = make(_pools(on_demand=8))
    h = c.h
    h.create(c.spec(timedelta(hours=2)))
    h.tick()
    record = h.record()
    assert record.status.calendar is not None and record.status.calendar.name == NAME
    assert record.status.phase is Phase.SEARCHING
    assert record.status.message.endswith("is pending approval; its window starts in 2 h 0 min")
    assert h.qrs() == {}, "nothing may ask for the reservation before its window"
    h.run(10)
    assert h.record().status.calendar.procurement == "APPROVED"
    h.run_until_phase(Phase.BOOTING, minutes=180)
    record = h.record()
    assert record.status.tier is Tier.RESERVATION
    assert record.status.calendar.procurement == "FULFILLED"
    assert h.world.kernel.pool(ZONE, "v6e", f"reservation:{NAME}").free == 0  # the slice consumes the booked chips
    h.delete()
    h.run_until_phase(Phase.DELETED, minutes=30)
    released = h.record().status.calendar
    assert released is not None and released.released_at is not None and released.release_reason
    assert c.booked() == []
    assert c.on_demand_free() == 8
    h.assert_invariants()


def test_a_stop_before_the_window_releases_it_before_any_charge(make: Any) -> None:
    c = make(_pools(on_demand=8))
    h = c.h
    h.create(c.spec(timedelta(days=2)))
    h.run(5)
    assert c.booked() == [NAME]
    h.stop()
    h.run_until_phase(Phase.STOPPED, minutes=10)
    booking = h.record().status.calendar
    assert booking is not None and booking.released_at is not None
    assert booking.released_at < booking.window.start
    assert booking.release_reason == "the deployment is stopped"
    assert c.booked() == []


def test_serving_from_spot_before_the_window_gives_the_window_back(make: Any) -> None:
    c = make(_pools(on_demand=8, spot=4))
    h = c.h
    h.create(c.spec(timedelta(days=1), tiers=(Tier.RESERVATION, Tier.SPOT)))
    h.run_until_phase(Phase.BOOTING, minutes=30)
    assert h.record().status.tier is Tier.SPOT  # the reservation tier waits for its window; spot is searched now
    _serving(h)
    h.run(2)
    booking = h.record().status.calendar
    assert booking is not None and booking.released_at is not None
    assert booking.release_reason == "serving from spot capacity before the window starts"
    assert c.booked() == []
    assert h.record().status.phase is Phase.SERVING


def test_a_declined_window_fails_a_deployment_that_has_no_other_tier(make: Any) -> None:
    c = make(_pools(on_demand=0))
    h = c.h
    h.create(c.spec(timedelta(hours=3)))
    h.run_until_phase(Phase.FAILED, minutes=30)
    record = h.record()
    assert f"calendar reservation {NAME} is gone (the booking was declined)" in record.status.message
    assert c.booked() == []
    assert h.qrs() == {}


def test_an_orphaned_booking_of_ours_is_released_and_others_are_left_alone(make: Any) -> None:
    c = make(_pools(on_demand=8))
    h = c.h
    start = h.clock.now().replace(microsecond=0) + timedelta(days=3)
    window = CalendarWindow(zone=ZONE, start=start, end=start + timedelta(days=1))
    c.calendar.book(booking_name("ghost"), "v6e-4", window, request_id="ghost")
    c.calendar.book("someone-elses", "v6e-4", window, request_id="theirs")
    h.create(c.spec(timedelta(days=2)))
    orphans = h.world.invariants(live_deployments=["gemma"])["orphans"]
    assert [(o["kind"], o["name"]) for o in orphans] == [("future_reservation", booking_name("ghost"))]
    h.tick()
    assert sorted(c.booked()) == sorted([NAME, "someone-elses"])
    h.assert_invariants()  # the sim counts tpuctl's bookings no live deployment holds as orphans: none now
    assert any(f"released orphaned calendar booking {ZONE}/{booking_name('ghost')}" in tick for tick in h.ticks)


def test_the_ttl_runs_from_the_window_and_its_teardown_releases_the_booking(make: Any) -> None:
    c = make(_pools(on_demand=8))
    h = c.h
    h.create(c.spec(timedelta(hours=2)).model_copy(update={"ttl_hours": 1.0}))
    h.run_until_phase(Phase.BOOTING, minutes=180)  # a TTL counted from the create would have ended it at 1 h
    assert h.record().status.tier is Tier.RESERVATION
    h.run_until_phase(Phase.DELETED, minutes=90)
    booking = h.record().status.calendar
    assert booking is not None and booking.release_reason == "the deployment was torn down (its TTL or budget)"
    assert c.booked() == []
    h.assert_invariants()

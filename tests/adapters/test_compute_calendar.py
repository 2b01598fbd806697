"""``ComputeCalendarReservations`` against the simulator's Compute Engine wire, through the real ``AdviceClient``
and ``FutureReservationsClient`` (docs/reference/capacity-advice.md A3)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from localcloud.tpu_sim import SimServer, World
from localcloud.tpu_sim.advice_wire import APPROVAL_S
from shared.adapters.compute_calendar import ComputeCalendarReservations, _request_uuid
from shared.domain.errors import CloudError, ErrorClass
from shared.domain.models import CalendarWindow
from tests.support.fixtures_compute_sim import lab_world

PROJECT = "demo-proj"
ZONE_A, ZONE_B, ZONE_EU = "us-east5-a", "us-east5-b", "europe-west4-a"
DAY = timedelta(days=1)


def _scenario() -> dict[str, object]:
    """On-demand v6e: 8 chips in us-east5-a now, in europe-west4-a from 12 h, in us-east5-b from day 1."""
    later = {"chips": 0, "timeline": [{"at_s": 86400, "chips": 8}]}
    sooner = {"chips": 0, "timeline": [{"at_s": 43200, "chips": 8}]}
    zones = {
        ZONE_A: {"capacity": {"v6e": {"on_demand": 8}}},
        ZONE_B: {"capacity": {"v6e": {"on_demand": later}}},
        ZONE_EU: {"capacity": {"v6e": {"on_demand": sooner}}},
    }
    return lab_world(zones, project=PROJECT, name="calendar-adapter")


@dataclass
class Sim:
    world: World
    url: str
    calendar: ComputeCalendarReservations

    @property
    def now(self) -> datetime:
        return datetime.fromtimestamp(self.world.kernel.now_s, tz=UTC)

    def window(self, start_in: timedelta = timedelta(hours=1), days: int = 1, zone: str = ZONE_A) -> CalendarWindow:
        start = self.now + start_in
        return CalendarWindow(zone=zone, start=start, end=start + days * DAY)

    def on_demand_free(self, zone: str = ZONE_A) -> int:
        return self.world.kernel.pool(zone, "v6e", "on_demand").free


@pytest.fixture
def sim() -> Iterator[Sim]:
    world = World(_scenario())
    server = SimServer(world)
    url = server.start()
    yield Sim(world, url, ComputeCalendarReservations(PROJECT, endpoint=url))
    server.stop()


def test_the_earliest_window_is_in_the_zone_with_chips_across_regions(sim: Sim) -> None:
    calendar, now = sim.calendar, sim.now
    found = calendar.earliest_window("v6e-4", [ZONE_A, ZONE_B], days=2, not_before=now)
    assert found == CalendarWindow(zone=ZONE_A, start=now, end=now + 2 * DAY)
    # us-east5-a is not asked for: its earlier window in the same region is denied, us-east5-b's is found
    only_b = calendar.earliest_window("v6e-4", [ZONE_B], days=1, not_before=now)
    assert only_b == CalendarWindow(zone=ZONE_B, start=now + DAY, end=now + 2 * DAY)
    # two regions: europe-west4-a's window (12 h) starts before us-east5-b's (1 day)
    across = calendar.earliest_window("v6e-8", [ZONE_B, ZONE_EU], days=1, not_before=now)
    assert across is not None and (across.zone, across.start) == (ZONE_EU, now + timedelta(hours=12))


def test_the_catalogs_other_zones_of_a_region_are_denied_up_front_so_one_ask_finds_ours(sim: Sim) -> None:
    calendar, asks = sim.calendar, []
    client = calendar._advice_client()
    ask = client.calendar_mode
    client.calendar_mode = lambda **kwargs: asks.append(kwargs) or ask(**kwargs)  # type: ignore[method-assign]
    only_b = calendar.earliest_window("v6e-4", [ZONE_B], days=1, not_before=sim.now)
    assert only_b is not None and only_b.zone == ZONE_B
    assert len(asks) == 1  # us-east5-a (in the catalog, earlier window) was denied in the first ask


def test_no_window_when_no_zone_has_the_chips_or_the_family_has_no_calendar_mode(sim: Sim) -> None:
    calendar, now = sim.calendar, sim.now
    assert calendar.earliest_window("v6e-16", [ZONE_A, ZONE_B, ZONE_EU], days=1, not_before=now) is None
    assert calendar.earliest_window("v5p-8", [ZONE_A], days=1, not_before=now) is None


def test_a_booking_is_approved_then_fulfilled_at_its_start(sim: Sim) -> None:
    calendar, window = sim.calendar, sim.window()
    calendar.book("tpuctl-cal-dep-a", "v6e-4", window, request_id="dep-a/1")
    assert calendar.procurement(ZONE_A, "tpuctl-cal-dep-a") == "PENDING_APPROVAL"
    sim.world.advance(APPROVAL_S)
    assert calendar.procurement(ZONE_A, "tpuctl-cal-dep-a") == "APPROVED"
    assert sim.on_demand_free() == 8  # nothing held before the start
    sim.world.advance(3600)
    assert calendar.procurement(ZONE_A, "tpuctl-cal-dep-a") == "FULFILLED"
    assert sim.on_demand_free() == 4
    assert sim.world.kernel.pool(ZONE_A, "v6e", "reservation:tpuctl-cal-dep-a").total == 4  # the same name
    calendar.release(ZONE_A, "tpuctl-cal-dep-a")
    assert sim.on_demand_free() == 8


def test_a_retried_booking_with_the_same_window_is_success_and_another_window_is_refused(sim: Sim) -> None:
    calendar, window = sim.calendar, sim.window()
    calendar.book("tpuctl-cal-dep-a", "v6e-4", window, request_id="dep-a/1")
    calendar.book("tpuctl-cal-dep-a", "v6e-4", window, request_id="dep-a/1")  # a crash between insert and record
    with pytest.raises(CloudError) as refused:
        calendar.book("tpuctl-cal-dep-a", "v6e-4", sim.window(start_in=timedelta(hours=2)), request_id="dep-a/2")
    assert refused.value.error_class is ErrorClass.INVALID
    assert str(refused.value).startswith("calendar:") and "release it" in str(refused.value)
    assert sim.calendar.list_names([ZONE_A]) == [(ZONE_A, "tpuctl-cal-dep-a")]


def test_a_release_before_the_start_frees_the_window_and_a_gone_booking_releases_quietly(sim: Sim) -> None:
    calendar, window = sim.calendar, sim.window(start_in=timedelta(hours=2))
    calendar.book("tpuctl-cal-dep-a", "v6e-8", window, request_id="dep-a/1")
    sim.world.advance(APPROVAL_S)
    assert calendar.procurement(ZONE_A, "tpuctl-cal-dep-a") == "APPROVED"
    calendar.release(ZONE_A, "tpuctl-cal-dep-a")
    assert calendar.procurement(ZONE_A, "tpuctl-cal-dep-a") is None
    calendar.release(ZONE_A, "tpuctl-cal-dep-a")  # already gone: success
    # the zone's 8 chips are promised to nobody: the same window for all of them is approved again
    calendar.book("tpuctl-cal-dep-b", "v6e-8", window, request_id="dep-b/1")
    sim.world.advance(APPROVAL_S)
    assert calendar.procurement(ZONE_A, "tpuctl-cal-dep-b") == "APPROVED"
    sim.world.advance(2 * 3600)
    assert calendar.procurement(ZONE_A, "tpuctl-cal-dep-b") == "FULFILLED"
    assert sim.on_demand_free() == 0


def test_list_names_per_zone(sim: Sim) -> None:
    calendar = sim.calendar
    calendar.book("tpuctl-cal-dep-a", "v6e-4", sim.window(), request_id="dep-a/1")
    calendar.book("tpuctl-cal-dep-b", "v6e-4", sim.window(start_in=DAY, zone=ZONE_B), request_id="dep-b/1")
    calendar.book("other-team", "v6e-1", sim.window(), request_id=str(uuid.uuid4()))
    names = calendar.list_names([ZONE_A, ZONE_B, ZONE_EU])
    assert sorted(names) == [(ZONE_A, "other-team"), (ZONE_A, "tpuctl-cal-dep-a"), (ZONE_B, "tpuctl-cal-dep-b")]


def test_api_errors_are_classified_cloud_errors(sim: Sim) -> None:
    with pytest.raises(CloudError) as too_far:
        sim.calendar.book("tpuctl-cal-dep-a", "v6e-4", sim.window(start_in=200 * DAY), request_id="dep-a/1")
    assert too_far.value.error_class is ErrorClass.INVALID and "timeWindow.startTime" in str(too_far.value)
    with pytest.raises(CloudError) as too_long:
        sim.calendar.earliest_window("v6e-4", [ZONE_A], days=91, not_before=sim.now)
    assert too_long.value.error_class is ErrorClass.INVALID and "timeRangeSpec.minDuration" in str(too_long.value)
    stranger = ComputeCalendarReservations("other-proj", endpoint=sim.url)
    with pytest.raises(CloudError) as denied:
        stranger.list_names([ZONE_A])
    assert denied.value.error_class is ErrorClass.PERMISSION
    with pytest.raises(CloudError) as odd:
        sim.calendar.book("tpuctl-cal-dep-a", "v5p-8", sim.window(), request_id="dep-a/1")
    assert odd.value.error_class is ErrorClass.INVALID and str(odd.value).startswith("calendar:")


def test_a_request_id_that_is_not_a_uuid_becomes_a_stable_uuid() -> None:
    given = str(uuid.uuid4())
    assert _request_uuid(given) == given
    derived = _request_uuid("dep-a/1")
    assert uuid.UUID(derived).version == 5 and derived == _request_uuid("dep-a/1") != _request_uuid("dep-a/2")

"""The calendar tier's pure decisions: period, price, what the booker does next, what the search may use."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from shared.domain.calendar_mode import (
    Book,
    Refresh,
    Release,
    booking_name,
    calendar_days,
    next_step,
    owner_of,
    plannable_spec,
    quote,
    waiting_message,
)
from shared.domain.models import (
    CalendarBooking,
    CalendarWindow,
    DeploymentRecord,
    DeploymentSpec,
    DeploymentStatus,
    Desired,
    Phase,
    Tier,
)
from shared.domain.planner import needs_ticks

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
WINDOW = CalendarWindow(zone="us-east5-a", start=NOW + timedelta(hours=5), end=NOW + timedelta(days=1, hours=5))
NAME = booking_name("gemma")


def spec(**overrides: Any) -> DeploymentSpec:
    values: dict[str, Any] = {
        "deployment_id": "gemma",
        "model": "gemma-4-26b-a4b",
        "accelerator": "v6e-4",
        "zones": ("us-east5-a",),
        "tiers": (Tier.RESERVATION,),
        "reservation_name": NAME,
        "calendar": WINDOW,
    }
    return DeploymentSpec(**{**values, **overrides})


def booking(**overrides: Any) -> CalendarBooking:
    values: dict[str, Any] = {"name": NAME, "window": WINDOW, "procurement": "APPROVED", "booked_at": NOW}
    return CalendarBooking(**{**values, **overrides})


def record(
    the_spec: DeploymentSpec | None = None, *, desired: Desired = Desired.PRESENT, **status: Any
) -> DeploymentRecord:
    return DeploymentRecord(
        deployment_id="gemma",
        spec=the_spec or spec(),
        desired=desired,
        status=DeploymentStatus(**status),
        created_at=NOW,
        updated_at=NOW,
    )


@pytest.mark.parametrize(("ttl", "days"), [(None, 1), (1.0, 1), (24.0, 1), (24.5, 2), (72.0, 3), (720.0, 30)])
def test_the_period_is_the_ttl_in_whole_days_at_least_one(ttl: float | None, days: int) -> None:
    assert calendar_days(ttl) == days


def test_the_whole_window_is_priced_whether_used_or_not() -> None:
    priced = quote(WINDOW, 4, 1.89, "table")
    assert priced.usd == pytest.approx(4 * 24 * 1.89)


def test_a_window_must_end_after_it_starts_and_needs_the_reservation_tier_in_its_zone() -> None:
    with pytest.raises(ValidationError, match=r"calendar\.end"):
        CalendarWindow(zone="us-east5-a", start=NOW, end=NOW)
    with pytest.raises(ValidationError, match="calendar: needs the 'reservation' tier"):
        spec(tiers=(Tier.SPOT,), reservation_name=None)
    with pytest.raises(ValidationError, match="calendar: needs"):
        spec(zones=("us-east5-b",))


def test_names_round_trip_to_their_deployment_and_others_are_not_ours() -> None:
    assert owner_of(NAME) == "gemma"
    assert owner_of("someone-elses") is None


def test_a_spec_with_a_window_and_no_booking_books_it() -> None:
    assert next_step(record(), NOW) == Book(NAME, WINDOW)
    assert next_step(record(desired=Desired.ABSENT), NOW) is None  # deleted before booking: nothing to book
    assert next_step(record(spec(calendar=None, tiers=(Tier.SPOT,), reservation_name=None)), NOW) is None


def test_a_booking_is_read_again_every_five_minutes() -> None:
    assert next_step(record(calendar=booking()), NOW) == Refresh(NAME, "us-east5-a")
    fresh = booking(checked_at=NOW - timedelta(minutes=2))
    assert next_step(record(calendar=fresh), NOW) is None
    assert next_step(record(calendar=fresh), NOW + timedelta(minutes=3)) == Refresh(NAME, "us-east5-a")


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"desired": Desired.ABSENT}, "the deployment is deleted"),
        ({"desired": Desired.STOPPED}, "the deployment is stopped"),
        ({"phase": Phase.FAILED}, "the deployment failed"),
        ({"phase": Phase.DELETED}, "the deployment was torn down (its TTL or budget)"),
        ({"procurement": "DECLINED"}, "the booking was declined"),
        ({"phase": Phase.SERVING, "tier": Tier.SPOT}, "serving from spot capacity before the window starts"),
    ],
)
def test_a_booking_nothing_needs_is_released_with_the_reason(changes: dict[str, Any], reason: str) -> None:
    desired = changes.pop("desired", Desired.PRESENT)
    procurement = changes.pop("procurement", "APPROVED")
    step = next_step(record(desired=desired, calendar=booking(procurement=procurement), **changes), NOW)
    assert step == Release(NAME, "us-east5-a", reason)


def test_serving_from_the_reservation_itself_or_after_the_window_started_keeps_it() -> None:
    on_it = record(calendar=booking(checked_at=NOW), phase=Phase.SERVING, tier=Tier.RESERVATION)
    assert next_step(on_it, NOW) is None
    elsewhere = record(calendar=booking(checked_at=NOW), phase=Phase.SERVING, tier=Tier.SPOT)
    assert not isinstance(next_step(elsewhere, WINDOW.start + timedelta(minutes=1)), Release)  # paid: kept


def test_a_released_booking_needs_nothing_and_an_ended_period_is_released() -> None:
    assert next_step(record(desired=Desired.ABSENT, calendar=booking(released_at=NOW)), NOW) is None
    assert next_step(record(calendar=booking()), WINDOW.end) == Release(NAME, "us-east5-a", "its period ended")


def test_the_search_holds_the_reservation_tier_back_until_the_booking_is_fulfilled() -> None:
    mixed = spec(tiers=(Tier.RESERVATION, Tier.SPOT))
    assert plannable_spec(mixed, booking()).tiers == (Tier.SPOT,)
    assert plannable_spec(mixed, booking(procurement="FULFILLED")) is mixed
    assert plannable_spec(spec(), None) is None  # only the window: nothing to search before it opens
    assert plannable_spec(spec(), booking(procurement="FULFILLED", released_at=NOW)) is None
    plain = spec(calendar=None)
    assert plannable_spec(plain, None) is plain


def test_the_waiting_message_says_when_the_window_opens() -> None:
    assert waiting_message(None, NOW) == "booking the calendar-mode reservation"
    message = waiting_message(booking(), NOW)
    assert message == f"calendar reservation {NAME} in us-east5-a is approved; its window starts in 5 h 0 min"
    assert "in 1 d 5 h" in waiting_message(booking(), NOW - timedelta(days=1))
    assert "now (waiting for Compute Engine" in waiting_message(booking(), WINDOW.start)


def test_a_held_booking_keeps_the_ticks_on_until_it_is_released() -> None:
    torn_down = record(phase=Phase.DELETED, calendar=booking())
    assert needs_ticks(torn_down)
    released = record(phase=Phase.DELETED, calendar=booking(released_at=NOW))
    assert not needs_ticks(released)


def test_a_booked_deployments_ttl_runs_from_its_window() -> None:
    booked = record(spec(ttl_hours=2.0))
    assert booked.ttl_ends_at == WINDOW.start + timedelta(hours=2)
    plain = record(spec(ttl_hours=2.0, calendar=None, tiers=(Tier.SPOT,), reservation_name=None))
    assert plain.ttl_ends_at == NOW + timedelta(hours=2)

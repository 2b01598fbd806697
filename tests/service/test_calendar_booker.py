"""The calendar booker's orphan sweep on its own: who it releases, how often it asks, and a missing role is one
warning, not one per sweep. A fake keeps the bookings (state, not a call script)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from shared.domain.errors import CloudError, ErrorClass
from shared.domain.models import CalendarWindow
from shared.services.calendar_booker import CalendarBooker

ZONE = "us-east5-a"
NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.seconds = 0.0

    def now(self) -> datetime:
        return NOW + timedelta(seconds=self.seconds)

    def monotonic(self) -> float:
        return self.seconds


class Bookings:
    """Future reservations by (zone, name); ``refuse`` makes every call a classified error."""

    def __init__(self, *names: str) -> None:
        self.held = {(ZONE, name) for name in names}
        self.lists = 0
        self.refuse: ErrorClass | None = None

    def _check(self) -> None:
        if self.refuse is not None:
            raise CloudError(self.refuse, "compute.futureReservations.list denied")

    def earliest_window(self, *args: object, **kwargs: object) -> CalendarWindow | None:
        return None

    def book(self, name: str, accelerator: str, window: CalendarWindow, *, request_id: str) -> None:
        self.held.add((window.zone, name))

    def procurement(self, zone: str, name: str) -> str | None:
        return "APPROVED" if (zone, name) in self.held else None

    def release(self, zone: str, name: str) -> None:
        self._check()
        self.held.discard((zone, name))

    def list_names(self, zones: Sequence[str]) -> list[tuple[str, str]]:
        self._check()
        self.lists += 1
        return sorted(item for item in self.held if item[0] in zones)


def test_the_sweep_releases_only_our_orphans_and_at_most_every_interval() -> None:
    clock, bookings = Clock(), Bookings("tpuctl-cal-ghost", "someone-elses")
    booker = CalendarBooker(bookings, clock, sweep_every_s=900)
    assert booker.sweep({}, [ZONE]) == [f"{ZONE}/tpuctl-cal-ghost"]
    assert bookings.held == {(ZONE, "someone-elses")}
    bookings.held.add((ZONE, "tpuctl-cal-late"))
    clock.seconds = 600
    assert booker.sweep({}, [ZONE]) == [] and bookings.lists == 1  # not yet: one list per interval
    clock.seconds = 901
    assert booker.sweep({}, [ZONE]) == [f"{ZONE}/tpuctl-cal-late"] and bookings.lists == 2


def test_a_missing_role_is_warned_once(caplog: pytest.LogCaptureFixture) -> None:
    clock, bookings = Clock(), Bookings("tpuctl-cal-ghost")
    bookings.refuse = ErrorClass.PERMISSION
    booker = CalendarBooker(bookings, clock, sweep_every_s=1)
    with caplog.at_level(logging.DEBUG, logger="tpuctl.calendar"):
        for second in range(3):
            clock.seconds = 2.0 * second
            assert booker.sweep({}, [ZONE]) == []
    levels = [record.levelno for record in caplog.records if "calendar sweep stopped" in record.getMessage()]
    assert levels == [logging.WARNING, logging.DEBUG, logging.DEBUG]
    assert bookings.held == {(ZONE, "tpuctl-cal-ghost")}

"""Calendar-mode reservations as a capacity tier: the window asked for, its price, and what the controller does next.

Why a tier of its own: a calendar-mode future reservation (Compute Engine, TPU, 1 to 90 days, bookable up to 120
days ahead) is capacity that is *promised* for a window, paid for the whole window whether used or not. The plan
quotes the earliest window for the deployment's duration (``advice.calendarMode``); with the user's confirmation
the gateway puts the window on the spec (``DeploymentSpec.calendar``); the controller books it, waits for its start,
and the deployment consumes it through the existing ``reservation`` tier (``reservation_name`` is the booking's);
once nothing needs it any more (deleted, stopped, failed, or serving from other capacity before the window starts)
it is released, before its start where that avoids the charge.

Pure: the decisions here read the spec, the booking's recorded state and the time; ``shared.services.calendar_booker``
carries them out through the ``CalendarReservations`` port.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from pydantic import BaseModel, ConfigDict, Field

from shared.domain.models import (
    CalendarBooking,
    CalendarWindow,
    DeploymentRecord,
    DeploymentSpec,
    Desired,
    Phase,
    Tier,
)

__all__ = [
    "MAX_DAYS",
    "MAX_LEAD",
    "MIN_DAYS",
    "REFRESH_EVERY",
    "TERMINAL_PROCUREMENT",
    "Book",
    "CalendarQuote",
    "Refresh",
    "Release",
    "booking_name",
    "calendar_days",
    "next_step",
    "plannable_spec",
    "quote",
    "waiting_message",
]

MIN_DAYS, MAX_DAYS = 1, 90  # a calendar-mode period (docs/reference/capacity-advice.md A3)
MAX_LEAD = timedelta(days=120)  # how far ahead a TPU window can be booked
REFRESH_EVERY = timedelta(minutes=5)  # how often a booking's procurement status is read while it matters
TERMINAL_PROCUREMENT = frozenset({"DECLINED", "FAILED", "CANCELLED"})
USABLE_PROCUREMENT = frozenset({"FULFILLED"})
NAME_PREFIX = "tpuctl-cal-"


class CalendarQuote(BaseModel):
    """The earliest window for a slice and a duration, and what it costs (committed, used or not)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    window: CalendarWindow
    chips: int = Field(ge=1)
    usd_per_chip_hour: float = Field(ge=0)
    usd: float = Field(ge=0, description="The whole window's price: chips x hours x the calendar-mode rate.")
    price_source: str = ""


def calendar_days(ttl_hours: float | None) -> int:
    """The period to book for a deployment's time to live: whole days, 1 to 90 (no TTL: the shortest, one day)."""
    if ttl_hours is None:
        return MIN_DAYS
    return max(MIN_DAYS, min(MAX_DAYS, math.ceil(ttl_hours / 24 - 1e-9)))


def quote(window: CalendarWindow, chips: int, usd_per_chip_hour: float, price_source: str = "") -> CalendarQuote:
    hours = (window.end - window.start).total_seconds() / 3600
    return CalendarQuote(
        window=window,
        chips=chips,
        usd_per_chip_hour=usd_per_chip_hour,
        usd=round(chips * hours * usd_per_chip_hour, 2),
        price_source=price_source,
    )


def booking_name(deployment_id: str) -> str:
    """The future reservation's and its auto-created reservation's name: one booking per deployment, found again
    by name after a crash (an insert that meets its own earlier insert is the same booking)."""
    return f"{NAME_PREFIX}{deployment_id}"


def owner_of(name: str) -> str | None:
    """The deployment a booking name belongs to (None: not one of ours)."""
    return name.removeprefix(NAME_PREFIX) if name.startswith(NAME_PREFIX) else None


@dataclass(frozen=True)
class Book:
    """Insert the future reservation for the spec's window."""

    name: str
    window: CalendarWindow


@dataclass(frozen=True)
class Refresh:
    """Read the booking's procurement status."""

    name: str
    zone: str


@dataclass(frozen=True)
class Release:
    """Delete the booking: nothing needs it any more."""

    name: str
    zone: str
    reason: str


Step = Book | Refresh | Release


def _released_or_gone(booking: CalendarBooking) -> bool:
    return booking.released_at is not None or booking.procurement == "GONE"


def _no_longer_needed(record: DeploymentRecord, now: datetime) -> str | None:
    """Why the booking is not needed any more, or None while it is."""
    status, booking = record.status, record.status.calendar
    if record.desired is Desired.ABSENT:
        return "the deployment is deleted"
    if record.desired is Desired.STOPPED:
        return "the deployment is stopped"
    if status.phase is Phase.FAILED:
        return "the deployment failed"
    if status.phase in (Phase.DELETING, Phase.DELETED):
        return "the deployment was torn down (its TTL or budget)"
    if record.spec.calendar is None:
        return "the spec no longer asks for a calendar window"
    assert booking is not None
    if booking.procurement in TERMINAL_PROCUREMENT:
        return f"the booking was {booking.procurement.lower()}"
    tier, serving = status.tier, status.phase in (Phase.SERVING, Phase.DEGRADED)
    if serving and tier is not None and tier is not Tier.RESERVATION and now < booking.window.start:
        return f"serving from {tier.value} capacity before the window starts"
    return None


def next_step(record: DeploymentRecord, now: datetime) -> Step | None:
    """What the booker does for this deployment now (None: nothing)."""
    booking, wanted = record.status.calendar, record.spec.calendar
    if booking is None:
        live = record.desired is Desired.PRESENT and record.status.phase is not Phase.FAILED
        return Book(booking_name(record.deployment_id), wanted) if wanted is not None and live else None
    if _released_or_gone(booking):
        return None
    why = _no_longer_needed(record, now)
    if why is not None:
        return Release(booking.name, booking.window.zone, why)
    if now >= booking.window.end:  # Compute Engine deleted the reservation and its TPUs; the request goes too
        return Release(booking.name, booking.window.zone, "its period ended")
    if booking.checked_at is None or now - booking.checked_at >= REFRESH_EVERY:
        return Refresh(booking.name, booking.window.zone)
    return None


def plannable_spec(spec: DeploymentSpec, booking: CalendarBooking | None) -> DeploymentSpec | None:
    """The spec the capacity search may act on now: the reservation tier only once the booking is fulfilled
    (before that its reservation does not exist and a request naming it would be refused). None: nothing to search
    with until the window starts (the booking is the only tier)."""
    usable = booking is not None and booking.released_at is None and booking.procurement in USABLE_PROCUREMENT
    if spec.calendar is None or usable:
        return spec
    tiers = tuple(tier for tier in spec.tiers if tier is not Tier.RESERVATION)
    return spec.model_copy(update={"tiers": tiers}) if tiers else None


def waiting_message(booking: CalendarBooking | None, now: datetime) -> str:
    """The status line while the deployment waits for its calendar window."""
    if booking is None:
        return "booking the calendar-mode reservation"
    wait = booking.window.start - now
    when = f"in {_span(wait)}" if wait > timedelta(0) else "now (waiting for Compute Engine to deliver it)"
    state = booking.procurement.lower().replace("_", " ") if booking.procurement else "submitted"
    return f"calendar reservation {booking.name} in {booking.window.zone} is {state}; its window starts {when}"


def _span(delta: timedelta) -> str:
    minutes = int(delta.total_seconds() // 60)
    days, rest = divmod(minutes, 24 * 60)
    hours, minutes = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    return f"{hours} h {minutes} min" if hours else f"{minutes} min"

"""Calendar-mode windows in the gateway (issue 21, item 3): the plan's quote and the confirmed booking on create.

The plan asks Compute Engine's ``advice.calendarMode`` (through the ``CalendarReservations`` port) for the earliest
window of the deployment's length (its TTL in whole days, 1 to 90; one day without a TTL) in the allowed zones, and
prices it at the calendar-mode rate: the whole window is paid whether used or not. A create with
``book_calendar`` re-asks, and is refused until the user confirmed exactly that window and price (a token bound to
both); the confirmed create carries the window on the spec (``DeploymentSpec.calendar``), the ``reservation`` tier
first and the booking's name as ``reservation_name``, and the controller books it (``shared.services
.calendar_booker``).
"""

from __future__ import annotations

from collections.abc import Sequence

from mcp_client_gateway.calendar_views import CalendarQuoteView
from mcp_client_gateway.capabilities.common import GatewayPorts, pricing
from mcp_client_gateway.errors import GatewayError
from shared.domain.calendar_mode import booking_name, calendar_days, quote
from shared.domain.errors import CloudError
from shared.domain.models import CalendarWindow, Tier

__all__ = ["CalendarQuotes"]


class CalendarQuotes:
    """Quotes and booking terms over the ``CalendarReservations`` port (absent: the plan says so)."""

    def __init__(self, ports: GatewayPorts) -> None:
        self.ports = ports

    def quote(self, accelerator: str, chips: int, zones: Sequence[str], ttl_hours: float | None) -> CalendarQuoteView:
        days = calendar_days(ttl_hours)
        blank = {"days": days, "chips": chips}
        source = self.ports.calendar
        if source is None:
            return CalendarQuoteView(**blank, note="calendar-mode reservations: no source is configured here")
        try:
            window = source.earliest_window(accelerator, zones, days=days, not_before=self.ports.clock.now())
        except CloudError as exc:
            return CalendarQuoteView(**blank, note=f"calendar-mode advice unavailable: {str(exc)[:200]}")
        if window is None:
            where = ", ".join(zones[:6]) + (", ..." if len(zones) > 6 else "")
            return CalendarQuoteView(**blank, note=f"no {days}-day calendar-mode window for {accelerator} in {where}")
        return self._priced(window, accelerator, chips, days)

    def _priced(self, window: CalendarWindow, accelerator: str, chips: int, days: int) -> CalendarQuoteView:
        prices = pricing(self.ports)
        found = prices.lookup(window.zone, Tier.RESERVATION, accelerator)
        base = {"zone": window.zone, "start": window.start, "end": window.end, "days": days, "chips": chips}
        span = f"{window.zone} from {window.start:%Y-%m-%d %H:%M} to {window.end:%Y-%m-%d %H:%M} UTC ({days} d)"
        if found is None:
            return CalendarQuoteView(**base, note=f"{span}; no calendar-mode price is known for this region")
        priced = quote(window, chips, found[0], found[1])
        return CalendarQuoteView(
            **base,
            usd_per_chip_hour=priced.usd_per_chip_hour,
            usd=priced.usd,
            price_source=priced.price_source,
            note=f"{span}: ${priced.usd:,.2f} for {chips} chips, paid for the whole window whether used or not",
        )

    def booking(self, deployment_id: str, view: CalendarQuoteView) -> tuple[CalendarWindow, str]:
        """The window to put on the spec and the reservation it becomes; refused when there is none to book."""
        if view.zone is None or view.start is None or view.end is None or view.usd is None:
            raise GatewayError(
                "failed_precondition",
                "book_calendar",
                f"there is no calendar-mode window to book ({view.note})",
                "leave book_calendar out and search the other tiers, or widen zones (tpu_plan shows the window)",
            )
        return CalendarWindow(zone=view.zone, start=view.start, end=view.end), booking_name(deployment_id)

    @staticmethod
    def impact(deployment_id: str, accelerator: str, view: CalendarQuoteView) -> str:
        return (
            f"book a calendar-mode reservation of {accelerator} for '{deployment_id}' in {view.note}; "
            "released at once if the deployment is deleted or stopped before the window starts"
        )

    @staticmethod
    def state(view: CalendarQuoteView) -> str:
        """What a booking's confirmation is bound to: the window and its price."""
        start = f"{view.start:%Y%m%d%H%M}" if view.start else "none"
        return f"{view.zone or 'none'}-{start}-{view.days}d-{round((view.usd or 0) * 100)}"

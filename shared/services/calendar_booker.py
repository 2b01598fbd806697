"""Books, follows and releases a deployment's calendar-mode window inside the provisioner's reconcile
(decisions in ``shared.domain.calendar_mode``; calls through the ``CalendarReservations`` port).

Order of a pass: :meth:`CalendarBooker.run` before the capacity search (book a window the spec asks for, read its
procurement status every few minutes, release it once nothing needs it), then :meth:`searchable`: the record the
search may act on, with the ``reservation`` tier held back until the booking is fulfilled; None while the window is
the only capacity and has not started, and the deployment then waits in SEARCHING saying when the window opens.

Crash safety: the booking is written after the insert returned. A pass that dies in between books again next time
under the same name and window, which the port treats as the same booking; a booking whose record was lost (the
deployment was dropped first) is found by name in :meth:`sweep` and released.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime

from shared.domain.calendar_mode import (
    TERMINAL_PROCUREMENT,
    Book,
    Refresh,
    Release,
    next_step,
    owner_of,
    plannable_spec,
    waiting_message,
)
from shared.domain.errors import CloudError, ErrorClass
from shared.domain.models import CalendarBooking, DeploymentRecord, DeploymentSpec, DeploymentStatus, Desired, Phase
from shared.ports import CalendarReservations, Clock

__all__ = ["CalendarBooker"]

log = logging.getLogger("tpuctl.calendar")

StatusWriter = Callable[[DeploymentRecord, DeploymentStatus], DeploymentRecord]
GONE = "GONE"
_LOST = TERMINAL_PROCUREMENT | {GONE}


class CalendarBooker:
    """The calendar tier for one provisioner; without a ``CalendarReservations`` source a calendar spec fails."""

    def __init__(self, calendar: CalendarReservations | None, clock: Clock, *, sweep_every_s: float = 900.0) -> None:
        self._calendar = calendar
        self._clock = clock
        self._sweep_every_s = sweep_every_s
        self._last_sweep: float | None = None
        self._warned = False

    def run(self, record: DeploymentRecord, write: StatusWriter) -> DeploymentRecord:
        """The deployment's booking steps, each outcome written: a read that finds it lost is released in the same
        pass. A transient failure waits for the next pass."""
        after = self._step(record, write)
        return self._step(after, write) if after.status.calendar != record.status.calendar else after

    def _step(self, record: DeploymentRecord, write: StatusWriter) -> DeploymentRecord:
        now = self._clock.now()
        step = next_step(record, now)
        if step is None:
            return record
        if self._calendar is None:
            return write(record, _failed(record.status, "no calendar-mode reservation source is configured"))
        try:
            status = self._apply(step, record.status, record, now)
        except CloudError as exc:
            if exc.transient:
                log.warning("calendar %s for %s deferred: %s", type(step).__name__.lower(), record.deployment_id, exc)
                return record
            status = self._refused(step, record.status, now, exc)
        return write(record, status)

    def _apply(
        self, step: Book | Refresh | Release, status: DeploymentStatus, record: DeploymentRecord, now: datetime
    ) -> DeploymentStatus:
        calendar = self._calendar
        assert calendar is not None
        if isinstance(step, Book):
            request_id = f"{record.deployment_id}/{record.generation}/calendar"
            calendar.book(step.name, record.spec.accelerator, step.window, request_id=request_id)
            booking = CalendarBooking(name=step.name, window=step.window, procurement="SUBMITTED", booked_at=now)
            log.info("booked calendar window %s for %s", step.name, record.deployment_id)
            return status.model_copy(update={"calendar": booking})
        current = status.calendar
        assert current is not None
        if isinstance(step, Refresh):
            procurement = calendar.procurement(step.zone, step.name) or GONE
            changed = {"procurement": procurement, "checked_at": now}
            return status.model_copy(update={"calendar": current.model_copy(update=changed)})
        calendar.release(step.zone, step.name)
        log.info("released calendar window %s: %s", step.name, step.reason)
        released = current.model_copy(update={"released_at": now, "release_reason": step.reason})
        return status.model_copy(update={"calendar": released})

    def _refused(
        self, step: Book | Refresh | Release, status: DeploymentStatus, now: datetime, exc: CloudError
    ) -> DeploymentStatus:
        """A permanent refusal: a refused booking fails the deployment (nothing was booked, so nothing is paid)."""
        if isinstance(step, Book):
            return _failed(status, f"the calendar-mode booking was refused: {exc}")
        log.error("calendar %s of %s failed: %s", type(step).__name__.lower(), step.name, exc)
        booking = status.calendar
        assert booking is not None
        return status.model_copy(update={"calendar": booking.model_copy(update={"checked_at": now})})

    def searchable(
        self, record: DeploymentRecord, write: StatusWriter
    ) -> tuple[DeploymentRecord, DeploymentSpec | None]:
        """The record (rewritten when it only waits) and the spec the capacity search acts on now: None while it
        can only wait for the window or the window is lost. Resources that exist are left to the search."""
        if record.desired is not Desired.PRESENT or record.spec.calendar is None:
            return record, record.spec
        booking = record.status.calendar
        spec = plannable_spec(record.spec, booking)
        if spec is not None or record.status.resources or record.status.probes:
            return record, spec or record.spec
        if record.status.phase is Phase.FAILED:
            return record, None
        if booking is not None and (booking.released_at is not None or booking.procurement in _LOST):
            why = booking.release_reason or booking.procurement.lower()
            lost = f"calendar reservation {booking.name} is gone ({why}); delete and create again to book a new window"
            return write(record, _failed(record.status, lost)), None
        waiting: dict[str, object] = {"phase": Phase.SEARCHING, "message": waiting_message(booking, self._clock.now())}
        if record.status.phase is not Phase.SEARCHING:
            waiting["phase_since"] = self._clock.now()
        return write(record, record.status.model_copy(update=waiting)), None

    def sweep(self, records: Mapping[str, DeploymentRecord], zones: Iterable[str]) -> list[str]:
        """Release bookings of ours that no live record holds (a record dropped before its release); at most every
        ``sweep_every_s``. Returns what it released."""
        now_s = self._clock.monotonic()
        if self._calendar is None or (self._last_sweep is not None and now_s - self._last_sweep < self._sweep_every_s):
            return []
        self._last_sweep = now_s
        held = {
            (r.status.calendar.window.zone, r.status.calendar.name)
            for r in records.values()
            if r.status.calendar is not None and r.status.calendar.released_at is None and r.live
        }
        released: list[str] = []
        try:
            for zone, name in self._calendar.list_names(sorted(set(zones))):
                if owner_of(name) is not None and (zone, name) not in held:
                    self._calendar.release(zone, name)
                    released.append(f"{zone}/{name}")
        except CloudError as exc:  # without the calendar role (enable_calendar_reservations off) once, not every sweep
            level = logging.DEBUG if exc.error_class is ErrorClass.PERMISSION and self._warned else logging.WARNING
            self._warned = self._warned or exc.error_class is ErrorClass.PERMISSION
            log.log(level, "calendar sweep stopped: %s", exc)
        for item in released:
            log.warning("released orphaned calendar booking %s", item)
        return released


def _failed(status: DeploymentStatus, why: str) -> DeploymentStatus:
    return status.model_copy(update={"phase": Phase.FAILED, "message": why})

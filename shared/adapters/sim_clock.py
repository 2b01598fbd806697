"""``SimulatorClock``: the local cloud's virtual time, read from the TPU simulator (``GET /_sim/clock``).

Why: the local cloud runs the scenario at a time scale (60 virtual seconds per wall second by default), so a
40-minute capacity wait takes 40 s. Every process of the stack (the three functions, the gateway, the node agent,
the ticker) must agree on that time: the command ledger ages commands, the planner waits out valid-until windows
and cooldowns, the scheduler fires its one-minute jobs, and the bus stamps publish times, all on ``Clock.now``.

Reads are cheap: the simulator answers with its virtual time and time scale, and between reads the clock
extrapolates with the process's monotonic clock times the scale, re-reading at most every ``resync_s`` so a manual
``/_sim/advance`` shows up within that bound. Time never runs backwards for a caller: a re-read that lands a few
milliseconds behind the extrapolation is held at the last value returned.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime, timedelta

import httpx

from shared.domain.errors import TransientError

__all__ = ["SimulatorClock"]

log = logging.getLogger(__name__)


class SimulatorClock:
    """A ``shared.ports.Clock`` that follows the simulator at ``endpoint`` (e.g. ``http://127.0.0.1:8471``)."""

    def __init__(self, endpoint: str, *, resync_s: float = 2.0, timeout_s: float = 2.0) -> None:
        if not endpoint.startswith(("http://", "https://")):
            raise ValueError(f"endpoint: {endpoint!r} must be the simulator's http:// base URL")
        if resync_s <= 0:
            raise ValueError(f"resync_s: {resync_s!r} must be positive")
        self._url = endpoint.rstrip("/") + "/_sim/clock"
        self._resync_s = resync_s
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._anchor_wall: float | None = None
        self._anchor_virtual = datetime.fromtimestamp(0, UTC)
        self._anchor_elapsed = 0.0
        self._scale = 0.0
        self._last_now = datetime.fromtimestamp(0, UTC)
        self._last_mono = 0.0

    def now(self) -> datetime:
        with self._lock:
            offset = self._offset_locked()
            value = max(self._last_now, self._anchor_virtual + timedelta(seconds=offset))
            self._last_now = value
            return value

    def monotonic(self) -> float:
        with self._lock:
            value = max(self._last_mono, self._anchor_elapsed + self._offset_locked())
            self._last_mono = value
            return value

    @property
    def time_scale(self) -> float:
        """Virtual seconds per wall second, as the simulator last reported it."""
        with self._lock:
            self._offset_locked()
            return self._scale

    def _offset_locked(self) -> float:
        """Virtual seconds since the anchor, re-reading the simulator when the anchor is older than resync_s."""
        wall = time.monotonic()
        if self._anchor_wall is None or wall - self._anchor_wall >= self._resync_s:
            self._resync_locked(wall)
        assert self._anchor_wall is not None
        return (time.monotonic() - self._anchor_wall) * self._scale

    def _resync_locked(self, wall: float) -> None:
        try:
            response = httpx.get(self._url, timeout=self._timeout_s)
            answered = time.monotonic()
            response.raise_for_status()
            body = response.json()
            virtual = datetime.fromisoformat(str(body["time"]).replace("Z", "+00:00"))
            elapsed = float(body["elapsed_s"])
            scale = float(body["time_scale"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            if self._anchor_wall is None:
                raise TransientError(
                    f"the simulator clock at {self._url} did not answer ({type(exc).__name__}); "
                    "is the local cloud running (python -m localcloud up)?",
                    retry_after_s=5,
                ) from None
            log.warning("simulator clock unreachable (%s); extrapolating from the last reading", type(exc).__name__)
            return
        if virtual.tzinfo is None:
            virtual = virtual.replace(tzinfo=UTC)
        self._anchor_wall = (wall + answered) / 2  # the simulator read its clock somewhere in the round trip
        self._anchor_virtual = virtual.astimezone(UTC)
        self._anchor_elapsed = elapsed
        self._scale = scale

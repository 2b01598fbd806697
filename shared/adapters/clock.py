"""Clocks: the real one, and a manual one for tests and the simulator's virtual time."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

__all__ = ["ManualClock", "SystemClock"]


class SystemClock:
    """Wall time in UTC and the process's monotonic clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to; thread-safe."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
        self._mono = 0.0
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def advance(self, seconds: float) -> datetime:
        """Move time forward; returns the new now."""
        if seconds < 0:
            raise ValueError("seconds: a clock only moves forward")
        with self._lock:
            self._now += timedelta(seconds=seconds)
            self._mono += seconds
            return self._now

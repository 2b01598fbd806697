"""The ``SchedulerApi`` port as an embedded ticker: jobs in SQLite, fired by whoever calls ``run_due``.

The local runner calls :meth:`LocalScheduler.run_due` (say every few seconds); each enabled job whose
unix-cron schedule has a minute slot since its last run publishes its body once on its topic. Like Cloud
Scheduler it does not back-fill missed slots (one publish however long the gap), and a paused job skips
the slots that pass while paused. Schedules are validated on upsert with a message naming the field.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from shared.ports import Clock, CommandBus, SchedulerJob

__all__ = ["CronSchedule", "LocalScheduler"]

_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12), ("day of week", 0, 7))
_MAX_LOOKBACK = timedelta(days=366)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS scheduler_jobs (
    name TEXT PRIMARY KEY,
    schedule TEXT NOT NULL,
    topic TEXT NOT NULL,
    data BLOB NOT NULL,
    attributes TEXT NOT NULL,
    paused INTEGER NOT NULL,
    last_slot TEXT NOT NULL
)
"""


@dataclass(frozen=True)
class CronSchedule:
    """A parsed five-field unix-cron expression (``* * * * *``, ``*/5 9-17 * * 1-5``, lists, ranges, steps)."""

    expression: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    any_day: bool
    any_weekday: bool

    @classmethod
    def parse(cls, expression: str) -> CronSchedule:
        parts = expression.split()
        if len(parts) != 5:
            raise ValueError(
                f"schedule: {expression!r} needs 5 fields (minute hour day-of-month month day-of-week), "
                "e.g. '* * * * *'"
            )
        sets = [_field(part, name, low, high) for part, (name, low, high) in zip(parts, _FIELDS, strict=True)]
        weekdays = frozenset(0 if day == 7 else day for day in sets[4])
        return cls(expression, sets[0], sets[1], sets[2], sets[3], weekdays, parts[2] == "*", parts[4] == "*")

    def matches(self, moment: datetime) -> bool:
        """True when the minute of ``moment`` (UTC) is a slot of this schedule."""
        if moment.minute not in self.minutes or moment.hour not in self.hours or moment.month not in self.months:
            return False
        day_ok = moment.day in self.days
        weekday_ok = (moment.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:
            return day_ok and weekday_ok
        return day_ok or weekday_ok  # both restricted: cron fires on either

    def last_slot(self, after: datetime, until: datetime) -> datetime | None:
        """The latest matching minute in ``(after, until]``, or None."""
        slot = until.replace(second=0, microsecond=0)
        floor = max(after, until - _MAX_LOOKBACK)
        while slot > floor:
            if self.matches(slot):
                return slot
            slot -= timedelta(minutes=1)
        return None


def _field(text: str, name: str, low: int, high: int) -> frozenset[int]:
    values: set[int] = set()
    for item in text.split(","):
        base, _, step_text = item.partition("/")
        try:
            step = int(step_text) if step_text else 1
            if base == "*":
                start, end = low, high
            elif "-" in base:
                first, last = base.split("-", 1)
                start, end = int(first), int(last)
            else:
                start = int(base)
                end = high if step_text else start
        except ValueError:
            raise ValueError(f"schedule: {name} field {text!r} is not a number, range, list or step") from None
        if step < 1 or start < low or end > high or start > end:
            raise ValueError(f"schedule: {name} field {text!r} must stay within {low}-{high}")
        values.update(range(start, end + 1, step))
    return frozenset(values)


def _minute(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(second=0, microsecond=0)


class LocalScheduler:
    """Scheduler jobs kept in one SQLite file; ``due(now)`` and ``run_due(bus)`` drive them."""

    def __init__(self, path: str | Path, *, clock: Clock) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._clock = clock
        self._lock = threading.Lock()
        with self._connect() as conn:
            conn.execute(_SCHEMA)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            try:
                conn.execute("BEGIN IMMEDIATE")
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            finally:
                conn.close()

    @staticmethod
    def _job(row: tuple[str, str, str, bytes, str, int, str]) -> SchedulerJob:
        name, schedule, topic, data, attributes, paused, _slot = row
        return SchedulerJob(
            name=name,
            schedule=schedule,
            topic=topic,
            data=bytes(data),
            paused=bool(paused),
            attributes=json.loads(attributes),
        )

    # -- SchedulerApi

    def upsert_job(self, job: SchedulerJob) -> None:
        if not job.name:
            raise ValueError("name: a job needs a name, e.g. tpuctl-reconcile-tick")
        if not job.topic:
            raise ValueError("topic: a job needs a topic to publish on, e.g. tpuctl-ticks")
        CronSchedule.parse(job.schedule)
        now_slot = _minute(self._clock.now()).isoformat()
        with self._connect() as conn:
            row = conn.execute("SELECT last_slot FROM scheduler_jobs WHERE name = ?", (job.name,)).fetchone()
            conn.execute(
                "INSERT OR REPLACE INTO scheduler_jobs VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    job.name,
                    job.schedule,
                    job.topic,
                    job.data,
                    json.dumps(dict(job.attributes)),
                    int(job.paused),
                    row[0] if row else now_slot,
                ),
            )

    def get_job(self, name: str) -> SchedulerJob | None:
        with self._connect() as conn:
            row = conn.execute("SELECT * FROM scheduler_jobs WHERE name = ?", (name,)).fetchone()
        return self._job(row) if row else None

    def list_jobs(self, prefix: str = "") -> list[SchedulerJob]:
        with self._connect() as conn:
            rows = conn.execute("SELECT * FROM scheduler_jobs ORDER BY name").fetchall()
        return [self._job(row) for row in rows if row[0].startswith(prefix)]

    def delete_job(self, name: str) -> None:
        with self._connect() as conn:
            conn.execute("DELETE FROM scheduler_jobs WHERE name = ?", (name,))

    def pause_job(self, name: str) -> None:
        self._set_paused(name, True)

    def resume_job(self, name: str) -> None:
        self._set_paused(name, False)

    def _set_paused(self, name: str, paused: bool) -> None:
        with self._connect() as conn:
            row = conn.execute("SELECT paused FROM scheduler_jobs WHERE name = ?", (name,)).fetchone()
            if row is None:
                raise KeyError(f"name: no scheduler job {name!r}; create it with upsert_job first")
            if bool(row[0]) == paused:
                return
            # Slots that pass while paused are skipped, not replayed on resume.
            conn.execute(
                "UPDATE scheduler_jobs SET paused = ?, last_slot = ? WHERE name = ?",
                (int(paused), _minute(self._clock.now()).isoformat(), name),
            )

    # -- the ticker

    def due(self, now: datetime | None = None) -> list[SchedulerJob]:
        """Enabled jobs with a schedule slot after their last run and at or before ``now``."""
        moment = now or self._clock.now()
        with self._connect() as conn:
            rows = conn.execute("SELECT * FROM scheduler_jobs WHERE paused = 0 ORDER BY name").fetchall()
        return [self._job(row) for row in rows if self._slot(row, moment) is not None]

    def _slot(self, row: tuple[str, str, str, bytes, str, int, str], now: datetime) -> datetime | None:
        return CronSchedule.parse(row[1]).last_slot(datetime.fromisoformat(row[6]), now)

    def run_due(self, bus: CommandBus, now: datetime | None = None) -> int:
        """Publish every due job once and remember its slot; returns how many were published."""
        moment = now or self._clock.now()
        published = 0
        with self._connect() as conn:
            rows = conn.execute("SELECT * FROM scheduler_jobs WHERE paused = 0 ORDER BY name").fetchall()
            fired = [(row, slot) for row in rows if (slot := self._slot(row, moment)) is not None]
            for row, slot in fired:
                conn.execute("UPDATE scheduler_jobs SET last_slot = ? WHERE name = ?", (slot.isoformat(), row[0]))
        for row, _slot in fired:
            job = self._job(row)
            bus.publish(job.topic, job.data, dict(job.attributes))
            published += 1
        return published

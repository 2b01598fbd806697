"""When each line of a twin container's log was written: the times ``docker logs --timestamps --since`` work on.

Why: Docker stamps every line it reads from a container (json-file keeps ``time`` per line), and the node agent's
log shipper reads forward with ``since``. The twin's containers write straight to a file, so the runtime stamps a
line when it first sees it: the lines new since the last look get the file's modification time (when the newest
of them was written, so never later than the truth), one nanosecond apart, so every line has its own time and
times only grow. Lines that were in the file before the first look all share its time then; later lines are
stamped within one read of when they were written (the shipper reads every few seconds). Stamps never change once
given. Only whole lines are stamped: a line still being written appears once its newline does.
"""

from __future__ import annotations

import bisect
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

__all__ = ["LogTimes", "log_times"]


@dataclass(frozen=True)
class _Run:
    """Lines stamped together: ``count`` lines from byte ``offset``, line ``first``, stamps ``first_ns`` + k."""

    offset: int
    first: int
    count: int
    first_ns: int

    @property
    def last_ns(self) -> int:
        return self.first_ns + self.count - 1


@dataclass
class LogTimes:
    """The stamps of one log file (thread-safe); a truncated or replaced file starts over."""

    path: Path
    now_ns: Callable[[], int] | None = None  # the VM's clock; None: the file's modification time
    _runs: list[_Run] = field(default_factory=list)
    _end: int = 0  # bytes stamped so far (always just after a newline)
    _lines: int = 0
    _inode: int | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def lines(self, since_ns: int = 0, tail: int | None = None) -> list[tuple[int, bytes]]:
        """(stamp, line) of every whole line stamped at or after ``since_ns``, oldest first; the last ``tail``."""
        with self._lock:
            self._catch_up()
            start = self._first_line_since(since_ns)
            if tail is not None:
                start = max(start, self._lines - tail)
            return self._read_from(start)

    def _catch_up(self) -> None:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return
        if stat.st_ino != self._inode or stat.st_size < self._end:
            self._runs, self._end, self._lines, self._inode = [], 0, 0, stat.st_ino
        if stat.st_size == self._end:
            return
        with self.path.open("rb") as handle:
            handle.seek(self._end)
            data = handle.read(stat.st_size - self._end)
        whole = data.rfind(b"\n") + 1
        count = data.count(b"\n", 0, whole)
        if count == 0:
            return
        seen_ns = self.now_ns() if self.now_ns is not None else stat.st_mtime_ns
        first_ns = max(seen_ns, self._runs[-1].last_ns + 1 if self._runs else 0)
        self._runs.append(_Run(self._end, self._lines, count, first_ns))
        self._end += whole
        self._lines += count

    def _first_line_since(self, since_ns: int) -> int:
        index = bisect.bisect_left([run.last_ns for run in self._runs], since_ns)
        if index == len(self._runs):
            return self._lines
        run = self._runs[index]
        return run.first + max(0, since_ns - run.first_ns)

    def _read_from(self, line: int) -> list[tuple[int, bytes]]:
        if line >= self._lines:
            return []
        index = bisect.bisect_right([run.first for run in self._runs], line) - 1
        out: list[tuple[int, bytes]] = []
        with self.path.open("rb") as handle:
            for run in self._runs[index:]:
                handle.seek(run.offset)
                found = _read_lines(handle, run.count)
                skip = max(0, line - run.first)
                out.extend((run.first_ns + k, text) for k, text in enumerate(found) if k >= skip)
        return out


def _read_lines(handle: BinaryIO, count: int) -> list[bytes]:
    """``count`` lines from the handle's position (each without its newline)."""
    return [handle.readline().rstrip(b"\n") for _ in range(count)]


_registry: dict[str, LogTimes] = {}
_registry_lock = threading.Lock()


def log_times(path: Path, now_ns: Callable[[], int] | None = None) -> LogTimes:
    """The one :class:`LogTimes` of ``path`` in this process (a restarted container keeps appending to its file).

    ``now_ns`` is the VM's clock (the simulator's virtual time in the local cloud, which the controller and the
    gateway read too): lines are stamped when first seen on it. Without it, the file's modification time.
    """
    key = os.path.realpath(path)
    with _registry_lock:
        found = _registry.get(key)
        if found is None:
            found = _registry[key] = LogTimes(Path(key), now_ns)
        return found

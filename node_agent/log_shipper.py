"""The node agent's log shipper: the serving container's lines to a ``LogSink`` (Cloud Logging on Google Cloud).

Why: vLLM's container logs to the Docker engine only, so without this nothing of vLLM reaches Cloud Logging and
``tpu_observe(show='logs')`` / ``tpu_observe(show='analysis')`` see nothing from it. How:

* **Forward from where it shipped.** Lines are read through the Engine API (``ContainerLogs.read_since``); the
  position of the last shipped line (the engine's nanosecond stamp and its ordinal among lines of that stamp) is
  kept in ``log-shipper.json`` beside the agent's journal, so a restarted agent neither repeats nor skips lines.
* **Severity and hygiene.** Each line gets the severity of vLLM's own format (``shared.domain.vllm_logs``; a
  traceback's lines inherit the line that began it), then is cleaned as a log tail is (``clean_log_line``: no
  escapes or control characters; registered secrets, the API key and token-shaped strings redacted; at most 2000
  characters). Blank lines are not shipped.
* **Batched.** A batch goes when ``batch_lines`` (100) wait or the oldest has waited ``batch_wait_s`` (5 s).
* **Bounded, and an outage loses nothing.** At most ``backlog_lines`` wait in memory. While the sink fails,
  reading pauses at that bound and the rest stays in the engine's log, which keeps it; the agent log says when
  shipping stopped (and every 5 minutes after) with how many lines wait, and when it resumed. A batch the sink
  refuses as invalid is dropped: the agent log and a WARNING entry in the sink say how many lines, of which times.
* **Watched.** Each raw line is shown to ``observe`` first (the agent's ``EngineReporter`` reads vLLM's start-up
  facts from it); a watcher's failure is logged and shipping goes on.
* **Never in the way.** Its own thread and engine connection, calls with timeouts, failures retried with backoff
  (2 s doubling to 60 s); benchmarks and node tasks never wait for it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from node_agent.log_lines import MAX_LINE_CHARS, clean_log_line
from shared.domain.errors import CloudError, ControllerError, ErrorClass
from shared.domain.vllm_logs import VllmLogParser
from shared.ports import ContainerLogs, LogSink, NodeLogLine

__all__ = ["LogShipper", "Position"]

log = logging.getLogger("tpuctl.node_agent.log_shipper")

_BACKOFF_MIN_S = 2.0
_BACKOFF_MAX_S = 60.0
_REPORT_EVERY_S = 300.0
_EXAMINED_CHARS = 4 * MAX_LINE_CHARS  # what is cleaned of a longer line: the rest would be cut off anyway


@dataclass(frozen=True, order=True)
class Position:
    """Where a line is in the container's log: its stamp, and its ordinal (1, 2, ...) among lines of that stamp."""

    time_ns: int = 0
    ordinal: int = 0


@dataclass(frozen=True)
class _Waiting:
    position: Position | None  # None: the shipper's own note
    line: NodeLogLine
    queued_at: float


class LogShipper:
    """Moves one container's log to a sink; ``run`` on a thread of its own, or ``step`` by step in tests."""

    def __init__(
        self,
        source: ContainerLogs,
        sink: LogSink,
        *,
        container: str,
        state_file: Path | None = None,
        api_key: str | None = None,
        batch_lines: int = 100,
        batch_wait_s: float = 5.0,
        backlog_lines: int = 5000,
        monotonic: Callable[[], float] = time.monotonic,
        wall_ns: Callable[[], int] = time.time_ns,
        observe: Callable[[str], None] | None = None,
    ) -> None:
        if not 1 <= batch_lines <= backlog_lines:
            raise ValueError("batch_lines: must be at least 1 and at most backlog_lines")
        self._source, self._sink, self._container = source, sink, container
        self._state_file, self._api_key = state_file, api_key
        self.batch_lines, self.batch_wait_s, self.backlog_lines = batch_lines, batch_wait_s, backlog_lines
        self._monotonic, self._wall_ns = monotonic, wall_ns
        self._observe = observe
        self._shipped = self._load()
        self._read_at = self._shipped
        self._backlog: deque[_Waiting] = deque()
        self._parser = VllmLogParser()
        self._failing_since: float | None = None
        self._reported_at = 0.0
        self._retry_at = 0.0
        self._backoff = _BACKOFF_MIN_S
        self._source_problem: str | None = None
        self.shipped = 0
        self.dropped = 0

    @property
    def waiting(self) -> int:
        return len(self._backlog)

    @property
    def position(self) -> Position:
        """The last line the sink has taken (what a restarted shipper resumes after)."""
        return self._shipped

    def run(self, stop: threading.Event, *, poll_s: float = 2.0) -> None:
        """Until ``stop``: read, ship, wait. Then what waits goes at once, unless the sink is failing: a stopping
        agent does not wait out an outage, and the next one reads those lines again from the engine."""
        while not stop.is_set():
            try:
                more = self.step()
            except Exception:  # the shipper must outlive any one bad round
                log.exception("log shipping round failed")
                more = False
            if not more:
                stop.wait(poll_s)
        if self._failing_since is None:
            self.flush(force=True)

    def step(self) -> bool:
        """One read and the batches due; returns whether more is waiting in the engine to read at once."""
        read, asked = self.pump()
        self.flush()
        return asked > 0 and read >= asked and self._failing_since is None

    def pump(self) -> tuple[int, int]:
        """Read new lines into the backlog, as many as it has room for; returns (lines taken, room asked for)."""
        room = self.backlog_lines - len(self._backlog)
        if room <= 0:
            return 0, 0
        try:
            lines = self._source.read_since(self._read_at.time_ns, max_lines=room + self._read_at.ordinal)
        except ControllerError as exc:
            self._source_failed(str(exc))
            return 0, room
        if self._source_problem is not None:
            log.info("reading %s's log again", self._container)
            self._source_problem = None
        taken, previous, ordinal = 0, -1, 0
        for raw in lines:
            ordinal = ordinal + 1 if raw.time_ns == previous else 1
            previous = raw.time_ns
            position = Position(raw.time_ns, ordinal)
            if position <= self._read_at:
                continue
            self._read_at = position
            taken += 1
            self._take(position, raw.text)
        return taken, room

    def flush(self, *, force: bool = False) -> int:
        """Write the batches that are due (all of them when ``force``); returns how many lines the sink took."""
        sent = 0
        while self._backlog and (force or self._due()):
            if not force and self._monotonic() < self._retry_at:
                break
            batch = [self._backlog[i] for i in range(min(self.batch_lines, len(self._backlog)))]
            try:
                self._sink.write([item.line for item in batch])
            except CloudError as exc:
                if exc.error_class is not ErrorClass.INVALID:
                    self._sink_failed(exc, len(batch))
                    return sent
                self._refused(batch, exc)
                continue
            except Exception as exc:  # an adapter bug must not stop the agent: treat it as an outage
                self._sink_failed(exc, len(batch))
                return sent
            self._done(batch, taken=True)
            sent += len(batch)
        return sent

    # ------------------------------------------------------------------ lines

    def _take(self, position: Position, text: str) -> None:
        if self._observe is not None:
            try:
                self._observe(text[:_EXAMINED_CHARS])  # raw: a config line is longer than a shipped one
            except Exception:  # a watcher's bug must not stop the shipping
                log.exception("a log line watcher failed")
        cleaned = clean_log_line(text[:_EXAMINED_CHARS], self._api_key)
        severity = self._parser.parse(cleaned).severity  # after the escapes went: a coloured level still reads
        if cleaned.strip():
            self._backlog.append(
                _Waiting(position, NodeLogLine(position.time_ns, severity, cleaned), self._monotonic())
            )

    def _due(self) -> bool:
        if len(self._backlog) >= self.batch_lines:
            return True
        return self._monotonic() - self._backlog[0].queued_at >= self.batch_wait_s

    def _done(self, batch: list[_Waiting], *, taken: bool) -> None:
        """The sink answered for ``batch`` (took it, or refused it for good): it leaves, the position moves on."""
        for _ in batch:
            self._backlog.popleft()
        self.shipped += sum(1 for item in batch if item.position is not None) if taken else 0
        positions = [item.position for item in batch if item.position is not None]
        if positions:
            self._shipped = positions[-1]
            self._save()
        if self._failing_since is not None:
            waited = self._monotonic() - self._failing_since
            log.info(
                "shipping %s's log resumed after %.0f s; %d lines still wait", self._container, waited, self.waiting
            )
            self._failing_since = None
        self._backoff, self._retry_at = _BACKOFF_MIN_S, 0.0

    def _refused(self, batch: list[_Waiting], exc: CloudError) -> None:
        lines = [item for item in batch if item.position is not None]
        first, last = _iso(batch[0].line.time_ns), _iso(batch[-1].line.time_ns)
        log.error(
            "the log sink refused a batch of %d lines of %s (%s to %s): %s; the refused lines are dropped",
            len(lines), self._container, first, last, exc,
        )  # fmt: skip
        self.dropped += len(lines)
        self._done(batch, taken=False)
        if lines:  # say so where the lines should have been (a refused note is not noted again)
            note = (
                f"tpuctl log shipper: the log sink refused a batch of {len(lines)} lines of {self._container} "
                f"from {first} to {last}; the refused lines were dropped: {str(exc)[:300]}"
            )
            line = NodeLogLine(self._wall_ns(), "WARNING", clean_log_line(note, self._api_key))
            self._backlog.appendleft(_Waiting(None, line, self._monotonic()))

    def _sink_failed(self, exc: Exception, batch: int) -> None:
        now = self._monotonic()
        if self._failing_since is None or now - self._reported_at >= _REPORT_EVERY_S:
            since = "" if self._failing_since is None else f" (failing for {now - self._failing_since:.0f} s)"
            log.warning(
                "shipping %s's log failed%s: %s; %d lines wait (a batch of %d), reading pauses at %d and the rest "
                "stays in the container's log",
                self._container, since, exc, self.waiting, batch, self.backlog_lines,
            )  # fmt: skip
            self._reported_at = now
        if self._failing_since is None:
            self._failing_since = now
        self._retry_at = now + self._backoff
        self._backoff = min(self._backoff * 2, _BACKOFF_MAX_S)

    def _source_failed(self, problem: str) -> None:
        if problem != self._source_problem:
            log.warning("cannot read %s's log: %s; trying again", self._container, problem)
            self._source_problem = problem

    # ------------------------------------------------------------------ position on disk

    def _load(self) -> Position:
        if self._state_file is None:
            return Position()
        try:
            state = json.loads(self._state_file.read_text(encoding="utf-8"))
            if state.get("container") != self._container:
                return Position()
            return Position(int(state["time_ns"]), int(state["ordinal"]))
        except FileNotFoundError:
            return Position()
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning(
                "log shipper state %s unreadable (%s); shipping from the start of the log", self._state_file, exc
            )
            return Position()

    def _save(self) -> None:
        if self._state_file is None:
            return
        state = {"container": self._container, "time_ns": self._shipped.time_ns, "ordinal": self._shipped.ordinal}
        partial = self._state_file.with_suffix(".tmp")
        try:
            self._state_file.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps(state), encoding="utf-8")
            os.replace(partial, self._state_file)
        except OSError as exc:
            log.warning("cannot save the log shipper's position to %s: %s", self._state_file, exc)


def _iso(time_ns: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time_ns // 1_000_000_000)) + "Z"

"""The node agent's run journal: a small JSON file that survives restarts, plus a lock for one agent per node.

Why: a benchmark outlives a message's ack deadline, so the agent acks a dispatch once it is written here and
runs it afterwards. If the agent dies mid-run, the next start finds the run still ``running`` and reports it
failed with that cause, so no run is left "running" forever; a run accepted but not started runs then.
Every change rewrites the file atomically (temp file, fsync, rename).

Entry states: ``accepted`` -> ``running`` -> ``completed`` | ``failed``; ``published`` turns true once
``benchmark.completed`` is on the bus (until then the agent keeps retrying the publish).

Node tasks (``serving.restart``, ``serving.logs``) have their own file beside it, ``tasks.json``
(:class:`TaskJournal`): a task id seen once is never carried out again, across agent restarts, and its answer
(``node.task_completed``) is kept until the bus took it. Both journals may be used from the agent's two threads.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = ["AgentLock", "JournalEntry", "RunJournal", "TaskEntry", "TaskJournal"]

RunState = Literal["accepted", "running", "completed", "failed"]
_KEEP_FINISHED = 200
_KEEP_TASKS = 1000


@dataclass
class JournalEntry:
    run_id: str
    state: RunState
    message: str
    """The ``benchmark.run`` body as received (needed to start an accepted run)."""
    accepted_at: str
    started_at: str | None = None
    finished_at: str | None = None
    pid: int | None = None
    error: str = ""
    published: bool = False
    result_file: str | None = None
    records_file: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class RunJournal:
    """Run entries in ``<directory>/journal.json``; result files live beside it in ``runs/``."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "runs").mkdir(exist_ok=True)
        self.path = self.directory / "journal.json"
        self._lock = threading.RLock()
        self._entries: dict[str, JournalEntry] = self._load()

    def _load(self) -> dict[str, JournalEntry]:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            broken = self.path.with_suffix(".broken")
            with contextlib.suppress(OSError):
                os.replace(self.path, broken)
            raise RuntimeError(f"journal: {self.path} was unreadable ({exc}); moved aside to {broken}") from exc
        return {item["run_id"]: JournalEntry(**item) for item in raw.get("runs", [])}

    def _save(self) -> None:
        with self._lock:
            finished = [e for e in self._entries.values() if e.state in ("completed", "failed") and e.published]
            for entry in sorted(finished, key=lambda e: e.finished_at or "")[:-_KEEP_FINISHED]:
                del self._entries[entry.run_id]
            body = json.dumps({"runs": [asdict(entry) for entry in self._entries.values()]}, indent=1)
            _write_atomically(self.path, body)

    def get(self, run_id: str) -> JournalEntry | None:
        with self._lock:
            return self._entries.get(run_id)

    def entries(self) -> list[JournalEntry]:
        with self._lock:
            return sorted(self._entries.values(), key=lambda entry: entry.accepted_at)

    def accept(self, run_id: str, message: str, at: str) -> bool:
        """Record a dispatch; False when the run is already known (a redelivery)."""
        with self._lock:
            if run_id in self._entries:
                return False
            self._entries[run_id] = JournalEntry(run_id=run_id, state="accepted", message=message, accepted_at=at)
            self._save()
            return True

    def next_accepted(self) -> JournalEntry | None:
        waiting = [entry for entry in self.entries() if entry.state == "accepted"]
        return waiting[0] if waiting else None

    def mark_running(self, run_id: str, at: str, pid: int) -> None:
        with self._lock:
            entry = self._entries[run_id]
            entry.state, entry.started_at, entry.pid = "running", at, pid
            self._save()

    def finish(
        self,
        run_id: str,
        state: Literal["completed", "failed"],
        at: str,
        *,
        error: str = "",
        result_file: str | None = None,
        records_file: str | None = None,
    ) -> None:
        with self._lock:
            entry = self._entries[run_id]
            entry.state, entry.finished_at, entry.error = state, at, error
            entry.result_file, entry.records_file = result_file, records_file
            self._save()

    def mark_published(self, run_id: str) -> None:
        with self._lock:
            self._entries[run_id].published = True
            self._save()

    def unpublished(self) -> list[JournalEntry]:
        return [e for e in self.entries() if e.state in ("completed", "failed") and not e.published]

    def interrupted(self) -> list[JournalEntry]:
        """Runs a previous agent process left ``running``."""
        return [entry for entry in self.entries() if entry.state == "running"]

    def result_path(self, run_id: str, suffix: str) -> Path:
        return self.directory / "runs" / f"{run_id}{suffix}"


def _write_atomically(path: Path, body: str) -> None:
    """Temp file, fsync, rename: a reader sees the old file or the new one, never half of one."""
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=".json")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(body)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


TaskAction = Literal["restart", "logs", "debug"]
TaskState = Literal["accepted", "completed", "failed"]


@dataclass
class TaskEntry:
    task_id: str
    action: TaskAction
    state: TaskState
    message: str
    """The request body as received (``serving.restart`` or ``serving.logs``)."""
    accepted_at: str
    finished_at: str | None = None
    detail: str = ""
    lines: list[str] = field(default_factory=list)
    bundle: str = ""
    """The debug bundle kept for this task (restart, debug), if any."""
    trace: str = ""
    """The W3C ``traceparent`` its answer is reported under: the request's, then the agent's own span's."""
    published: bool = False


class TaskJournal:
    """Node task entries in ``<directory>/tasks.json``: seen ids (for dedup) and answers not yet published."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / "tasks.json"
        self._lock = threading.RLock()
        self._entries: dict[str, TaskEntry] = self._load()

    def _load(self) -> dict[str, TaskEntry]:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
            return {item["task_id"]: TaskEntry(**item) for item in raw.get("tasks", [])}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, TypeError, KeyError) as exc:
            broken = self.path.with_suffix(".broken")
            with contextlib.suppress(OSError):
                os.replace(self.path, broken)
            raise RuntimeError(f"task journal: {self.path} was unreadable ({exc}); moved aside to {broken}") from exc

    def _save(self) -> None:
        with self._lock:
            done = [e for e in self._entries.values() if e.state != "accepted" and e.published]
            for entry in sorted(done, key=lambda e: e.finished_at or "")[:-_KEEP_TASKS]:
                del self._entries[entry.task_id]
            body = json.dumps({"tasks": [asdict(entry) for entry in self._entries.values()]})
            _write_atomically(self.path, body)

    def get(self, task_id: str) -> TaskEntry | None:
        with self._lock:
            return self._entries.get(task_id)

    def accept(self, task_id: str, action: TaskAction, message: str, at: str, *, trace: str = "") -> bool:
        """Record a task; False when its id was seen before (a redelivery or a duplicate)."""
        with self._lock:
            if task_id in self._entries:
                return False
            self._entries[task_id] = TaskEntry(
                task_id=task_id, action=action, state="accepted", message=message, accepted_at=at, trace=trace
            )
            self._save()
            return True

    def waiting(self) -> list[TaskEntry]:
        """Tasks accepted and not carried out yet, oldest first."""
        with self._lock:
            return sorted((e for e in self._entries.values() if e.state == "accepted"), key=lambda e: e.accepted_at)

    def finish(
        self,
        task_id: str,
        state: Literal["completed", "failed"],
        at: str,
        *,
        detail: str,
        lines: list[str],
        bundle: str = "",
        trace: str = "",
    ) -> None:
        with self._lock:
            entry = self._entries[task_id]
            entry.state, entry.finished_at, entry.detail, entry.lines = state, at, detail, list(lines)
            entry.bundle, entry.trace = bundle, trace or entry.trace
            self._save()

    def unpublished(self) -> list[TaskEntry]:
        with self._lock:
            return sorted(
                (e for e in self._entries.values() if e.state != "accepted" and not e.published),
                key=lambda e: e.finished_at or "",
            )

    def mark_published(self, task_id: str) -> None:
        """The answer is on the bus: keep only the id (the log lines are not needed any more)."""
        with self._lock:
            entry = self._entries[task_id]
            entry.published, entry.lines = True, []
            self._save()


class AgentLock:
    """An exclusive ``flock`` on ``<directory>/agent.lock``: one node agent (so one run) per node at a time."""

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / "agent.lock"
        self._handle: Any = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = self.path.open("a+")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise RuntimeError(
                f"node_journal_dir: another node agent holds {self.path} (one agent per node; stop the other first)"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self._handle = handle

    def release(self) -> None:
        if self._handle is not None:
            fcntl.flock(self._handle.fileno(), fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None

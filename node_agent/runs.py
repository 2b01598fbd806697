"""What a benchmark runner is to the node agent: how the agent stops a run, and what a run hands back.

Apart from ``node_agent.agent`` so a runner in a module of its own (``node_agent.tuning``) needs nothing of the
agent's; the agent re-exports both names.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any

from shared.messages import RunBenchmark

__all__ = ["RunControl", "RunOutcome", "Runner"]


@dataclass
class RunOutcome:
    """What a runner hands back: the structured result and the per-request records (JSON lines)."""

    result: dict[str, Any]
    records: Iterable[str] = ()
    cancelled: bool = False


@dataclass
class RunControl:
    """Lets the agent stop a run: the runner registers how; :meth:`stop` calls it."""

    stopping: threading.Event = field(default_factory=threading.Event)
    reason: str = ""
    _on_stop: list[Callable[[], None]] = field(default_factory=list)

    def on_stop(self, callback: Callable[[], None]) -> None:
        self._on_stop.append(callback)
        if self.stopping.is_set():
            callback()

    def stop(self, reason: str) -> None:
        self.reason = self.reason or reason
        self.stopping.set()
        for callback in list(self._on_stop):
            callback()


Runner = Callable[[RunBenchmark, RunControl], Coroutine[Any, Any, RunOutcome]]

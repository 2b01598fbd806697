"""Report what vLLM printed at start-up (its config, KV allocation, attention back end) to the controller.

Why: the plan's promises that ``/metrics`` does not carry are printed once in the serving container's log
(``shared.domain.engine_facts``). The log shipper already reads every line in order, so it hands each to
:meth:`EngineReporter.observe`, which only parses (no I/O on the shipper's thread); :meth:`EngineReporter.run`,
on a thread of its own, writes the facts to the guest attribute ``tpuctl/engine`` when they changed, at most every
``interval_s``, where the monitor reads them with the boot progress and telemetry. A write that fails is tried
again on the next round; the guest attribute keeps the last facts written across an agent restart.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from node_agent.tpu_telemetry import GuestAttributeWriter
from shared.domain.engine_facts import ENGINE_KEY, EngineFacts, EngineFactsParser, encode

__all__ = ["EngineReporter", "start_reporter"]

log = logging.getLogger("tpuctl.node_agent.engine_report")


class EngineReporter:
    """Parses the lines it is shown; publishes the newest engine's facts when they change."""

    def __init__(self, publish: Callable[[str], None], *, interval_s: float = 5.0) -> None:
        self._publish = publish
        self.interval_s = interval_s
        self._parser = EngineFactsParser()
        self._lock = threading.Lock()
        self._published: EngineFacts | None = None
        self._failed = False

    def observe(self, line: str) -> None:
        """One line of the serving container's log, in order (the log shipper's thread)."""
        with self._lock:
            self._parser.feed(line)

    @property
    def facts(self) -> EngineFacts | None:
        with self._lock:
            return self._parser.facts

    def publish_once(self) -> bool:
        """Write the facts if they changed since the last write; True when one was written."""
        facts = self.facts
        if facts is None or facts == self._published:
            return False
        try:
            self._publish(encode(facts))
        except Exception as exc:  # the metadata server is down: the next round tries again
            if not self._failed:
                log.warning("engine facts not written: %s: %s", type(exc).__name__, str(exc)[:200])
            self._failed = True
            return False
        self._published, self._failed = facts, False
        return True

    def run(self, stop: threading.Event) -> None:
        """Until ``stop``: a round every ``interval_s``, and a last one on the way out."""
        while not stop.wait(self.interval_s):
            self.publish_once()
        self.publish_once()


def start_reporter(stop: threading.Event) -> EngineReporter:
    """The agent's reporter, writing to this VM's ``tpuctl/engine`` on a daemon thread of its own until ``stop``."""
    reporter = EngineReporter(GuestAttributeWriter(ENGINE_KEY))
    threading.Thread(target=reporter.run, args=(stop,), name="engine-facts", daemon=True).start()
    return reporter

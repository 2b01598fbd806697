"""The node agent's log shipper (``node_agent.log_shipper``) against a container log and a sink that keep state.

The container log keeps stamped lines and answers ``since`` as the engine does (inclusive, oldest first); the sink
keeps every batch it took and can be down or refuse a batch, as Cloud Logging can. Time is a clock the test moves.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from node_agent.log_shipper import LogShipper, Position
from shared.domain.errors import CloudError, ErrorClass, PermanentError
from shared.logging import register_secret
from shared.ports import ContainerLogLine, NodeLogLine

T0 = 1_796_000_000_000_000_000
API_KEY = "sk-node-key-8f2b7d1e4c"
REGISTERED = "registered-secret-5a9c3e"


class ContainerLog:
    """A container's log as the engine keeps it."""

    def __init__(self) -> None:
        self.lines: list[ContainerLogLine] = []
        self.asked: list[int] = []  # max_lines of every read
        self.failure: Exception | None = None

    def write(self, *texts: str, same_stamp: bool = False) -> None:
        stamp = self.lines[-1].time_ns + 1_000 if self.lines else T0
        for text in texts:
            self.lines.append(ContainerLogLine(stamp, text))
            stamp += 0 if same_stamp else 1_000

    def read_since(self, since_ns: int, *, max_lines: int) -> list[ContainerLogLine]:
        self.asked.append(max_lines)
        if self.failure is not None:
            raise self.failure
        return [line for line in self.lines if line.time_ns >= since_ns][:max_lines]


class Sink:
    """Cloud Logging as far as the shipper can tell."""

    def __init__(self) -> None:
        self.batches: list[list[NodeLogLine]] = []
        self.down = False
        self.refuse: str | None = None  # refuse a batch holding a line with this text
        self.attempts = 0

    def write(self, lines: Sequence[NodeLogLine]) -> None:
        self.attempts += 1
        if self.down:
            raise CloudError(ErrorClass.TRANSIENT, "Cloud Logging unreachable: ConnectionError")
        if self.refuse is not None and any(self.refuse in line.text for line in lines):
            raise CloudError(ErrorClass.INVALID, "Cloud Logging entries:write: HTTP 400: entry too large")
        self.batches.append(list(lines))

    @property
    def texts(self) -> list[str]:
        return [line.text for batch in self.batches for line in batch]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def parts() -> tuple[ContainerLog, Sink, Clock]:
    return ContainerLog(), Sink(), Clock()


def shipper_for(log: ContainerLog, sink: Sink, clock: Clock, state: Path | None = None, **options: Any) -> LogShipper:
    return LogShipper(
        log, sink, container="tpuctl-vllm", state_file=state, api_key=API_KEY, monotonic=clock.monotonic, **options
    )


def drain(shipper: LogShipper, clock: Clock, rounds: int = 50) -> None:
    for _ in range(rounds):
        clock.now += 61
        shipper.step()


def test_lines_go_in_batches_of_100_and_a_short_batch_waits_its_time(parts: tuple[ContainerLog, Sink, Clock]) -> None:
    log, sink, clock = parts
    log.write(*(f"INFO 12-03 19:32:07 [x.py:1] line {n}" for n in range(250)))
    shipper = shipper_for(log, sink, clock)
    shipper.step()
    assert [len(batch) for batch in sink.batches] == [100, 100]
    assert shipper.waiting == 50
    clock.now += 4.9
    shipper.step()
    assert len(sink.batches) == 2, "a short batch waits up to 5 s"
    clock.now += 0.2
    shipper.step()
    assert [len(batch) for batch in sink.batches] == [100, 100, 50]
    assert sink.texts == [line.text for line in log.lines]
    assert [line.time_ns for batch in sink.batches for line in batch] == [line.time_ns for line in log.lines]


def test_each_line_carries_vllms_own_severity(parts: tuple[ContainerLog, Sink, Clock]) -> None:
    log, sink, clock = parts
    log.write(
        "(APIServer pid=8814) WARNING 12-03 19:49:02 [cpu.py:224] Triton is not installed.",
        'INFO:     127.0.0.1:54982 - "GET /v1/models HTTP/1.1" 401 Unauthorized',
        "Traceback (most recent call last):",
        '  File "/usr/lib/python3/vllm/entrypoints/cli/main.py", line 120, in main',
        "OSError: Repo id must be in the form 'repo_name'",
        'INFO:     127.0.0.1:53956 - "GET /health HTTP/1.1" 200 OK',
        "Triton is installed, but doesn't include CPU backend. Disabling Triton.",
    )
    shipper = shipper_for(log, sink, clock)
    shipper.pump()
    shipper.flush(force=True)
    assert [line.severity for line in sink.batches[0]] == [
        "WARNING", "WARNING", "ERROR", "ERROR", "ERROR", "INFO", "DEFAULT",
    ]  # fmt: skip


def test_lines_are_cleaned_cut_and_redacted_before_they_leave(parts: tuple[ContainerLog, Sink, Clock]) -> None:
    log, sink, clock = parts
    register_secret(REGISTERED)
    log.write(
        f"\x1b[31mERROR\x1b[0m 12-03 19:32:07 [x.py:1] key {API_KEY} and {REGISTERED}\x07 done",
        "INFO:     Authorization: Bearer abcdefghijklmnop1234 hf_" + "a" * 30,
        "",
        "   ",
        "x" * 10_000,
    )
    shipper = shipper_for(log, sink, clock)
    shipper.pump()
    shipper.flush(force=True)
    texts = sink.texts
    assert len(texts) == 3, "blank lines are not shipped"
    assert texts[0] == "ERROR 12-03 19:32:07 [x.py:1] key [REDACTED] and [REDACTED] done"
    assert API_KEY not in "".join(texts) and REGISTERED not in "".join(texts) and "hf_aaaa" not in texts[1]
    assert "abcdefghijklmnop1234" not in texts[1]
    assert len(texts[2]) == 2000 and texts[2].endswith("…")
    assert sink.batches[0][0].severity == "ERROR", "the severity is read once the escapes are gone"


def test_an_outage_keeps_a_bounded_backlog_pauses_reading_and_loses_nothing(
    parts: tuple[ContainerLog, Sink, Clock], caplog: pytest.LogCaptureFixture
) -> None:
    log, sink, clock = parts
    shipper = shipper_for(log, sink, clock, backlog_lines=300)
    sink.down = True
    log.write(*(f"line {n}" for n in range(1000)))
    with caplog.at_level(logging.WARNING, logger="tpuctl.node_agent.log_shipper"):
        drain(shipper, clock, rounds=10)
    assert shipper.waiting == 300 and sink.batches == []
    assert max(log.asked) <= 301, "never more asked of the engine than the backlog has room for"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings and "Cloud Logging unreachable" in warnings[0] and "reading pauses at 300" in warnings[0]
    assert len(warnings) < 10, "an outage is reported when it starts and then every 5 minutes, not every try"
    sink.down = False
    with caplog.at_level(logging.INFO, logger="tpuctl.node_agent.log_shipper"):
        drain(shipper, clock)
    assert sink.texts == [f"line {n}" for n in range(1000)], "every line once, in order"
    assert shipper.waiting == 0 and shipper.shipped == 1000 and shipper.dropped == 0
    assert any("resumed after" in r.getMessage() for r in caplog.records)


def test_a_refused_batch_is_dropped_and_the_drop_is_said_in_both_logs(
    parts: tuple[ContainerLog, Sink, Clock], caplog: pytest.LogCaptureFixture
) -> None:
    log, sink, clock = parts
    shipper = shipper_for(log, sink, clock, batch_lines=3, backlog_lines=30)
    log.write("ok 1", "poison 2", "ok 3", "ok 4", "ok 5")
    sink.refuse = "poison"
    with caplog.at_level(logging.ERROR, logger="tpuctl.node_agent.log_shipper"):
        drain(shipper, clock, rounds=3)
    assert shipper.dropped == 3
    assert "refused a batch of 3 lines of tpuctl-vllm" in caplog.records[0].getMessage()
    note, *rest = sink.batches[0]
    assert note.severity == "WARNING" and "refused a batch of 3 lines" in note.text and "entry too large" in note.text
    assert [line.text for line in rest] + sink.texts[len(sink.batches[0]) :] == ["ok 4", "ok 5"]


def test_a_restarted_shipper_resumes_after_the_last_line_the_sink_took(
    parts: tuple[ContainerLog, Sink, Clock], tmp_path: Path
) -> None:
    log, sink, clock = parts
    state = tmp_path / "journal" / "log-shipper.json"
    log.write("a", "b", "c")
    log.write("d", "e", "f", "g", "h", same_stamp=True)  # one stamp for five lines: the ordinal tells them apart
    first = shipper_for(log, sink, clock, state, batch_lines=5)
    first.step()
    assert sink.texts == ["a", "b", "c", "d", "e"] and first.waiting == 3
    assert first.position == Position(log.lines[4].time_ns, 2)
    second = shipper_for(log, sink, clock, state, batch_lines=5)  # the agent restarted: "f" to "h" were in memory
    log.write("i")
    second.pump()
    second.flush(force=True)
    assert sink.texts == ["a", "b", "c", "d", "e", "f", "g", "h", "i"]


def test_a_state_file_of_another_container_or_broken_starts_from_the_beginning(
    parts: tuple[ContainerLog, Sink, Clock], tmp_path: Path
) -> None:
    log, sink, clock = parts
    state = tmp_path / "log-shipper.json"
    log.write("a", "b")
    for text in ('{"container": "other", "time_ns": 99999999999999999999, "ordinal": 1}', "{not json"):
        state.write_text(text, encoding="utf-8")
        sink.batches.clear()
        shipper = shipper_for(log, sink, clock, state)
        shipper.pump()
        shipper.flush(force=True)
        assert sink.texts == ["a", "b"]


def test_an_unreadable_container_is_reported_once_and_reading_resumes(
    parts: tuple[ContainerLog, Sink, Clock], caplog: pytest.LogCaptureFixture
) -> None:
    log, sink, clock = parts
    shipper = shipper_for(log, sink, clock)
    log.failure = PermanentError("node_container: no container named 'tpuctl-vllm' on this node")
    with caplog.at_level(logging.INFO, logger="tpuctl.node_agent.log_shipper"):
        for _ in range(5):
            shipper.step()
        log.failure = None
        log.write("back")
        drain(shipper, clock, rounds=2)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("cannot read tpuctl-vllm's log" in m for m in messages) == 1
    assert any("reading tpuctl-vllm's log again" in m for m in messages)
    assert sink.texts == ["back"]


def test_run_ships_what_waits_when_it_is_stopped(parts: tuple[ContainerLog, Sink, Clock]) -> None:
    log, sink, clock = parts
    shipper = shipper_for(log, sink, clock, batch_wait_s=3600)
    log.write("one", "two")
    stop = threading.Event()
    runner = threading.Thread(target=shipper.run, args=(stop,), kwargs={"poll_s": 0.01})
    runner.start()
    try:
        while not log.asked:
            stop.wait(0.01)
        assert sink.batches == [], "a short batch waits for its time while running"
    finally:
        stop.set()
        runner.join(timeout=10)
    assert not runner.is_alive() and sink.texts == ["one", "two"]


def test_a_stopping_shipper_does_not_wait_out_an_outage_and_the_next_one_catches_up(
    parts: tuple[ContainerLog, Sink, Clock], tmp_path: Path
) -> None:
    log, sink, clock = parts
    state = tmp_path / "log-shipper.json"
    log.write("one", "two")
    sink.down = True
    stop = threading.Event()
    stop.set()
    first = shipper_for(log, sink, clock, state)
    first.pump()
    clock.now += 6
    first.step()
    assert sink.attempts == 1
    first.run(stop)  # returns at once: no last try against a failing sink
    assert sink.attempts == 1 and sink.batches == [] and first.waiting == 2
    sink.down = False
    second = shipper_for(log, sink, clock, state)
    second.pump()
    second.flush(force=True)
    assert sink.texts == ["one", "two"]

"""Reading a container's log forward: the VM twin's Engine API ``logs`` with ``since`` and ``timestamps``, and the
Docker adapter's ``read_since`` the log shipper uses, over a real unix socket and a real process's log file."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from shared.adapters.docker_engine import DockerEngineContainer, LogStreamDecoder, split_stamp
from tests.support.serving_container import StandIn, serve_stand_in

NANO_STAMP = re.compile(rb"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z$")


@pytest.fixture
def stand_in(tmp_path: Path) -> Iterator[StandIn]:
    with serve_stand_in(tmp_path / "node", lines=("first stderr line", "second stderr line")) as served:
        yield served


@pytest.fixture
def engine(stand_in: StandIn) -> Iterator[DockerEngineContainer]:
    client = DockerEngineContainer(stand_in.docker_host, "tpuctl-vllm", timeout_s=5)
    try:
        yield client
    finally:
        client.close()


def logs(stand_in: StandIn, **params: str) -> tuple[int, list[tuple[int | None, bytes]]]:
    """The raw Engine API call: status and (stamp, line) pairs."""
    transport = httpx.HTTPTransport(uds=str(stand_in.server.socket_path))
    with httpx.Client(transport=transport, base_url="http://docker", timeout=5) as client:
        answer = client.get("/v1.43/containers/tpuctl-vllm/logs", params={"stdout": "1", "stderr": "1", **params})
    if answer.status_code != 200:
        return answer.status_code, []
    decoder = LogStreamDecoder()
    pairs = decoder.feed(answer.content) + decoder.close()
    return 200, [split_stamp(line) for _, line in pairs]


def wait_for_lines(engine: DockerEngineContainer, count: int) -> None:
    deadline = time.monotonic() + 10
    while len(engine.read_since(0, max_lines=1000)) < count:
        assert time.monotonic() < deadline, f"the stand-in did not write {count} lines"
        time.sleep(0.05)


def append(stand_in: StandIn, text: bytes) -> None:
    with stand_in.image.log_path.open("ab") as log:
        log.write(text)


def test_each_line_has_its_own_stamp_that_never_changes(stand_in: StandIn, engine: DockerEngineContainer) -> None:
    wait_for_lines(engine, 3)
    first = engine.read_since(0, max_lines=100)
    assert [line.text for line in first] == ["boot 1", "first stderr line", "second stderr line"]
    stamps = [line.time_ns for line in first]
    assert stamps == sorted(set(stamps)), "every line its own time, in order"
    assert abs(stamps[0] / 1e9 - time.time()) < 60
    time.sleep(0.02)
    append(stand_in, b"later one\nlater two\n")
    again = engine.read_since(0, max_lines=100)
    assert [line.time_ns for line in again[:3]] == stamps
    assert [line.text for line in again[3:]] == ["later one", "later two"]
    assert again[3].time_ns > stamps[-1]


def test_reading_forward_from_a_stamp_and_stopping_after_the_oldest_n(
    stand_in: StandIn, engine: DockerEngineContainer
) -> None:
    wait_for_lines(engine, 3)
    append(stand_in, b"".join(b"more %d\n" % n for n in range(20)))
    everything = engine.read_since(0, max_lines=1000)
    middle = everything[5]
    assert engine.read_since(middle.time_ns, max_lines=1000) == everything[5:]
    assert engine.read_since(middle.time_ns + 1, max_lines=1000) == everything[6:]
    assert engine.read_since(middle.time_ns, max_lines=3) == everything[5:8], "the oldest, so the next read goes on"
    assert engine.read_since(everything[-1].time_ns + 1, max_lines=10) == []


def test_a_line_still_being_written_waits_for_its_newline(stand_in: StandIn, engine: DockerEngineContainer) -> None:
    wait_for_lines(engine, 3)
    append(stand_in, b"half a li")
    assert [line.text for line in engine.read_since(0, max_lines=100)][-1] == "second stderr line"
    append(stand_in, b"ne\n")
    assert [line.text for line in engine.read_since(0, max_lines=100)][-1] == "half a line"


def test_the_engine_api_since_parameter_as_docker_defines_it(stand_in: StandIn, engine: DockerEngineContainer) -> None:
    wait_for_lines(engine, 3)
    status, stamped = logs(stand_in, timestamps="1")
    assert status == 200 and len(stamped) == 3
    third = stamped[2][0]
    assert third is not None
    seconds, nanos = divmod(third, 1_000_000_000)
    _, exact = logs(stand_in, since=f"{seconds}.{nanos:09d}", timestamps="1")
    assert exact == stamped[2:], "since is inclusive, to the nanosecond"
    _, whole_second = logs(stand_in, since=str(seconds))
    assert whole_second[-1] == (None, b"second stderr line"), "without timestamps the lines come bare"
    assert len(whole_second) >= 1
    _, later = logs(stand_in, since=str(seconds + 2))
    assert later == []
    _, tail_and_since = logs(stand_in, since="0", tail="2")
    assert [line for _, line in tail_and_since] == [b"first stderr line", b"second stderr line"]
    for bad in ("yesterday", "-5", "1.1234567890", "1e9"):
        assert logs(stand_in, since=bad)[0] == 400


def test_stamps_are_rfc3339_with_nine_digits(stand_in: StandIn, engine: DockerEngineContainer) -> None:
    wait_for_lines(engine, 1)
    transport = httpx.HTTPTransport(uds=str(stand_in.server.socket_path))
    with httpx.Client(transport=transport, base_url="http://docker", timeout=5) as client:
        body = client.get("/containers/tpuctl-vllm/logs", params={"stdout": "1", "timestamps": "1"}).content
    decoder = LogStreamDecoder()
    for _, line in decoder.feed(body) + decoder.close():
        assert NANO_STAMP.match(line.split(b" ", 1)[0])


def test_split_stamp_reads_offsets_and_short_fractions() -> None:
    assert split_stamp(b"2026-12-03T19:32:07.5Z text") == (1_796_326_327_500_000_000, b"text")
    assert split_stamp(b"2026-12-03T20:32:07.000000001+01:00 x") == (1_796_326_327_000_000_001, b"x")
    assert split_stamp(b"no stamp here") == (None, b"no stamp here")

"""The Docker Engine adapter against the local cloud's Engine API twin, over a real unix socket.

The "container" is a real process in its own group (``tests.support.serving_container``), so a restart really
replaces one pid with another; the frame decoder is checked on its own with frames cut at every byte.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from localcloud.vm_twin.containers import frame, tail_file
from shared.adapters.docker_engine import DockerEngineContainer, LogStreamDecoder, parse_docker_time
from shared.domain.errors import PermanentError, TransientError
from tests.support.serving_container import StandIn, serve_stand_in


def _wait(condition: object, timeout_s: float = 10.0) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


@pytest.fixture
def stand_in(tmp_path: Path) -> Iterator[StandIn]:
    with serve_stand_in(tmp_path / "node", lines=("stderr line one", "stderr line two")) as served:
        yield served


@pytest.fixture
def engine(stand_in: StandIn) -> Iterator[DockerEngineContainer]:
    client = DockerEngineContainer(stand_in.docker_host, "tpuctl-vllm", timeout_s=5)
    try:
        yield client
    finally:
        client.close()


class TestAgainstTheLocalEngine:
    def test_inspect_reports_the_running_process_and_when_it_started(
        self, stand_in: StandIn, engine: DockerEngineContainer
    ) -> None:
        before = datetime.now(UTC)
        state = engine.inspect()
        assert state.name == "tpuctl-vllm"
        assert state.status == "running"
        assert state.pid == stand_in.starts[0].pid
        assert state.started_at is not None
        assert before - timedelta(seconds=30) < state.started_at <= datetime.now(UTC)

    def test_the_socket_is_private(self, stand_in: StandIn) -> None:
        assert stand_in.server.socket_path.stat().st_mode & 0o777 == 0o600

    def test_restart_replaces_the_process_and_moves_started_at(
        self, stand_in: StandIn, engine: DockerEngineContainer
    ) -> None:
        first = engine.inspect()
        after = engine.restart(timeout_s=5)
        assert after.status == "running"
        assert after.pid is not None and after.pid != first.pid
        assert after.pid == stand_in.starts[1].pid
        assert not stand_in.starts[0].alive()
        assert first.started_at is not None and after.started_at is not None
        assert after.started_at > first.started_at
        assert stand_in.restarts == 1
        _wait(lambda: any("boot 2" in line for line in engine.tail(10)))

    def test_tail_returns_the_newest_lines_with_timestamps(
        self, stand_in: StandIn, engine: DockerEngineContainer
    ) -> None:
        _wait(lambda: len(engine.tail(100)) >= 3)
        lines = engine.tail(100)
        messages = [line.split(" ", 1)[1] for line in lines]
        assert messages == ["boot 1", "stderr line one", "stderr line two"]
        stamp = parse_docker_time(lines[0].split(" ", 1)[0])
        assert stamp is not None and abs((datetime.now(UTC) - stamp).total_seconds()) < 60
        assert [line.split(" ", 1)[1] for line in engine.tail(2)] == ["stderr line one", "stderr line two"]

    def test_an_unknown_container_is_a_permanent_error_naming_the_setting(self, stand_in: StandIn) -> None:
        client = DockerEngineContainer(stand_in.docker_host, "no-such-box", timeout_s=5)
        try:
            for call in (client.inspect, lambda: client.restart(1), lambda: client.tail(5)):
                with pytest.raises(PermanentError, match=r"node_container: no container named 'no-such-box'"):
                    call()
        finally:
            client.close()

    # httpcore 1.0 does not close the socket of a refused unix connect; the garbage collector reports it
    @pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
    def test_a_stopped_api_is_transient_and_a_missing_socket_is_permanent(self, tmp_path: Path) -> None:
        with serve_stand_in(tmp_path / "gone") as served:
            host, path = served.docker_host, served.server.socket_path
        client = DockerEngineContainer(host, "tpuctl-vllm", timeout_s=2)
        try:
            with pytest.raises(PermanentError, match=r"node_docker_host: no Docker Engine socket at .*docker.sock"):
                client.inspect()
            # a socket file nobody listens on: the engine is down, which may pass
            dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            dead.bind(str(path))
            try:
                with pytest.raises(TransientError, match="docker engine at unix://"):
                    client.inspect()
            finally:
                dead.close()
        finally:
            client.close()


class TestSettings:
    @pytest.mark.parametrize("host", ["tcp://127.0.0.1:2375", "unix://relative.sock", "/var/run/docker.sock"])
    def test_a_bad_host_names_the_setting(self, host: str) -> None:
        with pytest.raises(ValueError, match="node_docker_host"):
            DockerEngineContainer(host, "tpuctl-vllm")

    @pytest.mark.parametrize("name", ["", "../etc", "a b", "-leading"])
    def test_a_bad_container_name_names_the_setting(self, name: str) -> None:
        with pytest.raises(ValueError, match="node_container"):
            DockerEngineContainer("unix:///var/run/docker.sock", name)

    def test_tail_and_restart_bounds(self, tmp_path: Path) -> None:
        client = DockerEngineContainer(f"unix://{tmp_path}/docker.sock", "tpuctl-vllm")
        try:
            with pytest.raises(ValueError, match="lines"):
                client.tail(0)
            with pytest.raises(ValueError, match="timeout_s"):
                client.restart(-1)
        finally:
            client.close()


class TestDecoder:
    BODY = (
        frame(1, b"out one\n")
        + frame(2, b"err one\nerr two\n")
        + frame(1, b"out two is ")
        + frame(1, b"split across frames\n")
        + frame(2, "caf\u00e9 \u2603\n".encode())
        + frame(2, b"no newline at the end")
    )
    EXPECTED = [
        (1, b"out one"),
        (2, b"err one"),
        (2, b"err two"),
        (1, b"out two is split across frames"),
        (2, "caf\u00e9 \u2603".encode()),
        (2, b"no newline at the end"),
    ]

    def _decode(self, chunks: list[bytes], content_type: str = "") -> list[tuple[int, bytes]]:
        decoder = LogStreamDecoder(content_type)
        out: list[tuple[int, bytes]] = []
        for chunk in chunks:
            out += decoder.feed(chunk)
        return out + decoder.close()

    def test_frames_cut_at_every_byte_decode_the_same(self) -> None:
        body = self.BODY
        for cut in range(1, len(body)):
            assert self._decode([body[:cut], body[cut:]]) == self.EXPECTED, cut
        assert self._decode([bytes([byte]) for byte in body]) == self.EXPECTED

    def test_the_content_type_alone_selects_frames(self) -> None:
        decoder = LogStreamDecoder("application/vnd.docker.multiplexed-stream")
        assert decoder.mode == "multiplexed"
        assert decoder.feed(frame(2, b"x\n")) == [(2, b"x")]

    def test_tty_output_is_plain_lines(self) -> None:
        body = b"2026-12-02T18:00:00.000000000Z INFO ready\r\nplain two\nthree"
        lines = self._decode([body[:5], body[5:]])
        assert lines == [(1, b"2026-12-02T18:00:00.000000000Z INFO ready"), (1, b"plain two"), (1, b"three")]
        assert self._decode([b"abc"]) == [(1, b"abc")]  # shorter than a header: plain

    def test_a_body_cut_inside_a_frame_is_transient(self) -> None:
        decoder = LogStreamDecoder()
        decoder.feed(frame(1, b"complete\n") + struct.pack(">BxxxL", 1, 50) + b"only part")
        with pytest.raises(TransientError, match="ended inside a frame"):
            decoder.close()

    def test_a_bad_stream_type_after_the_first_frame_is_transient(self) -> None:
        decoder = LogStreamDecoder()
        with pytest.raises(TransientError, match="stream 7"):
            decoder.feed(frame(1, b"ok\n") + struct.pack(">BxxxL", 7, 1) + b"x")


class TestTimes:
    def test_nanoseconds_and_offsets(self) -> None:
        parsed = parse_docker_time("2026-12-02T18:30:00.123456789Z")
        assert parsed == datetime(2026, 12, 2, 18, 30, 0, 123456, tzinfo=UTC)
        assert parse_docker_time("2026-12-02T20:30:00+02:00") == datetime(2026, 12, 2, 18, 30, tzinfo=UTC)
        assert parse_docker_time("0001-01-01T00:00:00Z") is None
        assert parse_docker_time("") is None
        with pytest.raises(ValueError, match="StartedAt"):
            parse_docker_time("yesterday")


def test_tail_file_reads_backwards_across_blocks(tmp_path: Path) -> None:
    path = tmp_path / "big.log"
    path.write_bytes(b"".join(f"line {n:06d} ".encode() + b"x" * 200 + b"\n" for n in range(2000)))
    lines = tail_file(path, 700)
    assert len(lines) == 700
    assert lines[0].startswith(b"line 001300") and lines[-1].startswith(b"line 001999")
    assert tail_file(tmp_path / "missing.log", 5) == []

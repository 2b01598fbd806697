"""The load generator against a local streaming stub whose first-token delay is known.

Timing assertions are deliberately loose (a shared 2-core machine); the precise figure (TTFT error under 1 ms at
concurrency 64) is measured by ``benchmarks/loadgen_vs_vllm_bench.py`` and recorded in docs/benchmarks.md.
"""

from __future__ import annotations

import asyncio
import json
import select
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from loadgen.generator import BenchmarkSetupError, LoadGenerator, Target
from loadgen.transport import StreamingTransport, enable_receive_times, receive_time
from shared.messages import BenchmarkRequest
from tests.support.fixtures_bench import STUB_FIRST_TOKEN_S
from tests.support.stub_server import StubBehaviour, StubProcess, StubServer


def _run(
    target: Target, request: BenchmarkRequest, *, transport: httpx.AsyncBaseTransport | None = None
) -> dict[str, Any]:
    result = asyncio.run(LoadGenerator(target, transport=transport).run(request))
    return result.as_dict()


@pytest.fixture
def stub_in_thread(request: pytest.FixtureRequest) -> Iterator[StubServer]:
    """A stub on a thread of this process, configured by ``@pytest.mark.parametrize(..., indirect=True)``."""
    server = StubServer(request.param)
    server.start_in_thread()
    try:
        yield server
    finally:
        server.stop_thread()


class TestTiming:
    def test_ttft_is_taken_at_the_first_token_at_concurrency_64(self, timed_stub: StubProcess) -> None:
        request = BenchmarkRequest(concurrency=(64,), num_prompts=128, input_len=16, output_len=8, warmup_requests=4)
        result = _run(Target(timed_stub.base_url), request)
        point = result["points"][0]
        assert point["completed"] == 128
        assert point["failed"] == 0
        # the stub sends the first token 20 ms after reading the request; the client adds only its own overhead
        assert STUB_FIRST_TOKEN_S * 1000 <= point["median_ttft_ms"] < STUB_FIRST_TOKEN_S * 1000 + 25
        assert point["total_output_tokens"] == 128 * 8  # from usage, exact with ignore_eos
        assert point["total_input_tokens"] == 128 * 16  # the stub counts words; prompts were built to 16
        assert result["dataset"]["exact_input_len"] is True
        assert point["max_concurrent_requests"] >= 32

    def test_the_chat_role_chunk_is_not_the_first_token(self, timed_stub: StubProcess) -> None:
        request = BenchmarkRequest(concurrency=(4,), num_prompts=12, input_len=8, output_len=4, warmup_requests=0)
        point = _run(Target(timed_stub.base_url, endpoint="chat"), request)["points"][0]
        # the role chunk arrives at once; taking TTFT there would give well under 20 ms
        assert point["median_ttft_ms"] >= STUB_FIRST_TOKEN_S * 1000
        assert point["completed"] == 12

    def test_a_concurrency_sweep_finds_a_knee_and_reports_each_level(self, timed_stub: StubProcess) -> None:
        request = BenchmarkRequest(concurrency=(1, 4, 16), num_prompts=16, input_len=8, output_len=4)
        result = _run(Target(timed_stub.base_url), request)
        levels = [point["level"] for point in result["points"]]
        assert levels == [1, 4, 16]
        assert result["knee"]["level"] in (1.0, 4.0, 16.0)
        throughput = [point["request_throughput"] for point in result["points"]]
        assert throughput[2] > throughput[0]  # a 20 ms server does more work with more requests in flight


class TestRateMode:
    def test_poisson_arrivals_with_a_cap_queue_in_the_client(self, timed_stub: StubProcess) -> None:
        request = BenchmarkRequest(
            mode="rate", request_rate=(400.0,), max_concurrency=2, num_prompts=30, input_len=8, output_len=4
        )
        point = _run(Target(timed_stub.base_url), request)["points"][0]
        assert point["completed"] == 30
        assert point["request_rate"] == 400.0
        assert point["max_concurrency"] == 2
        # two in flight at ~25 ms each can serve ~80 req/s: most of 400 req/s waits for the cap
        assert point["mean_client_queue_time_ms"] > 20
        assert point["request_throughput"] < 200

    def test_a_duration_bound_stops_starting_requests(self, timed_stub: StubProcess) -> None:
        request = BenchmarkRequest(
            mode="rate", request_rate=(20.0,), arrival="constant", num_prompts=500, duration_s=0.5, input_len=8,
            output_len=2, warmup_requests=0,
        )  # fmt: skip
        point = _run(Target(timed_stub.base_url), request)["points"][0]
        assert point["stopped_by"] == "duration"
        assert 8 <= point["num_prompts"] <= 11  # 20 req/s for 0.5 s, constant arrivals


class TestFailures:
    @pytest.mark.parametrize(
        ("stub_in_thread", "cause"),
        [
            (StubBehaviour(fail_every=3, failure="status_500"), "http_500"),
            (StubBehaviour(fail_every=3, failure="status_429"), "http_429"),
            (StubBehaviour(fail_every=3, failure="disconnect"), "disconnected"),
            (StubBehaviour(fail_every=3, failure="midstream", inter_token_s=0.001), "disconnected"),
        ],
        indirect=["stub_in_thread"],
    )
    def test_failures_are_counted_by_cause(self, stub_in_thread: StubServer, cause: str) -> None:
        request = BenchmarkRequest(concurrency=(2,), num_prompts=12, input_len=4, output_len=6, warmup_requests=1)
        result = _run(Target(stub_in_thread.base_url), request)
        point = result["points"][0]
        assert point["failures"] == {cause: point["failed"]}
        assert point["failed"] >= 3
        assert point["completed"] + point["failed"] == 12
        assert result["failures"] == {cause: point["failed"]}

    def test_an_unreachable_server_is_a_setup_error_naming_the_url(self) -> None:
        with pytest.raises(BenchmarkSetupError, match="base_url"):
            _run(Target("http://127.0.0.1:9"), BenchmarkRequest(num_prompts=1, concurrency=(1,)))

    @pytest.mark.parametrize("stub_in_thread", [StubBehaviour(api_key="sekret")], indirect=True)
    def test_a_wrong_api_key_is_a_setup_error_naming_the_key(self, stub_in_thread: StubServer) -> None:
        with pytest.raises(BenchmarkSetupError, match="api_key"):
            _run(Target(stub_in_thread.base_url, api_key="wrong"), BenchmarkRequest(num_prompts=1, concurrency=(1,)))
        ok = _run(
            Target(stub_in_thread.base_url, api_key="sekret"),
            BenchmarkRequest(num_prompts=2, concurrency=(1,), input_len=4, output_len=2),
        )
        assert ok["points"][0]["completed"] == 2

    @pytest.mark.parametrize("stub_in_thread", [StubBehaviour(max_model_len=64)], indirect=True)
    def test_a_workload_over_max_model_len_is_refused_before_any_load(self, stub_in_thread: StubServer) -> None:
        with pytest.raises(BenchmarkSetupError, match=r"benchmark\.input_len.*max_model_len 64"):
            _run(Target(stub_in_thread.base_url), BenchmarkRequest(input_len=60, output_len=8, concurrency=(1,)))
        assert stub_in_thread.stats.generation_requests == 0


class TestDatasetsAndTransports:
    def test_the_prompts_dataset_sends_the_given_texts(self, timed_stub: StubProcess) -> None:
        request = BenchmarkRequest(
            dataset="prompts", prompts=("one two three", "four five"), concurrency=(2,), num_prompts=4, output_len=3
        )
        result = _run(Target(timed_stub.base_url), request)
        assert result["dataset"]["kind"] == "prompts"
        assert result["points"][0]["total_input_tokens"] == 3 + 2 + 3 + 2

    def test_httpx_default_transport_gives_the_same_measurements(self, timed_stub: StubProcess) -> None:
        request = BenchmarkRequest(concurrency=(2,), num_prompts=6, input_len=4, output_len=3, warmup_requests=0)
        point = _run(Target(timed_stub.base_url), request, transport=httpx.AsyncHTTPTransport())["points"][0]
        assert point["completed"] == 6
        assert point["median_ttft_ms"] >= STUB_FIRST_TOKEN_S * 1000

    def test_the_streaming_transport_reuses_connections(self, timed_stub: StubProcess) -> None:
        transport = StreamingTransport()
        request = BenchmarkRequest(concurrency=(3,), num_prompts=60, input_len=4, output_len=2, warmup_requests=0)
        _run(Target(timed_stub.base_url), request, transport=transport)
        # 60 measured requests and 60 tokenizer calls: at most 16 tokenizer connections, 3 workers, 1 discovery
        assert transport.connections_opened <= 16 + 3 + 1

    def test_a_receipt_stamp_is_when_the_bytes_arrived_not_when_they_were_read(self) -> None:
        with socket.create_server(("127.0.0.1", 0)) as listener:
            sender = socket.create_connection(listener.getsockname())
            receiver, _ = listener.accept()
            with sender, receiver:
                assert enable_receive_times(receiver) is True
                _wait_until_the_kernel_stamps(sender, receiver)
                sender.sendall(b"data: {}\n\n")
                # Readable means the bytes have reached the socket (and were stamped): on a loaded machine loopback
                # delivery can lag the send, and the stamp rightly follows the delivery, not the send.
                assert select.select([receiver], [], [], 5.0)[0] == [receiver]
                time.sleep(0.3)  # the bytes wait in the socket; a busy event loop would read them this late
                data, ancillary, _flags, _address = receiver.recvmsg(4096, socket.CMSG_SPACE(16))
                read_at_wall = time.time()
                read_at = time.perf_counter()
        assert data == b"data: {}\n\n"
        # The kernel's stamp is wall-clock time: judged against the wall clock at the read, so a difference in rate
        # between the wall and the monotonic clock (a slewing NTP, a container's clock) cannot hide or fake it.
        (payload,) = [payload for level, _kind, payload in ancillary if level == socket.SOL_SOCKET]
        seconds, nanoseconds = struct.unpack_from("@qq", payload)
        assert read_at_wall - (seconds + nanoseconds / 1e9) >= 0.25
        assert receive_time(ancillary) <= read_at + 0.001  # moved to perf_counter, never after the read

    def test_records_hold_one_line_per_request_with_its_timings(self, timed_stub: StubProcess) -> None:
        request = BenchmarkRequest(concurrency=(2,), num_prompts=4, input_len=4, output_len=3, warmup_requests=0)
        result = asyncio.run(LoadGenerator(Target(timed_stub.base_url)).run(request))
        lines = [json.loads(line) for line in result.records_jsonl()]
        assert [line["index"] for line in lines] == [0, 1, 2, 3]
        assert all(len(line["itl_ms"]) == 2 and line["output_tokens"] == 3 for line in lines)
        assert all(line["ttft_ms"] >= STUB_FIRST_TOKEN_S * 1000 for line in lines)


def _wait_until_the_kernel_stamps(sender: socket.socket, receiver: socket.socket) -> None:
    """Linux turns receive stamping on through deferred work when the first socket asks, so on a loaded machine the
    first bytes after ``enable_receive_times`` can arrive unstamped (the transport then falls back to the read time).
    """
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        sender.sendall(b"x")
        assert select.select([receiver], [], [], 5.0)[0] == [receiver]
        _data, ancillary, _flags, _address = receiver.recvmsg(4096, socket.CMSG_SPACE(16))
        if any(level == socket.SOL_SOCKET for level, _kind, _payload in ancillary):
            return
        time.sleep(0.05)
    raise AssertionError("the kernel never stamped a receive on a socket with SO_TIMESTAMPNS on")

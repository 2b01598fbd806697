"""The monitor's canary completion, end to end over real HTTP: the real probe (httpx), the embedded SQLite store
and local bus, a manual clock.

Two servers: the repo's OpenAI-compatible stub (``tests.support.openai_stub``: ``/health``, ``/v1/models`` and a
streamed ``/v1/chat/completions`` that can be told to fail or to wait), and ``CountingVllm`` below, a vLLM
stand-in whose Prometheus counters move with every completion it serves (the canary's and the users'), because
the canary must not count as the traffic that keeps a deployment from being idle."""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from shared.adapters.clock import ManualClock
from shared.adapters.local_bus import LocalBus
from shared.adapters.sqlite_store import SqliteStateStore
from shared.adapters.vllm_probe import VllmProbe
from shared.config import Settings
from shared.domain.models import DeploymentRecord, DeploymentSpec, DeploymentStatus, MonitorSample, Phase
from shared.domain.serving_key import deployment_api_key
from shared.messages import decode_message
from shared.ports import Delivery
from shared.services.monitor import Monitor, MonitorSettings, TickReport
from shared.wiring import Runtime
from tests.support.openai_stub import QuietHandler, StubConfig, StubServer, serve_openai_stub
from tests.support.vllm_replay import FIXTURES, real_metrics_text, with_values

START = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
TOPICS = {"commands": "tpuctl-commands", "events": "tpuctl-events", "ticks": "tpuctl-ticks"}
MASTER = "sk-master-canary-test-0123456789abcdef"  # the controller's vLLM API key (a test value)
NAME = "dep-a"
DERIVED = deployment_api_key(MASTER, NAME)  # what dep-a's serving port takes
CANARY_S = 300.0


_TTFT = re.compile(r'^(vllm:time_to_first_token_seconds_bucket\{[^}]*le="([^"]+)"[^}]*\} )(\S+)$', re.MULTILINE)
_TTFT_TOTALS = re.compile(r"^(vllm:time_to_first_token_seconds_(count|sum)\{[^}]*\} )(\S+)$", re.MULTILINE)
_CHAT_2XX = 'http_requests_total{handler="/v1/chat/completions",method="POST",status="2xx"}'


def observed(text: str, ttfts: list[float], answers_5xx: int) -> str:
    """The real capture plus these first-token times in the TTFT histogram and these 5xx chat answers."""

    def bucket(match: re.Match[str]) -> str:
        le = float("inf") if match.group(2) == "+Inf" else float(match.group(2))
        return f"{match.group(1)}{float(match.group(3)) + sum(1 for t in ttfts if t <= le)!r}"

    def total(match: re.Match[str]) -> str:
        added = len(ttfts) if match.group(2) == "count" else sum(ttfts)
        return f"{match.group(1)}{float(match.group(3)) + added!r}"

    text = _TTFT_TOTALS.sub(total, _TTFT.sub(bucket, text))
    if answers_5xx:
        line = next(line for line in text.splitlines() if line.startswith(_CHAT_2XX))
        text = text.replace(line, f"{line}\n{_CHAT_2XX.replace('2xx', '5xx')} {float(answers_5xx)!r}")
    return text


@dataclass
class CountingVllm:
    """A loopback vLLM stand-in that keeps count: each completion it serves moves ``vllm:request_success_total``
    (reason ``length``), the prompt and generation token counters and the TTFT histogram (``canary_ttft_s``), as
    vLLM's would; ``serve_users`` stands for users' requests between ticks. With ``fail_body`` set, completions
    answer HTTP 500 with that body, counted in ``http_requests_total`` as 5xx."""

    api_key: str
    base_url: str = ""
    finished: int = 0
    prompt_tokens: int = 0
    generated: int = 0
    ttfts: list[float] = field(default_factory=list)
    answers_5xx: int = 0
    canary_ttft_s: float = 0.03
    completions: list[dict[str, Any]] = field(default_factory=list)  # the bodies of completions received
    fail_body: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def serve_users(self, requests: int, ttft_s: float = 0.03) -> None:
        with self._lock:
            self.finished += requests
            self.prompt_tokens += 20 * requests
            self.generated += 50 * requests
            self.ttfts.extend([ttft_s] * requests)

    def metrics(self) -> str:
        with self._lock:
            counted = with_values(
                real_metrics_text(),
                success_length=104 + self.finished,
                prompt_tokens=1758 + self.prompt_tokens,
                generation_tokens=3248 + self.generated,
            )
            return observed(counted, self.ttfts, self.answers_5xx)

    def complete(self, body: dict[str, Any]) -> bool:
        """Record one completion; False when it is to fail (the counters still move: vLLM counts errors)."""
        with self._lock:
            self.completions.append(body)
            self.finished += 1
            self.prompt_tokens += 14
            if self.fail_body is not None:
                self.answers_5xx += 1
                return False
            self.generated += 1
            self.ttfts.append(self.canary_ttft_s)
            return True


def _counting_handler(state: CountingVllm) -> type[BaseHTTPRequestHandler]:
    models = (FIXTURES / "real_vllm_models.json").read_bytes()

    class Handler(QuietHandler):
        def _authorised(self) -> bool:
            if self.headers.get("Authorization") == f"Bearer {state.api_key}":
                return True
            self._send(401, b'{"error":"Unauthorized"}')
            return False

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, b"", "text/plain")
            elif self.path == "/metrics":
                self._send(200, state.metrics().encode(), "text/plain; version=0.0.4; charset=utf-8")
            elif self.path == "/v1/models":
                if self._authorised():
                    self._send(200, models)
            else:
                self._send(404, b'{"detail":"Not Found"}')

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
            if self.path != "/v1/chat/completions" or not self._authorised():
                return
            if not state.complete(body):
                self._send(500, (state.fail_body or "").encode())
                return
            chunks = [
                {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
                {"choices": [{"index": 0, "delta": {"content": "OK"}, "finish_reason": "length"}]},
                {"choices": [], "usage": {"prompt_tokens": 14, "completion_tokens": 1, "total_tokens": 15}},
            ]
            stream = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"
            self._send(200, stream.encode(), "text/event-stream")

    return Handler


@contextmanager
def counting_vllm(api_key: str) -> Iterator[CountingVllm]:
    state = CountingVllm(api_key=api_key)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _counting_handler(state))
    server.daemon_threads = True
    state.base_url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@dataclass
class World:
    store: SqliteStateStore
    bus: LocalBus
    clock: ManualClock
    monitor: Monitor

    def add(self, endpoint: str, *, phase: Phase = Phase.BOOTING, **spec: Any) -> DeploymentRecord:
        now = self.clock.now()
        record = DeploymentRecord(
            deployment_id=NAME,
            spec=DeploymentSpec(
                deployment_id=NAME, model="tiny-llama", accelerator="v6e-1", zones=("us-east5-b",), **spec
            ),
            status=DeploymentStatus(phase=phase, phase_since=now, endpoint=endpoint),
            created_at=now,
            updated_at=now,
        )
        return self.store.put_deployment(record, expected_version=None)

    def tick(self, advance_s: float = 60.0) -> TickReport:
        self.clock.advance(advance_s)
        return self.monitor.tick()

    def record(self) -> DeploymentRecord:
        found = self.store.get_deployment(NAME)
        assert found is not None
        return found

    def latest(self) -> MonitorSample:
        return self.store.list_samples(NAME, limit=1)[0]

    def messages(self, logical: str) -> list[Any]:
        got: list[Any] = []

        def keep(delivery: Delivery) -> None:
            got.append(decode_message(delivery.data))

        self.bus.drain(f"{logical}-probe", keep)
        return got


def make_world(tmp_path: Path, *, read_timeout_s: float = 2.0) -> Iterator[World]:
    clock = ManualClock(START)
    store = SqliteStateStore(tmp_path / "state.db")
    bus = LocalBus(tmp_path / "bus.db", clock=clock)
    for logical, topic in TOPICS.items():
        bus.ensure_topic(topic)
        bus.ensure_subscription(topic, f"{logical}-probe")
    settings = MonitorSettings(
        canary_interval_s=CANARY_S,
        topic_commands=TOPICS["commands"],
        topic_events=TOPICS["events"],
        topic_ticks=TOPICS["ticks"],
    )
    probe = VllmProbe(api_key=MASTER, timeout_s=read_timeout_s, connect_timeout_s=0.5)
    yield World(store, bus, clock, Monitor(store, probe, bus, clock, settings))
    bus.close()
    store.close()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    yield from make_world(tmp_path)


@pytest.fixture
def stub() -> Iterator[StubServer]:
    with serve_openai_stub(StubConfig(api_key=DERIVED)) as server:
        yield server


def test_health_and_models_answering_while_completions_fail_is_degraded_not_serving(
    world: World, stub: StubServer
) -> None:
    stub.config.fail_chat_status = 500
    world.add(stub.base_url)
    report = world.tick()
    record = world.record()
    assert record.status.phase is Phase.DEGRADED
    assert record.status.message == (
        "canary completion failed: /v1/chat/completions answered HTTP 500: max_tokens is too large"
    )
    assert report.deployments[0].reason == record.status.message
    assert world.latest().slis["canary_ok"] == 0.0
    # not an instant restart: no command at all, only the phase change
    assert world.messages("commands") == []
    assert [(m.previous, m.phase) for m in world.messages("events")] == [(Phase.BOOTING, Phase.DEGRADED)]
    # one tiny completion with the deployment's own key
    (body,) = stub.requests
    assert body["max_tokens"] == 1 and body["temperature"] == 0 and body["model"] == "tiny-llama"
    assert stub.headers[0]["Authorization"] == f"Bearer {DERIVED}"


def test_a_failed_canary_is_retried_next_tick_and_a_passing_one_clears_degraded(world: World, stub: StubServer) -> None:
    stub.config.fail_chat_status = 500
    world.add(stub.base_url)
    world.tick()
    assert world.record().status.phase is Phase.DEGRADED
    stub.config.fail_chat_status = None
    world.tick()  # a minute later: a failed canary does not wait out the rate limit
    assert len(stub.requests) == 2
    record = world.record()
    assert record.status.phase is Phase.SERVING
    assert record.status.slis["canary_ok"] == 1.0


def test_canary_latency_is_an_sli_on_the_sample_and_the_record(world: World, stub: StubServer) -> None:
    stub.config.first_token_delay_s = 0.05
    world.add(stub.base_url)
    world.tick()
    now = world.clock.now()
    for slis in (world.latest().slis, world.record().status.slis):
        assert slis["canary_at"] == now.timestamp()
        assert 50.0 <= slis["canary_latency_ms"] < 2000.0
        assert slis["canary_ok"] == 1.0
    assert world.record().status.phase is Phase.SERVING


def test_canaries_are_rate_limited_on_the_monitors_clock(world: World, stub: StubServer) -> None:
    world.add(stub.base_url)
    sent_at: list[int] = []
    for minute in range(1, 12):
        before = len(stub.requests)
        world.tick()
        if len(stub.requests) > before:
            sent_at.append(minute)
        assert world.record().status.phase is Phase.SERVING
    assert sent_at == [1, 6, 11]
    canaried = [s.taken_at.minute for s in world.store.list_samples(NAME) if "canary_at" in s.slis]
    assert sorted(canaried) == [1, 6, 11]  # only the samples of the ticks that sent one carry its SLIs


def test_a_canary_that_times_out_is_degraded(tmp_path: Path) -> None:
    for world in make_world(tmp_path, read_timeout_s=0.3):
        with serve_openai_stub(StubConfig(api_key=DERIVED, first_token_delay_s=1.0)) as stub:
            world.add(stub.base_url, phase=Phase.SERVING)
            world.tick()
            record = world.record()
            assert record.status.phase is Phase.DEGRADED
            assert record.status.message.startswith("canary completion failed: ReadTimeout")
            assert 300.0 <= world.latest().slis["canary_latency_ms"] < 1000.0
            assert world.messages("commands") == []


def test_users_traffic_holds_the_canary_off_until_idle_for_the_interval(world: World) -> None:
    with counting_vllm(DERIVED) as vllm:
        world.add(vllm.base_url, phase=Phase.SERVING)
        world.tick()  # minute 1: never proven, no traffic yet: a canary
        assert len(vllm.completions) == 1
        for _ in range(2, 9):  # minutes 2-8: users' requests in every interval
            vllm.serve_users(3)
            world.tick()
        assert len(vllm.completions) == 1
        sent_at = []
        for minute in range(9, 15):  # idle from minute 8's scrape on
            before = len(vllm.completions)
            world.tick()
            if len(vllm.completions) > before:
                sent_at.append(minute)
        assert sent_at == [13]  # 5 minutes after the last traffic, not after the record's lazy last_request_at
        assert world.record().status.phase is Phase.SERVING


def test_the_canary_is_not_traffic_so_an_idle_deployment_still_stops(world: World) -> None:
    with counting_vllm(DERIVED) as vllm:
        world.add(vllm.base_url, phase=Phase.SERVING, idle_minutes=5)
        first_stop_minute = None
        for minute in range(1, 11):
            if "deployment.stop" in world.tick().deployments[0].published and first_stop_minute is None:
                first_stop_minute = minute
        assert len(vllm.completions) == 2  # minutes 1 and 6
        assert vllm.finished == 2  # vLLM counted them as requests...
        assert world.record().status.last_request_at is None  # ...the monitor did not take them for users
        assert first_stop_minute == 8  # as without canaries: 5 idle minutes plus the slack


def test_the_canarys_own_slow_first_token_or_5xx_is_not_judged_again_as_users_latency_or_errors(world: World) -> None:
    with counting_vllm(DERIVED) as vllm:
        vllm.canary_ttft_s = 3.0  # a cold first request: over the 2 s TTFT p90 SLO
        world.add(vllm.base_url, phase=Phase.SERVING)
        world.tick()  # minute 1: the canary passes (slowly)
        world.tick()  # minute 2: its 3 s TTFT is in this interval's histogram
        assert world.latest().slis["ttft_p90_s"] > 2.0  # measured and recorded...
        assert world.record().status.phase is Phase.SERVING  # ...but not a users' SLO breach

        vllm.fail_body = json.dumps({"error": {"message": "engine error"}})
        world.tick(advance_s=240)  # minute 6: the next canary fails
        assert world.record().status.phase is Phase.DEGRADED
        vllm.fail_body = None
        world.tick()  # minute 7: the retry passes; the failed canary's 5xx is in this interval
        assert world.latest().slis["http_5xx"] == 1.0
        record = world.record()
        assert record.status.phase is Phase.SERVING, record.status.message

        vllm.serve_users(4, ttft_s=3.0)  # users who wait as long are a breach
        world.tick()
        assert world.record().status.message.startswith("degraded: ttft p90")


def test_the_api_key_never_reaches_records_samples_events_or_logs(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with counting_vllm(DERIVED) as vllm:
        vllm.fail_body = json.dumps({"error": {"message": f"key {DERIVED} (master {MASTER}) is over quota"}})
        world.add(vllm.base_url, phase=Phase.SERVING)
        report = world.tick()
        record = world.record()
        assert len(vllm.completions) == 1  # the key was sent (the stand-in refuses a wrong one)
        assert record.status.phase is Phase.DEGRADED
        assert record.status.message.startswith("canary completion failed: /v1/chat/completions answered HTTP 500")
        assert "is over quota" in record.status.message
        seen = [
            record.model_dump_json(),
            *(s.model_dump_json() for s in world.store.list_samples(NAME)),
            *(m.model_dump_json() for m in world.messages("events")),
            report.summary(),
            *(d.reason for d in report.deployments),
            caplog.text,
        ]
        for text in seen:
            assert DERIVED not in text and MASTER not in text


def test_the_deployed_monitor_takes_its_canary_interval_from_settings(tmp_path: Path) -> None:
    assert Runtime(Settings(backend="local", data_dir=tmp_path)).monitor.settings.canary_interval_s == 300.0
    tuned = Runtime(Settings(backend="local", data_dir=tmp_path / "b", monitor_canary_interval_s=0))
    assert tuned.monitor.settings.canary_interval_s == 0.0

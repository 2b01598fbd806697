"""Totals and window figures read back through GatewayCore, the MCP tool (``tpu_observe``'s default view,
metrics) and ``tpuctl metrics``.

The samples are stored the way the monitor writes them: ``counters`` is the scrape's cumulative record and
``slis`` the per-interval figures, both from real vLLM ``/metrics`` captures.
"""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from mcp import Client
from mcp.types import TextContent

from mcp_client_gateway.cli import EXIT_OK, EXIT_USAGE, run
from shared.adapters.vllm_probe import parse_metrics
from shared.domain.metrics import MetricsSnapshot, derive_interval
from shared.domain.models import MonitorSample, Phase
from tests.mcp.conftest import GatewayWorld
from tests.unit.test_metric_window import FIRST, OTHER, served

pytestmark = pytest.mark.anyio

SERVING_FOR_MIN = 40


def store_history(world: GatewayWorld) -> datetime:
    """A deployment serving for 40 minutes with one vLLM restart, one failed probe, and an older generation's
    sample before serving began. Returns now."""
    now = datetime.now(UTC)
    record = world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
    status = record.status.model_copy(update={"serving_since": now - timedelta(minutes=SERVING_FOR_MIN)})
    world.store.put_deployment(record.model_copy(update={"status": status}), expected_version=record.version)
    busy = served(FIRST, 10, ttft=0.03)
    timeline: list[tuple[int, str | None]] = [
        (50, served(OTHER, 900, ttft=5.0)),  # before serving_since: the previous generation's server
        (30, FIRST),
        (20, busy),
        (10, OTHER),  # a restart
        (5, served(OTHER, 5, ttft=0.03)),
        (3, None),  # the probe failed
    ]
    samples: list[MonitorSample] = []
    previous: MetricsSnapshot | None = None
    for minutes, text in timeline:
        snapshot = parse_metrics(text) if text is not None else None
        slis = derive_interval(previous, snapshot, 60.0).slis() if snapshot is not None else {}
        samples.append(
            MonitorSample(
                deployment_id="gemma-a",
                taken_at=now - timedelta(minutes=minutes),
                phase=Phase.SERVING,
                probe="ok" if snapshot is not None else "timeout",
                slis=slis,
                counters=snapshot.to_record() if snapshot is not None else {},
            )
        )
        previous = snapshot or previous
    world.store.write_samples(samples)
    return now


class TestCore:
    def test_totals_add_the_segments_of_the_serving_generation_only(self, world: GatewayWorld) -> None:
        store_history(world)
        view = world.core.get_metrics("gemma-a", window_minutes=60)
        assert view.totals is not None
        # 114 by the first server, 159 by the restarted one; the 1054 of the previous generation are not counted.
        assert view.totals.counts.requests_served == 114 + 159
        assert view.totals.counts.generation_tokens == 3248 + 200 + 4848 + 100
        assert view.totals.restarts == 1 and view.totals.samples == 4
        assert view.totals.since_server_start

    def test_window_figures_come_from_the_deltas_between_its_first_and_last_sample(self, world: GatewayWorld) -> None:
        now = store_history(world)
        view = world.core.get_metrics("gemma-a", window_minutes=25)
        window = view.window
        assert window is not None
        assert window.samples == 3 and window.restarts == 1
        assert window.start == now - timedelta(minutes=20) and window.span_s == pytest.approx(15 * 60)
        assert window.counts.requests_finished == 159  # everything the restarted server finished
        assert window.requests_per_s == pytest.approx(round(159 / 900, 4))
        other = parse_metrics(served(OTHER, 5, ttft=0.03)).histograms["ttft"]
        assert window.latency["ttft"].mean_s == pytest.approx(other.sum / other.count)
        assert window.latency["ttft"].observations == 159
        assert "bucket deltas" in window.percentiles_from
        assert view.notes == [
            "1 sample(s) in the window skipped: no /metrics read (the probe failed or the server was not up)"
        ]
        assert any(line.startswith("  requests finished: 159 (0.18 req/s)") for line in view.summary)

    def test_a_window_with_one_usable_sample_says_why_it_has_no_figures(self, world: GatewayWorld) -> None:
        store_history(world)
        view = world.core.get_metrics("gemma-a", window_minutes=7)
        assert view.window is None
        assert any("two samples" in note for note in view.notes)
        assert view.totals is not None and view.totals.counts.requests_served == 273


async def test_the_tool_returns_the_same_figures_and_a_readable_summary(world: GatewayWorld) -> None:
    store_history(world)
    async with Client(world.server()) as session:
        result = await session.call_tool("tpu_observe", {"deployment_id": "gemma-a", "minutes": 25})
    assert not result.is_error
    body: dict[str, Any] = result.structured_content
    assert body["totals"]["counts"]["requests_served"] == 273
    assert body["window"]["counts"]["requests_finished"] == 159
    assert body["window"]["samples"] == 3  # the 25-minute window was the one asked for, not the default hour
    first = result.content[0]
    assert isinstance(first, TextContent)
    summary = first.text
    assert summary.splitlines()[0].endswith(" in 25 min; phase SERVING.")
    assert "Totals since " in summary and "  requests served: 273" in summary and "e+" not in summary


class TestCli:
    def tpuctl(self, world: GatewayWorld, *argv: str) -> tuple[int, str, str]:
        stdout, stderr = io.StringIO(), io.StringIO()
        code = run(list(argv), ports=world.ports, stdout=stdout, stderr=stderr)
        return code, stdout.getvalue(), stderr.getvalue()

    def test_metrics_prints_totals_and_window_figures_in_human_units(self, world: GatewayWorld) -> None:
        store_history(world)
        code, out, err = self.tpuctl(world, "metrics", "gemma-a", "--window", "25")
        assert code == EXIT_OK, err
        lines = out.splitlines()
        assert lines[0] == "gemma-a (SERVING), window 25 min"
        assert "  requests served: 273" in lines
        assert "  generation tokens: 4,948 (5.50 tok/s)" in lines
        assert any(line.startswith("  time to first token: mean ") and " ms" in line for line in lines)
        assert "e+" not in out and "1796" not in out
        assert "note: 1 sample(s) in the window skipped" in err

    def test_json_output_is_the_view(self, world: GatewayWorld) -> None:
        store_history(world)
        code, out, _ = self.tpuctl(world, "--format", "json", "metrics", "gemma-a")
        assert code == EXIT_OK
        assert '"requests_served": 273' in out

    def test_a_window_out_of_range_names_the_flag(self, world: GatewayWorld) -> None:
        world.seed("gemma-a")
        code, _, err = self.tpuctl(world, "metrics", "gemma-a", "--window", "0")
        assert code == EXIT_USAGE
        assert "--window" in err

"""MCP Apps: a client that negotiated Apps gets ``ui://`` chart pages drawn from the store's values (``tpu_observe``'s
metrics and benchmark views, ``tpu_status``'s deployment view); one that did not gets exactly the result it got
before. Real SDK clients over the in-memory transport, and one over stdio."""

from __future__ import annotations

import os
import re
import sys
from datetime import UTC, datetime, timedelta
from html import escape
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from mcp.client.extension import advertise
from mcp.server.apps import APP_MIME_TYPE, EXTENSION_ID

from mcp_client_gateway.charts import CSP
from mcp_client_gateway.server import build_server
from mcp_client_gateway.tools.chart_apps import BENCHMARK, CHART_APPS, COMPARISON, DEPLOYMENT, METRICS
from shared.domain.models import BenchmarkRun, MonitorSample, Phase
from shared.messages import new_command_id
from tests.mcp.conftest import GatewayWorld, seed_monitor_restart

pytestmark = pytest.mark.anyio

REPO_ROOT = Path(__file__).resolve().parents[2]
APPS = [advertise(EXTENSION_ID, {"mimeTypes": [APP_MIME_TYPE]})]
METRICS_URI = METRICS.uri
BENCH_URI = BENCHMARK.uri
COMPARISON_URI = COMPARISON.uri
DEPLOYMENT_URI = DEPLOYMENT.uri
# (minutes ago, TTFT p50 s, generated tokens/s, KV-cache use)
SAMPLES = ((30, 0.123, 456.5, 0.25), (20, 0.150, 512.0, 0.5), (10, 0.097, 640.25, 0.75))
HOSTILE = '<script>alert("x")</script>\u202egnp.exe"><img src=//evil.example/a>'


def store_samples(world: GatewayWorld) -> None:
    world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
    now = datetime.now(UTC)
    world.store.write_samples(
        [
            MonitorSample(
                deployment_id="gemma-a",
                taken_at=now - timedelta(minutes=minutes),
                phase=Phase.SERVING,
                probe="ok",
                slis={"ttft_p50_s": ttft, "generation_tokens_per_s": tokens, "kv_cache_usage": kv},
            )
            for minutes, ttft, tokens, kv in SAMPLES
        ]
    )


def store_run(world: GatewayWorld) -> str:
    world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
    at = datetime.now(UTC) - timedelta(minutes=5)
    points = [
        {"level": 1, "output_throughput": 101.5, "median_ttft_ms": 40.0, "p99_ttft_ms": 55.0},
        {"level": 4, "output_throughput": 377.0, "median_ttft_ms": 61.0, "p99_ttft_ms": 90.0},
        {"level": 16, "output_throughput": 802.25, "median_ttft_ms": 180.0, "p99_ttft_ms": 260.0},
    ]
    run = BenchmarkRun(
        run_id=new_command_id(),
        deployment_id="gemma-a",
        status="failed",
        request={"mode": "concurrency", "concurrency": [1, 4, 16]},
        result={"points": points},
        plan={"model": "gemma-4-26b-a4b", "accelerator": "v6e-4", "tier": "spot"},
        error=HOSTILE,
        created_at=at,
        updated_at=at,
    )
    world.store.create_benchmark_run(run)
    return run.run_id


def store_history(world: GatewayWorld) -> str:
    """A deployment that booted, served and stalled (a VM's hostile detail), and that the monitor restarted."""
    world.seed("gemma-a", phase=Phase.STALLED, endpoint="http://10.0.0.5:8000")
    now = datetime.now(UTC)
    phases = ((20, Phase.BOOTING, ""), (15, Phase.SERVING, ""), (10, Phase.STALLED, HOSTILE))
    world.store.write_samples(
        [
            MonitorSample(deployment_id="gemma-a", taken_at=now - timedelta(minutes=ago), phase=phase, detail=detail)
            for ago, phase, detail in phases
        ]
    )
    restart_id = seed_monitor_restart(world, now)
    return restart_id


def drawn(html: str, series: str) -> list[tuple[float, float]]:
    """The (x, y) of every point of ``series`` the page draws."""
    found = re.findall(rf'<circle [^>]*data-series="{re.escape(series)}" data-x="([^"]+)" data-y="([^"]+)"', html)
    return [(float(x), float(y)) for x, y in found]


def ui_of(result: Any) -> Any:
    """The result's ``_meta.ui`` (the SDK stamps other ``_meta`` keys of its own)."""
    return (result.meta or {}).get("ui")


def texts(result: Any) -> list[str]:
    return [block.text for block in result.content]


async def read_page(client: Client, uri: str) -> str:
    read = await client.read_resource(uri)
    (content,) = read.contents
    assert content.mime_type == APP_MIME_TYPE
    text: str = content.text
    return text


class TestAnAppsClient:
    async def test_the_observe_tool_lists_the_metrics_page_which_charts_the_stored_samples(
        self, world: GatewayWorld
    ) -> None:
        store_samples(world)
        async with Client(world.server(), extensions=APPS) as client:
            listed = {tool.name: tool for tool in (await client.list_tools()).tools}
            resources = {str(r.uri): r.mime_type for r in (await client.list_resources()).resources}
            result = await client.call_tool("tpu_observe", {"deployment_id": "gemma-a", "minutes": 60})
            html = await read_page(client, METRICS_URI)
        assert CHART_APPS["tpu_observe"].pages == (METRICS, BENCHMARK, COMPARISON)  # the first is the listed one
        assert listed["tpu_observe"].meta == {"ui": {"resourceUri": METRICS_URI}}
        charted = {name for name, tool in listed.items() if (tool.meta or {}).get("ui")}
        assert charted == {"tpu_observe", "tpu_status"}
        pages = {app.uri for name in charted for app in CHART_APPS[name].pages}
        assert pages == {METRICS_URI, BENCH_URI, COMPARISON_URI, DEPLOYMENT_URI}
        assert resources == dict.fromkeys(pages, APP_MIME_TYPE)  # every page of every chart tool, and no other
        assert not result.is_error and ui_of(result) == {"resourceUri": METRICS_URI}
        assert html.startswith("<!DOCTYPE html>") and f'content="{CSP}"' in html
        assert "<script" not in html and "http://" not in html.replace("http://www.w3.org/2000/svg", "")
        stamps = [(datetime.now(UTC) - timedelta(minutes=minutes)).timestamp() for minutes, *_ in SAMPLES]
        ttft = drawn(html, "TTFT p50")
        assert [round(y, 6) for _, y in ttft] == [123.0, 150.0, 97.0]  # seconds drawn as ms, oldest first
        assert [x for x, _ in ttft] == pytest.approx(stamps, abs=60)
        assert [y for _, y in drawn(html, "generated")] == [456.5, 512.0, 640.25]
        assert [y for _, y in drawn(html, "KV cache")] == [25.0, 50.0, 75.0]
        assert "3 sample(s) charted." in html

    async def test_the_benchmark_page_draws_the_levels_and_escapes_what_the_node_reported(
        self, world: GatewayWorld
    ) -> None:
        run_id = store_run(world)
        async with Client(world.server(), extensions=APPS) as client:
            result = await client.call_tool("tpu_observe", {"show": "benchmarks", "command_id": run_id})
            html = await read_page(client, BENCH_URI)
            compared = await client.call_tool("tpu_observe", {"show": "benchmarks", "deployment_id": "gemma-a"})
            comparison = await read_page(client, COMPARISON_URI)
        assert ui_of(result) == {"resourceUri": BENCH_URI}
        assert drawn(html, "output") == [(1.0, 101.5), (4.0, 377.0), (16.0, 802.25)]
        assert drawn(html, "p99") == [(1.0, 55.0), (4.0, 90.0), (16.0, 260.0)]
        assert "<script" not in html and "<img" not in html and "\u202e" not in html
        assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html
        assert ui_of(compared) == {"resourceUri": COMPARISON_URI}
        assert run_id in comparison and "1 benchmark run(s) compared" in comparison

    async def test_the_deployment_page_shows_its_phase_and_the_timeline_the_store_holds(
        self, world: GatewayWorld
    ) -> None:
        store_history(world)
        async with Client(world.server(), extensions=APPS) as client:
            listed = {tool.name: tool for tool in (await client.list_tools()).tools}
            result = await client.call_tool("tpu_status", {"deployment_id": "gemma-a"})
            html = await read_page(client, DEPLOYMENT_URI)
        assert listed["tpu_status"].meta == {"ui": {"resourceUri": DEPLOYMENT_URI}}
        assert not result.is_error and ui_of(result) == {"resourceUri": DEPLOYMENT_URI}
        assert "timeline" not in (result.structured_content or {}), "the result is the tool's own"
        assert html.startswith("<!DOCTYPE html>") and f'content="{CSP}"' in html
        assert "Deployment gemma-a" in html and "phase STALLED since" in html
        timeline = world.core.timeline("gemma-a")
        summaries = [event.summary for event in timeline.events]
        assert {"created", "capacity", "phase", "restart"} <= {event.kind for event in timeline.events}
        cells = re.findall(r"<tr><td>[^<]*</td><td>([^<]*)</td><td>([^<]*)</td><td>([^<]*)</td>", html)
        assert [summary for _, summary, _ in cells] == [escape(s, quote=True) for s in summaries[::-1]]
        assert cells[0][:2] == ("restart", "vLLM container restart completed: STALLED since 12:00: no progress")
        assert cells[0][2] == "the monitor (healing)" and "BOOTING -&gt; SERVING" in html
        assert "<script" not in html and "<img" not in html and "\u202e" not in html
        assert f": {len(summaries)} event(s), newest first." in html
        newest = timeline.events[-1].at.strftime("%Y-%m-%d %H:%M:%S UTC")
        assert f"<tr><td>{newest}</td><td>restart</td>" in html

    async def test_before_any_call_the_page_says_to_call_the_tool(self, world: GatewayWorld) -> None:
        async with Client(world.server(), extensions=APPS) as client:
            html = await read_page(client, METRICS_URI)
            deployment = await read_page(client, DEPLOYMENT_URI)
        assert "No chart yet: call tpu_observe(show=&#x27;metrics&#x27;) first" in html and "<circle" not in html
        assert "No chart yet: call tpu_status(deployment_id=...) first" in deployment

    async def test_each_call_names_the_page_of_its_view_and_a_view_without_a_chart_names_none(
        self, world: GatewayWorld
    ) -> None:
        run_id = store_run(world)
        async with Client(world.server(), extensions=APPS) as client:
            one_run = await client.call_tool("tpu_observe", {"show": "benchmarks", "command_id": run_id})
            compared = await client.call_tool("tpu_observe", {"show": "benchmarks"})
            logs = await client.call_tool("tpu_observe", {"show": "logs", "deployment_id": "gemma-a"})
            listing = await client.call_tool("tpu_status", {})
            metrics_page = await read_page(client, METRICS_URI)
            deployment_page = await read_page(client, DEPLOYMENT_URI)
        assert not one_run.is_error and ui_of(one_run) == {"resourceUri": BENCH_URI}
        assert not compared.is_error and ui_of(compared) == {"resourceUri": COMPARISON_URI}
        assert not logs.is_error and ui_of(logs) is None, texts(logs)
        assert not listing.is_error and ui_of(listing) is None, texts(listing)
        assert "No chart yet" in metrics_page and "No chart yet" in deployment_page  # neither call drew a page


class TestAClientWithoutApps:
    async def test_gets_exactly_the_result_of_a_server_without_apps(self, world: GatewayWorld) -> None:
        store_samples(world)
        run_id = store_run(world)
        store_history(world)
        calls: list[tuple[str, dict[str, Any]]] = [
            ("tpu_observe", {"deployment_id": "gemma-a", "minutes": 60}),
            ("tpu_observe", {"show": "benchmarks", "command_id": run_id}),
            ("tpu_observe", {"show": "benchmarks"}),
            ("tpu_status", {"deployment_id": "gemma-a"}),
        ]
        results: dict[str, list[Any]] = {"apps": [], "plain": []}
        for key, server in (("apps", world.server()), ("plain", build_server(world.core, chart_apps=False))):
            async with Client(server) as client:
                for name, arguments in calls:
                    results[key].append(await client.call_tool(name, arguments))
            if key == "apps":
                async with Client(server, extensions=APPS) as client:  # nothing was rendered for the plain client
                    assert "No chart yet" in await read_page(client, METRICS_URI)
        for with_apps, without in zip(results["apps"], results["plain"], strict=True):
            assert texts(with_apps) == texts(without) and texts(with_apps)[0]
            assert with_apps.structured_content == without.structured_content
            assert with_apps.meta == without.meta and ui_of(with_apps) is None

    async def test_advertising_apps_without_its_mime_type_is_not_negotiating_it(self, world: GatewayWorld) -> None:
        store_samples(world)
        async with Client(world.server(), extensions=[advertise(EXTENSION_ID, {"mimeTypes": ["text/html"]})]) as c:
            result = await c.call_tool("tpu_observe", {"deployment_id": "gemma-a"})
        assert not result.is_error and ui_of(result) is None


async def test_over_stdio_an_apps_client_reads_the_chart_of_the_stored_samples(
    world: GatewayWorld, tmp_path: Path
) -> None:
    store_samples(world)
    world.store.close()  # the server opens the same store: <data dir>/state.sqlite
    assert (tmp_path / "state.sqlite").exists()
    env = {key: value for key, value in os.environ.items() if not key.startswith("TPUCTL_")}
    env.update({"TPUCTL_BACKEND": "local", "PYTHONPATH": str(REPO_ROOT)})
    args = ["-m", "mcp_client_gateway", "--data-dir", str(tmp_path)]
    params = StdioServerParameters(command=sys.executable, args=args, env=env)
    async with Client(params, extensions=APPS) as client:
        result = await client.call_tool("tpu_observe", {"deployment_id": "gemma-a"})
        html = await read_page(client, METRICS_URI)
    assert ui_of(result) == {"resourceUri": METRICS_URI}, texts(result)
    assert [y for _, y in drawn(html, "generated")] == [456.5, 512.0, 640.25]

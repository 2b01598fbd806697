"""The status page (``tpuctl ui``) over the embedded store, read over real HTTP and in headless Chromium (Debian's
``chromium``, ``--dump-dom`` after layout; the tests that need it skip and say so where it is missing)."""

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest

from mcp_client_gateway.cli import EXIT_USAGE, run
from mcp_client_gateway.status_page.server import StatusPage
from shared.domain.models import BenchmarkRun, MonitorSample, Phase
from shared.messages import new_command_id
from tests.mcp.conftest import GatewayWorld, seed_monitor_restart

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
BROWSER = (str(CHROMIUM), "--headless=new", "--no-sandbox", "--disable-gpu")
HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'
TTFT_P90 = (0.41, 0.52, 0.77)


@pytest.fixture
def page(world: GatewayWorld) -> Iterator[StatusPage]:
    server = StatusPage(world.core)
    server.start()
    yield server
    server.stop()


def _seed_history(world: GatewayWorld) -> tuple[str, str]:
    """A deployment that booted, served, stalled, was restarted by the monitor and benchmarked."""
    world.seed("gemma-a")
    now = datetime.now(UTC)
    phases = (Phase.BOOTING, Phase.SERVING, Phase.SERVING, Phase.STALLED)
    samples = [
        MonitorSample(
            deployment_id="gemma-a",
            taken_at=now - timedelta(minutes=25 - 5 * index),
            phase=phase,
            slis={"ttft_p90_s": TTFT_P90[index - 1], "kv_cache_usage": 0.25} if index else {},
            detail=HOSTILE if phase is Phase.STALLED else "",
        )
        for index, phase in enumerate(phases)
    ]
    world.store.write_samples(samples)
    restart_id = seed_monitor_restart(world, now)
    run_id = new_command_id()
    points = [
        {"level": 1, "output_throughput": 120.5, "median_ttft_ms": 80.0},
        {"level": 4, "output_throughput": 260.0, "median_ttft_ms": 140.0},
    ]
    world.store.create_benchmark_run(
        BenchmarkRun(
            run_id=run_id,
            deployment_id="gemma-a",
            status="completed",
            result={"points": points},
            created_at=now - timedelta(minutes=2),
            updated_at=now - timedelta(minutes=1),
        )
    )
    return restart_id, run_id


def _dom(url: str) -> str:
    assert CHROMIUM is not None
    done = subprocess.run(
        [*BROWSER, "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout


class _Elements(HTMLParser):
    """Every element's tag and attributes, as the browser's DOM holds them."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str]]] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, {name: value or "" for name, value in attrs}))


@needs_chromium
def test_a_deployment_s_page_shows_its_phase_timeline_and_sli_chart_in_chromium(
    world: GatewayWorld, page: StatusPage
) -> None:
    restart_id, run_id = _seed_history(world)
    dom = _dom(f"{page.url}deployments/gemma-a")
    elements = _Elements(dom).found
    assert ("span", {"class": "phase", "data-phase": "SERVING", "style": "background:#188038"}) in elements
    ttft = [float(a["data-y"]) for tag, a in elements if tag == "circle" and a.get("data-series") == "p90"]
    assert ttft == list(TTFT_P90), "the TTFT p90 chart is drawn from the stored samples"
    curve = [(float(a["data-x"]), float(a["data-y"])) for tag, a in elements if a.get("data-series") == run_id[:8]]
    assert curve == [(120.5, 80.0), (260.0, 140.0)], "the benchmark's sweep as a latency-throughput curve"
    assert "europe-west4-a" in dom and "stockout" in dom, "the capacity hunt"
    assert "BOOTING -&gt; SERVING" in dom or "BOOTING -> SERVING" in dom, "a phase change on the timeline"
    assert "the monitor (healing)" in dom and "debug-bundles/gemma-a/1/bundle.json" in dom, "restart, cause, bundle"
    assert not [tag for tag, _ in elements if tag in ("script", "img")], "hostile text is shown, never run"
    assert "alert(" in dom, "the hostile detail is still there, as text"
    assert restart_id  # the monitor's id decided the cause above


@needs_chromium
def test_the_index_lists_deployments_with_links_in_chromium(world: GatewayWorld, page: StatusPage) -> None:
    world.seed("gemma-a")
    world.seed("gemma-b", phase=Phase.SEARCHING)
    elements = _Elements(_dom(page.url)).found
    links = [a["href"] for tag, a in elements if tag == "a"]
    assert links == ["/deployments/gemma-b", "/deployments/gemma-a"] or set(links) == {
        "/deployments/gemma-a",
        "/deployments/gemma-b",
    }
    assert {a["data-phase"] for tag, a in elements if tag == "span"} == {"SERVING", "SEARCHING"}


@needs_chromium
def test_a_screenshot_of_the_page_is_a_picture_of_it(world: GatewayWorld, page: StatusPage, tmp_path: Path) -> None:
    _seed_history(world)
    shot = tmp_path / "status-page.png"
    assert CHROMIUM is not None
    subprocess.run(
        [
            *BROWSER,
            "--hide-scrollbars",
            "--window-size=1280,1700",
            f"--screenshot={shot}",
            f"{page.url}deployments/gemma-a",
        ],
        capture_output=True,
        timeout=120,
        check=True,
    )
    header = shot.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    assert int.from_bytes(header[16:20], "big") == 1280 and int.from_bytes(header[20:24], "big") == 1700


def test_the_timeline_says_who_caused_each_step(world: GatewayWorld) -> None:
    _, run_id = _seed_history(world)
    timeline = world.core.timeline("gemma-a")
    kinds = [event.kind for event in timeline.events]
    assert kinds[0] == "created" and {"capacity", "phase", "restart", "benchmark"} <= set(kinds)
    assert [event.at for event in timeline.events] == sorted(event.at for event in timeline.events)
    phases = [event.summary.split(":")[0] for event in timeline.events if event.kind == "phase"]
    assert phases == ["BOOTING", "BOOTING -> SERVING", "SERVING -> STALLED"]
    restart = next(event for event in timeline.events if event.kind == "restart")
    assert restart.cause == "the monitor (healing)" and restart.link.endswith("bundle.json")
    benchmark = next(event for event in timeline.events if event.kind == "benchmark")
    assert benchmark.link == run_id and benchmark.cause == "a user, through the gateway"
    stalled = next(event for event in timeline.events if "STALLED" in event.summary)
    assert "\n" not in stalled.summary and len(stalled.summary) < 300


def test_the_page_is_read_only_loopback_only_and_strict(world: GatewayWorld, page: StatusPage) -> None:
    world.seed("gemma-a")
    answer = httpx.get(page.url)
    assert answer.status_code == 200
    assert answer.headers["content-security-policy"].startswith("default-src 'none'")
    assert answer.headers["x-frame-options"] == "DENY" and answer.headers["cache-control"] == "no-store"
    assert httpx.post(page.url, content=b"x").status_code == 405
    assert httpx.get(page.url, headers={"Host": "attacker.example:80"}).status_code == 421, "DNS rebinding refused"
    missing = httpx.get(f"{page.url}deployments/nope")
    assert missing.status_code == 404 and "no deployment" in missing.text
    assert httpx.get(f"{page.url}deployments/{'%3Cb%3E'}").status_code in (400, 404)
    with pytest.raises(ValueError, match="loopback"):
        StatusPage(world.core, host="0.0.0.0")


def test_tpuctl_ui_serves_until_ctrl_c_and_says_where(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "TPUCTL_BACKEND": "local"}
    env["TPUCTL_DATA_DIR"] = str(tmp_path / "var")
    command = [sys.executable, "-c", "from mcp_client_gateway.cli import main; main()", "ui", "--port", "0"]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2])
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert url, line
        page = httpx.get(url.group(0), timeout=30)
        assert page.status_code == 200 and "No deployments yet" in page.text
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
        if process.stderr is not None:
            process.stderr.close()


def test_tpuctl_ui_on_a_taken_port_says_how_to_pick_another(world: GatewayWorld) -> None:
    taken = StatusPage(world.core)
    try:
        stdout, stderr = io.StringIO(), io.StringIO()
        code = run(["ui", "--port", str(taken.port)], ports=world.ports, stdout=stdout, stderr=stderr)
        assert code == 2 and "--port 0" in stderr.getvalue()
        assert run(["ui", "--port", "70000"], ports=world.ports, stdout=stdout, stderr=stderr) == EXIT_USAGE
    finally:
        taken.stop()

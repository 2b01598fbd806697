"""``tpuctl bench report`` (issue 22 item 6): several stored runs drawn as latency against throughput, the Pareto
front of tokens/s per user against per chip, and the cost per million output tokens, as PNG, SVG and one HTML page.

The runs seeded here are the ones the images in docs/img/bench-report-*.png were drawn from."""

from __future__ import annotations

import re
import struct
from datetime import timedelta
from pathlib import Path
from typing import Any

from mcp_client_gateway.bench_report import TITLES, report_runs
from mcp_client_gateway.charts import CSP
from shared.domain.bench_pareto import pareto_points
from shared.domain.models import BenchmarkRun
from tests.mcp.conftest import GatewayWorld
from tests.mcp.test_cli_tables_and_plots import EXIT_FAILED, EXIT_OK, tpuctl

OUTPUT_LEN = 256
BASELINE = "0b6d3c1e-1a2b-4c3d-8e4f-5a6b7c8d9e01"
TUNED = "0b6d3c1e-1a2b-4c3d-8e4f-5a6b7c8d9e02"
SMALL = "0b6d3c1e-1a2b-4c3d-8e4f-5a6b7c8d9e03"
V6E_8 = {"accelerator": "v6e-8", "chips": 8, "tier": "on_demand", "zone": "us-east5-b"}
V6E_4 = {"accelerator": "v6e-4", "chips": 4, "tier": "spot", "zone": "us-east5-b"}


def level(n: float, tok_s: float, ttft_ms: float, tpot_ms: float, **extra: Any) -> dict[str, Any]:
    """One level as loadgen stores it: 64 requests of 256 output tokens."""
    return {
        "level": n,
        "mode": "concurrency",
        "completed": 64,
        "failed": 0,
        "duration": 64 * OUTPUT_LEN / tok_s,
        "output_throughput": tok_s,
        "total_token_throughput": tok_s * 3,
        "request_throughput": tok_s / OUTPUT_LEN,
        "p50_ttft_ms": ttft_ms,
        "p90_ttft_ms": ttft_ms * 1.6,
        "p50_itl_ms": tpot_ms,
        "p90_itl_ms": tpot_ms * 1.3,
        "median_tpot_ms": tpot_ms,
        **extra,
    }


def rate_level(rate: float, achieved: float, ttft_ms: float, tpot_ms: float, good_share: float) -> dict[str, Any]:
    tok_s = achieved * OUTPUT_LEN
    point = level(rate, tok_s, ttft_ms, tpot_ms, mode="rate", arrival_rate=rate, completion_rate=achieved)
    point["request_goodput"] = good_share * 64 / point["duration"]
    return point


def seed(world: GatewayWorld, run_id: str, deployment: str, plan: dict[str, Any], **result: Any) -> None:
    now = world.core.ports.clock.now() + timedelta(seconds=int(run_id[-2:]))
    request = result.pop("request", {"mode": "concurrency"})
    world.store.create_benchmark_run(
        BenchmarkRun(
            run_id=run_id,
            deployment_id=deployment,
            status="completed",
            request=request,
            plan=plan,
            result={"output_throughput": 1.0, **result},
            created_at=now,
            updated_at=now,
        )
    )


def seed_realistic_runs(world: GatewayWorld, model: str = "gemma-4-31b") -> None:
    """A baseline and a tuned run of a 31B on v6e-8 (concurrency sweeps), and an open-loop rate sweep of it on
    half the chips with an SLO."""
    seed(
        world,
        BASELINE,
        "gemma-31b",
        V6E_8,
        model=model,
        points=[
            level(1, 46.0, 120.0, 21.0),
            level(4, 168.0, 150.0, 23.0),
            level(16, 560.0, 260.0, 27.5),
            level(64, 1480.0, 900.0, 41.0),
            level(128, 1720.0, 3100.0, 70.0),
        ],
    )
    seed(
        world,
        TUNED,
        "gemma-31b-tuned",
        V6E_8,
        model=model,
        points=[
            level(1, 44.0, 110.0, 22.0),
            level(4, 172.0, 140.0, 22.5),
            level(16, 610.0, 240.0, 25.5),
            level(64, 1650.0, 700.0, 37.0),
            level(128, 2150.0, 1900.0, 56.0),
        ],
    )
    seed(
        world,
        SMALL,
        "gemma-31b-v6e4",
        V6E_4,
        model=model,
        request={"mode": "rate", "slo_ttft_ms": 1000.0, "slo_tpot_ms": 40.0},
        points=[
            rate_level(0.5, 0.5, 130.0, 20.0, 1.0),
            rate_level(1.0, 1.0, 140.0, 22.0, 1.0),
            rate_level(2.0, 2.0, 190.0, 26.0, 0.98),
            rate_level(4.0, 3.95, 420.0, 38.0, 0.93),
            rate_level(8.0, 4.3, 4200.0, 65.0, 0.1),
        ],
    )


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", path
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_bench_report_writes_four_charts_in_both_formats_and_one_self_contained_page(
    world: GatewayWorld, tmp_path: Path
) -> None:
    seed_realistic_runs(world)
    out = tmp_path / "report"
    made = tpuctl(world, "bench", "report", BASELINE, "gemma-31b-tuned", SMALL, "--out", str(out))  # an id and a name
    assert made.code == EXIT_OK, made.stderr
    paths = [Path(line) for line in made.stdout.splitlines()]
    names = sorted(path.name for path in paths)
    assert names == sorted(["bench-report.html"] + [f"bench-report-{c}.{e}" for c in TITLES for e in ("svg", "png")])
    assert all(path.is_file() and path.parent == out for path in paths)
    assert all(png_size(path) == (720, 440) for path in paths if path.suffix == ".png")

    html = (out / "bench-report.html").read_text(encoding="utf-8")
    assert (
        f'content="{CSP}"' in html
        and "<script" not in html
        and "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    )
    assert all(title in html for title in TITLES.values())
    assert html.count("<svg") == 4 and all(run_id in html for run_id in (BASELINE, TUNED, SMALL))

    views = [world.core.get_benchmark(run_id) for run_id in (BASELINE, TUNED, SMALL)]
    front = [p for p in pareto_points([run.figures for run in report_runs(views)]) if p.on_front]
    assert 0 < len(front) < 15  # some of the 15 levels are dominated
    assert f"{len(front)} of 15 level(s) are on the Pareto front." in html
    front_table = re.search(r'<section id="pareto-front">(.*?)</section>', html)
    assert front_table is not None and front_table.group(1).count("<tr>") == 1 + len(front)  # header + one a point
    # the baseline's top level is beaten by the tuned run's: faster per user and more per chip
    assert not any(p.run == "gemma-31b" and p.level == 128 for p in front)
    assert any(p.run == "gemma-31b-tun" and p.level == 128 for p in front), front  # labels are cut to 13
    # the SLO run's levels that met it are ringed in the cost chart: one ring per such level
    cost_svg = (out / "bench-report-cost.svg").read_text(encoding="utf-8")
    assert cost_svg.count('r="7" fill="none"') == 1 + 4  # the legend's ring and 4 of 5 rates (8 req/s fell behind)


def test_hostile_text_in_a_run_is_escaped_and_a_report_of_empty_runs_writes_nothing(
    world: GatewayWorld, tmp_path: Path
) -> None:
    seed_realistic_runs(world, model="<script>alert(1)</script>")
    seed(
        world,
        "0b6d3c1e-1a2b-4c3d-8e4f-5a6b7c8d9e04",
        "<img src=x onerror=alert(1)>",
        V6E_8,
        points=[level(1, 46.0, 120.0, 21.0)],
    )
    made = tpuctl(
        world, "bench", "report", BASELINE, "0b6d3c1e-1a2b-4c3d-8e4f-5a6b7c8d9e04", "--out", str(tmp_path / "r")
    )
    assert made.code == EXIT_OK, made.stderr
    html = (tmp_path / "r" / "bench-report.html").read_text(encoding="utf-8")
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<img" not in html and "&lt;img src=x" in html
    svg = (tmp_path / "r" / "bench-report-pareto.svg").read_text(encoding="utf-8")
    assert "<img" not in svg and "&lt;img src=x" in svg  # the label in the legend

    seed(world, "0b6d3c1e-1a2b-4c3d-8e4f-5a6b7c8d9e05", "gemma-bare", V6E_8)
    refused = tpuctl(world, "bench", "report", "gemma-bare", "--out", str(tmp_path / "none"))
    assert refused.code == EXIT_FAILED and "none of these runs has levels to report" in refused.stderr
    assert not (tmp_path / "none").exists()
    unknown = tpuctl(world, "bench", "report", "gemma-nothing", "--out", str(tmp_path / "none"))
    assert unknown.code != EXIT_OK and "no benchmark run of 'gemma-nothing'" in unknown.stderr


def test_more_runs_than_a_report_holds_is_a_usage_error(world: GatewayWorld, tmp_path: Path) -> None:
    runs = [f"0b6d3c1e-1a2b-4c3d-8e4f-5a6b7c8d9e{n:02d}" for n in range(10, 19)]  # 9 ids, never read
    refused = tpuctl(world, "bench", "report", *runs, "--out", str(tmp_path / "many"))
    assert refused.code == 2 and "compare at most 8" in refused.stderr
    assert not (tmp_path / "many").exists()

"""What ``tpuctl`` prints is readable at any width (#18 item 12): a pipe gets whole tables, a benchmark shows
every level, instants read as times, ``--wait`` speaks when the stage changes, and a run can be plotted."""

from __future__ import annotations

import io
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mcp_client_gateway.cli import EXIT_FAILED, EXIT_OK, _wording, run
from mcp_client_gateway.cli_output import Output, render_serving_logs
from shared.domain.models import BenchmarkRun, NodeTask
from shared.domain.throughput_bound import judge_throughput
from tests.mcp.conftest import GatewayWorld

LONG_ID = "gemma-with-a-deployment-name-that-is-long"


@dataclass
class Ran:
    code: int
    stdout: str
    stderr: str


def tpuctl(world: GatewayWorld, *argv: str) -> Ran:
    stdout, stderr = io.StringIO(), io.StringIO()
    code = run(list(argv), ports=world.ports, stdout=stdout, stderr=stderr)
    return Ran(code, stdout.getvalue(), stderr.getvalue())


def point(level: int, throughput: float) -> dict[str, Any]:
    return {
        "level": level,
        "mode": "concurrency",
        "completed": 32,
        "failed": 0,
        "request_throughput": level * 0.9,
        "output_throughput": throughput,
        "total_token_throughput": throughput * 3,
        "median_ttft_ms": 40.0 + level,
        "p50_ttft_ms": 40.0 + level,
        "p90_ttft_ms": 60.0 + level,
        "p99_ttft_ms": 90.0 + level,
        "median_itl_ms": 9.5,
        "p50_itl_ms": 9.5,
        "p90_itl_ms": 11.0,
        "p99_itl_ms": 14.25,
        "mean_tpot_ms": 10.125,
    }


def seed_run(world: GatewayWorld, run_id: str, deployment_id: str = "gemma-a", with_points: bool = True) -> None:
    now = world.core.ports.clock.now()
    result: dict[str, Any] = {"output_throughput": 512.5, "mean_ttft_ms": 80.0, "model": "gemma-4-31b"}
    if with_points:
        result["points"] = [point(1, 101.5), point(4, 377.0), point(16, 912.75)]
        result["knee"] = {"level": 16, "reason": "throughput flattened"}
    world.store.create_benchmark_run(
        BenchmarkRun(
            run_id=run_id,
            deployment_id=deployment_id,
            status="completed",
            result=result,
            created_at=now,
            updated_at=now,
        )
    )


def test_a_pipe_gets_tables_whole_not_cut_at_80_columns(world: GatewayWorld) -> None:
    for n in range(3):
        seed_run(world, f"3f0c2a9e-5b1d-4c7e-9a2b-1d2e3f4a5b6{n}", deployment_id=f"{LONG_ID}-{n}")
    shown = tpuctl(world, "bench", "compare")
    assert shown.code == EXIT_OK
    assert all(f"{LONG_ID}-{n}" in shown.stdout for n in range(3)), shown.stdout
    assert max(len(line) for line in shown.stdout.splitlines()) > 80, "nothing was folded to fit 80 columns"


def test_bench_show_prints_every_level_not_only_the_headline(world: GatewayWorld) -> None:
    run_id = "3f0c2a9e-5b1d-4c7e-9a2b-1d2e3f4a5b6c"
    seed_run(world, run_id)
    shown = tpuctl(world, "bench", "show", run_id)
    assert shown.code == EXIT_OK
    rows = [line.split() for line in shown.stdout.splitlines() if line.split()[:1] in (["1"], ["4"], ["16"])]
    assert [row[0] for row in rows] == ["1", "4", "16"] and "912.8" in shown.stdout
    assert "Knee: 16 (throughput flattened)" in shown.stdout
    latest = tpuctl(world, "bench", "show", "gemma-a")  # a deployment id: its newest run
    assert latest.code == EXIT_OK and latest.stdout == shown.stdout
    none = tpuctl(world, "bench", "show", "gemma-b")
    assert none.code != EXIT_OK and "no benchmark run of 'gemma-b'" in none.stderr


def test_bench_show_prints_the_physical_bound_line_only_when_one_was_drawn(world: GatewayWorld) -> None:
    old, judged = "3f0c2a9e-5b1d-4c7e-9a2b-1d2e3f4a5b6c", "3f0c2a9e-5b1d-4c7e-9a2b-1d2e3f4a5b6d"
    seed_run(world, old)
    seed_run(world, judged, deployment_id="gemma-b")
    levels = [
        {"level": level, **verdict.as_dict()}
        for level, tok_s in ((1, 101.5), (4, 377.0), (16, 912.75))
        if (verdict := judge_throughput("gemma-4-31b", "v6e-8", concurrency=level, measured_tok_s=tok_s))
    ]
    stored = world.store.get_benchmark_run(judged)
    assert stored is not None and stored.result is not None
    comparison = {"throughput_bound": {"levels": levels, "findings": []}}
    world.store.update_benchmark_run(stored.model_copy(update={"result": {**stored.result, "comparison": comparison}}))
    shown = tpuctl(world, "bench", "show", judged)
    assert shown.code == EXIT_OK
    line = next(line for line in shown.stdout.splitlines() if "physical bound" in line)
    assert line.startswith("throughput against the physical bound: 912.8 tok/s at the peak level, ")
    assert f"of the bound of {levels[2]['bound_tok_s']:,.0f} tok/s" in line
    assert "physical bound" not in tpuctl(world, "bench", "show", old).stdout


def test_bench_plot_writes_a_page_a_person_can_open_and_refuses_a_run_without_levels(
    world: GatewayWorld, tmp_path: Path
) -> None:
    run_id = "3f0c2a9e-5b1d-4c7e-9a2b-1d2e3f4a5b6c"
    seed_run(world, run_id)
    made = tpuctl(world, "bench", "plot", run_id, "--out", str(tmp_path / "plots"))
    assert made.code == EXIT_OK
    paths = [Path(line) for line in made.stdout.splitlines()]
    page = tmp_path / "plots" / f"benchmark-{run_id}.html"
    assert paths[0] == page and all(p.is_file() for p in paths)
    html = page.read_text(encoding="utf-8")
    assert html.count("<svg") == 3 and "912.8" in html
    pngs = [p for p in paths if p.suffix == ".png"]
    assert len(pngs) == 3 and all(p.read_bytes().startswith(b"\x89PNG\r\n\x1a\n") for p in pngs)

    bare = "7a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
    seed_run(world, bare, with_points=False)
    refused = tpuctl(world, "bench", "plot", bare, "--out", str(tmp_path / "none"))
    assert refused.code == EXIT_FAILED and "no levels to plot" in refused.stderr
    assert not (tmp_path / "none").exists()


def test_slis_that_are_instants_read_as_utc_times(world: GatewayWorld) -> None:
    record = world.seed("gemma-a")
    slis = {"as_of_epoch_s": 1796330000.5, "canary_at": 1796330000.0, "ttft_p90_s": 0.0421, "tokens_total": 1234567.0}
    status = record.status.model_copy(update={"slis": slis})
    world.store.put_deployment(record.model_copy(update={"status": status}), expected_version=record.version)
    shown = tpuctl(world, "status", "gemma-a")
    assert shown.code == EXIT_OK
    assert f"{datetime.fromtimestamp(1796330000, UTC):%Y-%m-%d %H:%M:%S} UTC" in shown.stdout
    assert "e+09" not in shown.stdout and "1796330000" not in shown.stdout
    assert "0.0421" in shown.stdout and "1,234,567" in shown.stdout


def test_wait_speaks_when_the_stage_changes_not_when_its_minutes_count_up() -> None:
    assert _wording("searching: waited 3 min in 2 zone(s)") == _wording("searching: waited 4 min in 2 zone(s)")
    assert _wording("searching: waited 3 min") != _wording("booting: vLLM loads (3 min)")


def test_a_next_step_the_cli_prints_names_tpuctl_commands_not_tools(world: GatewayWorld) -> None:
    task_id = "3f0c2a9e-5b1d-4c7e-9a2b-1d2e3f4a5b6c"
    world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
    world.store.create_node_task(
        NodeTask(task_id=task_id, deployment_id="gemma-a", action="logs", requested_at=datetime.now(UTC))
    )
    view = world.core.tail_serving_logs("gemma-a", task_id=task_id)  # the node has not answered: pending
    assert view.status == "pending"
    assert f"tpu_control(action='log_tail', deployment_id='gemma-a', task_id='{task_id}')" in view.next_step
    stdout, stderr = io.StringIO(), io.StringIO()
    render_serving_logs(view, Output("table", False, stdout, stderr))
    said = stderr.getvalue()
    assert f"call tpuctl logs gemma-a --task-id {task_id} again" in said
    assert "tpu_control" not in said and "action=" not in said and "task_id=" not in said

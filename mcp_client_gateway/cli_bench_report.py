"""``tpuctl bench report RUN [RUN ...] --out DIR``: latency against throughput per run, the Pareto front of
tokens/s per user against tokens/s per chip, and the cost per million output tokens against the request rate, as
PNG and SVG files and one self-contained HTML page (``mcp_client_gateway.bench_report``). Read-only."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from mcp_client_gateway.bench_report import MAX_RUNS, write_report
from mcp_client_gateway.cli_bench import run_of
from mcp_client_gateway.cli_output import Output
from mcp_client_gateway.core import GatewayCore

__all__ = ["add_bench_report_command", "cmd_bench_report"]

_EXIT_USAGE, _EXIT_FAILED = 2, 5  # as in ``cli``


def add_bench_report_command(bench_sub: Any, common: argparse.ArgumentParser) -> None:
    """Register ``tpuctl bench report`` on the ``bench`` subparsers."""
    report = bench_sub.add_parser(
        "report", parents=[common], help="runs compared in charts: latency, Pareto front, cost (HTML, SVG, PNG)"
    )
    report.add_argument(
        "runs", nargs="+", metavar="RUN", help=f"run ids or deployment ids (newest run); {MAX_RUNS} at most"
    )
    report.add_argument("--out", type=Path, default=Path("bench-report"), help="folder to write them into")
    report.set_defaults(handler=cmd_bench_report)


def cmd_bench_report(core: GatewayCore, args: argparse.Namespace, out: Output) -> int:
    run_ids = list(dict.fromkeys(run_of(core, given) for given in args.runs))  # the same run once
    if len(run_ids) > MAX_RUNS:
        out.note(f"bench report: {len(run_ids)} runs given; compare at most {MAX_RUNS} in one report")
        return _EXIT_USAGE
    written = write_report([core.get_benchmark(run_id) for run_id in run_ids], args.out)
    if not written:
        out.note("none of these runs has levels to report yet")
        return _EXIT_FAILED
    for path in written:
        out.stdout.write(f"{path}\n")
    return 0

"""``tpuctl bench run``'s workload and SLO flags: shared prefix, multi-turn sessions, a trace file, goodput SLOs,
and ``--search-max-rate-from``, the open-loop max rate at the SLO over a doubling ladder of Poisson rates.

The trace file is read here, on the workstation (``loadgen.workloads.read_trace_file``: JSON Lines of
``timestamp`` in seconds, ``input_len``, ``output_len``), and sent in the command as the ``trace`` the MCP tool
takes: timestamps made relative to the first request and rounded to the microsecond, so a long trace fits the
command. A bad line is refused naming the file's line and field before anything is published.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from loadgen.workloads import TraceError, read_trace_file
from mcp_client_gateway.core import GatewayCore
from mcp_client_gateway.errors import GatewayError
from shared.domain.bench_rate_search import LADDER_RUNGS, rate_ladder
from shared.messages import WORKLOADS
from shared.messages.contracts import UUID_PATTERN

__all__ = ["add_tune_command", "add_workload_arguments", "run_of", "workload_settings"]

_TUNE = (
    "auto-tune a serving deployment's vLLM flags for an SLO: the baseline, then trials each on a recreated engine, "
    "each judged by its max request rate at the SLO; the best is kept as a verified preset (tpuctl deploy --preset)"
)


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """The workload and SLO flags of ``tpuctl bench run``."""
    parser.add_argument("--workload", choices=WORKLOADS, help="random (default), shared_prefix, multi_turn, trace")
    parser.add_argument("--prefix-len", type=int, help="shared_prefix: tokens of the common prefix")
    parser.add_argument("--prefix-share", type=float, help="shared_prefix: share of requests with it (0-1)")
    parser.add_argument("--turns", type=int, help="multi_turn: requests per session (2-64)")
    parser.add_argument(
        "--trace-file", type=Path, help="JSON Lines to replay: timestamp (s), input_len, output_len per line"
    )
    parser.add_argument("--slo-ttft-ms", type=float, help="TTFT SLO (ms) for goodput and the cost at the SLO")
    parser.add_argument("--slo-tpot-ms", type=float, help="TPOT SLO (ms) for goodput and the cost at the SLO")
    parser.add_argument(
        "--search-max-rate-from",
        type=float,
        metavar="RATE",
        help=f"open-loop max rate at the SLO: Poisson levels RATE, 2xRATE, ... ({LADDER_RUNGS} rungs) instead of "
        "--concurrency; the result names the highest rate that kept up (>= 95%% of offered) and met the SLO",
    )


def add_tune_command(sub: Any, parents: list[argparse.ArgumentParser], handler: Any) -> None:
    """``tpuctl tune ID --trials N --slo-ttft-ms X``: a benchmark run with ``tune_trials`` (``handler`` is the
    bench run's); ``tpuctl bench show RUN`` prints its trials and the preset it kept."""
    tune = sub.add_parser("tune", parents=parents, help=_TUNE, description=_TUNE)
    tune.add_argument("deployment_id")
    tune.add_argument("--trials", type=int, required=True, help="trials in all, the baseline included (2-12)")
    tune.add_argument(
        "--num-prompts",
        type=int,
        default=24,
        help="at least this many requests per probe of each trial's rate search (8 s of arrivals at fast rates)",
    )
    tune.add_argument("--input-len", type=int, default=256)
    tune.add_argument("--output-len", type=int, default=64)
    tune.add_argument("--command-id", help="idempotency key (UUID)")
    add_workload_arguments(tune)
    tune.set_defaults(handler=handler, concurrency=[1, 4, 16], endpoint="completions")


def workload_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The benchmark settings the flags give (absent flags give nothing: the defaults apply)."""
    settings: dict[str, Any] = {}
    for name in ("workload", "prefix_len", "prefix_share", "turns", "slo_ttft_ms", "slo_tpot_ms"):
        value = getattr(args, name, None)
        if value is not None:
            settings[name] = value
    if getattr(args, "trials", None) is not None:  # tpuctl tune
        settings["tune_trials"] = args.trials
    if args.trace_file is not None:
        try:
            trace = read_trace_file(args.trace_file)
        except TraceError as exc:
            raise GatewayError(
                "invalid_argument",
                "trace_file",
                str(exc).removeprefix("trace_file: "),
                "one JSON object per line with timestamp (seconds), input_len and output_len (tokens)",
            ) from None
        first = trace[0].timestamp
        settings["trace"] = [
            {
                "timestamp": round(entry.timestamp - first, 6),
                "input_len": entry.input_len,
                "output_len": entry.output_len,
            }
            for entry in trace
        ]
        settings.setdefault("workload", "trace")
    start = getattr(args, "search_max_rate_from", None)
    if start is not None:
        settings.update(_search_ladder(start, settings))
    return settings


def _search_ladder(start: float, settings: dict[str, Any]) -> dict[str, Any]:
    """``--search-max-rate-from``: a rate sweep over the search's ladder (the node measures every rung; the
    controller judges them in order and stops at the first that saturates or breaks the SLO)."""
    if settings.get("workload") == "trace":
        raise GatewayError(
            "invalid_argument",
            "search_max_rate_from",
            "a trace sets its own arrivals, so there is no rate to search",
            "drop --trace-file, or drop --search-max-rate-from to replay the trace",
        )
    if not 0 < start <= 5000:
        raise GatewayError(
            "invalid_argument",
            "search_max_rate_from",
            f"{start:g} is not a usable first rate",
            "give the first request rate to probe, in requests per second, above 0 and at most 5000",
        )
    return {"mode": "rate", "request_rate": rate_ladder(start)}


_UUID = re.compile(UUID_PATTERN)


def run_of(core: GatewayCore, run_or_deployment: str) -> str:
    """A run id as given, or a deployment id's newest run (run ids are UUIDs, deployment ids never are)."""
    if _UUID.fullmatch(run_or_deployment):
        return run_or_deployment
    rows = core.compare_benchmarks(deployment_id=run_or_deployment, limit=1).rows
    if not rows:
        raise GatewayError("not_found", "run_id", f"no benchmark run of '{run_or_deployment}'", "tpuctl bench run it")
    return rows[0].run_id

"""Gateway latency over the real stdio transport: startup to the first ``tools/list`` answer, and read round trips.

Targets (issue 8): startup under 1.5 s, a read tool round trip under 100 ms.

What is measured, with the MCP SDK's own client driving ``python -m mcp_client_gateway`` as a subprocess (as
Gemini CLI and Antigravity do):

- startup: process spawn -> protocol negotiation -> ``tools/list`` answered, on a fresh process each run;
- read round trip: ``tools/call`` of ``tpu_status`` for one deployment (``deployment_id``) and for the list (no
  arguments) against a store seeded with deployments, including the client's validation of the result against the
  output schema. The first call of a session is reported apart (the gateway opens the store in the background at
  start); the Python client's own one-time import of ``jsonschema`` for that validation is done before timing.

Run: ``.venv/bin/python benchmarks/gateway_latency.py [--runs 7] [--calls 200] [--json]``
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import jsonschema  # noqa: F401 - the SDK client imports it on its first tools/call (~0.15 s CPU)
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from shared.adapters.sqlite_store import SqliteStateStore  # noqa: E402
from shared.domain.models import (  # noqa: E402
    AttemptLog,
    DeploymentRecord,
    DeploymentSpec,
    DeploymentStatus,
    Phase,
    Tier,
)


def seed(data_dir: Path, count: int) -> None:
    """Deployments as the controller leaves them, each with a capacity-search history."""
    data_dir.mkdir(parents=True, exist_ok=True)
    store = SqliteStateStore(data_dir / "state.sqlite")
    now = datetime.now(UTC)
    for index in range(count):
        deployment_id = f"gemma-{index:02d}"
        attempts = [
            AttemptLog(at=now - timedelta(minutes=60 - i), zone="us-east5-b", tier=Tier.SPOT, outcome="stockout")
            for i in range(30)
        ]
        record = DeploymentRecord(
            deployment_id=deployment_id,
            spec=DeploymentSpec(
                deployment_id=deployment_id, model="gemma-4-26b-a4b", accelerator="v6e-4", zones=("us-east5-b",)
            ),
            status=DeploymentStatus(
                phase=Phase.SERVING,
                zone="us-east5-b",
                tier=Tier.SPOT,
                endpoint="http://10.0.0.5:8000",
                attempts=attempts,
            ),
            created_at=now - timedelta(hours=1),
            updated_at=now,
        )
        store.put_deployment(record, expected_version=None)
    store.close()


def server_params(data_dir: Path, pycache: Path) -> StdioServerParameters:
    """The gateway as an agent CLI starts it. Bytecode is cached (as after ``pip install``) in a private
    folder, so a machine with PYTHONDONTWRITEBYTECODE set does not measure recompiling the project each time."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("TPUCTL_") and key != "PYTHONDONTWRITEBYTECODE"
    }
    env.update({"TPUCTL_BACKEND": "local", "PYTHONPATH": str(REPO_ROOT), "PYTHONPYCACHEPREFIX": str(pycache)})
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "mcp_client_gateway", "--data-dir", str(data_dir)],
        env=env,
        cwd=str(REPO_ROOT),
    )


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def measure_startup(data_dir: Path, pycache: Path) -> tuple[float, float]:
    """Wall time to the tools/list answer, and the CPU time the gateway process used in its whole (short) life.

    The CPU figure hardly depends on what else the machine runs, so it is the one to compare across runs
    on a shared machine.
    """
    cpu_before = _children_cpu_s()
    with open(os.devnull, "w") as errlog:
        started = time.perf_counter()
        async with Client(stdio_client(server_params(data_dir, pycache), errlog=errlog)) as client:
            listed = await client.list_tools()
            elapsed = time.perf_counter() - started
    if len(listed.tools) < 8:
        raise RuntimeError(f"the gateway listed only {len(listed.tools)} tools")
    return elapsed, _children_cpu_s() - cpu_before


async def measure_calls(data_dir: Path, pycache: Path, calls: int) -> dict[str, Any]:
    # Each measured read, by the name it is reported under: (tool, arguments).
    reads: dict[str, tuple[str, dict[str, Any]]] = {
        "tpu_status(deployment_id)": ("tpu_status", {"deployment_id": "gemma-07"}),
        "tpu_status (list)": ("tpu_status", {}),
    }
    timings: dict[str, list[float]] = {name: [] for name in reads}
    first: dict[str, float] = {}
    with open(os.devnull, "w") as errlog:
        async with Client(stdio_client(server_params(data_dir, pycache), errlog=errlog)) as client:
            await client.list_tools()
            for name, (tool, args) in reads.items():
                started = time.perf_counter()
                result = await client.call_tool(tool, args)
                first[name] = time.perf_counter() - started
                if result.is_error:
                    raise RuntimeError(f"{name} failed: {result.content}")
            for _ in range(calls):
                for name, (tool, args) in reads.items():
                    started = time.perf_counter()
                    await client.call_tool(tool, args)
                    timings[name].append(time.perf_counter() - started)
    return {"first_call_ms": {k: v * 1000 for k, v in first.items()}, "timings": timings}


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


async def main_async(runs: int, calls: int) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="tpuctl-gw-bench-") as folder:
        data_dir = Path(folder) / "var"
        pycache = Path(folder) / "pycache"
        seed(data_dir, 20)
        first, _ = await measure_startup(data_dir, pycache)  # compiles the project's bytecode once
        measured_startups = [await measure_startup(data_dir, pycache) for _ in range(runs)]
        startups = [wall for wall, _ in measured_startups]
        cpu = [used for _, used in measured_startups]
        measured = await measure_calls(data_dir, pycache, calls)
    report: dict[str, Any] = {
        "load_average_1min": {"before": load_before, "after": os.getloadavg()[0], "cpus": os.cpu_count()},
        "startup_s": {
            "first_run_compiling": first,
            "runs": runs,
            "median": statistics.median(startups),
            "max": max(startups),
            "min": min(startups),
            "cpu_median": statistics.median(cpu),
        },
        "first_call_ms": measured["first_call_ms"],
        "round_trip_ms": {},
    }
    for name, values in measured["timings"].items():
        ms = [v * 1000 for v in values]
        report["round_trip_ms"][name] = {
            "calls": len(ms),
            "p50": percentile(ms, 50),
            "p95": percentile(ms, 95),
            "p99": percentile(ms, 99),
            "max": max(ms),
        }
    return report


def render(report: dict[str, Any]) -> str:
    startup = report["startup_s"]
    lines = [
        "| measure | value | target |",
        "|---|---|---|",
        f"| startup to first tools/list (median of {startup['runs']}) | {startup['median']:.3f} s | < 1.5 s |",
        f"| startup, best / worst run | {startup['min']:.3f} / {startup['max']:.3f} s | < 1.5 s |",
        f"| CPU time of one gateway process (start, list, exit; median) | {startup['cpu_median']:.3f} s | |",
        f"| startup, very first run (compiles bytecode) | {startup['first_run_compiling']:.3f} s | |",
    ]
    for name, stats in report["round_trip_ms"].items():
        lines.append(
            f"| {name} round trip p50 / p95 / p99 ({stats['calls']} calls) | "
            f"{stats['p50']:.1f} / {stats['p95']:.1f} / {stats['p99']:.1f} ms | < 100 ms |"
        )
    for name, ms in report["first_call_ms"].items():
        lines.append(f"| {name}, first call of the session | {ms:.1f} ms | |")
    load = report["load_average_1min"]
    lines.append(
        f"| machine load (1-min average before / after, {load['cpus']} CPUs) | "
        f"{load['before']:.2f} / {load['after']:.2f} | |"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="fresh processes for the startup measure")
    parser.add_argument("--calls", type=int, default=200, help="calls per read tool")
    parser.add_argument("--json", action="store_true", help="print the raw report as JSON")
    args = parser.parse_args()
    report = anyio.run(main_async, args.runs, args.calls)
    print(json.dumps(report, indent=2) if args.json else render(report))
    startup_ok = report["startup_s"]["max"] < 1.5
    calls_ok = all(stats["p95"] < 100 for stats in report["round_trip_ms"].values())
    sys.exit(0 if startup_ok and calls_ok else 1)


if __name__ == "__main__":
    main()

"""Gateway startup and ``tpuctl zones`` side by side with a bare MCP server on the same SDK (issue 18, item 14).

Every subject is a fresh process, run interleaved (one of each per round, N rounds, after one warm-up round that
is discarded), so machine load hits all of them alike; the report is medians and ratios to the baseline.

MCP startup, spoken to with raw JSON-RPC over the process's pipes (no client library in the measured path):
process spawn -> ``initialize`` answered -> ``notifications/initialized`` -> ``tools/list`` answered.

- ``bare``: a stdio server on the same SDK (``mcp.server.mcpserver.MCPServer``) with one trivial tool;
- ``gateway``: ``python -m mcp_client_gateway --backend local --data-dir <tmp>``;
- ``tpuctl mcp``: the console script agent CLIs are configured with (``mcp_config.json``), same flags.

``tpuctl zones`` (spawn to exit, ``--format json``), against baselines of ``python -c pass`` and
``python -c 'import mcp'`` (it imports ``mcp.server.mcpserver``, the SDK's server, as both servers do):

- ``zones (no stack)``: the local backend with no stack running (the shipped ``--data-dir var`` case);
- ``zones (Google path)``: the same with ``TPUCTL_PROJECT`` set, which takes the path every local call without
  a stack took before ``shared/adapters/local_stack.py``: the Google clients, then a missing-credentials error;
- ``zones (simulator)``: the local backend pointed at a TPU simulator this script starts in-process (what
  ``make up`` serves): live quota limits from its Cloud Quotas stand-in and usage from its TPU API.

Run: ``.venv/bin/python benchmarks/gateway_startup_bench.py [--rounds 9] [--json]``
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from localcloud.tpu_sim import SimServer, World  # noqa: E402

PYTHON = sys.executable
TPUCTL = str(Path(sys.executable).parent / "tpuctl")

BARE_SERVER = '''
from mcp.server.mcpserver import MCPServer

server = MCPServer("bare")


@server.tool()
def echo(text: str) -> str:
    """Return the text."""
    return text


server.run("stdio")
'''


@dataclass(frozen=True)
class Subject:
    name: str
    argv: Sequence[str]
    kind: str  # "mcp": spawn -> tools/list answered; "exit": spawn -> exit 0
    env: dict[str, str]


def _rpc(process: subprocess.Popen[bytes], message: dict[str, Any], *, answer: bool) -> dict[str, Any] | None:
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(json.dumps(message).encode() + b"\n")
    process.stdin.flush()
    if not answer:
        return None
    while True:
        line = process.stdout.readline()
        if not line:
            raise RuntimeError(f"the server closed stdout before answering {message['method']}")
        reply: dict[str, Any] = json.loads(line)
        if reply.get("id") == message["id"]:
            if "error" in reply:
                raise RuntimeError(f"{message['method']}: {reply['error']}")
            return reply


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_mcp(subject: Subject) -> tuple[float, int]:
    """Seconds from spawn to the ``tools/list`` answer, and how many tools it listed."""
    start = time.perf_counter()
    process = subprocess.Popen(
        subject.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=subject.env
    )
    try:
        init = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}
        _rpc(process, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init}, answer=True)
        _rpc(process, {"jsonrpc": "2.0", "method": "notifications/initialized"}, answer=False)
        listed = _rpc(process, {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}, answer=True)
        elapsed = time.perf_counter() - start
    finally:
        assert process.stdin is not None
        process.stdin.close()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        assert process.stdout is not None
        process.stdout.close()
    assert listed is not None
    return elapsed, len(listed["result"]["tools"])


def time_exit(subject: Subject) -> tuple[float, int]:
    """Seconds from spawn to a clean exit, and the bytes written on stdout."""
    start = time.perf_counter()
    done = subprocess.run(subject.argv, capture_output=True, env=subject.env, timeout=120, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{subject.name}: exit {done.returncode}: {done.stderr.decode()[-400:]}")
    return elapsed, len(done.stdout)


def subjects(work: Path, sim_url: str, sim_project: str) -> list[Subject]:
    base = {key: value for key, value in os.environ.items() if not key.startswith("TPUCTL_")}
    base["PYTHONPATH"] = str(REPO_ROOT)
    bare = work / "bare_server.py"
    bare.write_text(BARE_SERVER, encoding="utf-8")
    local = ["--backend", "local", "--data-dir", str(work / "var")]
    sim_env = {**base, "TPUCTL_TPU_ENDPOINT": sim_url, "TPUCTL_PROJECT": sim_project, "TPUCTL_CLOCK": "simulator"}
    zones = [TPUCTL, *local, "zones", "--format", "json"]
    return [
        Subject("bare MCP server (same SDK)", [PYTHON, str(bare)], "mcp", base),
        Subject("python -m mcp_client_gateway", [PYTHON, "-m", "mcp_client_gateway", *local], "mcp", base),
        Subject("tpuctl mcp", [TPUCTL, "mcp", *local], "mcp", base),
        Subject("python -c pass", [PYTHON, "-c", "pass"], "exit", base),
        Subject("python -c 'import mcp'", [PYTHON, "-c", "import mcp.server.mcpserver"], "exit", base),
        Subject("tpuctl zones (no stack)", zones, "exit", base),
        Subject("tpuctl zones (Google path)", zones, "exit", {**base, "TPUCTL_PROJECT": "tpuctl-local"}),
        Subject("tpuctl zones (simulator)", [TPUCTL, *local, "zones", "--format", "json"], "exit", sim_env),
    ]


def measure(rounds: int, emit: Callable[[str], None]) -> dict[str, Any]:
    world = World("quota-bound", time_scale=0.0)
    server = SimServer(world)
    sim_url = server.start()
    try:
        with tempfile.TemporaryDirectory(prefix="startup-bench-") as folder:
            runs = subjects(Path(folder), sim_url, world.scenario.project)
            times: dict[str, list[float]] = {subject.name: [] for subject in runs}
            cpu: dict[str, list[float]] = {subject.name: [] for subject in runs}
            sizes: dict[str, int] = {}
            for round_index in range(rounds + 1):  # round 0 warms caches and is dropped
                for subject in runs:
                    cpu_before = _children_cpu()
                    elapsed, size = (time_mcp if subject.kind == "mcp" else time_exit)(subject)
                    sizes[subject.name] = size
                    if round_index:
                        times[subject.name].append(elapsed)
                        cpu[subject.name].append(_children_cpu() - cpu_before)
                emit(f"round {round_index}/{rounds} done (load {os.getloadavg()[0]:.1f})")
    finally:
        server.stop()
    medians = {name: statistics.median(values) for name, values in times.items()}
    return {
        "rounds": rounds,
        "python": sys.version.split()[0],
        "load_1m_at_end": os.getloadavg()[0],
        "medians_s": medians,
        "cpu_medians_s": {name: statistics.median(values) for name, values in cpu.items()},
        "min_s": {name: min(values) for name, values in times.items()},
        "max_s": {name: max(values) for name, values in times.items()},
        "tools_listed_or_stdout_bytes": sizes,
    }


def ratios(result: dict[str, Any], key: str = "medians_s") -> list[tuple[str, float, str, float]]:
    """(subject, median, baseline, ratio) rows of wall (``medians_s``) or CPU (``cpu_medians_s``) medians."""
    medians: dict[str, float] = result[key]
    baseline_of = {
        "python -m mcp_client_gateway": "bare MCP server (same SDK)",
        "tpuctl mcp": "bare MCP server (same SDK)",
        "python -c 'import mcp'": "python -c pass",
        "tpuctl zones (no stack)": "python -c 'import mcp'",
        "tpuctl zones (Google path)": "python -c 'import mcp'",
        "tpuctl zones (simulator)": "python -c 'import mcp'",
    }
    rows = []
    for name, median in medians.items():
        base = baseline_of.get(name)
        rows.append((name, median, base or "-", median / medians[base] if base else 1.0))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=9, help="measured rounds (one more warm-up round runs first)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    result = measure(args.rounds, emit=lambda line: print(line, file=sys.stderr, flush=True))
    if args.json:
        print(json.dumps({**result, "ratios": ratios(result), "cpu_ratios": ratios(result, "cpu_medians_s")}, indent=2))
        return 0
    print(f"{args.rounds} interleaved rounds, Python {result['python']}, load {result['load_1m_at_end']:.1f}")
    print(f"{'subject':30} {'wall':>7} {'min':>6} {'max':>6} {'wall ratio':>10} {'cpu':>7} {'cpu ratio':>9}  to")
    cpu_rows = {row[0]: row for row in ratios(result, "cpu_medians_s")}
    for name, median, base, ratio in ratios(result):
        low, high = result["min_s"][name], result["max_s"][name]
        cpu_median, cpu_ratio = cpu_rows[name][1], cpu_rows[name][3]
        against = base if base != "-" else "(baseline)"
        print(
            f"{name:30} {median:6.3f}s {low:5.2f}s {high:5.2f}s {ratio:9.2f}x {cpu_median:6.3f}s {cpu_ratio:8.2f}x  "
            f"{against}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What a debug bundle costs a heal: the capture the node agent runs before every restart, on a real vLLM on CPU.

Run: ``.venv/bin/python -m benchmarks.debug_bundle_bench [--rounds 7]`` (needs ``make setup-local``).

One vLLM 0.32.0 server on CPU in production's process layout (API server, EngineCore in a child process), the
tiny local model. Side by side, in one run:

* ``capture, engine running``: ``capture_bundle`` + ``encode_bundle`` from the API server's pid (py-spy on every
  process of the tree, 200 log lines, ``/metrics``, tpu-info absent, no metadata server), the engine idle;
* ``capture, engine frozen``: the same with the EngineCore stopped (SIGSTOP), as before the monitor's restart of a
  STALLED engine; thawed after each round;
* ``vLLM start to /health``: what the restart that follows costs at least (a fresh server, same model), measured
  once per run, so the capture reads as a share of the heal.

Printed: median and spread per case, the bundle's size and the steps' medians, and the ratio of a frozen capture
to the start. Nothing here is asserted: the figures go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from localcloud.vllm_cpu import VllmCpuTier, VllmProcess, default_cache_dir, free_loopback_port, start_vllm
from node_agent.forensics import ForensicsSources, capture_bundle, encode_bundle, find_py_spy
from shared.ports import ContainerState

START_TIMEOUT_S = 300.0


class ServerAsContainer:
    """The server as the node agent's ``ServingContainer`` sees it (a capture never restarts it)."""

    def __init__(self, server: VllmProcess) -> None:
        self.server = server

    def inspect(self) -> ContainerState:
        return ContainerState(name="tpuctl-vllm", status="running", started_at=None, pid=self.server.pid)

    def restart(self, timeout_s: float) -> ContainerState:
        raise RuntimeError("the benchmark never restarts through the container")

    def reconfigure(self, overrides: Mapping[str, Any], timeout_s: float) -> ContainerState:
        raise RuntimeError("the benchmark never reconfigures the container")

    def tail(self, lines: int) -> list[str]:
        return self.server.log_tail(lines).splitlines()


def _engine_core(root: int) -> int:
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == root and "EngineCore" in (proc / "cmdline").read_text():
                return int(proc.name)
        except (OSError, ValueError, IndexError):
            continue
    raise RuntimeError(f"no EngineCore under pid {root}")


def _start(tier: VllmCpuTier, work: Path, name: str) -> tuple[VllmProcess, float]:
    began = time.monotonic()
    server = start_vllm(
        tier,
        port=free_loopback_port(),
        api_key_file=None,
        log_path=work / f"{name}.log",
        served_model_name="tiny-llama",
        engine_in_subprocess=True,
    )
    if not server.wait_healthy(START_TIMEOUT_S):
        server.stop()
        raise RuntimeError(f"vLLM did not become healthy in {START_TIMEOUT_S:.0f} s: {server.log_tail(20)}")
    return server, time.monotonic() - began


def _capture(sources: ForensicsSources) -> tuple[float, int, dict[str, Any]]:
    began = time.perf_counter()
    bundle = capture_bundle(
        sources, deployment_id="bench", bundle_id="b", reason="bench", node="bench", captured_at=datetime.now(UTC)
    )
    size = len(encode_bundle(bundle))
    return time.perf_counter() - began, size, bundle


def _rounds(sources: ForensicsSources, engine: int, rounds: int, frozen: bool) -> dict[str, Any]:
    seconds: list[float] = []
    sizes: list[int] = []
    steps: dict[str, list[float]] = {}
    for _ in range(rounds):
        if frozen:
            os.kill(engine, signal.SIGSTOP)
        try:
            took, size, bundle = _capture(sources)
        finally:
            if frozen:
                os.kill(engine, signal.SIGCONT)
        seconds.append(took)
        sizes.append(size)
        for step, value in (bundle.get("timings_s") or {}).items():
            steps.setdefault(step, []).append(float(value))
        stopped = [p for p in bundle["processes"] if str(p.get("state", "")).startswith("T")]
        if frozen and not stopped:
            raise RuntimeError("the frozen engine was not seen stopped")
        time.sleep(0.5)
    return {
        "median_s": statistics.median(seconds),
        "min_s": min(seconds),
        "max_s": max(seconds),
        "bundle_bytes": int(statistics.median(sizes)),
        "steps_median_s": {step: statistics.median(values) for step, values in steps.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    tier = VllmCpuTier(default_cache_dir())
    reason = tier.unavailable_reason()
    if reason:
        print(f"the vLLM CPU tier is not here: {reason}", file=sys.stderr)
        return 2
    py_spy = find_py_spy()
    with tempfile.TemporaryDirectory(prefix="bundle-bench-") as folder:
        work = Path(folder)
        server, start_s = _start(tier, work, "measured")
        try:
            sources = ForensicsSources(
                container=ServerAsContainer(server),
                vllm_url=server.base_url,
                api_key=None,
                metadata_url=None,
                py_spy=py_spy,
            )
            engine = _engine_core(server.pid)
            running = _rounds(sources, engine, args.rounds, frozen=False)
            frozen = _rounds(sources, engine, args.rounds, frozen=True)
        finally:
            server.stop()
        second, second_start_s = _start(tier, work, "restart")
        second.stop()
    result = {
        "rounds": args.rounds,
        "py_spy": str(py_spy),
        "capture_engine_running": running,
        "capture_engine_frozen": frozen,
        "vllm_start_to_health_s": [round(start_s, 2), round(second_start_s, 2)],
        "frozen_capture_share_of_start": frozen["median_s"] / min(start_s, second_start_s),
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

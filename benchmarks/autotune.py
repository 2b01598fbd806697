"""Auto-tune on the real vLLM on CPU, through the production path (issue 22, item 5).

The local cloud runs with ``TPUCTL_BACKEND=gcp`` (the functions, the real Google clients, the stand-ins); the TPU VM
is a VM twin whose serving container is vLLM on CPU with the tiny model. One deployment is created and, once it
serves, one ``tpuctl tune`` (a benchmark run with ``tune_trials``) goes the way a user's would: the gateway
publishes it, the benchmark function hands it to the node agent, the agent recreates the vLLM container with each
trial's flags and runs the open-loop max-rate-at-the-SLO search against it, then restores the planned flags; the
controller checks the result and keeps the verified preset. The baseline (the planned flags) and every trial are
measured in the same run, on the same VM, minutes apart.

Usage::

    .venv/bin/python benchmarks/autotune.py --trials 6 --slo-ttft-ms 500 --slo-tpot-ms 100
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from localcloud.demo import DemoSpec, LocalDemo
from localcloud.runner import LocalCloud, LocalCloudOptions
from localcloud.vllm_cpu import VllmCpuTier, default_cache_dir
from mcp_client_gateway.composition import build_ports
from mcp_client_gateway.core import GatewayCore, GatewayError
from shared.domain.serving_overrides import describe_overrides

ZONES = ("us-east5-a", "us-east5-b")
BOOT_TIMEOUT_S = 900.0
TUNE_TIMEOUT_S = 7200.0


def tune_request(args: argparse.Namespace) -> dict[str, Any]:
    """The benchmark request of the tune: the workload, its lengths and the SLO every trial is judged by."""
    request: dict[str, Any] = {
        "tune_trials": args.trials,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "slo_ttft_ms": args.slo_ttft_ms,
        "slo_tpot_ms": args.slo_tpot_ms,
        "workload": args.workload,
        "num_prompts": args.probe_requests,  # each probe of a trial's search: at least this many requests
        "request_rate": [args.start_rate, args.max_rate],  # where each trial's search starts, and its ceiling
    }
    if args.workload == "shared_prefix":
        request["prefix_len"] = args.input_len // 2
    return request


def wait_for_run(gateway: GatewayCore, run_id: str) -> dict[str, Any]:
    """The run's stored result once the node reported it (completed or failed)."""
    deadline = time.monotonic() + TUNE_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            view = gateway.get_benchmark(run_id)
        except GatewayError as exc:  # published, not recorded by the benchmark function yet
            if exc.code != "not_found":
                raise
            time.sleep(5.0)
            continue
        if view.status in ("completed", "failed"):
            return view.model_dump(mode="json")
        time.sleep(5.0)
    raise TimeoutError(f"the tune {run_id} did not finish within {TUNE_TIMEOUT_S:.0f} s")


def trial_lines(view: dict[str, Any]) -> list[str]:
    """One line per trial (its flags and max rate at the SLO), then the best and its gain over the baseline."""
    result = view.get("result") or {}
    tune = result.get("tune") or {}
    lines = [f"status {view.get('status')}; {len(tune.get('trials', []))} trial(s)"]
    lines.append(f"{'#':>2} {'max rate at SLO (req/s)':>24} {'lowest failing':>15}  flags")
    for index, trial in enumerate(tune.get("trials", [])):
        lines.append(
            f"{index:>2} {trial.get('max_rate_at_slo')!s:>24} {trial.get('lowest_failing_rate')!s:>15}  "
            f"{describe_overrides(trial.get('overrides') or {})} ({trial.get('stop_reason')})"
        )
    gain = tune.get("gain")
    shown = f"{gain:.2f}x" if isinstance(gain, int | float) else "none"
    lines.append(f"best: trial {tune.get('best')}, gain over the baseline {shown}")
    preset = result.get("preset")
    if preset:
        lines.append(f"verified preset: {json.dumps(preset, default=str)}")
    return lines


def one_tune(tier: VllmCpuTier, args: argparse.Namespace) -> dict[str, Any]:
    """Deploy on a fresh local cloud, tune once, tear down; the run's stored view."""
    with tempfile.TemporaryDirectory(prefix="autotune-bench-") as folder:
        options = LocalCloudOptions(data_dir=Path(folder), cache_dir=tier.cache_dir, time_scale=60.0, gcp=True)
        cloud = LocalCloud(options)
        try:
            cloud.start()
            for zone in ZONES:
                cloud.world.set_capacity(zone, "spot", 8)
            spec = DemoSpec(
                deployment_id="tune",
                model=args.model,
                accelerator=args.accelerator,
                zones=ZONES,
                tiers=("spot",),
                hedge=1,
                valid_until_minutes=None,
            )
            gateway = GatewayCore(build_ports(cloud.settings))
            demo = LocalDemo(cloud, gateway, spec, emit=lambda line: None)
            demo.deploy()
            demo.wait_until_serving(BOOT_TIMEOUT_S)
            began = time.monotonic()
            accepted = gateway.run_benchmark(spec.deployment_id, benchmark=tune_request(args))
            view = wait_for_run(gateway, accepted.command_id)
            view["wall_s"] = round(time.monotonic() - began, 1)
            demo.teardown(BOOT_TIMEOUT_S)
            return view
        finally:
            cloud.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--slo-ttft-ms", type=float, default=500.0)
    parser.add_argument("--slo-tpot-ms", type=float, default=100.0)
    parser.add_argument("--workload", choices=("random", "shared_prefix", "multi_turn"), default="random")
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--probe-requests", type=int, default=24)
    parser.add_argument("--start-rate", type=float, default=1.0)
    parser.add_argument("--max-rate", type=float, default=256.0)
    parser.add_argument("--model", default="gemma-4-31b")  # the twin serves its tiny model under this plan
    parser.add_argument("--accelerator", default="v6e-4")
    parser.add_argument("--json", type=Path, help="also write the run's stored view here")
    args = parser.parse_args(argv)
    tier = VllmCpuTier(default_cache_dir())
    if tier.unavailable_reason():
        print(tier.unavailable_reason(), file=sys.stderr)
        return 2
    view = one_tune(tier, args)
    print("\n".join(trial_lines(view)))
    print(f"tune wall time {view['wall_s']} s")
    if args.json:
        args.json.write_text(json.dumps(view, indent=2, default=str), encoding="utf-8")
    return 0 if view.get("status") == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())

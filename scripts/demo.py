"""``make demo``: the whole product on this machine, no Google Cloud account, start to clean bill.

Starts the local cloud (``localcloud.runner``) with the ``scarce-v6e`` scenario at 60x virtual time, then drives
it through the gateway core exactly as the MCP server would: a deployment of Gemma 4 31B on a v6e-4, the capacity
hunt across zones and tiers, the boot of a real vLLM (on CPU, tiny stand-in weights), SERVING, one timed query,
a short benchmark, the teardown, the invariant report and a one-screen summary. Exit status 0 only when every
step finished and every invariant held.

Usage: ``python scripts/demo.py [--time-scale 60] [--data-dir DIR] [--keep]`` (``make demo`` builds the vLLM venv
and the tiny model first).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from localcloud.demo import DemoSpec, LocalDemo, StepFailed
from localcloud.runner import LocalCloud, LocalCloudOptions
from localcloud.vllm_cpu import VllmCpuTier, default_cache_dir
from mcp_client_gateway.composition import build_ports
from mcp_client_gateway.core import GatewayCore, GatewayError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/demo.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--time-scale", type=float, default=60.0, help="virtual seconds per wall second")
    parser.add_argument("--data-dir", type=Path, default=None, help="keep the run's state and logs here")
    parser.add_argument("--keep", action="store_true", help="keep the temporary data folder (logs, databases)")
    parser.add_argument("--cache-dir", type=Path, default=None, help="where `make vllm-env tiny-model` built the tier")
    parser.add_argument("--timeout", type=float, default=600.0, help="wall seconds allowed for each long step")
    parser.add_argument("--emulators", action="store_true", help="store and bus on the Firestore/Pub/Sub emulators")
    args = parser.parse_args(argv)

    began = time.monotonic()
    tier = VllmCpuTier(args.cache_dir or default_cache_dir())
    reason = tier.unavailable_reason()
    if reason:
        print(f"demo: the vLLM CPU tier is not ready: {reason}", file=sys.stderr)
        return 2
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="tpuctl-demo-"))
    print(f"tpuctl local cloud demo: data and logs in {data_dir}", flush=True)
    cloud = LocalCloud(
        LocalCloudOptions(
            data_dir=data_dir,
            scenario="scarce-v6e",
            time_scale=args.time_scale,
            cache_dir=tier.cache_dir,
            emulators=args.emulators,
        )
    )
    ok = False
    demo: LocalDemo | None = None
    report = applied = None
    try:
        cloud.start()
        print(f"stack up in {time.monotonic() - began:.1f} s: simulator {cloud.sim_url}, functions "
              f"{', '.join(sorted(cloud.functions))}, time x{args.time_scale:g}", flush=True)  # fmt: skip
        core = GatewayCore(build_ports(cloud.settings))
        demo = LocalDemo(cloud, core, DemoSpec(), emit=lambda line: print(line, flush=True))
        demo.save_canary_token()
        demo.deploy()
        demo.wait_until_serving(args.timeout)
        demo.ask()
        demo.run_benchmark(args.timeout)
        for line in demo.benchmark_lines():
            print(line)
        demo.teardown(args.timeout)
        report, applied = demo.check()
        ok = report.ok and all(count == 1 for count in applied.values())
    except (StepFailed, GatewayError, RuntimeError) as exc:
        print(f"demo: {exc}", file=sys.stderr)
        if demo is not None:
            with_report = demo.check()
            report, applied = with_report
    except KeyboardInterrupt:
        print("demo: interrupted; stopping the stack", file=sys.stderr)
    finally:
        stopped = cloud.stop()
    if demo is not None and report is not None and applied is not None:
        for line in demo.summary_lines(report, applied, stopped, time.monotonic() - began):
            print(line)
    ok = ok and not stopped.survivors
    if args.data_dir is None and not args.keep and ok:
        shutil.rmtree(data_dir, ignore_errors=True)
    elif not ok:
        print(f"demo: logs kept in {data_dir / 'logs'}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

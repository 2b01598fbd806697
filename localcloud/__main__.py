"""``python -m localcloud up``: run the whole stack on this machine until Ctrl-C (or SIGTERM).

It publishes how to reach the stack at a stable place, ``var/localcloud/current.json`` (the run's data folder, the
simulator's endpoint and clock; ``shared/adapters/local_stack.py``), which a gateway or CLI started with
``--backend local --data-dir var`` (the shipped ``mcp_config.json``) reads, and removes it on the way out. It
also prints the ``TPUCTL_*`` variables that point the MCP gateway and the ``tpuctl`` CLI at the stack, then one
line per deployment phase change. Ctrl-C stops everything it started and says whether anything survived.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType

from localcloud.progress import ProgressTracker
from localcloud.runner import LocalCloud, LocalCloudOptions
from localcloud.tpu_sim import ScenarioError, available_scenarios
from localcloud.vllm_cpu import REPO_ROOT, default_cache_dir
from mcp_client_gateway.composition import build_ports
from mcp_client_gateway.core import GatewayCore
from mcp_client_gateway.status_page.server import StatusPage
from shared.adapters.local_stack import connection_path, publish, withdraw
from shared.logging import configure_logging


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m localcloud", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="run the local cloud until Ctrl-C")
    up.add_argument(
        "--scenario",
        default="scarce-v6e",
        help=f"simulator scenario ({', '.join(available_scenarios())}) or a .yaml/.json path",
    )
    up.add_argument("--time-scale", type=float, default=60.0, help="virtual seconds per wall second (default 60)")
    up.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="state, bus, secrets and logs (default: a new var/localcloud/run-<time> folder)",
    )
    up.add_argument(
        "--publish-root",
        type=Path,
        default=REPO_ROOT / "var",
        help="publish how to reach the stack at <this>/localcloud/current.json (default: the checkout's var, "
        "where `--backend local --data-dir var` finds it)",
    )
    up.add_argument("--sim-port", type=int, default=8471, help="the TPU simulator's loopback port (0 = any)")
    up.add_argument("--cache-dir", type=Path, default=None, help="where `make vllm-env tiny-model` built the tier")
    up.add_argument("--no-vllm", action="store_true", help="do not boot vLLM on READY nodes")
    up.add_argument(
        "--emulators", action="store_true", help="store and bus on the Firestore and Pub/Sub emulators (gcloud)"
    )
    up.add_argument(
        "--gcp",
        action="store_true",
        help="the production-path twin: TPUCTL_BACKEND=gcp everywhere, on the emulators and local Google API stand-ins",
    )
    up.add_argument(
        "--twin-compile",
        action="store_true",
        help="vLLM on CPU compiles instead of running eagerly (slower boots; what tpuctl prewarm needs to fill)",
    )
    up.add_argument("--seed", type=int, default=None, help="override the scenario's RNG seed")
    up.add_argument("--log-level", default="WARNING", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    up.add_argument(
        "--ui-port", type=int, default=8765, help="the status page's loopback port (0: any free one; -1: no page)"
    )
    return parser


def _announce(cloud: LocalCloud, args: argparse.Namespace) -> Path:
    """Print how to reach the stack and publish it at the stable place; the connection file's path."""
    print(f"local cloud up: scenario {cloud.scenario.name!r}, time x{args.time_scale:g}, data {cloud.data_dir}")
    for group in cloud.reaped_at_start:
        print(f"  stopped {group.what} (process group {group.pgid}), left running by a killed run (pid {group.owner})")
    if cloud.fleet is None:
        print("  nodes do not boot:", cloud.no_boot_reason)
    print("point the gateway and the CLI at it with:\n")
    for name, value in cloud.client_env().items():
        print(f"  export {name}={value}")
    print("\n  then e.g.  .venv/bin/tpuctl status   or   .venv/bin/python -m mcp_client_gateway (MCP over stdio)\n")
    connection = connection_path(args.publish_root)
    try:
        publish(connection, cloud.client_env(), pid=os.getpid(), started_at=datetime.now(UTC).isoformat())
    except OSError as exc:
        print(f"localcloud: could not publish {connection} ({exc}); use the exports above", file=sys.stderr)
    else:
        print(f"or with `--backend local --data-dir {args.publish_root}` (the shipped mcp_config.json; it reads")
        print(f"  {connection}, removed when the stack stops)\n")
    print("Ctrl-C stops the stack.", flush=True)
    return connection


def _status_page(cloud: LocalCloud, port: int) -> StatusPage | None:
    """The status page (``tpuctl ui``) over the stack's own store, when ``port`` is not -1 and is free."""
    if port < 0:
        return None
    try:
        page = StatusPage(GatewayCore(build_ports(cloud.settings)), port=port)
    except OSError as exc:
        print(f"localcloud: no status page on port {port} ({exc.strerror}); run `tpuctl ui --port 0`", file=sys.stderr)
        return None
    print(f"status page: {page.start()}", flush=True)
    return page


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    configure_logging(args.log_level).setLevel(args.log_level)  # the runner's own INFO lines go to its log file
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    data_dir = args.data_dir or REPO_ROOT / "var" / "localcloud" / f"run-{stamp}"
    try:
        options = LocalCloudOptions(
            data_dir=data_dir,
            scenario=args.scenario,
            time_scale=args.time_scale,
            cache_dir=args.cache_dir or default_cache_dir(),
            sim_port=args.sim_port,
            boot_nodes=not args.no_vllm,
            emulators=args.emulators,
            gcp=args.gcp,
            twin_compile=args.twin_compile,
            seed=args.seed,
            log_level="INFO",
        )
        cloud = LocalCloud(options)
    except (ScenarioError, ValueError) as exc:
        print(f"localcloud: {exc}", file=sys.stderr)
        return 2
    stopping = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        cloud.start()
    except (RuntimeError, OSError) as exc:
        print(f"localcloud: could not start: {exc}", file=sys.stderr)
        report = cloud.stop()
        return 1 if not report.survivors else 3
    connection = _announce(cloud, args)
    page = _status_page(cloud, args.ui_port)
    try:
        tracker = ProgressTracker(cloud.store, cloud.fleet)
        while not stopping.wait(1.0):
            for line in tracker.poll(cloud.world.now()):
                print(line.render(), flush=True)
    finally:  # also when following progress fails: nothing started is left running, nothing stale published
        withdraw(connection, pid=os.getpid())
        if page is not None:
            page.stop()
        print("stopping...", flush=True)
        report = cloud.stop()
    if report.survivors:
        print(f"localcloud: process groups still alive: {report.survivors}", file=sys.stderr)
        return 3
    print(f"stopped {report.stopped_groups} process group(s) in {report.wall_s:.1f} s; nothing left running")
    return 0


if __name__ == "__main__":
    logging.captureWarnings(True)
    sys.exit(main())

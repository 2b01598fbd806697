"""Boot stages of a VM twin, read from its guest attributes, on the embedded default and the production-path twin.

Each run starts the local cloud (``--mode embedded``: SQLite and the local bus; ``--mode gcp``: every process on
``TPUCTL_BACKEND=gcp`` against the emulators and stand-ins), gives one zone spot capacity, deploys a preset and
polls the node's guest attributes (``tpuctl/phase``, what the startup script writes) every 50 ms until vLLM
serves. Reported per mode, medians over the runs: wall seconds from the create to the VM powering on, from power
on to each boot stage's first appearance, to the monitor's SERVING, and the whole command-to-SERVING time; plus
the end-to-end wall time of a run (start, deploy, serve, query, delete, stop).

Usage::

    .venv/bin/python benchmarks/vm_twin_boot.py --runs 3 --mode embedded --mode gcp
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from localcloud.demo import DemoSpec, LocalDemo
from localcloud.runner import LocalCloud, LocalCloudOptions
from localcloud.vllm_cpu import VllmCpuTier, default_cache_dir
from mcp_client_gateway.composition import build_ports
from mcp_client_gateway.core import GatewayCore
from shared.domain.models import Phase

ZONE = "us-east5-a"
STAGES = ("booting", "secrets", "image", "node-agent", "weights", "starting", "compiling", "serving")


def one_run(mode: str, tier: VllmCpuTier) -> dict[str, float]:
    """Wall seconds of each milestone of one deployment, from the create."""
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="twin-boot-") as folder:
        cloud = LocalCloud(
            LocalCloudOptions(data_dir=Path(folder), cache_dir=tier.cache_dir, time_scale=60.0, gcp=mode == "gcp")
        )
        try:
            cloud.start()
            cloud.world.set_capacity(ZONE, "spot", 8)
            spec = DemoSpec(deployment_id="boot", zones=(ZONE,), tiers=("spot",), hedge=1, valid_until_minutes=None)
            demo = LocalDemo(cloud, GatewayCore(build_ports(cloud.settings)), spec, emit=lambda line: None)
            created = time.monotonic()
            demo.deploy()
            seen = _watch_boot(cloud, demo, created)
            demo.ask(max_tokens=8)
            demo.teardown(240)
        finally:
            cloud.stop()
    seen["run"] = time.monotonic() - began
    return seen


def _watch_boot(cloud: LocalCloud, demo: LocalDemo, created: float) -> dict[str, float]:
    seen: dict[str, float] = {}
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        vms = cloud.fleet.vms() if cloud.fleet else []
        if vms and "power-on" not in seen:
            seen["power-on"] = time.monotonic() - created
        for vm in vms:
            try:
                attributes = {key: value for ns, key, value in cloud.world.guest_attributes(vm.zone, vm.node_id)}
            except KeyError:
                continue
            phase = attributes.get("phase")
            if phase and phase not in seen:
                seen[phase] = time.monotonic() - created
        record = cloud.store.get_deployment(demo.spec.deployment_id)
        if record is not None and record.status.phase is Phase.SERVING:
            seen["SERVING"] = time.monotonic() - created
            return seen
        if record is not None and record.status.phase is Phase.FAILED:
            raise RuntimeError(f"the deployment FAILED: {record.status.message}")
        time.sleep(0.05)
    raise RuntimeError("no SERVING within 600 s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--mode", action="append", choices=("embedded", "gcp"), default=[])
    args = parser.parse_args(argv)
    tier = VllmCpuTier(default_cache_dir())
    if tier.unavailable_reason():
        print(tier.unavailable_reason(), file=sys.stderr)
        return 2
    modes = args.mode or ["embedded", "gcp"]
    results: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    for _ in range(args.runs):
        for mode in modes:  # interleaved, so both modes see the same machine load
            results[mode].append(one_run(mode, tier))
    columns = ["power-on", *STAGES, "SERVING", "run"]
    print("| milestone (wall s from the create, median) | " + " | ".join(modes) + " |")
    print("|---|" + "---|" * len(modes))
    for column in columns:
        cells = []
        for mode in modes:
            values = [run[column] for run in results[mode] if column in run]
            cells.append(f"{statistics.median(values):.1f}" if values else "-")
        print(f"| {column} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

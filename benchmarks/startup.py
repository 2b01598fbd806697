"""Time to serve in the VM twin, cold and warm, each stage measured on the real pipeline (issue 20, item 5).

Like ``vllm bench startup``, but over the whole boot and on the production path: the local cloud runs with
``TPUCTL_BACKEND=gcp`` (the functions, the real Google clients, the stand-ins), every TPU VM runs its rendered
startup script in a VM twin, and vLLM on CPU compiles (``LocalCloudOptions.twin_compile``: no ``--enforce-eager``,
so it keeps a torch Inductor cache under the VM's vLLM cache directory, the CPU counterpart of the JAX cache).
Each run deploys once and times three boots of the same deployment, each read from the guest attribute
``tpuctl/stages`` the script writes (image pull, weights with their source, engine with the compile cache's state,
the first one-token completion):

* ``cold``: the first boot; an empty regional weights cache, an empty disk (weights from the Hub stand-in);
* ``replacement``: the boot after a spot preemption, on a new VM in the same region (weights from the region's
  Cloud Storage cache, which the first boot filled; the compile cache is on the lost disk: cold);
* ``reboot``: the guest of the serving VM restarted on the same disk (weights and compile cache both kept): what a
  host-maintenance reboot gets. The monitor's Scheduler job is paused meanwhile (as an SRE would during
  maintenance) so that its healing does not restart the engine the boot is timing;
* ``prewarm``: a ``tpuctl prewarm`` of the same plan and slice, a builder VM (the builder service account, no
  proxy): it compiles, answers one token on its socket, fills the region's shared compile cache (``compile_fill``)
  and is deleted;
* ``restored``: the boot after a second spot preemption, on a new VM again, now with the compile cache restored
  from the bucket the prewarm filled (``compile_restore``): against ``replacement`` (the same boot without it),
  what the shared compile cache gives.

``trigger -> first token`` is wall time from the command (create, preemption, reboot) until the VM reported its
first token; the stages are on the VM's own clock. Medians over the runs; ratios against ``cold``.

Usage::

    .venv/bin/python benchmarks/startup.py --runs 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from localcloud.demo import DemoSpec, LocalDemo
from localcloud.runner import LocalCloud, LocalCloudOptions
from localcloud.vllm_cpu import VllmCpuTier, default_cache_dir
from mcp_client_gateway.composition import build_ports
from mcp_client_gateway.core import GatewayCore
from shared.domain.boot_stages import STAGE_NAMES, parse_stages
from shared.domain.models import BootStages

SERVING_STAGES = ("image", "weights", "engine", "first_token")  # every serving boot has these
ZONES = ("us-east5-a", "us-east5-b")  # one region: the replacement lands where the first boot filled the cache
MONITOR_JOB = "tpuctl-monitor-tick"
KINDS = ("cold", "replacement", "reboot", "prewarm", "restored")
BOOT_TIMEOUT_S = 900.0
Reading = tuple[str, tuple[int, BootStages]] | None  # (node, (boot stamp, stages)) once a first token is reported


@dataclass(frozen=True)
class Boot:
    """One timed boot: what the VM reported, and wall seconds from the trigger to its first token."""

    kind: str
    node: str
    stages: BootStages
    trigger_to_first_token_s: float


@dataclass
class Table:
    """Medians per boot kind and stage, for the markdown table."""

    boots: dict[str, list[Boot]] = field(default_factory=dict)

    def add(self, boot: Boot) -> None:
        self.boots.setdefault(boot.kind, []).append(boot)

    def median(self, kind: str, stage: str) -> float | None:
        values = [boot.stages.seconds[stage] for boot in self.boots.get(kind, []) if stage in boot.stages.seconds]
        return statistics.median(values) if values else None

    def trigger_median(self, kind: str) -> float | None:
        values = [boot.trigger_to_first_token_s for boot in self.boots.get(kind, [])]
        return statistics.median(values) if values else None

    def lines(self) -> list[str]:
        rows = [*self._stage_rows(), "stages total", "trigger -> first token (wall)"]
        out = [
            "| stage (median s) | " + " | ".join(KINDS) + " | " + " | ".join(f"{k} / cold" for k in KINDS[1:]) + " |"
        ]
        out.append("|---|" + "---|" * (2 * len(KINDS) - 1))
        for row in rows:
            cells = [self._cell(kind, row) for kind in KINDS]
            ratios = [self._ratio(kind, row) for kind in KINDS[1:]]
            out.append(f"| {row.replace('_', ' ')} | " + " | ".join(cells + ratios) + " |")
        pad = " |" * len(KINDS)  # the ratio columns stay empty
        out.append("| weights source | " + " | ".join(self._sources(kind, "weights") for kind in KINDS) + pad)
        out.append("| compile cache | " + " | ".join(self._sources(kind, "compile") for kind in KINDS) + pad)
        shared = (
            boot.stages.compile_restore or boot.stages.compile_fill
            for kind in KINDS
            for boot in self.boots.get(kind, [])
        )
        if any(shared):
            out.append("| shared compile cache | " + " | ".join(self._sources(kind, "shared") for kind in KINDS) + pad)
        out.append(f"runs: {', '.join(f'{kind} {len(self.boots.get(kind, []))}' for kind in KINDS)}")
        return out

    def _stage_rows(self) -> list[str]:
        """Every stage a serving boot has, and the compile cache's restore where any boot had one."""
        seen = {stage for boots in self.boots.values() for boot in boots for stage in boot.stages.seconds}
        return [stage for stage in STAGE_NAMES if stage in SERVING_STAGES or stage in seen]

    def _value(self, kind: str, row: str) -> float | None:
        if row == "stages total":
            parts = {stage: self.median(kind, stage) for stage in self._stage_rows()}
            if any(parts[stage] is None for stage in SERVING_STAGES):
                return None
            return sum(part for part in parts.values() if part is not None)
        if row.startswith("trigger"):
            return self.trigger_median(kind)
        return self.median(kind, row)

    def _cell(self, kind: str, row: str) -> str:
        value = self._value(kind, row)
        return "-" if value is None else f"{value:.1f}"

    def _ratio(self, kind: str, row: str) -> str:
        value, cold = self._value(kind, row), self._value("cold", row)
        return "-" if value is None or not cold else f"{value / cold:.2f}"

    def _sources(self, kind: str, what: str) -> str:
        def state(stages: BootStages) -> str | None:
            if what == "shared":
                return stages.compile_restore or stages.compile_fill
            return stages.weights_source if what == "weights" else stages.compile_cache

        found = {state(boot.stages) or "?" for boot in self.boots.get(kind, [])}
        return "/".join(sorted(found)) or "-"


class GuestAttributes(Protocol):
    def guest_attributes(self, zone: str, node_id: str, query_path: str = "") -> list[tuple[str, str, str]]: ...


def reported_stages(
    world: GuestAttributes, zone: str, node: str, *, after_boot: int = 0
) -> tuple[int, BootStages] | None:
    """The node's stage line once it holds a first token, for a boot stamped later than ``after_boot``."""
    try:
        attributes = {key: value for _ns, key, value in world.guest_attributes(zone, node)}
    except KeyError:
        return None
    stamp = attributes.get("boot", "")
    if not stamp.isdigit() or int(stamp) <= after_boot:
        return None
    stages = parse_stages(attributes.get("stages", ""), int(stamp))
    return (int(stamp), stages) if stages is not None and "first_token" in stages.seconds else None


def wait_for(read: Callable[[], Reading], what: str) -> tuple[str, int, BootStages]:
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    while time.monotonic() < deadline:
        found = read()
        if found is not None:
            node, (stamp, stages) = found
            return node, stamp, stages
        time.sleep(0.2)
    raise RuntimeError(f"{what}: no first token within {BOOT_TIMEOUT_S:.0f} s")


def serving_vm(
    cloud: LocalCloud, exclude: Sequence[str] = ()
) -> Callable[[], tuple[str, tuple[int, BootStages]] | None]:
    def read() -> tuple[str, tuple[int, BootStages]] | None:
        for vm in cloud.fleet.vms() if cloud.fleet else []:
            if vm.node_id not in exclude and (found := reported_stages(cloud.world, vm.zone, vm.node_id)) is not None:
                return vm.node_id, found
        return None

    return read


def prewarmed(cloud: LocalCloud, exclude: Sequence[str]) -> Callable[[], Reading]:
    """A reader of the builder VM once it reported its compile cache fill."""

    def read() -> Reading:
        found = serving_vm(cloud, exclude)()
        return found if found is not None and "compile_fill" in found[1][1].seconds else None

    return read


def rebooted(cloud: LocalCloud, zone: str, node: str, stamp: int) -> Callable[[], Reading]:
    """A reader of ``node``'s next boot (stamped after ``stamp``) once it reported a first token."""

    def read() -> Reading:
        found = reported_stages(cloud.world, zone, node, after_boot=stamp)
        return None if found is None else (node, found)

    return read


def one_run(tier: VllmCpuTier, compile_model: bool) -> list[Boot]:
    """Deploy, preempt, reboot: three timed boots of one deployment on a fresh local cloud."""
    with tempfile.TemporaryDirectory(prefix="startup-bench-") as folder:
        options = LocalCloudOptions(
            data_dir=Path(folder), cache_dir=tier.cache_dir, time_scale=60.0, gcp=True, twin_compile=compile_model
        )
        cloud = LocalCloud(options)
        try:
            cloud.start()
            for zone in ZONES:
                cloud.world.set_capacity(zone, "spot", 8)
            spec = DemoSpec(deployment_id="startup", zones=ZONES, tiers=("spot",), hedge=1, valid_until_minutes=None)
            demo = LocalDemo(cloud, GatewayCore(build_ports(cloud.settings)), spec, emit=lambda line: None)
            return _boots(cloud, demo)
        finally:
            cloud.stop()


def _boots(cloud: LocalCloud, demo: LocalDemo) -> list[Boot]:
    assert cloud.fleet is not None
    began = time.monotonic()
    demo.deploy()
    node, _stamp, stages = wait_for(serving_vm(cloud), "cold boot")
    boots = [Boot("cold", node, stages, time.monotonic() - began)]
    demo.wait_until_serving(BOOT_TIMEOUT_S)

    began = time.monotonic()
    demo.preempt()
    node, stamp, stages = wait_for(serving_vm(cloud, exclude=(node,)), "replacement boot")
    boots.append(Boot("replacement", node, stages, time.monotonic() - began))
    demo.wait_until_serving(BOOT_TIMEOUT_S)

    vm = next(vm for vm in cloud.fleet.vms() if vm.node_id == node)
    cloud.scheduler.pause_job(MONITOR_JOB)
    try:
        began = time.monotonic()
        cloud.fleet.reboot(vm.zone, vm.node_id)
        node, _stamp, stages = wait_for(rebooted(cloud, vm.zone, node, stamp), "reboot")
        boots.append(Boot("reboot", node, stages, time.monotonic() - began))
    finally:
        cloud.scheduler.resume_job(MONITOR_JOB)
    return boots + _prewarm_then_restored(cloud, demo, node)


def _prewarm_then_restored(cloud: LocalCloud, demo: LocalDemo, serving: str) -> list[Boot]:
    """A prewarm of the same plan, then a second preemption whose replacement restores what the builder compiled."""
    spec = demo.spec
    began = time.monotonic()
    demo.gateway.create_deployment(
        deployment_id=f"{spec.deployment_id}-prewarm",
        model=spec.model,
        accelerator=spec.accelerator,
        zones=list(spec.zones),
        tiers=list(spec.tiers),
        hedge=spec.hedge,
        prewarm=True,
        ttl_hours=24.0,  # the clock runs 60x the wall; the default 2 h backstop would end the compile at 2 min
    )
    builder, _stamp, stages = wait_for(prewarmed(cloud, exclude=(serving,)), "prewarm")
    boots = [Boot("prewarm", builder, stages, time.monotonic() - began)]
    began = time.monotonic()
    demo.preempt()
    node, _stamp, stages = wait_for(serving_vm(cloud, exclude=(serving, builder)), "restored boot")
    boots.append(Boot("restored", node, stages, time.monotonic() - began))
    demo.wait_until_serving(BOOT_TIMEOUT_S)
    demo.teardown(BOOT_TIMEOUT_S)
    return boots


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--eager", action="store_true", help="vLLM on CPU runs eagerly: no compile cache to warm")
    args = parser.parse_args(argv)
    tier = VllmCpuTier(default_cache_dir())
    if tier.unavailable_reason():
        print(tier.unavailable_reason(), file=sys.stderr)
        return 2
    table = Table()
    for run in range(args.runs):
        for boot in one_run(tier, compile_model=not args.eager):
            table.add(boot)
            print(f"run {run + 1} {boot.kind:<11} {boot.node}: {boot.stages.model_dump()} "
                  f"trigger->first token {boot.trigger_to_first_token_s:.1f} s", flush=True)  # fmt: skip
    print("\n".join(table.lines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

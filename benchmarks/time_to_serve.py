"""Command -> first token in the capacity benchmark: the boot model applied to the slices a run was granted.

Why here and not in the controller or the simulator's lifecycle: the controller never sees the boot (it
must not branch on a local run), and the simulator's API stops at ACTIVE. The harness records when the
served slice was ACTIVE (``ServeTracker``), then ``account`` lays a boot on each ACTIVE interval with
``shared.domain.boot_model`` (preset ``gemma-4-26b-a4b``, the benchmark's, on the granted slice):

* a boot starts when the provider turned the slice ACTIVE; it serves once the boot is over, if the slice is
  still ACTIVE then (a preemption during the boot wastes it and the next slice boots again);
* command -> first token = the end of the first boot that completes;
* the outage after a preemption = from the moment the serving slice stopped being ACTIVE until a slice's
  boot completed again (time to ACTIVE again + re-boot); censored at the end of the run.

Cache state per policy (the rule the docs state):

* ``ours`` and every other policy: today's pipeline, every boot cold (Hub download, compile from scratch);
* ``ours+cache``: each seed starts with empty regional caches; a boot that completes fills its region's
  weights cache (keyed by region) and compile cache (keyed by region and slice: the JAX key holds the
  topology); a later boot in a filled region is warm, in another region cold (no cross-region reads);
* ``ours+cache-primed``: as ``ours+cache``, but every region of the scenario was filled before the command
  by an earlier deployment of the same preset on the plan's slice (the steady state of a user who has
  deployed before).

Each run draws its boots from ``Random(seed)``, one boot after the other, so the three cache rules see the same
jitter for the same boot of the same seed.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from benchmarks.capacity_search_results import RunResult, ScenarioPlan
from localcloud.tpu_sim import World
from shared.domain.boot_model import CacheState, boot_stages, median_stages
from shared.domain.models import Tier, region_of

__all__ = [
    "BOOT_PRESET",
    "CACHE_POLICIES",
    "ServeTracker",
    "account",
    "first_token_table",
    "world_slice",
]

BOOT_PRESET = "gemma-4-26b-a4b"
CACHE_POLICIES = {"ours+cache": "regional", "ours+cache-primed": "primed"}


@dataclass
class Interval:
    """One stretch in which the served slice was ACTIVE."""

    name: str
    zone: str
    slice_name: str
    start_s: float
    end_s: float | None = None


@dataclass
class ServeTracker:
    """Fed every sample of ``drive``: records the ACTIVE intervals of the served slice."""

    active_at: Callable[[str, float], float]  # when the provider turned this slice ACTIVE
    slice_of: Callable[[str, str], str]
    intervals: list[Interval] = field(default_factory=list)

    def sample(self, now_s: float, serving: tuple[str, str, Tier] | None, up: bool) -> None:
        current = self.intervals[-1] if self.intervals and self.intervals[-1].end_s is None else None
        name = serving[1] if up and serving is not None else None
        if current is not None and current.name != name:
            current.end_s = now_s
            current = None
        if serving is not None and name is not None and current is None:
            zone = serving[0]
            self.intervals.append(Interval(name, zone, self.slice_of(zone, name), self.active_at(name, now_s)))


def world_slice(world: World, default: str) -> Callable[[str, str], str]:
    """The accelerator type of a queued resource as the simulator holds it."""

    def slice_of(zone: str, name: str) -> str:
        with world.kernel.transaction():
            qr = world.tpu.qrs.get((zone, name))
            return str(qr.accelerator) if qr is not None else default

    return slice_of


def account(result: RunResult, tracker: ServeTracker, plan: ScenarioPlan, regions: Sequence[str]) -> None:
    """Fill the first-token fields of ``result`` from the recorded intervals and the policy's cache rule."""
    mode = CACHE_POLICIES.get(result.policy, "cold")
    run_end = result.time_to_known_s + result.window_s if result.time_to_known_s is not None else plan.horizon_s
    rng = random.Random(result.seed)
    weights: set[str] = set(regions) if mode == "primed" else set()
    compiled: set[tuple[str, str]] = {(r, plan.accelerator) for r in regions} if mode == "primed" else set()
    down_since: float | None = None
    for interval in tracker.intervals:
        region = region_of(interval.zone)
        state = CacheState.COLD
        if (region, interval.slice_name) in compiled:
            state = CacheState.WARM
        elif region in weights:
            state = CacheState.WARM_WEIGHTS
        ready = interval.start_s + boot_stages(BOOT_PRESET, interval.slice_name, state, rng).total_s
        result.boots.append(state.value)
        if ready > (interval.end_s if interval.end_s is not None else run_end):
            continue  # preempted (or the run ended) before the boot completed
        if mode != "cold":
            weights.add(region)
            compiled.add((region, interval.slice_name))
        if result.first_token_s is None:
            result.first_token_s = ready
        elif down_since is not None:
            result.token_outages_s.append(max(0.0, ready - down_since))
        down_since = interval.end_s
        if interval.end_s is None:
            return
    if result.first_token_s is not None and down_since is not None:
        result.token_outages_s.append(max(0.0, run_end - down_since))
        result.token_unrecovered += 1


# --------------------------------------------------------------------------------------------- report


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _minutes(results: Sequence[RunResult], plan: ScenarioPlan, attr: str) -> tuple[float, float]:
    values = [(getattr(r, attr) if getattr(r, attr) is not None else plan.horizon_s) / 60 for r in results]
    return statistics.median(values), _pct(values, 0.9)


def reboot_ratio(slice_name: str = "v6e-4") -> float:
    """Median warm re-boot over median cold boot for the benchmark's preset (the model, no jitter)."""
    cold = median_stages(BOOT_PRESET, slice_name, CacheState.COLD).total_s
    return median_stages(BOOT_PRESET, slice_name, CacheState.WARM).total_s / cold


def first_token_table(groups: Sequence[tuple[ScenarioPlan, Sequence[RunResult]]]) -> str:
    """Command -> ACTIVE beside command -> first token, boots by cache state and outages, per scenario and policy."""
    lines = [
        "| scenario | policy | cache | ACTIVE median (p90) min | first token median (p90) min | first token vs ours |"
        " boots cold / warm-weights / warm | outages after preemption: median min to first token again (n, never) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    ours_median: dict[str, float] = {}
    for plan, results in groups:
        if results and results[0].policy == "ours":
            ours_median[plan.name] = _minutes(results, plan, "first_token_s")[0]
    for plan, results in groups:
        if not results:
            continue
        policy = results[0].policy
        active, token = _minutes(results, plan, "time_to_active_s"), _minutes(results, plan, "first_token_s")
        base = ours_median.get(plan.name)
        versus = f"{100 * (token[0] / base - 1):+.0f} %" if base else "-"
        boots = [b for r in results for b in r.boots]
        counts = " / ".join(str(boots.count(state.value)) for state in CacheState)
        outages = [x / 60 for r in results for x in r.token_outages_s]
        never = sum(r.token_unrecovered for r in results)
        outage = f"{statistics.median(outages):.1f} ({len(outages)}, {never})" if outages else "-"
        lines.append(
            f"| {plan.name} | {policy} | {CACHE_POLICIES.get(policy, 'cold')} | {active[0]:.1f} ({active[1]:.1f}) |"
            f" {token[0]:.1f} ({token[1]:.1f}) | {versus} | {counts} | {outage} |"
        )
    lines.append("")
    lines.append(f"Model, {BOOT_PRESET} on v6e-4: median warm re-boot / cold boot = {reboot_ratio():.2f}.")
    return "\n".join(lines)

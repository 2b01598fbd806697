"""Saturation: how much room a serving deployment has left, and a warning before its latency SLO breaks.

Headroom is one figure from the gauges the monitor already scrapes (``shared.domain.metrics``): the larger of
two pressures, the KV cache's use (``vllm:kv_cache_usage_perc``) and the running requests against the most vLLM
will run at once (``spec.serving.max_num_seqs``, else the model preset's default), subtracted from one::

    headroom = 1 - max(kv_cache_usage, running / max_running)

Either pressure may be missing (an old server, a model outside the catalog); headroom then comes from the other,
and is absent when both are. A request that waits (``vllm:num_requests_waiting``) has found no room at all.

The warning is a finding on the deployment, not a phase: headroom under ``HealthThresholds.headroom_min`` for
``headroom_ticks`` samples in a row (this one included), or requests waiting for as many, while the phase model
(``shared.domain.health``) only calls it DEGRADED once users already feel it. It clears on the first sample that
is no longer short of room. Values come from the VM and are untrusted: a non-finite or negative gauge counts as
missing, a share is clamped to [0, 1].
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from shared.domain.catalog import UnknownPreset, preset
from shared.domain.models import DeploymentSpec, HealthThresholds

__all__ = ["HEADROOM_SLI", "SATURATION_FINDING", "Saturation", "max_running", "measure", "saturation_finding"]

HEADROOM_SLI = "headroom"
"""The name of the SLI in ``MonitorSample.slis`` and ``DeploymentStatus.slis``: a share, 0 (none) to 1."""
SATURATION_FINDING = "saturation"
"""The tag the warning starts with (``"saturation: headroom 8% ..."``): a finding is the same one while its tag is."""


@dataclass(frozen=True)
class Saturation:
    """One sample's pressures and the headroom they leave."""

    headroom: float
    kv_cache_usage: float | None = None
    running: float | None = None
    waiting: float = 0.0
    max_running: int | None = None

    def describe(self) -> str:
        """The pressures in words: "KV cache 92% full, 250/256 running, 3 request(s) waiting"."""
        parts: list[str] = []
        if self.kv_cache_usage is not None:
            parts.append(f"KV cache {self.kv_cache_usage:.0%} full")
        if self.running is not None and self.max_running:
            parts.append(f"{self.running:.0f}/{self.max_running} running")
        if self.waiting > 0:
            parts.append(f"{self.waiting:.0f} request(s) waiting")
        return ", ".join(parts)


def max_running(spec: DeploymentSpec) -> int | None:
    """The most requests vLLM runs at once for this spec: its ``max_num_seqs``, else the preset's default (what
    the serving plan passes to vLLM); None for a model outside the catalog."""
    if spec.serving.max_num_seqs is not None:
        return spec.serving.max_num_seqs
    try:
        return preset(spec.model).default_max_num_seqs
    except UnknownPreset:
        return None


def measure(gauges: Mapping[str, float], limit: int | None) -> Saturation | None:
    """The headroom of one scrape's gauges (``MetricsSnapshot.gauges``); None when neither pressure is known."""
    kv = _finite(gauges.get("kv_cache_usage"))
    kv = None if kv is None else min(1.0, kv)
    running = _finite(gauges.get("running"))
    waiting = _finite(gauges.get("waiting")) or 0.0
    pressures = [kv] if kv is not None else []
    if running is not None and limit:
        pressures.append(min(1.0, running / limit))
    if not pressures:
        return None
    headroom = round(1.0 - max(pressures), 4)
    return Saturation(headroom, kv, running, waiting, limit if running is not None else None)


def saturation_finding(
    now: Saturation | None, history: Sequence[Mapping[str, float]], thresholds: HealthThresholds
) -> str | None:
    """The warning, or None: headroom under ``headroom_min`` or requests waiting, for ``headroom_ticks`` samples
    in a row. ``history`` holds the earlier samples' SLIs, newest first."""
    if now is None:
        return None
    earlier = thresholds.headroom_ticks - 1
    limit = thresholds.headroom_min

    def short(slis: Mapping[str, float]) -> bool:
        headroom = _finite(slis.get(HEADROOM_SLI))
        return headroom is not None and headroom < limit

    def queued(slis: Mapping[str, float]) -> bool:
        return (_finite(slis.get("waiting")) or 0.0) > 0

    low = now.headroom < limit and _run(history, short) >= earlier
    waiting = now.waiting > 0 and _run(history, queued) >= earlier
    if not (low or waiting):
        return None
    ticks = thresholds.headroom_ticks
    if low:
        head = f"headroom {now.headroom:.0%} (under {limit:.0%}) for {ticks} sample(s)"
    else:
        head = f"requests waiting for {ticks} sample(s), headroom {now.headroom:.0%}"
    return f"{SATURATION_FINDING}: {head}; {now.describe()}"


def _run(history: Sequence[Mapping[str, float]], holds: Callable[[Mapping[str, float]], bool]) -> int:
    """How many of the newest samples in a row ``holds`` is true for."""
    count = 0
    for slis in history:
        if not holds(slis):
            break
        count += 1
    return count


def _finite(value: object) -> float | None:
    """A gauge read from the VM: a finite number >= 0, else missing."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) and number >= 0 else None

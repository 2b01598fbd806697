"""TPU telemetry: HBM use per chip, TensorCore duty cycle and utilisation, HBM bandwidth use, as the agent samples them.

Why: vLLM on TPU exports no HBM or duty-cycle metrics, so a full HBM or an idle chip under load is invisible in
``/metrics``. libtpu serves them on the VM (its runtime metrics service, the one ``tpu-info`` reads, and its SDK's
``tpumonitoring`` for TensorCore utilisation: the share of the matrix units' peak in use, where the duty cycle only
says the core was busy); the node agent samples both and writes the newest reading to its guest attribute
``tpuctl/telemetry`` (``encode``); the monitor reads it back with the boot progress (``read_telemetry``), keeps it
in the tick's sample (``telemetry_slis``) and the benchmark result keeps a summary of the readings taken during the
run (``summarize``).

The VM is hostile (it parses prompts): its value is cut to ``MAX_RAW_CHARS`` before parsing, a reading with more
than ``MAX_CHIPS`` chips, a byte count outside ``0..MAX_HBM_BYTES`` or a percentage outside ``0..100`` is refused
whole, and its ``error`` text is cleaned by the caller. A reading older than the caller's ``max_age_s`` (the agent
stamps it with the controller's clock: wall time on Google Cloud, the simulator's in the local cloud) is stale: the
agent died or its sampler stopped, and stale numbers are worse than none.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from shared.domain.startup_script import GUEST_ATTRIBUTE_NAMESPACE

__all__ = [
    "MAX_CHIPS",
    "MAX_RAW_CHARS",
    "TELEMETRY_KEY",
    "TELEMETRY_SLIS",
    "ChipReading",
    "TpuTelemetry",
    "encode",
    "read_node_telemetry",
    "read_telemetry",
    "summarize",
    "telemetry_slis",
]

TELEMETRY_KEY = "telemetry"  # guest attribute tpuctl/telemetry
MAX_CHIPS = 64
MAX_RAW_CHARS = 16_384
MAX_HBM_BYTES = 1 << 40  # 1 TiB per chip: far above any TPU's HBM, so only nonsense is refused
MAX_ERROR_CHARS = 300
GIB = float(1 << 30)
TELEMETRY_SLIS = (
    "tpu_hbm_used_frac_max",
    "tpu_hbm_used_gib",
    "tpu_duty_cycle_pct",
    "tpu_tensorcore_util_pct",
    "tpu_hbm_bandwidth_pct",
)


@dataclass(frozen=True)
class ChipReading:
    """One chip (or core, where a chip has two): HBM bytes used and total, and the percentages when known."""

    chip: int
    hbm_used_bytes: int
    hbm_total_bytes: int
    duty_cycle_pct: float | None = None
    hbm_bandwidth_pct: float | None = None
    tensorcore_util_pct: float | None = None

    @property
    def hbm_used_frac(self) -> float:
        return self.hbm_used_bytes / self.hbm_total_bytes if self.hbm_total_bytes else 0.0


@dataclass(frozen=True)
class TpuTelemetry:
    """One sample of every chip; ``error`` says why there are no chips (no TPU runtime yet, a read failed)."""

    sampled_at: datetime
    chips: tuple[ChipReading, ...] = ()
    error: str = ""


def encode(reading: TpuTelemetry) -> str:
    """The compact JSON the agent writes to ``tpuctl/telemetry`` (and keeps for a benchmark's summary)."""
    chips = [
        {
            "chip": c.chip,
            "hbm_used": c.hbm_used_bytes,
            "hbm_total": c.hbm_total_bytes,
            **({"duty_pct": round(c.duty_cycle_pct, 2)} if c.duty_cycle_pct is not None else {}),
            **({"hbm_bw_pct": round(c.hbm_bandwidth_pct, 2)} if c.hbm_bandwidth_pct is not None else {}),
            **({"tc_util_pct": round(c.tensorcore_util_pct, 2)} if c.tensorcore_util_pct is not None else {}),
        }
        for c in reading.chips
    ]
    body: dict[str, Any] = {"at": reading.sampled_at.astimezone(UTC).isoformat(), "chips": chips}
    if reading.error:
        body["error"] = reading.error[:MAX_ERROR_CHARS]
    return json.dumps(body, separators=(",", ":"))


def _int(value: Any, high: int) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
        return None
    return value


def _percent(value: Any) -> float | None:
    """A percentage in 0..100; None for absent. Raises ValueError for anything else (the reading is refused)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError("percentage is not a number")
    if not 0 <= value <= 100:
        raise ValueError("percentage outside 0..100")
    return float(value)


def _chip(data: Any) -> ChipReading:
    if not isinstance(data, dict):
        raise ValueError("chip is not an object")
    chip = _int(data.get("chip"), MAX_CHIPS * 2)
    used, total = _int(data.get("hbm_used"), MAX_HBM_BYTES), _int(data.get("hbm_total"), MAX_HBM_BYTES)
    if chip is None or used is None or total is None or used > total:
        raise ValueError("chip id or HBM bytes out of range")
    duty, bandwidth, util = (_percent(data.get(name)) for name in ("duty_pct", "hbm_bw_pct", "tc_util_pct"))
    return ChipReading(chip, used, total, duty, bandwidth, util)


def read_telemetry(
    value: str, now: datetime, max_age_s: float, clean: Callable[[str, int], str]
) -> TpuTelemetry | None:
    """The agent's reading from its guest attribute, or None when it is malformed, hostile or stale."""
    try:
        data = json.loads(value[:MAX_RAW_CHARS])
        if not isinstance(data, dict) or not isinstance(data.get("at"), str) or not isinstance(data.get("chips"), list):
            return None
        sampled_at = datetime.fromisoformat(data["at"])
        if sampled_at.tzinfo is None or len(data["chips"]) > MAX_CHIPS:
            return None
        chips = tuple(sorted((_chip(item) for item in data["chips"]), key=lambda c: c.chip))
    except (ValueError, TypeError, RecursionError):
        return None
    age_s = (now - sampled_at).total_seconds()
    if not -max_age_s <= age_s <= max_age_s:  # far in the future is as wrong as far in the past
        return None
    error = data.get("error")
    text = " ".join(clean(error, MAX_ERROR_CHARS).split()) if isinstance(error, str) else ""
    return TpuTelemetry(sampled_at=sampled_at, chips=chips, error=text)


def telemetry_slis(reading: TpuTelemetry | None) -> dict[str, float]:
    """What a monitor sample keeps: the fullest chip's HBM fraction, HBM in use, and the means of the percentages."""
    if reading is None or not reading.chips:
        return {}
    chips = reading.chips
    slis = {
        "tpu_hbm_used_frac_max": round(max(c.hbm_used_frac for c in chips), 4),
        "tpu_hbm_used_gib": round(sum(c.hbm_used_bytes for c in chips) / GIB, 3),
    }
    for name, field in _PERCENT_SLIS:
        values = [getattr(c, field) for c in chips if getattr(c, field) is not None]
        if values:
            slis[name] = round(statistics.fmean(values), 2)
    return slis


_PERCENT_SLIS = (
    ("tpu_duty_cycle_pct", "duty_cycle_pct"),
    ("tpu_tensorcore_util_pct", "tensorcore_util_pct"),
    ("tpu_hbm_bandwidth_pct", "hbm_bandwidth_pct"),
)


def summarize(readings: Iterable[TpuTelemetry]) -> dict[str, float]:
    """Beside a benchmark result: how many readings the run saw, peak HBM, and mean/peak duty cycle and TensorCore
    utilisation over them."""
    slis = [telemetry_slis(r) for r in readings]
    slis = [s for s in slis if s]
    if not slis:
        return {}
    summary: dict[str, float] = {
        "samples": float(len(slis)),
        "hbm_used_frac_peak": max(s["tpu_hbm_used_frac_max"] for s in slis),
        "hbm_used_gib_peak": max(s["tpu_hbm_used_gib"] for s in slis),
    }
    for name, sli in (("duty_cycle_pct", "tpu_duty_cycle_pct"), ("tensorcore_util_pct", "tpu_tensorcore_util_pct")):
        values: Sequence[float] = [s[sli] for s in slis if sli in s]
        if values:
            summary[f"{name}_mean"] = round(statistics.fmean(values), 2)
            summary[f"{name}_peak"] = max(values)
    return summary


def read_node_telemetry(
    attributes: Iterable[Any], now: datetime, max_age_s: float, clean: Callable[[str, int], str]
) -> TpuTelemetry | None:
    """Every worker's ``tpuctl/telemetry`` of one node as one reading (chips numbered across workers in worker
    order, stamped with the oldest worker's time); None when no worker has a fresh, well-formed reading."""
    readings: list[tuple[int, TpuTelemetry]] = []
    for item in attributes:
        if item.namespace == GUEST_ATTRIBUTE_NAMESPACE and item.key == TELEMETRY_KEY:
            reading = read_telemetry(item.value, now, max_age_s, clean)
            if reading is not None:
                readings.append((item.worker, reading))
    if not readings:
        return None
    readings.sort(key=lambda pair: pair[0])
    chips: list[ChipReading] = []
    for _, reading in readings:
        chips.extend(replace(chip, chip=len(chips)) for chip in reading.chips)
    errors = "; ".join(reading.error for _, reading in readings if reading.error)
    oldest = min(reading.sampled_at for _, reading in readings)
    return TpuTelemetry(sampled_at=oldest, chips=tuple(chips[: MAX_CHIPS * 4]), error=errors[:MAX_ERROR_CHARS])

"""TensorCore utilisation per core, read with the libtpu SDK in a child process, for the agent's TPU telemetry.

Why: libtpu's runtime metrics service (``node_agent.tpu_telemetry``) serves HBM, duty cycle and HBM bandwidth, but
not how much of the matrix units' peak is in use; a core can be busy 100 % of the time at 5 % utilisation (a
decode that waits on HBM). The libtpu SDK's ``tpumonitoring.get_metric("tensorcore_util")`` answers it, from any
process on the host, as ``tpu-info`` does. The node agent runs on the pinned serving image's Python, which carries
libtpu, so it can import the SDK, but importing libtpu may crash the importer (``tpu-info`` checks it in a throwaway
process first for that reason): every reading therefore runs ``python -m node_agent.tensorcore_util`` as a child
with a deadline, which prints one JSON line. Where libtpu is absent the reader says so and asks again only every
``RETRY_UNAVAILABLE_S``, not on every sample.

The child's answer is parsed strictly (a list of at most ``MAX_CORES`` finite numbers in 0..100) and mapped onto
the chips of the runtime reading by :func:`per_chip`: one value per chip, or the mean of each chip's cores where a
chip has several.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from shared.domain.tpu_telemetry import ChipReading, TpuTelemetry

__all__ = ["MAX_CORES", "RETRY_UNAVAILABLE_S", "TensorCoreUtilReader", "UtilReading", "per_chip", "with_utilisation"]

METRIC = "tensorcore_util"
MAX_CORES = 256
RETRY_UNAVAILABLE_S = 600.0
_MAX_ANSWER_CHARS = 16_384
UNAVAILABLE = "the libtpu SDK is not installed in the agent's Python"


@dataclass(frozen=True)
class UtilReading:
    """Per-core TensorCore utilisation in percent, in the SDK's core order; ``error`` says why there is none."""

    cores: tuple[float, ...] = ()
    error: str = ""


def parse_answer(text: str) -> UtilReading:
    """The child's last output line; anything but a short list of percentages is an error, never a guess."""
    lines = text[-_MAX_ANSWER_CHARS:].strip().splitlines()
    try:
        data = json.loads(lines[-1]) if lines else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return UtilReading(error="the libtpu SDK reader printed no answer")
    if isinstance(data.get("error"), str):
        return UtilReading(error=" ".join(data["error"].split())[:300])
    values = data.get("cores")
    if not isinstance(values, list) or not 0 < len(values) <= MAX_CORES:
        return UtilReading(error="the libtpu SDK returned no per-core utilisation")
    cores = [_percent(value) for value in values]
    if any(value is None for value in cores):
        return UtilReading(error="the libtpu SDK returned a utilisation outside 0..100")
    return UtilReading(cores=tuple(value for value in cores if value is not None))


def _percent(value: object) -> float | None:
    """A number (or numeric text, as the SDK gives it) in 0..100, allowing libtpu's rounding just past the edges."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    if not math.isfinite(number) or not -0.5 <= number <= 100.5:
        return None
    return min(100.0, max(0.0, number))


def per_chip(cores: Sequence[float], chips: int) -> list[float] | None:
    """One value per chip: as given when there are as many, else the mean of each chip's equal share of cores;
    None when the counts do not divide (the SDK and the runtime disagree on the devices: no guess)."""
    if chips <= 0 or not cores or len(cores) % chips:
        return None
    share = len(cores) // chips
    return [round(statistics.fmean(cores[index * share : (index + 1) * share]), 2) for index in range(chips)]


class TensorCoreUtilReader:
    """Runs the SDK reader as a child with a deadline; never raises."""

    def __init__(self, *, python: str = sys.executable, timeout_s: float = 15.0) -> None:
        self.command = (python, "-m", "node_agent.tensorcore_util")
        self.timeout_s = timeout_s
        self._unavailable_until = 0.0

    def read(self) -> UtilReading:
        if time.monotonic() < self._unavailable_until:
            return UtilReading(error=UNAVAILABLE)
        try:
            done = subprocess.run(
                self.command, capture_output=True, text=True, timeout=self.timeout_s, stdin=subprocess.DEVNULL
            )
        except subprocess.TimeoutExpired:
            return UtilReading(error=f"the libtpu SDK did not answer within {self.timeout_s:g} s")
        except OSError as exc:
            return UtilReading(error=f"the libtpu SDK reader did not start: {exc}"[:300])
        if done.returncode < 0:
            return UtilReading(error=f"the libtpu SDK reader died of signal {-done.returncode}")
        reading = parse_answer(done.stdout)
        if reading.error == UNAVAILABLE:
            self._unavailable_until = time.monotonic() + RETRY_UNAVAILABLE_S
        return reading


def with_utilisation(
    read: Callable[[], TpuTelemetry], read_util: Callable[[], UtilReading]
) -> Callable[[], TpuTelemetry]:
    """``read`` with each chip's TensorCore utilisation added; a failed utilisation read adds its reason to the
    reading's ``error`` and keeps the rest (HBM and duty cycle do not depend on it)."""

    def combined() -> TpuTelemetry:
        reading = read()
        if not reading.chips:
            return reading
        util = read_util()
        values = per_chip(util.cores, len(reading.chips)) if not util.error else None
        if values is None:
            reason = util.error or f"{len(util.cores)} cores' utilisation for {len(reading.chips)} chips"
            note = f"TensorCore utilisation: {reason}"
            return replace(reading, error=f"{reading.error}; {note}" if reading.error else note)
        chips: list[ChipReading] = [
            replace(c, tensorcore_util_pct=v) for c, v in zip(reading.chips, values, strict=True)
        ]
        return replace(reading, chips=tuple(chips))

    return combined


def main() -> int:
    """The child: one JSON line, ``{"cores": [...]}`` or ``{"error": "..."}``; exit status 0 either way."""
    try:
        from libtpu import sdk  # in the serving image, not in our wheels
    except ImportError:
        print(json.dumps({"error": UNAVAILABLE}))
        return 0
    monitoring = getattr(sdk, "tpumonitoring", None) or getattr(sdk, "monitoring", None)
    if monitoring is None:
        print(json.dumps({"error": "this libtpu SDK has no monitoring module (libtpu too old)"}))
        return 0
    try:
        data = list(monitoring.get_metric(METRIC).data())
    except Exception as exc:  # the SDK's own failures (no runtime yet, an old agent) are answers, not crashes
        print(json.dumps({"error": f"{METRIC}: {type(exc).__name__}: {exc}"[:300]}))
        return 0
    print(json.dumps({"cores": [str(value) for value in data[:MAX_CORES]]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

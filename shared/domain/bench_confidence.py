"""Repeats, 95 % confidence intervals and "significant or not" for benchmark figures (issue 22, item 4).

Pure. For ``n`` repeats of one figure:

- **mean** with a Student t-interval: mean ± t(0.975, n - 1) x s / sqrt(n) (s the sample standard deviation);
- **median** with a percentile-bootstrap interval: 2,000 resamples with a fixed seed (0), so the same values give
  the same interval on every machine;
- with one value there is no interval (both ends are the value, ``n`` says 1).

**% change from the previous run** is the change of the means; it is **significant** when the two runs' 95 %
t-intervals do not overlap. That is a deliberately conservative test (two non-overlapping 95 % intervals mean a
difference significant at well below 5 %, roughly 0.5 % for equal spreads), chosen over Welch's t-test because it
needs no t distribution function, reads directly off the numbers shown, and errs towards "not significant" with
the 3-5 repeats a benchmark affords. A run without repeats (n = 1) is never called significant.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Estimate", "change", "estimate", "t_quantile_975"]

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0

# t(0.975, df) for df 1..30 (two-sided 95 %); beyond 30 the normal's 1.96 is within 2 %.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t_quantile_975(df: int) -> float:
    """Student's t 97.5th percentile (a two-sided 95 % interval) for ``df`` degrees of freedom."""
    if df < 1:
        raise ValueError(f"df: {df} must be at least 1 (two or more repeats)")
    return _T975[df - 1] if df <= len(_T975) else 1.96


@dataclass(frozen=True, slots=True)
class Estimate:
    """One figure over ``n`` repeats."""

    n: int
    mean: float
    mean_low: float
    mean_high: float
    median: float
    median_low: float
    median_high: float

    def as_dict(self, digits: int = 4) -> dict[str, Any]:
        return {
            "n": self.n,
            "mean": round(self.mean, digits),
            "mean_ci95": [round(self.mean_low, digits), round(self.mean_high, digits)],
            "median": round(self.median, digits),
            "median_ci95": [round(self.median_low, digits), round(self.median_high, digits)],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Estimate:
        """Back from :meth:`as_dict` (a previous run's file); ``ValueError`` when it is not one."""
        try:
            mean_ci, median_ci = data["mean_ci95"], data["median_ci95"]
            return cls(
                int(data["n"]),
                float(data["mean"]),
                float(mean_ci[0]),
                float(mean_ci[1]),
                float(data["median"]),
                float(median_ci[0]),
                float(median_ci[1]),
            )
        except (KeyError, TypeError, IndexError, ValueError) as exc:
            raise ValueError(f"not an estimate (n, mean, mean_ci95, median, median_ci95): {exc}") from None

    def text(self, digits: int = 2) -> str:
        """``median [low, high]``, or the value alone for one repeat."""
        if self.n < 2:
            return f"{self.median:.{digits}f}"
        return f"{self.median:.{digits}f} [{self.median_low:.{digits}f}, {self.median_high:.{digits}f}]"


def _median(ordered: Sequence[float]) -> float:
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def estimate(values: Sequence[float], *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> Estimate:
    """Mean with its t-interval and median with its bootstrap interval (95 %) of ``values`` (one per repeat)."""
    if not values:
        raise ValueError("values: give at least one repeat's figure")
    if any(not math.isfinite(value) for value in values):
        raise ValueError(f"values: {list(values)} must all be finite numbers")
    n = len(values)
    ordered = sorted(values)
    centre = math.fsum(values) / n
    median = _median(ordered)
    if n == 1:
        return Estimate(1, centre, centre, centre, median, median, median)
    spread = math.sqrt(math.fsum((value - centre) ** 2 for value in values) / (n - 1))
    half = t_quantile_975(n - 1) * spread / math.sqrt(n)
    rng = random.Random(seed)
    medians = sorted(_median(sorted(rng.choices(values, k=n))) for _ in range(resamples))
    low = medians[int(0.025 * (resamples - 1))]
    high = medians[math.ceil(0.975 * (resamples - 1))]
    return Estimate(n, centre, centre - half, centre + half, median, low, high)


def change(now: Estimate, before: Estimate) -> dict[str, Any]:
    """% change of the mean from ``before`` to ``now`` and whether it is significant (95 % t-intervals apart)."""
    pct = None if before.mean == 0 else (now.mean / before.mean - 1.0) * 100
    apart = now.mean_low > before.mean_high or now.mean_high < before.mean_low
    significant = now.n >= 2 and before.n >= 2 and apart
    return {
        "change_pct": None if pct is None else round(pct, 1),
        "significant": significant,
        "test": "95% t-intervals of the means do not overlap",
    }

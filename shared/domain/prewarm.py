"""Prewarm: a deployment that builds the shared compile cache instead of serving, then ends; what it costs.

Why: a cold boot of vLLM on a TPU spends most of its time compiling (93 % of the 31B engine start), and every boot
after a preemption, a stop/start or a move pays it again. A prewarm (``tpuctl prewarm``; ``prewarm`` on
``tpu_deploy``) runs the same plan on the same slice once, as a builder (``COMPILE_CACHE_ROLE=fill``,
under the builder service account, serving nothing), so later boots in the region restore the compiled artefacts
(``shared.domain.compile_cache``). The monitor deletes the deployment when its builder says ``prewarmed``; its
``ttl_hours`` is the backstop against a builder that never finishes.

The price is the slice's hourly price for as long as a cold boot takes by the calibrated boot model
(``shared.domain.boot_model``), capacity search not included (a waiting request is not billed).
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.domain.boot_model import CacheState, median_stages
from shared.domain.boot_progress import BOOT_PREWARMED
from shared.domain.models import DeploymentRecord

__all__ = ["PREWARM_TTL_HOURS", "PrewarmQuote", "builder_finished", "prewarm_quote"]

PREWARM_TTL_HOURS = 2.0  # the default backstop: the slowest calibrated cold boot is about 11 minutes


@dataclass(frozen=True, slots=True)
class PrewarmQuote:
    """What one prewarm costs at a tier's price: the modelled cold boot it pays for, in minutes and dollars."""

    minutes: float
    usd: float
    region: str
    tier: str
    note: str


def builder_finished(record: DeploymentRecord) -> bool:
    """A prewarm whose builder said ``prewarmed`` (only a prewarm's builder is believed: any VM can write a phase)."""
    boot = record.status.boot
    return record.spec.prewarm and boot is not None and boot.stage == BOOT_PREWARMED


def prewarm_quote(preset: str, slice_name: str, usd_per_hour: float, region: str, tier: str) -> PrewarmQuote | None:
    """The price of one prewarm of ``preset`` on ``slice_name``; None where the boot model has no calibration."""
    try:
        stages = median_stages(preset, slice_name, CacheState.COLD)
    except (KeyError, ValueError):
        return None
    minutes = stages.total_s / 60.0
    return PrewarmQuote(
        minutes=round(minutes, 1),
        usd=round(usd_per_hour * minutes / 60.0, 2),
        region=region,
        tier=tier,
        note=f"a cold boot of about {minutes:.0f} min (compile {stages.compile_s / 60:.0f} min) billed once; "
        "later boots in the region restore the compiled artefacts",
    )

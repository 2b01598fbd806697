"""The plan's view of the regional weights caches (issue 20): what each region's cache holds and what it costs.

Apart from ``models.py`` (its size). Why in the plan: a boot that restores from a warm cache skips the Hub download
(minutes for a large model), and keeping a model cached is billed per GB-month; both belong beside the slice's price.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.domain.cost import CostEstimate
from shared.domain.errors import CloudError
from shared.domain.prewarm import prewarm_quote
from shared.domain.weights_cache import choose_bucket, regions_of, storage_usd_per_month
from shared.ports import WeightsCacheState

__all__ = ["PrewarmView", "WeightsCacheView", "prewarm_view", "weights_cache_views"]

WARM_SHARE = 0.9  # cached bytes at least this share of the model's estimated size: a boot restores all of it


class WeightsCacheView(BaseModel):
    """One region's weights cache for the plan's model."""

    model_config = ConfigDict(extra="forbid")

    region: str
    bucket: str | None = None
    state: Literal["warm", "partial", "cold", "none", "unreadable"]
    cached_bytes: int | None = None
    usd_per_month: float | None = Field(default=None, description="Keeping the model cached: Standard storage.")
    note: str
    compile_cache: Literal["warm", "cold", "unreadable"] | None = Field(
        default=None, description="This plan's compiled artefacts on this slice (tpuctl prewarm fills them)."
    )
    compile_bytes: int | None = None


class PrewarmView(BaseModel):
    """One prewarm of this plan (``tpuctl prewarm``): the cold boot it pays for once, at the cheapest price."""

    model_config = ConfigDict(extra="forbid")

    minutes: float
    usd: float
    region: str
    tier: str
    note: str


def weights_cache_views(
    buckets: Mapping[str, str],
    cross_region: bool,
    state: WeightsCacheState | None,
    hub_id: str,
    model_bytes: int,
    zones: Sequence[str],
    compile_key: str = "",
) -> list[WeightsCacheView]:
    """The cache each region of ``zones`` would boot from, its state and its monthly storage price, and whether it
    holds this plan's compiled artefacts (``compile_key``)."""
    views = []
    for region in regions_of(zones):
        choice = choose_bucket(buckets, region, cross_region=cross_region)
        if choice.bucket is None:
            views.append(WeightsCacheView(region=region, state="none", note=f"boots from the Hub: {choice.reason}"))
            continue
        if state is None:
            note = "no cache reader here (set TPUCTL_WEIGHTS_CACHE_BUCKETS); a boot still restores from it"
            views.append(WeightsCacheView(region=region, bucket=choice.bucket, state="unreadable", note=note))
            continue
        try:
            cached = state.cached_bytes(choice.bucket, hub_id)
        except CloudError as exc:
            note = f"{choice.bucket} could not be read ({exc}); a boot still restores what it can"
            views.append(WeightsCacheView(region=region, bucket=choice.bucket, state="unreadable", note=note))
            continue
        views.append(_with_compiled(_view(region, choice.bucket, cached, model_bytes), state, hub_id, compile_key))
    return views


def _with_compiled(view: WeightsCacheView, state: WeightsCacheState, hub_id: str, key: str) -> WeightsCacheView:
    """The view with the compile cache's state for ``key``: warm (an entry a boot would restore), cold, unreadable."""
    if not key or view.bucket is None:
        return view
    try:
        compiled = state.compiled_bytes(view.bucket, hub_id, key)
    except CloudError as exc:
        return view.model_copy(update={"compile_cache": "unreadable", "note": f"{view.note}; compile cache: {exc}"})
    if compiled is None:
        note = f"{view.note}; compile cache cold: a boot compiles from scratch (tpuctl prewarm fills it)"
        return view.model_copy(update={"compile_cache": "cold", "note": note})
    price = storage_usd_per_month(compiled)
    note = f"{view.note}; compile cache warm ({compiled / 1e6:.0f} MB, ${price:.2f}/month): a boot restores it"
    return view.model_copy(update={"compile_cache": "warm", "compile_bytes": compiled, "note": note})


def prewarm_view(preset: str, slice_name: str, cheapest: CostEstimate | None) -> PrewarmView | None:
    """What one prewarm costs at the cheapest tier's price, from the calibrated boot model; None when unpriced."""
    if cheapest is None:
        return None
    quote = prewarm_quote(preset, slice_name, cheapest.usd_per_hour, cheapest.region, cheapest.tier.value)
    return None if quote is None else PrewarmView(**dataclasses.asdict(quote))


def _view(region: str, bucket: str, cached: int, model_bytes: int) -> WeightsCacheView:
    gb = f"{cached / 1e9:.2f} GB"
    if cached >= WARM_SHARE * model_bytes:
        state, note = "warm", f"{gb} cached: a boot restores the weights from {bucket}, not the Hub"
    elif cached:
        state, note = "partial", f"{gb} of ~{model_bytes / 1e9:.1f} GB cached: a boot fetches the rest and fills it"
    else:
        state, note = "cold", f"empty: the first boot downloads ~{model_bytes / 1e9:.1f} GB from the Hub and fills it"
    price = storage_usd_per_month(max(cached, model_bytes))
    return WeightsCacheView(
        region=region,
        bucket=bucket,
        state=state,
        cached_bytes=cached,
        usd_per_month=price,
        note=f"{note} (${price:.2f}/month to keep)",
    )

"""Cost model: what a slice costs per hour, per day, for a TTL, and per million generated tokens.

Why: a user should see the price of a deployment before it starts, per zone and tier, and the cost of a
token at a measured throughput. Prices come from the dated table in ``shared.domain.prices`` (chip-hours
only: the host VM, disks, egress and time waiting in the queue are not billed as chip-hours and are left
out, which ``CostEstimate.excludes`` says). Flex-start runs stop at their run-duration cap (7 days at most),
so a TTL beyond the cap is billed only up to the cap.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

from shared.domain.catalog import AcceleratorSpec, accelerator
from shared.domain.errors import InvalidMessage, PermanentError
from shared.domain.models import Tier
from shared.domain.prices import PRICE_TABLE_DATE, price_row, region_from_location

__all__ = [
    "FLEX_START_MAX_RUN_HOURS",
    "CostEstimate",
    "UnknownPrice",
    "cost_per_million_tokens",
    "estimate_cost",
]

FLEX_START_MAX_RUN_HOURS = 7 * 24.0  # docs/reference/tpu-api.md §4: "Max run 7 days"
HOURS_PER_DAY = 24.0
TOKENS_PER_MILLION = 1_000_000
SECONDS_PER_HOUR = 3600.0
EXCLUDED_FROM_PRICE = ("host VM", "boot disk", "egress", "time waiting in the queue")


class UnknownPrice(PermanentError):
    """The price table has no row for this region, tier and chip family."""

    def __init__(self, location: str, tier: Tier, family: str) -> None:
        self.location = location
        self.tier = tier
        self.family = family
        super().__init__(
            f"price: none for {family} {tier.value} in {location} (table dated {PRICE_TABLE_DATE.isoformat()}; "
            "pick a priced region or add a row to shared/domain/prices.py)"
        )


@dataclass(frozen=True, slots=True)
class CostEstimate:
    """Chip-hour cost of one slice in one region and tier."""

    accelerator: str
    chips: int
    region: str
    tier: Tier
    usd_per_chip_hour: float
    usd_per_hour: float
    usd_per_day: float
    billable_hours: float | None  # for the TTL, after the flex-start cap
    usd_for_ttl: float | None
    capped_by_run_duration: bool
    max_run_hours: float | None  # flex-start run cap applied, else None
    price_source: str
    price_date: date
    excludes: tuple[str, ...] = EXCLUDED_FROM_PRICE

    def per_million_tokens(self, tokens_per_second: float) -> float:
        """USD per million generated tokens at a measured output throughput (tokens/s over the whole slice)."""
        return cost_per_million_tokens(self.usd_per_hour, tokens_per_second)


def cost_per_million_tokens(usd_per_hour: float, tokens_per_second: float) -> float:
    """USD per million tokens for a machine costing ``usd_per_hour`` that produces ``tokens_per_second``."""
    if tokens_per_second <= 0:
        raise InvalidMessage("tokens_per_second", "must be positive", "pass the measured output throughput")
    return usd_per_hour / (tokens_per_second * SECONDS_PER_HOUR) * TOKENS_PER_MILLION


def estimate_cost(
    accelerator_type: str | AcceleratorSpec,
    zone_or_region: str,
    tier: Tier,
    *,
    ttl_hours: float | None = None,
    max_run_hours: float | None = None,
) -> CostEstimate:
    """Cost of one slice; raises ``UnknownPrice`` when the table has no row, ``InvalidMessage`` on bad input."""
    slice_ = accelerator_type if isinstance(accelerator_type, AcceleratorSpec) else accelerator(accelerator_type)
    region = region_from_location(zone_or_region)
    if region is None:
        raise InvalidMessage(
            "zone", f"{zone_or_region!r} is neither a zone nor a region", "e.g. us-east5-b or us-east5"
        )
    row = price_row(region, tier, slice_.family)
    if row is None:
        raise UnknownPrice(region, tier, slice_.family)
    if ttl_hours is not None and ttl_hours <= 0:
        raise InvalidMessage("ttl_hours", "must be positive", "e.g. 4")
    cap: float | None = None
    if tier is Tier.FLEX_START:
        cap = FLEX_START_MAX_RUN_HOURS if max_run_hours is None else max_run_hours
        if not 0 < cap <= FLEX_START_MAX_RUN_HOURS:
            raise InvalidMessage("max_run_hours", f"{cap} is outside (0, 168]", "flex-start runs at most 7 days")
    hourly = row.usd_per_chip_hour * slice_.chips
    billable = None if ttl_hours is None else (min(ttl_hours, cap) if cap is not None else ttl_hours)
    return CostEstimate(
        accelerator=slice_.name,
        chips=slice_.chips,
        region=region,
        tier=tier,
        usd_per_chip_hour=row.usd_per_chip_hour,
        usd_per_hour=hourly,
        usd_per_day=hourly * HOURS_PER_DAY,
        billable_hours=billable,
        usd_for_ttl=None if billable is None else hourly * billable,
        capped_by_run_duration=bool(cap is not None and ttl_hours is not None and ttl_hours > cap),
        max_run_hours=cap,
        price_source=row.source,
        price_date=PRICE_TABLE_DATE,
    )

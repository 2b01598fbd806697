"""Dated TPU price table: USD per chip-hour by region, capacity tier and accelerator family.

Why a table in code: the cost model and the provisioner's ranking need a price offline and
deterministically. Prices change (spot may move every 30 days), so every row names its source and
the whole table carries ``PRICE_TABLE_DATE``; callers should treat a price as configuration and say
how old it is. An unknown (region, tier, family) is ``None``, never a guess.

Sources (read late 2026; each row names one):
- ``billing``: Cloud Billing catalog, service 6F81-5844-456A, us-east5 ("Columbus") SKUs copied 2026-08-07.
- ``skypilot``: skypilot-org/skypilot-catalog ``catalogs/v7/gcp/vms.csv`` per-region on-demand/spot.
- ``ga-list``: Google's v6e GA announcement list prices ($2.70 on-demand, $1.89 1-yr CUD), global
  "starting at" figures.
- ``list``: v5e $1.20 and v5p $4.20 on-demand per chip-hour, the US list prices quoted when the
  reference agent's constants were checked; no regional, spot or flex-start v5e/v5p price is known.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date

from shared.domain.models import Tier

__all__ = [
    "FAMILIES",
    "PRICE_TABLE",
    "PRICE_TABLE_DATE",
    "PriceRow",
    "price_per_chip_hour",
    "price_row",
    "region_from_location",
]

PRICE_TABLE_DATE = date(2026, 8, 7)
FAMILIES: tuple[str, ...] = ("v6e", "v5e", "v5p")

_REGION = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")
_ZONE = re.compile(r"^([a-z]+-[a-z]+[0-9]+)-[a-z0-9]{1,8}$")


@dataclass(frozen=True, slots=True)
class PriceRow:
    """One price: where, how bought, which chip, how much, and where the number came from."""

    region: str
    tier: Tier
    family: str
    usd_per_chip_hour: float
    source: str


def _rows() -> tuple[PriceRow, ...]:
    rows: list[PriceRow] = [
        # us-east5: the only region with billing-catalog SKUs for every tier.
        PriceRow("us-east5", Tier.ON_DEMAND, "v6e", 2.70, "billing: TpuV6e running in Columbus"),
        PriceRow("us-east5", Tier.FLEX_START, "v6e", 1.35, "billing: DWS Defined Duration V6e running in Columbus"),
        PriceRow("us-east5", Tier.SPOT, "v6e", 1.4033, "billing: TpuV6e on Spot VMs (skypilot says 1.08)"),
        PriceRow("us-east5", Tier.RESERVATION, "v6e", 1.89, "billing: Reserved V6e TPU in Columbus in Calendar Mode"),
    ]
    for region in ("us-central1", "us-east1", "us-west1"):
        rows += [
            PriceRow(region, Tier.ON_DEMAND, "v6e", 2.70, "skypilot"),
            PriceRow(region, Tier.SPOT, "v6e", 0.648, "skypilot"),
            PriceRow(region, Tier.RESERVATION, "v6e", 1.89, "ga-list: 1-yr CUD, global starting-at"),
        ]
    for region, spot in (("us-east4", 0.858), ("us-south1", 1.89)):
        rows += [
            PriceRow(region, Tier.ON_DEMAND, "v6e", 2.70, "skypilot"),
            PriceRow(region, Tier.SPOT, "v6e", spot, "skypilot"),
        ]
    for region, on_demand, spot in (
        ("europe-west4", 2.97, 0.713),
        ("asia-southeast1", 2.97, 0.730),
        ("asia-northeast1", 3.24, 1.077),
        ("asia-south1", 3.24, 2.27),
    ):
        rows += [
            PriceRow(region, Tier.ON_DEMAND, "v6e", on_demand, "skypilot"),
            PriceRow(region, Tier.SPOT, "v6e", spot, "skypilot"),
        ]
    rows += [
        PriceRow("us-central1", Tier.ON_DEMAND, "v5e", 1.20, "list: US on-demand"),
        PriceRow("us-central1", Tier.ON_DEMAND, "v5p", 4.20, "list: US on-demand"),
    ]
    return tuple(rows)


PRICE_TABLE: tuple[PriceRow, ...] = _rows()
_INDEX: dict[tuple[str, Tier, str], PriceRow] = {(r.region, r.tier, r.family): r for r in PRICE_TABLE}


def region_from_location(zone_or_region: str) -> str | None:
    """``us-east5-b`` or ``us-east5`` -> ``us-east5``; anything else -> None."""
    text = zone_or_region.strip().lower()
    if _REGION.fullmatch(text):
        return text
    zone = _ZONE.fullmatch(text)
    return zone.group(1) if zone else None


def _family_of(family: str) -> str:
    """Accept ``v6e``, ``v6e-4``, ``v5litepod-8``, ``v5e`` and ``v5p-8`` alike."""
    name = family.strip().lower().split("-", 1)[0]
    return "v5e" if name in ("v5litepod", "v5lite") else name


def price_row(zone_or_region: str, tier: Tier, family: str = "v6e") -> PriceRow | None:
    """The table row for a zone or region, tier and chip family, or None when the table has none."""
    region = region_from_location(zone_or_region)
    if region is None:
        return None
    return _INDEX.get((region, Tier(tier), _family_of(family)))


def price_per_chip_hour(zone_or_region: str, tier: Tier, family: str = "v6e") -> float | None:
    """USD per chip-hour for a zone (``us-east5-b``) or region (``us-east5``); None when unknown."""
    row = price_row(zone_or_region, tier, family)
    return row.usd_per_chip_hour if row else None

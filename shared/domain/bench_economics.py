"""What every benchmark level costs: tokens per second per chip and USD per million output tokens (pure).

The benchmarker prices a stored sweep at the deployment's own tier and zone (``plan``: ``accelerator``, ``chips``,
``tier``, ``zone``) with a price lookup: the live Billing Catalog where it has the SKU (``PriceBook.lookup``), the
dated table otherwise (:func:`table_price`, the default). Per level:

- ``output_tokens_per_s_per_chip``: output throughput / chips;
- ``usd_per_million_output_tokens``: the slice's hourly price / (output throughput x 3600) x 1e6
  (``shared.domain.cost.cost_per_million_tokens``); chip-hours only, as the cost model says;
- at the SLO (goodput; only when the run set an SLO): the same over ``output_goodput``, the output tokens of the
  requests that met every SLO per second, so a level where few requests meet the SLO costs more per useful token;
  a level where none does has no finite price and shows None.

A rate sweep also gets ``max_rate_at_slo``: its levels judged as the open-loop search's ladder
(``shared.domain.bench_rate_search.sweep_rate_search``) and the price per million output tokens at that rate.

``cheapest`` and ``cheapest_at_slo`` name the level with the lowest price per million output tokens. The result is
written by the controller (``result["economics"]``), never taken from the node.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from shared.domain.bench_rate_search import sweep_rate_search
from shared.domain.cost import cost_per_million_tokens
from shared.domain.models import Tier
from shared.domain.prices import PRICE_TABLE_DATE, price_row

__all__ = ["PriceLookup", "benchmark_economics", "economics_lines", "table_price"]

PriceLookup = Callable[[str, Tier, str], tuple[float, str] | None]
"""(zone or region, tier, accelerator family) -> (USD per chip-hour, where the price came from), or None."""


def table_price(zone_or_region: str, tier: Tier, family: str) -> tuple[float, str] | None:
    """The dated table's price (``shared.domain.prices``), said as such."""
    row = price_row(zone_or_region, tier, family)
    if row is None:
        return None
    return row.usd_per_chip_hour, f"table {PRICE_TABLE_DATE:%Y-%m-%d}: {row.source}"


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _per_million(usd_per_hour: float | None, tokens_per_s: float | None) -> float | None:
    if usd_per_hour is None or tokens_per_s is None or tokens_per_s <= 0:
        return None
    return round(cost_per_million_tokens(usd_per_hour, tokens_per_s), 4)


def _slo(request: Mapping[str, Any]) -> dict[str, float]:
    names = (("ttft_ms", "slo_ttft_ms"), ("tpot_ms", "slo_tpot_ms"), ("e2el_ms", "slo_e2el_ms"))
    return {name: value for name, key in names if (value := _number(request.get(key))) is not None}


def _price(plan: Mapping[str, Any], price: PriceLookup) -> tuple[float | None, str]:
    """(USD per chip-hour, its source) or (None, why there is none)."""
    tier, zone, accelerator = plan.get("tier"), plan.get("zone"), plan.get("accelerator")
    if not isinstance(tier, str) or not tier:
        return None, "unpriced: the deployment has no capacity tier recorded"
    if not isinstance(zone, str) or not zone:
        return None, "unpriced: the deployment has no zone recorded"
    try:
        tier_value = Tier(tier)
    except ValueError:
        return None, f"unpriced: unknown tier {tier!r}"
    family = str(accelerator or "v6e").split("-", 1)[0]
    found = price(zone, tier_value, family)
    if found is None:
        return None, f"unpriced: no price for {family} {tier} in {zone}"
    return found


def benchmark_economics(
    plan: Mapping[str, Any],
    request: Mapping[str, Any],
    points: Sequence[Mapping[str, Any]],
    price: PriceLookup = table_price,
) -> dict[str, Any]:
    """Each level's tokens per second per chip and USD per million output tokens, overall and at the SLO."""
    chips = _number(plan.get("chips"))
    chips = chips if chips and chips > 0 else None
    per_chip_hour, source = _price(plan, price)
    per_hour = per_chip_hour * chips if per_chip_hour is not None and chips is not None else None
    slo = _slo(request)
    rows: list[dict[str, Any]] = []
    for point in points:
        throughput = _number(point.get("output_throughput"))
        goodput = _number(point.get("output_goodput")) if slo else None
        rows.append(
            {
                "level": point.get("level"),
                "output_tokens_per_s_per_chip": round(throughput / chips, 4) if throughput and chips else None,
                "usd_per_million_output_tokens": _per_million(per_hour, throughput),
                "output_goodput": goodput,
                "goodput_tokens_per_s_per_chip": round(goodput / chips, 4) if goodput is not None and chips else None,
                "usd_per_million_output_tokens_at_slo": _per_million(per_hour, goodput),
            }
        )
    economics: dict[str, Any] = {
        "chips": int(chips) if chips is not None else None,
        "tier": plan.get("tier"),
        "zone": plan.get("zone"),
        "usd_per_chip_hour": per_chip_hour,
        "usd_per_hour": round(per_hour, 4) if per_hour is not None else None,
        "price_source": source,
        "slo": slo or None,
        "points": rows,
        "cheapest": _cheapest(rows, "usd_per_million_output_tokens"),
        "cheapest_at_slo": _cheapest(rows, "usd_per_million_output_tokens_at_slo"),
    }
    search = sweep_rate_search(request, points)
    if search is not None:
        best = next((row for row in rows if _number(row.get("level")) == search["max_rate_at_slo"]), {})
        search["usd_per_million_output_tokens_at_max_rate"] = best.get("usd_per_million_output_tokens_at_slo")
        economics["max_rate_at_slo"] = search
    return economics


def _cheapest(rows: Sequence[Mapping[str, Any]], key: str) -> dict[str, Any] | None:
    priced = [row for row in rows if row.get(key) is not None]
    if not priced:
        return None
    best = min(priced, key=lambda row: float(row[key]))
    per_chip = "goodput_tokens_per_s_per_chip" if key.endswith("_at_slo") else "output_tokens_per_s_per_chip"
    return {"level": best.get("level"), key: best[key], per_chip: best.get(per_chip)}


def _money(value: Any) -> str:
    number = _number(value)
    return "-" if number is None else f"${number:,.4f}" if number < 1 else f"${number:,.2f}"


def _max_rate_line(economics: Mapping[str, Any]) -> list[str]:
    search = economics.get("max_rate_at_slo")
    if not isinstance(search, Mapping):
        return []
    price = search.get("usd_per_million_output_tokens_at_max_rate")
    return [
        f"Max rate at the SLO (open loop): {search.get('max_rate_at_slo')} req/s, lowest failing "
        f"{search.get('lowest_failing_rate')} ({search.get('stop_reason')})"
        + (f", {_money(price)} per million output tokens there" if price is not None else "")
    ]


def economics_lines(economics: Any) -> list[str]:
    """The economics of a stored result in a few lines for people (empty when the result has none)."""
    if not isinstance(economics, Mapping):
        return []
    per_chip_hour = _number(economics.get("usd_per_chip_hour"))
    if per_chip_hour is None:
        return [f"Cost: {economics.get('price_source') or 'unpriced'}", *_max_rate_line(economics)]
    lines = [
        f"Cost: {economics.get('tier')} in {economics.get('zone')} at {_money(per_chip_hour)} per chip-hour x "
        f"{economics.get('chips')} chips = {_money(economics.get('usd_per_hour'))}/h ({economics.get('price_source')})"
    ]
    cheapest = economics.get("cheapest")
    if isinstance(cheapest, Mapping):
        lines.append(
            f"Cheapest level {cheapest.get('level')}: {_money(cheapest.get('usd_per_million_output_tokens'))} per "
            f"million output tokens, {cheapest.get('output_tokens_per_s_per_chip')} output tok/s per chip"
        )
    slo = economics.get("slo")
    at_slo = economics.get("cheapest_at_slo")
    if not slo:
        lines.append("At the SLO: no SLO set (give slo_ttft_ms, slo_tpot_ms or slo_e2el_ms to price goodput)")
    elif isinstance(at_slo, Mapping):
        lines.append(
            f"At the SLO ({', '.join(f'{k} {v:g}' for k, v in slo.items())}): cheapest level {at_slo.get('level')}, "
            f"{_money(at_slo.get('usd_per_million_output_tokens_at_slo'))} per million output tokens that met it, "
            f"{at_slo.get('goodput_tokens_per_s_per_chip')} tok/s per chip"
        )
    else:
        lines.append("At the SLO: no level had a request that met it")
    return lines + _max_rate_line(economics)

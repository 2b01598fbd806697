"""The cost model and the dated price table."""

from __future__ import annotations

from datetime import date

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.domain.catalog import InvalidAccelerator
from shared.domain.cost import FLEX_START_MAX_RUN_HOURS, UnknownPrice, cost_per_million_tokens, estimate_cost
from shared.domain.errors import InvalidMessage
from shared.domain.models import Tier
from shared.domain.prices import PRICE_TABLE, PRICE_TABLE_DATE, price_per_chip_hour, region_from_location


@pytest.mark.parametrize(
    ("location", "tier", "family", "usd"),
    [
        ("us-east5-b", Tier.FLEX_START, "v6e", 1.35),
        ("us-east5", Tier.FLEX_START, "v6e", 1.35),
        ("us-east5-a", Tier.ON_DEMAND, "v6e", 2.70),
        ("us-east5-b", Tier.SPOT, "v6e", 1.4033),
        ("us-east5-b", Tier.RESERVATION, "v6e", 1.89),
        ("us-central1-ai1a", Tier.SPOT, "v6e", 0.648),
        ("europe-west4-a", Tier.ON_DEMAND, "v6e", 2.97),
        ("asia-south1-b", Tier.SPOT, "v6e", 2.27),
        ("us-central1-a", Tier.ON_DEMAND, "v5litepod-4", 1.20),
        ("us-central1", Tier.ON_DEMAND, "v5p", 4.20),
        ("europe-west4-a", Tier.FLEX_START, "v6e", None),
        ("southamerica-west1-a", Tier.ON_DEMAND, "v6e", None),
        ("us-east5-b", Tier.SPOT, "v5e", None),
        ("us-east5-b", Tier.FLEX_START, "v7", None),
    ],
)
def test_price_per_chip_hour_takes_a_zone_or_a_region(
    location: str, tier: Tier, family: str, usd: float | None
) -> None:
    assert price_per_chip_hour(location, tier, family) == usd


def test_the_price_table_is_dated_and_every_row_names_a_source() -> None:
    assert date(2026, 8, 7) == PRICE_TABLE_DATE
    assert all(row.source and row.usd_per_chip_hour > 0 for row in PRICE_TABLE)
    assert len({(r.region, r.tier, r.family) for r in PRICE_TABLE}) == len(PRICE_TABLE)


@given(st.text(max_size=60))
def test_any_location_text_gives_a_price_or_none_never_an_error(text: str) -> None:
    price = price_per_chip_hour(text, Tier.SPOT)
    assert price is None or price > 0
    region = region_from_location(text)
    assert region is None or region in text.strip().lower()


@pytest.mark.parametrize(
    ("accelerator", "location", "tier", "per_hour"),
    [
        ("v6e-4", "us-east5-b", Tier.FLEX_START, 5.40),  # the reference's default: 4 x $1.35 x 1 h
        ("v6e-4", "us-east5-b", Tier.ON_DEMAND, 10.80),
        ("v6e-8", "europe-west4-a", Tier.SPOT, 8 * 0.713),
        ("v6e-1", "asia-northeast1-b", Tier.ON_DEMAND, 3.24),
        ("v5litepod-8", "us-central1-a", Tier.ON_DEMAND, 8 * 1.20),
        ("v5p-8", "us-central1-a", Tier.ON_DEMAND, 4 * 4.20),  # v5p-8 is 4 chips
    ],
)
def test_hourly_and_daily_cost(accelerator: str, location: str, tier: Tier, per_hour: float) -> None:
    cost = estimate_cost(accelerator, location, tier)
    assert cost.usd_per_hour == pytest.approx(per_hour)
    assert cost.usd_per_day == pytest.approx(per_hour * 24)
    assert cost.price_date == PRICE_TABLE_DATE
    assert "host VM" in cost.excludes


@pytest.mark.parametrize(
    ("tier", "ttl", "max_run", "billable", "capped"),
    [
        (Tier.FLEX_START, 10.0, 4.0, 4.0, True),
        (Tier.FLEX_START, 3.0, 4.0, 3.0, False),
        (Tier.FLEX_START, 500.0, None, FLEX_START_MAX_RUN_HOURS, True),
        (Tier.ON_DEMAND, 10.0, None, 10.0, False),
        (Tier.SPOT, 10.0, None, 10.0, False),
    ],
)
def test_a_ttl_is_billed_up_to_the_flex_start_run_cap(
    tier: Tier, ttl: float, max_run: float | None, billable: float, capped: bool
) -> None:
    cost = estimate_cost("v6e-4", "us-east5-b", tier, ttl_hours=ttl, max_run_hours=max_run)
    assert cost.billable_hours == billable
    assert cost.capped_by_run_duration is capped
    assert cost.usd_for_ttl == pytest.approx(cost.usd_per_hour * billable)


@pytest.mark.parametrize(
    ("tokens_per_second", "usd_per_million"),
    [(202.9, 1.848), (870.0, 0.431)],  # docs/reference/reference-agent.md §11: flex-start v6e-1, $1.848 and $0.431
)
def test_cost_per_million_tokens_reproduces_the_published_figures(
    tokens_per_second: float, usd_per_million: float
) -> None:
    cost = estimate_cost("v6e-1", "us-east5-b", Tier.FLEX_START)
    assert cost.per_million_tokens(tokens_per_second) == pytest.approx(usd_per_million, abs=0.0005)


def test_an_unpriced_combination_says_where_to_add_the_price() -> None:
    with pytest.raises(UnknownPrice) as raised:
        estimate_cost("v6e-4", "europe-west4-a", Tier.FLEX_START)
    assert "europe-west4" in str(raised.value)
    assert "2026-08-07" in str(raised.value)


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda: estimate_cost("v6e-4", "not a zone", Tier.SPOT), InvalidMessage),
        (lambda: estimate_cost("v6e-4", "us-east5-b", Tier.FLEX_START, max_run_hours=200), InvalidMessage),
        (lambda: estimate_cost("v6e-4", "us-east5-b", Tier.SPOT, ttl_hours=0), InvalidMessage),
        (lambda: estimate_cost("2*2", "us-east5-b", Tier.SPOT), InvalidAccelerator),
        (lambda: cost_per_million_tokens(5.4, 0), InvalidMessage),
    ],
)
def test_bad_input_is_refused_with_a_clear_error(call: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        call()  # type: ignore[operator]

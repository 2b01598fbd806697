"""BillingCatalog with the real google-cloud-billing REST client against the simulator's catalog subset.

Three situations the issue names: the catalog is reachable (live prices, cached with a date), unreachable
(the cache, else the dated table, with a warning), and a tier has no SKU (that tier from the table, said so).
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from localcloud.tpu_sim import SimServer, World
from shared.adapters.billing_catalog import BillingCatalog, parse_skus
from shared.domain.models import Tier
from shared.domain.prices import PRICE_TABLE_DATE, price_per_chip_hour

SPOT_OVERRIDE = 1.11  # a price the dated table does not have: proves it came from the catalog


def scenario(**catalog: Any) -> dict[str, Any]:
    return {
        "name": "prices",
        "zones": {"us-east5-b": {}, "europe-west4-a": {}},
        "prices": {"us-east5": {"spot": SPOT_OVERRIDE}},
        "billing_catalog": {"page_size": 3, **catalog},
    }


@pytest.fixture
def served() -> Any:
    servers: list[SimServer] = []

    def start(world: World) -> str:
        server = SimServer(world)
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.stop()


def test_reachable_catalog_prices_every_live_tier_and_caches_them_with_a_date(served: Any, tmp_path: Path) -> None:
    world = World(scenario())
    cache = tmp_path / "prices.json"
    catalog = BillingCatalog(endpoint=served(world), clock=world.clock, cache_path=cache, page_size=4)
    book = catalog.prices()
    assert book.source == "catalog"
    assert book.read_at == world.now()
    assert book("us-east5-b", Tier.SPOT, "v6e") == pytest.approx(SPOT_OVERRIDE)
    assert book("us-east5", Tier.FLEX_START, "v6e") == pytest.approx(1.35)
    assert book("europe-west4-a", Tier.ON_DEMAND, "v6e-4") == pytest.approx(2.97)
    assert "TpuV6e attached to Spot Preemptible VMs running in Columbus" in book.explain("us-east5-b", Tier.SPOT)
    assert book.warnings == []
    stored = json.loads(cache.read_text())
    assert stored["read_at"].startswith(f"{world.now():%Y-%m-%d}")
    assert len(stored["rows"]) == 2 * 3  # two regions x flex-start, spot, on-demand (paged 4 at a time)
    catalog.close()


def test_a_fresh_cache_is_reused_and_a_stale_one_is_read_again(served: Any, tmp_path: Path) -> None:
    world = World(scenario())
    url = served(world)
    cache = tmp_path / "prices.json"
    BillingCatalog(endpoint=url, clock=world.clock, cache_path=cache).prices()
    world.inject_fault({"endpoint": "cloudbilling.skus.list", "status": 503, "times": 5})
    again = BillingCatalog(endpoint=url, clock=world.clock, cache_path=cache, max_age_s=3600).prices()
    assert again.source == "cache"  # no call made: the fault is still armed
    assert world.faults()[0]["remaining"] == 5
    world.clear_faults()
    world.advance(2 * 3600)
    fresh = BillingCatalog(endpoint=url, clock=world.clock, cache_path=cache, max_age_s=3600).prices()
    assert fresh.source == "catalog"
    assert fresh.read_at == world.now()


def test_unreachable_catalog_falls_back_to_the_dated_table_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    world = World(scenario())
    catalog = BillingCatalog(endpoint="http://127.0.0.1:9", clock=world.clock, timeout_s=2)
    with caplog.at_level(logging.WARNING, logger="tpuctl.prices"):
        book = catalog.prices()
    assert book.source == "table"
    assert book.read_at is None
    assert book("us-east5-b", Tier.SPOT, "v6e") == price_per_chip_hour("us-east5", Tier.SPOT)
    assert len(book.warnings) == 1
    assert "unreachable" in book.warnings[0]
    assert f"dated price table of {PRICE_TABLE_DATE:%Y-%m-%d}" in book.warnings[0]
    assert any("unreachable" in record.getMessage() for record in caplog.records)
    assert "table 2026-08-07 (catalog not read)" in book.explain("us-east5-b", Tier.SPOT)


def test_unreachable_catalog_prefers_the_last_cached_prices_and_says_how_old(served: Any, tmp_path: Path) -> None:
    world = World(scenario())
    cache = tmp_path / "prices.json"
    BillingCatalog(endpoint=served(world), clock=world.clock, cache_path=cache).prices()
    world.advance(3 * 86400)
    book = BillingCatalog(endpoint="http://127.0.0.1:9", clock=world.clock, cache_path=cache, timeout_s=2).prices()
    assert book.source == "cache"
    assert book("us-east5-b", Tier.SPOT, "v6e") == pytest.approx(SPOT_OVERRIDE)
    assert "using prices cached on" in book.warnings[0]
    assert "3.0 days old" in book.warnings[0]


def test_a_tier_without_skus_comes_from_the_table_and_says_so(served: Any, caplog: pytest.LogCaptureFixture) -> None:
    world = World(scenario(omit_tiers=["flex_start"]))
    with caplog.at_level(logging.WARNING, logger="tpuctl.prices"):
        book = BillingCatalog(endpoint=served(world), clock=world.clock).prices()
    assert book.source == "catalog"
    assert book.missing_tiers == (Tier.FLEX_START,)
    assert book("us-east5-b", Tier.FLEX_START, "v6e") == pytest.approx(1.35)  # the table's us-east5 row
    assert book("us-east5-b", Tier.SPOT, "v6e") == pytest.approx(SPOT_OVERRIDE)  # still live
    assert book("europe-west4-a", Tier.FLEX_START, "v6e") is None  # the table has no row either
    assert any("no flex_start SKU" in warning for warning in book.warnings)
    assert "no catalog SKU for this region and tier" in book.explain("us-east5-b", Tier.FLEX_START)
    assert "no price" in book.explain("europe-west4-a", Tier.FLEX_START)
    assert any("flex_start prices come from the dated table" in r.getMessage() for r in caplog.records)


def test_the_price_book_ranks_like_any_price_function(served: Any) -> None:
    world = World(scenario())
    world.advance(timedelta(hours=1).total_seconds())
    book = BillingCatalog(endpoint=served(world), clock=world.clock).prices()
    assert book("us-east5-b", Tier.RESERVATION, "v6e") == pytest.approx(1.89)  # reservation: always the table
    assert book("us-east5-b", Tier.SPOT, "v5p") is None  # only v6e SKUs are read; no v5p spot row in the table


def test_sku_parsing_keeps_hourly_v6e_prices_and_skips_what_it_cannot_read() -> None:
    rows, notes = parse_skus(
        [
            {
                "skuId": "A",
                "description": "TpuV6e running in Columbus",
                "serviceRegions": ["us-east5"],
                "pricingInfo": [
                    {
                        "pricingExpression": {
                            "usageUnit": "h",
                            "tieredRates": [{"unitPrice": {"units": "2", "nanos": 700000000}}],
                        }
                    }
                ],
            },
            {
                "skuId": "B",
                "description": "TpuV6e attached to Spot Preemptible VMs running in Columbus",
                "serviceRegions": ["us-east5"],
                "pricingInfo": [{"pricingExpression": {"usageUnit": "mo", "tieredRates": []}}],
            },
            {"skuId": "C", "description": "N2 Instance Core running in Columbus", "serviceRegions": ["us-east5"]},
        ]
    )
    assert list(rows) == [("us-east5", Tier.ON_DEMAND)]
    assert rows[("us-east5", Tier.ON_DEMAND)].usd_per_chip_hour == pytest.approx(2.70)
    assert len(notes) == 1
    assert "B" in notes[0]

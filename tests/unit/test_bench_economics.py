"""Each benchmark level priced (issue 22 item 2): tokens per second per chip, USD per million output tokens, and the
same over the goodput at the SLO, at the deployment's own tier and zone."""

from __future__ import annotations

from typing import Any

import pytest

from loadgen.report import result_table
from shared.domain.bench_economics import benchmark_economics, economics_lines, table_price
from shared.domain.benchmark_headline import sweep_headline
from shared.domain.models import Tier
from shared.domain.prices import price_per_chip_hour

PLAN = {"accelerator": "v6e-4", "chips": 4, "tier": "spot", "zone": "us-east5-b"}
SPOT_EAST5 = 1.4033  # shared/domain/prices.py: billing, TpuV6e on Spot VMs in Columbus


def _points() -> list[dict[str, Any]]:
    return [
        {"level": 1, "output_throughput": 200.0, "output_goodput": 200.0},
        {"level": 8, "output_throughput": 1000.0, "output_goodput": 500.0},
        {"level": 32, "output_throughput": 1600.0, "output_goodput": 0.0},
    ]


def test_each_level_is_priced_per_chip_and_per_million_output_tokens_at_the_tier_price() -> None:
    assert price_per_chip_hour("us-east5-b", Tier.SPOT) == SPOT_EAST5
    economics = benchmark_economics(PLAN, {"slo_ttft_ms": 500.0}, _points())
    assert economics["usd_per_chip_hour"] == SPOT_EAST5
    assert economics["usd_per_hour"] == pytest.approx(4 * SPOT_EAST5)
    assert economics["price_source"].startswith("table 2026-08-07: billing")
    by_level = {row["level"]: row for row in economics["points"]}
    # $5.6132/h over 1000 tok/s = 3.6 M tokens an hour: $1.5592 per million
    assert by_level[8]["usd_per_million_output_tokens"] == pytest.approx(4 * SPOT_EAST5 / 3.6, abs=1e-4)
    assert by_level[8]["output_tokens_per_s_per_chip"] == 250.0
    # at the SLO only half the tokens count: twice the price per useful token
    assert by_level[8]["usd_per_million_output_tokens_at_slo"] == pytest.approx(4 * SPOT_EAST5 / 1.8, abs=1e-4)
    assert by_level[8]["goodput_tokens_per_s_per_chip"] == 125.0
    assert by_level[32]["usd_per_million_output_tokens_at_slo"] is None  # nothing met the SLO: no finite price
    assert economics["cheapest"]["level"] == 32  # the most tokens per dollar overall ...
    assert economics["cheapest_at_slo"]["level"] == 8  # ... but not at the SLO
    assert economics["slo"] == {"ttft_ms": 500.0}


def test_without_an_slo_there_is_no_price_at_the_slo() -> None:
    economics = benchmark_economics(PLAN, {}, _points())
    assert economics["slo"] is None and economics["cheapest_at_slo"] is None
    assert all(row["usd_per_million_output_tokens_at_slo"] is None for row in economics["points"])
    assert any("no SLO set" in line for line in economics_lines(economics))


def test_the_live_catalog_price_is_used_with_its_source() -> None:
    seen: list[tuple[str, Tier, str]] = []

    def catalog(zone: str, tier: Tier, family: str) -> tuple[float, str] | None:
        seen.append((zone, tier, family))
        return 2.0, "catalog 2026-12-01: TpuV6e on Spot (SKU X)"

    economics = benchmark_economics(PLAN, {}, _points(), catalog)
    assert seen == [("us-east5-b", Tier.SPOT, "v6e")]
    assert economics["points"][1]["usd_per_million_output_tokens"] == pytest.approx(8.0 / 3.6, abs=1e-4)
    assert economics["price_source"].startswith("catalog")


@pytest.mark.parametrize(
    ("plan", "why"),
    [
        ({**PLAN, "tier": None}, "no capacity tier"),
        ({**PLAN, "zone": None}, "no zone"),
        ({**PLAN, "zone": "mars-north1-a"}, "no price for v6e spot in mars-north1-a"),
    ],
)
def test_an_unpriced_deployment_keeps_its_per_chip_figures_and_says_why(plan: dict[str, Any], why: str) -> None:
    economics = benchmark_economics(plan, {}, _points())
    assert economics["usd_per_hour"] is None and why in economics["price_source"]
    assert economics["points"][1]["output_tokens_per_s_per_chip"] == 250.0
    assert economics["points"][1]["usd_per_million_output_tokens"] is None
    assert economics_lines(economics) == [f"Cost: {economics['price_source']}"]


def test_the_table_price_names_its_row_and_is_none_where_the_table_has_no_row() -> None:
    assert table_price("us-east5-b", Tier.FLEX_START, "v6e") == (
        1.35,
        "table 2026-08-07: billing: DWS Defined Duration V6e running in Columbus",
    )
    assert table_price("antarctica-south1-a", Tier.SPOT, "v6e") is None


def test_the_headline_and_the_table_show_the_price_at_the_peak_and_at_the_slo() -> None:
    points = [{**point, "mode": "concurrency", "completed": 8, "failed": 0} for point in _points()]
    result = {"points": points, "knee": {"level": 8}, "request": {"slo_ttft_ms": 500.0}}
    result["economics"] = benchmark_economics(PLAN, result["request"], points)
    headline = sweep_headline(result)
    assert headline["peak_output_tokens_per_s_per_chip"] == 400.0  # level 32: 1600 tok/s on 4 chips
    assert headline["usd_per_million_output_tokens_at_peak"] == pytest.approx(4 * SPOT_EAST5 / (1.6 * 3.6), abs=1e-4)
    assert headline["usd_per_million_output_tokens_at_slo"] == pytest.approx(4 * SPOT_EAST5 / 1.8, abs=1e-4)
    table = result_table(result)
    assert "tok/s/chip" in table and "$/M @SLO" in table
    assert "Cheapest level 32" in table and "At the SLO (ttft_ms 500): cheapest level 8" in table

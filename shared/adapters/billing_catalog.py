"""Live TPU prices from the Cloud Billing Catalog API, cached with a date, over the dated domain table.

Why: spot prices move every 30 days and the domain table (``shared.domain.prices``) is a snapshot; the
capacity search ranks zones by price, so a stale table picks the wrong zone. This adapter reads the
Compute Engine service's SKUs (``services/6F81-5844-456A``) with google-cloud-billing and keeps the v6e
ones (docs/reference/reference-agent.md §11)::

    flex_start   ^DWS Defined Duration V6e running in <city>
    spot         ^TpuV6e attached to Spot Preemptible VMs running in <city>
    on_demand    ^TpuV6e running in <city>

The result is a :class:`PriceBook`, callable as the planner's ``PriceFn``. What it does when the
catalog cannot give a price, said plainly in ``PriceBook.warnings`` and the log:

- catalog unreachable: the last cached prices (with the date they were read), else the dated table;
- a tier with no SKU at all: that tier comes from the dated table (other tiers stay live);
- a (region, tier) the catalog does not list: the table's price for it, or None when the table has none;
- reservation: always the table (calendar-mode SKUs are not per-chip-hour list prices).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import google.api_core.exceptions as gexc
import google.auth.exceptions
import requests
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials, Credentials
from google.cloud import billing_v1

from shared.adapters.gcp_tpu import cloud_error_from_exception
from shared.domain.errors import CloudError
from shared.domain.models import Tier
from shared.domain.prices import PRICE_TABLE_DATE, price_row, region_from_location
from shared.ports import Clock

__all__ = ["COMPUTE_SERVICE", "SKU_PATTERNS", "BillingCatalog", "CatalogPrice", "PriceBook", "parse_skus"]

log = logging.getLogger("tpuctl.prices")

COMPUTE_SERVICE = "services/6F81-5844-456A"
SKU_PATTERNS: Mapping[Tier, re.Pattern[str]] = {
    Tier.FLEX_START: re.compile(r"^DWS Defined Duration V6e running in (.+)$"),
    Tier.SPOT: re.compile(r"^TpuV6e attached to Spot Preemptible VMs running in (.+)$"),
    Tier.ON_DEMAND: re.compile(r"^TpuV6e running in (.+)$"),
}
LIVE_TIERS: tuple[Tier, ...] = tuple(SKU_PATTERNS)


@dataclass(frozen=True)
class CatalogPrice:
    """One v6e price read from the catalog: USD per chip-hour in one region and tier."""

    region: str
    tier: Tier
    usd_per_chip_hour: float
    sku_id: str
    description: str
    family: str = "v6e"


def _money(units: Any, nanos: Any) -> float:
    return int(units or 0) + int(nanos or 0) / 1e9


def parse_skus(skus: Iterable[Mapping[str, Any]]) -> tuple[dict[tuple[str, Tier], CatalogPrice], list[str]]:
    """SKUs as plain dicts (``description``, ``serviceRegions``, ``pricingInfo``…) -> v6e prices, notes.

    Only hourly prices are kept; a SKU whose unit is not ``h`` or whose price cannot be read is skipped
    with a note, never guessed.
    """
    found: dict[tuple[str, Tier], CatalogPrice] = {}
    notes: list[str] = []
    for sku in skus:
        description = str(sku.get("description", "")).strip()
        tier = next((t for t, pattern in SKU_PATTERNS.items() if pattern.match(description)), None)
        if tier is None:
            continue
        pricing = (sku.get("pricingInfo") or [{}])[0]
        expression = pricing.get("pricingExpression") or {}
        rates = expression.get("tieredRates") or []
        unit = str(expression.get("usageUnit", ""))
        if unit != "h" or not rates:
            notes.append(f"skipped SKU {sku.get('skuId', '?')} ({description}): unit {unit!r}, {len(rates)} rate(s)")
            continue
        price = rates[0].get("unitPrice") or {}
        usd = _money(price.get("units"), price.get("nanos"))
        for region in sku.get("serviceRegions") or ():
            found[(str(region), tier)] = CatalogPrice(str(region), tier, usd, str(sku.get("skuId", "")), description)
    return found, notes


def _sku_dict(sku: billing_v1.Sku) -> dict[str, Any]:
    """The fields :func:`parse_skus` reads, from a client ``Sku`` (no full JSON round trip per SKU)."""
    pricing = []
    for info in sku.pricing_info[:1]:
        expression = info.pricing_expression
        pricing.append(
            {
                "pricingExpression": {
                    "usageUnit": expression.usage_unit,
                    "tieredRates": [
                        {"unitPrice": {"units": rate.unit_price.units, "nanos": rate.unit_price.nanos}}
                        for rate in expression.tiered_rates
                    ],
                }
            }
        )
    return {
        "skuId": sku.sku_id,
        "description": sku.description,
        "serviceRegions": list(sku.service_regions),
        "pricingInfo": pricing,
    }


@dataclass
class PriceBook:
    """Prices for the planner (``PriceFn``): catalog rows where read, the dated table elsewhere.

    ``read_at`` is when the catalog rows were fetched (None: table only); ``source`` is ``catalog``,
    ``cache`` or ``table``; ``warnings`` say in words what fell back to the table and why.
    """

    rows: dict[tuple[str, Tier], CatalogPrice] = field(default_factory=dict)
    read_at: datetime | None = None
    source: str = "table"
    warnings: list[str] = field(default_factory=list)

    @property
    def missing_tiers(self) -> tuple[Tier, ...]:
        """Live tiers with no SKU at all: they are priced from the table."""
        if self.source == "table":
            return LIVE_TIERS
        present = {tier for _, tier in self.rows}
        return tuple(tier for tier in LIVE_TIERS if tier not in present)

    def __call__(self, zone_or_region: str, tier: Tier, family: str) -> float | None:
        found = self.lookup(zone_or_region, tier, family)
        return found[0] if found else None

    def lookup(self, zone_or_region: str, tier: Tier, family: str = "v6e") -> tuple[float, str] | None:
        """(USD per chip-hour, where it came from), or None when neither the catalog nor the table knows."""
        region = region_from_location(zone_or_region)
        tier = Tier(tier)
        if region is not None and family.split("-", 1)[0] == "v6e":
            row = self.rows.get((region, tier))
            if row is not None:
                when = f"{self.read_at:%Y-%m-%d}" if self.read_at else "?"
                return row.usd_per_chip_hour, f"{self.source} {when}: {row.description} (SKU {row.sku_id})"
        table = price_row(zone_or_region, tier, family)
        if table is None:
            return None
        why = "no catalog SKU for this region and tier" if self.source != "table" else "catalog not read"
        return table.usd_per_chip_hour, f"table {PRICE_TABLE_DATE:%Y-%m-%d} ({why}): {table.source}"

    def explain(self, zone_or_region: str, tier: Tier, family: str = "v6e") -> str:
        """One line for status views: the price and its source, or why there is none."""
        found = self.lookup(zone_or_region, tier, family)
        if found is None:
            return f"no price for {family} {Tier(tier).value} in {zone_or_region} (neither catalog nor table)"
        return f"${found[0]:.4f}/chip-h from {found[1]}"

    def to_json(self) -> dict[str, Any]:
        return {
            "read_at": self.read_at.isoformat() if self.read_at else None,
            "service": COMPUTE_SERVICE,
            "rows": [
                {
                    "region": row.region,
                    "tier": row.tier.value,
                    "usd_per_chip_hour": row.usd_per_chip_hour,
                    "sku_id": row.sku_id,
                    "description": row.description,
                }
                for row in sorted(self.rows.values(), key=lambda item: (item.region, item.tier.value))
            ],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, source: str) -> PriceBook:
        rows = {}
        for item in data.get("rows", ()):
            row = CatalogPrice(
                str(item["region"]),
                Tier(item["tier"]),
                float(item["usd_per_chip_hour"]),
                item["sku_id"],
                item["description"],
            )
            rows[(row.region, row.tier)] = row
        read_at = datetime.fromisoformat(data["read_at"]) if data.get("read_at") else None
        return cls(rows=rows, read_at=read_at, source=source)


class BillingCatalog:
    """Reads and caches v6e prices from the Cloud Billing Catalog (or the simulator's catalog subset).

    ``endpoint`` points the client elsewhere (``http://127.0.0.1:8471``, anonymous); ``cache_path`` keeps
    the last good read on disk (JSON with its date); a read younger than ``max_age_s`` is reused.
    """

    def __init__(
        self,
        *,
        endpoint: str | None = None,
        credentials: Credentials | None = None,
        clock: Clock | None = None,
        cache_path: Path | None = None,
        max_age_s: float = 86400.0,
        timeout_s: float = 20.0,
        page_size: int = 5000,
    ) -> None:
        if max_age_s <= 0:
            raise ValueError("max_age_s: must be > 0 (seconds a catalog read stays fresh, e.g. 86400)")
        self._endpoint = endpoint
        self._credentials = credentials if credentials is not None or endpoint is None else AnonymousCredentials()
        self._clock = clock
        self._cache_path = cache_path
        self._max_age = timedelta(seconds=max_age_s)
        self._timeout_s = timeout_s
        self._page_size = page_size
        self._client: billing_v1.CloudCatalogClient | None = None
        self._book: PriceBook | None = None

    def _now(self) -> datetime:
        return self._clock.now() if self._clock is not None else datetime.now(UTC)

    @property
    def client(self) -> billing_v1.CloudCatalogClient:
        if self._client is None:
            options = ClientOptions(api_endpoint=self._endpoint) if self._endpoint else None
            self._client = billing_v1.CloudCatalogClient(
                transport="rest", credentials=self._credentials, client_options=options
            )
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.transport.close()
            self._client = None

    def prices(self) -> PriceBook:
        """Fresh-enough prices: memory, then the disk cache, then a catalog read (with every fallback)."""
        now = self._now()
        for book in (self._book, self._read_cache()):
            if book is not None and book.read_at is not None and now - book.read_at < self._max_age:
                self._book = book
                return book
        return self.refresh()

    def refresh(self) -> PriceBook:
        """Read the catalog now; on failure fall back to the cache, then to the dated table, with a warning."""
        now = self._now()
        try:
            skus = [_sku_dict(sku) for sku in self._list_skus()]
        except CloudError as exc:
            book = self._fallback(exc, now)
        else:
            rows, notes = parse_skus(skus)
            book = PriceBook(rows=rows, read_at=now, source="catalog", warnings=list(notes))
            self._write_cache(book)
        for tier in book.missing_tiers if book.source != "table" else ():
            book.warnings.append(
                f"the catalog lists no {tier.value} SKU for v6e (pattern {SKU_PATTERNS[tier].pattern!r}); "
                f"{tier.value} prices come from the dated table of {PRICE_TABLE_DATE:%Y-%m-%d}"
            )
        for warning in book.warnings:
            log.warning("%s", warning)
        self._book = book
        return book

    def _list_skus(self) -> Iterable[billing_v1.Sku]:
        request = billing_v1.ListSkusRequest(parent=COMPUTE_SERVICE, currency_code="USD", page_size=self._page_size)
        try:
            return list(self.client.list_skus(request=request, timeout=self._timeout_s))
        except (
            gexc.GoogleAPIError,
            requests.exceptions.RequestException,
            google.auth.exceptions.GoogleAuthError,
        ) as exc:
            raise cloud_error_from_exception(exc) from exc

    def _fallback(self, exc: CloudError, now: datetime) -> PriceBook:
        cached = self._read_cache()
        reason = f"{exc.error_class.value}: {exc.message[:200]}"
        if cached is not None and cached.read_at is not None:
            days = (now - cached.read_at).total_seconds() / 86400
            cached.warnings.append(
                f"Cloud Billing Catalog unreachable ({reason}); using prices cached on "
                f"{cached.read_at:%Y-%m-%d %H:%M} UTC ({days:.1f} days old)"
            )
            return cached
        age = (now.date() - PRICE_TABLE_DATE).days
        return PriceBook(
            source="table",
            warnings=[
                f"Cloud Billing Catalog unreachable ({reason}); using the dated price table of "
                f"{PRICE_TABLE_DATE:%Y-%m-%d} ({age} days old)"
            ],
        )

    def _read_cache(self) -> PriceBook | None:
        path = self._cache_path
        if path is None or not path.exists():
            return None
        try:
            return PriceBook.from_json(json.loads(path.read_text(encoding="utf-8")), source="cache")
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("price cache %s is unreadable (%s); ignoring it", path, exc)
            return None

    def _write_cache(self, book: PriceBook) -> None:
        path = self._cache_path
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(path.suffix + ".tmp")
        temporary.write_text(json.dumps(book.to_json(), indent=1), encoding="utf-8")
        temporary.replace(path)

"""Zones and capacity: slice prices per tier, what the capacity search remembers, and live quota headroom."""

from __future__ import annotations

from collections.abc import Sequence

from mcp_client_gateway import bounds
from mcp_client_gateway.capabilities.checks import TIERS, optional
from mcp_client_gateway.capabilities.common import GatewayPorts, pricing, slice_chips
from mcp_client_gateway.errors import GatewayError
from mcp_client_gateway.log_hygiene import clean_text
from mcp_client_gateway.models import (
    ExcludedZoneView,
    LiveQuotaView,
    QuotaBoundView,
    SearchScopeView,
    ZoneMemoryView,
    ZoneQuotaView,
    ZonesView,
    ZoneView,
)
from shared.domain.cloud import accelerator_family
from shared.domain.errors import CloudError, ErrorClass
from shared.domain.models import ACCELERATOR_TYPES, DeploymentSpec, Tier, ZoneMemoryEntry, region_of
from shared.domain.prices import PRICE_TABLE_DATE
from shared.domain.quota import (
    QuotaHeadroom,
    QuotaLimit,
    SearchScope,
    quota_headroom,
    search_scope,
    tpu_quota_usage,
    usage_from_records,
    zones_with_zone_limits,
)
from shared.domain.zone_catalog import offering_zones
from shared.domain.zone_memory import blocking_entry, is_active

__all__ = ["Capacity", "given_scope"]


class Capacity:
    """Where a slice can run and what it costs there (reads the store, the Cloud Quotas and TPU APIs)."""

    def __init__(self, ports: GatewayPorts) -> None:
        self.ports = ports

    def list_zones(self, *, accelerator: str = "v6e-4", tier: str | None = None, live_quota: bool = True) -> ZonesView:
        """Zones with slice prices per tier, what the capacity search remembers, and (live) the quota headroom."""
        accelerator = bounds.choice("accelerator", accelerator, ACCELERATOR_TYPES)
        tier = optional(bounds.choice, "tier", tier, TIERS)
        live_quota = bounds.flag("live_quota", live_quota)
        chips = slice_chips(accelerator)
        family = accelerator_family(accelerator)
        now = self.ports.clock.now()
        memory = {entry.key: entry for entry in self.ports.store.list_zone_memory() if is_active(entry, now)}
        tiers = [Tier(tier)] if tier else list(Tier)
        zones = set(offering_zones(family))
        for record in self.ports.store.list_deployments():
            if record.spec.accelerator == accelerator:
                zones.update(record.spec.zones)
        zones.update(entry.zone for entry in memory.values() if entry.zone)
        live: LiveQuotaView | None = None
        headroom: dict[tuple[str, Tier], QuotaHeadroom] = {}
        if live_quota:
            limits, live = self._read_quota()
            if live.read:
                zones.update(zones_with_zone_limits(limits, family))
                usage = self._read_quota_usage(live)
                for found in quota_headroom(limits, usage, sorted(zones), tiers, family):
                    headroom[(found.zone, found.tier)] = found
        price_source = pricing(self.ports)
        views: list[ZoneView] = []
        for zone in sorted(zones):
            prices: dict[str, float] = {}
            blocked: dict[str, ZoneMemoryEntry] = {}
            quota: list[ZoneQuotaView] = []
            short: set[str] = set()
            for each in tiers:
                price = price_source.per_chip_hour(zone, each, family)
                if price is not None:
                    prices[each.value] = round(price * chips, 4)
                entry = blocking_entry(memory, zone, each, accelerator, now)
                if entry is not None:
                    blocked[each.value] = entry
                row = headroom.get((zone, each))
                if row is not None:
                    quota.append(_zone_quota(row, chips))
                    if row.fits(chips) is False:
                        short.add(each.value)
            views.append(
                ZoneView(
                    zone=zone,
                    region=region_of(zone),
                    usd_per_hour=prices,
                    available=len(set(blocked) | short) < len(tiers),
                    blocked_tiers={name: entry.key for name, entry in blocked.items()},
                    memory=[_memory(entry) for entry in {e.key: e for e in blocked.values()}.values()],
                    quota=quota,
                )
            )
        region_blocks = [_memory(entry) for entry in memory.values() if entry.zone is None]
        return ZonesView(
            accelerator=accelerator,
            chips=chips,
            zones=views,
            region_blocks=region_blocks,
            price_table_date=PRICE_TABLE_DATE.isoformat(),
            price_source=price_source.label,
            live_quota=live,
            note="Prices are per slice-hour (price_source says from where); quota is not availability: a zone is "
            "only known to have capacity once a queued resource there went ACTIVE. Live quota: limits from the "
            "Cloud Quotas API, in use counted from the TPU API's nodes (preempted nodes still hold quota).",
        )

    def ladder_scope(
        self, accelerator: str, alternatives: Sequence[str] | None, tiers: Sequence[str] | None = None
    ) -> SearchScopeView:
        """``search_scope`` over the accelerator and its alternatives: every zone where one of them fits quota."""
        if not alternatives:
            return self.search_scope(accelerator=accelerator, tiers=tiers)
        return _ladder_scope(self, [accelerator, *alternatives], tiers)

    def search_scope(self, *, accelerator: str, tiers: Sequence[str] | None = None) -> SearchScopeView:
        """The zones a search uses when none are given (plan and create alike): the catalog zones offering the
        slice where it fits the live quota (zone and region limits, chips in use) in one of ``tiers``, cheapest
        first; every catalog zone, with the reason, when the quota cannot be read. Raises when none fits."""
        accelerator = bounds.choice("accelerator", accelerator, ACCELERATOR_TYPES)
        chosen = [Tier(bounds.choice(f"tiers[{i}]", tier, TIERS)) for i, tier in enumerate(tiers or ())]
        chosen = chosen or list(DeploymentSpec.model_fields["tiers"].default)
        family = accelerator_family(accelerator)
        catalog = offering_zones(family)
        spending = [tier for tier in chosen if tier is not Tier.RESERVATION]
        headroom: list[QuotaHeadroom] | None = None
        problem: str | None = "a reservation spends no quota" if not spending else None
        if spending:
            limits, live = self._read_quota()
            if live.read:
                usage = self._read_quota_usage(live)
                headroom = quota_headroom(limits, usage, catalog, spending, family)
            else:
                problem = live.problem
        chips = slice_chips(accelerator)
        prices = pricing(self.ports)

        def price(zone: str) -> float | None:
            known = [p for tier in chosen if (p := prices.per_chip_hour(zone, tier, family)) is not None]
            return min(known) * chips if known else None

        view = _scope_view(search_scope(accelerator, catalog, headroom, price, problem))
        if not view.zones:
            raise GatewayError(
                "failed_precondition",
                "zones",
                f"no zone has quota for {accelerator} in {', '.join(t.value for t in chosen)}: {view.summary}",
                "pass zones explicitly (tpu_plan(show='zones') shows quota per zone), choose a smaller slice or "
                "another tier, or request more TPU quota",
            )
        return view

    def _read_quota(self) -> tuple[list[QuotaLimit], LiveQuotaView]:
        """TPU API quota limits, or none and a view saying why (with the fix) when the API cannot be read."""
        if self.ports.quotas is None:
            return [], LiveQuotaView(
                read=False,
                usage_read=False,
                field="live_quota",
                problem="this gateway has no Cloud Quotas port",
                fix="run the gateway from `python -m mcp_client_gateway` (it wires one), or pass live_quota=false",
            )
        try:
            limits = self.ports.quotas.list_limits()
        except CloudError as exc:
            return [], _quota_failure(exc)
        return limits, LiveQuotaView(read=True, usage_read=False, limits=len(limits))

    def _read_quota_usage(self, live: LiveQuotaView) -> dict[tuple[str, str], int]:
        """Chips in use per quota id and location: the TPU API's node list, else the controller's own records.

        The gateway identity has no TPU API role by default (terraform), so on Google Cloud the fallback is
        the usual path unless roles/tpu.viewer is granted; the view says which count was used.
        """
        if self.ports.tpu is not None:
            try:
                resources = self.ports.tpu.list("-")
            except CloudError as exc:
                problem = f"the TPU API list failed ({clean_text(exc.message)[0][:300]})"
                live.error_class = exc.error_class.value
                live.fix = (
                    "grant roles/tpu.viewer to the gateway identity to count every TPU node in the project"
                    if exc.error_class is ErrorClass.PERMISSION
                    else "retry in a minute; the TPU API did not answer"
                )
            else:
                live.usage_read, live.usage_source = True, "tpu_api"
                return tpu_quota_usage(resources)
        else:
            problem = "this gateway has no TPU API port"
            live.fix = "run the gateway from `python -m mcp_client_gateway` (it wires one)"
        live.usage_read, live.usage_source = True, "controller_records"
        live.problem = f"in use counts only tpuctl's own slices from the controller's records: {problem}"
        return usage_from_records(self.ports.store.list_deployments())


def _ladder_scope(capacity: Capacity, slices: Sequence[str], tiers: Sequence[str] | None) -> SearchScopeView:
    """The scope of a spec with alternative slices (#21 item 5): every zone where one of its slices fits the live
    quota, the first slice's zones first; raises (naming ``zones``) only when none fits for any slice."""
    views: list[SearchScopeView] = []
    refusal: GatewayError | None = None
    for accelerator in slices:
        try:
            views.append(capacity.search_scope(accelerator=accelerator, tiers=tiers))
        except GatewayError as exc:
            refusal = refusal or exc
    if not views:
        assert refusal is not None  # slices is never empty
        raise refusal
    zones = list(dict.fromkeys(zone for view in views for zone in view.zones))
    excluded = [item for item in views[0].excluded if item.zone not in zones]
    summary = "; ".join(f"{slice_}: {view.summary}" for slice_, view in zip(slices, views, strict=False))
    return views[0].model_copy(update={"zones": zones, "excluded": excluded, "summary": summary})


def given_scope(zones: Sequence[str]) -> SearchScopeView:
    """The scope of zones the caller named."""
    return SearchScopeView(
        zones=list(zones),
        excluded=[],
        source="given",
        summary=f"search scope: the {len(zones)} zone(s) you gave: {', '.join(zones)}",
    )


def _scope_view(scope: SearchScope) -> SearchScopeView:
    return SearchScopeView(
        zones=list(scope.zones),
        excluded=[ExcludedZoneView(zone=item.zone, reason=item.reason) for item in scope.excluded],
        source="live_quota" if scope.source == "live_quota" else "catalog",
        problem=scope.problem,
        summary=scope.summary(),
    )


def _zone_quota(row: QuotaHeadroom, chips: int) -> ZoneQuotaView:
    return ZoneQuotaView(
        tier=row.tier.value,
        quota_ids=list(row.quota_ids),
        limits=[
            QuotaBoundView(
                quota_id=bound.quota_id,
                scope=bound.scope,
                location=bound.location,
                limit=bound.limit,
                in_use=bound.in_use,
                headroom=bound.headroom,
            )
            for bound in row.bounds
        ],
        headroom_chips=row.headroom_chips,
        slices_that_fit=list(row.slices_that_fit),
        fits=row.fits(chips),
    )


_QUOTA_FIX = (
    "grant roles/cloudquotas.viewer to the gateway identity and enable cloudquotas.googleapis.com "
    "(terraform/modules/identities does both), or pass live_quota=false"
)


def _quota_failure(exc: CloudError) -> LiveQuotaView:
    """A failed Cloud Quotas read as a degraded view: what failed and the one thing that fixes it."""
    message = clean_text(exc.message)[0][:300]
    if exc.error_class is ErrorClass.PERMISSION:
        problem, fix = f"the Cloud Quotas API refused the read: {message}", _QUOTA_FIX
    elif exc.error_class is ErrorClass.FAILED_PRECONDITION:  # the port names what is missing (no local stack)
        problem, fix = message, "do that, then retry; or pass live_quota=false"
    else:
        problem = f"the Cloud Quotas API is unreachable ({exc.error_class.value}): {message}"
        fix = "retry in a minute (locally TPUCTL_TPU_ENDPOINT must point at the simulator), or pass live_quota=false"
    return LiveQuotaView(
        read=False, usage_read=False, error_class=exc.error_class.value, field="live_quota", problem=problem, fix=fix
    )


def _memory(entry: ZoneMemoryEntry) -> ZoneMemoryView:
    return ZoneMemoryView(
        key=entry.key,
        kind=entry.kind,
        error_class=entry.error_class,
        tier=entry.tier.value if entry.tier else None,
        reason=clean_text(entry.reason, limit=200)[0],
        failures=entry.failures,
        until=entry.until,
    )

"""The live-quota join: limits (Cloud Quotas API) x usage (TPU API nodes) -> headroom and slices that fit."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from shared.domain.cloud import ObservedResource
from shared.domain.models import (
    Backend,
    DeploymentRecord,
    DeploymentSpec,
    DeploymentStatus,
    NodeState,
    QueuedResourceState,
    ResourceRef,
    Tier,
)
from shared.domain.quota import (
    UNLIMITED,
    QuotaLimit,
    holds_tpu_quota,
    parse_tpu_quota_id,
    quota_headroom,
    slice_chips,
    tpu_quota_id,
    tpu_quota_usage,
    usage_from_records,
    zones_with_zone_limits,
)

ZONE_SPOT = "TPUV6EPreemptiblePerProjectPerZoneForTPUAPI"
REGION_SPOT = "TPUV6EPreemptiblePerProjectPerRegionForTPUAPI"
ZONE_ON_DEMAND = "TPUV6EPerProjectPerZoneForTPUAPI"
REGION_ON_DEMAND = "TPUV6EPerProjectPerRegionForTPUAPI"


def node(
    zone: str = "us-east5-b",
    accelerator: str = "v6e-4",
    tier: Tier | None = Tier.SPOT,
    node_state: NodeState | None = NodeState.READY,
    state: QueuedResourceState = QueuedResourceState.ACTIVE,
    backend: Backend = Backend.TPU_API,
) -> ObservedResource:
    return ObservedResource(
        name=f"r-{zone}-{accelerator}-{tier}",
        zone=zone,
        backend=backend,
        state=state,
        tier=tier,
        accelerator=accelerator,
        node_state=node_state,
    )


class TestQuotaIds:
    @pytest.mark.parametrize(
        ("family", "preemptible", "scope", "expected"),
        [
            ("v6e", True, "zone", ZONE_SPOT),
            ("v6e", False, "region", REGION_ON_DEMAND),
            ("v5litepod", True, "region", "TPUV5sLitepodPreemptiblePerProjectPerRegionForTPUAPI"),
        ],
    )
    def test_ids_are_built_and_parsed_back(self, family: str, preemptible: bool, scope: str, expected: str) -> None:
        assert tpu_quota_id(family, preemptible=preemptible, scope=scope) == expected
        assert parse_tpu_quota_id(expected) == (family, preemptible, scope)

    def test_rate_quotas_and_unknown_scopes_are_not_chip_quotas(self) -> None:
        assert parse_tpu_quota_id("CreateNodeRequestsPerMinutePerProject") is None
        with pytest.raises(ValueError, match="scope"):
            tpu_quota_id("v6e", preemptible=True, scope="global")

    def test_slice_chips_counts_chips_not_cores(self) -> None:
        assert slice_chips("v6e-8") == 8
        assert slice_chips("v6e-64") == 64
        assert slice_chips("v5p-16") == 8
        with pytest.raises(ValueError, match="accelerator"):
            slice_chips("v6e")


class TestUsage:
    def test_nodes_count_against_zone_and_region_ids_of_their_tier(self) -> None:
        usage = tpu_quota_usage(
            [
                node(tier=Tier.SPOT),
                node(tier=Tier.FLEX_START, accelerator="v6e-8"),
                node(zone="us-east5-a", tier=Tier.ON_DEMAND, accelerator="v6e-1"),
            ]
        )
        assert usage == {
            (ZONE_SPOT, "us-east5-b"): 12,
            (REGION_SPOT, "us-east5"): 12,
            (ZONE_ON_DEMAND, "us-east5-a"): 1,
            (REGION_ON_DEMAND, "us-east5"): 1,
        }

    def test_what_holds_no_tpu_api_quota_is_left_out(self) -> None:
        waiting = node(node_state=None, state=QueuedResourceState.WAITING)
        reserved = node(tier=Tier.RESERVATION)
        compute = node(backend=Backend.COMPUTE_ENGINE)
        assert tpu_quota_usage([waiting, reserved, compute]) == {}
        assert holds_tpu_quota(waiting) is False

    def test_a_preempted_node_still_holds_its_chips_and_a_provisioning_slice_holds_them_too(self) -> None:
        assert holds_tpu_quota(node(node_state=NodeState.PREEMPTED)) is True
        assert holds_tpu_quota(node(node_state=None, state=QueuedResourceState.PROVISIONING)) is True

    def test_the_controllers_records_count_the_same_way(self) -> None:
        spec = DeploymentSpec(deployment_id="gemma-a", model="gemma-4-e4b", accelerator="v6e-8", zones=("us-east5-b",))
        refs = [
            ResourceRef(
                name="a", zone="us-east5-b", tier=Tier.SPOT, generation=1, attempt=1, node_state=NodeState.READY
            ),
            ResourceRef(name="b", zone="us-east5-a", tier=Tier.SPOT, generation=1, attempt=2),  # queued, no node
        ]
        at = datetime(2026, 12, 2, tzinfo=UTC)
        status = DeploymentStatus(resources=refs)
        record = DeploymentRecord(deployment_id="gemma-a", spec=spec, status=status, created_at=at, updated_at=at)
        assert usage_from_records([record]) == {(ZONE_SPOT, "us-east5-b"): 8, (REGION_SPOT, "us-east5"): 8}

    def test_a_node_without_a_tier_is_counted_as_on_demand(self) -> None:
        assert tpu_quota_usage([node(tier=None)]) == {
            (ZONE_ON_DEMAND, "us-east5-b"): 4,
            (REGION_ON_DEMAND, "us-east5"): 4,
        }


class TestHeadroom:
    def test_the_tighter_of_zone_and_region_limits_decides_what_fits(self) -> None:
        limits = [QuotaLimit(ZONE_SPOT, "us-east5-b", 32), QuotaLimit(REGION_SPOT, "us-east5", 16)]
        usage = {(ZONE_SPOT, "us-east5-b"): 4, (REGION_SPOT, "us-east5"): 8}
        (row,) = quota_headroom(limits, usage, ["us-east5-b"], [Tier.SPOT])
        assert [(b.scope, b.limit, b.in_use, b.headroom) for b in row.bounds] == [
            ("zone", 32, 4, 28),
            ("region", 16, 8, 8),
        ]
        assert row.headroom_chips == 8
        assert row.slices_that_fit == ("v6e-1", "v6e-4", "v6e-8")
        assert row.fits(8) is True
        assert row.fits(16) is False

    def test_a_region_limit_of_zero_blocks_a_zone_with_room(self) -> None:
        limits = [QuotaLimit(ZONE_ON_DEMAND, "us-east5-b", 32), QuotaLimit(REGION_ON_DEMAND, "us-east5", 0)]
        (row,) = quota_headroom(limits, {}, ["us-east5-b"], [Tier.ON_DEMAND])
        assert row.headroom_chips == 0
        assert row.slices_that_fit == ()
        assert row.fits(1) is False

    def test_unlimited_fits_every_shape_and_an_unlisted_quota_is_unknown(self) -> None:
        limits = [QuotaLimit(ZONE_SPOT, "us-east5-b", UNLIMITED)]
        spot, on_demand = quota_headroom(limits, {}, ["us-east5-b"], [Tier.SPOT, Tier.ON_DEMAND])
        assert spot.headroom_chips is None
        assert spot.slices_that_fit[-1] == "v6e-256"
        assert spot.fits(256) is True
        assert on_demand.listed is False
        assert on_demand.slices_that_fit == ()
        assert on_demand.fits(1) is None

    def test_a_specific_limit_beats_the_default_and_a_default_applies_by_region_or_globally(self) -> None:
        limits = [
            QuotaLimit(ZONE_SPOT, "us-east5-b", 0, default=True),
            QuotaLimit(ZONE_SPOT, "us-east5-b", 8),
            QuotaLimit(ZONE_SPOT, "us-east5", 4, default=True),
            QuotaLimit(REGION_SPOT, "global", 1, default=True),
        ]
        b, a = quota_headroom(limits, {}, ["us-east5-b", "us-east5-a"], [Tier.SPOT])
        assert [bound.limit for bound in b.bounds] == [8, 1]
        assert [bound.limit for bound in a.bounds] == [4, 1]
        assert b.headroom_chips == a.headroom_chips == 1

    def test_unknown_usage_keeps_limits_but_claims_no_headroom(self) -> None:
        (row,) = quota_headroom([QuotaLimit(ZONE_SPOT, "us-east5-b", 32)], None, ["us-east5-b"], [Tier.SPOT])
        assert row.bounds[0].in_use is None
        assert row.headroom_chips is None
        assert row.slices_that_fit == ()
        assert row.fits(4) is None

    def test_reservation_spends_no_quota_and_has_no_row(self) -> None:
        assert quota_headroom([QuotaLimit(ZONE_SPOT, "us-east5-b", 8)], {}, ["us-east5-b"], [Tier.RESERVATION]) == []

    def test_zones_with_zone_limits_skips_zero_regions_and_other_families(self) -> None:
        limits = [
            QuotaLimit(ZONE_SPOT, "asia-east1-a", 8),
            QuotaLimit(ZONE_SPOT, "us-central1-b", 0),
            QuotaLimit(REGION_SPOT, "europe-west4", 16),
            QuotaLimit("TPUV5sLitepodPerProjectPerZoneForTPUAPI", "us-west4-a", 8),
        ]
        assert zones_with_zone_limits(limits) == {"asia-east1-a"}

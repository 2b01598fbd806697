"""Zone memory and the create token bucket: how errors become cooldowns and blocks, and how pairs rank."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from shared.domain.errors import CloudError, ErrorClass, ErrorScope
from shared.domain.models import Tier, ZoneMemoryEntry
from shared.domain.ratelimit import TokenBucket
from shared.domain.zone_memory import (
    RATE_LIMIT_KEY,
    CloudFailure,
    MemoryPolicy,
    blocking_entry,
    estimated_price,
    forget_on_success,
    learn,
    learn_preemption,
    learn_stuck,
    prune,
    quota_pool,
    quota_released,
    rank,
    rate_limited_until,
)

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
ACC = "v6e-4"


def _learn(
    failure: CloudFailure,
    memory: dict[str, ZoneMemoryEntry],
    zone: str = "us-east5-b",
    tier: Tier = Tier.SPOT,
    now: datetime = NOW,
) -> ZoneMemoryEntry:
    entry = learn(failure, zone=zone, tier=tier, accelerator=ACC, memory=memory, now=now)
    assert entry is not None
    memory[entry.key] = entry
    return entry


class TestStockout:
    def test_a_stockout_cools_the_pair_and_the_cooldown_doubles_up_to_the_cap(self) -> None:
        memory: dict[str, ZoneMemoryEntry] = {}
        policy = MemoryPolicy()
        lengths = []
        for _ in range(7):
            entry = _learn(CloudFailure(ErrorClass.STOCKOUT, "There is no more capacity in the zone"), memory)
            assert entry.until is not None
            lengths.append((entry.until - NOW).total_seconds())
        assert entry.key == "stockout/us-east5-b/v6e/spot"
        assert entry.kind == "cooldown"
        assert lengths[:3] == [300, 600, 1200]
        assert max(lengths) == policy.stockout_max_s
        assert entry.failures == 7

    def test_a_stockout_blocks_only_its_zone_family_and_tier_and_then_expires(self) -> None:
        memory: dict[str, ZoneMemoryEntry] = {}
        _learn(CloudFailure(ErrorClass.STOCKOUT, "no more capacity"), memory)
        assert blocking_entry(memory, "us-east5-b", Tier.SPOT, ACC, NOW) is not None
        assert blocking_entry(memory, "us-east5-b", Tier.ON_DEMAND, ACC, NOW) is None
        assert blocking_entry(memory, "us-east5-a", Tier.SPOT, ACC, NOW) is None
        assert blocking_entry(memory, "us-east5-b", Tier.SPOT, "v5litepod-4", NOW) is None
        assert blocking_entry(memory, "us-east5-b", Tier.SPOT, ACC, NOW + timedelta(minutes=6)) is None

    def test_capacity_found_clears_the_stockout_of_that_pair(self) -> None:
        memory: dict[str, ZoneMemoryEntry] = {}
        entry = _learn(CloudFailure(ErrorClass.STOCKOUT), memory)
        assert forget_on_success(memory, "us-east5-b", Tier.SPOT, ACC) == [entry.key]
        assert forget_on_success(memory, "us-east5-b", Tier.ON_DEMAND, ACC) == []


class TestQuota:
    def test_a_region_quota_blocks_every_zone_of_the_region_for_that_pool_only(self) -> None:
        memory: dict[str, ZoneMemoryEntry] = {}
        entry = _learn(
            CloudFailure(
                ErrorClass.QUOTA_REGION,
                "Quota limit 'TPUV6EPreemptiblePerProjectPerRegionForTPUAPI' has been exceeded. Limit: 0 in region "
                "us-east5.",
                quota_id="TPUV6EPreemptiblePerProjectPerRegionForTPUAPI",
            ),
            memory,
        )
        assert entry.key == "quota/region/us-east5/TPUV6EPreemptible"
        assert entry.kind == "block"
        assert entry.region == "us-east5"
        for zone in ("us-east5-a", "us-east5-b", "us-east5-c"):
            assert blocking_entry(memory, zone, Tier.SPOT, ACC, NOW) is entry
            assert blocking_entry(memory, zone, Tier.FLEX_START, ACC, NOW) is entry  # flex uses preemptible quota
            assert blocking_entry(memory, zone, Tier.ON_DEMAND, ACC, NOW) is None
        assert blocking_entry(memory, "us-central1-b", Tier.SPOT, ACC, NOW) is None

    def test_a_zone_quota_blocks_only_that_zone(self) -> None:
        memory: dict[str, ZoneMemoryEntry] = {}
        entry = _learn(
            CloudFailure(
                ErrorClass.QUOTA_ZONE, "Quota exceeded in zone us-east5-b", quota_id="TPUV6EPerProjectPerZoneForTPUAPI"
            ),
            memory,
            tier=Tier.ON_DEMAND,
        )
        assert entry.key == "quota/zone/us-east5-b/TPUV6E"
        assert blocking_entry(memory, "us-east5-b", Tier.ON_DEMAND, ACC, NOW) is entry
        assert blocking_entry(memory, "us-east5-a", Tier.ON_DEMAND, ACC, NOW) is None
        assert blocking_entry(memory, "us-east5-b", Tier.SPOT, ACC, NOW) is None

    def test_a_quota_error_without_an_id_blocks_the_tier_that_hit_it_and_is_rechecked(self) -> None:
        memory: dict[str, ZoneMemoryEntry] = {}
        entry = _learn(CloudFailure(ErrorClass.QUOTA_REGION, "quota exceeded"), memory, tier=Tier.FLEX_START)
        assert entry.key == "quota/region/us-east5/tier-flex_start"
        assert blocking_entry(memory, "us-east5-a", Tier.FLEX_START, ACC, NOW) is entry
        assert entry.until is not None and entry.until - NOW == timedelta(seconds=MemoryPolicy().quota_recheck_s)

    def test_deleting_one_of_our_slices_lifts_quota_blocks_in_its_zone_and_region(self) -> None:
        memory: dict[str, ZoneMemoryEntry] = {}
        region = _learn(
            CloudFailure(ErrorClass.QUOTA_REGION, "x", quota_id="TPUV6EPerProjectPerRegionForTPUAPI"), memory
        )
        other = _learn(
            CloudFailure(ErrorClass.QUOTA_REGION, "x", quota_id="TPUV6EPerProjectPerRegionForTPUAPI"),
            memory,
            zone="europe-west4-a",
        )
        assert quota_released(memory, "us-east5-a") == [region.key]
        assert other.key not in quota_released(memory, "us-east5-a")

    @pytest.mark.parametrize(
        ("quota_id", "pool"),
        [
            ("TPUV6EPreemptiblePerProjectPerRegionForTPUAPI", "TPUV6EPreemptible"),
            ("TPUV6EPerProjectPerZoneForTPUAPI", "TPUV6E"),
            ("SomethingElse", "SomethingElse"),
        ],
    )
    def test_quota_ids_of_zone_and_region_share_one_pool(self, quota_id: str, pool: str) -> None:
        assert quota_pool(quota_id) == pool


class TestCatalogueFacts:
    # The scope is what the adapter reads from each message (tests/adapters/test_error_scope.py checks that).
    @pytest.mark.parametrize(
        ("message", "scope", "key", "blocked", "allowed"),
        [
            (
                'The requested accelerator configuration for accelerator type, "v6e-4", could not be found in the '
                'zonal accelerator configurations for "asia-east1-a".',
                ErrorScope.ACCELERATOR,
                "unsupported/accelerator/asia-east1-a/v6e-4",
                [(Tier.SPOT, "v6e-4"), (Tier.ON_DEMAND, "v6e-4")],
                [(Tier.SPOT, "v6e-8")],
            ),
            (
                'Cloud TPU received a bad request. The requested zone "asia-east1-a" is not supported.',
                ErrorScope.ZONE,
                "unsupported/zone/asia-east1-a",
                [(Tier.SPOT, "v6e-4"), (Tier.ON_DEMAND, "v6e-8")],
                [],
            ),
            (
                'FLEX_START provisioning model is not supported for accelerator type "v6e-4" in location '
                '"asia-east1-a"',
                ErrorScope.TIER,
                "unsupported/tier/asia-east1-a/v6e-4/flex_start",
                [(Tier.FLEX_START, "v6e-4")],
                [(Tier.SPOT, "v6e-4"), (Tier.FLEX_START, "v6e-8")],
            ),
        ],
    )
    def test_unsupported_drops_exactly_the_pair_the_message_names(
        self,
        message: str,
        scope: ErrorScope,
        key: str,
        blocked: list[tuple[Tier, str]],
        allowed: list[tuple[Tier, str]],
    ) -> None:
        memory: dict[str, ZoneMemoryEntry] = {}
        failure = CloudFailure(ErrorClass.UNSUPPORTED, message, scope=scope)
        entry = _learn(failure, memory, zone="asia-east1-a", tier=Tier.FLEX_START)
        assert entry.key == key
        assert entry.kind == "unsupported"
        assert entry.until is not None and entry.until - NOW >= timedelta(days=1)
        for tier, accelerator in blocked:
            assert blocking_entry(memory, "asia-east1-a", tier, accelerator, NOW) is entry
        for tier, accelerator in allowed:
            assert blocking_entry(memory, "asia-east1-a", tier, accelerator, NOW) is None

    def test_a_denied_location_blocks_the_zone_until_cleared(self) -> None:
        memory: dict[str, ZoneMemoryEntry] = {}
        entry = _learn(
            CloudFailure(
                ErrorClass.PERMISSION,
                "Permission denied on 'locations/us-central2-b' (or it may not exist).",
                scope=ErrorScope.ZONE,
            ),
            memory,
            zone="us-central2-b",
        )
        assert entry.key == "permission/zone/us-central2-b"
        assert entry.until is None
        assert blocking_entry(memory, "us-central2-b", Tier.SPOT, ACC, NOW + timedelta(days=30)) is entry
        assert blocking_entry(memory, "us-central1-b", Tier.SPOT, ACC, NOW) is None

    def test_a_missing_iam_permission_is_charged_to_the_project_not_to_a_zone(self) -> None:
        memory: dict[str, ZoneMemoryEntry] = {}
        failure = CloudFailure(
            ErrorClass.PERMISSION, "Permission 'tpu.queuedResources.create' denied", scope=ErrorScope.PROJECT
        )
        entry = _learn(failure, memory)
        assert entry.key == "permission/project"
        assert blocking_entry(memory, "europe-west4-a", Tier.ON_DEMAND, ACC, NOW) is entry


class TestOtherClasses:
    def test_a_rate_limit_pauses_creates_but_blocks_no_zone(self) -> None:
        memory: dict[str, ZoneMemoryEntry] = {}
        entry = _learn(CloudFailure(ErrorClass.RATE_LIMIT, "Maximum number of CreateNode requests per minute"), memory)
        assert entry.key == RATE_LIMIT_KEY
        assert rate_limited_until(memory, NOW) == NOW + timedelta(seconds=60)
        assert rate_limited_until(memory, NOW + timedelta(seconds=61)) is None
        assert blocking_entry(memory, "us-east5-b", Tier.SPOT, ACC, NOW) is None

    @pytest.mark.parametrize("cls", [ErrorClass.TRANSIENT, ErrorClass.NOT_FOUND, ErrorClass.ALREADY_EXISTS])
    def test_transient_and_bookkeeping_errors_teach_nothing(self, cls: ErrorClass) -> None:
        assert (
            learn(CloudFailure(cls, "503"), zone="us-east5-b", tier=Tier.SPOT, accelerator=ACC, memory={}, now=NOW)
            is None
        )

    def test_an_unparsed_error_gets_one_free_retry_then_a_short_cooldown(self) -> None:
        memory: dict[str, ZoneMemoryEntry] = {}
        first = _learn(CloudFailure(ErrorClass.UNKNOWN, "weird"), memory)
        assert blocking_entry(memory, "us-east5-b", Tier.SPOT, ACC, NOW) is None
        second = _learn(CloudFailure(ErrorClass.UNKNOWN, "weird"), memory)
        assert first.key == second.key
        assert blocking_entry(memory, "us-east5-b", Tier.SPOT, ACC, NOW) is second

    def test_a_preemption_skips_the_whole_region_for_that_tier(self) -> None:
        memory: dict[str, ZoneMemoryEntry] = {}
        entry = learn_preemption(zone="us-east5-b", tier=Tier.SPOT, accelerator=ACC, memory=memory, now=NOW)
        memory[entry.key] = entry
        assert blocking_entry(memory, "us-east5-a", Tier.SPOT, ACC, NOW) is entry
        assert blocking_entry(memory, "us-east5-a", Tier.ON_DEMAND, ACC, NOW) is None
        assert blocking_entry(memory, "us-central1-b", Tier.SPOT, ACC, NOW) is None

    def test_stuck_provisioning_cools_the_pair_like_a_stockout(self) -> None:
        entry = learn_stuck(zone="us-east5-b", tier=Tier.SPOT, accelerator=ACC, memory={}, now=NOW, minutes=45)
        assert entry.key == "stockout/us-east5-b/v6e/spot"
        assert entry.error_class == "stuck_provisioning"

    def test_a_cloud_error_keeps_its_class_quota_id_and_place(self) -> None:
        error = CloudError(ErrorClass.QUOTA_REGION, "quota", code=429, quota_id="Q", location="us-east5")
        failure = CloudFailure.from_error(error)
        assert (failure.error_class, failure.quota_id, failure.location, failure.code) == (
            ErrorClass.QUOTA_REGION,
            "Q",
            "us-east5",
            429,
        )

    def test_entries_are_forgotten_a_day_after_they_expire(self) -> None:
        memory: dict[str, ZoneMemoryEntry] = {}
        stockout = _learn(CloudFailure(ErrorClass.STOCKOUT), memory)
        permission = _learn(
            CloudFailure(ErrorClass.PERMISSION, "LOCATION_POLICY_VIOLATED", scope=ErrorScope.ZONE), memory
        )
        assert prune(memory, NOW + timedelta(hours=2)) == []
        later = prune(memory, NOW + timedelta(days=2))
        assert stockout.key in later
        assert permission.key not in later


class TestRanking:
    def test_pairs_rank_by_price_cheapest_first(self) -> None:
        ranked = rank(["us-east5-b", "us-central1-b", "europe-west4-a"], [Tier.SPOT, Tier.ON_DEMAND], ACC, {}, NOW)
        prices = [c.price for c in ranked]
        assert prices == sorted(prices)
        assert (ranked[0].zone, ranked[0].tier) == ("us-central1-b", Tier.SPOT)
        assert ranked[-1].tier is Tier.ON_DEMAND

    def test_blocked_pairs_are_left_out_and_remembered_failures_rank_lower(self) -> None:
        memory: dict[str, ZoneMemoryEntry] = {}
        _learn(CloudFailure(ErrorClass.STOCKOUT), memory, zone="us-central1-b")
        ranked = rank(["us-central1-b", "us-east1-d"], [Tier.SPOT], ACC, memory, NOW)
        assert [c.zone for c in ranked] == ["us-east1-d"]
        later = rank(["us-central1-b", "us-east1-d"], [Tier.SPOT], ACC, memory, NOW + timedelta(hours=1))
        assert [c.zone for c in later] == ["us-east1-d", "us-central1-b"]
        assert later[1].remembered_failures == 1

    def test_pairs_never_found_empty_are_swept_before_any_is_asked_again(self) -> None:
        memory: dict[str, ZoneMemoryEntry] = {}
        _learn(CloudFailure(ErrorClass.STOCKOUT), memory, zone="us-central1-b", now=NOW - timedelta(hours=2))
        ranked = rank(["us-central1-b", "us-east5-b"], [Tier.SPOT, Tier.ON_DEMAND], ACC, memory, NOW)
        assert [(c.zone, c.tier) for c in ranked] == [
            ("us-east5-b", Tier.SPOT),  # 1.40, never tried
            ("us-central1-b", Tier.ON_DEMAND),  # 2.70, never tried
            ("us-east5-b", Tier.ON_DEMAND),
            ("us-central1-b", Tier.SPOT),  # cheapest, but already came up empty once
        ]

    def test_unknown_prices_are_estimated_from_the_regions_on_demand_price(self) -> None:
        usd, known = estimated_price("europe-west4-a", Tier.FLEX_START, ACC)
        assert not known
        assert usd == pytest.approx(2.97 * 0.5)
        assert estimated_price("us-east5-b", Tier.FLEX_START, ACC) == (1.35, True)

    def test_ties_follow_the_users_tier_then_zone_order(self) -> None:
        ranked = rank(["us-west1-c", "us-central1-b"], [Tier.SPOT], ACC, {}, NOW)
        assert [c.zone for c in ranked] == ["us-west1-c", "us-central1-b"]


class TestTokenBucket:
    def test_a_burst_is_capped_and_tokens_come_back_with_time(self) -> None:
        bucket = TokenBucket.per_minute(6, burst=3)
        state = bucket.full(NOW)
        granted = []
        for _ in range(5):
            ok, state = bucket.take(state, NOW)
            granted.append(ok)
        assert granted == [True, True, True, False, False]
        assert bucket.wait_s(state, NOW) == pytest.approx(10.0)
        ok, state = bucket.take(state, NOW + timedelta(seconds=10))
        assert ok
        assert bucket.available(state, NOW + timedelta(hours=1)) == 3

    def test_a_429_empties_the_bucket_for_a_minute(self) -> None:
        bucket = TokenBucket.per_minute(60, burst=10)
        state = bucket.drain(bucket.full(NOW), NOW)
        assert bucket.available(state, NOW + timedelta(seconds=59)) == 0
        assert bucket.wait_s(state, NOW) == pytest.approx(61.0)
        assert bucket.available(state, NOW + timedelta(seconds=65)) == 5

    def test_time_running_backwards_grants_nothing_extra(self) -> None:
        bucket = TokenBucket.per_minute(60, burst=2)
        _, state = bucket.take(bucket.full(NOW), NOW, 2)
        assert bucket.available(state, NOW - timedelta(minutes=5)) == 0

    @pytest.mark.parametrize(("capacity", "refill", "field"), [(0, 1.0, "capacity"), (5, 0.0, "refill_per_s")])
    def test_a_bad_bucket_names_the_field(self, capacity: float, refill: float, field: str) -> None:
        with pytest.raises(ValueError, match=field):
            TokenBucket(capacity=capacity, refill_per_s=refill)

"""Back ends in the capacity search: machine types, quota pools per back end, memory views, ranking."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from shared.domain.backends import (
    accelerator_of_machine_type,
    blocking_entry_for,
    candidate_backends,
    learn_for_backend,
    machine_type_of,
    memory_view,
    rank_backends,
)
from shared.domain.errors import ErrorClass, ErrorScope
from shared.domain.models import Backend, Tier, ZoneMemoryEntry
from shared.domain.quota import compute_pool, compute_quota_ids, quota_alternatives, quota_blocking_entry
from shared.domain.zone_memory import CloudFailure, blocking_entry, learn

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
ACC = "v6e-4"


def learned(
    failure: CloudFailure,
    backend: Backend,
    zone: str = "us-east5-b",
    tier: Tier = Tier.SPOT,
    memory: dict[str, ZoneMemoryEntry] | None = None,
) -> dict[str, ZoneMemoryEntry]:
    memory = dict(memory or {})
    entry = learn_for_backend(failure, backend=backend, zone=zone, tier=tier, accelerator=ACC, memory=memory, now=NOW)
    assert entry is not None
    memory[entry.key] = entry
    return memory


def quota(quota_id: str) -> CloudFailure:
    return CloudFailure(
        ErrorClass.QUOTA_REGION,
        f"Quota exceeded in region us-east5 ({quota_id})",
        quota_id=quota_id,
        location="us-east5",
    )


PREEMPTIBLE = "PREEMPTIBLE-TPU-V6E-per-project-region"
FAMILY = "TPUS-PER-TPU-FAMILY-per-project-region"


class TestTables:
    @pytest.mark.parametrize(
        ("accelerator", "machine"),
        [("v6e-1", "ct6e-standard-1t"), ("v6e-4", "ct6e-standard-4t"), ("v6e-8", "ct6e-standard-8t")],
    )
    def test_v6e_slices_map_to_ct6e_machine_types_and_back(self, accelerator: str, machine: str) -> None:
        assert machine_type_of(accelerator) == machine
        assert accelerator_of_machine_type(f"zones/us-east5-b/machineTypes/{machine}") == accelerator

    def test_unknown_slices_have_no_machine_type(self) -> None:
        assert machine_type_of("v6e-256") is None
        assert accelerator_of_machine_type("n2-standard-4") is None

    def test_any_means_both_back_ends_compute_engine_first(self) -> None:
        assert candidate_backends(Backend.ANY) == (Backend.COMPUTE_ENGINE, Backend.TPU_API)
        assert candidate_backends("tpu-api") == (Backend.TPU_API,)

    @pytest.mark.parametrize(
        ("tier", "ids"),
        [
            (Tier.SPOT, (PREEMPTIBLE,)),
            (Tier.FLEX_START, (PREEMPTIBLE, FAMILY)),
            (Tier.ON_DEMAND, (FAMILY,)),
            (Tier.RESERVATION, ()),
        ],
    )
    def test_compute_engine_spends_the_pools_of_its_provisioning_model(self, tier: Tier, ids: tuple[str, ...]) -> None:
        assert compute_quota_ids(ACC, tier) == ids

    def test_pools_are_named_apart_per_back_end(self) -> None:
        assert quota_alternatives(Backend.TPU_API, ACC, Tier.SPOT) == ("tpuv6epreemptible",)
        assert quota_alternatives(Backend.COMPUTE_ENGINE, ACC, Tier.FLEX_START) == (
            "ce-preemptible-tpu-v6e",
            "ce-tpus-per-tpu-family-ct6e",
        )
        assert compute_pool(None, ACC, Tier.SPOT) == "ce-tier-spot"


class TestQuotaPerBackEnd:
    def test_a_compute_engine_quota_block_never_blocks_the_tpu_api(self) -> None:
        memory = learned(quota(PREEMPTIBLE), Backend.COMPUTE_ENGINE)
        assert blocking_entry_for(memory, "us-east5-b", Tier.SPOT, ACC, Backend.COMPUTE_ENGINE, NOW) is not None
        assert blocking_entry_for(memory, "us-east5-a", Tier.SPOT, ACC, Backend.COMPUTE_ENGINE, NOW) is not None
        assert blocking_entry_for(memory, "us-east5-b", Tier.SPOT, ACC, Backend.TPU_API, NOW) is None
        assert blocking_entry(memory, "us-east5-b", Tier.SPOT, ACC, NOW) is None  # the planner's old view too

    def test_a_tpu_api_quota_block_never_blocks_compute_engine(self) -> None:
        failure = quota("TPUV6EPreemptiblePerProjectPerRegionForTPUAPI")
        memory = {}
        entry = learn(failure, zone="us-east5-b", tier=Tier.SPOT, accelerator=ACC, memory=memory, now=NOW)
        assert entry is not None
        memory[entry.key] = entry
        assert blocking_entry_for(memory, "us-east5-b", Tier.SPOT, ACC, Backend.TPU_API, NOW) is not None
        assert blocking_entry_for(memory, "us-east5-b", Tier.SPOT, ACC, Backend.COMPUTE_ENGINE, NOW) is None

    def test_flex_start_is_blocked_only_when_both_of_its_pools_are(self) -> None:
        memory = learned(quota(PREEMPTIBLE), Backend.COMPUTE_ENGINE)
        flex = (memory, "us-east5-b", Tier.FLEX_START, ACC, Backend.COMPUTE_ENGINE, NOW)
        assert blocking_entry_for(*flex) is None  # the family pool may still have room
        assert blocking_entry_for(memory, "us-east5-b", Tier.ON_DEMAND, ACC, Backend.COMPUTE_ENGINE, NOW) is None
        memory = learned(quota(FAMILY), Backend.COMPUTE_ENGINE, tier=Tier.ON_DEMAND, memory=memory)
        blocked = blocking_entry_for(memory, "us-east5-b", Tier.FLEX_START, ACC, Backend.COMPUTE_ENGINE, NOW)
        assert blocked is not None
        assert blocked.error_class == ErrorClass.QUOTA_REGION.value
        assert quota_blocking_entry(memory, "us-central1-a", Tier.FLEX_START, ACC, Backend.COMPUTE_ENGINE, NOW) is None

    def test_compute_engine_quota_blocks_back_off_and_expire(self) -> None:
        memory = learned(quota(PREEMPTIBLE), Backend.COMPUTE_ENGINE)
        again = learned(quota(PREEMPTIBLE), Backend.COMPUTE_ENGINE, memory=memory)
        entry = again["quota/region/us-east5/ce-preemptible-tpu-v6e"]
        assert (entry.failures, entry.tier) == (2, None)
        assert entry.until == NOW + timedelta(seconds=1200)
        later = NOW + timedelta(hours=2)
        assert blocking_entry_for(again, "us-east5-b", Tier.SPOT, ACC, Backend.COMPUTE_ENGINE, later) is None


class TestCatalogueFacts:
    def test_an_unknown_zone_on_compute_engine_drops_the_zone_there_only(self) -> None:
        failure = CloudFailure(
            ErrorClass.UNSUPPORTED,
            "Invalid value for field 'zone': 'asia-east1-a'. Unknown zone.",
            scope=ErrorScope.ZONE,  # as the Compute Engine adapter reads "Unknown zone"
        )
        memory = learned(failure, Backend.COMPUTE_ENGINE, zone="asia-east1-a")
        assert list(memory) == ["unsupported@compute-engine/zone/asia-east1-a"]
        for tier in Tier:
            assert blocking_entry_for(memory, "asia-east1-a", tier, ACC, Backend.COMPUTE_ENGINE, NOW) is not None
            assert blocking_entry_for(memory, "asia-east1-a", tier, ACC, Backend.TPU_API, NOW) is None

    def test_a_zone_the_tpu_api_does_not_serve_stays_open_to_compute_engine(self) -> None:
        failure = CloudFailure(
            ErrorClass.UNSUPPORTED, 'The requested zone "asia-northeast1-a" is not supported.', scope=ErrorScope.ZONE
        )
        memory = learned(failure, Backend.TPU_API, zone="asia-northeast1-a")
        assert blocking_entry_for(memory, "asia-northeast1-a", Tier.SPOT, ACC, Backend.TPU_API, NOW) is not None
        assert blocking_entry_for(memory, "asia-northeast1-a", Tier.SPOT, ACC, Backend.COMPUTE_ENGINE, NOW) is None

    def test_a_stockout_is_about_the_hardware_and_holds_for_both(self) -> None:
        memory = learned(CloudFailure(ErrorClass.STOCKOUT, "no capacity"), Backend.COMPUTE_ENGINE)
        for backend in (Backend.COMPUTE_ENGINE, Backend.TPU_API):
            assert blocking_entry_for(memory, "us-east5-b", Tier.SPOT, ACC, backend, NOW) is not None

    def test_the_tpu_api_view_is_the_memory_unchanged(self) -> None:
        memory = learned(CloudFailure(ErrorClass.STOCKOUT, "x"), Backend.TPU_API)
        assert memory_view(memory, Backend.TPU_API, ACC, NOW) == memory


class TestRanking:
    def test_equal_prices_tie_break_by_tier_then_zone_then_the_back_end_that_waits(self) -> None:
        both = candidate_backends(Backend.ANY)
        spot = rank_backends(["us-east5-b", "us-east5-a"], [Tier.SPOT], both, ACC, {}, NOW)
        assert [(c.zone, c.backend) for c in spot] == [
            ("us-east5-b", Backend.TPU_API),  # a queued resource keeps its place; a spot VM insert fails at once
            ("us-east5-b", Backend.COMPUTE_ENGINE),
            ("us-east5-a", Backend.TPU_API),
            ("us-east5-a", Backend.COMPUTE_ENGINE),
        ]
        flex = rank_backends(["us-east5-b"], [Tier.FLEX_START], both, ACC, {}, NOW)
        assert [c.backend for c in flex] == [Backend.COMPUTE_ENGINE, Backend.TPU_API]  # flex-start VMs wait too

    def test_a_back_end_blocked_in_a_zone_leaves_the_other_one_ranked(self) -> None:
        memory = learned(quota(PREEMPTIBLE), Backend.COMPUTE_ENGINE)
        ranked = rank_backends(["us-east5-b"], [Tier.SPOT], candidate_backends(Backend.ANY), ACC, memory, NOW)
        assert [(c.zone, c.tier, c.backend) for c in ranked] == [("us-east5-b", Tier.SPOT, Backend.TPU_API)]
        assert ranked[0].score == pytest.approx(1.4033)

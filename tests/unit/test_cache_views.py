"""The plan's weights-cache view: each region's state, from what the bucket holds, and what keeping it costs."""

from __future__ import annotations

import pytest

from mcp_client_gateway.cache_views import prewarm_view, weights_cache_views
from shared.domain.cost import estimate_cost
from shared.domain.errors import CloudError, ErrorClass
from shared.domain.models import Tier

HUB_ID = "google/gemma-4-31b-it"
MODEL_BYTES = 62_000_000_000


class FakeCacheState:
    """Bytes cached per (bucket, repo); a bucket in ``unreadable`` refuses, as a missing grant does."""

    def __init__(
        self,
        held: dict[tuple[str, str], int],
        unreadable: frozenset[str] = frozenset(),
        compiled: dict[tuple[str, str, str], int] | None = None,
    ) -> None:
        self.held = held
        self.unreadable = unreadable
        self.compiled = compiled or {}
        self.asked: list[str] = []

    def compiled_bytes(self, bucket: str, repo_id: str, key: str) -> int | None:
        if bucket in self.unreadable:
            raise CloudError(ErrorClass.PERMISSION, f"Cloud Storage read of gs://{bucket}: HTTP 403")
        return self.compiled.get((bucket, repo_id, key))

    def cached_bytes(self, bucket: str, repo_id: str) -> int:
        self.asked.append(bucket)
        if bucket in self.unreadable:
            raise CloudError(ErrorClass.PERMISSION, f"Cloud Storage list of gs://{bucket}: HTTP 403")
        return self.held.get((bucket, repo_id), 0)


BUCKETS = {"us-east5": "w-us-east5", "europe-west4": "w-europe-west4", "us-central1": "w-us-central1"}


@pytest.mark.parametrize(
    ("cached", "state", "usd"),
    [(MODEL_BYTES, "warm", 1.24), (MODEL_BYTES // 4, "partial", 1.24), (0, "cold", 1.24)],
)
def test_a_regions_cache_is_warm_partial_or_cold_and_priced_for_the_whole_model(
    cached: int, state: str, usd: float
) -> None:
    fake = FakeCacheState({("w-us-east5", HUB_ID): cached})
    (view,) = weights_cache_views(BUCKETS, False, fake, HUB_ID, MODEL_BYTES, ["us-east5-a", "us-east5-b"])
    assert (view.region, view.bucket, view.state, view.cached_bytes) == ("us-east5", "w-us-east5", state, cached)
    assert view.usd_per_month == usd and f"${usd:.2f}/month" in view.note
    assert fake.asked == ["w-us-east5"]  # one read per region, not per zone


def test_a_region_without_a_cache_boots_from_the_hub_and_its_neighbours_cache_is_not_read() -> None:
    fake = FakeCacheState({("w-us-east5", HUB_ID): MODEL_BYTES})
    views = weights_cache_views({"us-east5": "w-us-east5"}, False, fake, HUB_ID, MODEL_BYTES, ["asia-east1-c"])
    assert [(v.region, v.state, v.bucket) for v in views] == [("asia-east1", "none", None)]
    assert "not read across regions" in views[0].note and fake.asked == []


def test_an_unreadable_cache_is_said_so_with_the_reason() -> None:
    fake = FakeCacheState({}, unreadable=frozenset({"w-europe-west4"}))
    zones = ["us-east5-a", "europe-west4-a"]
    views = weights_cache_views(BUCKETS, False, fake, HUB_ID, MODEL_BYTES, zones)
    assert [(v.region, v.state) for v in views] == [("us-east5", "cold"), ("europe-west4", "unreadable")]
    assert "HTTP 403" in views[1].note


def test_no_installed_cache_means_every_region_boots_from_the_hub() -> None:
    views = weights_cache_views({}, False, None, HUB_ID, MODEL_BYTES, ["us-east5-a"])
    assert [(v.state, v.bucket) for v in views] == [("none", None)]
    assert "weights_cache_regions" in views[0].note


KEY = "0123456789abcdef0123456789abcdef"


def test_a_regions_compile_cache_is_warm_only_for_this_plans_key_and_is_priced() -> None:
    fake = FakeCacheState({("w-us-east5", HUB_ID): MODEL_BYTES}, compiled={("w-us-east5", HUB_ID, KEY): 300_000_000})
    zones = ["us-east5-a", "us-central1-a"]
    warm, cold = weights_cache_views(BUCKETS, False, fake, HUB_ID, MODEL_BYTES, zones, KEY)
    assert (warm.compile_cache, warm.compile_bytes) == ("warm", 300_000_000) and "300 MB" in warm.note
    assert cold.compile_cache == "cold" and "tpuctl prewarm" in cold.note
    (other,) = weights_cache_views(BUCKETS, False, fake, HUB_ID, MODEL_BYTES, zones[:1], "f" * 32)
    assert other.compile_cache == "cold"  # another plan's flags or slice: another key
    (unkeyed,) = weights_cache_views(BUCKETS, False, fake, HUB_ID, MODEL_BYTES, zones[:1])
    assert unkeyed.compile_cache is None


def test_a_prewarm_is_priced_from_the_calibrated_cold_boot_at_the_cheapest_price() -> None:
    cheapest = estimate_cost("v6e-4", "us-east5", Tier.SPOT)
    assert cheapest is not None
    view = prewarm_view("gemma-4-26b-a4b", "v6e-4", cheapest)
    assert view is not None and 9.0 < view.minutes < 12.0  # 616 s cold on one chip (docs/reference/time-to-serve.md)
    assert view.usd == pytest.approx(cheapest.usd_per_hour * view.minutes / 60.0, abs=0.01) and (
        view.region,
        view.tier,
    ) == (
        "us-east5",
        "spot",
    )
    assert prewarm_view("gemma-4-26b-a4b", "v5p-8", cheapest) is None  # the model is calibrated on v6e only
    assert prewarm_view("gemma-4-26b-a4b", "v6e-4", None) is None

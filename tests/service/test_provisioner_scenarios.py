"""The eleven simulator scenarios of docs/reference/tpu-api.md §9, each on the TPU simulator through the real adapter.

Every test drives the provisioner with commands and minute ticks in virtual time and asserts the end
state (where the slice runs, what was deleted, what zone memory learned) and the invariants (no orphan,
no stale FAILED/SUSPENDED leftover, at most one ACTIVE slice per deployment, state matches the world).
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest

from shared.domain.cloud import LABEL_DEPLOYMENT, LABEL_GENERATION, OperationStatus, ProvisionRequest
from shared.domain.errors import CloudError, ErrorClass
from shared.domain.models import Phase, QueuedResourceState, Tier
from shared.domain.planner import PlannerPolicy, request_id
from shared.domain.ratelimit import TokenBucket
from shared.domain.zone_memory import blocking_entry
from shared.entry import Outcome, PubSubPayload, handle_payload
from shared.messages import CreateDeployment, encode_message
from shared.ports import TpuApi
from shared.services.provisioner import ProvisionerSettings
from tests.support.fixtures_provisioner import HarnessFactory, spot, world
from tests.support.provisioner_harness import Harness, make_spec

CHEAP = "us-central1-b"  # spot 0.648, ranked first
CHEAP_2 = "us-east1-d"  # spot 0.648, second
EUROPE = "europe-west4-a"  # spot 0.713, third


def _creates(harness: Harness, zone: str | None = None) -> list[str]:
    """Queued resources the simulator saw created (from its event log)."""
    return [e["resource"] for e in harness.world.events() if e["kind"] == "qr.creating" and zone in (None, e["zone"])]


def _ever_active(harness: Harness, name: str) -> bool:
    return any(e["kind"] == "qr.active" and e["resource"] == name for e in harness.world.events())


class TestScenario01Stockout:
    def test_a_stockout_fails_over_within_one_tick_and_cools_the_zone_with_a_ttl(
        self, harness_factory: HarnessFactory
    ) -> None:
        h = harness_factory(world({CHEAP: spot(0), EUROPE: spot(8)}))
        h.create(zones=(CHEAP, EUROPE), valid_until_minutes=5)
        assert h.zones_tried() == [CHEAP]
        h.run(10, until=lambda: bool(_creates(h, EUROPE)))
        attempts = h.record().status.attempts
        expired = next(a for a in attempts if a.outcome == "expired")
        failover = next(a for a in attempts if a.outcome == "requested" and a.zone == EUROPE)
        assert expired.zone == CHEAP
        assert failover.at == expired.at  # the same tick that saw the stockout asked elsewhere

        entry = h.memory()[f"stockout/{CHEAP}/v6e/spot"]
        assert entry.kind == "cooldown"
        assert entry.until is not None and entry.until > expired.at
        assert blocking_entry(h.memory(), CHEAP, Tier.SPOT, "v6e-4", entry.until + timedelta(seconds=1)) is None

        h.run_until_phase(Phase.BOOTING, minutes=15)
        assert h.active() == ["gemma-g1-a1"]
        h.run(3)
        assert "gemma-g1-a0" not in h.qrs()
        h.assert_invariants()


class TestScenario02Quota:
    def test_zone_quota_blocks_the_zone_and_region_quota_blocks_every_zone_of_the_region(
        self, harness_factory: HarnessFactory
    ) -> None:
        zones = {CHEAP: spot(8), "us-east1-d": spot(8), "us-east1-c": spot(8), EUROPE: spot(8)}
        quotas = [
            {"id": "TPUV6EPreemptiblePerProjectPerZoneForTPUAPI", "location": CHEAP, "limit": 0},
            {"id": "TPUV6EPreemptiblePerProjectPerRegionForTPUAPI", "location": "us-east1", "limit": 0},
            {"id": "TPUV6EPreemptiblePerProjectPerZoneForTPUAPI", "location": "us-east1-d", "limit": 64},
        ]
        h = harness_factory(world(zones, quotas=quotas))
        outcome = h.create(zones=(CHEAP, "us-east1-d", "us-east1-c", EUROPE))
        assert "created gemma-g1-a2" in outcome  # three plans in one invocation: two refusals, then Europe
        memory = h.memory()
        zone_block = memory[f"quota/zone/{CHEAP}/TPUV6EPreemptible"]
        region_block = memory["quota/region/us-east1/TPUV6EPreemptible"]
        assert zone_block.quota_id == "TPUV6EPreemptiblePerProjectPerZoneForTPUAPI"
        assert region_block.quota_id == "TPUV6EPreemptiblePerProjectPerRegionForTPUAPI"
        assert region_block.until is not None  # rechecked later, not forever
        assert h.zones_tried() == [CHEAP, "us-east1-d", EUROPE]
        assert _creates(h, "us-east1-c") == []  # never tried: its region is blocked for that quota
        h.run_until_phase(Phase.BOOTING, minutes=10)
        assert h.active() == ["gemma-g1-a2"]
        h.assert_invariants()


class TestScenario03PermissionAndCatalogue:
    def test_a_denied_zone_is_blocked_for_good_and_unsupported_pairs_are_dropped(
        self, harness_factory: HarnessFactory
    ) -> None:
        zones = {
            CHEAP: spot(8, forbidden=True),
            "us-east1-d": spot(8, accelerators=["v6e-8"]),
            "us-west1-c": spot(8, served=False),
            EUROPE: spot(8),
        }
        h = harness_factory(world(zones))
        h.create(zones=(CHEAP, "us-east1-d", "us-west1-c", EUROPE))
        memory = h.memory()
        assert memory[f"permission/zone/{CHEAP}"].until is None
        assert memory["unsupported/accelerator/us-east1-d/v6e-4"].kind == "unsupported"
        assert memory["unsupported/zone/us-west1-c"].kind == "unsupported"
        h.run_until_phase(Phase.BOOTING, minutes=10)
        assert h.record().status.zone == EUROPE

        second = make_spec("gemma-two", zones=(CHEAP, "us-east1-d", "us-west1-c", EUROPE))
        h.create(second)
        assert h.zones_tried("gemma-two") == [EUROPE]  # the catalogue facts spared it three refusals
        h.run_until_phase(Phase.BOOTING, minutes=10, deployment_id="gemma-two")
        h.assert_invariants()


class TestScenario04ValidUntil:
    @pytest.mark.parametrize("quota_leak", [False, True])
    def test_a_request_failed_at_valid_until_is_deleted_before_the_retry_so_quota_never_leaks(
        self, harness_factory: HarnessFactory, quota_leak: bool
    ) -> None:
        zones = {"us-east1-d": spot(0), "us-east1-c": spot(8)}
        quotas = [{"id": "TPUV6EPreemptiblePerProjectPerRegionForTPUAPI", "location": "us-east1", "limit": 4}]
        h = harness_factory(world(zones, quotas=quotas, limits={"quota_leak": quota_leak}))
        h.create(zones=("us-east1-d", "us-east1-c"), valid_until_minutes=5)
        h.run_until_phase(Phase.BOOTING, minutes=20)
        assert h.active() == ["gemma-g1-a1"]
        assert not any(key.startswith("quota/") for key in h.memory())  # the retry never hit the quota
        h.run(2)
        assert "gemma-g1-a0" not in h.qrs()
        report = h.assert_invariants()
        assert report["leftovers"] == []


class TestScenario05GiveUpOnWaiting:
    def test_a_waiting_request_is_force_deleted_and_never_turns_active(self, harness_factory: HarnessFactory) -> None:
        late = {"chips": 0, "timeline": [{"at_s": 1800, "chips": 8}]}
        h = harness_factory(world({CHEAP: spot(late), EUROPE: spot(8)}))
        h.create(zones=(CHEAP, EUROPE), hedge=2)
        assert sorted(h.qrs()) == ["gemma-g1-a0", "gemma-g1-a1"]
        h.run_until_phase(Phase.BOOTING, minutes=15)
        assert h.record().status.zone == EUROPE
        h.run(40, step_s=300)  # well past the moment capacity shows up in the abandoned zone
        assert not _ever_active(h, "gemma-g1-a0")
        assert h.world.pool(CHEAP, "spot")["used"] == 0
        assert h.active() == ["gemma-g1-a1"]
        h.assert_invariants()

    def test_a_request_given_up_after_its_capacity_check_is_never_fulfilled_later(
        self, harness_factory: HarnessFactory
    ) -> None:
        late = {"chips": 0, "timeline": [{"at_s": 1800, "chips": 8}]}
        no_parking = ProvisionerSettings(holder="test-provisioner", planner=PlannerPolicy(park_after_check=0))
        h = harness_factory(world({CHEAP: spot(late), EUROPE: spot(0)}), settings=no_parking)
        h.create(zones=(CHEAP, EUROPE))
        h.run(12)
        assert any(a.outcome == "checked" and a.zone == CHEAP for a in h.record().status.attempts)
        assert "gemma-g1-a0" not in h.qrs()  # force-deleted and verified gone
        h.run_until_phase(Phase.BOOTING, minutes=60)
        assert not _ever_active(h, "gemma-g1-a0")
        assert h.record().status.zone == CHEAP  # a later request there got the chips
        h.assert_invariants()

    def test_a_parked_request_gets_the_chips_when_they_arrive_and_the_other_is_deleted(
        self, harness_factory: HarnessFactory
    ) -> None:
        late = {"chips": 0, "timeline": [{"at_s": 1800, "chips": 8}]}
        h = harness_factory(world({CHEAP: spot(late), EUROPE: spot(0)}))
        h.create(zones=(CHEAP, EUROPE))
        h.run(12)
        assert {a.zone for a in h.record().status.attempts if a.outcome == "parked"} == {CHEAP, EUROPE}
        assert sorted(h.qrs()) == ["gemma-g1-a0", "gemma-g1-a1"]  # both still queued, nothing re-asked
        h.run_until_phase(Phase.BOOTING, minutes=60)
        assert h.record().status.zone == CHEAP
        assert h.active() == ["gemma-g1-a0"]  # the request parked since minute 5 got the chips at once
        h.run(5)
        assert sorted(h.qrs()) == ["gemma-g1-a0"]  # the other parked request was force-deleted
        h.assert_invariants()

    def test_deleting_a_deployment_while_it_waits_leaves_nothing_to_be_fulfilled_later(
        self, harness_factory: HarnessFactory
    ) -> None:
        late = {"chips": 0, "timeline": [{"at_s": 900, "chips": 8}]}
        h = harness_factory(world({CHEAP: spot(late)}))
        h.create(zones=(CHEAP,))
        h.run(3)
        h.delete()
        h.run_until_phase(Phase.DELETED, minutes=10)
        h.run(30, step_s=300)
        assert h.qrs() == {}
        assert not _ever_active(h, "gemma-g1-a0")
        h.assert_invariants(live=[])


class TestScenario06Preemption:
    def test_a_preempted_slice_is_deleted_and_relaunched_in_another_region(
        self, harness_factory: HarnessFactory
    ) -> None:
        h = harness_factory(world({CHEAP: spot(8), "us-central1-c": spot(8), EUROPE: spot(8)}))
        h.create(zones=(CHEAP, "us-central1-c", EUROPE))
        h.run_until_phase(Phase.BOOTING, minutes=10)
        assert h.record().status.zone == CHEAP
        h.world.preempt(CHEAP, queued_resource="gemma-g1-a0")
        h.world.advance(30)
        h.tick()
        record = h.record()
        assert record.status.phase is Phase.SEARCHING
        assert h.zones_tried()[-1] == EUROPE  # eager next region: us-central1-c is skipped
        assert "preempted/us-central1/v6e/spot" in h.memory()
        h.run_until_phase(Phase.BOOTING, minutes=10)
        h.run(3)
        assert h.active() == ["gemma-g1-a1"]
        assert "gemma-g1-a0" not in h.qrs()  # the SUSPENDED request and its PREEMPTED node are gone
        h.assert_invariants()

    def test_a_preemption_during_provisioning_is_handled_the_same_way(self, harness_factory: HarnessFactory) -> None:
        zones = {CHEAP: spot(8, timings={"boot_s": [600, 600]}), EUROPE: spot(8)}
        h = harness_factory(world(zones))
        h.create(zones=(CHEAP, EUROPE))
        h.run(3)
        assert h.qrs()["gemma-g1-a0"] == "PROVISIONING"
        assert h.world.preempt(CHEAP, queued_resource="gemma-g1-a0")
        h.run_until_phase(Phase.BOOTING, minutes=15)
        h.run(3)
        assert h.record().status.zone == EUROPE
        assert list(h.qrs()) == ["gemma-g1-a1"]
        h.assert_invariants()


class TestScenario07Cycling:
    def test_stuck_provisioning_is_told_apart_from_waiting_for_chips(self, harness_factory: HarnessFactory) -> None:
        cycling = spot(8, cycling={"probability": 1.0, "fail_after_s": None})
        late = spot({"chips": 0, "timeline": [{"at_s": 3600, "chips": 8}]})
        h = harness_factory(world({CHEAP: cycling, EUROPE: late}))
        h.create(zones=(CHEAP, EUROPE))
        h.run(10, step_s=120)
        assert h.qrs() == {"gemma-g1-a0": "PROVISIONING"}
        assert "stuck" not in h.record().status.message

        h.run(14, step_s=120)  # 24 minutes in: stuck, so the hedge goes elsewhere
        message = h.record().status.message
        assert f"stuck provisioning in {CHEAP}" in message
        assert f"{EUROPE} spot: waiting for chips" in message
        assert h.zones_tried() == [CHEAP, EUROPE]

        h.run(24, step_s=120)  # 48 minutes in: abandoned and cooled down like a stockout
        entry = h.memory()[f"stockout/{CHEAP}/v6e/spot"]
        assert entry.error_class == "stuck_provisioning"
        assert any(a.outcome == "stuck" for a in h.record().status.attempts)
        h.run_until_phase(Phase.BOOTING, minutes=20)
        h.run(2)
        assert len(h.active()) == 1
        assert h.record().status.zone == EUROPE
        assert "gemma-g1-a0" not in h.qrs()
        h.assert_invariants()


class _CrashAfterCreate:
    """A TpuApi whose first create succeeds at the provider and then "crashes" before returning."""

    def __init__(self, inner: TpuApi) -> None:
        self.inner = inner
        self.crashes = 1

    def create(self, request: ProvisionRequest) -> OperationStatus:
        op = self.inner.create(request)
        if self.crashes:
            self.crashes -= 1
            raise RuntimeError("function instance died after the create call")
        return op

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class TestScenario08Duplicates:
    def test_a_duplicate_delivery_creates_nothing_twice(self, harness_factory: HarnessFactory) -> None:
        h = harness_factory(world({CHEAP: spot(0)}))
        spec = make_spec(zones=(CHEAP,))
        message = CreateDeployment(
            deployment_id="gemma", spec=spec, command_id=str(uuid.uuid4()), issued_at=h.clock.now()
        )
        payload = PubSubPayload(data=encode_message(message), message_id="m-1")
        first = handle_payload(payload, h.provisioner.handle, store=h.store, clock=h.clock, max_age_s=600)
        second = handle_payload(payload, h.provisioner.handle, store=h.store, clock=h.clock, max_age_s=600)
        assert (first.outcome, second.outcome) == (Outcome.APPLIED, Outcome.DUPLICATE)
        assert _creates(h) == ["gemma-g1-a0"]

    def test_a_crash_between_the_create_and_the_state_write_is_adopted_not_repeated(
        self, harness_factory: HarnessFactory
    ) -> None:
        h = harness_factory(world({CHEAP: spot(8)}))
        crashing = h.another(tpu=_CrashAfterCreate(h.tpu))
        spec = make_spec(zones=(CHEAP,))
        envelope = {"command_id": str(uuid.uuid4()), "issued_at": h.clock.now()}
        with pytest.raises(RuntimeError):
            crashing.handle(CreateDeployment(deployment_id="gemma", spec=spec, **envelope))
        assert h.record().status.resources[0].state is QueuedResourceState.UNKNOWN  # the expectation
        h.run(5)
        assert _creates(h) == ["gemma-g1-a0"]
        h.run_until_phase(Phase.BOOTING, minutes=10)
        h.assert_invariants()

    def test_already_exists_for_our_own_id_is_success(self, harness_factory: HarnessFactory) -> None:
        h = harness_factory(world({CHEAP: spot(8)}, limits={"list_lag_s": 90}))
        name = "gemma-g1-a0"
        h.tpu.create(
            ProvisionRequest(
                resource_id=name,
                node_id=name,
                zone=CHEAP,
                accelerator="v6e-4",
                tier=Tier.SPOT,
                request_id=str(uuid.uuid4()),
                labels={LABEL_DEPLOYMENT: "gemma", LABEL_GENERATION: "1"},
            )
        )
        outcome = h.create(zones=(CHEAP,))
        assert f"created {name}" in outcome  # 409, then a get proves it is ours
        assert h.record().status.resources[0].state is QueuedResourceState.CREATING
        assert _creates(h) == [name]
        h.run_until_phase(Phase.BOOTING, minutes=15)
        assert _creates(h) == [name]
        h.assert_invariants()

    def test_a_retried_create_carries_the_same_id_and_request_id(self, harness_factory: HarnessFactory) -> None:
        h = harness_factory(world({CHEAP: spot(0)}))
        recording = _RecordingTpu(h.tpu)
        h.provisioner = h.another(tpu=recording)
        h.world.inject_fault({"endpoint": "create_queued_resource", "status": 503, "times": 1})
        h.create(zones=(CHEAP,))
        assert _creates(h) == []
        h.run(1)
        assert _creates(h) == ["gemma-g1-a0"]
        expected = ("gemma-g1-a0", request_id("gemma", 1, 0, "create"))
        assert recording.sent == [expected, expected]


class _RecordingTpu:
    """Remembers (resource id, request id) of every create sent."""

    def __init__(self, inner: TpuApi) -> None:
        self.inner = inner
        self.sent: list[tuple[str, str]] = []

    def create(self, request: ProvisionRequest) -> OperationStatus:
        self.sent.append((request.resource_id, request.request_id))
        return self.inner.create(request)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class _CountingTpu:
    """Counts rate-limit refusals the provider answered."""

    def __init__(self, inner: TpuApi) -> None:
        self.inner = inner
        self.rate_limited = 0

    def create(self, request: ProvisionRequest) -> OperationStatus:
        try:
            return self.inner.create(request)
        except CloudError as exc:
            if exc.error_class is ErrorClass.RATE_LIMIT:
                self.rate_limited += 1
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class TestScenario09RateLimit:
    def _fan_out(self, h: Harness, deployments: int) -> None:
        for index in range(deployments):
            h.create(make_spec(f"fan-{index}", zones=(CHEAP, EUROPE), hedge=2))

    def test_our_token_bucket_keeps_fan_out_under_the_project_limit(self, harness_factory: HarnessFactory) -> None:
        settings = ProvisionerSettings(holder="bucket", create_bucket=TokenBucket.per_minute(4, burst=4))
        h = harness_factory(
            world({CHEAP: spot(0), EUROPE: spot(0)}, limits={"creates_per_minute": 5}), settings=settings
        )
        counting = _CountingTpu(h.tpu)
        h.provisioner = h.another(tpu=counting)
        self._fan_out(h, 4)
        assert len(_creates(h)) == 4  # the burst
        h.run(3)
        assert len(_creates(h)) == 8
        assert counting.rate_limited == 0
        assert "ratelimit/project" not in h.memory()
        h.assert_invariants()

    def test_a_429_from_the_api_pauses_every_create_for_a_minute_and_blocks_no_zone(
        self, harness_factory: HarnessFactory
    ) -> None:
        settings = ProvisionerSettings(holder="greedy", create_bucket=TokenBucket.per_minute(60, burst=20))
        h = harness_factory(
            world({CHEAP: spot(0), EUROPE: spot(0)}, limits={"creates_per_minute": 5}), settings=settings
        )
        counting = _CountingTpu(h.tpu)
        h.provisioner = h.another(tpu=counting)
        self._fan_out(h, 4)
        assert len(_creates(h)) == 5
        assert counting.rate_limited == 1  # the first refusal pauses the rest of the fan-out
        assert "ratelimit/project" in h.memory()
        h.run(4)
        assert len(_creates(h)) == 8
        assert not any(key.startswith(("stockout/", "quota/", "unknown/")) for key in h.memory())
        h.assert_invariants()


class TestScenario10FlexStartEnds:
    def test_the_end_of_a_flex_start_run_is_a_normal_end_of_lease(self, harness_factory: HarnessFactory) -> None:
        h = harness_factory(world({"us-east5-b": {"capacity": {"v6e": {"flex_start": 8}}}}))
        h.create(zones=("us-east5-b",), tiers=(Tier.FLEX_START,), max_run_hours=0.1)
        h.run_until_phase(Phase.BOOTING, minutes=10)
        first_active = h.record().status.attempts[-1].at
        h.run(8, until=lambda: any(a.outcome == "ended" for a in h.record().status.attempts))
        attempts = h.record().status.attempts
        assert any(a.outcome == "ended" for a in attempts)
        assert h.memory() == {}  # not a stockout, not a preemption
        assert first_active < attempts[-1].at
        h.run_until_phase(Phase.BOOTING, minutes=10)
        assert h.active() == ["gemma-g1-a1"]
        h.run(2)
        assert "gemma-g1-a0" not in h.qrs()
        h.assert_invariants()


class TestScenario11Transient:
    def test_a_503_on_get_operation_leaves_the_operation_stored_for_the_next_tick(
        self, harness_factory: HarnessFactory
    ) -> None:
        h = harness_factory(world({CHEAP: spot(0)}))
        h.create(zones=(CHEAP,))
        stored = h.record().status.resources[0].operation
        assert stored is not None and "/operations/" in stored
        h.world.inject_fault({"endpoint": "get_operation", "status": 503, "times": 3})
        for _ in range(3):
            before = h.world.elapsed_s()
            h.world.advance(60)
            h.tick()
            assert h.world.elapsed_s() == before + 60  # the tick returned without waiting on anything
            assert h.record().status.resources[0].operation == stored
        h.run(1)
        assert h.record().status.resources[0].operation is None
        assert h.record().status.resources[0].state is QueuedResourceState.WAITING

    def test_a_503_on_listing_skips_the_tick_and_keeps_the_ticks_coming(self, harness_factory: HarnessFactory) -> None:
        h = harness_factory(world({CHEAP: spot(8)}))
        h.create(zones=(CHEAP,))
        h.world.inject_fault({"endpoint": "list_queued_resources", "status": 503, "times": 1})
        h.world.advance(60)
        assert "tick skipped" in h.tick()
        h.run_until_phase(Phase.BOOTING, minutes=10)
        h.assert_invariants()

"""Capacity advice, capacity history, calendar-mode advice and future reservations, served on the Compute
Engine REST wire and driven with the real google-cloud-compute ``AdviceClient`` and ``FutureReservationsClient``."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from google.api_core import exceptions
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1, tpu_v2

from localcloud.tpu_sim import SimServer, World
from localcloud.tpu_sim.advice_wire import APPROVAL_S
from localcloud.tpu_sim.compute_validation import ComputeApiError
from tests.support.fixtures_compute_sim import lab_world

PROJECT = "demo-proj"
REGION = "us-east5"
ZONE_A, ZONE_B = "us-east5-a", "us-east5-b"
START = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
NOISY = "advice-noisy"  # a shipped scenario (localcloud/tpu_sim/scenarios/)


class Sim:
    def __init__(self, scenario: str | dict[str, Any]) -> None:
        self.world = World(scenario)
        self.server = SimServer(self.world)
        options = ClientOptions(api_endpoint=self.server.start())
        credentials = AnonymousCredentials()
        self.advice = compute_v1.AdviceClient(credentials=credentials, client_options=options)
        self.reservations = compute_v1.FutureReservationsClient(credentials=credentials, client_options=options)

    def capacity(self, model: str = "SPOT", size: int = 1) -> list[tuple[str, float]]:
        request = {
            "instance_properties": {"scheduling": {"provisioning_model": model}},
            "instance_flexibility_policy": {"instance_selections": {"s1": {"machine_types": ["ct6e-standard-4t"]}}},
            "size": size,
            "distribution_policy": {"target_shape": "ANY_SINGLE_ZONE"},
        }
        answer = self.advice.capacity(project=PROJECT, region=REGION, capacity_advice_request_resource=request)
        return [(r.shards[0].zone.rsplit("/", 1)[-1], r.scores.obtainability) for r in answer.recommendations]


@pytest.fixture
def sims() -> Iterator[list[Sim]]:
    started: list[Sim] = []
    yield started
    for sim in started:
        sim.server.stop()


def spot_world(**extra: Any) -> dict[str, Any]:
    """us-east5-a has no spot chips until 30 min in, us-east5-b has 8 until then."""
    zones = {
        ZONE_A: {"capacity": {"v6e": {"spot": {"chips": 0, "timeline": [{"at_s": 1800, "chips": 8}]}}}},
        ZONE_B: {
            "capacity": {"v6e": {"spot": {"chips": 8, "timeline": [{"at_s": 1800, "chips": 0}]}}},
            "preemption": {"hazard_per_hour": 2.0},
        },
    }
    return lab_world(zones, **extra)


def test_accurate_advice_ranks_the_zone_whose_timeline_has_capacity_first(sims: list[Sim]) -> None:
    sims.append(sim := Sim(spot_world()))
    assert sim.capacity() == [(ZONE_B, 0.95), (ZONE_A, 0.0)]
    sim.world.advance(1800)
    assert sim.capacity() == [(ZONE_A, 0.95), (ZONE_B, 0.0)]
    assert sim.capacity(size=4) == [(ZONE_A, 0.47), (ZONE_B, 0.0)]  # 8 of the 16 chips asked for: half of 0.95


def test_advice_with_accuracy_zero_ranks_the_empty_zone_first(sims: list[Sim]) -> None:
    sims.append(sim := Sim(spot_world(advice={"accuracy": 0.0})))
    assert [zone for zone, _ in sim.capacity()] == [ZONE_A, ZONE_B]


def test_stale_advice_shows_capacity_as_of_n_minutes_ago(sims: list[Sim]) -> None:
    sims.append(stale := Sim(spot_world(advice={"staleness_minutes": 20})))
    stale.world.advance(2400)  # the truth flipped at 1800 s; 20 minutes ago (600 s) it had not
    assert stale.capacity()[0][0] == ZONE_B
    stale.world.advance(1200)  # 20 minutes ago is now 2400 s, past the flip
    assert stale.capacity()[0][0] == ZONE_A


def test_advice_refuses_a_request_naming_the_field(sims: list[Sim]) -> None:
    sims.append(sim := Sim(spot_world()))
    with pytest.raises(exceptions.BadRequest, match=r"instanceProperties\.scheduling\.provisioningModel"):
        sim.capacity(model="RESERVATION_BOUND")


def test_capacity_history_reports_the_zone_hazard_and_the_spot_price(sims: list[Sim]) -> None:
    sims.append(sim := Sim(spot_world(prices={REGION: {"spot": 1.25}})))
    request = {
        "instance_properties": {"machine_type": "ct6e-standard-4t", "scheduling": {"provisioning_model": "SPOT"}},
        "location_policy": {"location": f"zones/{ZONE_B}"},
        "types": ["PREEMPTION", "PRICE"],
    }
    answer = sim.advice.capacity_history(project=PROJECT, region=REGION, capacity_history_request_resource=request)
    assert answer.location.endswith(f"/zones/{ZONE_B}")
    assert len(answer.preemption_history) == 24
    assert answer.preemption_history[0].preemption_rate == pytest.approx(2.0 / 3.0, abs=1e-4)
    assert answer.price_history[0].list_price.units == 5  # 4 chips at 1.25 USD
    request["instance_properties"]["scheduling"] = {"provisioning_model": "STANDARD"}
    with pytest.raises(exceptions.BadRequest, match="must be set to SPOT"):
        sim.advice.capacity_history(project=PROJECT, region=REGION, capacity_history_request_resource=request)


def calendar_request(max_duration: str = "259200s", deny: str = "") -> dict[str, Any]:
    locations = {f"zones/{deny}": {"preference": "DENY"}} if deny else {}
    spec = {
        "location_policy": {"locations": locations},
        "time_range_spec": {
            "start_time_not_earlier_than": "2026-12-03T00:00:00Z",
            "start_time_not_later_than": "2026-12-20T00:00:00Z",
            "min_duration": "172800s",
            "max_duration": max_duration,
        },
        "target_resources": {
            "aggregate_resources": {
                "vm_family": "VM_FAMILY_CLOUD_TPU_LITE_POD_SLICE_CT6E",
                "accelerator_count": 8,
                "workload_type": "SERVING",
            }
        },
    }
    return {"future_resources_specs": {"spec": spec}}


def test_calendar_advice_returns_a_window_within_the_limits_and_refuses_over_90_days(sims: list[Sim]) -> None:
    sims.append(sim := Sim(NOISY))
    answer = sim.advice.calendar_mode(
        project=PROJECT, region=REGION, calendar_mode_advice_request_resource=calendar_request()
    )
    spec = answer.recommendations[0].recommendations_per_spec["spec"]
    start, end = datetime.fromisoformat(spec.start_time), datetime.fromisoformat(spec.end_time)
    assert spec.location == f"zones/{ZONE_A}"  # us-east5-b has no on-demand chips until day 2
    assert start == datetime(2026, 12, 3, tzinfo=UTC)
    assert end - start == timedelta(days=2)
    assert spec.other_locations[f"zones/{ZONE_B}"].status == "RECOMMENDED"
    denied = sim.advice.calendar_mode(
        project=PROJECT, region=REGION, calendar_mode_advice_request_resource=calendar_request(deny=ZONE_A)
    )
    late = denied.recommendations[0].recommendations_per_spec["spec"]
    assert (late.location, late.start_time) == (f"zones/{ZONE_B}", "2026-12-03T12:00:00.000Z")
    with pytest.raises(exceptions.BadRequest, match=r"futureResourcesSpecs\.spec\.timeRangeSpec\.maxDuration"):
        sim.advice.calendar_mode(
            project=PROJECT, region=REGION, calendar_mode_advice_request_resource=calendar_request("8640000s")
        )


def future_reservation(name: str, start: datetime, days: int = 2, chips: int = 4, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "reservation_name": "tpuctl-v6e4",
        "aggregate_reservation": {
            "vm_family": "VM_FAMILY_CLOUD_TPU_LITE_POD_SLICE_CT6E",
            "workload_type": "SERVING",
            "reserved_resources": [{"accelerator": {"accelerator_count": chips}}],
        },
        "time_window": {"start_time": start.isoformat(), "end_time": (start + timedelta(days=days)).isoformat()},
        "planning_status": "SUBMITTED",
        "reservation_mode": "CALENDAR",
        "specific_reservation_required": True,
        "auto_delete_auto_created_reservations": True,
        **extra,
    }


def reservation_bound(name: str, reservation: str = "tpuctl-v6e4") -> dict[str, Any]:
    return {
        "name": name,
        "machineType": f"zones/{ZONE_A}/machineTypes/ct6e-standard-4t",
        "labels": {"tpuctl-deployment": "dep-a"},
        "scheduling": {"provisioningModel": "RESERVATION_BOUND", "onHostMaintenance": "TERMINATE"},
        "reservationAffinity": {
            "consumeReservationType": "SPECIFIC_RESERVATION",
            "key": "compute.googleapis.com/reservation-name",
            "values": [f"projects/{PROJECT}/reservations/{reservation}"],
        },
    }


def test_a_future_reservation_holds_chips_from_its_start_and_deleting_it_releases_them(sims: list[Sim]) -> None:
    sims.append(sim := Sim(NOISY))
    world, client = sim.world, sim.reservations
    start = START + timedelta(hours=1)
    client.insert(project=PROJECT, zone=ZONE_A, future_reservation_resource=future_reservation("fr-1", start)).result()
    got = client.get(project=PROJECT, zone=ZONE_A, future_reservation="fr-1")
    assert got.status.procurement_status == "PENDING_APPROVAL"
    world.advance(APPROVAL_S)
    assert client.get(project=PROJECT, zone=ZONE_A, future_reservation="fr-1").status.procurement_status == "APPROVED"
    assert world.kernel.pool(ZONE_A, "v6e", "on_demand").free == 8  # nothing held before the start
    world.advance(3600)
    got = client.get(project=PROJECT, zone=ZONE_A, future_reservation="fr-1")
    assert got.status.procurement_status == "FULFILLED"
    assert got.status.auto_created_reservations[0].endswith("/reservations/tpuctl-v6e4")
    assert world.kernel.pool(ZONE_A, "v6e", "on_demand").free == 4
    world.compute.insert(PROJECT, ZONE_A, reservation_bound("vm-1"))
    world.advance(600)
    assert world.compute.status(ZONE_A, "vm-1") == "RUNNING"
    assert world.kernel.pool(ZONE_A, "v6e", "reservation:tpuctl-v6e4").free == 0  # the create consumed it
    world.compute.delete(PROJECT, ZONE_A, "vm-1")
    world.advance(600)
    client.delete(project=PROJECT, zone=ZONE_A, future_reservation="fr-1").result()
    assert world.kernel.pool(ZONE_A, "v6e", "on_demand").free == 8
    assert world.kernel.pool(ZONE_A, "v6e", "reservation:tpuctl-v6e4").total == 0
    assert list(client.list(project=PROJECT, zone=ZONE_A)) == []
    with pytest.raises(exceptions.NotFound):
        client.get(project=PROJECT, zone=ZONE_A, future_reservation="fr-1")


def test_future_reservation_inserts_are_refused_naming_the_field(sims: list[Sim]) -> None:
    sims.append(sim := Sim(NOISY))
    client = sim.reservations
    cases = [
        (future_reservation("fr-long", START + timedelta(days=1), days=91), r"resource\.timeWindow\.endTime"),
        (future_reservation("fr-far", START + timedelta(days=121)), r"resource\.timeWindow\.startTime"),
        (future_reservation("fr-odd", START + timedelta(days=1), chips=3), r"acceleratorCount"),
        (future_reservation("fr-name", START, reservation_name="Not_A-Name"), r"resource\.reservationName"),
    ]
    for body, field in cases:
        with pytest.raises(exceptions.BadRequest, match=field):
            client.insert(project=PROJECT, zone=ZONE_A, future_reservation_resource=body)


def test_a_reservation_whose_window_lacks_chips_is_declined(sims: list[Sim]) -> None:
    sims.append(sim := Sim(NOISY))
    body = future_reservation("fr-b", START + timedelta(hours=1), chips=8)
    sim.reservations.insert(project=PROJECT, zone=ZONE_A, future_reservation_resource=body).result()
    second = future_reservation("fr-c", START + timedelta(hours=2), chips=4)
    sim.reservations.insert(project=PROJECT, zone=ZONE_A, future_reservation_resource=second).result()
    sim.world.advance(APPROVAL_S)
    statuses = {fr.name: fr.status.procurement_status for fr in sim.reservations.list(project=PROJECT, zone=ZONE_A)}
    assert statuses == {"fr-b": "APPROVED", "fr-c": "DECLINED"}  # 8 on-demand chips, 8 already promised


BOOKED = "cal-booked"  # a reservation no scenario declares: the booking creates it


def undeclared_world() -> dict[str, Any]:
    """8 on-demand v6e chips in us-east5-a and no declared reservation."""
    return lab_world({ZONE_A: {"capacity": {"v6e": {"on_demand": 8}}}})


def book(sim: Sim, name: str, start: datetime) -> None:
    body = compute_v1.FutureReservation(future_reservation(name, start, reservation_name=BOOKED))
    sim.reservations.insert(project=PROJECT, zone=ZONE_A, future_reservation_resource=body).result()


def test_a_booked_reservation_exists_from_approval_for_instances_and_is_unknown_once_deleted(sims: list[Sim]) -> None:
    sims.append(sim := Sim(undeclared_world()))
    world = sim.world
    book(sim, "fr-vm", START + timedelta(hours=1))
    with pytest.raises(ComputeApiError, match=f"reservations/{BOOKED}' was not found"):
        world.compute.insert(PROJECT, ZONE_A, reservation_bound("vm-early", BOOKED))  # not approved yet
    world.advance(APPROVAL_S)
    world.compute.insert(PROJECT, ZONE_A, reservation_bound("vm-before", BOOKED))  # accepted: it exists, empty
    world.advance(600)
    assert world.compute.status(ZONE_A, "vm-before") is None  # an empty reservation before the start: no VM
    world.advance(3600)
    world.compute.insert(PROJECT, ZONE_A, reservation_bound("vm-1", BOOKED))
    world.advance(600)
    assert world.compute.status(ZONE_A, "vm-1") == "RUNNING"
    assert world.kernel.pool(ZONE_A, "v6e", f"reservation:{BOOKED}").used == 4
    assert world.kernel.pool(ZONE_A, "v6e", "on_demand").free == 4  # the booking holds the other 4
    world.compute.delete(PROJECT, ZONE_A, "vm-1")
    world.advance(600)
    sim.reservations.delete(project=PROJECT, zone=ZONE_A, future_reservation="fr-vm").result()
    with pytest.raises(ComputeApiError, match=f"reservations/{BOOKED}' was not found") as refused:
        world.compute.insert(PROJECT, ZONE_A, reservation_bound("vm-2", BOOKED))
    assert refused.value.http_status == 404


def test_a_booked_reservation_is_consumed_by_a_queued_resource_on_the_tpu_wire(sims: list[Sim]) -> None:
    sims.append(sim := Sim(undeclared_world()))
    world = sim.world
    tpu = tpu_v2.TpuClient(
        transport="rest",
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": sim.server.base_url},
    )
    parent = f"projects/{PROJECT}/locations/{ZONE_A}"

    def queued(qr_id: str) -> tpu_v2.QueuedResource:
        node = tpu_v2.Node(
            accelerator_type="v6e-4", runtime_version="v2-alpha-tpuv6e", labels={"tpuctl-deployment": "d"}
        )
        spec = tpu_v2.QueuedResource.Tpu.NodeSpec(parent=parent, node_id=f"{qr_id}-node", node=node)
        return tpu_v2.QueuedResource(
            tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec]), reservation_name=f"{parent}/reservations/{BOOKED}"
        )

    def state(qr_id: str) -> str:
        return tpu.get_queued_resource(name=f"{parent}/queuedResources/{qr_id}").state.state.name

    book(sim, "fr-qr", START + timedelta(hours=1))
    with pytest.raises(exceptions.BadRequest, match="Reservation"):
        tpu.create_queued_resource(parent=parent, queued_resource_id="qr-early", queued_resource=queued("qr-early"))
    world.advance(APPROVAL_S)
    tpu.create_queued_resource(parent=parent, queued_resource_id="qr-1", queued_resource=queued("qr-1"))
    world.advance(600)
    assert state("qr-1") == "WAITING_FOR_RESOURCES"  # the reservation exists, without chips before its start
    world.advance(3600)
    assert state("qr-1") == "ACTIVE"
    assert world.kernel.pool(ZONE_A, "v6e", f"reservation:{BOOKED}").used == 4
    tpu.delete_queued_resource(
        request=tpu_v2.DeleteQueuedResourceRequest(name=f"{parent}/queuedResources/qr-1", force=True)
    )
    world.advance(600)
    sim.reservations.delete(project=PROJECT, zone=ZONE_A, future_reservation="fr-qr").result()
    with pytest.raises(exceptions.BadRequest, match="Reservation"):
        tpu.create_queued_resource(parent=parent, queued_resource_id="qr-2", queued_resource=queued("qr-2"))
    tpu.transport.close()


def test_a_declined_booking_creates_no_reservation(sims: list[Sim]) -> None:
    sims.append(sim := Sim(undeclared_world()))
    body = compute_v1.FutureReservation(
        future_reservation("fr-big", START + timedelta(hours=1), chips=16, reservation_name=BOOKED)
    )
    sim.reservations.insert(project=PROJECT, zone=ZONE_A, future_reservation_resource=body).result()
    sim.world.advance(APPROVAL_S)
    got = sim.reservations.get(project=PROJECT, zone=ZONE_A, future_reservation="fr-big")
    assert got.status.procurement_status == "DECLINED"  # 16 chips asked, 8 in the zone
    with pytest.raises(ComputeApiError, match="was not found"):
        sim.world.compute.insert(PROJECT, ZONE_A, reservation_bound("vm-1", BOOKED))


def advice_trace(sim: Sim) -> list[list[tuple[str, float]]]:
    trace = []
    for _ in range(12):
        trace.append(sim.capacity())
        sim.world.advance(300)
    return trace


def test_the_noisy_scenario_is_deterministic_under_its_seed(sims: list[Sim]) -> None:
    sims.extend([first := Sim(NOISY), again := Sim(NOISY)])
    trace = advice_trace(first)
    assert advice_trace(again) == trace
    stale_truth = [ZONE_B] * 9 + [ZONE_A] * 3  # the timeline flips at 30 min, seen 15 min late
    assert [ranking[0][0] for ranking in trace] != stale_truth  # the noise is on: some rankings are wrong
    sims.append(other := Sim({**World(NOISY).scenario.model_dump(mode="json"), "seed": 32}))
    assert advice_trace(other) != trace

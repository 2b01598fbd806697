"""What the spot probe relies on, on the wire with the real google-cloud-tpu client: a spot create that does not
queue (``nodes.create``) fails its operation at once with code 8 RESOURCE_EXHAUSTED where the zone has no spot
chips, while a flex-start queued resource in the same zone waits in WAITING_FOR_RESOURCES; with chips it is granted
and the node is deleted like any other (docs/reference/tpu-api.md §5.2, docs/reference/capacity-advice.md A5)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from google.api_core import exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import tpu_v2

from shared.domain.cloud import LABEL_DEPLOYMENT, LABEL_PROBE, ProvisionRequest
from shared.domain.errors import CloudError, ErrorClass
from shared.domain.models import NodeState, QueuedResourceState, Tier
from tests.support.fixtures_provisioner import spot, world
from tests.support.fixtures_tpu_sim import TpuSimFactory, TpuSimHandle

EMPTY, STOCKED = "us-east5-b", "europe-west4-a"
SCENARIO = world({EMPTY: spot(0), STOCKED: spot(8)}, name="spot-probe-wire")


@pytest.fixture
def sim(tpu_sim_factory: TpuSimFactory) -> TpuSimHandle:
    return tpu_sim_factory(SCENARIO)


@pytest.fixture
def client(sim: TpuSimHandle) -> Iterator[tpu_v2.TpuClient]:
    made = tpu_v2.TpuClient(
        transport="rest", credentials=AnonymousCredentials(), client_options={"api_endpoint": sim.base_url}
    )
    yield made
    made.transport.close()


def _spot_node(labels: dict[str, str] | None = None) -> tpu_v2.Node:
    return tpu_v2.Node(
        accelerator_type="v6e-4",
        runtime_version="v2-alpha-tpuv6e",
        scheduling_config=tpu_v2.SchedulingConfig(spot=True),
        labels=labels or {},
    )


def _request(name: str, zone: str, tier: Tier, *, queued: bool) -> ProvisionRequest:
    return ProvisionRequest(
        resource_id=name,
        node_id=name,
        zone=zone,
        accelerator="v6e-4",
        tier=tier,
        request_id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"{zone}/{name}")),
        labels={LABEL_DEPLOYMENT: "gemma", LABEL_PROBE: "gemma-g1-a0"},
        valid_until_s=3600 if queued else None,
        max_run_s=3600 if tier is Tier.FLEX_START else None,
        queued=queued,
    )


def test_a_spot_node_create_without_chips_fails_with_code_8_resource_exhausted(
    sim: TpuSimHandle, client: tpu_v2.TpuClient
) -> None:
    parent = f"projects/{sim.project}/locations/{EMPTY}"
    operation = client.create_node(parent=parent, node_id="probe-a", node=_spot_node())
    sim.advance(60)  # the capacity check takes seconds, not the valid-until of a queue
    with pytest.raises(exceptions.ResourceExhausted) as raised:
        operation.result(timeout=5)
    assert raised.value.grpc_status_code is not None and raised.value.grpc_status_code.value[0] == 8
    assert "no more capacity" in raised.value.message
    assert [node.name for node in client.list_nodes(parent=parent)] == []  # nothing left behind, nothing billed


def test_the_adapter_reads_the_failed_probe_as_a_stockout_while_flex_start_waits_in_the_same_zone(
    sim: TpuSimHandle,
) -> None:
    api = sim.api
    waiting = api.create(_request("gemma-g1-a0", EMPTY, Tier.FLEX_START, queued=True))
    probe = api.create(_request("gemma-g1-a0-p", EMPTY, Tier.SPOT, queued=False))
    assert not probe.done
    sim.advance(120)
    failed = api.get_operation(probe.name)
    assert (failed.done, failed.error_class, failed.error_code) == (True, ErrorClass.STOCKOUT, 8)
    assert api.get(EMPTY, "gemma-g1-a0-p") is None
    queued = api.get(EMPTY, "gemma-g1-a0")
    assert queued is not None and queued.state is QueuedResourceState.WAITING, waiting.name
    assert sim.world.billing()["total_chip_hours"] == 0.0


def test_a_granted_spot_probe_is_a_labelled_bare_node_and_deleting_it_leaves_nothing(sim: TpuSimHandle) -> None:
    api = sim.api
    created = api.create(_request("gemma-g1-a0-p", STOCKED, Tier.SPOT, queued=False))
    sim.advance(600)
    assert api.get_operation(created.name).error_class is None
    seen = api.get(STOCKED, "gemma-g1-a0-p")
    assert seen is not None
    assert (seen.kind, seen.tier, seen.node_state, seen.labels[LABEL_PROBE]) == (
        "node",
        Tier.SPOT,
        NodeState.READY,
        "gemma-g1-a0",
    )
    api.delete(STOCKED, "gemma-g1-a0-p", force=True)
    sim.advance(300)
    assert api.get(STOCKED, "gemma-g1-a0-p") is None
    assert sim.world.invariants(live_deployments=[])["orphans"] == []


def test_a_bare_node_is_spot_or_on_demand_only(sim: TpuSimHandle) -> None:
    with pytest.raises(CloudError) as raised:
        sim.api.create(_request("gemma-g1-a0-p", STOCKED, Tier.RESERVATION, queued=False))
    assert raised.value.error_class is ErrorClass.INVALID

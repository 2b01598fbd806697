"""The reference-agent-zones scenario reproduces the reference agent's recorded 19-zone outcome.

The expectations are read from the agent's own record (tests/fixtures/reference-agent/, copied from the
public xbill9/gemma4-tips repo): each zone's error text or timeout line decides what our adapter, talking
to the simulator through the real client, must see at the same moments.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from shared.domain.cloud import ProvisionRequest
from shared.domain.errors import CloudError, ErrorClass
from shared.domain.models import QueuedResourceState, Tier
from tests.support.fixtures_tpu_sim import TpuSimFactory, TpuSimHandle

RECORD = Path(__file__).parents[1] / "fixtures" / "reference-agent" / "tpu-26B-v6e4__tpu_zones_status.md"
_ROW = re.compile(r"^\| \*\*(?P<zone>[a-z0-9-]+)\*\* \| (?P<quota>\w+) \| (?P<started>\w+) \| (?P<details>.*)$")


def recorded_outcomes() -> dict[str, str]:
    """zone -> the record's details cell (cells may span lines)."""
    rows: dict[str, str] = {}
    zone = ""
    for line in RECORD.read_text(encoding="utf-8").splitlines():
        match = _ROW.match(line)
        if match:
            zone = match["zone"]
            rows[zone] = match["details"]
        elif zone and line.strip() and not line.startswith("|"):
            rows[zone] += "\n" + line
    return rows


def flex_request(zone: str) -> ProvisionRequest:
    return ProvisionRequest(
        resource_id="vllm-gemma4-qr",
        node_id="vllm-gemma4-node",
        zone=zone,
        accelerator="v6e-4",
        tier=Tier.FLEX_START,
        request_id=f"replay-{zone}",
        valid_until_s=4 * 3600,
        max_run_s=4 * 3600,
        labels={"tpuctl-deployment": "replay"},
    )


@pytest.fixture(scope="module")
def record() -> dict[str, str]:
    rows = recorded_outcomes()
    assert len(rows) == 19
    return rows


def _without_eid(text: str) -> str:
    return re.sub(r"\s*\[EID: 0x[0-9a-f]+\]", "", text).strip()


def test_the_replay_matches_every_recorded_zone(record: dict[str, str], tpu_sim_factory: TpuSimFactory) -> None:
    sim: TpuSimHandle = tpu_sim_factory("reference-agent-zones")
    operations: dict[str, str] = {}
    for zone, details in sorted(record.items()):
        if "INVALID_ARGUMENT:" in details:
            with pytest.raises(CloudError) as caught:
                sim.api.create(flex_request(zone))
            assert caught.value.error_class is ErrorClass.UNSUPPORTED
            expected = _without_eid(details.split("INVALID_ARGUMENT: ", 1)[1].split(". Cleaned up", 1)[0])
            assert _without_eid(caught.value.message) == expected
        else:
            operations[zone] = sim.api.create(flex_request(zone)).name

    sim.advance(15)
    for zone, details in sorted(record.items()):
        if '"code": 3' in details:
            polled = sim.api.get_operation(operations[zone])
            assert (polled.error_class, polled.error_code) == (ErrorClass.UNSUPPORTED, 3), zone
            assert polled.error_message in details.replace('\\"', '"')

    sim.advance(180 - 15)
    states = {item.zone: item.state for item in sim.api.list() if item.error_class is None}
    for zone, details in record.items():
        if details.startswith("Successfully started"):
            assert states[zone] is QueuedResourceState.ACTIVE, zone
        if details.startswith("Timed out waiting 3 minutes"):
            assert states[zone] is QueuedResourceState.WAITING, zone

    sim.advance(600 - 180)
    states = {item.zone: item.state for item in sim.api.list() if item.error_class is None}
    for zone, details in record.items():
        if "reached PROVISIONING" in details:
            assert states[zone] is QueuedResourceState.PROVISIONING, zone
    assert sum(state is QueuedResourceState.ACTIVE for state in states.values()) == 1


def test_the_slow_zones_are_capacity_pending_not_broken(tpu_sim_factory: TpuSimFactory) -> None:
    sim = tpu_sim_factory("reference-agent-zones")
    sim.api.create(flex_request("asia-northeast1-b"))
    sim.api.create(flex_request("europe-west4-a"))
    sim.advance(2 * 3600)
    observed = {item.zone: item for item in sim.api.list()}
    assert observed["asia-northeast1-b"].state is QueuedResourceState.ACTIVE
    assert observed["europe-west4-a"].state is QueuedResourceState.ACTIVE

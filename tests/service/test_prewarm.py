"""A prewarm deployment end to end in the controller: the provisioner runs its node as the builder account, and the
monitor deletes it once its builder says ``prewarmed`` (not before), and believes that phase of no other
deployment. One simulated world (the real google-cloud-tpu client over HTTP), the real SQLite store and
local bus, the real vLLM probe against a port nobody listens on (a builder serves nothing)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.domain.errors import PermanentError
from shared.domain.models import Phase
from shared.messages import DeleteDeployment
from shared.services.provisioner import ProvisionerSettings
from tests.support.fixtures_provisioner import HarnessFactory, spot, world
from tests.support.monitor_booting import Booting, start_booting
from tests.support.provisioner_harness import make_spec

ZONE = "us-east5-b"
SCENARIO = world({ZONE: spot(8)}, timings={"delete_s": [30, 30]})
BUILDER = "tpuctl-tpu-builder@proj-1234.iam.gserviceaccount.com"


@pytest.fixture
def builder(harness_factory: HarnessFactory, tmp_path: Path) -> Iterator[Booting]:
    h = harness_factory(SCENARIO, settings=ProvisionerSettings(holder="t", builder_service_account=BUILDER))
    made = start_booting(h, tmp_path, make_spec(zones=(ZONE,), prewarm=True, ttl_hours=2.0))
    yield made
    made.bus.close()


def test_without_a_builder_account_a_prewarm_is_refused_naming_the_setting(harness_factory: HarnessFactory) -> None:
    h = harness_factory(SCENARIO)
    with pytest.raises(PermanentError, match="TPUCTL_BUILDER_SERVICE_ACCOUNT"):
        h.create(make_spec(zones=(ZONE,), prewarm=True, ttl_hours=2.0))
    assert h.store.get_deployment("gemma") is None and h.qrs() == {}


def test_a_prewarm_node_runs_as_the_builder_and_a_serving_node_does_not(harness_factory: HarnessFactory) -> None:
    settings = ProvisionerSettings(holder="t", builder_service_account=BUILDER)
    h = harness_factory(SCENARIO, settings=settings)
    h.create(make_spec("warm", zones=(ZONE,), prewarm=True, ttl_hours=2.0))
    h.create(make_spec("served", zones=(ZONE,)))
    h.run(3)
    accounts = {}
    for deployment in ("warm", "served"):
        record = h.store.get_deployment(deployment)
        assert record is not None and record.status.resources
        node = h.world.node(ZONE, record.status.resources[0].name)
        assert node is not None
        accounts[deployment] = (node.get("serviceAccount") or {}).get("email")
    assert accounts["warm"] == BUILDER and accounts["served"] != BUILDER


def test_a_builder_is_deleted_once_it_says_prewarmed_and_not_before(builder: Booting) -> None:
    builder.write("compiling", "container running restarts=0")
    for _ in range(12):  # it compiles with nothing listening: no command, still booting
        builder.tick()
    assert builder.published("commands") == [] and builder.h.record().status.phase is Phase.BOOTING
    builder.write("prewarmed", "compile cache filled (123456 bytes, sha256 9481b0f33b05)")
    builder.tick()
    boot = builder.h.record().status.boot
    assert boot is not None and boot.stage == "prewarmed", "stored first: the deleted record says how it ended"
    assert builder.published("commands") == []
    builder.tick()
    builder.tick()  # a repeated tick publishes the same command (the ledger drops it), never another kind
    deletes = builder.published("commands")
    assert {type(m) for m in deletes} == {DeleteDeployment} and len({m.command_id for m in deletes}) == 1
    assert deletes[0].expected_generation == builder.h.record().generation
    builder.h.provisioner.handle(deletes[0])
    builder.h.run(3)
    assert builder.h.qrs() == {}


def test_a_serving_vm_that_writes_prewarmed_is_not_deleted(harness_factory: HarnessFactory, tmp_path: Path) -> None:
    served = start_booting(harness_factory(SCENARIO), tmp_path, make_spec(zones=(ZONE,)))
    served.write("prewarmed", "forged by a hostile VM")
    served.tick()
    served.tick()
    assert not any(isinstance(m, DeleteDeployment) for m in served.published("commands"))
    served.bus.close()

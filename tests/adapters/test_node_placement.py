"""Every TPU VM is created with the installation's service account, network and firewall tag.

Terraform outputs ``tpu_vm_service_account`` and ``node_network``; the provision function receives them as
``TPUCTL_NODE_*`` settings. Both back ends are driven with their real google-cloud clients against the
simulator, which keeps what it was sent, so these tests read back the node or instance the API stored.
"""

from __future__ import annotations

from typing import Any

import pytest

from shared.adapters.compute_engine_tpu import ComputeEngineTpu
from shared.adapters.gcp_tpu import GcpTpuApi
from shared.config import Settings
from shared.domain.cloud import LABEL_DEPLOYMENT, NodePlacement, ProvisionRequest
from shared.domain.models import Backend, Tier
from tests.sim.bodies import lab_scenario
from tests.support.fixtures_compute_sim import ComputeSimFactory
from tests.support.fixtures_tpu_sim import TpuSimFactory

ZONE = "us-east5-b"
ACCOUNT = "tpuctl-node@demo-proj.iam.gserviceaccount.com"
PLACEMENT = NodePlacement(
    service_account=ACCOUNT, network="tpuctl-vpc", subnetwork="tpuctl-nodes", tags=("tpuctl-node",), external_ips=False
)


def request(tier: Tier = Tier.SPOT, backend: Backend = Backend.TPU_API, **extra: Any) -> ProvisionRequest:
    return ProvisionRequest(
        resource_id="dep-a-g1-a0",
        node_id="dep-a-g1-a0",
        zone=ZONE,
        accelerator="v6e-4",
        tier=tier,
        request_id="req-dep-a-g1-a0",
        labels={LABEL_DEPLOYMENT: "dep-a"},
        max_run_s=3600 if tier is Tier.FLEX_START else None,
        backend=backend,
        **extra,
    )


@pytest.mark.parametrize("tier", [Tier.SPOT, Tier.FLEX_START])
def test_queued_resource_nodes_carry_the_account_network_and_tag(tpu_sim_factory: TpuSimFactory, tier: Tier) -> None:
    lab = tpu_sim_factory(lab_scenario())
    api = GcpTpuApi(lab.project, endpoint=lab.base_url, placement=PLACEMENT)
    try:
        api.create(request(tier))
    finally:
        api.close()
    stored = lab.world.queued_resource(ZONE, "dep-a-g1-a0")
    assert stored is not None
    node = stored["tpu"]["nodeSpec"][0]["node"]
    assert node["serviceAccount"]["email"] == ACCOUNT
    assert node["serviceAccount"]["scope"] == ["https://www.googleapis.com/auth/cloud-platform"]
    assert node["networkConfig"]["network"] == "projects/demo-proj/global/networks/tpuctl-vpc"
    assert node["networkConfig"]["subnetwork"] == "projects/demo-proj/regions/us-east5/subnetworks/tpuctl-nodes"
    assert node["networkConfig"].get("enableExternalIps", False) is False
    assert node["tags"] == ["tpuctl-node"]


def test_without_placement_the_node_gets_the_api_defaults(tpu_sim_factory: TpuSimFactory) -> None:
    lab = tpu_sim_factory(lab_scenario())
    lab.api.create(request())
    stored = lab.world.queued_resource(ZONE, "dep-a-g1-a0")
    assert stored is not None
    node = stored["tpu"]["nodeSpec"][0]["node"]
    assert "serviceAccount" not in node and "networkConfig" not in node and "tags" not in node


def test_a_request_account_wins_over_the_installation_default(tpu_sim_factory: TpuSimFactory) -> None:
    lab = tpu_sim_factory(lab_scenario())
    api = GcpTpuApi(lab.project, endpoint=lab.base_url, placement=PLACEMENT)
    other = "other-node@demo-proj.iam.gserviceaccount.com"
    try:
        api.create(request(service_account=other))
    finally:
        api.close()
    stored = lab.world.queued_resource(ZONE, "dep-a-g1-a0")
    assert stored is not None
    assert stored["tpu"]["nodeSpec"][0]["node"]["serviceAccount"]["email"] == other


def test_compute_engine_instances_carry_the_same_placement(compute_sim_factory: ComputeSimFactory) -> None:
    lab = compute_sim_factory(lab_scenario())
    ce = ComputeEngineTpu(lab.project, endpoint=lab.base_url, placement=PLACEMENT)
    ce.create(request(Tier.FLEX_START, Backend.COMPUTE_ENGINE))
    body = lab.world.compute.instance(ZONE, "dep-a-g1-a0")
    assert body is not None
    interface = body["networkInterfaces"][0]
    assert interface["network"].endswith("/projects/demo-proj/global/networks/tpuctl-vpc")
    assert interface["subnetwork"].endswith("/projects/demo-proj/regions/us-east5/subnetworks/tpuctl-nodes")
    lab.advance(600)
    running = lab.world.compute.instance(ZONE, "dep-a-g1-a0")
    assert running is not None and running["status"] == "RUNNING"
    # no external IP: the VM reaches out through Cloud NAT
    assert not running["networkInterfaces"][0].get("accessConfigs")
    assert body["serviceAccounts"][0]["email"] == ACCOUNT
    assert body["tags"]["items"] == ["tpuctl-node"]


def test_settings_build_the_placement_from_terraform_outputs() -> None:
    settings = Settings(
        node_service_account=ACCOUNT, node_network="tpuctl-vpc", node_tags="tpuctl-node, tpuctl-extra",
        node_external_ips=False,
    )  # fmt: skip
    placement = settings.node_placement()
    assert placement.tags == ("tpuctl-node", "tpuctl-extra")
    assert placement.external_ips is False
    assert placement.network_path("demo-proj") == "projects/demo-proj/global/networks/tpuctl-vpc"
    assert NodePlacement(network="projects/p/global/networks/n").network_path("demo-proj") == (
        "projects/p/global/networks/n"
    )


@pytest.mark.parametrize(
    ("fields", "variable"),
    [
        ({"node_tags": "Not A Tag"}, "TPUCTL_NODE_TAGS"),
        ({"node_service_account": "root"}, "TPUCTL_NODE_SERVICE_ACCOUNT"),
        ({"node_network": "bad network!"}, "TPUCTL_NODE_NETWORK"),
        ({"builder_service_account": "root"}, "TPUCTL_BUILDER_SERVICE_ACCOUNT"),
        # The prewarm builder writes the compile cache: it is never the serving VMs' account.
        ({"builder_service_account": ACCOUNT, "node_service_account": ACCOUNT}, "TPUCTL_BUILDER_SERVICE_ACCOUNT"),
    ],
)
def test_a_malformed_setting_names_its_variable(fields: dict[str, str], variable: str) -> None:
    with pytest.raises(ValueError, match=variable):
        Settings(**fields)  # type: ignore[arg-type]

"""CloudQuotas with the real google-cloud-quotas REST client against the simulator's Cloud Quotas subset.

Also checks the usage half of the live quota: chips counted from GcpTpuApi.list (the real TPU client) agree
with the simulator's own quota accounting, the thing that decides its 429s.
"""

from __future__ import annotations

import socket

import pytest
from google.cloud import cloudquotas_v1

from shared.adapters.cloud_quotas import CloudQuotas, limits_from_info
from shared.domain.cloud import ProvisionRequest
from shared.domain.errors import CloudError, ErrorClass
from shared.domain.models import Tier
from shared.domain.quota import QuotaLimit, tpu_quota_usage
from tests.support.fixtures_tpu_sim import TpuSimFactory, TpuSimHandle

REGION_SPOT = "TPUV6EPreemptiblePerProjectPerRegionForTPUAPI"
ZONE_SPOT = "TPUV6EPreemptiblePerProjectPerZoneForTPUAPI"
ZONE_ON_DEMAND = "TPUV6EPerProjectPerZoneForTPUAPI"


@pytest.fixture
def bound(tpu_sim_factory: TpuSimFactory) -> TpuSimHandle:
    return tpu_sim_factory("quota-bound")


def quotas_for(sim: TpuSimHandle, **kwargs: object) -> CloudQuotas:
    return CloudQuotas(sim.project, endpoint=sim.base_url, **kwargs)  # type: ignore[arg-type]


def test_every_scenario_limit_reads_back_per_quota_id_and_location_across_pages(bound: TpuSimHandle) -> None:
    quotas = quotas_for(bound, page_size=2)  # 4 quota ids: two pages at least
    limits = quotas.list_limits()
    quotas.close()
    expected = {(spec.id, spec.location): spec.limit for spec in bound.world.scenario.quotas}
    assert {(limit.quota_id, limit.location): limit.value for limit in limits} == expected
    assert len(limits) == len(expected)
    assert all(not limit.default for limit in limits)
    assert QuotaLimit(REGION_SPOT, "us-east5", 0) in limits
    assert QuotaLimit(ZONE_ON_DEMAND, "europe-west4-a", 16) in limits


def test_another_service_lists_no_tpu_limits(bound: TpuSimHandle) -> None:
    quotas = quotas_for(bound)
    assert quotas.list_limits("compute.googleapis.com") == []
    quotas.close()


def test_a_caller_without_the_viewer_role_gets_a_permission_error(bound: TpuSimHandle) -> None:
    bound.world.inject_fault(
        {
            "endpoint": "cloudquotas.quotaInfos.list",
            "status": 403,
            "message": "Permission 'cloudquotas.quotas.get' denied on resource 'projects/demo-proj'",
        }
    )
    quotas = quotas_for(bound)
    with pytest.raises(CloudError) as caught:
        quotas.list_limits()
    quotas.close()
    assert caught.value.error_class is ErrorClass.PERMISSION
    assert "cloudquotas.quotas.get" in caught.value.message


def test_a_brief_outage_is_retried_and_a_long_one_is_transient(bound: TpuSimHandle) -> None:
    bound.world.inject_fault({"endpoint": "cloudquotas.quotaInfos.list", "status": 503, "times": 1})
    quotas = quotas_for(bound, retry_budget_s=1.0)
    assert len(quotas.list_limits()) == len(bound.world.scenario.quotas)
    bound.world.inject_fault({"endpoint": "cloudquotas.quotaInfos.list", "status": 503, "times": 1000})
    with pytest.raises(CloudError) as caught:
        quotas.list_limits()
    quotas.close()
    assert caught.value.error_class is ErrorClass.TRANSIENT


def test_another_project_is_refused_as_a_permission_problem(bound: TpuSimHandle) -> None:
    quotas = CloudQuotas("other-proj", endpoint=bound.base_url)
    with pytest.raises(CloudError) as caught:
        quotas.list_limits()
    quotas.close()
    assert caught.value.error_class is ErrorClass.PERMISSION


def test_nothing_listening_is_transient() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    quotas = CloudQuotas("demo-proj", endpoint=f"http://127.0.0.1:{port}", timeout_s=2.0)
    with pytest.raises(CloudError) as caught:
        quotas.list_limits()
    assert caught.value.error_class is ErrorClass.TRANSIENT


def test_bad_settings_name_the_field() -> None:
    with pytest.raises(ValueError, match="project"):
        CloudQuotas("")
    with pytest.raises(ValueError, match="page_size"):
        CloudQuotas("demo-proj", page_size=0)
    with pytest.raises(ValueError, match="retry_budget_s"):
        CloudQuotas("demo-proj", retry_budget_s=0)


def test_a_default_entry_applies_to_its_listed_locations_and_a_specific_one_names_its_own() -> None:
    info = cloudquotas_v1.QuotaInfo(
        quota_id=ZONE_SPOT,
        dimensions=["zone"],
        dimensions_infos=[
            cloudquotas_v1.DimensionsInfo(
                dimensions={"zone": "us-east5-b"},
                details=cloudquotas_v1.QuotaDetails(value=64),
                applicable_locations=["us-east5-b"],
            ),
            cloudquotas_v1.DimensionsInfo(
                details=cloudquotas_v1.QuotaDetails(value=-1), applicable_locations=["us-east5-a", "us-east5-c"]
            ),
            cloudquotas_v1.DimensionsInfo(details=cloudquotas_v1.QuotaDetails(value=8)),
        ],
    )
    assert limits_from_info(info) == [
        QuotaLimit(ZONE_SPOT, "us-east5-b", 64),
        QuotaLimit(ZONE_SPOT, "us-east5-a", -1, default=True),
        QuotaLimit(ZONE_SPOT, "us-east5-c", -1, default=True),
        QuotaLimit(ZONE_SPOT, "global", 8, default=True),
    ]


def test_usage_counted_from_the_tpu_list_matches_the_simulators_quota_accounting(bound: TpuSimHandle) -> None:
    for name, tier in (("dep-a-g1-a0", Tier.SPOT), ("dep-b-g1-a0", Tier.ON_DEMAND)):
        bound.api.create(
            ProvisionRequest(
                resource_id=name,
                node_id=name,
                zone="europe-west4-a",
                accelerator="v6e-4",
                tier=tier,
                request_id=f"req-{name}",
            )
        )
    bound.advance(3600)
    usage = tpu_quota_usage(bound.api.list("-"))
    simulated = {(row["id"], row["location"]): row["usage"] for row in bound.world.state(events=0)["quota"]}
    assert simulated[(ZONE_SPOT, "europe-west4-a")] == 4  # the simulator holds the chips of both slices
    assert simulated[(REGION_SPOT, "europe-west4")] == 4
    assert simulated[(ZONE_ON_DEMAND, "europe-west4-a")] == 4
    for key, chips in simulated.items():
        assert usage.get(key, 0) == chips, key

"""A zone the catalog does not know to offer the slice is refused at the gateway, before anything is published."""

from __future__ import annotations

import pytest

from mcp_client_gateway.capabilities.checks import nearest_zones
from mcp_client_gateway.errors import GatewayError
from shared.domain.zone_catalog import V6E_ZONES
from tests.mcp.conftest import GatewayWorld


def test_a_misspelt_zone_is_refused_before_a_create_is_published(world: GatewayWorld) -> None:
    with pytest.raises(GatewayError) as refused:
        world.core.create_deployment(
            deployment_id="gemma-a", model="gemma-4-26b-a4b", accelerator="v6e-4", zones=["us-east5-z"]
        )
    message = str(refused.value)
    assert message.startswith("[invalid_argument] zones[0]: us-east5-z is not a zone that offers v6e")
    assert "Fix: pick one of us-east5-a, us-east5-b, us-east5-c" in message and "tpu_plan(show='zones')" in message
    assert world.published() == []


def test_the_refusal_names_the_bad_zone_among_good_ones(world: GatewayWorld) -> None:
    with pytest.raises(GatewayError) as refused:
        world.core.create_deployment(
            deployment_id="gemma-a",
            model="gemma-4-26b-a4b",
            accelerator="v6e-4",
            zones=["us-east5-b", "europe-west9-a"],
        )
    assert refused.value.field == "zones[1]"
    assert "pick one of europe-west4-a" in str(refused.value)


def test_plan_refuses_an_unknown_zone_too(world: GatewayWorld) -> None:
    with pytest.raises(GatewayError) as refused:
        world.core.plan(model="gemma-4-26b-a4b", accelerator="v6e-4", zones=["us-east5-z"])
    assert refused.value.code == "invalid_argument" and refused.value.field == "zones[0]"


def test_known_zones_still_publish(world: GatewayWorld) -> None:
    world.core.create_deployment(
        deployment_id="gemma-a", model="gemma-4-26b-a4b", accelerator="v6e-4", zones=["us-east5-b", "europe-west4-a"]
    )
    assert [m.kind for m in world.published()] == ["deployment.create"]


def test_nearest_zones_fall_back_from_region_to_geography_to_any() -> None:
    assert nearest_zones("us-east5-z", V6E_ZONES) == ["us-east5-a", "us-east5-b", "us-east5-c"]
    assert nearest_zones("asia-east9-a", V6E_ZONES)[0].startswith("asia-")
    assert nearest_zones("mars-north1-a", V6E_ZONES) == list(V6E_ZONES[:4])

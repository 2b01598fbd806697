"""The serving plan: catalog lookup, capacity verdict, prices per (zone, tier) and one launch."""

from __future__ import annotations

import json

import pytest

from shared.domain.errors import InvalidMessage
from shared.domain.models import DeploymentSpec, Tier
from shared.domain.serving_plan import ServingEnvironment, build_serving_plan

ENVIRONMENT = ServingEnvironment(project="tpuctl-test")


def spec(**overrides: object) -> DeploymentSpec:
    values: dict[str, object] = {
        "deployment_id": "plan-check",
        "model": "gemma-4-26b-a4b",
        "accelerator": "v6e-4",
        "zones": ("us-east5-b", "europe-west4-a"),
        "serving": {"dtype": "fp8", "kv_cache_dtype": "fp8", "gpu_memory_utilization": 0.8, "max_model_len": 16384},
    }
    values.update(overrides)
    return DeploymentSpec.model_validate(values)


def test_the_reference_deployment_plans_the_reference_kv_pool_and_prices_each_zone_and_tier() -> None:
    plan = build_serving_plan(spec(ttl_hours=10, max_run_hours=4), ENVIRONMENT)
    assert plan.fits and plan.capacity.kv_tokens == 458_368
    priced = {(cost.region, cost.tier) for cost in plan.costs}
    assert priced == {
        ("us-east5", Tier.FLEX_START),
        ("us-east5", Tier.SPOT),
        ("us-east5", Tier.ON_DEMAND),
        ("europe-west4", Tier.SPOT),
        ("europe-west4", Tier.ON_DEMAND),
    }
    assert plan.unpriced == ("europe-west4-a flex_start",)
    flex = next(cost for cost in plan.costs if cost.tier is Tier.FLEX_START)
    assert flex.usd_per_hour == pytest.approx(5.40)
    assert flex.billable_hours == 4 and flex.capped_by_run_duration
    assert plan.cheapest() == min(plan.costs, key=lambda cost: cost.usd_per_hour)


def test_a_plan_that_does_not_fit_names_the_smallest_slice_that_does() -> None:
    plan = build_serving_plan(spec(model="gemma-4-31b", accelerator="v6e-1", serving={}), ENVIRONMENT)
    assert not plan.fits
    assert plan.smallest_fitting_slice == "v6e-4"
    assert any("exceed" in reason for reason in plan.capacity.reasons)


def test_the_summary_is_json_and_carries_no_secret_names_values_or_tokens() -> None:
    plan = build_serving_plan(spec(), ENVIRONMENT)
    summary = plan.summary()
    text = json.dumps(summary)
    assert summary["plan_hash"] == plan.plan_hash
    assert summary["argv"] == list(plan.launch.argv)
    assert "hf_" not in text and "API_KEY" not in text
    assert any("not pinned to a revision" in note for note in summary["notes"])


def test_a_weight_dtype_the_model_does_not_offer_is_refused() -> None:
    with pytest.raises(InvalidMessage) as raised:
        build_serving_plan(spec(model="tiny-llama", accelerator="v6e-1", serving={"dtype": "fp8"}), ENVIRONMENT)
    assert raised.value.field == "serving.dtype"


def test_a_measured_weight_figure_flows_into_the_plan() -> None:
    plan = build_serving_plan(spec(), ENVIRONMENT, measured_weights_gib=10.5)
    assert plan.capacity.weights_source == "measured"
    assert plan.capacity.kv_tokens < 458_368

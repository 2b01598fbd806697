"""The serving plan: catalog lookup, capacity verdict, prices per (zone, tier) and one launch."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from shared.domain.autotune import baseline_from_argv
from shared.domain.errors import InvalidMessage
from shared.domain.models import DeploymentSpec, Tier
from shared.domain.serving_overrides import apply_to_argv
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


TUNED = {"max_num_seqs": 32, "max_num_batched_tokens": 8192, "block_size": 64, "prefix_caching": False}
RUN_ID = "5f0c8a52-3d1e-4b7a-9c2f-1a2b3c4d5e6f"


def test_tuned_serving_options_reach_the_engine_the_kv_layout_and_the_plans_identity() -> None:
    default = build_serving_plan(spec(), ENVIRONMENT)
    tuned = build_serving_plan(spec(serving={**spec().serving.model_dump(), **TUNED, "preset": RUN_ID}), ENVIRONMENT)
    engine = tuned.engine
    assert (engine.max_num_seqs, engine.max_num_batched_tokens, engine.block_size) == (32, 8192, 64)
    assert engine.prefix_caching is False and "--no-enable-prefix-caching" in tuned.launch.argv
    assert tuned.capacity.block_size == 64 and tuned.capacity.max_num_batched_tokens == 8192
    assert tuned.capacity.activation_estimate_gib > default.capacity.activation_estimate_gib, "a bigger chunk costs"
    assert tuned.plan_hash != default.plan_hash and tuned.compile_key != default.compile_key
    assert any(RUN_ID in note for note in tuned.summary()["notes"])
    assert default.engine.prefix_caching is None and "--enable-prefix-caching" not in default.launch.argv


def test_a_preset_deploys_the_flags_its_trial_ran() -> None:
    """The tune applied its winner to the planned argv (apply_to_argv); a deployment with that preset plans it."""
    default = build_serving_plan(spec(), ENVIRONMENT)
    trial_argv = apply_to_argv(default.launch.argv, TUNED)
    deployed = build_serving_plan(spec(serving={**spec().serving.model_dump(), **TUNED}), ENVIRONMENT)
    assert baseline_from_argv(deployed.launch.argv) == baseline_from_argv(trial_argv)
    assert sorted(deployed.launch.argv) == sorted(trial_argv), "the same words, only their order may differ"


@pytest.mark.parametrize(
    ("model", "serving", "problem"),
    [
        ("gemma-4-e2b", {"max_num_batched_tokens": 2048}, "below gemma-4-e2b's largest image (2496 tokens)"),
        ("gemma-4-31b", {"max_num_batched_tokens": 256, "max_num_seqs": 512}, "below max_num_seqs 512"),
    ],
)
def test_batched_tokens_vllm_would_refuse_are_refused_naming_the_field(
    model: str, serving: dict[str, object], problem: str
) -> None:
    with pytest.raises(InvalidMessage) as raised:
        build_serving_plan(spec(model=model, serving=serving), ENVIRONMENT)
    assert raised.value.field == "serving.max_num_batched_tokens"
    assert problem in raised.value.problem and raised.value.fix.startswith("give at least")


@pytest.mark.parametrize(
    ("serving", "field"),
    [
        ({"max_num_batched_tokens": 63}, "max_num_batched_tokens"),
        ({"max_num_batched_tokens": 131073}, "max_num_batched_tokens"),
        ({"block_size": 24}, "block_size"),
        ({"block_size": "32"}, "block_size"),
        ({"prefix_caching": "yes"}, "prefix_caching"),
        ({"preset": "not-a-run"}, "preset"),
        ({"preset": RUN_ID.upper()}, "preset"),
    ],
)
def test_serving_options_out_of_bounds_are_refused_naming_the_field(serving: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as raised:
        spec(serving=serving)
    assert raised.value.errors()[0]["loc"] == ("serving", field)

"""The weight dtype can be asked for: plan and create take ``dtype`` (bfloat16 or fp8), the CLI ``--dtype``;
fp8 weights leave more HBM to the KV cache, and the fit error suggests only the fixes that help."""

from __future__ import annotations

from typing import Any

import pytest

from mcp_client_gateway.cli import build_parser
from mcp_client_gateway.errors import GatewayError
from tests.mcp.conftest import HF_TOKEN, GatewayWorld


def test_plan_with_fp8_weights_holds_far_more_kv_tokens_for_26b_a4b_on_v6e_4(world: GatewayWorld) -> None:
    bf16 = world.core.plan(model="gemma-4-26b-a4b", accelerator="v6e-4")
    fp8 = world.core.plan(model="gemma-4-26b-a4b", accelerator="v6e-4", dtype="fp8")
    assert bf16.capacity.weight_dtype == "bfloat16" and fp8.capacity.weight_dtype == "fp8"
    assert fp8.capacity.weights_gib < 0.6 * bf16.capacity.weights_gib
    assert fp8.capacity.kv_tokens > 1.5 * bf16.capacity.kv_tokens
    assert "fp8" in " ".join(fp8.argv) and fp8.plan_hash != bf16.plan_hash


def test_create_publishes_the_weight_dtype(world: GatewayWorld) -> None:
    world.secrets.put(world.settings.hf_token_secret, HF_TOKEN)
    world.core.create_deployment(
        deployment_id="gemma-a", model="gemma-4-26b-a4b", accelerator="v6e-4", zones=["us-east5-b"], dtype="fp8"
    )
    (message,) = world.published()
    assert message.kind == "deployment.create" and message.spec.serving.dtype == "fp8"


@pytest.mark.parametrize("dtype", ["int4", "FP8", 8])
def test_a_bad_dtype_is_refused_naming_the_field(world: GatewayWorld, dtype: Any) -> None:
    with pytest.raises(GatewayError) as refused:
        world.core.plan(model="gemma-4-26b-a4b", accelerator="v6e-4", dtype=dtype)
    assert refused.value.code == "invalid_argument" and refused.value.field == "dtype"
    with pytest.raises(GatewayError) as refused:
        world.core.create_deployment(
            deployment_id="gemma-a", model="gemma-4-26b-a4b", accelerator="v6e-4", zones=["us-east5-b"], dtype=dtype
        )
    assert refused.value.field == "dtype"
    assert world.published() == []


def test_a_model_without_fp8_weights_refuses_them_naming_the_field(world: GatewayWorld) -> None:
    with pytest.raises(GatewayError) as refused:
        world.core.plan(model="tiny-llama", accelerator="v6e-1", dtype="fp8")
    assert refused.value.field == "dtype" and "does not offer fp8" in str(refused.value)


def test_a_weights_misfit_suggests_fp8_weights_not_an_fp8_kv_cache(world: GatewayWorld) -> None:
    with pytest.raises(GatewayError) as refused:
        world.core.create_deployment(
            deployment_id="gemma-a", model="gemma-4-31b", accelerator="v6e-1", zones=["us-east5-b"]
        )
    assert refused.value.code == "failed_precondition"
    assert "dtype='fp8'" in refused.value.fix and "kv_cache_dtype" not in refused.value.fix
    assert "max_model_len" not in refused.value.fix


def test_the_cli_takes_dtype_on_plan_and_deploy() -> None:
    parser = build_parser()
    assert parser.parse_args(["plan", "--model", "gemma-4-26b-a4b", "--dtype", "fp8"]).dtype == "fp8"
    assert (
        parser.parse_args(["deploy", "gemma-a", "--model", "gemma-4-26b-a4b", "--dtype", "bfloat16"]).dtype
        == "bfloat16"
    )
    with pytest.raises(SystemExit):
        parser.parse_args(["plan", "--model", "gemma-4-26b-a4b", "--dtype", "int4"])

"""Alternative slices (issue 21, item 5) through the MCP tools, the core's plan (``tpu_plan`` takes no alternatives
over MCP since issue #23; ``tpuctl plan`` does) and the CLI: validated by fit, published, shown."""

from __future__ import annotations

import io

import pytest

from mcp_client_gateway.cli import run
from mcp_client_gateway.core import GatewayError
from shared.domain.models import QueuedResourceState, ResourceRef, Tier
from shared.messages import CreateDeployment
from tests.mcp.conftest import GatewayWorld, call, text

pytestmark = pytest.mark.anyio


class TestPlanAndCreate:
    def test_the_plan_lists_each_alternative_with_its_own_tensor_parallel_size(self, world: GatewayWorld) -> None:
        # tpu_plan takes no alternative_accelerators over MCP (issue #23): the core's plan, as tpuctl plan calls it
        plan = world.core.plan(
            model="gemma-4-26b-a4b", accelerator="v6e-8", alternative_accelerators=["v6e-4"], zones=["us-east5-b"]
        )
        (alternative,) = plan.alternatives
        assert alternative.accelerator == "v6e-4"
        assert alternative.chips == 4 and alternative.tensor_parallel_size == 4
        assert plan.capacity.tensor_parallel == 8

    async def test_an_alternative_that_does_not_fit_is_refused_naming_the_field_and_the_fix(
        self, world: GatewayWorld
    ) -> None:
        result = await call(
            world,
            "tpu_deploy",
            {
                "deployment_id": "big",
                "model": "gemma-4-31b",
                "accelerator": "v6e-8",
                "alternative_accelerators": ["v6e-1"],
                "zones": ["us-east5-b"],
            },
        )
        assert result.is_error
        assert "[invalid_argument] alternative_accelerators[0]" in text(result)
        assert "does not fit v6e-1" in text(result) and "drop v6e-1" in text(result)
        assert world.published() == []

    async def test_the_accelerator_itself_as_an_alternative_is_refused(self, world: GatewayWorld) -> None:
        with pytest.raises(GatewayError) as refused:
            world.core.plan(model="gemma-4-26b-a4b", accelerator="v6e-4", alternative_accelerators=["v6e-4"])
        assert refused.value.code == "invalid_argument" and refused.value.field == "alternative_accelerators[0]"
        result = await call(
            world,
            "tpu_deploy",
            {
                "deployment_id": "same",
                "model": "gemma-4-26b-a4b",
                "accelerator": "v6e-4",
                "alternative_accelerators": ["v6e-4"],
            },
        )
        assert result.is_error and "alternative_accelerators[0]" in text(result)
        assert world.published() == []

    async def test_a_create_with_a_fitting_alternative_is_published_with_it(self, world: GatewayWorld) -> None:
        result = await call(
            world,
            "tpu_deploy",
            {
                "deployment_id": "step",
                "model": "gemma-4-26b-a4b",
                "accelerator": "v6e-8",
                "alternative_accelerators": ["v6e-4"],
                "zones": ["us-east5-b"],
            },
        )
        assert not result.is_error, text(result)
        (message,) = world.published()
        assert isinstance(message, CreateDeployment)
        assert message.spec.alternative_accelerators == ("v6e-4",)


class TestDeploymentShowsTheGrantedSlice:
    async def test_the_detail_names_the_slice_granted_and_each_request_s_slice(self, world: GatewayWorld) -> None:
        record = world.seed("step", accelerator="v6e-8")
        ref = record.status.resources[0].model_copy(update={"accelerator": "v6e-4"})
        spec = record.spec.model_copy(update={"alternative_accelerators": ("v6e-4",)})
        status = record.status.model_copy(update={"accelerator": "v6e-4", "resources": [ref]})
        world.store.put_deployment(
            record.model_copy(update={"spec": spec, "status": status}), expected_version=record.version
        )
        result = await call(world, "tpu_status", {"deployment_id": "step"})
        assert not result.is_error, text(result)
        detail = result.structured_content
        assert detail["accelerator"] == "v6e-8" and detail["alternative_accelerators"] == ["v6e-4"]
        assert detail["granted_accelerator"] == "v6e-4"
        assert detail["resources"][0]["accelerator"] == "v6e-4"
        assert detail["node"]["accelerator"] == "v6e-4" and detail["node"]["chips"] == 4

    def test_a_request_without_a_slice_is_the_spec_s(self) -> None:
        ref = ResourceRef(name="a", zone="us-east5-b", tier=Tier.SPOT, generation=1, attempt=0)
        assert ref.accelerator is None and ref.state is QueuedResourceState.UNKNOWN


class TestCli:
    def test_plan_and_deploy_take_repeated_alternative_accelerators(self, world: GatewayWorld) -> None:
        stdout, stderr = io.StringIO(), io.StringIO()
        argv = ["plan", "--model", "gemma-4-31b", "--accelerator", "v6e-8", "--alternative-accelerator", "v6e-1"]
        code = run([*argv, "--zone", "us-east5-b"], ports=world.ports, stdout=stdout, stderr=stderr)
        assert code != 0
        assert "alternative_accelerators[0]" in stderr.getvalue() and "drop v6e-1" in stderr.getvalue()
        deploy = ["deploy", "cli-step", "--model", "gemma-4-26b-a4b", "--accelerator", "v6e-8", "--zone", "us-east5-b"]
        code = run([*deploy, "--alternative-accelerator", "v6e-4"], ports=world.ports, stdout=stdout, stderr=stderr)
        assert code == 0, stderr.getvalue()
        (message,) = world.published()
        assert message.spec.alternative_accelerators == ("v6e-4",)

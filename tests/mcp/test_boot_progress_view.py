"""The startup script's boot stage, as the monitor stored it, in ``tpu_status(deployment_id=...)``, in the progress
line that ``tpu_status(command_id=...)`` and ``tpuctl deploy --wait`` show, and in ``tpuctl status``."""

from __future__ import annotations

import io
from datetime import timedelta
from typing import Any

import pytest
from mcp import Client

from mcp_client_gateway.cli import EXIT_OK, run
from mcp_client_gateway.core import deployment_stage
from shared.domain.models import BootProgress, BootStages, DeploymentRecord, Phase
from tests.mcp.conftest import GatewayWorld

pytestmark = pytest.mark.anyio


def with_boot(
    world: GatewayWorld,
    phase: Phase,
    stage: str,
    detail: str,
    node: str = "gemma-a-g1-a1",
    stages: BootStages | None = None,
) -> DeploymentRecord:
    """A deployment whose node reported ``stage`` (written as the monitor writes it)."""
    record = world.seed("gemma-a", phase=phase, endpoint="http://10.0.0.5:8000")
    at = record.updated_at - timedelta(minutes=2)
    boot = BootProgress(node=node, stage=stage, detail=detail, boot=1, stage_since=at, seen_at=at, stages=stages)
    updated = record.model_copy(update={"status": record.status.model_copy(update={"boot": boot})})
    return world.store.put_deployment(updated, expected_version=record.version)


async def get(world: GatewayWorld) -> Any:
    async with Client(world.server()) as session:
        result = await session.call_tool("tpu_status", {"deployment_id": "gemma-a"})
    assert not result.is_error
    return result.structured_content


async def test_the_dashboard_shows_the_boot_stage_the_node_reported(world: GatewayWorld) -> None:
    world.seed("gemma-a", phase=Phase.BOOTING, endpoint="http://10.0.0.5:8000")
    assert (await get(world))["boot"] is None  # before the monitor read anything
    with_boot(world, Phase.BOOTING, "weights", "downloading")
    boot = (await get(world))["boot"]
    assert (boot["node"], boot["stage"], boot["text"]) == (
        "gemma-a-g1-a1",
        "weights",
        "downloading weights (downloading)",
    )


async def test_progress_lines_name_the_stage_and_a_failed_boot_names_its_reason(world: GatewayWorld) -> None:
    record = with_boot(world, Phase.BOOTING, "image", "pulling")
    assert deployment_stage(record, record.updated_at).startswith("Booting: pulling image (pulling)")
    other_node = with_boot(world, Phase.BOOTING, "serving", "health 200 after 600s", node="gemma-a-g0-a3")
    assert deployment_stage(other_node, other_node.updated_at).startswith("Booting: pulling the image")
    compiling = with_boot(world, Phase.COMPILING, "compiling", "container running restarts=0")
    assert "compiling (container running restarts=0)" in deployment_stage(compiling, compiling.updated_at)
    failed = with_boot(world, Phase.FAILED, "failed", "weights step (downloading) exited 1 at line 160")
    failed = failed.model_copy(
        update={"status": failed.status.model_copy(update={"message": "boot failed on gemma-a-g1-a1: HTTP 401"})}
    )
    assert deployment_stage(failed, failed.updated_at) == "Failed: boot failed on gemma-a-g1-a1: HTTP 401"


async def test_stored_text_is_cleaned_again_on_the_way_out(world: GatewayWorld) -> None:
    with_boot(world, Phase.BOOTING, "weights", "\x1b[31mred\x1b[0m \u202eevil")
    boot = (await get(world))["boot"]
    assert boot["detail"] == "red evil" and boot["text"] == "downloading weights (red evil)"


def test_tpuctl_status_prints_the_boot_stage(world: GatewayWorld) -> None:
    with_boot(world, Phase.BOOTING, "weights", "downloading")
    stdout, stderr = io.StringIO(), io.StringIO()
    assert run(["status", "gemma-a"], ports=world.ports, stdout=stdout, stderr=stderr) == EXIT_OK
    assert "downloading weights (downloading)" in stdout.getvalue() and "gemma-a-g1-a1" in stdout.getvalue()


STAGES = BootStages(
    seconds={"image": 84.2, "weights": 337.0, "engine": 427.9, "first_token": 4.1},
    weights_source="hub",
    weights_bytes=62579490816,
    compile_cache="cold",
)


async def test_the_dashboard_and_tpuctl_status_show_the_boot_stage_times(world: GatewayWorld) -> None:
    with_boot(world, Phase.SERVING, "serving", "health 200 after 430s", stages=STAGES)
    stages = (await get(world))["boot"]["stages"]
    assert stages == {
        "seconds": {"image": 84.2, "weights": 337.0, "engine": 427.9, "first_token": 4.1},
        "weights_source": "hub",
        "weights_bytes": 62579490816,
        "compile_cache": "cold",
        "compile_restore": None,
        "compile_fill": None,
        "text": "image 84 s, weights 337 s (hub, 58.3 GiB), engine 428 s (compile cache cold), first token 4 s",
    }
    stdout, stderr = io.StringIO(), io.StringIO()
    assert run(["status", "gemma-a"], ports=world.ports, stdout=stdout, stderr=stderr) == EXIT_OK
    shown = stdout.getvalue()
    assert "boot stages" in shown and "engine 428 s (compile cache cold), first token 4 s" in shown


async def test_a_boot_that_restored_the_shared_compile_cache_says_so(world: GatewayWorld) -> None:
    restored = BootStages(
        seconds={"image": 0.2, "weights": 0.9, "compile_restore": 0.9, "engine": 74.8, "first_token": 0.03},
        weights_source="bucket",
        compile_cache="warm",
        compile_restore="hit",
    )
    with_boot(world, Phase.SERVING, "serving", "health 200 after 80s", stages=restored)
    stages = (await get(world))["boot"]["stages"]
    assert (stages["compile_restore"], stages["compile_cache"], stages["compile_fill"]) == ("hit", "warm", None)
    assert "compile restore 1 s (hit), engine 75 s (compile cache warm)" in stages["text"]

"""One serving spec: what the gateway previews (``tpu_plan`` showing the startup script or the plan, ``tpuctl plan``)
is byte for byte the startup script the controller hands to the TPU API, because both build it in
``serving_environment``.

Settings here differ from every default that matters (project, secret names, a node-agent bundle), so a preview
built in an environment of its own would differ in the rendered script or the plan hash.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from mcp_client_gateway.core import GatewayCore, GatewayPorts
from mcp_client_gateway.server import build_server
from shared.adapters.clock import SystemClock
from shared.adapters.file_secrets import FileSecretStore
from shared.adapters.local_bus import LocalBus
from shared.adapters.sqlite_store import SqliteStateStore
from shared.config import Settings
from shared.domain.models import DeploymentRecord, DeploymentSpec, DeploymentStatus, Phase
from shared.wiring import Runtime

pytestmark = pytest.mark.anyio

DIGEST = "5e" * 32
BUNDLE = f"gs://proof-project-tpuctl-sources/node-agent/{DIGEST}-tpuctl-node-agent-0.1.0.tar.gz"
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        backend="local",
        data_dir=tmp_path / "var",
        project="proof-project",
        hf_token_secret="team-hf-token",
        vllm_api_key_secret="team-vllm-key",
        node_agent_bundle=BUNDLE,
        node_agent_bundle_sha256=DIGEST,
    )


@pytest.fixture
def core(settings: Settings, tmp_path: Path) -> Iterator[GatewayCore]:
    store = SqliteStateStore(tmp_path / "state.sqlite")
    bus = LocalBus(tmp_path / "bus.sqlite")
    ports = GatewayPorts(
        settings=settings, store=store, bus=bus, secrets=FileSecretStore(tmp_path / "secrets"), clock=SystemClock()
    )
    yield GatewayCore(ports)
    store.close()
    bus.close()


def _stored(core: GatewayCore, spec: DeploymentSpec) -> None:
    now = SystemClock().now()
    record = DeploymentRecord(
        deployment_id=spec.deployment_id,
        spec=spec,
        status=DeploymentStatus(phase=Phase.SEARCHING, phase_since=now),
        created_at=now,
        updated_at=now,
    )
    core.ports.store.put_deployment(record, expected_version=None)


async def _tool(core: GatewayCore, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    async with Client(build_server(core)) as session:
        result = await session.call_tool(name, arguments)
    assert not result.is_error, result.content
    content: dict[str, Any] = result.structured_content
    return content


def _plan_hash(script: str) -> str:
    match = re.search(r"^PLAN_HASH=(\S+)$", script, re.MULTILINE)
    assert match, "no PLAN_HASH in the script"
    return match.group(1)


async def test_the_rendered_artifact_is_the_script_the_controller_deploys(
    core: GatewayCore, settings: Settings
) -> None:
    spec = DeploymentSpec(
        deployment_id="gemma-proof", model="gemma-4-26b-a4b", accelerator="v6e-4", zones=("us-east5-b", "us-central1-b")
    )
    _stored(core, spec)
    deployed = Runtime(settings).startup_script(spec)

    rendered = await _tool(core, "tpu_plan", {"show": "startup_script", "deployment_id": "gemma-proof"})

    assert rendered["startup_script"] == deployed
    assert rendered["plan_hash"] == _plan_hash(deployed)
    assert f"NODE_AGENT_BUNDLE={BUNDLE}\n" in deployed and "secrets/team-vllm-key/versions/" in deployed


async def test_a_plan_preview_has_the_hash_and_launch_of_the_deployment(core: GatewayCore, settings: Settings) -> None:
    spec = DeploymentSpec(deployment_id="gemma-proof", model="gemma-4-e4b", accelerator="v6e-1", zones=("us-east5-b",))
    deployed = Runtime(settings).startup_script(spec)

    plan = await _tool(core, "tpu_plan", {"model": "gemma-4-e4b", "accelerator": "v6e-1"})

    assert plan["plan_hash"] == _plan_hash(deployed)
    host = plan["argv"][plan["argv"].index("--host") + 1]
    assert host == "0.0.0.0", "the preview shows the bind address the VM uses"


def test_the_gateway_builds_no_serving_environment_of_its_own() -> None:
    source = (REPO_ROOT / "mcp_client_gateway" / "core.py").read_text(encoding="utf-8")
    assert "ServingEnvironment(" not in source and "serving_environment(self.settings)" in source

"""A gateway on the embedded adapters in a temporary folder, plus helpers to seed state and read the bus."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from mcp_client_gateway.core import GatewayCore, GatewayPorts
from mcp_client_gateway.server import build_server, served_tools
from mcp_client_gateway.strict_tools import StrictTool
from shared.adapters.clock import SystemClock
from shared.adapters.file_secrets import FileSecretStore
from shared.adapters.local_bus import LocalBus
from shared.adapters.local_logs import JsonLinesLogReader
from shared.adapters.openai_client import OpenAiCompatibleClient
from shared.adapters.sqlite_store import SqliteStateStore
from shared.config import Settings
from shared.domain.models import (
    AttemptLog,
    DeploymentRecord,
    DeploymentSpec,
    DeploymentStatus,
    Desired,
    NodeState,
    NodeTask,
    Phase,
    QueuedResourceState,
    ResourceRef,
    Tier,
)
from shared.messages import decode_message
from shared.ports import Delivery

OBSERVER = "test-observer"
HF_TOKEN = "hf_" + "TestTokenValue0123456789abcdefXYZ"  # built so no scanner mistakes it for a real token
API_KEY = "vllm-key-Secret-0123456789-abcdef"


@dataclass
class GatewayWorld:
    """Everything a gateway test touches, all real embedded adapters."""

    settings: Settings
    store: SqliteStateStore
    bus: LocalBus
    secrets: FileSecretStore
    ports: GatewayPorts
    core: GatewayCore
    log_dir: Path

    def server(self, *, read_only: bool = False) -> Any:
        return build_server(self.core, read_only=read_only)

    def enforced_schemas(self) -> dict[str, dict[str, Any]]:
        """Each tool's full argument schema, as the server validates it (``tools/list`` publishes it compacted)."""
        return {tool.name: tool.enforced_schema for tool in served_tools(self.core) if isinstance(tool, StrictTool)}

    def seed(
        self,
        deployment_id: str = "gemma-a",
        *,
        phase: Phase = Phase.SERVING,
        endpoint: str | None = None,
        desired: Desired = Desired.PRESENT,
        model: str = "gemma-4-26b-a4b",
        accelerator: str = "v6e-4",
        created_at: datetime | None = None,
    ) -> DeploymentRecord:
        """Store a deployment as the controller would have left it."""
        now = datetime.now(UTC)
        created = created_at or now - timedelta(minutes=30)
        resources = []
        attempts = [
            AttemptLog(at=created, zone="us-east5-b", tier=Tier.FLEX_START, outcome="stockout", detail="no capacity"),
        ]
        if phase not in (Phase.PENDING, Phase.SEARCHING):
            resources.append(
                ResourceRef(
                    name=f"{deployment_id}-g1-a1",
                    zone="europe-west4-a",
                    tier=Tier.SPOT,
                    generation=1,
                    attempt=1,
                    state=QueuedResourceState.ACTIVE,
                    node_state=NodeState.READY,
                    endpoint=endpoint,
                    created_at=created,
                    active_at=created + timedelta(minutes=5),
                )
            )
            attempts.append(AttemptLog(at=created, zone="europe-west4-a", tier=Tier.SPOT, outcome="active"))
        spec = DeploymentSpec(
            deployment_id=deployment_id,
            model=model,  # type: ignore[arg-type]
            accelerator=accelerator,  # type: ignore[arg-type]
            zones=("us-east5-b", "europe-west4-a"),
        )
        record = DeploymentRecord(
            deployment_id=deployment_id,
            spec=spec,
            desired=desired,
            status=DeploymentStatus(
                phase=phase,
                observed_generation=1,
                zone="europe-west4-a" if resources else None,
                tier=Tier.SPOT if resources else None,
                endpoint=endpoint,
                resources=resources,
                attempts=attempts,
                slis={"ttft_p50_ms": 120.0, "tokens_per_s": 94.3},
                spend_usd=1.25,
                phase_since=now - timedelta(minutes=3),
            ),
            created_at=created,
            updated_at=now,
        )
        existing = self.store.get_deployment(deployment_id)
        return self.store.put_deployment(record, expected_version=existing.version if existing else None)

    def published(self) -> list[Any]:
        """Drain every message published since the last call, decoded."""
        seen: list[Any] = []

        def keep(delivery: Delivery) -> None:
            seen.append(decode_message(delivery.data))

        while self.bus.pull(OBSERVER, keep, max_messages=100, timeout_s=0.0):
            pass
        return seen


def refusal_confirmation(result: Any) -> dict[str, Any]:
    """The confirmation request a destructive tool's refusal carries: its second text block, as JSON."""
    assert result.is_error, "the call was not refused"
    texts = [block.text for block in result.content if hasattr(block, "text")]
    assert texts[0].startswith("[confirmation_required] confirm: "), texts[0]
    body: dict[str, Any] = json.loads(texts[1])
    assert f"confirm='{body['confirm']}'" in texts[0]  # the one-line error carries the same token
    return body


def seed_monitor_restart(world: GatewayWorld, now: datetime) -> str:
    """The restart the monitor asked of gemma-a's node for a stall five minutes ago, answered with a debug bundle."""
    restart_id = str(uuid.uuid5(uuid.NAMESPACE_URL, "gemma-a/1/restart"))  # the monitor's incident-derived id
    world.store.create_node_task(
        NodeTask(
            task_id=restart_id,
            deployment_id="gemma-a",
            action="restart",
            status="completed",
            reason="STALLED since 12:00: no progress",
            requested_at=now - timedelta(minutes=5),
            bundle="debug-bundles/gemma-a/1/bundle.json",
        )
    )
    return restart_id


async def call(world: GatewayWorld, tool: str, arguments: dict[str, Any], **client: Any) -> Any:
    """One tool call over a real MCP session (``client``: the session's options, e.g. an elicitation callback)."""
    async with Client(world.server(), **client) as session:
        return await session.call_tool(tool, arguments)


def text(result: Any) -> str:
    """The text blocks of a tool result, joined."""
    return " ".join(block.text for block in result.content if hasattr(block, "text"))


@pytest.fixture
def world(tmp_path: Path) -> Iterator[GatewayWorld]:
    settings = Settings(backend="local", data_dir=tmp_path / "var")
    store = SqliteStateStore(tmp_path / "state.sqlite")
    bus = LocalBus(tmp_path / "bus.sqlite")
    bus.ensure_topic(settings.topic_commands)
    bus.ensure_subscription(settings.topic_commands, OBSERVER)
    secrets = FileSecretStore(tmp_path / "secrets")
    log_dir = tmp_path / "var" / "logs"
    log_dir.mkdir(parents=True)
    ports = GatewayPorts(
        settings=settings,
        store=store,
        bus=bus,
        secrets=secrets,
        clock=SystemClock(),
        logs=JsonLinesLogReader(log_dir),
        model_client=OpenAiCompatibleClient(),
    )
    yield GatewayWorld(settings, store, bus, secrets, ports, GatewayCore(ports), log_dir)
    store.close()
    bus.close()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"

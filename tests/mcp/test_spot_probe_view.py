"""The spot probe where attempts are shown (issue 21, item 4): the deployment view carries the probe's steps in its
attempts and, on the waiting request, what the probe found holds it; ``tpuctl status`` prints both."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from mcp import Client

from mcp_client_gateway.cli import EXIT_OK, run
from shared.domain.attempts import Step
from shared.domain.models import AttemptLog, QueuedResourceState, ResourceRef, Tier
from tests.mcp.conftest import GatewayWorld

pytestmark = pytest.mark.anyio

CREATED = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def _seed(world: GatewayWorld) -> None:
    record = world.seed("gemma-a")
    refs = [
        ResourceRef(
            name="gemma-a-g1-a0",
            zone="us-east5-b",
            tier=Tier.FLEX_START,
            generation=1,
            attempt=0,
            state=QueuedResourceState.WAITING,
            created_at=CREATED,
            probe="quota",
        ),
        ResourceRef(
            name="gemma-a-g1-a1",
            zone="europe-west4-a",
            tier=Tier.FLEX_START,
            generation=1,
            attempt=1,
            state=QueuedResourceState.WAITING,
            created_at=CREATED,
        ),
    ]
    attempts = [
        AttemptLog(at=CREATED + timedelta(minutes=1), zone="us-east5-b", tier=Tier.FLEX_START, outcome=Step.PROBE_SENT),
        AttemptLog(
            at=CREATED + timedelta(minutes=3),
            zone="us-east5-b",
            tier=Tier.FLEX_START,
            outcome=Step.PROBE_QUOTA,
            detail="spot granted in us-east5-b while gemma-a-g1-a0 waits: held by quota or entitlement",
        ),
    ]
    status = record.status.model_copy(update={"resources": refs, "attempts": attempts})
    world.store.put_deployment(record.model_copy(update={"status": status}), expected_version=record.version)


async def test_the_deployment_view_shows_the_probe_steps_and_what_holds_the_wait(world: GatewayWorld) -> None:
    _seed(world)
    async with Client(world.server()) as session:
        result = await session.call_tool("tpu_status", {"deployment_id": "gemma-a"})
    assert not result.is_error, result.content
    body: dict[str, Any] = result.structured_content or {}
    assert [r["waiting_on"] for r in body["resources"]] == ["quota", None]
    assert [a["outcome"] for a in body["attempts"]][-2:] == ["probe_sent", "probe_quota"]
    assert "held by quota" in body["attempts"][-1]["detail"]


def test_tpuctl_status_prints_the_probe(world: GatewayWorld) -> None:
    _seed(world)
    stdout = io.StringIO()
    assert run(["status", "gemma-a"], ports=world.ports, stdout=stdout, stderr=io.StringIO()) == EXIT_OK
    text = " ".join(stdout.getvalue().split())
    assert "probe_quota" in text
    assert "held by quota" in text and "(spot probe)" in text  # the attempt, and the waiting request's terms

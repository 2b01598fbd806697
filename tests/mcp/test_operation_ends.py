"""An operation whose deployment is deleted (or stopped) under it ends, saying why, instead of polling forever."""

from __future__ import annotations

import pytest

from shared.domain.models import BootProgress, CommandRecord, Desired, Phase
from tests.mcp.conftest import GatewayWorld

COMMAND = "11111111-1111-4111-8111-111111111111"


def applied(world: GatewayWorld, kind: str, deployment_id: str = "gemma-a") -> None:
    world.store.record_command(
        CommandRecord(
            command_id=COMMAND,
            kind=kind,
            deployment_id=deployment_id,
            status="applied",
            received_at=world.core.ports.clock.now(),
        )
    )


def set_status(world: GatewayWorld, phase: Phase, message: str, desired: Desired = Desired.PRESENT) -> None:
    record = world.seed("gemma-a", phase=phase, desired=desired)
    record.status.message = message
    world.store.put_deployment(record, expected_version=record.version)


@pytest.mark.parametrize("kind", ["deployment.create", "deployment.start"])
def test_a_ttl_teardown_under_a_pending_create_or_start_ends_the_operation(world: GatewayWorld, kind: str) -> None:
    applied(world, kind)
    world.seed("gemma-a", phase=Phase.SEARCHING)
    assert world.core.get_operation(COMMAND).done is False
    set_status(world, Phase.DELETING, "ttl of 2 h reached: waiting for 1 resource(s) to be gone")
    deleting = world.core.get_operation(COMMAND)
    assert deleting.done is True and deleting.superseded is True
    verb = kind.split(".")[1]
    expected = f"Superseded: the deployment is being deleted (ttl of 2 h reached) before this {verb} finished"
    assert deleting.stage == expected
    assert "Poll again" not in deleting.next_step
    set_status(world, Phase.DELETED, "budget of $5.00 reached (spent $5.10); nothing left running; spend $5.10")
    deleted = world.core.get_operation(COMMAND)
    assert deleted.done is True
    assert "was deleted (budget of $5.00 reached (spent $5.10)) before this" in deleted.stage


def test_a_delete_under_a_pending_create_ends_it_even_before_the_controller_acts(world: GatewayWorld) -> None:
    applied(world, "deployment.create")
    world.seed("gemma-a", phase=Phase.SEARCHING, desired=Desired.ABSENT)
    view = world.core.get_operation(COMMAND)
    assert view.done is True
    assert view.stage == "Superseded: the deployment is being deleted (delete requested) before this create finished"


def test_a_stop_under_a_pending_create_ends_it(world: GatewayWorld) -> None:
    applied(world, "deployment.create")
    world.seed("gemma-a", phase=Phase.STOPPED, desired=Desired.STOPPED)
    view = world.core.get_operation(COMMAND)
    assert view.done is True and "was stopped (stop requested) before this create finished" in view.stage


def test_a_removed_record_ends_an_applied_create(world: GatewayWorld) -> None:
    applied(world, "deployment.create", deployment_id="gone-a")
    view = world.core.get_operation(COMMAND)
    assert view.done is True and view.superseded is True and "no longer exists" in view.stage


def test_a_pending_create_still_polls_and_a_delete_still_finishes(world: GatewayWorld) -> None:
    applied(world, "deployment.create")
    world.seed("gemma-a", phase=Phase.BOOTING)
    assert world.core.get_operation(COMMAND).done is False
    world.seed("gemma-a", phase=Phase.SERVING)
    served = world.core.get_operation(COMMAND)
    assert served.done is True and served.superseded is False


def test_a_prewarm_create_ends_done_once_its_builder_said_prewarmed_not_superseded(world: GatewayWorld) -> None:
    applied(world, "deployment.create")
    record = world.seed("gemma-a", phase=Phase.BOOTING)
    now = world.core.ports.clock.now()
    spec = record.spec.model_copy(update={"prewarm": True, "ttl_hours": 2.0})
    compiling = BootProgress(node="gemma-a-g1-a1", stage="compiling", detail="", boot=1, stage_since=now, seen_at=now)
    record = record.model_copy(update={"spec": spec, "status": record.status.model_copy(update={"boot": compiling})})
    world.store.put_deployment(record, expected_version=record.version)
    assert world.core.get_operation(COMMAND).done is False  # still compiling
    record = world.store.get_deployment("gemma-a")
    assert record is not None
    done = compiling.model_copy(update={"stage": "prewarmed"})
    status = record.status.model_copy(update={"boot": done, "phase": Phase.DELETED})
    world.store.put_deployment(record.model_copy(update={"status": status}), expected_version=record.version)
    view = world.core.get_operation(COMMAND)
    assert view.done is True and view.superseded is False and view.stage.startswith("Prewarmed: the compile cache")

"""When a deployment's tick work joins its command's trace (``shared.services.deployment_trace``), what a command
stamps on the record, and the node agents' trace export in the startup script (``shared.domain.serving_plan``)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from shared.domain.models import (
    DeploymentRecord,
    DeploymentSpec,
    DeploymentStatus,
    Desired,
    Phase,
    ResourceRef,
    Tier,
)
from shared.domain.serving_plan import ServingEnvironment, build_serving_plan
from shared.services.deployment_trace import command_in_progress, with_command_trace
from shared.tracing import current_traceparent, node_trace_metadata
from tests.unit.test_startup_script import ENVIRONMENT, _evaluate_values

NOW = datetime(2026, 12, 6, tzinfo=UTC)
SPEC = DeploymentSpec(deployment_id="gemma", model="tiny-llama", accelerator="v6e-1", zones=("us-east5-b",))


def _record(phase: Phase, desired: Desired = Desired.PRESENT, *generations: int) -> DeploymentRecord:
    resources = [
        ResourceRef(name=f"gemma-g{g}", zone="us-east5-b", tier=Tier.SPOT, generation=g, attempt=0) for g in generations
    ]
    return DeploymentRecord(
        deployment_id="gemma",
        spec=SPEC,
        generation=2,
        desired=desired,
        status=DeploymentStatus(phase=phase, resources=resources),
        created_at=NOW,
        updated_at=NOW,
    )


@pytest.mark.parametrize(
    ("phase", "desired", "generations", "in_progress"),
    [
        (Phase.PENDING, Desired.PRESENT, (), True),
        (Phase.SEARCHING, Desired.PRESENT, (2,), True),
        (Phase.BOOTING, Desired.PRESENT, (2,), True),
        (Phase.COMPILING, Desired.PRESENT, (2,), True),
        (Phase.SERVING, Desired.PRESENT, (2,), False),
        (Phase.DOWN, Desired.PRESENT, (2,), False),
        (Phase.FAILED, Desired.PRESENT, (), False),
        (Phase.SERVING, Desired.PRESENT, (1, 2), True),  # an update: the new generation is sought
        (Phase.SERVING, Desired.PRESENT, (1,), True),  # an update: nothing of the new one yet
        (Phase.STOPPED, Desired.PRESENT, (), True),  # a start
        (Phase.SERVING, Desired.STOPPED, (2,), True),  # a stop
        (Phase.STOPPED, Desired.STOPPED, (), False),
        (Phase.SERVING, Desired.ABSENT, (2,), True),  # a delete
        (Phase.DELETED, Desired.ABSENT, (), False),
    ],
)
def test_a_command_is_in_progress_until_its_desired_state_is_reached(
    phase: Phase, desired: Desired, generations: tuple[int, ...], in_progress: bool
) -> None:
    assert command_in_progress(_record(phase, desired, *generations)) is in_progress


def test_without_a_recording_span_a_command_stamps_no_trace_and_no_node_is_told_one() -> None:
    stale = _record(Phase.SERVING).model_copy(update={"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"})
    assert current_traceparent() is None and node_trace_metadata() == {}
    assert with_command_trace(stale) == stale.model_copy(update={"traceparent": None}), "no stale trace is kept"
    assert with_command_trace(None) is None


def test_an_old_record_without_a_trace_still_loads() -> None:
    document = _record(Phase.SERVING).model_dump(mode="json")
    document.pop("traceparent")
    assert DeploymentRecord.model_validate(document).traceparent is None


@pytest.mark.parametrize(("export", "agent_gets"), [("cloud-trace", "cloud-trace"), ("none", None), ("file:/x", None)])
def test_the_node_agents_export_to_cloud_trace_only_when_the_controller_does(
    export: str, agent_gets: str | None, tmp_path: Path
) -> None:
    plan = build_serving_plan(SPEC, replace(ENVIRONMENT, trace_export=export))
    words = _evaluate_values(plan.startup_script(), tmp_path)
    agent = words[words.index("AGENT") + 1 :]
    found = [word.removeprefix("TPUCTL_TRACE_EXPORT=") for word in agent if word.startswith("TPUCTL_TRACE_EXPORT=")]
    assert found == ([agent_gets] if agent_gets else [])
    assert ServingEnvironment(project="tpuctl-test").trace_export == "none"

"""When a node task (restart, log tail) may run, and how a reader sees a task the node never answered.

Pinned: ``NODE_PHASES`` is exactly the phases with a running TPU VM; ``no_node_reason`` answers None there and, for
every other phase, names the deployment, the phase and the next step (wait for BOOTING, start it, or create one);
a deleted, absent or missing deployment is "no live deployment". ``as_read`` leaves a task alone up to and at the
answer timeout (counted from ``dispatched_at``, else ``requested_at``), turns it into a failed task past it, and
never touches a finished task. The node-task service and the gateway both rely on these answers agreeing.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from shared.domain.models import (
    LIVE_PHASES,
    DeploymentRecord,
    DeploymentSpec,
    DeploymentStatus,
    Desired,
    NodeTask,
    Phase,
)
from shared.domain.node_task_rules import NODE_PHASES, as_read, no_node_reason
from tests.support.builders import ISSUED_AT, spec_dict

NOW = ISSUED_AT
TIMEOUT_S = 30.0


def record(phase: Phase, desired: Desired = Desired.PRESENT, deployment_id: str = "gemma-a") -> DeploymentRecord:
    return DeploymentRecord(
        deployment_id=deployment_id,
        spec=DeploymentSpec.model_validate(spec_dict(deployment_id)),
        desired=desired,
        status=DeploymentStatus(phase=phase),
        created_at=NOW,
        updated_at=NOW,
    )


def task(
    *,
    status: str = "dispatched",
    requested_ago_s: float = 0.0,
    dispatched_ago_s: float | None = None,
) -> NodeTask:
    return NodeTask(
        task_id="cmd-1",
        deployment_id="gemma-a",
        action="logs",
        status=status,
        reason="why not",
        requested_at=NOW - timedelta(seconds=requested_ago_s),
        dispatched_at=None if dispatched_ago_s is None else NOW - timedelta(seconds=dispatched_ago_s),
        lines=("a line",),
    )


# --- NODE_PHASES ----------------------------------------------------------------------------------------------


def test_node_phases_are_exactly_the_phases_with_a_running_tpu_vm() -> None:
    assert {
        Phase.BOOTING,
        Phase.COMPILING,
        Phase.SERVING,
        Phase.DEGRADED,
        Phase.STALLED,
        Phase.DOWN,
    } == NODE_PHASES


def test_node_phases_are_all_live_phases() -> None:
    assert NODE_PHASES <= LIVE_PHASES


# --- no_node_reason -------------------------------------------------------------------------------------------

NO_VM_YET = "try again once tpu_status(deployment_id='gemma-a') shows BOOTING or later"
START_IT = "start it with tpu_control(action='start', deployment_id='gemma-a') first"
CREATE_ONE = "create or start a deployment first"

# Every phase but DELETED (which is "no live deployment", below): None means a node task may run.
FIX_BY_PHASE: list[tuple[Phase, str | None]] = [
    (Phase.PENDING, NO_VM_YET),
    (Phase.SEARCHING, NO_VM_YET),
    (Phase.PROVISIONING, NO_VM_YET),
    (Phase.BOOTING, None),
    (Phase.COMPILING, None),
    (Phase.SERVING, None),
    (Phase.DEGRADED, None),
    (Phase.STALLED, None),
    (Phase.DOWN, None),
    (Phase.STOPPING, START_IT),
    (Phase.STOPPED, START_IT),
    (Phase.DELETING, CREATE_ONE),
    (Phase.FAILED, CREATE_ONE),
]


def test_the_table_covers_every_phase() -> None:
    assert {phase for phase, _ in FIX_BY_PHASE} | {Phase.DELETED} == set(Phase)


@pytest.mark.parametrize(("phase", "fix"), FIX_BY_PHASE, ids=[p.value for p, _ in FIX_BY_PHASE])
def test_no_node_reason_names_the_phase_and_the_next_step(phase: Phase, fix: str | None) -> None:
    reason = no_node_reason(record(phase), "gemma-a")
    if fix is None:
        assert reason is None
        assert phase in NODE_PHASES
        return
    assert reason is not None
    assert reason.startswith("deployment_id: gemma-a ")
    assert f"is {phase.value}," in reason
    assert "no node runs the vLLM container" in reason
    assert reason.endswith(fix)


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(None, id="no-record"),
        pytest.param(record(Phase.DELETED), id="deleted"),
        pytest.param(record(Phase.SERVING, Desired.ABSENT), id="serving-but-delete-requested"),
        pytest.param(record(Phase.DELETING, Desired.ABSENT), id="deleting"),
        pytest.param(record(Phase.DELETED, Desired.ABSENT), id="deleted-and-absent"),
    ],
)
def test_a_missing_or_deleted_deployment_is_no_live_deployment(case: DeploymentRecord | None) -> None:
    assert no_node_reason(case, "gemma-a") == ("deployment_id: no live deployment 'gemma-a' (check tpu_status)")


def test_a_deployment_asked_to_stop_but_still_serving_still_takes_node_tasks() -> None:
    assert no_node_reason(record(Phase.SERVING, Desired.STOPPED), "gemma-a") is None


def test_the_reason_names_the_id_it_was_asked_about() -> None:
    assert "gemma-b" in (no_node_reason(None, "gemma-b") or "")
    assert "deployment_id: gemma-b is STOPPED" in (no_node_reason(record(Phase.STOPPED), "gemma-b") or "")


# --- as_read --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("requested_ago_s", "dispatched_ago_s", "times_out"),
    [
        pytest.param(0.0, None, False, id="just-requested"),
        pytest.param(29.0, None, False, id="requested-before-timeout"),
        pytest.param(30.0, None, False, id="requested-exactly-at-timeout"),
        pytest.param(30.001, None, True, id="requested-just-past-timeout"),
        pytest.param(3600.0, None, True, id="requested-long-ago-never-dispatched"),
        pytest.param(3600.0, 10.0, False, id="dispatched-recently-after-a-long-wait"),
        pytest.param(3600.0, 30.0, False, id="dispatched-exactly-at-timeout"),
        pytest.param(3600.0, 31.0, True, id="dispatched-past-timeout"),
        pytest.param(40.0, 40.0, True, id="dispatched-when-requested-past-timeout"),
    ],
)
def test_an_unanswered_task_fails_only_past_the_timeout(
    requested_ago_s: float, dispatched_ago_s: float | None, times_out: bool
) -> None:
    before = task(requested_ago_s=requested_ago_s, dispatched_ago_s=dispatched_ago_s)
    read = as_read(before, NOW, TIMEOUT_S)
    if not times_out:
        assert read == before
        assert not read.finished
        return
    assert read.status == "failed"
    assert read.finished
    assert read.finished_at == NOW


@pytest.mark.parametrize("status", ["completed", "failed"])
@pytest.mark.parametrize("requested_ago_s", [0.0, 31.0, 86400.0])
def test_a_finished_task_reads_as_stored_however_old(status: str, requested_ago_s: float) -> None:
    done = task(status=status, requested_ago_s=requested_ago_s, dispatched_ago_s=requested_ago_s)
    assert as_read(done, NOW, TIMEOUT_S) is done


def test_a_timed_out_task_keeps_what_it_was_and_says_what_to_do() -> None:
    before = task(requested_ago_s=120.0, dispatched_ago_s=100.0)
    read = as_read(before, NOW, TIMEOUT_S)
    assert read.detail == (
        "the node agent did not answer within 30 s (the node may be down or restarting); "
        "check tpu_status(deployment_id='gemma-a'), then try again"
    )
    kept = ("task_id", "deployment_id", "action", "reason", "requested_at", "dispatched_at", "lines")
    assert {name: getattr(read, name) for name in kept} == {name: getattr(before, name) for name in kept}
    assert before.status == "dispatched" and before.finished_at is None  # the stored task is not changed


@pytest.mark.parametrize(("timeout_s", "shown"), [(0.4, "0 s"), (2.6, "3 s"), (90.0, "90 s")])
def test_the_timeout_is_shown_in_whole_seconds(timeout_s: float, shown: str) -> None:
    read = as_read(task(requested_ago_s=3600.0), NOW, timeout_s)
    assert f"within {shown} " in read.detail


def test_a_task_stamped_in_the_future_is_not_timed_out() -> None:
    ahead = task(requested_ago_s=-600.0)  # the reader's clock is behind the writer's
    assert as_read(ahead, NOW, TIMEOUT_S) == ahead

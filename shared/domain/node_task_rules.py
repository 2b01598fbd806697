"""When a node task (restart, log tail) can run, and how a reader sees one that was never answered (pure).

Shared by the node-task service, which refuses and expires tasks, and the gateway, which says why before it
publishes anything and shows tasks as the service would judge them.
"""

from __future__ import annotations

from datetime import datetime

from shared.domain.models import DeploymentRecord, Desired, NodeTask, Phase

__all__ = ["NODE_PHASES", "as_read", "no_node_reason"]

NODE_PHASES = frozenset({Phase.BOOTING, Phase.COMPILING, Phase.SERVING, Phase.DEGRADED, Phase.STALLED, Phase.DOWN})
"""Phases in which the deployment's TPU VM runs, so its node agent can act on the container."""


def no_node_reason(record: DeploymentRecord | None, deployment_id: str) -> str | None:
    """Why a node task cannot run on this deployment now (None: it can), naming the phase and the fix."""
    if record is None or record.desired is Desired.ABSENT or record.status.phase is Phase.DELETED:
        return f"deployment_id: no live deployment {deployment_id!r} (check tpu_status)"
    phase = record.status.phase
    if phase in NODE_PHASES:
        return None
    if phase in (Phase.PENDING, Phase.SEARCHING, Phase.PROVISIONING):
        fix = (
            "its TPU VM is not up yet; try again once "
            f"tpu_status(deployment_id='{record.deployment_id}') shows BOOTING or later"
        )
    elif phase in (Phase.STOPPING, Phase.STOPPED):
        fix = (
            "it has no TPU VM while stopped; start it with "
            f"tpu_control(action='start', deployment_id='{record.deployment_id}') first"
        )
    else:
        fix = "it has no TPU VM; create or start a deployment first"
    return f"deployment_id: {deployment_id} is {phase.value}, so no node runs the vLLM container: {fix}"


def as_read(task: NodeTask, now: datetime, timeout_s: float) -> NodeTask:
    """The task as a reader should see it: a dispatched task past the answer timeout has failed."""
    if task.finished:
        return task
    since = task.dispatched_at or task.requested_at
    if (now - since).total_seconds() <= timeout_s:
        return task
    return task.model_copy(
        update={
            "status": "failed",
            "finished_at": now,
            "detail": f"the node agent did not answer within {timeout_s:.0f} s (the node may be down or restarting); "
            f"check tpu_status(deployment_id='{task.deployment_id}'), then try again",
        }
    )

"""A deployment's work in the trace of the command that set it going (docs/tracing.md).

A command that changes a deployment (create, update, start, stop, delete) leaves its ``traceparent`` on the record
(:func:`with_command_trace`); the provisioner's and the monitor's share of a tick for that deployment runs under it
(:func:`deployment_work`) while the command's work is under way (:func:`command_in_progress`). Once the deployment
has settled (serving, stopped, deleted, failed) its ticks are routine: they run in the tick's own trace, linked to
the command's, so a deployment that serves for a week does not grow one trace forever.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from shared.domain.models import DeploymentRecord, Desired, Phase
from shared.tracing import current_traceparent, deployment_span

__all__ = ["command_in_progress", "deployment_work", "with_command_trace"]

# Where a present deployment stays once its command's work is done: serving, or the monitor's health verdicts on it.
_SETTLED = frozenset({Phase.SERVING, Phase.DEGRADED, Phase.STALLED, Phase.DOWN, Phase.FAILED})


def command_in_progress(record: DeploymentRecord) -> bool:
    """True while the last command's work is under way: the desired state is not reached yet, or a slice of another
    generation is being sought or released."""
    phase = record.status.phase
    if record.desired is Desired.ABSENT:
        return phase is not Phase.DELETED
    if record.desired is Desired.STOPPED:
        return phase is not Phase.STOPPED
    if any(ref.generation != record.generation for ref in record.status.resources):
        return True
    return phase not in _SETTLED


def with_command_trace(record: DeploymentRecord | None) -> DeploymentRecord | None:
    """The record as a command writes it: carrying the command's ``traceparent`` (None when no span is recording)."""
    return None if record is None else record.model_copy(update={"traceparent": current_traceparent()})


@contextmanager
def deployment_work(record: DeploymentRecord, name: str) -> Iterator[Any]:
    """A span for one deployment's share of a tick: in its command's trace while the command is in progress."""
    with deployment_span(
        record.traceparent, name, join=command_in_progress(record), deployment_id=record.deployment_id
    ) as span:
        yield span

"""A deployment's timeline: everything the store remembers about it, in order, with who or what caused each step.

Sources, all read from the state store: the record (creation, the capacity search's attempts), the monitor's
samples (a phase change is a sample whose phase differs from the one before), node tasks (restarts, debug bundles,
log tails) and benchmark runs. Who caused a node task is told by its id: the monitor derives its command ids from
the incident (UUID version 5, so a repeated tick publishes the same id), a person's command through the gateway gets
a fresh UUID version 4. Text that came from a VM (a sample's detail, a task's answer) is cleaned and cut.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Literal

from pydantic import Field

from mcp_client_gateway.capabilities.common import GatewayPorts, Records
from mcp_client_gateway.log_hygiene import clean_text
from mcp_client_gateway.models import _View  # the views' shared base (strict, documented)
from shared.domain.attempts import outcome_text
from shared.domain.models import DeploymentRecord, MonitorSample, NodeTask

__all__ = ["MAX_EVENTS", "TimelineEvent", "TimelineView", "Timelines", "task_cause"]

MAX_EVENTS = 200
_MAX_SAMPLES = 2000
_TEXT_CHARS = 240
_TASK_WORDS = {"restart": "vLLM container restart", "debug": "debug bundle capture", "logs": "log tail"}


class TimelineEvent(_View):
    """One thing that happened to a deployment, with who or what caused it."""

    at: datetime
    kind: Literal["created", "capacity", "phase", "restart", "debug", "logs", "benchmark"]
    summary: str
    cause: str = Field(description="Who or what caused it: a user through the gateway, the provisioner, the monitor.")
    link: str = Field(default="", description="A debug bundle's location or a benchmark run id, when there is one.")


class TimelineView(_View):
    """A deployment's history, oldest first: creation, capacity attempts, phase changes, restarts, bundles, runs."""

    deployment_id: str
    phase: str
    since: datetime = Field(description="Phase changes are read from monitor samples taken after this time.")
    events: list[TimelineEvent]
    trimmed: int = Field(default=0, description="Older events left out to keep the view bounded.")


def task_cause(task_id: str) -> str:
    """Who asked for a node task, from its id's UUID version (see the module docstring)."""
    try:
        version = uuid.UUID(task_id).version
    except ValueError:
        return "unknown"
    return "the monitor (healing)" if version == 5 else "a user, through the gateway"


class Timelines:
    """Builds ``TimelineView``s from the store; read-only."""

    def __init__(self, ports: GatewayPorts, records: Records) -> None:
        self.ports = ports
        self.records = records

    def timeline(self, deployment_id: str, *, hours: float = 24.0) -> TimelineView:
        record = self.records.get(deployment_id, include_deleted=True)
        since = self.ports.clock.now() - timedelta(hours=max(0.1, min(hours, 24.0 * 14)))
        samples = self.ports.store.list_samples(record.deployment_id, since=since, limit=_MAX_SAMPLES)
        tasks = self.ports.store.list_node_tasks(record.deployment_id, limit=50)
        runs = self.ports.store.list_benchmark_runs(record.deployment_id, limit=50)
        events = [*_record_events(record), *_phase_events(samples), *(_task_event(task) for task in tasks)]
        for run in runs:
            events.append(
                TimelineEvent(
                    at=run.created_at,
                    kind="benchmark",
                    summary=f"benchmark {run.status}" + (f": {_clean(run.error)}" if run.error else ""),
                    cause="a user, through the gateway",
                    link=run.run_id,
                )
            )
        events.sort(key=lambda event: event.at)
        trimmed = max(0, len(events) - MAX_EVENTS)
        return TimelineView(
            deployment_id=record.deployment_id,
            phase=record.status.phase.value,
            since=since,
            events=events[trimmed:],
            trimmed=trimmed,
        )


def _record_events(record: DeploymentRecord) -> list[TimelineEvent]:
    spec = record.spec
    events = [
        TimelineEvent(
            at=record.created_at,
            kind="created",
            summary=f"deployment created: {spec.model} on {spec.accelerator}",
            cause="a user, through the gateway",
        )
    ]
    for attempt in record.status.attempts:
        words = outcome_text(attempt.outcome)
        detail = f" ({_clean(attempt.detail)})" if attempt.detail else ""
        events.append(
            TimelineEvent(
                at=attempt.at,
                kind="capacity",
                summary=f"{attempt.tier.value} in {attempt.zone}: {words}{detail}",
                cause="the provisioner (capacity search)",
            )
        )
    return events


def _phase_events(samples: list[MonitorSample]) -> list[TimelineEvent]:
    events: list[TimelineEvent] = []
    previous = None
    for sample in sorted(samples, key=lambda s: s.taken_at):
        if sample.phase is not previous:
            before = f"{previous.value} -> " if previous is not None else ""
            detail = f": {_clean(sample.detail)}" if sample.detail else ""
            events.append(
                TimelineEvent(
                    at=sample.taken_at,
                    kind="phase",
                    summary=f"{before}{sample.phase.value}{detail}",
                    cause="the monitor (probe of vLLM)",
                )
            )
        previous = sample.phase
    return events


def _task_event(task: NodeTask) -> TimelineEvent:
    words = _TASK_WORDS.get(task.action, task.action)
    reason = f": {_clean(task.reason)}" if task.reason else ""
    return TimelineEvent(
        at=task.requested_at,
        kind=task.action,
        summary=f"{words} {task.status}{reason}",
        cause=task_cause(task.task_id),
        link=_clean(task.bundle),
    )


def _clean(text: str) -> str:
    return clean_text(text, _TEXT_CHARS)[0]

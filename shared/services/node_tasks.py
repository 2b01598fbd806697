"""Node tasks: container control on a deployment's node (restart vLLM, tail its log, capture a debug bundle),
recorded and dispatched.

``NodeTasks(...).handle(message) -> str`` runs inside ``functions/benchmark`` (the function that talks to
nodes; raise to retry, return to ack):

- ``serving.restart`` / ``serving.logs`` / ``serving.debug``: the task (id = the request's ``command_id``) is
  recorded with ``StateStore.create_node_task`` (create-if-absent, so a redelivery acts once), checked (the
  deployment exists and is in a phase where its TPU VM runs), then the request is published unchanged on the
  node-tasks topic, where the node agent's subscription (filtered on ``deployment_id``) picks it up. A task refused
  here is stored ``failed`` with the reason and the fix, and raised as ``PermanentError`` (the ledger keeps it too).
  A task recorded but not published (a crash in between: ``dispatched_at`` is None) is published on redelivery.
- ``node.task_completed`` (from the node agent): status, detail and log lines are stored once, and only for a
  task recorded here for that deployment and action and still unanswered. A completion for an unknown task,
  another deployment's or action's task, a second one, or one that arrives after the answer timeout changes
  nothing (acked as ``ignored``). The node is untrusted (it parses prompts): lines and detail are scrubbed of
  escapes, control, bidi and invisible characters and of secrets before storage, whatever the agent already did;
  the debug bundle it names is linked only if it is the one name that task may have
  (``shared.domain.debug_bundle.is_bundle_of``), so a VM cannot point a task at any other object.

A dispatched task with no answer after ``answer_timeout_s`` reads as failed (:func:`as_read`), and is stored
failed the next time a task of that deployment is handled.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from shared.domain.debug_bundle import is_bundle_of
from shared.domain.errors import PermanentError
from shared.domain.models import NodeTask
from shared.domain.node_task_rules import NODE_PHASES, as_read, no_node_reason
from shared.domain.untrusted import clean_text
from shared.logging import scrub_untrusted
from shared.messages import (
    CaptureDebugBundle,
    Message,
    NodeTaskCompleted,
    RestartServing,
    TailServingLogs,
    encode_message,
    message_attributes,
)
from shared.ports import Clock, CommandBus, StateStore

__all__ = [
    "NODE_PHASES",
    "NodeTaskSettings",
    "NodeTasks",
    "as_read",
    "no_node_reason",
    "scrub_line",
]

log = logging.getLogger("tpuctl.node_tasks")


_ACTIONS: dict[str, Literal["restart", "logs", "debug"]] = {
    "serving.restart": "restart",
    "serving.logs": "logs",
    "serving.debug": "debug",
}
_MAX_LINE_CHARS = 2000
_MAX_DETAIL_CHARS = 2000


@dataclass(frozen=True)
class NodeTaskSettings:
    """Knobs of the node-task service; the runtime builds it from ``shared.config.Settings``."""

    topic_node_tasks: str = "tpuctl-node-tasks"
    """Where requests go; the node agent subscribes with a filter on its deployment id."""
    answer_timeout_s: float = 300.0
    """A dispatched task unanswered this long has failed (the agent is down, or never got it)."""
    history_limit: int = 50
    """Tasks of one deployment looked at when expiring unanswered ones."""

    def __post_init__(self) -> None:
        if self.answer_timeout_s <= 0:
            raise ValueError(f"answer_timeout_s: {self.answer_timeout_s} must be > 0")
        if self.history_limit < 1:
            raise ValueError(f"history_limit: {self.history_limit} must be >= 1")


def scrub_line(text: str, limit: int = _MAX_LINE_CHARS) -> str:
    """One untrusted log line made safe to store: no escapes, control, bidi, zero-width or other invisible
    characters (``shared.domain.untrusted``; spacing kept), secrets redacted after that (so invisible characters
    cannot hide one), bounded."""
    return clean_text(text, limit, collapse=False, redact=_redact)


def _redact(text: str) -> str:
    return scrub_untrusted(text, len(text) + 1)[0]


class NodeTasks:
    """Node-task requests and answers, through ports only. See the module docstring."""

    def __init__(
        self, store: StateStore, bus: CommandBus, clock: Clock, settings: NodeTaskSettings | None = None
    ) -> None:
        self._store = store
        self._bus = bus
        self._clock = clock
        self.settings = settings or NodeTaskSettings()

    def handle(self, message: Message) -> str:
        """Dispatch one decoded message; other kinds are acknowledged without effect."""
        match message:
            case RestartServing() | TailServingLogs() | CaptureDebugBundle():
                return self.request(message)
            case NodeTaskCompleted():
                return self.complete(message)
            case _:
                return f"ignored: {getattr(message, 'kind', type(message).__name__)} is not a node task"

    # --- reads ------------------------------------------------------------------------------------------------

    def get(self, task_id: str) -> NodeTask | None:
        """One task as read now (unanswered past the timeout: failed)."""
        task = self._store.get_node_task(task_id)
        return as_read(task, self._clock.now(), self.settings.answer_timeout_s) if task else None

    def recent(self, deployment_id: str, limit: int = 10) -> list[NodeTask]:
        """The deployment's newest tasks as read now."""
        now = self._clock.now()
        timeout = self.settings.answer_timeout_s
        return [as_read(task, now, timeout) for task in self._store.list_node_tasks(deployment_id, limit=limit)]

    # --- serving.restart / serving.logs / serving.debug ------------------------------------------------------------

    def request(self, message: RestartServing | TailServingLogs | CaptureDebugBundle) -> str:
        now = self._clock.now()
        self.expire_stale(message.deployment_id, now)
        task_id = message.command_id
        action = _ACTIONS[message.kind]
        reason = f"last {message.lines} lines" if isinstance(message, TailServingLogs) else message.reason
        refusal = no_node_reason(self._store.get_deployment(message.deployment_id), message.deployment_id)
        task = NodeTask(
            task_id=task_id,
            deployment_id=message.deployment_id,
            action=action,
            status="failed" if refusal else "dispatched",
            reason=scrub_line(reason, 500),
            requested_at=now,
            finished_at=now if refusal else None,
            detail=refusal or "",
        )
        created, stored = self._store.create_node_task(task)
        if not created:
            if stored.finished or stored.dispatched_at is not None:
                return f"duplicate: node task {task_id} is already {stored.status}"
            log.info("node task %s was recorded but not dispatched; dispatching now", task_id)
        elif refusal:
            raise PermanentError(f"{message.kind} {task_id} refused: {refusal}")
        self._bus.publish(
            self.settings.topic_node_tasks,
            encode_message(message),
            message_attributes(message),
            ordering_key=message.deployment_id,
        )
        # Only while still unanswered: a fast agent may have completed it already.
        self._store.update_node_task(stored.model_copy(update={"dispatched_at": now}), expected_status="dispatched")
        return f"dispatched {action} task {task_id} to the node of {message.deployment_id}"

    def expire_stale(self, deployment_id: str, now: datetime) -> list[str]:
        """Store as failed the deployment's tasks that got no answer in time; returns their ids."""
        expired = []
        timeout = self.settings.answer_timeout_s
        for task in self._store.list_node_tasks(deployment_id, limit=self.settings.history_limit):
            read = as_read(task, now, timeout)
            if read.status != task.status and self._store.update_node_task(read, expected_status="dispatched"):
                expired.append(task.task_id)
        return expired

    # --- node.task_completed ----------------------------------------------------------------------------------

    def complete(self, event: NodeTaskCompleted) -> str:
        now = self._clock.now()
        task = self._store.get_node_task(event.task_id)
        if task is None:
            return f"ignored: no node task {event.task_id} was requested"
        if task.deployment_id != event.deployment_id or task.action != event.action:
            return (
                f"ignored: node task {event.task_id} is a {task.action} of {task.deployment_id}, "
                f"not a {event.action} of {event.deployment_id}"
            )
        if task.finished:
            return f"ignored: node task {event.task_id} is already {task.status}"
        read = as_read(task, now, self.settings.answer_timeout_s)
        if read.finished:  # the answer came after the timeout: the task stays failed
            self._store.update_node_task(read, expected_status="dispatched")
            return f"ignored: node task {event.task_id} timed out before the answer arrived"
        answered = task.model_copy(
            update={
                "status": event.status,
                "finished_at": now,
                "detail": scrub_line(event.detail, _MAX_DETAIL_CHARS),
                "lines": tuple(scrub_line(line) for line in event.lines),
                "bundle": _linkable_bundle(event),
            }
        )
        if not self._store.update_node_task(answered, expected_status="dispatched"):
            return f"ignored: node task {event.task_id} was answered concurrently"
        linked = f", bundle {answered.bundle}" if answered.bundle else ""
        return f"stored {event.status} {event.action} task {event.task_id} ({len(event.lines)} line(s){linked})"


def _linkable_bundle(event: NodeTaskCompleted) -> str:
    """The bundle name the node reported, if it is the one this task may link; any other name is dropped, loudly."""
    if not event.bundle or is_bundle_of(event.bundle, event.deployment_id, event.task_id):
        return event.bundle
    log.warning(
        "node of %s reported bundle %r for task %s, not the name that task may link; not linked",
        event.deployment_id,
        scrub_line(event.bundle, 200),
        event.task_id,
    )
    return ""

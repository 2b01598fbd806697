"""Cloud Function ``benchmark``: the commands and events that concern a deployment's node.

Benchmark requests and schedules and node tasks (``serving.restart``, ``serving.logs``, ``serving.debug``) from
the commands topic; the node agent's answers, results and boot reports from the events topic, where a TPU VM may report
about itself (its events sealed with its own deployment's key, shared/domain/node_seal.py) but never command
(shared/messages/routing.py). Return acks, raise retries (shared/entry.py);
configuration comes from ``TPUCTL_*`` variables.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flask
import functions_framework

from shared.logging import configure_logging
from shared.messages import CaptureDebugBundle, Message, NodeTaskCompleted, RestartServing, TailServingLogs
from shared.triggers import FunctionEntry
from shared.wiring import Runtime, runtime


def _handler(rt: Runtime) -> Callable[[Message], str]:
    def handle(message: Message) -> str:
        """Node tasks (``NODE_TASK_KINDS``) and their answers to the node-task service, the rest to the benchmarker."""
        match message:
            case RestartServing() | TailServingLogs() | CaptureDebugBundle() | NodeTaskCompleted():
                return rt.node_tasks.handle(message)
            case _:
                return rt.benchmarker.handle(message)

    return handle


ENTRY = FunctionEntry("benchmark", _handler, authenticate=lambda rt: rt.event_seals.check)
configure_logging(runtime().settings.log_level)


@functions_framework.cloud_event
def benchmark(cloud_event: Any) -> None:
    ENTRY.cloud_event(cloud_event)


@functions_framework.errorhandler(400)
def unreadable_push(error: Exception) -> Any:
    """A push functions-framework cannot convert (an attribute-only message) is recorded and acked."""
    return ("", 204) if ENTRY.unreadable_push(flask.request.get_data(), flask.request.path) else error

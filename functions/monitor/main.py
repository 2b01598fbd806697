"""Cloud Function ``monitor``: a Scheduler tick probes every serving deployment and records what it saw.

Return acks, raise retries (shared/entry.py); what it accepts from which topic is the routing table's
(shared/messages/routing.py); configuration comes from ``TPUCTL_*`` variables.
"""

from __future__ import annotations

from typing import Any

import flask
import functions_framework

from shared.logging import configure_logging
from shared.triggers import FunctionEntry
from shared.wiring import runtime

ENTRY = FunctionEntry("monitor", lambda rt: rt.monitor.handle)
configure_logging(runtime().settings.log_level)


@functions_framework.cloud_event
def monitor(cloud_event: Any) -> None:
    ENTRY.cloud_event(cloud_event)


@functions_framework.errorhandler(400)
def unreadable_push(error: Exception) -> Any:
    """A push functions-framework cannot convert (an attribute-only message) is recorded and acked."""
    return ("", 204) if ENTRY.unreadable_push(flask.request.get_data(), flask.request.path) else error

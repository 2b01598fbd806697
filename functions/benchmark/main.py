"""Cloud Function ``benchmark``: the commands and events that concern a deployment's node.

Benchmark requests and schedules, node tasks (``serving.restart``, ``serving.logs``) and the node agent's
answers, results and boot reports. Return acks, raise retries (shared/entry.py); configuration comes from
``TPUCTL_*`` variables.
"""

from __future__ import annotations

from typing import Any

import functions_framework

from shared.entry import handle_payload, payload_from_cloud_event
from shared.logging import configure_logging
from shared.wiring import runtime

KINDS = frozenset({"benchmark.run", "benchmark.schedule", "benchmark.completed", "node.booted",
                   "serving.restart", "serving.logs", "node.task_completed"})  # fmt: skip
NODE_TASK_MESSAGES = frozenset({"serving.restart", "serving.logs", "node.task_completed"})
configure_logging(runtime().settings.log_level)


def _handle(message: Any) -> str:
    rt = runtime()
    service = rt.node_tasks if message.kind in NODE_TASK_MESSAGES else rt.benchmarker
    return str(service.handle(message))


@functions_framework.cloud_event
def benchmark(cloud_event: Any) -> None:
    rt = runtime()
    handle_payload(
        payload_from_cloud_event(cloud_event), _handle, store=rt.store, clock=rt.clock,
        max_age_s=rt.settings.max_event_age_s, claim_s=rt.settings.command_claim_s, accept=KINDS,
    )  # fmt: skip

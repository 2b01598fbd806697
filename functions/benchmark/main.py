"""Cloud Function ``benchmark``: benchmark requests and schedules, and the node agent's results and boot reports.

Return acks, raise retries (shared/entry.py); configuration comes from ``TPUCTL_*`` variables.
"""

from __future__ import annotations

from typing import Any

import functions_framework

from shared.entry import handle_payload, payload_from_cloud_event
from shared.logging import configure_logging
from shared.wiring import runtime

KINDS = frozenset({"benchmark.run", "benchmark.schedule", "benchmark.completed", "node.booted"})
configure_logging(runtime().settings.log_level)


@functions_framework.cloud_event
def benchmark(cloud_event: Any) -> None:
    rt = runtime()
    handle_payload(
        payload_from_cloud_event(cloud_event), rt.benchmarker.handle, store=rt.store, clock=rt.clock,
        max_age_s=rt.settings.max_event_age_s, claim_s=rt.settings.command_claim_s, accept=KINDS,
    )  # fmt: skip

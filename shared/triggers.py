"""What each Cloud Function's ``main.py`` runs: a delivery through ``shared.entry`` to the function's service.

Kept out of ``main.py`` so the three entry points stay a few lines each and cannot drift apart: the routing
table (``shared.messages.routing``) decides what each accepts from which topic, the runtime supplies the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from shared.entry import EntryResult, handle_payload, payload_from_cloud_event, payload_from_push_body
from shared.messages.routing import accepted_on
from shared.tracing import configure_tracing, flush_traces
from shared.wiring import Runtime, runtime

__all__ = ["FunctionEntry"]


@dataclass(frozen=True)
class FunctionEntry:
    """One function: ``name`` keys the routing table, ``handler`` picks its service's handler from the runtime."""

    name: str
    handler: Callable[[Runtime], Callable[[Any], str]]
    authenticate: Callable[[Runtime], Callable[[Mapping[str, str], bytes, Any], None]] | None = None

    def cloud_event(self, event: Any) -> EntryResult:
        """Handle one CloudEvent; returns to ack, raises to have Pub/Sub redeliver."""
        return self.deliver(payload_from_cloud_event(event))

    def unreadable_push(self, body: bytes, path: str) -> bool:
        """A push functions-framework refused to convert: record it and ack (True), or leave it alone (False)."""
        payload = payload_from_push_body(body, path)
        if payload is None:
            return False
        self.deliver(payload)
        return True

    def deliver(self, payload: Any) -> EntryResult:
        rt = runtime()
        configure_tracing(rt.settings.trace_export, f"tpuctl-{self.name}", project=rt.settings.project)
        try:
            return self._handle(rt, payload)
        finally:
            flush_traces()  # an instance may be frozen until its next delivery

    def _handle(self, rt: Runtime, payload: Any) -> EntryResult:
        return handle_payload(
            payload,
            self.handler(rt),
            store=rt.store,
            clock=rt.clock,
            max_age_s=rt.settings.max_event_age_s,
            claim_s=rt.settings.command_claim_s,
            accept=accepted_on(self.name, rt.topic),
            authenticate=self.authenticate(rt) if self.authenticate is not None else None,
        )

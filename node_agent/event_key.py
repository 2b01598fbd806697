"""This VM's event key, read from its own instance metadata: the key its node agent seals its events with.

The metadata server answers only the VM it runs for, so the key names this node's deployment alone; the controller
refuses every event from a node without one (``shared.domain.node_seal``).
"""

from __future__ import annotations

import logging
import time

from node_agent.bundle_keeper import metadata_base_url
from shared.domain.node_seal import EVENT_KEY_METADATA

__all__ = ["read_event_key"]

log = logging.getLogger("tpuctl.node_agent")


def read_event_key(
    metadata_host: str | None = None, *, attempts: int = 5, wait_s: float = 2.0, timeout_s: float = 5.0
) -> str | None:
    """This VM's event key from its own instance metadata (``tpuctl-event-key``), or None when it has none.

    The metadata server answers only the VM it runs for, so the key names this node's deployment alone."""
    import httpx

    url = f"{metadata_base_url(metadata_host)}/instance/attributes/{EVENT_KEY_METADATA}"
    for attempt in range(attempts):
        try:
            answer = httpx.get(url, headers={"Metadata-Flavor": "Google"}, timeout=timeout_s)
        except httpx.HTTPError as exc:
            log.warning("metadata server unreachable for the event key (%s); attempt %d", type(exc).__name__, attempt)
        else:
            if answer.status_code == 404:
                break
            key = answer.text.strip()
            if answer.status_code == 200 and len(key) == 64 and all(c in "0123456789abcdef" for c in key):
                return key
            log.warning("metadata server gave no usable event key (HTTP %d); attempt %d", answer.status_code, attempt)
        time.sleep(wait_s)
    log.error(
        "this node has no %s in its instance metadata: the controller will refuse every event it publishes "
        "(benchmark results, task answers, node.booted); recreate the node from the controller",
        EVENT_KEY_METADATA,
    )
    return None

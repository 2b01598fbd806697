"""The span this node's boot is reported under: the ``traceparent`` the controller put in its instance metadata.

The provisioner gives every node it creates the trace context of the pass that created it (``tpuctl-traceparent``,
``shared.tracing.node_trace_metadata``), so the node agent's ``node.booted`` joins the trace of the deploy. It is
read as untrusted text: at most 64 characters, parsed later by the W3C propagator, which ignores anything malformed
(the boot then starts a trace of its own). A missing key or a silent metadata server costs nothing but the link.
"""

from __future__ import annotations

import logging

from node_agent.bundle_keeper import metadata_base_url
from shared.tracing import TRACEPARENT_METADATA

__all__ = ["read_boot_trace"]

log = logging.getLogger("tpuctl.node_agent")


def read_boot_trace(metadata_host: str | None = None, *, timeout_s: float = 5.0) -> str:
    """This VM's ``tpuctl-traceparent`` instance metadata, or "" when it has none or the server does not answer."""
    import httpx

    url = f"{metadata_base_url(metadata_host)}/instance/attributes/{TRACEPARENT_METADATA}"
    try:
        answer = httpx.get(url, headers={"Metadata-Flavor": "Google"}, timeout=timeout_s)
    except httpx.HTTPError as exc:
        log.info("no boot trace: the metadata server did not answer (%s)", type(exc).__name__)
        return ""
    return answer.text.strip()[:64] if answer.status_code == 200 else ""

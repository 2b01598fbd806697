"""A one-line progress text for a deployment's phase: what a person wants to read while waiting (pure).

The status message and the boot stage come from the controller and the node, so they are untrusted text: the
caller passes ``clean`` (text, limit) -> text, which the gateway makes its log-hygiene cleaner.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from shared.domain.boot_progress import stage_text
from shared.domain.models import DeploymentRecord, Phase

__all__ = ["deployment_stage"]


def _as_is(text: str, limit: int) -> str:
    return text


def deployment_stage(record: DeploymentRecord, now: datetime, *, clean: Callable[[str, int], str] = _as_is) -> str:
    """A one-line progress text for a deployment's phase (what a person wants to read while waiting)."""
    status = record.status
    phase = status.phase
    since = status.phase_since
    elapsed = f", {int((now - since).total_seconds() // 60)} min" if since else ""
    if phase is Phase.PENDING:
        return "Accepted: planning the capacity search"
    if phase is Phase.SEARCHING:
        waiting = [r for r in status.resources if r.state.value in ("WAITING_FOR_RESOURCES", "ACCEPTED", "CREATING")]
        places = ", ".join(f"{r.zone} {r.tier.value}" for r in waiting[:3]) or "trying zones"
        return f"Waiting for capacity ({places}{elapsed})"
    if phase is Phase.PROVISIONING:
        return f"Provisioning the TPU VM in {status.zone or '?'} ({status.tier.value if status.tier else '?'}{elapsed})"
    current = {ref.name for ref in status.resources if ref.generation == record.generation}
    boot = clean(stage_text(status.boot if status.boot and status.boot.node in current else None), 200)
    if phase is Phase.BOOTING:
        return f"Booting: {boot or 'pulling the image and the model weights'}{elapsed}"
    if phase is Phase.COMPILING:
        return f"Starting vLLM: {boot or 'loading weights and compiling'}{elapsed}"
    if phase is Phase.SERVING:
        return f"Healthy: serving at {status.endpoint}"
    if phase in (Phase.DEGRADED, Phase.STALLED, Phase.DOWN):
        detail = clean(status.message, 160)
        return f"Unhealthy ({phase.value}{elapsed})" + (f": {detail}" if detail else "")
    if phase is Phase.FAILED:
        attempts = f"see the attempts in tpu_status(deployment_id='{record.deployment_id}')"
        return "Failed: " + (clean(status.message, 200) or attempts)
    return phase.value.capitalize() + elapsed

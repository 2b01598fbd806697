"""How the provisioner's status write is merged with a concurrent writer's (the monitor's), field by field.

Why here: the provisioner compare-and-sets the status it planned; when another writer (the monitor, a command)
changed the record meanwhile, the provisioner's fields win and the monitor's are kept. The rule is pure and small,
and it is the contract between the two services over one record, so it lives beside the models.
"""

from __future__ import annotations

from typing import Any

from shared.domain.models import DeploymentStatus, Phase

__all__ = ["STATUS_FIELDS_OWNED", "merge_status"]

STATUS_FIELDS_OWNED = (
    "observed_generation",
    "zone",
    "tier",
    "backend",
    "accelerator",
    "search_since",
    "endpoint",
    "message",
    "resources",
    "attempts",
    "next_attempt",
    "probes",
    "calendar",
    "spend_usd",
    "billed_until",
)
"""The status fields the provisioner owns."""

_NO_SERVING_NODE = frozenset(
    {Phase.PENDING, Phase.SEARCHING, Phase.PROVISIONING, Phase.STOPPING, Phase.STOPPED, Phase.DELETING, Phase.FAILED}
)
"""Phases with no node serving: entering one forgets ``serving_since``, so the next node's boot is judged as a boot
(BOOTING, COMPILING), not as an outage of a server that had been up (DOWN) and healed by a restart mid-boot."""


def merge_status(base: DeploymentStatus, ours: DeploymentStatus, fresh: DeploymentStatus) -> DeploymentStatus:
    """Our fields from ``ours``; the monitor's fields from ``fresh``; phase ours only if we changed it (and then
    ``serving_since`` forgotten when no node serves any more)."""
    if ours.phase != base.phase and ours.phase in _NO_SERVING_NODE:
        ours = ours.model_copy(update={"serving_since": None})
    if fresh == base:
        return ours
    update: dict[str, Any] = {name: getattr(ours, name) for name in STATUS_FIELDS_OWNED}
    if ours.phase != base.phase:
        update["phase"] = ours.phase
        update["phase_since"] = ours.phase_since
        if ours.phase in _NO_SERVING_NODE:
            update["serving_since"] = None
    return fresh.model_copy(update=update)

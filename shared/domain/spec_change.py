"""Which spec changes need a new generation (a TPU slice of its own) and which apply to the running one.

Why: every generation runs on a slice of its own, so a new generation costs a capacity search, a handover with two
slices billing and a model load. Changing when the deployment ends (TTL, budget, idle rules) or how the monitor
judges it (health thresholds) touches neither the slice nor vLLM, so it applies in place, to the same generation.
"""

from __future__ import annotations

from shared.domain.models import DeploymentSpec

__all__ = ["IN_PLACE_FIELDS", "needs_new_generation"]

IN_PLACE_FIELDS = frozenset({"ttl_hours", "budget_usd", "idle_minutes", "on_idle", "health"})


def needs_new_generation(current: DeploymentSpec, wanted: DeploymentSpec) -> bool:
    """Whether going from ``current`` to ``wanted`` changes anything outside ``IN_PLACE_FIELDS``."""
    keep = {field: getattr(current, field) for field in IN_PLACE_FIELDS}
    return wanted.model_copy(update=keep) != current

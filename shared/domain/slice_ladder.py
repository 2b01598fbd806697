"""Step-down and step-across: the slices a search may ask for, and when it widens to the next one.

A spec names one ``accelerator`` and, optionally, ``alternative_accelerators`` in order (a v6e-8 first, then a
v6e-4 for a preset that fits both at the chosen context). The search asks for the first slice only; every
``StepPolicy.step_after_minutes`` of searching without an ACTIVE slice it widens to the next one, keeping the
requests it already has (a waiting request costs nothing). Which slice was granted, and why, is recorded on the
request (``ResourceRef.accelerator``), its attempt log and the status (``DeploymentStatus.accelerator``).

Each alternative must fit the preset at the spec's context by the same rule the serving plan uses
(:func:`check_alternatives` builds the serving plan for each); the serving config of a request follows its own
slice (the provisioner renders one startup script per slice, so tensor parallelism matches the chips granted).
Pure: the clock is the status's ``search_since``, set by the planner when a search begins and cleared when a slice
is ACTIVE, so a repeated or late message re-derives the same ladder.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from shared.domain.errors import InvalidMessage
from shared.domain.models import DeploymentRecord, DeploymentSpec, ResourceRef

if TYPE_CHECKING:
    from shared.domain.serving_plan import ServingEnvironment

__all__ = [
    "StepPolicy",
    "advice_slice",
    "allowed_slices",
    "check_alternatives",
    "chips_of",
    "ladder",
    "ref_slice",
    "scripts_per_slice",
    "served_spec",
    "spec_for_slice",
    "step_reason",
]


@dataclass(frozen=True, slots=True)
class StepPolicy:
    """When the search widens to the next allowed slice."""

    step_after_minutes: float = 10.0
    """Searching this long without an ACTIVE slice widens to the next slice of the ladder (and again for each
    further one). 10 min: two capacity checks of the first sweep, so a scarce first slice is not waited out
    for long, while a first slice that is granted within minutes is never stepped away from."""


def ladder(spec: DeploymentSpec) -> tuple[str, ...]:
    """Every slice the spec allows, in the order the search widens to them."""
    return (spec.accelerator, *spec.alternative_accelerators)


def allowed_slices(spec: DeploymentSpec, search_since: datetime | None, now: datetime, policy: StepPolicy) -> list[str]:
    """The slices the search may ask for now: the first, then one more per ``step_after_minutes`` searched."""
    slices = ladder(spec)
    if search_since is None or len(slices) == 1:
        return [slices[0]]
    step = timedelta(minutes=policy.step_after_minutes)
    steps = int((now - search_since) / step) if step > timedelta(0) else len(slices)
    return list(slices[: 1 + max(0, steps)])


def advice_slice(spec: DeploymentSpec, search_since: datetime | None, now: datetime, policy: StepPolicy) -> str:
    """The slice capacity advice is asked for: the one the ladder widened to last (the search asks it first)."""
    return allowed_slices(spec, search_since, now, policy)[-1]


def ref_slice(spec: DeploymentSpec, ref: ResourceRef) -> str:
    """The slice a request asked for (older records carry none: the spec's)."""
    return ref.accelerator or spec.accelerator


def spec_for_slice(spec: DeploymentSpec, accelerator: str) -> DeploymentSpec:
    """The spec as if it named ``accelerator``: what the serving plan and startup script of that slice come from."""
    if accelerator == spec.accelerator:
        return spec
    return spec.model_copy(update={"accelerator": accelerator, "alternative_accelerators": ()})


def served_spec(record: DeploymentRecord) -> DeploymentSpec:
    """The spec as the slice granted serves it (a step-down's tensor parallelism, not the first slice's)."""
    return spec_for_slice(record.spec, record.status.accelerator or record.spec.accelerator)


def step_reason(spec: DeploymentSpec, accelerator: str, search_since: datetime | None, now: datetime) -> str:
    """Why a request asks for this slice (the attempt log's words)."""
    if accelerator == spec.accelerator:
        return ""
    waited = (now - search_since).total_seconds() / 60 if search_since is not None else 0.0
    first = spec.accelerator
    kind = "step-down" if _chips(accelerator) < _chips(first) else "step-across"
    return f"{kind} to {accelerator}: no {first} after {waited:.0f} min of searching"


def scripts_per_slice(spec: DeploymentSpec, render: Callable[[DeploymentSpec], str]) -> Mapping[str, str]:
    """One startup script per allowed slice, each rendered from that slice's spec (its own tensor parallelism)."""
    return {accelerator: render(spec_for_slice(spec, accelerator)) for accelerator in ladder(spec)}


def check_alternatives(spec: DeploymentSpec, environment: ServingEnvironment) -> None:
    """Raise ``InvalidMessage`` naming ``alternative_accelerators[i]`` when an alternative slice cannot serve the
    preset with the spec's serving options, by the serving plan's own fit rule."""
    from shared.domain.serving_plan import build_serving_plan  # the capacity model: loaded only when checked

    for index, accelerator in enumerate(spec.alternative_accelerators):
        field = f"alternative_accelerators[{index}]"
        if accelerator.rsplit("-", 1)[0] != spec.accelerator.rsplit("-", 1)[0]:
            raise InvalidMessage(
                field,
                f"{accelerator} is not a {spec.accelerator.rsplit('-', 1)[0]} slice like {spec.accelerator}",
                "list alternatives of the same family as accelerator",
            )
        plan = build_serving_plan(spec_for_slice(spec, accelerator), environment)
        if not plan.fits:
            reasons = "; ".join(plan.capacity.reasons)
            smallest = plan.smallest_fitting_slice
            fix = f"drop {accelerator}, or lower max_model_len (or use kv_cache_dtype fp8) until it fits"
            raise InvalidMessage(
                field,
                f"{spec.model} does not fit {accelerator} at max_model_len {plan.engine.max_model_len}: {reasons}",
                fix + (f"; the smallest slice that fits is {smallest}" if smallest else ""),
            )


def _chips(accelerator: str) -> int:
    family, count = accelerator.rsplit("-", 1)
    return int(count) // 2 if family == "v5p" else int(count)


def chips_of(accelerator: str) -> int:
    """Chips in one slice of this type (v5p names count TensorCores, two per chip)."""
    return _chips(accelerator)

"""Capacity advice and calendar-mode future reservations of the simulated Compute Engine
(docs/reference/capacity-advice.md, A1 to A3).

Advice is read from the scenario's own capacity: with ``advice.staleness_minutes`` 0 it is the live pool
(timeline steps, random arrivals and chips in use); otherwise it is the pool's scripted timeline as it stood
N minutes ago. With probability ``1 - advice.accuracy`` a zone's score is inverted (a full zone looks empty
and an empty one full). The noise draws come from their own generator seeded by the scenario seed, the zone
and the virtual time, so they never disturb the world's RNG and the same calls give the same advice.

A future reservation in calendar mode holds on-demand chips of its zone from its start time to its end time
and puts them in the pool ``reservation:<reservationName>``, which ``RESERVATION_BOUND`` instances naming that
reservation consume; deleting it (or its end) gives the chips back. From its approval to its end (or its
deletion) the zone has that reservation as if the scenario declared it (:func:`booked_reservations`), as Compute
Engine creates a booking's reservation at approval, inactive until the start time.
"""

from __future__ import annotations

import random
import weakref
from dataclasses import dataclass, field
from typing import Any

from localcloud.tpu_sim.compute_render import zone_url
from localcloud.tpu_sim.compute_validation import MACHINE_TYPES, ComputeApiError
from localcloud.tpu_sim.kernel import LABEL_DEPLOYMENT, PoolKey, SimKernel
from localcloud.tpu_sim.scenario import Scenario
from localcloud.tpu_sim.wire import SimApiError, format_time, parse_duration, parse_time
from shared.domain.calendar_mode import owner_of

__all__ = [
    "DAY_S",
    "MAX_LEAD_S",
    "FutureReservation",
    "ReservationBook",
    "booked_reservations",
    "calendar_advice",
    "calendar_bookings",
    "capacity_advice",
    "capacity_history",
    "check_period",
    "duration_field",
    "free_window",
    "invalid",
    "reservation_book",
    "time_field",
    "vm_family_and_chips",
]

DAY_S = 86400.0
MAX_LEAD_S = 120 * DAY_S  # TPUs: availability viewable up to 120 days ahead
VM_FAMILIES = {
    "VM_FAMILY_CLOUD_TPU_LITE_POD_SLICE_CT6E": "v6e",
    "VM_FAMILY_CLOUD_TPU_LITE_POD_SLICE_CT5LP": "v5litepod",
}
CHIP_COUNTS = (1, 4, 8, 16, 32, 64, 128, 256)
_POOL_OF_MODEL = {"STANDARD": "on_demand", "SPOT": "spot", "FLEX_START": "flex_start"}
_BY_MACHINE = {machine: (accelerator, chips) for accelerator, (machine, chips) in MACHINE_TYPES.items()}


def invalid(field_name: str, why: str) -> ComputeApiError:
    """A 400 in Compute Engine's envelope naming the field."""
    return ComputeApiError(400, f"Invalid value for field '{field_name}': {why}", reason="invalid")


def duration_field(value: Any, field_name: str) -> float:
    try:
        return parse_duration(value, field_name)
    except SimApiError as error:
        raise invalid(field_name, error.message) from None


def time_field(value: Any, field_name: str) -> float:
    try:
        return parse_time(value, field_name)
    except SimApiError as error:
        raise invalid(field_name, error.message) from None


def _last(url: Any) -> str:
    return str(url or "").rstrip("/").rsplit("/", 1)[-1]


def region_zones(scenario: Scenario, region: str) -> list[str]:
    zones = sorted(zone for zone in scenario.zones if zone.rsplit("-", 1)[0] == region)
    if not zones:
        raise ComputeApiError(404, f"The resource 'regions/{region}' was not found", reason="notFound")
    return zones


def timeline_total(scenario: Scenario, key: PoolKey, elapsed_s: float) -> int:
    """Chips the scenario scripts for a pool ``elapsed_s`` after its start (the steps, not random arrivals)."""
    zone, family, pool = key
    spec = scenario.zones[zone].capacity.get(family, {}).get(pool) if zone in scenario.zones else None
    if spec is None:
        return 0
    chips = spec.chips
    for step in spec.timeline:
        if step.at_s <= elapsed_s:
            chips = step.chips
    return chips


def _noise(scenario: Scenario, kind: str, zone: str, now_s: float) -> random.Random:
    return random.Random(f"{scenario.seed}/{kind}/{zone}/{now_s:.3f}")


# ---------------------------------------------------------------------------------------------- advice.capacity


@dataclass(frozen=True)
class _CapacityAsk:
    machine: str
    family: str
    chips: int
    model: str
    size: int
    zones: list[str]


def _parse_capacity(scenario: Scenario, region: str, body: Any) -> _CapacityAsk:
    if not isinstance(body, dict):
        raise invalid("capacityAdviceRequest", "the body must be a CapacityAdviceRequest")
    scheduling = (body.get("instanceProperties") or {}).get("scheduling") or {}
    model = str(scheduling.get("provisioningModel") or "")
    if model not in _POOL_OF_MODEL:
        raise invalid(
            "instanceProperties.scheduling.provisioningModel", f"'{model}'. Use one of {', '.join(_POOL_OF_MODEL)}."
        )
    if model == "FLEX_START" and scheduling.get("maxRunDuration") is None:
        raise invalid("instanceProperties.scheduling.maxRunDuration", "required with FLEX_START.")
    if scheduling.get("maxRunDuration") is not None:
        duration_field(scheduling["maxRunDuration"], "instanceProperties.scheduling.maxRunDuration")
    selections = (body.get("instanceFlexibilityPolicy") or {}).get("instanceSelections") or {}
    if not isinstance(selections, dict) or len(selections) != 1:
        raise invalid("instanceFlexibilityPolicy.instanceSelections", "exactly one instance selection is supported.")
    selection = next(iter(selections.values()))
    machines = (selection.get("machineTypes") if isinstance(selection, dict) else None) or []
    machine = _last(machines[0]) if machines else ""
    if machine not in _BY_MACHINE:
        raise invalid("instanceFlexibilityPolicy.instanceSelections.machineTypes", f"'{machine}' is not a TPU VM type.")
    accelerator, chips = _BY_MACHINE[machine]
    size = body.get("size", 1)
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise invalid("size", f"{size!r}: must be a positive number of VMs.")
    in_region = region_zones(scenario, region)
    listed = [_last(entry.get("zone")) for entry in (body.get("distributionPolicy") or {}).get("zones") or []]
    for zone in listed:
        if zone not in in_region:
            raise invalid("distributionPolicy.zones", f"'{zone}' is not a zone of region '{region}'.")
    family = accelerator.rsplit("-", 1)[0]
    return _CapacityAsk(machine, family, chips, model, size, sorted(listed) or in_region)


def _free_chips(kernel: SimKernel, key: PoolKey) -> int:
    """Free chips as the advice sees them: live when current, the scripted timeline when stale."""
    staleness_s = kernel.scenario.advice.staleness_minutes * 60.0
    if staleness_s <= 0:
        return kernel.pools[key].free if key in kernel.pools else 0
    elapsed = max(0.0, kernel.now_s - kernel.start_s - staleness_s)
    return timeline_total(kernel.scenario, key, elapsed)


def _uptime_s(scenario: Scenario, zone: str) -> int:
    hazard = scenario.zones[zone].preemption.hazard_per_hour
    return 3600 if hazard < 1.0 else 600


def capacity_advice(kernel: SimKernel, project: str, region: str, body: Any) -> dict[str, Any]:
    """``advice.capacity``: one recommendation per zone, best obtainability first (ties by zone name)."""
    scenario = kernel.scenario
    ask = _parse_capacity(scenario, region, body)
    needed = ask.chips * ask.size
    scored: list[tuple[float, str]] = []
    for zone in ask.zones:
        truth = min(1.0, _free_chips(kernel, (zone, ask.family, _POOL_OF_MODEL[ask.model])) / needed)
        score = round(0.95 * truth, 2)
        if _noise(scenario, "capacity", zone, kernel.now_s).random() >= scenario.advice.accuracy:
            score = round(0.95 - score, 2)
        scored.append((score, zone))
    recommendations = []
    for score, zone in sorted(scored, key=lambda item: (-item[0], item[1])):
        scores: dict[str, Any] = {"obtainability": score}
        if ask.model == "SPOT":
            scores["estimatedUptime"] = f"{_uptime_s(scenario, zone)}s"
        shard = {
            "zone": zone_url(project, zone),
            "machineType": ask.machine,
            "instanceCount": ask.size,
            "provisioningModel": ask.model,
        }
        recommendations.append({"scores": scores, "shards": [shard]})
    return {"recommendations": recommendations}


# ---------------------------------------------------------------------------------------- advice.capacityHistory


def capacity_history(kernel: SimKernel, project: str, region: str, body: Any) -> dict[str, Any]:
    """``advice.capacityHistory``: hourly spot preemption rates (from the zones' hazards) and list prices, the
    last 24 hours of virtual time."""
    scenario = kernel.scenario
    if not isinstance(body, dict):
        raise invalid("capacityHistoryAdviceRequest", "the body must be a CapacityHistoryAdviceRequest")
    properties = body.get("instanceProperties") or {}
    model = str((properties.get("scheduling") or {}).get("provisioningModel") or "")
    if model != "SPOT":
        raise invalid("instanceProperties.scheduling.provisioningModel", f"'{model}'. This field must be set to SPOT.")
    machine = _last(properties.get("machineType"))
    if machine not in _BY_MACHINE:
        raise invalid("instanceProperties.machineType", f"'{machine}' is not a TPU VM type.")
    types = body.get("types") or ["PREEMPTION", "PRICE"]
    if not set(types) <= {"PREEMPTION", "PRICE"}:
        raise invalid("types", f"{types!r}: use PREEMPTION and/or PRICE.")
    location = _last((body.get("locationPolicy") or {}).get("location")) or region
    zones = [location] if location != region else region_zones(scenario, region)
    if location != region and location not in region_zones(scenario, region):
        raise invalid("locationPolicy.location", f"'{location}' is not a zone of region '{region}'.")
    hazard = sum(scenario.zones[zone].preemption.hazard_per_hour for zone in zones) / len(zones)
    rate = round(min(1.0, hazard / (1.0 + hazard)), 4)
    usd = scenario.price(region, "spot") * _BY_MACHINE[machine][1]
    money = {"currencyCode": "USD", "units": str(int(usd)), "nanos": round((usd - int(usd)) * 1e9)}
    end = kernel.now_s - kernel.now_s % 3600
    intervals = [
        {"startTime": format_time(end - (n + 1) * 3600), "endTime": format_time(end - n * 3600)} for n in range(24)
    ]
    scope = f"zones/{location}" if location != region else f"regions/{region}"
    answer: dict[str, Any] = {
        "machineType": machine,
        "location": f"https://www.googleapis.com/compute/v1/projects/{project}/{scope}",
    }
    if "PREEMPTION" in types:
        answer["preemptionHistory"] = [{"interval": span, "preemptionRate": rate} for span in intervals]
    if "PRICE" in types:
        answer["priceHistory"] = [{"interval": span, "listPrice": money} for span in intervals]
    return answer


# ----------------------------------------------------------------------------------- future reservations (state)


@dataclass
class FutureReservation:
    zone: str
    name: str
    body: dict[str, Any]
    family: str
    chips: int
    start_s: float
    end_s: float
    numeric_id: int
    created_s: float
    procurement: str
    holding: bool = False


@dataclass
class ReservationBook:
    """The future reservations of one world (forgotten when the world's kernel restarts)."""

    pools: dict[PoolKey, Any]
    items: dict[tuple[str, str], FutureReservation] = field(default_factory=dict)
    serial: int = 0

    def held(self, zone: str, family: str, start_s: float, end_s: float) -> int:
        """On-demand chips promised to approved reservations overlapping ``[start_s, end_s)`` in a zone."""
        return sum(
            item.chips
            for item in self.items.values()
            if item.zone == zone
            and item.family == family
            and item.procurement in ("APPROVED", "FULFILLED")
            and item.start_s < end_s
            and start_s < item.end_s
        )


_BOOKS: weakref.WeakKeyDictionary[SimKernel, ReservationBook] = weakref.WeakKeyDictionary()
_RESERVATION_EXISTS = frozenset({"APPROVED", "PROVISIONING", "FULFILLED"})


def calendar_bookings(kernel: SimKernel) -> list[tuple[str, str, str, dict[str, str]]]:
    """tpuctl's bookings (``tpuctl-cal-<deployment>``) still held, as the invariants' resources: one no live deployment
    holds is an orphan like a queued resource. Other names are someone else's and not counted."""
    held = []
    for item in reservation_book(kernel).items.values():
        owner = owner_of(item.name)
        if owner is not None and item.end_s > kernel.now_s:
            held.append(("future_reservation", item.zone, item.name, {LABEL_DEPLOYMENT: owner}))
    return held


def reservation_book(kernel: SimKernel) -> ReservationBook:
    """The kernel's book; a fresh one after a restart (the restart replaces the pools)."""
    book = _BOOKS.get(kernel)
    if book is None or book.pools is not kernel.pools:
        book = ReservationBook(kernel.pools)
        _BOOKS[kernel] = book
    return book


def booked_reservations(kernel: SimKernel, zone: str) -> frozenset[str]:
    """The reservations future reservations created in ``zone``: from approval until the booking's end, its
    deletion, or its decline or failure (then the name is unknown again, unless the scenario declares it)."""
    book = _BOOKS.get(kernel)
    if book is None or book.pools is not kernel.pools:
        return frozenset()
    return frozenset(
        str(item.body["reservationName"])
        for item in book.items.values()
        if item.zone == zone and item.procurement in _RESERVATION_EXISTS and kernel.now_s < item.end_s
    )


# --------------------------------------------------------------------------------------- advice.calendarMode


def _calendar_ask(kernel: SimKernel, body: Any) -> tuple[dict[str, Any], str, int, float, float, float]:
    """-> (spec, family, chips, earliest start, latest start, duration)."""
    prefix = "futureResourcesSpecs"
    specs = body.get(prefix) if isinstance(body, dict) else None
    if not isinstance(specs, dict) or len(specs) != 1 or not isinstance(next(iter(specs.values())), dict):
        raise invalid(prefix, "exactly one spec is allowed in this map.")
    key, spec = next(iter(specs.items()))
    prefix = f"{prefix}.{key}"
    aggregate = (spec.get("targetResources") or {}).get("aggregateResources") or {}
    family, chips = vm_family_and_chips(
        aggregate.get("vmFamily"), aggregate.get("acceleratorCount"), f"{prefix}.targetResources.aggregateResources"
    )
    window = spec.get("timeRangeSpec") or {}
    now = kernel.now_s
    early = (
        time_field(window["startTimeNotEarlierThan"], f"{prefix}.timeRangeSpec.startTimeNotEarlierThan")
        if (window.get("startTimeNotEarlierThan"))
        else now
    )
    late = (
        time_field(window["startTimeNotLaterThan"], f"{prefix}.timeRangeSpec.startTimeNotLaterThan")
        if (window.get("startTimeNotLaterThan"))
        else now + MAX_LEAD_S
    )
    if late > now + MAX_LEAD_S or late < max(early, now):
        raise invalid(
            f"{prefix}.timeRangeSpec.startTimeNotLaterThan",
            f"{format_time(late)}: must be after the earliest start and at most 120 days from now.",
        )
    span = {"minDuration": DAY_S, "maxDuration": 90 * DAY_S}  # the shortest window asked for is advised
    for name in span:
        if window.get(name) is not None:
            span[name] = duration_field(window[name], f"{prefix}.timeRangeSpec.{name}")
            check_period(span[name], f"{prefix}.timeRangeSpec.{name}")
    if span["maxDuration"] < span["minDuration"]:
        raise invalid(f"{prefix}.timeRangeSpec.maxDuration", f"{span['maxDuration']:.0f}s is shorter than minDuration.")
    return spec, family, chips, max(early, now), late, span["minDuration"]


def vm_family_and_chips(vm_family: Any, count: Any, field_name: str) -> tuple[str, int]:
    """``VM_FAMILY_CLOUD_TPU_LITE_POD_SLICE_CT6E``, ``"4"`` -> ("v6e", 4), or a 400 naming the field."""
    if vm_family not in VM_FAMILIES:
        raise invalid(f"{field_name}.vmFamily", f"'{vm_family}'. Use one of {', '.join(VM_FAMILIES)}.")
    try:
        chips = int(count)
    except (TypeError, ValueError):
        chips = 0
    if chips not in CHIP_COUNTS:
        raise invalid(f"{field_name}.acceleratorCount", f"{count!r}. Use one of {CHIP_COUNTS}.")
    return VM_FAMILIES[vm_family], chips


def check_period(seconds: float, field_name: str) -> None:
    """A calendar-mode period is 1 to 90 days."""
    if not DAY_S <= seconds <= 90 * DAY_S:
        raise invalid(field_name, f"{seconds:.0f}s. A calendar-mode reservation lasts 1 to 90 days.")


def free_window(kernel: SimKernel, zone: str, family: str, chips: int, start_s: float, end_s: float) -> bool:
    """The zone's scripted on-demand chips, less other reservations, cover ``chips`` over the whole window."""
    scenario = kernel.scenario
    key = (zone, family, "on_demand")
    spec = scenario.zones[zone].capacity.get(family, {}).get("on_demand")
    points = [start_s] + [kernel.start_s + step.at_s for step in (spec.timeline if spec else ())]
    held = reservation_book(kernel).held(zone, family, start_s, end_s)
    for at in points:
        if start_s <= at < end_s and timeline_total(scenario, key, at - kernel.start_s) - held < chips:
            return False
    return True


def _earliest(kernel: SimKernel, zone: str, ask: tuple[str, int, float, float, float]) -> float | None:
    family, chips, early, late, duration = ask
    spec = kernel.scenario.zones[zone].capacity.get(family, {}).get("on_demand")
    starts = sorted(
        {early}
        | {kernel.start_s + s.at_s for s in (spec.timeline if spec else ()) if early < kernel.start_s + s.at_s <= late}
    )
    for start in starts:
        if free_window(kernel, zone, family, chips, start, start + duration):
            return start
    return None


def calendar_advice(kernel: SimKernel, project: str, region: str, body: Any) -> dict[str, Any]:
    """``advice.calendarMode``: the allowed zone with the earliest window that fits, the others' status."""
    spec, family, chips, early, late, duration = _calendar_ask(kernel, body)
    locations = (spec.get("locationPolicy") or {}).get("locations") or {}
    denied = {_last(k) for k, v in locations.items() if (v or {}).get("preference") == "DENY"}
    zones = [zone for zone in region_zones(kernel.scenario, region) if zone not in denied]
    found = {zone: _earliest(kernel, zone, (family, chips, early, late, duration)) for zone in zones}
    fitting = sorted((start, zone) for zone, start in found.items() if start is not None)
    if not fitting:
        return {"recommendations": []}
    start, best = fitting[0]
    others = {
        f"zones/{zone}": {"status": "RECOMMENDED"}
        if found[zone] is not None
        else {"status": "NO_CAPACITY", "details": f"No {chips}-chip window in {zone} before {format_time(late)}."}
        for zone in zones
        if zone != best
    }
    recommendation = {
        "recommendationId": f"{kernel.scenario.seed}-{best}-{int(start)}",
        "recommendationType": "FUTURE_RESERVATION",
        "location": f"zones/{best}",
        "startTime": format_time(start),
        "endTime": format_time(start + duration),
        "otherLocations": others,
    }
    key = next(iter(body["futureResourcesSpecs"]))
    return {"recommendations": [{"recommendationsPerSpec": {key: recommendation}}]}

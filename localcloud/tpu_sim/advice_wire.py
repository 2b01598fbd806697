"""The Compute Engine REST routes of capacity advice and calendar-mode future reservations
(docs/reference/capacity-advice.md A1 to A3); ``compute_wire.py`` appends :data:`ADVICE_TABLE` to its table::

    POST   /compute/v1/projects/P/regions/R/advice/capacity         ranked zones with obtainability scores
    POST   /compute/v1/projects/P/regions/R/advice/capacityHistory  spot preemption and price history
    POST   /compute/v1/projects/P/regions/R/advice/calendarMode     a window and zone for a calendar reservation
    POST|GET  /compute/v1/projects/P/zones/Z/futureReservations     insert (requestId) | list
    GET|DELETE /compute/v1/projects/P/zones/Z/futureReservations/N  get | delete

A future reservation goes ``DRAFTING`` (planningStatus DRAFT) or ``PENDING_APPROVAL`` (SUBMITTED), then after
:data:`APPROVAL_S` ``APPROVED`` when the zone's scripted on-demand chips cover its window (``DECLINED``
otherwise), ``FULFILLED`` at its start time when the chips are free (``FAILED`` when they are not), and gives
them back at its end time or when deleted. Its ``reservationName`` need not exist: from approval to its end the
zone has that reservation (empty until the start), as Compute Engine creates it (``advice.booked_reservations``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from localcloud.tpu_sim.advice import (
    MAX_LEAD_S,
    FutureReservation,
    calendar_advice,
    capacity_advice,
    capacity_history,
    check_period,
    duration_field,
    free_window,
    invalid,
    reservation_book,
    time_field,
    vm_family_and_chips,
)
from localcloud.tpu_sim.compute_render import render_op, zone_url
from localcloud.tpu_sim.compute_validation import ComputeApiError, check_project, zone_spec
from localcloud.tpu_sim.kernel import SimKernel
from localcloud.tpu_sim.wire import format_time
from localcloud.tpu_sim.world import World

__all__ = ["ADVICE_TABLE", "APPROVAL_S"]

APPROVAL_S = 60.0
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_PROJECT = r"^/compute/(?:v1|beta)/projects/(?P<project>[^/]+)"  # gcloud sends its beta track to /beta
_REGION = _PROJECT + r"/regions/(?P<region>[^/]+)"
_ZONE = _PROJECT + r"/zones/(?P<zone>[^/]+)"

Query = dict[str, str]
Result = tuple[int, Any]
Handler = Callable[[World, dict[str, str], Query, Any], Result]


def _advise(advisor: Callable[[SimKernel, str, str, Any], dict[str, Any]]) -> Handler:
    def handle(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
        with w.kernel.transaction():
            check_project(w.scenario, p["project"])
            return 200, advisor(w.kernel, p["project"], p["region"], b)

    return handle


# ------------------------------------------------------------------------------------ future reservations


def _render(project: str, item: FutureReservation) -> dict[str, Any]:
    status: dict[str, Any] = {"procurementStatus": item.procurement}
    if item.holding:
        reservation = item.body["reservationName"]
        status["autoCreatedReservations"] = [f"{zone_url(project, item.zone)}/reservations/{reservation}"]
        status["fulfilledCount"] = str(item.chips)
    kernel_fields = {
        "kind": "compute#futureReservation",
        "id": str(item.numeric_id),
        "creationTimestamp": format_time(item.created_s),
        "selfLink": f"{zone_url(project, item.zone)}/futureReservations/{item.name}",
        "zone": zone_url(project, item.zone),
        "timeWindow": {"startTime": format_time(item.start_s), "endTime": format_time(item.end_s)},
        "status": status,
    }
    return {**item.body, **kernel_fields}


def _parse_window(kernel: SimKernel, body: dict[str, Any]) -> tuple[float, float]:
    window = body.get("timeWindow") or {}
    if not window.get("startTime"):
        raise invalid("resource.timeWindow.startTime", "required (RFC 3339).")
    start = time_field(window["startTime"], "resource.timeWindow.startTime")
    if not kernel.now_s <= start <= kernel.now_s + MAX_LEAD_S:
        raise invalid("resource.timeWindow.startTime", f"{window['startTime']}: must be from now to 120 days ahead.")
    if window.get("endTime"):
        end = time_field(window["endTime"], "resource.timeWindow.endTime")
        check_period(end - start, "resource.timeWindow.endTime")
    else:
        end = start + duration_field(window.get("duration"), "resource.timeWindow.duration")
        check_period(end - start, "resource.timeWindow.duration")
    return start, end


def _parse_reservation(w: World, zone: str, body: Any) -> FutureReservation:
    kernel = w.kernel
    if not isinstance(body, dict):
        raise invalid("resource", "the body must be a FutureReservation")
    name = body.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise invalid("resource.name", f"'{name}'. Must be a match of regex '(?:[a-z](?:[-a-z0-9]{{0,61}}[a-z0-9])?)'")
    zone_spec(w.scenario, zone, permission="compute.futureReservations.create")
    aggregate = body.get("aggregateReservation") or {}
    resources = aggregate.get("reservedResources") or [{}]
    count = (resources[0].get("accelerator") or {}).get("acceleratorCount")
    family, chips = vm_family_and_chips(aggregate.get("vmFamily"), count, "resource.aggregateReservation")
    start, end = _parse_window(kernel, body)
    reservation = str(body.get("reservationName") or name)
    if not _NAME.match(reservation):
        raise invalid(
            "resource.reservationName",
            f"'{reservation}'. Must be a match of regex '(?:[a-z](?:[-a-z0-9]{{0,61}}[a-z0-9])?)'",
        )
    planning = str(body.get("planningStatus") or "DRAFT")
    if planning not in ("DRAFT", "SUBMITTED"):
        raise invalid("resource.planningStatus", f"'{planning}'. Use DRAFT or SUBMITTED.")
    book = reservation_book(kernel)
    book.serial += 1
    stored = {**body, "name": name, "reservationName": reservation, "planningStatus": planning}
    procurement = "PENDING_APPROVAL" if planning == "SUBMITTED" else "DRAFTING"
    numeric_id = 8_000_000_000_000 + book.serial * 7919
    return FutureReservation(zone, name, stored, family, chips, start, end, numeric_id, kernel.now_s, procurement)


def _current(kernel: SimKernel, item: FutureReservation) -> bool:
    return reservation_book(kernel).items.get((item.zone, item.name)) is item


def _on_review(kernel: SimKernel, item: FutureReservation) -> None:
    if not _current(kernel, item) or item.procurement != "PENDING_APPROVAL":
        return
    fits = free_window(kernel, item.zone, item.family, item.chips, item.start_s, item.end_s)
    item.procurement = "APPROVED" if fits else "DECLINED"
    kernel.log("future_reservation", item.zone, item.name, item.procurement)


def _on_start(kernel: SimKernel, item: FutureReservation) -> None:
    if not _current(kernel, item) or item.procurement != "APPROVED":
        return
    pool = kernel.pool(item.zone, item.family, "on_demand")
    if pool.free < item.chips:
        item.procurement = "FAILED"
    else:
        pool.used += item.chips
        kernel.pool(item.zone, item.family, f"reservation:{item.body['reservationName']}").total += item.chips
        kernel.mark_dirty((item.zone, item.family, f"reservation:{item.body['reservationName']}"))
        item.holding = True
        item.procurement = "FULFILLED"
    kernel.log("future_reservation", item.zone, item.name, item.procurement)


def _release(kernel: SimKernel, item: FutureReservation) -> None:
    if not item.holding:
        return
    item.holding = False
    key = (item.zone, item.family, "on_demand")
    kernel.pool(*key).used = max(0, kernel.pool(*key).used - item.chips)
    kernel.mark_dirty(key)
    reserved = kernel.pool(item.zone, item.family, f"reservation:{item.body['reservationName']}")
    reserved.total = max(0, reserved.total - item.chips)


def _on_end(kernel: SimKernel, item: FutureReservation) -> None:
    if _current(kernel, item):
        _release(kernel, item)
        kernel.log("future_reservation", item.zone, item.name, "ended")


def _operation(w: World, project: str, zone: str, kind: str, item: FutureReservation) -> dict[str, Any]:
    compute = w.compute
    target = f"{zone_url(project, zone)}/futureReservations/{item.name}"
    op = compute._new_op(zone, kind, target, item.numeric_id)
    compute._finish_op(compute._op_key(op))
    return render_op(project, op)


def _insert(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    kernel = w.kernel
    with kernel.transaction():
        check_project(w.scenario, p["project"])
        item = _parse_reservation(w, p["zone"], b)
        book = reservation_book(kernel)
        if (item.zone, item.name) in book.items:
            raise ComputeApiError(
                409,
                f"The resource 'projects/{p['project']}/zones/{item.zone}/futureReservations/{item.name}' "
                "already exists",
                reason="alreadyExists",
            )
        book.items[(item.zone, item.name)] = item
        if item.procurement == "PENDING_APPROVAL":
            kernel.schedule(kernel.now_s + APPROVAL_S, _on_review, kernel, item)
        kernel.schedule(item.start_s, _on_start, kernel, item)
        kernel.schedule(item.end_s, _on_end, kernel, item)
        return 200, _operation(w, p["project"], item.zone, "insert", item)


def _require(w: World, p: dict[str, str]) -> FutureReservation:
    check_project(w.scenario, p["project"])
    item = reservation_book(w.kernel).items.get((p["zone"], p["name"]))
    if item is None:
        raise ComputeApiError(
            404,
            f"The resource 'projects/{p['project']}/zones/{p['zone']}/futureReservations/{p['name']}' was not found",
            reason="notFound",
        )
    return item


def _get(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    with w.kernel.transaction():
        return 200, _render(p["project"], _require(w, p))


def _delete(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    kernel = w.kernel
    with kernel.transaction():
        item = _require(w, p)
        _release(kernel, item)
        del reservation_book(kernel).items[(item.zone, item.name)]
        kernel.log("future_reservation", item.zone, item.name, "deleted")
        return 200, _operation(w, p["project"], item.zone, "delete", item)


def _list(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    with w.kernel.transaction():
        check_project(w.scenario, p["project"])
        zone_spec(w.scenario, p["zone"], permission="compute.futureReservations.list")
        book = reservation_book(w.kernel)
        items = [_render(p["project"], item) for (zone, _), item in sorted(book.items.items()) if zone == p["zone"]]
    start = int(q["pageToken"]) if q.get("pageToken", "").isdigit() else 0
    size = int(q["maxResults"]) if q.get("maxResults", "").isdigit() and int(q["maxResults"]) > 0 else len(items)
    body: dict[str, Any] = {"kind": "compute#futureReservationsListResponse", "items": items[start : start + size]}
    if start + size < len(items):
        body["nextPageToken"] = str(start + size)
    return 200, body


_FR = _ZONE + r"/futureReservations"
ADVICE_TABLE: list[tuple[str, str, str, Handler]] = [
    ("POST", _REGION + r"/advice/capacity$", "compute.advice.capacity", _advise(capacity_advice)),
    ("POST", _REGION + r"/advice/capacityHistory$", "compute.advice.capacityHistory", _advise(capacity_history)),
    ("POST", _REGION + r"/advice/calendarMode$", "compute.advice.calendarMode", _advise(calendar_advice)),
    ("POST", _FR + r"$", "compute.futureReservations.insert", _insert),
    ("GET", _FR + r"$", "compute.futureReservations.list", _list),
    ("GET", _FR + r"/(?P<name>[^/]+)$", "compute.futureReservations.get", _get),
    ("DELETE", _FR + r"/(?P<name>[^/]+)$", "compute.futureReservations.delete", _delete),
]

"""``CalendarReservations`` on Compute Engine: ``advice.calendarMode`` and calendar-mode future reservations
(google-cloud-compute ``AdviceClient`` and ``FutureReservationsClient``, REST; docs/reference/capacity-advice.md A3).

Why this shape: the earliest window is asked once per region (the advice ranks the zones of one region and
answers with its best one; a zone outside the caller's list is denied and the question asked again), and the
booking is the body gcloud assembles (A3.2): the future reservation and its auto-created reservation share one
name, so a crashed controller finds its booking again by name, and a retried insert that meets its own earlier
insert (409) is success when the window is the one asked for. Unlike advice, nothing here fails soft: every
error is a classified ``CloudError`` (``shared.adapters.compute_engine_tpu.compute_error_from_exception``).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import google.api_core.exceptions as gexc
import google.auth.exceptions
import requests
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials, Credentials
from google.cloud import compute_v1

from shared.adapters.compute_engine_tpu import translated_errors as _translated
from shared.domain.calendar_mode import MAX_LEAD
from shared.domain.errors import CloudError, ErrorClass
from shared.domain.models import CalendarWindow, region_of
from shared.domain.quota import slice_chips
from shared.domain.zone_catalog import offering_zones

__all__ = ["VM_FAMILIES", "ComputeCalendarReservations", "vm_family_of"]

VM_FAMILIES = {
    "v6e": "VM_FAMILY_CLOUD_TPU_LITE_POD_SLICE_CT6E",
    "v5litepod": "VM_FAMILY_CLOUD_TPU_LITE_POD_SLICE_CT5LP",
}
_SPEC_KEY = "spec"  # futureResourcesSpecs is a map with one entry; gcloud's key
_MAX_ASKS_PER_REGION = 8  # each further ask denies one more zone the caller did not list
_VENDOR_ERRORS = (gexc.GoogleAPIError, requests.exceptions.RequestException, google.auth.exceptions.GoogleAuthError)


def vm_family_of(accelerator: str) -> str | None:
    """``v6e-4`` -> ``VM_FAMILY_CLOUD_TPU_LITE_POD_SLICE_CT6E``; None: no calendar mode for the family."""
    return VM_FAMILIES.get(accelerator.rpartition("-")[0])


def _rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _whole(moment: datetime) -> datetime:
    """To the second, as the wire carries it."""
    return moment.astimezone(UTC).replace(microsecond=0)


def _parse_time(value: str) -> datetime:
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _chips(accelerator: str) -> int:
    try:
        return slice_chips(accelerator)
    except ValueError as error:
        raise CloudError(ErrorClass.INVALID, f"calendar: {error}") from error


def _request_uuid(request_id: str) -> str:
    """Compute Engine's ``requestId`` must be a UUID: one as given, else a UUID5 derived from it (stable)."""
    try:
        return str(uuid.UUID(request_id))
    except ValueError:
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"tpuctl-calendar/{request_id}"))


class ComputeCalendarReservations:
    """Calendar-mode future reservations of one project (or the local simulator's, with ``endpoint``).

    With an endpoint and no ``credentials`` the calls are anonymous; otherwise Application Default
    Credentials are used. Clients are built on first use. Inserts and deletes wait for their operation (at most
    ``operation_timeout_s``); each call waits at most ``timeout_s``.
    """

    def __init__(
        self,
        project: str,
        *,
        endpoint: str | None = None,
        credentials: Credentials | None = None,
        timeout_s: float = 10.0,
        operation_timeout_s: float = 120.0,
    ) -> None:
        self.project = project
        self._endpoint = endpoint
        self._credentials = credentials if credentials is not None or endpoint is None else AnonymousCredentials()
        self._timeout_s = timeout_s
        self._operation_timeout_s = operation_timeout_s
        self._advice: compute_v1.AdviceClient | None = None
        self._reservations: compute_v1.FutureReservationsClient | None = None

    # ------------------------------------------------------------------------------------------ the window

    def earliest_window(
        self, accelerator: str, zones: Sequence[str], *, days: int, not_before: datetime
    ) -> CalendarWindow | None:
        family = vm_family_of(accelerator)
        if family is None or not zones:
            return None
        chips = _chips(accelerator)
        found: list[CalendarWindow] = []
        known = offering_zones(accelerator.rpartition("-")[0])  # the catalog's zones: denied up front when not ours
        for region in sorted({region_of(zone) for zone in zones}):
            in_region = sorted(zone for zone in zones if region_of(zone) == region)
            others = {zone for zone in known if region_of(zone) == region and zone not in in_region}
            window = self._region_window(region, in_region, others, family, chips, days, not_before)
            if window is not None:
                found.append(window)
        return min(found, key=lambda window: (window.start, window.zone), default=None)

    def _region_window(
        self, region: str, zones: list[str], denied: set[str], family: str, chips: int, days: int, not_before: datetime
    ) -> CalendarWindow | None:
        """The earliest window among ``zones``: a zone the answer names that is not ours (one the catalog does not
        list) is denied and the region asked again."""
        for _ in range(_MAX_ASKS_PER_REGION):
            request = _advice_request(zones, denied, family, chips, days, not_before)
            with _translated():
                answer = self._advice_client().calendar_mode(
                    project=self.project,
                    region=region,
                    calendar_mode_advice_request_resource=request,
                    timeout=self._timeout_s,
                )
            advised = [
                recommendation.recommendations_per_spec[key]
                for recommendation in answer.recommendations
                for key in recommendation.recommendations_per_spec
            ]
            if not advised:
                return None
            ours = [item for item in advised if item.location.rsplit("/", 1)[-1] in zones]
            if ours:
                best = min(ours, key=lambda item: _parse_time(item.start_time))
                zone = best.location.rsplit("/", 1)[-1]
                return CalendarWindow(zone=zone, start=_parse_time(best.start_time), end=_parse_time(best.end_time))
            denied.update(item.location.rsplit("/", 1)[-1] for item in advised)
        return None

    # ---------------------------------------------------------------------------------------- the booking

    def book(self, name: str, accelerator: str, window: CalendarWindow, *, request_id: str) -> None:
        family = vm_family_of(accelerator)
        if family is None:
            raise CloudError(
                ErrorClass.INVALID,
                f"calendar: {accelerator} has no calendar-mode reservations (only {', '.join(VM_FAMILIES)} slices); "
                "remove the calendar window from the spec",
            )
        body = _future_reservation(name, family, _chips(accelerator), window)
        try:
            with _translated():
                request = compute_v1.InsertFutureReservationRequest(
                    project=self.project,
                    zone=window.zone,
                    future_reservation_resource=body,
                    request_id=_request_uuid(request_id),
                )
                operation = self._reservations_client().insert(request=request, timeout=self._timeout_s)
                operation.result(timeout=self._operation_timeout_s)
        except CloudError as error:
            if error.error_class is not ErrorClass.ALREADY_EXISTS:
                raise
            self._check_existing(name, window)

    def _check_existing(self, name: str, window: CalendarWindow) -> None:
        """A 409 on our insert: the same booking retried is success; another window under the name is refused."""
        with _translated():
            existing = self._reservations_client().get(
                project=self.project, zone=window.zone, future_reservation=name, timeout=self._timeout_s
            )
        start, end = _parse_time(existing.time_window.start_time), _parse_time(existing.time_window.end_time)
        if (start, end) != (_whole(window.start), _whole(window.end)):
            raise CloudError(
                ErrorClass.INVALID,
                f"calendar: future reservation {name} in {window.zone} already exists for {_rfc3339(start)} to "
                f"{_rfc3339(end)}, not the asked {_rfc3339(window.start)} to {_rfc3339(window.end)}; release it "
                "(or ask for the window it has) and book again",
                code=409,
                location=window.zone,
                surfaced="sync",
            )

    def procurement(self, zone: str, name: str) -> str | None:
        try:
            with _translated():
                existing = self._reservations_client().get(
                    project=self.project, zone=zone, future_reservation=name, timeout=self._timeout_s
                )
        except CloudError as error:
            if error.error_class is ErrorClass.NOT_FOUND:
                return None
            raise
        return str(existing.status.procurement_status)

    def release(self, zone: str, name: str) -> None:
        try:
            with _translated():
                operation = self._reservations_client().delete(
                    project=self.project, zone=zone, future_reservation=name, timeout=self._timeout_s
                )
                operation.result(timeout=self._operation_timeout_s)
        except CloudError as error:
            if error.error_class is not ErrorClass.NOT_FOUND:
                raise

    def list_names(self, zones: Sequence[str]) -> list[tuple[str, str]]:
        names: list[tuple[str, str]] = []
        for zone in zones:
            with _translated():
                pager = self._reservations_client().list(project=self.project, zone=zone, timeout=self._timeout_s)
                names.extend((zone, item.name) for item in pager)
        return names

    # ------------------------------------------------------------------------------------------- clients

    def _options(self) -> ClientOptions | None:
        return ClientOptions(api_endpoint=self._endpoint) if self._endpoint else None

    def _advice_client(self) -> compute_v1.AdviceClient:
        if self._advice is None:
            with _translated():
                self._advice = compute_v1.AdviceClient(credentials=self._credentials, client_options=self._options())
        return self._advice

    def _reservations_client(self) -> compute_v1.FutureReservationsClient:
        if self._reservations is None:
            with _translated():
                self._reservations = compute_v1.FutureReservationsClient(
                    credentials=self._credentials, client_options=self._options()
                )
        return self._reservations


def _advice_request(
    zones: list[str], denied: set[str], family: str, chips: int, days: int, not_before: datetime
) -> compute_v1.CalendarModeAdviceRequest:
    """A3.1: the zones allowed (and those seen in earlier answers denied), starts from ``not_before`` to 120
    days after it, exactly ``days`` long, one slice of the family's chips, serving, dense."""
    locations = {f"zones/{zone}": {"preference": "ALLOW"} for zone in zones}
    locations.update({f"zones/{zone}": {"preference": "DENY"} for zone in sorted(denied)})
    period = f"{days * 86400}s"
    spec: dict[str, Any] = {
        "deployment_type": "DENSE",
        "location_policy": {"locations": locations},
        "time_range_spec": {
            "start_time_not_earlier_than": _rfc3339(not_before),
            "start_time_not_later_than": _rfc3339(not_before + MAX_LEAD),
            "min_duration": period,
            "max_duration": period,
        },
        "target_resources": {
            "aggregate_resources": {"vm_family": family, "accelerator_count": chips, "workload_type": "SERVING"}
        },
    }
    return compute_v1.CalendarModeAdviceRequest(future_resources_specs={_SPEC_KEY: spec})


def _future_reservation(name: str, family: str, chips: int, window: CalendarWindow) -> compute_v1.FutureReservation:
    """A3.2: the body gcloud assembles for a submitted TPU calendar-mode request."""
    body: dict[str, Any] = {
        "name": name,
        "description": "tpuctl calendar-mode booking",
        "reservation_name": name,
        "aggregate_reservation": {
            "vm_family": family,
            "workload_type": "SERVING",
            "reserved_resources": [{"accelerator": {"accelerator_count": chips}}],
        },
        "time_window": {"start_time": _rfc3339(window.start), "end_time": _rfc3339(window.end)},
        "planning_status": "SUBMITTED",
        "reservation_mode": "CALENDAR",
        "specific_reservation_required": True,
        "auto_delete_auto_created_reservations": True,
        "deployment_type": "DENSE",
        "share_settings": {"share_type": "LOCAL"},
    }
    return compute_v1.FutureReservation(body)

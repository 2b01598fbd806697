"""Every Cloud TPU API error, synchronous or a long-running operation's, into the one ``CloudError`` it means.

Split from ``gcp_tpu.py`` (the adapter) so the mapping can be read and tested on its own; the Compute Engine,
Billing and Cloud Quotas adapters reuse :func:`cloud_error_from_exception`. The signals per error class are
listed in ``gcp_tpu``'s module docstring; scope and location rules are in :mod:`shared.adapters.tpu_errors`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import google.api_core.exceptions as gexc
import google.auth.exceptions
import httpx
import requests
from google.cloud import tpu_v2
from google.longrunning import operations_pb2
from google.protobuf import json_format

from shared.adapters.tpu_errors import error_scope, quota_message_location, zone_of_operation
from shared.domain.errors import RPC_CODE_NAMES, CloudError, ErrorClass

__all__ = [
    "classify_tpu_error",
    "cloud_error_from_exception",
    "cloud_error_from_status",
    "op_verb",
    "translated",
]

_HTTP_TO_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ALREADY_EXISTS",
    412: "FAILED_PRECONDITION",
    416: "OUT_OF_RANGE",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}

_STATUS_CLASS = {
    "CANCELLED": ErrorClass.TRANSIENT,
    "UNKNOWN": ErrorClass.UNKNOWN,
    "INVALID_ARGUMENT": ErrorClass.INVALID,
    "DEADLINE_EXCEEDED": ErrorClass.TRANSIENT,
    "NOT_FOUND": ErrorClass.NOT_FOUND,
    "ALREADY_EXISTS": ErrorClass.ALREADY_EXISTS,
    "PERMISSION_DENIED": ErrorClass.PERMISSION,
    "UNAUTHENTICATED": ErrorClass.PERMISSION,
    "FAILED_PRECONDITION": ErrorClass.FAILED_PRECONDITION,
    "ABORTED": ErrorClass.TRANSIENT,
    "OUT_OF_RANGE": ErrorClass.INVALID,
    "UNIMPLEMENTED": ErrorClass.INVALID,
    "INTERNAL": ErrorClass.TRANSIENT,
    "UNAVAILABLE": ErrorClass.TRANSIENT,
    "DATA_LOSS": ErrorClass.UNKNOWN,
}

_UNSUPPORTED = re.compile(
    r"could not be found in the zonal accelerator configurations|the accelerator \S+ was not found in zone"
    r"|The requested zone \"[^\"]+\" is not supported|provisioning model is not supported for accelerator type",
    re.IGNORECASE,
)
_PERMISSION = re.compile(
    r"Permission denied on|not found or access is unauthorized|Permission '[^']+' denied|LOCATION_POLICY_VIOLATED",
    re.IGNORECASE,
)
_RATE = re.compile(r"requests per minute|RATE_LIMIT_EXCEEDED|qps/create", re.IGNORECASE)
_QUOTA_LIMIT = re.compile(r"Quota limit '([^']+)' has been exceeded\.\s*Limit:\s*([^ ]+) in (.+?)\.?\s*$", re.DOTALL)
_QUOTA_FAILURE = re.compile(r"Quota '([^']+)' exhausted\.\s*Limit\s+(\S+)\s+in\s+(region|zone)\s+([a-z0-9-]+)")
_STOCKOUT = re.compile(
    r"no more capacity|Insufficient reserved capacity|not supported while in state PREEMPTED|an internal error",
    re.IGNORECASE,
)
_LOCATION = re.compile(
    r"(?:locations/|zone \"|zone |location \"|Location |region \"|region )([a-z]+-[a-z]+[0-9]+(?:-[a-z0-9]+)?)"
)


def _quota_scope(message: str, details: Sequence[Mapping[str, Any]]) -> tuple[ErrorClass, str | None, str | None]:
    """(QUOTA_ZONE or QUOTA_REGION, quota id, location) from a quota message or its QuotaFailure details.

    A joined message (``'A,B' … in region R,zone Z``) names both; the region scope wins because
    blocking the region also covers the zone.
    """
    found: list[tuple[str, str, str]] = []  # (quota id, scope, location)
    match = _QUOTA_LIMIT.search(message)
    if match:
        ids = [item.strip() for item in match.group(1).split(",")]
        places = [item.strip() for item in match.group(3).split(",")]
        parsed = [(scope.lower(), location.strip()) for scope, _, location in (p.partition(" ") for p in places)]
        for index, qid in enumerate(ids):
            # gcloud joins ids and places in no promised order: pair by the scope the id names, else by position.
            named = "region" if "PerRegion" in qid else "zone" if "PerZone" in qid else None
            match_place = next((place for place in parsed if place[0] == named), None)
            if match_place is None:
                match_place = parsed[index] if index < len(parsed) else parsed[-1]
            found.append((qid, match_place[0], match_place[1]))
    for detail in details:
        if str(detail.get("@type", "")).endswith("google.rpc.QuotaFailure"):
            for violation in detail.get("violations", ()):
                text = f"{violation.get('description', '')} {violation.get('subject', '')}"
                for item in _QUOTA_FAILURE.finditer(text):
                    found.append((item.group(1), item.group(3).lower(), item.group(4)))
    for item in _QUOTA_FAILURE.finditer(message):
        found.append((item.group(1), item.group(3).lower(), item.group(4)))
    if not found:
        for qid in re.findall(r"\b(TPU\w+Per(?:Zone|Region)\w*)", message):
            found.append((qid, "region" if "PerRegion" in qid else "zone", ""))
    region = next((item for item in found if item[1] == "region" or "PerRegion" in item[0]), None)
    if region is not None:
        return ErrorClass.QUOTA_REGION, region[0], region[2] or None
    if found:
        return ErrorClass.QUOTA_ZONE, found[0][0], found[0][2] or None
    if re.search(r"\bin region\b", message):
        return ErrorClass.QUOTA_REGION, None, None
    return ErrorClass.QUOTA_ZONE, None, None


def _error_info(details: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    for detail in details:
        if str(detail.get("@type", "")).endswith("google.rpc.ErrorInfo"):
            return detail
    return {}


def _is_capacity_loss(status: str, message: str, verb: str | None) -> bool:
    """Operation errors that mean "no chips for you here": opaque INTERNAL on a create, reserved-capacity
    shortfall (9), and a preemption that killed a pending operation (3)."""
    if status == "INTERNAL":
        return verb in (None, "create")
    return status in ("FAILED_PRECONDITION", "INVALID_ARGUMENT") and bool(_STOCKOUT.search(message))


def classify_tpu_error(
    status: str,
    message: str,
    details: Sequence[Mapping[str, Any]] = (),
    *,
    surfaced: str,
    code: int | None = None,
    verb: str | None = None,
    zone: str | None = None,
) -> CloudError:
    """THE mapping from a provider error to a :class:`CloudError` (sync answers and operation errors alike).

    ``status`` is the canonical name (``RESOURCE_EXHAUSTED``…); ``surfaced`` is ``sync`` or ``operation``
    (quota arrives synchronously, capacity on the operation, so the same status means different things);
    ``verb`` is the operation's verb when known (an INTERNAL error on a create is an opaque stockout);
    ``zone`` the zone of the request when known (a permission error naming it is about that zone). The
    error's ``scope`` and quota ``location`` are read here (:mod:`shared.adapters.tpu_errors`), once.
    """
    info = _error_info(details)
    reason = str(info.get("reason", ""))
    metadata = info.get("metadata") or {}
    text = f"{message} {reason}"
    quota_id: str | None = None
    location = metadata.get("location") if isinstance(metadata, Mapping) else None
    error_class: ErrorClass
    if status in ("PERMISSION_DENIED", "UNAUTHENTICATED") or reason == "LOCATION_POLICY_VIOLATED":
        error_class = ErrorClass.PERMISSION
    elif status == "RESOURCE_EXHAUSTED":
        if _RATE.search(text):
            error_class = ErrorClass.RATE_LIMIT
        elif "quota" in text.lower() or reason == "QUOTA_EXCEEDED":
            error_class, quota_id, quota_location = _quota_scope(message, details)
            location = quota_location or location
        elif surfaced == "operation":
            error_class = ErrorClass.STOCKOUT
        else:
            error_class = ErrorClass.RATE_LIMIT
    elif _UNSUPPORTED.search(message):
        error_class = ErrorClass.UNSUPPORTED
    elif surfaced == "operation" and _is_capacity_loss(status, message, verb):
        error_class = ErrorClass.STOCKOUT
    elif _PERMISSION.search(text) and status in ("NOT_FOUND", "INVALID_ARGUMENT", "FAILED_PRECONDITION"):
        error_class = ErrorClass.PERMISSION
    else:
        error_class = _STATUS_CLASS.get(status, ErrorClass.UNKNOWN)
    if location is None:
        match = _LOCATION.search(message)
        location = match.group(1) if match else None
    scope = error_scope(error_class, message, zone=zone)
    location = location or quota_message_location(scope, message)
    return CloudError(
        error_class, message, code=code, quota_id=quota_id, location=location, surfaced=surfaced, scope=scope
    )


def cloud_error_from_status(
    status: Mapping[str, Any], *, verb: str | None = None, zone: str | None = None
) -> CloudError:
    """A ``google.rpc.Status`` (an operation's ``error`` or a queued resource's ``failedData.error``)."""
    code = int(status.get("code", 2) or 2)
    details = [item for item in status.get("details", ()) if isinstance(item, Mapping)]
    return classify_tpu_error(
        RPC_CODE_NAMES.get(code, "UNKNOWN"),
        str(status.get("message", "")),
        details,
        surfaced="operation",
        code=code,
        verb=verb,
        zone=zone,
    )


def _status_of_http_class(http_code: int) -> str:
    """Statuses without a canonical name: 5xx may pass, other 4xx are the request's fault, 3xx are unexpected."""
    if http_code >= 500:
        return "UNAVAILABLE"
    if http_code >= 400:
        return "INVALID_ARGUMENT"
    return "UNKNOWN"


def _envelope_of(response: Any) -> Mapping[str, Any]:
    try:
        payload = response.json()
    except (ValueError, AttributeError, TypeError):
        return {}
    if isinstance(payload, list):
        payload = next((item for item in payload if isinstance(item, dict)), {})
    error = payload.get("error") if isinstance(payload, dict) else None
    return error if isinstance(error, dict) else {}


def cloud_error_from_exception(exc: BaseException) -> CloudError:
    """Any exception the REST, operation or transport paths raise -> a classified CloudError."""
    if isinstance(exc, CloudError):
        return exc
    if isinstance(exc, gexc.RetryError):
        return CloudError(ErrorClass.TRANSIENT, f"retries exhausted: {exc}", surfaced="sync")
    if isinstance(exc, gexc.GoogleAPICallError):
        if isinstance(exc.response, operations_pb2.Operation):  # raised by operation.result(): an LRO error
            operation = exc.response
            return cloud_error_from_status(
                json_format.MessageToDict(operation.error),
                verb=op_verb(operation),
                zone=zone_of_operation(operation.name),
            )
        envelope = _envelope_of(exc.response) if exc.response is not None else {}
        http_code = exc.code if isinstance(exc.code, int) else None
        grpc_code = getattr(exc, "grpc_status_code", None)
        status = str(envelope.get("status") or "")
        if not status and grpc_code is not None:
            status = str(getattr(grpc_code, "name", grpc_code))
        if not status and http_code is not None:
            status = _HTTP_TO_STATUS.get(http_code) or _status_of_http_class(http_code)
        if not status and isinstance(exc, gexc.ServerError):
            status = "UNAVAILABLE"
        details = [item for item in (envelope.get("details") or exc.details or ()) if isinstance(item, Mapping)]
        message = str(envelope.get("message") or exc.message)
        return classify_tpu_error(status or "UNKNOWN", message, details, surfaced="sync", code=http_code)
    if isinstance(exc, httpx.HTTPStatusError):
        envelope = _envelope_of(exc.response)
        http_code = exc.response.status_code
        status = str(envelope.get("status") or _HTTP_TO_STATUS.get(http_code) or _status_of_http_class(http_code))
        details = [item for item in envelope.get("details", ()) if isinstance(item, Mapping)]
        message = str(envelope.get("message") or exc.response.text[:500])
        return classify_tpu_error(status, message, details, surfaced="sync", code=http_code)
    if isinstance(exc, httpx.TransportError | requests.exceptions.ConnectionError | requests.exceptions.Timeout):
        return CloudError(ErrorClass.TRANSIENT, f"{type(exc).__name__}: {exc}", surfaced="sync")
    if isinstance(exc, google.auth.exceptions.DefaultCredentialsError):
        return CloudError(
            ErrorClass.PERMISSION,
            f"no Google credentials: {exc} (run `gcloud auth application-default login`, or set an endpoint "
            "for the local simulator)",
            surfaced="sync",
        )
    if isinstance(exc, google.auth.exceptions.RefreshError):
        return CloudError(ErrorClass.PERMISSION, f"credentials refresh failed: {exc}", surfaced="sync")
    if isinstance(exc, google.auth.exceptions.TransportError | requests.exceptions.RequestException):
        return CloudError(ErrorClass.TRANSIENT, f"{type(exc).__name__}: {exc}", surfaced="sync")
    if isinstance(exc, json_format.ParseError):
        return CloudError(ErrorClass.UNKNOWN, f"unparseable TPU API answer: {exc}", surfaced="sync")
    return CloudError(ErrorClass.UNKNOWN, f"{type(exc).__name__}: {exc}", surfaced="sync")


_TRANSLATED = (
    gexc.GoogleAPIError,
    httpx.HTTPError,
    requests.exceptions.RequestException,
    google.auth.exceptions.GoogleAuthError,
    json_format.ParseError,
)


@contextmanager
def translated() -> Iterator[None]:
    """Re-raise every vendor exception as the CloudError it means (``from`` the original)."""
    try:
        yield
    except CloudError:
        raise
    except _TRANSLATED as exc:
        raise cloud_error_from_exception(exc) from exc


def op_verb(op: operations_pb2.Operation) -> str | None:
    """The verb (create, delete, ...) a TPU operation's metadata names, or None."""
    if not op.metadata.type_url.endswith("OperationMetadata"):
        return None
    try:
        return str(tpu_v2.OperationMetadata.deserialize(op.metadata.value).verb) or None
    except Exception:
        return None

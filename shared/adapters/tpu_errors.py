"""What a TPU capacity error is about, read from the provider's message once, here in the adapters.

Both back ends (:mod:`shared.adapters.gcp_tpu`, :mod:`shared.adapters.compute_engine_tpu`) classify an error
into an :class:`ErrorClass`; these helpers add the :class:`ErrorScope` and the quota location the planner
needs (docs/reference/tpu-api.md §5.4), so the domain reads fields and never message text:

=================  ===========================================================  ====================
class              message says                                                 scope
=================  ===========================================================  ====================
unsupported        "provisioning model" / "FLEX_START"                          tier
unsupported        "zone" … "not supported" (Compute Engine: "Unknown zone")    zone
unsupported        anything else ("accelerator … not found in zone")            accelerator
permission         "Permission 'x.y' denied" (a missing IAM permission)         project
permission         LOCATION_POLICY_VIOLATED, "locations/…", "location …", the   zone
                   zone of the request
permission         anything else                                                project
quota (zone)       -                                                            zone
quota (region)     -                                                            region
=================  ===========================================================  ====================
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from shared.domain.cloud import OperationStatus
from shared.domain.errors import CloudError, ErrorClass, ErrorScope

__all__ = ["error_scope", "failed_operation", "in_request_zone", "quota_message_location", "zone_of_operation"]

_IAM_PERMISSION = re.compile(r"permission '[a-z0-9_.]+' denied", re.IGNORECASE)
_ANY_ZONE = re.compile(r"[a-z]+-[a-z]+[0-9]+-[a-z0-9]+")
_IN_REGION = re.compile(r"in region ([a-z]+-[a-z]+[0-9]+)\b")
_IN_ZONE = re.compile(r"in zone ([a-z]+-[a-z]+[0-9]+-[a-z0-9]+)\b")
_OPERATION_ZONE = re.compile(r"^projects/[^/]+/(?:locations|zones)/([^/]+)/operations/")


def _unsupported_scope(message: str, zone: str | None) -> ErrorScope:
    lowered = message.lower()
    if "provisioning model" in lowered or "flex_start" in lowered:
        return ErrorScope.TIER
    if "zone" in lowered and "not supported" in lowered:
        return ErrorScope.ZONE
    return ErrorScope.ACCELERATOR


def _compute_unsupported_scope(message: str, zone: str | None) -> ErrorScope:
    """Compute Engine's "Unknown zone" refuses the zone whatever else the message says."""
    if "unknown zone" in message.lower():
        return ErrorScope.ZONE
    return _unsupported_scope(message, zone)


def _permission_scope(message: str, zone: str | None) -> ErrorScope:
    """A denied location blocks one zone; a missing IAM permission (``Permission 'x' denied``) the project."""
    if _IAM_PERMISSION.search(message):
        return ErrorScope.PROJECT
    lowered = message.lower()
    if "location_policy_violated" in lowered or "locations/" in lowered or "location " in lowered:
        return ErrorScope.ZONE
    names_zone = zone in lowered if zone else _ANY_ZONE.search(lowered) is not None
    return ErrorScope.ZONE if names_zone else ErrorScope.PROJECT


def _fixed(scope: ErrorScope) -> Callable[[str, str | None], ErrorScope]:
    return lambda message, zone: scope


_TPU_SCOPES: Mapping[ErrorClass, Callable[[str, str | None], ErrorScope]] = {
    ErrorClass.UNSUPPORTED: _unsupported_scope,
    ErrorClass.PERMISSION: _permission_scope,
    ErrorClass.QUOTA_ZONE: _fixed(ErrorScope.ZONE),
    ErrorClass.QUOTA_REGION: _fixed(ErrorScope.REGION),
}
_COMPUTE_SCOPES: Mapping[ErrorClass, Callable[[str, str | None], ErrorScope]] = {
    **_TPU_SCOPES,
    ErrorClass.UNSUPPORTED: _compute_unsupported_scope,
}


def error_scope(
    error_class: ErrorClass, message: str, *, zone: str | None = None, compute_engine: bool = False
) -> ErrorScope | None:
    """What an error of ``error_class`` with this ``message`` is about; None for classes without a scope.

    ``zone`` is the zone of the request that failed, when the caller knows it: a permission error that
    names it is about that zone. ``compute_engine`` selects Compute Engine's wording ("Unknown zone").
    """
    reader = (_COMPUTE_SCOPES if compute_engine else _TPU_SCOPES).get(error_class)
    return reader(message, zone) if reader is not None else None


def quota_message_location(scope: ErrorScope | None, message: str) -> str | None:
    """The zone (``in zone Z``) or region (``in region R``) a quota message names, for the quota's scope."""
    if scope not in (ErrorScope.ZONE, ErrorScope.REGION):
        return None
    match = (_IN_ZONE if scope is ErrorScope.ZONE else _IN_REGION).search(message)
    return match.group(1) if match else None


def zone_of_operation(name: str) -> str | None:
    """``projects/P/locations/Z/operations/OP`` (TPU API) or ``projects/P/zones/Z/operations/OP`` -> ``Z``."""
    match = _OPERATION_ZONE.match(name)
    return match.group(1) if match else None


@contextmanager
def in_request_zone(zone: str, *, compute_engine: bool = False) -> Iterator[None]:
    """Around a create in ``zone``: a permission error raised inside is re-read knowing the request's zone
    (one that names it is about that zone), then re-raised as it was."""
    try:
        yield
    except CloudError as exc:
        if exc.error_class is ErrorClass.PERMISSION:
            exc.scope = error_scope(exc.error_class, exc.message, zone=zone, compute_engine=compute_engine)
        raise


def failed_operation(name: str, error: CloudError) -> OperationStatus:
    """A finished operation that failed with ``error``, as both back ends report it (with what it is about)."""
    return OperationStatus(
        name=name,
        done=True,
        error_class=error.error_class,
        error_code=error.code,
        error_message=error.message,
        error_scope=error.scope,
        error_location=error.location,
    )

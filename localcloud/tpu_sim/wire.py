"""Wire-format helpers: Google's error envelope, enum, duration and timestamp parsing.

As docs/reference/tpu-api.md §5.1 and §6 describe them."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "ACCELERATOR_CONFIG_TYPES",
    "HTTP_STATUS_NAMES",
    "SimApiError",
    "family_of_quota",
    "format_duration",
    "format_time",
    "parse_duration",
    "parse_enum",
    "parse_time",
    "quota_id",
    "topology_of",
]


HTTP_STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ALREADY_EXISTS",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}

ACCELERATOR_CONFIG_TYPES = ("TYPE_UNSPECIFIED", "V2", "V3", "V4", "V5LITE_POD", "V5P", "V6E")

_FAMILY_CONFIG_TYPE = {"v2": "V2", "v3": "V3", "v4": "V4", "v5litepod": "V5LITE_POD", "v5p": "V5P", "v6e": "V6E"}
_FAMILY_QUOTA_PREFIX = {"v6e": "TPUV6E", "v5litepod": "TPUV5sLitepod", "v5p": "TPUV5P", "v4": "TPUV4"}
_TOPOLOGY = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}


class SimApiError(Exception):
    """An error answered synchronously in Google's envelope: ``{"error": {code, message, status, details}}``."""

    def __init__(self, http_status: int, message: str, *, status: str | None = None, details: list[Any] | None = None):
        super().__init__(message)
        self.http_status = http_status
        self.message = message
        self.status = status or HTTP_STATUS_NAMES.get(http_status, "UNKNOWN")
        self.details = details or []

    def envelope(self) -> dict[str, Any]:
        """The JSON body Google sends with this error."""
        body: dict[str, Any] = {"code": self.http_status, "message": self.message, "status": self.status}
        if self.details:
            body["details"] = self.details
        return {"error": body}


def config_type_of(family: str) -> str:
    """``v6e`` -> ``V6E`` (AcceleratorConfig.type)."""
    return _FAMILY_CONFIG_TYPE.get(family, family.upper())


def topology_of(chips: int) -> str:
    """A plausible 2-D topology for a slice of ``chips`` chips."""
    return _TOPOLOGY.get(chips, f"1x{chips}")


def quota_id(family: str, *, preemptible: bool, scope: str) -> str:
    """The TPU API quota id for chips of ``family`` (``scope`` = ``Zone`` or ``Region``)."""
    prefix = _FAMILY_QUOTA_PREFIX.get(family, f"TPU{family.upper()}")
    kind = "Preemptible" if preemptible else ""
    return f"{prefix}{kind}PerProjectPer{scope}ForTPUAPI"


def family_of_quota(qid: str) -> tuple[str, bool]:
    """``TPUV6EPreemptiblePerProjectPerZoneForTPUAPI`` -> (``v6e``, True)."""
    for family, prefix in sorted(_FAMILY_QUOTA_PREFIX.items(), key=lambda item: -len(item[1])):
        if qid.startswith(prefix):
            return family, qid[len(prefix) :].startswith("Preemptible")
    return qid, "Preemptible" in qid


def parse_enum(value: Any, names: tuple[str, ...], field: str) -> str:
    """Accept an enum as its name or its number (the REST client sends numbers)."""
    if isinstance(value, bool):
        raise SimApiError(400, f"Invalid value for {field}: {value!r}")
    if isinstance(value, int):
        if 0 <= value < len(names):
            return names[value]
        raise SimApiError(400, f"Invalid value at '{field}' ({value}): not a known enum number")
    if isinstance(value, str) and value in names:
        return value
    raise SimApiError(400, f"Invalid value at '{field}' ({value!r}): expected one of {', '.join(names)}")


_DURATION = re.compile(r"^(-?\d+(?:\.\d{1,9})?)s$")


def parse_duration(value: Any, field: str) -> float:
    """``"1800s"`` (JSON Duration) -> 1800.0; ``{"seconds": 1800}`` and plain numbers are accepted too."""
    if isinstance(value, dict):
        return float(value.get("seconds", 0)) + float(value.get("nanos", 0)) / 1e9
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        match = _DURATION.match(value.strip())
        if match:
            return float(match.group(1))
    raise SimApiError(400, f"Invalid value at '{field}' ({value!r}): expected a Duration such as \"1800s\"")


def parse_time(value: Any, field: str) -> float:
    """RFC 3339 timestamp -> epoch seconds."""
    if isinstance(value, str):
        text = value.strip().replace("Z", "+00:00")
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            parsed = None
        if parsed is not None and parsed.tzinfo is not None:
            return parsed.timestamp()
    raise SimApiError(
        400, f"Invalid value at '{field}' ({value!r}): expected an RFC 3339 time like 2026-12-02T12:00:00Z"
    )


def format_time(epoch: float) -> str:
    """Epoch seconds -> RFC 3339 with milliseconds and ``Z``."""
    stamp = datetime.fromtimestamp(epoch, UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z"


def format_duration(seconds: float) -> str:
    """Seconds -> JSON Duration string."""
    return f"{int(seconds)}s" if float(seconds).is_integer() else f"{seconds:.3f}s"

"""How both state-store adapters turn records into stored documents and back, so they store the same shape.

Writes: a pydantic dump with every datetime moved to UTC, enums as their plain values and tuples as lists, which
is what both Firestore maps and JSON hold. Reads: every datetime comes back as a plain UTC-aware ``datetime``
(Firestore hands out ``DatetimeWithNanoseconds``), then the model validates the document again.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any, Literal, TypeVar, cast

from pydantic import BaseModel

from shared.domain.errors import ConflictError
from shared.domain.models import DeploymentRecord

__all__ = [
    "COMMAND_STATUSES",
    "EPOCH",
    "MAX_LIMIT",
    "MAX_SAMPLES_PER_WRITE",
    "as_stored",
    "check_aware",
    "check_command_status",
    "check_limit",
    "check_samples",
    "from_document",
    "micros",
    "next_deployment_version",
    "to_document",
]

ModelT = TypeVar("ModelT", bound=BaseModel)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MAX_LIMIT = 10_000
# Firestore caps one batched write at 500 operations; both adapters keep the same limit so callers see one contract.
MAX_SAMPLES_PER_WRITE = 500


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return check_aware("datetime", value).astimezone(UTC)
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def _utc(value: Any) -> Any:
    if isinstance(value, datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        moved = aware.astimezone(UTC)
        return datetime(
            moved.year,
            moved.month,
            moved.day,
            moved.hour,
            moved.minute,
            moved.second,
            moved.microsecond,
            tzinfo=UTC,
        )
    if isinstance(value, Mapping):
        return {key: _utc(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_utc(item) for item in value]
    return value


def to_document(model: BaseModel) -> dict[str, Any]:
    """The record as a plain map: UTC datetimes, enum values, lists."""
    return {key: _plain(value) for key, value in model.model_dump(mode="python").items()}


def from_document(model_type: type[ModelT], document: Mapping[str, Any]) -> ModelT:
    """Validate a stored map back into ``model_type``, with every datetime a plain UTC ``datetime``."""
    return model_type.model_validate(_utc(dict(document)))


def as_stored(model: ModelT) -> ModelT:
    """The record exactly as a read will return it (datetimes in UTC), for answers given without a read."""
    return from_document(type(model), to_document(model))


def check_aware(name: str, value: datetime) -> datetime:
    """Refuse naive datetimes: the store compares instants, and a naive one has no instant."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name}: must be timezone-aware (UTC), e.g. datetime.now(UTC)")
    return value


COMMAND_STATUSES = ("accepted", "applied", "rejected", "failed")


def check_command_status(status: str) -> Literal["accepted", "applied", "rejected", "failed"]:
    """The ledger's status values (``CommandRecord.status``), checked before anything is written."""
    if status not in COMMAND_STATUSES:
        raise ValueError(f"status: must be one of {', '.join(COMMAND_STATUSES)} (got {status!r})")
    return cast(Literal["accepted", "applied", "rejected", "failed"], status)


def check_limit(limit: int) -> int:
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit: must be between 1 and {MAX_LIMIT} (got {limit})")
    return limit


def check_samples(count: int) -> None:
    if count > MAX_SAMPLES_PER_WRITE:
        raise ValueError(
            f"samples: at most {MAX_SAMPLES_PER_WRITE} per write (got {count}); split the tick into several writes"
        )


def micros(value: datetime) -> int:
    """Microseconds since the epoch: an exact, sortable integer for SQLite columns."""
    return (check_aware("datetime", value) - EPOCH) // timedelta(microseconds=1)


def next_deployment_version(
    record: DeploymentRecord, *, expected_version: int | None, current: int | None
) -> DeploymentRecord:
    """The compare-and-set rule of ``put_deployment``, checked against the stored ``current`` version.

    ``expected_version=None`` creates (the record must not exist); otherwise it must match ``current``. Returns the
    record as it will be stored, with the next version.
    """
    if expected_version is None and current is not None:
        raise ConflictError(
            f"deployment {record.deployment_id!r} already exists (version {current}); "
            "read it and update with expected_version"
        )
    if expected_version is not None and current != expected_version:
        found = "does not exist" if current is None else f"is at version {current}"
        raise ConflictError(
            f"deployment {record.deployment_id!r} {found}, expected version {expected_version}; re-read and try again"
        )
    return as_stored(record.model_copy(update={"version": (current or 0) + 1}))

"""The controller's error tree, grouped by what the caller should do next.

    ControllerError
    ├── PermanentError          ack the message, record the failure, never retry
    │   ├── InvalidMessage      a command or event that fails validation (names the field and the fix)
    │   ├── StaleGeneration     a command whose expected generation is behind the stored one
    │   └── NotOwned            a resource that does not carry our labels: never touched
    ├── TransientError          raise, let Pub/Sub (or the local bus) redeliver with backoff
    │   ├── ConflictError       a compare-and-set lost a race; re-read and try again
    │   └── LeaseHeld           another reconciler holds the deployment's lease
    └── CloudError              a provider error, classified ONCE in the adapter (see ErrorClass)
        ├── PermanentCloudError   also a PermanentError: quota, stockout, permission, invalid, ...
        └── TransientCloudError   also a TransientError: rate limits, 5xx, unknown

Every error the controller raises on purpose is exactly one of permanent or transient: entry points
map the two families mechanically (``shared.entry``): permanent -> record, return (ack); transient
and anything unexpected -> raise (retry). ``CloudError(...)`` builds the subclass its ``ErrorClass``
calls for, so a PERMISSION_DENIED ends the command that met it instead of being redelivered until it
dead-letters; the planner still reads the class to steer the capacity search.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "RPC_CODE_NAMES",
    "CloudError",
    "ConflictError",
    "ControllerError",
    "ErrorClass",
    "ErrorScope",
    "InvalidMessage",
    "LeaseHeld",
    "NotOwned",
    "PermanentCloudError",
    "PermanentError",
    "StaleGeneration",
    "TransientCloudError",
    "TransientError",
]


# google.rpc.Code: the numbers operations and error envelopes carry, and their names.
RPC_CODE_NAMES: dict[int, str] = {
    0: "OK",
    1: "CANCELLED",
    2: "UNKNOWN",
    3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND",
    6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED",
    8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION",
    10: "ABORTED",
    11: "OUT_OF_RANGE",
    12: "UNIMPLEMENTED",
    13: "INTERNAL",
    14: "UNAVAILABLE",
    15: "DATA_LOSS",
    16: "UNAUTHENTICATED",
}


class ControllerError(Exception):
    """Root of every error the controller raises on purpose."""


class PermanentError(ControllerError):
    """Retrying will not help: record it and acknowledge the message."""


class TransientError(ControllerError):
    """Retrying later may help; ``retry_after_s`` is a hint, not a promise."""

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class InvalidMessage(PermanentError):
    """A message that fails validation. ``field`` is a dotted path; ``fix`` says what would pass."""

    def __init__(self, field: str, problem: str, fix: str = "") -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        text = f"{field}: {problem}"
        if fix:
            text += f" ({fix})"
        super().__init__(text)


class StaleGeneration(PermanentError):
    """The command was written against an older generation of the deployment."""


class NotOwned(PermanentError):
    """The resource does not carry our labels, so the controller must not touch it."""


class ConflictError(TransientError):
    """A compare-and-set write lost to a concurrent writer."""


class LeaseHeld(TransientError):
    """Another reconciler holds the lease; the next tick will pick the work up."""


class ErrorClass(StrEnum):
    """What a provider error means for the capacity search (docs/reference/tpu-api.md §5.4)."""

    STOCKOUT = "stockout"
    QUOTA_ZONE = "quota_zone"
    QUOTA_REGION = "quota_region"
    UNSUPPORTED = "unsupported"
    PERMISSION = "permission"
    RATE_LIMIT = "rate_limit"
    TRANSIENT = "transient"
    NOT_FOUND = "not_found"
    ALREADY_EXISTS = "already_exists"
    FAILED_PRECONDITION = "failed_precondition"
    INVALID = "invalid"
    UNKNOWN = "unknown"


class ErrorScope(StrEnum):
    """What a provider error is about, as the adapter read it (so the planner never reads message text).

    ``unsupported`` errors name a ``zone`` the API does not serve, an ``accelerator`` the zone lacks, or a
    ``tier`` (provisioning model, e.g. flex-start) not offered for the accelerator there; ``permission``
    errors name a denied ``zone`` (location policy) or the ``project`` (a missing IAM permission); quota
    errors name their ``zone`` or ``region``.
    """

    PROJECT = "project"
    REGION = "region"
    ZONE = "zone"
    ACCELERATOR = "accelerator"
    TIER = "tier"


_TRANSIENT_CLASSES = frozenset({ErrorClass.RATE_LIMIT, ErrorClass.TRANSIENT, ErrorClass.UNKNOWN})


class CloudError(ControllerError):
    """A provider error, classified once by the adapter that saw it.

    ``quota_id`` and ``scope`` (``zone`` or ``region``) are set for quota errors; ``location`` is the
    zone or region the error names; ``scope`` (an :class:`ErrorScope`) also says what an ``unsupported``
    or ``permission`` error is about (None: the adapter could not tell; the planner then reads an
    ``unsupported`` error as the accelerator's and a ``permission`` error as the project's). ``surfaced``
    says where it arrived: ``sync`` (the HTTP answer) or ``operation`` (the long-running operation's error).
    Constructing ``CloudError`` (or a subclass that is not yet in either family) yields an instance that is
    also exactly one of ``PermanentError`` and ``TransientError``, chosen by ``error_class``.
    """

    scope: ErrorScope | None = None  # class default: errors pickled before the field existed unpickle with None

    def __new__(cls, error_class: ErrorClass, *args: object, **kwargs: object) -> CloudError:
        if not issubclass(cls, (PermanentError, TransientError)):
            cls = _family_class(cls, ErrorClass(error_class) in _TRANSIENT_CLASSES)
        return super().__new__(cls)

    def __init__(
        self,
        error_class: ErrorClass,
        message: str,
        *,
        code: int | None = None,
        quota_id: str | None = None,
        location: str | None = None,
        surfaced: str = "sync",
        scope: ErrorScope | None = None,
    ) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.message = message
        self.code = code
        self.quota_id = quota_id
        self.location = location
        self.surfaced = surfaced
        self.scope = scope

    @property
    def transient(self) -> bool:
        """True when the same call may succeed if simply repeated later."""
        return self.error_class in _TRANSIENT_CLASSES

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_cloud_error, (_family_root(type(self)), self.error_class, self.message, self.__dict__))

    def __repr__(self) -> str:
        return f"CloudError({self.error_class.value!r}, {self.message!r})"


class PermanentCloudError(CloudError, PermanentError):
    """A provider error that the same call will meet again: record it, do not retry the message."""


class TransientCloudError(CloudError, TransientError):
    """A provider error that may pass if the same call is repeated later."""


_FAMILIES: dict[tuple[type, bool], type] = {
    (CloudError, True): TransientCloudError,
    (CloudError, False): PermanentCloudError,
}


def _family_class(cls: type, transient: bool) -> type:
    """The permanent or transient variant of a ``CloudError`` subclass (made once per subclass)."""
    key = (cls, transient)
    if key not in _FAMILIES:
        family = TransientError if transient else PermanentError
        _FAMILIES[key] = type(
            cls.__name__, (cls, family), {"__module__": cls.__module__, "__qualname__": cls.__qualname__}
        )
    return _FAMILIES[key]


def _family_root(cls: type[CloudError]) -> type[CloudError]:
    """The class a caller constructed (``CloudError`` or its subclass), before the family was chosen."""
    for base in cls.__mro__:
        if issubclass(base, CloudError) and not issubclass(base, (PermanentError, TransientError)):
            return base
    return CloudError


def _rebuild_cloud_error(
    root: type[CloudError], error_class: ErrorClass, message: str, state: dict[str, object]
) -> CloudError:
    """Unpickle (e.g. across a process pool) into the same family the original was built in."""
    error = CloudError.__new__(root, error_class)
    Exception.__init__(error, message)
    error.__dict__.update(state)
    return error

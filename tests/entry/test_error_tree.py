"""Every error class the controller raises on purpose is exactly one of permanent or transient, and the entry
acts on that: permanent errors end the command (recorded ``failed``, acked), transient ones are retried (raised,
the ledger left ``accepted`` for the redelivery). None maps to both or to neither."""

from __future__ import annotations

import enum
import importlib
import inspect
import json
import pkgutil
import typing
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import mcp_client_gateway
import shared
from shared.adapters.clock import ManualClock
from shared.adapters.sqlite_store import SqliteStateStore
from shared.domain.errors import CloudError, ControllerError, ErrorClass, PermanentError, TransientError
from shared.entry import Outcome, PubSubPayload, handle_payload
from tests.support.builders import ISSUED_AT, command_bytes

_SKIP_MODULES = ("tests.support.stub_server",)  # a test-only server with import-time side effects


def _all_modules() -> Iterator[str]:
    for package in (shared, mcp_client_gateway):
        for info in pkgutil.walk_packages(package.__path__, prefix=f"{package.__name__}."):
            if not info.name.startswith(_SKIP_MODULES):
                yield info.name


def _subclasses(root: type) -> set[type]:
    found: set[type] = set()
    stack = [root]
    while stack:
        for sub in stack.pop().__subclasses__():
            if sub not in found:
                found.add(sub)
                stack.append(sub)
    return found


def _error_classes() -> list[type]:
    for name in _all_modules():
        importlib.import_module(name)
    return sorted(_subclasses(ControllerError), key=lambda cls: f"{cls.__module__}.{cls.__qualname__}")


def _instances(cls: type) -> list[Exception]:
    """Instances of ``cls`` built from its signature: one per ErrorClass where it takes one."""
    params = [
        p
        for p in inspect.signature(cls.__init__).parameters.values()
        if p.name != "self" and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    hints = typing.get_type_hints(cls.__init__)
    classes = list(ErrorClass) if any(p.name == "error_class" for p in params) else [None]
    built = []
    for error_class in classes:
        args = [error_class if p.name == "error_class" else _sample(hints.get(p.name), p.name) for p in params]
        built.append(cls(*args))
    return built


def _sample(hint: Any, name: str) -> Any:
    """A plausible argument of type ``hint`` (the first member of an enum, else text)."""
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return next(iter(hint))
    if hint in (int, float):
        return hint(1)
    return f"{name} text"


ERROR_CLASSES = _error_classes()


def test_the_walk_finds_the_error_tree() -> None:
    names = {cls.__name__ for cls in ERROR_CLASSES}
    assert {"InvalidMessage", "ConflictError", "LeaseHeld", "PermanentCloudError", "EndpointAccessError"} <= names
    assert len(ERROR_CLASSES) >= 15


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__qualname__)
def test_every_error_is_exactly_one_of_permanent_or_transient(cls: type) -> None:
    for error in _instances(cls):
        families = [family.__name__ for family in (PermanentError, TransientError) if isinstance(error, family)]
        assert len(families) == 1, f"{cls.__qualname__}({getattr(error, 'error_class', '')}) is {families or 'neither'}"


def test_cloud_errors_take_their_family_from_their_class() -> None:
    assert isinstance(CloudError(ErrorClass.PERMISSION, "denied"), PermanentError)
    assert isinstance(CloudError(ErrorClass.STOCKOUT, "none left"), PermanentError)
    assert isinstance(CloudError(ErrorClass.RATE_LIMIT, "slow down"), TransientError)
    assert isinstance(CloudError(ErrorClass.TRANSIENT, "503"), TransientError)
    assert CloudError(ErrorClass.RATE_LIMIT, "x").transient and not CloudError(ErrorClass.QUOTA_ZONE, "x").transient


@pytest.fixture
def store(tmp_path: Path) -> SqliteStateStore:
    return SqliteStateStore(tmp_path / "state.sqlite")


def _raising(error: BaseException) -> Any:
    def handler(message: Any) -> str:
        raise error

    return handler


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__qualname__)
def test_the_entry_acks_and_records_permanent_errors_and_retries_transient_ones(
    cls: type, store: SqliteStateStore
) -> None:
    for index, error in enumerate(_instances(cls)):
        raw = command_bytes()
        payload = PubSubPayload(data=raw, message_id=f"m-{index}")
        clock = ManualClock(ISSUED_AT + timedelta(seconds=5))
        command_id = json.loads(raw)["command_id"]
        if isinstance(error, PermanentError):
            result = handle_payload(payload, _raising(error), store=store, clock=clock, max_age_s=3600)
            assert result.outcome is Outcome.FAILED
            stored = store.get_command(command_id)
            assert stored is not None and stored.status == "failed"
        else:
            with pytest.raises(type(error)):
                handle_payload(payload, _raising(error), store=store, clock=clock, max_age_s=3600)
            stored = store.get_command(command_id)
            assert stored is not None and stored.status == "accepted", "left for the redelivery to finish"


def test_an_unexpected_exception_is_retried_not_recorded_as_an_outcome(store: SqliteStateStore) -> None:
    raw = command_bytes()
    clock = ManualClock(ISSUED_AT + timedelta(seconds=5))
    with pytest.raises(ValueError):
        handle_payload(
            PubSubPayload(data=raw, message_id="m"),
            _raising(ValueError("bug")),
            store=store,
            clock=clock,
            max_age_s=3600,
        )
    stored = store.get_command(json.loads(raw)["command_id"])
    assert stored is not None and stored.status == "accepted"

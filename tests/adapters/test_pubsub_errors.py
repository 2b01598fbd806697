"""Every exception the Pub/Sub client can raise maps to one of our two error families, and the adapter says so."""

from __future__ import annotations

import inspect
import threading

import pytest
from google.api_core import exceptions as api_exceptions
from google.auth import exceptions as auth_exceptions
from google.cloud.pubsub_v1.publisher import exceptions as publisher_exceptions

from shared.adapters.pubsub_bus import PubSubBus, error_family
from shared.domain.errors import PermanentError, TransientError
from shared.ports import Delivery
from tests.support.emulators import free_loopback_port

API_CALL_ERRORS = [
    cls
    for _, cls in inspect.getmembers(api_exceptions, inspect.isclass)
    if issubclass(cls, api_exceptions.GoogleAPIError)
]


@pytest.mark.parametrize("vendor_class", API_CALL_ERRORS, ids=lambda cls: cls.__name__)
def test_every_google_api_core_exception_has_a_family(vendor_class: type[Exception]) -> None:
    assert error_family(_instance(vendor_class)) in (PermanentError, TransientError)


@pytest.mark.parametrize(
    ("vendor_class", "family"),
    [
        (api_exceptions.NotFound, PermanentError),
        (api_exceptions.AlreadyExists, PermanentError),
        (api_exceptions.Conflict, PermanentError),
        (api_exceptions.InvalidArgument, PermanentError),
        (api_exceptions.BadRequest, PermanentError),
        (api_exceptions.FailedPrecondition, PermanentError),
        (api_exceptions.PermissionDenied, PermanentError),
        (api_exceptions.Forbidden, PermanentError),
        (api_exceptions.Unauthenticated, PermanentError),
        (api_exceptions.MethodNotImplemented, PermanentError),
        (auth_exceptions.DefaultCredentialsError, PermanentError),
        (api_exceptions.Aborted, TransientError),
        (api_exceptions.Cancelled, TransientError),
        (api_exceptions.ResourceExhausted, TransientError),
        (api_exceptions.TooManyRequests, TransientError),
        (api_exceptions.ServiceUnavailable, TransientError),
        (api_exceptions.DeadlineExceeded, TransientError),
        (api_exceptions.InternalServerError, TransientError),
        (api_exceptions.Unknown, TransientError),
        (api_exceptions.RetryError, TransientError),
        (publisher_exceptions.PublishError, TransientError),
        (publisher_exceptions.PublishToPausedOrderingKeyException, TransientError),
        (publisher_exceptions.FlowControlLimitError, TransientError),
        (TimeoutError, TransientError),
    ],
    ids=lambda value: getattr(value, "__name__", str(value)),
)
def test_the_families_follow_what_the_caller_should_do_next(
    vendor_class: type[Exception], family: type[Exception]
) -> None:
    assert error_family(_instance(vendor_class)) is family


def test_exceptions_that_are_not_the_clients_have_no_family() -> None:
    assert error_family(ValueError("bad input")) is None
    assert error_family(KeyError("x")) is None


def test_a_pull_from_an_unreachable_service_is_a_transient_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", f"127.0.0.1:{free_loopback_port()}")  # nothing listens there
    bus = PubSubBus("demo-tpuctl")
    handled: list[Delivery] = []
    try:
        with pytest.raises(TransientError, match=r"pubsub pull from subscription 'commands-sub': ServiceUnavailable"):
            bus.pull("commands-sub", handled.append, timeout_s=5.0)
    finally:
        bus.close()
    assert handled == []


def test_the_bus_needs_a_project_and_sane_settings() -> None:
    with pytest.raises(ValueError, match=r"^project: "):
        PubSubBus("")
    with pytest.raises(ValueError, match=r"^ack_deadline_s: "):
        PubSubBus("demo-tpuctl", ack_deadline_s=5)
    with pytest.raises(ValueError, match=r"^backoff_min_s/backoff_max_s: "):
        PubSubBus("demo-tpuctl", backoff_min_s=30.0, backoff_max_s=10.0)


def test_clients_are_created_once_even_when_threads_race(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", f"127.0.0.1:{free_loopback_port()}")
    bus = PubSubBus("demo-tpuctl")
    clients: list[object] = []
    threads = [threading.Thread(target=lambda: clients.append(bus._subscriber_client())) for _ in range(4)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
    finally:
        bus.close()
    assert len(clients) == 4
    assert len({id(client) for client in clients}) == 1


def _instance(vendor_class: type[Exception]) -> Exception:
    """An instance built the way the client library builds it."""
    if issubclass(vendor_class, api_exceptions.RetryError):
        return vendor_class("retries exhausted", cause=None)
    return vendor_class("simulated")

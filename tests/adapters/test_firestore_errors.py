"""Every google.api_core error the Firestore store can meet maps to one branch of our error tree (G4)."""

from __future__ import annotations

import pytest
from google.api_core import exceptions as gexc

from shared.adapters.firestore_store import FirestoreStateStore, _document_id, mapped_firestore_errors
from shared.domain.errors import ConflictError, ControllerError, TransientError


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (gexc.Aborted("Transaction lock timeout."), ConflictError),
        (gexc.AlreadyExists("Document already exists"), ConflictError),
        (gexc.ServiceUnavailable("unavailable"), TransientError),
        (gexc.DeadlineExceeded("deadline"), TransientError),
        (gexc.InternalServerError("internal"), TransientError),
        (gexc.ResourceExhausted("quota"), TransientError),
        (gexc.TooManyRequests("slow down"), TransientError),
        (gexc.GatewayTimeout("gateway"), TransientError),
        (gexc.RetryError("retries spent", cause=None), TransientError),
    ],
)
def test_vendor_errors_become_controller_errors(raised: Exception, expected: type[ControllerError]) -> None:
    with pytest.raises(expected, match="put_deployment") as caught, mapped_firestore_errors("put_deployment"):
        raise raised
    assert caught.value.__cause__ is raised


def test_a_conflict_is_not_mistaken_for_unavailability() -> None:
    with pytest.raises(ConflictError), mapped_firestore_errors("acquire_lease"):
        raise gexc.Aborted("lock timeout")
    assert not issubclass(TransientError, ConflictError)


def test_a_transaction_that_spent_its_attempts_is_a_conflict() -> None:
    with pytest.raises(ConflictError, match="kept losing"), mapped_firestore_errors("put_deployment"):
        try:
            raise gexc.Aborted("Transaction lock timeout.")
        except gexc.Aborted as exc:
            raise ValueError("Failed to commit transaction in 30 attempts.") from exc


def test_other_errors_pass_through_unchanged() -> None:
    with pytest.raises(gexc.PermissionDenied), mapped_firestore_errors("get_deployment"):
        raise gexc.PermissionDenied("missing roles/datastore.user")
    with pytest.raises(ValueError, match="limit"), mapped_firestore_errors("list_samples"):
        raise ValueError("limit: must be between 1 and 10000 (got 0)")


@pytest.mark.parametrize(
    ("value", "document_id"),
    [
        ("gemma-a", "gemma-a"),
        ("stockout/us-east5-b/v6e/spot", "stockout%2Fus-east5-b%2Fv6e%2Fspot"),
        (".", "%2E"),
        ("..", "%2E%2E"),
        ("__name__", "%5F%5F%6E%61%6D%65%5F%5F"),
    ],
)
def test_any_key_maps_to_a_legal_document_id(value: str, document_id: str) -> None:
    assert _document_id("key", value) == document_id


def test_an_empty_key_or_a_slash_in_the_prefix_is_refused() -> None:
    with pytest.raises(ValueError, match="command_id: must not be empty"):
        _document_id("command_id", "")
    with pytest.raises(ValueError, match="prefix"):
        FirestoreStateStore(client=None, prefix="a/b")  # type: ignore[arg-type]

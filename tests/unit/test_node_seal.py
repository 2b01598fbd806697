"""Node event seals: a key per deployment, derived from the controller key; a seal per event body."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.adapters.file_secrets import FileSecretStore
from shared.domain.errors import InvalidMessage
from shared.domain.node_seal import EVENT_SEAL_ATTRIBUTE, deployment_event_key, seal, seal_matches
from shared.services.event_seals import EventSeals
from tests.support.builders import command_dict

CONTROLLER_KEY = b"k" * 32


def test_each_deployment_has_its_own_key_and_the_same_one_every_time() -> None:
    first = deployment_event_key(CONTROLLER_KEY, "gemma-a")
    assert first == deployment_event_key(CONTROLLER_KEY, "gemma-a")
    assert first != deployment_event_key(CONTROLLER_KEY, "gemma-b")
    assert first != deployment_event_key(b"x" * 32, "gemma-a")
    assert len(bytes.fromhex(first)) == 32


def test_a_short_controller_key_is_refused() -> None:
    with pytest.raises(ValueError, match="32"):
        deployment_event_key(b"short", "gemma-a")


@pytest.mark.parametrize("presented", ["", "00" * 32, "zz", "é" * 70, "A" * 1000])
def test_a_seal_matches_only_its_own_body_and_key(presented: str) -> None:
    key = deployment_event_key(CONTROLLER_KEY, "gemma-a")
    assert seal_matches(key, b"body", seal(key, b"body"))
    assert not seal_matches(key, b"body2", seal(key, b"body"))
    assert not seal_matches(key, b"body", presented)


def test_the_controller_key_is_made_once_and_never_returned(tmp_path: Path) -> None:
    store = FileSecretStore(tmp_path / "secrets")
    seals = EventSeals(store, "tpuctl-event-key")
    with pytest.raises(InvalidMessage, match="no version"):
        seals.event_key("gemma-a")
    key = seals.event_key("gemma-a", create=True)
    stored = store.get("tpuctl-event-key")
    assert stored is not None and stored not in key
    assert EventSeals(store, "tpuctl-event-key").event_key("gemma-a") == key, "another instance derives the same key"


def test_the_check_names_the_attribute_and_lets_controller_events_through(tmp_path: Path) -> None:
    seals = EventSeals(FileSecretStore(tmp_path / "secrets"), "tpuctl-event-key")
    key = seals.event_key("gemma-a", create=True)
    body = b'{"kind": "node.booted"}'
    booted = type("Msg", (), {"kind": "node.booted", "deployment_id": "gemma-a"})()
    seals.check({EVENT_SEAL_ATTRIBUTE: seal(key, body)}, body, booted)
    with pytest.raises(InvalidMessage) as refused:
        seals.check({}, body, booted)
    assert refused.value.field == f"attributes.{EVENT_SEAL_ATTRIBUTE}"
    observed = command_dict("deployment.observed", "gemma-a")
    seals.check({}, b"{}", type("Msg", (), observed)())  # the controller's own events carry no seal

"""Every node the provisioner creates carries its deployment's event key in its instance metadata, and no record does.

On the simulator through the real TPU adapter, with the embedded secret store holding the controller key.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.adapters.file_secrets import FileSecretStore
from shared.domain.errors import CloudError, ErrorClass
from shared.domain.models import Phase
from shared.domain.node_seal import EVENT_KEY_METADATA
from shared.ports import SecretStore
from shared.services.event_seals import EventSeals
from shared.services.provisioner import Provisioner
from tests.support.fixtures_provisioner import HarnessFactory, spot, world
from tests.support.provisioner_harness import Harness

CHEAP = "us-central1-b"
EUROPE = "europe-west4-a"
ZONES = (CHEAP, EUROPE)
PLENTY = world({CHEAP: spot(8), EUROPE: spot(8)})
SECRET = "tpuctl-event-key"


class FlakySecrets:
    """The embedded secret store with a queue of errors raised on writes first (one per call)."""

    def __init__(self, inner: SecretStore) -> None:
        self.inner = inner
        self.put_errors: list[CloudError] = []

    def get(self, name: str) -> str | None:
        return self.inner.get(name)

    def put(self, name: str, value: str) -> None:
        if self.put_errors:
            raise self.put_errors.pop(0)
        self.inner.put(name, value)


def _node_metadata(h: Harness, deployment_id: str = "gemma") -> list[dict[str, str]]:
    """The instance metadata of every node the world holds for a deployment."""
    found = []
    for resource in h.record(deployment_id).status.resources:
        node = h.world.node(resource.zone, resource.name)
        if node is not None:
            found.append(dict(node.get("metadata") or {}))
    return found


def _wire(h: Harness, secrets: SecretStore) -> EventSeals:
    seals = EventSeals(secrets, SECRET)

    def node_metadata(deployment_id: str) -> dict[str, str]:
        return {EVENT_KEY_METADATA: seals.event_key(deployment_id, create=True)}

    h.provisioner = Provisioner(h.store, h.tpu, h.clock, settings=h.settings, node_metadata=node_metadata)
    return seals


@pytest.fixture
def h(harness_factory: HarnessFactory) -> Harness:
    return harness_factory(PLENTY)


def test_each_deployment_s_nodes_carry_its_own_key_and_the_store_holds_none(h: Harness, tmp_path: Path) -> None:
    seals = _wire(h, FileSecretStore(tmp_path / "secrets"))
    h.create(zones=ZONES)
    h.create(deployment_id="other", zones=ZONES)
    h.run_until_phase(Phase.BOOTING, minutes=10)
    h.run_until_phase(Phase.BOOTING, minutes=10, deployment_id="other")
    mine, theirs = _node_metadata(h), _node_metadata(h, "other")
    assert mine and theirs
    assert {m[EVENT_KEY_METADATA] for m in mine} == {seals.event_key("gemma")}
    assert {m[EVENT_KEY_METADATA] for m in theirs} == {seals.event_key("other")}
    assert seals.event_key("gemma") != seals.event_key("other")
    store_bytes = b"".join(p.read_bytes() for p in tmp_path.glob("state-*.db*"))
    assert seals.event_key("gemma").encode() not in store_bytes, "the key lives in the node's metadata only"
    assert "metadata" not in h.record().status.model_dump_json()


def test_a_key_that_cannot_be_made_holds_the_create_back_until_the_next_tick(h: Harness, tmp_path: Path) -> None:
    secrets = FlakySecrets(FileSecretStore(tmp_path / "secrets"))
    secrets.put_errors.append(CloudError(ErrorClass.TRANSIENT, "secretmanager: 503 unavailable"))
    seals = _wire(h, secrets)
    outcome = h.create(zones=ZONES)
    assert "node-metadata:" in outcome
    assert h.qrs() == {}, "no node is created without its key"
    h.run_until_phase(Phase.BOOTING, minutes=10)
    assert {m[EVENT_KEY_METADATA] for m in _node_metadata(h)} == {seals.event_key("gemma")}
    h.assert_invariants()

"""The controller's side of sealed node events (``shared.domain.node_seal``): the key, derivation, checking.

The controller key is a Secret Manager secret (``TPUCTL_EVENT_KEY_SECRET``) that only the controller's
functions read; the provisioner makes it on first use. No VM can read it, so no VM can derive the event key
of a deployment other than its own (which arrives in its own instance metadata).
"""

from __future__ import annotations

import secrets as token_source
from collections.abc import Mapping

from shared.domain.errors import InvalidMessage
from shared.domain.node_seal import (
    EVENT_SEAL_ATTRIBUTE,
    MIN_CONTROLLER_KEY_BYTES,
    SEALED_KINDS,
    deployment_event_key,
    seal_matches,
)
from shared.messages import Message
from shared.ports import SecretStore

__all__ = ["EventSeals"]


class EventSeals:
    """Derives deployments' event keys from the controller key and checks the seals node events carry."""

    def __init__(self, secrets: SecretStore, secret_name: str) -> None:
        self._secrets = secrets
        self._secret_name = secret_name
        self._key: bytes | None = None

    def event_key(self, deployment_id: str, *, create: bool = False) -> str:
        """The event key to hand a deployment's VMs (``create``: make the controller key on first use)."""
        return deployment_event_key(self._controller_key(create=create), deployment_id)

    def check(self, attributes: Mapping[str, str], body: bytes, message: Message) -> None:
        """Refuse a node event whose seal was not made with the key of the deployment it names."""
        if message.kind not in SEALED_KINDS:
            return
        presented = attributes.get(EVENT_SEAL_ATTRIBUTE, "")
        fix = "only a deployment's own TPU VMs can report about it"
        if not presented:
            raise InvalidMessage(f"attributes.{EVENT_SEAL_ATTRIBUTE}", f"is missing on a {message.kind}", fix)
        deployment_id = message.deployment_id
        if deployment_id is None or not seal_matches(self.event_key(deployment_id), body, presented):
            raise InvalidMessage(
                f"attributes.{EVENT_SEAL_ATTRIBUTE}",
                f"does not match the event key of deployment {message.deployment_id!r}",
                fix,
            )

    def _controller_key(self, *, create: bool) -> bytes:
        if self._key is not None:
            return self._key
        stored = self._secrets.get(self._secret_name)
        if stored is None and create:
            self._secrets.put(self._secret_name, token_source.token_hex(MIN_CONTROLLER_KEY_BYTES))
            stored = self._secrets.get(self._secret_name)  # the latest version, whoever wrote it
        if stored is None:
            raise InvalidMessage(
                self._secret_name, "has no version, so no VM holds an event key", "create a deployment first"
            )
        key = stored.strip().encode("utf-8")
        if len(key) < MIN_CONTROLLER_KEY_BYTES:
            raise InvalidMessage(
                self._secret_name, f"is shorter than {MIN_CONTROLLER_KEY_BYTES} bytes", "add a longer random version"
            )
        self._key = key
        return key

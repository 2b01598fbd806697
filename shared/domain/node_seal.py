"""Node events are sealed: a TPU VM can speak only for its own deployment.

Every TPU VM may publish on the events topic, and Pub/Sub does not tell a subscriber who published. So each
deployment's VMs get their own event key in their instance metadata (``tpuctl-event-key``; the metadata server
serves a VM its own metadata only), derived from a controller key kept in Secret Manager that no VM can read.
The node agent seals every event with an HMAC of its body under that key (attribute ``event_seal``); the
controller derives the key again from the deployment the event names and refuses an event whose seal does not
match. A VM that is taken over can forge events for its own deployment, never for another.
"""

from __future__ import annotations

import hashlib
import hmac

__all__ = [
    "EVENT_KEY_METADATA",
    "EVENT_SEAL_ATTRIBUTE",
    "SEALED_KINDS",
    "deployment_event_key",
    "seal",
    "seal_matches",
]

EVENT_KEY_METADATA = "tpuctl-event-key"
"""The instance metadata attribute that carries a deployment's event key to its VMs."""
EVENT_SEAL_ATTRIBUTE = "event_seal"
"""The Pub/Sub attribute that carries an event's seal."""
SEALED_KINDS = frozenset({"node.booted", "benchmark.completed", "node.task_completed"})
"""The events a node agent publishes: each must carry a seal made with its deployment's key."""
_CONTEXT = b"tpuctl node events v1\x00"
MIN_CONTROLLER_KEY_BYTES = 32


def deployment_event_key(controller_key: bytes, deployment_id: str) -> str:
    """The event key of one deployment's VMs (hex), derived so that it names no other deployment."""
    if len(controller_key) < MIN_CONTROLLER_KEY_BYTES:
        raise ValueError(f"the controller key has {len(controller_key)} bytes; it needs {MIN_CONTROLLER_KEY_BYTES}")
    return hmac.new(controller_key, _CONTEXT + deployment_id.encode("utf-8"), hashlib.sha256).hexdigest()


def seal(event_key: str, body: bytes) -> str:
    """The seal of one event body under a deployment's event key (hex)."""
    return hmac.new(bytes.fromhex(event_key), body, hashlib.sha256).hexdigest()


def seal_matches(event_key: str, body: bytes, presented: str) -> bool:
    """True when ``presented`` is the body's seal under ``event_key`` (compared in constant time)."""
    return hmac.compare_digest(seal(event_key, body).encode("ascii"), presented.encode("utf-8", "replace")[:128])

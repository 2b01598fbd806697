"""Builders for valid messages and specs, so tests state only what they vary."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from shared.messages import new_command_id

ISSUED_AT = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def spec_dict(deployment_id: str = "gemma-a", **overrides: Any) -> dict[str, Any]:
    """A valid DeploymentSpec as plain JSON-able data."""
    spec: dict[str, Any] = {
        "deployment_id": deployment_id,
        "model": "gemma-4-26b-a4b",
        "accelerator": "v6e-4",
        "zones": ["us-east5-b", "europe-west4-a"],
    }
    spec.update(overrides)
    return spec


def command_dict(kind: str = "deployment.create", deployment_id: str = "gemma-a", **overrides: Any) -> dict[str, Any]:
    """A valid command of ``kind`` as plain data (a fresh command id unless given)."""
    body: dict[str, Any] = {
        "kind": kind,
        "command_id": new_command_id(),
        "issued_at": ISSUED_AT.isoformat().replace("+00:00", "Z"),
        "deployment_id": deployment_id,
    }
    if kind in ("deployment.create", "deployment.update"):
        body["spec"] = spec_dict(deployment_id)
    if kind == "reconcile.tick":
        body.pop("deployment_id")
    body.update(overrides)
    return body


def command_bytes(kind: str = "deployment.create", deployment_id: str = "gemma-a", **overrides: Any) -> bytes:
    return json.dumps(command_dict(kind, deployment_id, **overrides)).encode()

"""Builders for simulator tests: a small lab world with fixed timings, and REST bodies as the client sends them."""

from __future__ import annotations

import copy
from typing import Any

from localcloud.tpu_sim import World

PROJECT = "demo-proj"

# Fixed timings (low == high) so tests can step exactly past each transition.
ACCEPT_S = 3.0
WAIT_S = 2.0
BOOT_S = 100.0
CAPACITY_CHECK_S = 10.0
DELETE_S = 40.0
SUSPEND_S = 10.0
FLEX_REFUSAL_S = 10.0
QUEUED_AT = ACCEPT_S + WAIT_S  # a request is WAITING_FOR_RESOURCES from here
ACTIVE_AT = QUEUED_AT + BOOT_S  # and ACTIVE from here when chips are free


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value
    return base


def lab_scenario(**overrides: Any) -> dict[str, Any]:
    """A world with one zone of each kind; ``overrides`` are deep-merged."""
    base: dict[str, Any] = {
        "name": "lab",
        "project": PROJECT,
        "seed": 1,
        "timings": {
            "accept_s": [ACCEPT_S, ACCEPT_S],
            "wait_s": [WAIT_S, WAIT_S],
            "boot_s": [BOOT_S, BOOT_S],
            "capacity_check_s": [CAPACITY_CHECK_S, CAPACITY_CHECK_S],
            "delete_s": [DELETE_S, DELETE_S],
            "suspend_s": [SUSPEND_S, SUSPEND_S],
            "stop_s": [20, 20],
            "start_s": [30, 30],
            "flex_refusal_s": [FLEX_REFUSAL_S, FLEX_REFUSAL_S],
        },
        "zones": {
            "us-east5-b": {
                "capacity": {"v6e": {"spot": 8, "on_demand": 8, "flex_start": 8, "reservation:res-a": 8}},
                "reservations": ["res-a"],
            },
            "us-east5-a": {"capacity": {"v6e": {"spot": 0, "on_demand": 0, "flex_start": 0}}},
            "asia-east1-c": {"provisioning_models": ["standard", "spot"], "capacity": {"v6e": {"spot": 4}}},
            "asia-east1-a": {"accelerators": ["v5litepod-4"]},
            "asia-northeast1-a": {"served": False},
            "us-central2-b": {"forbidden": True},
        },
    }
    return _merge(copy.deepcopy(base), overrides)


def lab_world(**overrides: Any) -> World:
    return World(lab_scenario(**overrides))


def qr_body(
    zone: str = "us-east5-b",
    node_id: str = "node-1",
    *,
    tier: str = "spot",
    accelerator: str = "v6e-4",
    labels: dict[str, str] | None = None,
    valid_until_s: float | None = None,
    max_run_s: float | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A QueuedResource body; ``tier`` is spot, guaranteed, plain, flex or reservation."""
    node: dict[str, Any] = {
        "acceleratorType": accelerator,
        "runtimeVersion": "v2-alpha-tpuv6e",
        "labels": {"tpuctl-deployment": "dep-a"} if labels is None else labels,
        "metadata": {"startup-script": "#!/bin/bash\necho boot"},
    }
    body: dict[str, Any] = {
        "tpu": {"nodeSpec": [{"parent": f"projects/{PROJECT}/locations/{zone}", "nodeId": node_id, "node": node}]}
    }
    if tier == "spot":
        body["spot"] = {}
    elif tier == "guaranteed":
        body["guaranteed"] = {}
    elif tier == "flex":
        body["provisioningModel"] = "FLEX_START"
        body["runDuration"] = {"maxRunDuration": f"{int(max_run_s or 3600)}s"}
    elif tier == "reservation":
        body["reservationName"] = f"projects/{PROJECT}/locations/{zone}/reservations/res-a"
    if valid_until_s is not None:
        body["queueingPolicy"] = {"validUntilDuration": f"{int(valid_until_s)}s"}
    body.update(extra)
    return body


def create(
    world: World, qr_id: str = "qr-1", zone: str = "us-east5-b", *, request_id: str | None = None, **body: Any
) -> dict[str, Any]:
    """Create a queued resource through the world's API (v2alpha1 for flex) and return the operation."""
    version = "v2alpha1" if body.get("tier") == "flex" else "v2"
    node_id = body.pop("node_id", f"{qr_id}-node")
    return world.create_queued_resource(
        PROJECT, zone, qr_id, qr_body(zone, node_id, **body), request_id=request_id, api_version=version
    )

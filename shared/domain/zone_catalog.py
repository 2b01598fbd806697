"""Zones known to offer an accelerator family before any deployment or quota row names them (pure data).

The gateway's zone listing starts from these, then adds the zones deployments, capacity memory and live quota
name (docs/reference/tpu-api.md §7: Google's list plus zones seen in the API's acceleratorTypes).
"""

from __future__ import annotations

__all__ = ["V6E_ZONES", "offering_zones"]

# Zones that offer v6e (docs/reference/tpu-api.md §7: Google's list plus zones seen in the API's acceleratorTypes).
V6E_ZONES: tuple[str, ...] = (
    "asia-northeast1-b",
    "asia-south1-b",
    "asia-south1-c",
    "asia-southeast1-b",
    "europe-west4-a",
    "southamerica-west1-a",
    "us-central1-b",
    "us-central1-c",
    "us-east1-d",
    "us-east4-a",
    "us-east4-b",
    "us-east5-a",
    "us-east5-b",
    "us-east5-c",
    "us-south1-a",
    "us-south1-c",
    "us-west1-c",
)

_OFFERING: dict[str, tuple[str, ...]] = {"v6e": V6E_ZONES}


def offering_zones(family: str) -> tuple[str, ...]:
    """The zones known to offer ``family`` (``accelerator_family`` of a slice); none for a family not listed."""
    return _OFFERING.get(family, ())

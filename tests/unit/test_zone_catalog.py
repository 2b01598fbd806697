"""The zone catalog: which zones the gateway lists for an accelerator family before any deployment names one.

Pinned: every catalog zone is a zone the domain accepts (``ZONE_PATTERN``, the spec's ``Zone`` type), the list
is sorted and has no repeats, the v6e slice types all map to it through ``accelerator_family`` (the way the
gateway's ``list_zones`` asks), and a family the catalog does not know gets no zones instead of an error. A typo
in a zone would otherwise reach the price table and the quota lookup unnoticed.
"""

from __future__ import annotations

import re

import pytest

from shared.domain.cloud import accelerator_family
from shared.domain.models import ACCELERATOR_TYPES, ZONE_PATTERN, DeploymentSpec, region_of
from shared.domain.zone_catalog import V6E_ZONES, offering_zones
from tests.support.builders import spec_dict


@pytest.mark.parametrize("zone", V6E_ZONES)
def test_every_catalog_zone_matches_the_domain_zone_pattern(zone: str) -> None:
    assert re.fullmatch(ZONE_PATTERN, zone), zone
    assert len(zone) <= 40


@pytest.mark.parametrize("zone", V6E_ZONES)
def test_every_catalog_zone_has_a_region_one_dash_shorter(zone: str) -> None:
    region = region_of(zone)
    assert zone.startswith(region + "-")
    assert re.fullmatch(r"[a-z]+-[a-z]+[0-9]+", region), region


def test_a_spec_may_name_every_catalog_zone_at_once() -> None:
    spec = DeploymentSpec.model_validate(spec_dict(zones=list(V6E_ZONES)))
    assert spec.zones == V6E_ZONES


def test_the_catalog_is_sorted_and_has_no_repeats() -> None:
    assert list(V6E_ZONES) == sorted(set(V6E_ZONES))


def test_the_catalog_is_not_empty_and_holds_the_zones_the_default_spec_uses() -> None:
    assert len(V6E_ZONES) >= 10
    assert set(spec_dict()["zones"]) <= set(V6E_ZONES)


@pytest.mark.parametrize("accelerator", [a for a in ACCELERATOR_TYPES if a.startswith("v6e-")])
def test_every_v6e_slice_type_reaches_the_v6e_zones_through_its_family(accelerator: str) -> None:
    assert offering_zones(accelerator_family(accelerator)) == V6E_ZONES


@pytest.mark.parametrize("accelerator", [a for a in ACCELERATOR_TYPES if not a.startswith("v6e-")])
def test_families_the_catalog_does_not_list_get_no_zones(accelerator: str) -> None:
    assert offering_zones(accelerator_family(accelerator)) == ()


@pytest.mark.parametrize(
    "family",
    [
        "",  # nothing
        "v6e-4",  # a slice type, not a family
        "V6E",  # families are lower case
        " v6e",  # no trimming
        "v7x",  # a family the catalog does not know
    ],
)
def test_anything_but_an_exact_known_family_gets_no_zones(family: str) -> None:
    assert offering_zones(family) == ()

"""A zone the TPU API does not know is refused as a denied location (permission); the reason a person reads
says the zone is unknown, so a misspelling is not chased as an IAM problem."""

from __future__ import annotations

from shared.domain.models import Phase
from tests.support.fixtures_provisioner import HarnessFactory, spot, world

EUROPE = "europe-west4-a"


def test_an_unknown_zone_fails_the_deployment_with_a_reason_that_says_unknown_zone(
    harness_factory: HarnessFactory,
) -> None:
    h = harness_factory(world({EUROPE: spot(8)}))
    h.create(zones=("us-east5-z",))
    h.run(3)
    status = h.record().status
    assert status.phase is Phase.FAILED
    assert "us-east5-z/" in status.message and "permission until cleared" in status.message
    assert "(unknown zone: us-east5-z is not a zone that offers v6e; check its spelling)" in status.message


def test_a_denied_known_zone_says_permission_only(harness_factory: HarnessFactory) -> None:
    h = harness_factory(world({"us-central1-b": spot(8, forbidden=True)}))
    h.create(zones=("us-central1-b",))
    h.run(3)
    status = h.record().status
    assert status.phase is Phase.FAILED
    assert "permission until cleared" in status.message and "unknown zone" not in status.message

"""The adapters read what an error is about (``CloudError.scope``, quota ``location``) once, from the
provider's text, so the planner acts on fields: checked on the captured TPU API errors in tests/fixtures,
on the catalogue variants, and end to end through ``zone_memory.learn``.
"""

from __future__ import annotations

import pickle
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from shared.adapters.compute_engine_tpu import classify_compute_error
from shared.adapters.gcp_tpu import classify_tpu_error, cloud_error_from_status
from shared.adapters.tpu_errors import error_scope, in_request_zone, zone_of_operation
from shared.domain.backends import learn_for_backend
from shared.domain.errors import CloudError, ErrorClass, ErrorScope, PermanentError
from shared.domain.models import Backend, Tier
from shared.domain.zone_memory import CloudFailure, learn

E, S = ErrorClass, ErrorScope
NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
RECORD = Path(__file__).parents[1] / "fixtures" / "reference-agent" / "tpu-26B-v6e4__tpu_zones_status.md"
_ROW = re.compile(r"^\| \*\*(?P<zone>[a-z0-9-]+)\*\* \|(?P<body>.*?)(?=^\| \*\*|\Z)", re.MULTILINE | re.DOTALL)
_SYNC = re.compile(r"INVALID_ARGUMENT: (?P<message>.+?)\. Cleaned up")
_LRO = re.compile(
    r"Waiting for operation \[(?P<operation>[^\]]+)\].*?"
    r"\"code\": (?P<code>\d+),\s*\"message\": \"(?P<message>(?:[^\"\\]|\\.)*)\"",
    re.DOTALL,
)


def _captured() -> list[tuple[str, CloudError]]:
    """(zone, classified error) for every failed create the reference agent recorded."""
    found: list[tuple[str, CloudError]] = []
    for row in _ROW.finditer(RECORD.read_text()):
        zone, body = row["zone"], row["body"]
        if (lro := _LRO.search(body)) is not None:
            status = {"code": int(lro["code"]), "message": lro["message"].replace('\\"', '"')}
            found.append(
                (zone, cloud_error_from_status(status, verb="create", zone=zone_of_operation(lro["operation"])))
            )
        elif (sync := _SYNC.search(body)) is not None:
            found.append((zone, classify_tpu_error("INVALID_ARGUMENT", sync["message"], surfaced="sync", code=400)))
    return found


CAPTURED = _captured()
# What each captured refusal drops from the search, as the planner learns it from the fields alone.
EXPECTED_KEY = {
    S.TIER: "unsupported/tier/{zone}/v6e-4/flex_start",
    S.ZONE: "unsupported/zone/{zone}",
    S.ACCELERATOR: "unsupported/accelerator/{zone}/v6e-4",
}


def test_the_fixture_holds_every_kind_of_captured_refusal() -> None:
    scopes = sorted(error.scope.value for _, error in CAPTURED if error.scope is not None)
    assert (scopes.count("accelerator"), scopes.count("tier"), scopes.count("zone")) == (3, 5, 8)
    assert len(CAPTURED) == 16


@pytest.mark.parametrize(("zone", "error"), CAPTURED, ids=[zone for zone, _ in CAPTURED])
def test_a_captured_refusal_is_classified_with_its_scope_and_place(zone: str, error: CloudError) -> None:
    assert error.error_class is E.UNSUPPORTED
    assert error.location == zone
    expected = S.TIER if "provisioning model" in error.message else S.ZONE if 'zone "' in error.message else None
    assert error.scope is (expected or S.ACCELERATOR)
    assert error.surfaced == ("operation" if expected is S.TIER else "sync")


@pytest.mark.parametrize(("zone", "error"), CAPTURED, ids=[zone for zone, _ in CAPTURED])
def test_a_captured_refusal_teaches_the_pair_its_scope_names(zone: str, error: CloudError) -> None:
    failure = CloudFailure.from_error(error)
    assert failure.scope is error.scope
    entry = learn(failure, zone=zone, tier=Tier.FLEX_START, accelerator="v6e-4", memory={}, now=NOW)
    assert entry is not None
    assert error.scope is not None
    assert entry.key == EXPECTED_KEY[error.scope].format(zone=zone)


# (message, zone of the request or None, scope) for permission errors: a location vs the project.
PERMISSION = [
    ("Permission denied on 'locations/us-central2-b' (or it may not exist).", None, S.ZONE),
    ("Location us-east1-d is not found or access is unauthorized.", None, S.ZONE),
    ("LOCATION_POLICY_VIOLATED", None, S.ZONE),
    ("Permission 'tpu.queuedResources.create' denied on 'projects/p/locations/us-east5-b'", None, S.PROJECT),
    ("The caller does not have permission", None, S.PROJECT),
    ("Request had invalid authentication credentials.", "us-east5-b", S.PROJECT),
    ("The project may not create TPUs in us-east5-b", "us-east5-b", S.ZONE),
    ("The project may not create TPUs in us-east5-b", "us-east5-a", S.PROJECT),
]


@pytest.mark.parametrize(("message", "zone", "scope"), PERMISSION)
def test_a_permission_error_names_a_zone_or_the_project(message: str, zone: str | None, scope: ErrorScope) -> None:
    assert classify_tpu_error("PERMISSION_DENIED", message, surfaced="sync", code=403, zone=zone).scope is scope
    assert error_scope(E.PERMISSION, message, zone=zone, compute_engine=True) is scope


def test_a_create_re_reads_a_permission_error_knowing_its_zone() -> None:
    raised = classify_tpu_error("PERMISSION_DENIED", "The project may not create TPUs in us-east5-b", surfaced="sync")
    with pytest.raises(CloudError) as caught, in_request_zone("us-east5-a"):
        raise raised
    assert caught.value is raised and raised.scope is S.PROJECT
    with pytest.raises(CloudError), in_request_zone("us-east5-b"):
        raise raised
    assert raised.scope is S.ZONE


@pytest.mark.parametrize(
    ("status", "message", "surfaced", "expected", "scope", "location"),
    [
        ("RESOURCE_EXHAUSTED", "Quota limit 'TPUV6EPerProjectPerZoneForTPUAPI' has been exceeded. Limit: 4 in zone "
         "us-east5-b.", "sync", E.QUOTA_ZONE, S.ZONE, "us-east5-b"),
        ("RESOURCE_EXHAUSTED", "Quota limit 'TPUV6EPreemptiblePerProjectPerRegionForTPUAPI' has been exceeded. Limit: "
         "0 in region us-east5.", "sync", E.QUOTA_REGION, S.REGION, "us-east5"),
        ("RESOURCE_EXHAUSTED", "There is no more capacity in the zone \"us-east5-a\"", "operation", E.STOCKOUT, None,
         "us-east5-a"),
        ("INVALID_ARGUMENT", "Cloud TPU received a bad request. something else", "sync", E.INVALID, None, None),
    ],
)  # fmt: skip
def test_quota_errors_carry_their_scope_and_place_and_others_no_scope(
    status: str, message: str, surfaced: str, expected: ErrorClass, scope: ErrorScope | None, location: str | None
) -> None:
    error = classify_tpu_error(status, message, surfaced=surfaced)
    assert (error.error_class, error.scope, error.location) == (expected, scope, location)


@pytest.mark.parametrize(
    ("code", "message", "status", "expected", "scope", "key"),
    [
        ("invalid", "Invalid value for field 'zone': 'asia-east1-a'. Unknown zone.", 400, E.UNSUPPORTED, S.ZONE,
         "unsupported@compute-engine/zone/asia-east1-a"),
        ("UNSUPPORTED_OPERATION", "The provisioning model 'FLEX_START' is not supported for machine type "
         "'ct6e-standard-4t' in zone 'asia-east1-a'.", 400, E.UNSUPPORTED, S.TIER,
         "unsupported@compute-engine/tier/asia-east1-a/v6e-4/flex_start"),
        ("invalid", "Machine type with name 'ct6e-standard-4t' does not exist in zone 'asia-east1-a'.", 400,
         E.UNSUPPORTED, S.ACCELERATOR, "unsupported@compute-engine/accelerator/asia-east1-a/v6e-4"),
        ("QUOTA_EXCEEDED", "Quota 'PREEMPTIBLE_TPU_V6E' exceeded.  Limit: 0.0 in region asia-east1.", 403,
         E.QUOTA_REGION, S.REGION, "quota/region/asia-east1/ce-preemptible-tpu-v6e"),
        ("forbidden", "Constraint constraints/gcp.resourceLocations violated for 'zones/asia-east1-a'", 403,
         E.PERMISSION, S.ZONE, "permission/zone/asia-east1-a"),
    ],
)  # fmt: skip
def test_compute_engine_errors_carry_the_scope_the_planner_learns_from(
    code: str, message: str, status: int, expected: ErrorClass, scope: ErrorScope, key: str
) -> None:
    error = classify_compute_error(code, message, surfaced="operation", http_status=status, zone="asia-east1-a")
    assert (error.error_class, error.scope) == (expected, scope)
    entry = learn_for_backend(
        CloudFailure.from_error(error),
        backend=Backend.COMPUTE_ENGINE,
        zone="asia-east1-a",
        tier=Tier.FLEX_START if scope is S.TIER else Tier.SPOT,
        accelerator="v6e-4",
        memory={},
        now=NOW,
    )
    assert entry is not None and entry.key == key


def test_the_zone_of_an_operation_comes_from_its_name() -> None:
    assert zone_of_operation("projects/p/locations/asia-east1-c/operations/operation-1") == "asia-east1-c"
    assert zone_of_operation("projects/p/zones/us-east5-b/operations/op-1") == "us-east5-b"
    assert zone_of_operation("operations/op-1") is None


def test_the_scope_survives_pickling_and_keeps_the_family() -> None:
    error = CloudError(E.UNSUPPORTED, "x", location="z", scope=S.TIER)
    copy = pickle.loads(pickle.dumps(error))  # noqa: S301 (our own bytes)
    assert isinstance(copy, CloudError) and isinstance(copy, PermanentError)
    assert (copy.error_class, copy.scope, copy.location) == (E.UNSUPPORTED, S.TIER, "z")


def test_an_error_pickled_before_the_scope_existed_reads_as_no_scope() -> None:
    error = CloudError(E.PERMISSION, "denied")
    del error.__dict__["scope"]  # the state an older controller pickled
    copy = pickle.loads(pickle.dumps(error))  # noqa: S301 (our own bytes)
    assert isinstance(copy, CloudError) and isinstance(copy, PermanentError)
    assert copy.scope is None
    assert CloudFailure.from_error(copy).scope is None


@pytest.mark.parametrize(("zone", "error"), CAPTURED, ids=[zone for zone, _ in CAPTURED])
def test_an_operation_failure_reaches_the_planner_with_its_scope(zone: str, error: CloudError) -> None:
    from shared.adapters.tpu_errors import failed_operation

    op = failed_operation(f"projects/p/locations/{zone}/operations/operation-1", error)
    failure = CloudFailure.from_operation(op)
    assert (failure.error_class, failure.scope, failure.location) == (error.error_class, error.scope, error.location)
    assert failure.surfaced == "operation"

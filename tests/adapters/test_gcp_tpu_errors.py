"""The TPU error mapping is complete: every google.api_core exception class, every LRO code, every catalogue text.

docs/reference/tpu-api.md §5.2 (catalogue), §5.3 (which classes the REST and LRO paths raise) and §5.4 (classes).
A new exception class in google-api-core fails ``test_the_table_names_every_api_core_exception_class``
until someone decides what it means for us.
"""

from __future__ import annotations

import inspect
from typing import Any

import google.api_core.exceptions as gexc
import google.auth.exceptions
import httpx
import pytest
import requests
from google.api_core import operation as ga_operation
from google.auth.credentials import AnonymousCredentials
from google.cloud import tpu_v2
from google.longrunning import operations_pb2
from google.protobuf import any_pb2, json_format
from google.rpc import status_pb2

from shared.adapters.gcp_tpu import (
    NODE_STATES,
    QR_STATES,
    classify_tpu_error,
    cloud_error_from_exception,
    cloud_error_from_status,
)
from shared.domain.errors import CloudError, ErrorClass
from tests.support.fixtures_tpu_sim import TpuSimFactory

E = ErrorClass

# What each api_core class means when raised with no telling message (REST parents and gRPC-named subclasses).
EXCEPTION_TABLE: dict[str, ErrorClass] = {
    "Aborted": E.TRANSIENT,
    "AlreadyExists": E.ALREADY_EXISTS,
    "BadGateway": E.TRANSIENT,
    "BadRequest": E.INVALID,
    "Cancelled": E.TRANSIENT,
    "ClientError": E.UNKNOWN,
    "Conflict": E.ALREADY_EXISTS,
    "DataLoss": E.UNKNOWN,
    "DeadlineExceeded": E.TRANSIENT,
    "FailedPrecondition": E.FAILED_PRECONDITION,
    "Forbidden": E.PERMISSION,
    "GatewayTimeout": E.TRANSIENT,
    "GoogleAPICallError": E.UNKNOWN,
    "InternalServerError": E.TRANSIENT,
    "InvalidArgument": E.INVALID,
    "LengthRequired": E.INVALID,
    "MethodNotAllowed": E.INVALID,
    "MethodNotImplemented": E.INVALID,
    "MissingStatusHeaderError": E.UNKNOWN,
    "MovedPermanently": E.UNKNOWN,
    "NotFound": E.NOT_FOUND,
    "NotModified": E.UNKNOWN,
    "OutOfRange": E.INVALID,
    "PermissionDenied": E.PERMISSION,
    "PreconditionFailed": E.FAILED_PRECONDITION,
    "Redirection": E.UNKNOWN,
    "RequestRangeNotSatisfiable": E.INVALID,
    "ResourceExhausted": E.RATE_LIMIT,
    "ResumableTransferError": E.UNKNOWN,
    "ResumeIncomplete": E.UNKNOWN,
    "ServerError": E.TRANSIENT,
    "ServiceUnavailable": E.TRANSIENT,
    "TemporaryRedirect": E.UNKNOWN,
    "TooManyRequests": E.RATE_LIMIT,
    "TransferStalledError": E.UNKNOWN,
    "Unauthenticated": E.PERMISSION,
    "Unauthorized": E.PERMISSION,
    "Unknown": E.UNKNOWN,
    "UnseekableStreamError": E.UNKNOWN,
    "UploadCancelledError": E.UNKNOWN,
}


def _api_core_classes() -> dict[str, type[gexc.GoogleAPICallError]]:
    return {
        name: value
        for name, value in vars(gexc).items()
        if inspect.isclass(value) and issubclass(value, gexc.GoogleAPICallError)
    }


def test_the_table_names_every_api_core_exception_class() -> None:
    assert set(EXCEPTION_TABLE) == set(_api_core_classes())


@pytest.mark.parametrize("name", sorted(EXCEPTION_TABLE))
def test_every_api_core_exception_class_maps_to_a_class(name: str) -> None:
    error = cloud_error_from_exception(_api_core_classes()[name]("something went wrong"))
    assert isinstance(error, CloudError)
    assert error.error_class is EXCEPTION_TABLE[name]


# Every google.rpc.Code an operation can carry, with a neutral message.
LRO_CODES = {
    1: E.TRANSIENT,
    2: E.UNKNOWN,
    3: E.INVALID,
    4: E.TRANSIENT,
    5: E.NOT_FOUND,
    6: E.ALREADY_EXISTS,
    7: E.PERMISSION,
    8: E.STOCKOUT,
    9: E.FAILED_PRECONDITION,
    10: E.TRANSIENT,
    11: E.INVALID,
    12: E.INVALID,
    13: E.STOCKOUT,
    14: E.TRANSIENT,
    15: E.UNKNOWN,
    16: E.PERMISSION,
}


@pytest.mark.parametrize(("code", "expected"), sorted(LRO_CODES.items()))
def test_every_operation_error_code_maps_to_a_class(code: int, expected: ErrorClass) -> None:
    error = cloud_error_from_status({"code": code, "message": "operation failed"})
    assert (error.error_class, error.code, error.surfaced) == (expected, code, "operation")


# docs/reference/tpu-api.md §5.2: the LRO variants, verbatim where the catalogue has them.
LRO_VARIANTS: list[tuple[int, str, str | None, ErrorClass]] = [
    (
        8,
        'There is no more capacity in the zone "us-central1-b"; you can try in another zone where Cloud TPU Nodes are '
        "offered (see https://cloud.google.com/tpu/docs/regions) [EID: 0x1234abcd]",
        "create",
        E.STOCKOUT,
    ),
    (13, "an internal error has occurred", "create", E.STOCKOUT),
    (13, "an internal error has occurred", "delete", E.TRANSIENT),
    (
        9,
        "Insufficient reserved capacity. Contact customer support to increase your reservation. [EID: 0xab]",
        "create",
        E.STOCKOUT,
    ),
    (8, "Insufficient reserved capacity. Contact customer support to increase your reservation.", "create", E.STOCKOUT),
    (9, "Node is in a state that does not allow this", "stop", E.FAILED_PRECONDITION),
    (
        3,
        'FLEX_START provisioning model is not supported for accelerator type "v6e-4" in location "asia-east1-c"',
        "create",
        E.UNSUPPORTED,
    ),
    (3, "Cloud TPU received a bad request. update is not supported while in state PREEMPTED", "update", E.STOCKOUT),
    (3, "Cloud TPU received a bad request. something else", "create", E.INVALID),
    (
        8,
        "The queued resource was not provisioned before its valid-until time: there is no more capacity in the zone "
        '"us-east5-a"',
        None,
        E.STOCKOUT,
    ),
]


@pytest.mark.parametrize(("code", "message", "verb", "expected"), LRO_VARIANTS)
def test_catalogue_operation_errors(code: int, message: str, verb: str | None, expected: ErrorClass) -> None:
    assert cloud_error_from_status({"code": code, "message": message}, verb=verb).error_class is expected


def test_a_flex_start_refusal_names_its_location() -> None:
    error = cloud_error_from_status(
        {
            "code": 3,
            "message": 'FLEX_START provisioning model is not supported for accelerator type "v6e-4" in location '
            '"asia-south1-b"',
        }
    )
    assert error.location == "asia-south1-b"


def _rest_error(
    status: int, message: str, status_name: str | None = None, details: Any = ()
) -> gexc.GoogleAPICallError:
    """What google-api-core raises for a REST error answer (parent classes, body attached)."""
    response = requests.Response()
    response.status_code = status
    body: dict[str, Any] = {"code": status, "message": message}
    if status_name:
        body["status"] = status_name
    if details:
        body["details"] = list(details)
    response._content = json_format.json.dumps({"error": body}).encode()  # type: ignore[attr-defined]
    return gexc.format_http_response_error(response, "POST", "http://tpu/v2/x", {"error": body})


QUOTA_REGION = (
    "Quota limit 'TPUV6EPreemptiblePerProjectPerRegionForTPUAPI' has been exceeded. Limit: 0 in region us-east5."
)
QUOTA_JOINED = (
    "RESOURCE_EXHAUSTED: Quota limit 'TPUV6EPerProjectPerZoneForTPUAPI,TPUV6EPerProjectPerRegionForTPUAPI' has been "
    "exceeded. Limit: 0,0 in region us-central1,zone us-central1-a."
)
QUOTA_FAILURE = {
    "@type": "type.googleapis.com/google.rpc.QuotaFailure",
    "violations": [
        {
            "subject": "projects/p",
            "description": "Quota 'TPUV2sPreemptiblePodPerProjectPerRegionForTPUAPI' exhausted. "
            "Limit 32 in region europe-west4",
        }
    ],
}
LOCATION_INFO = {
    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
    "reason": "LOCATION_POLICY_VIOLATED",
    "domain": "googleapis.com",
    "metadata": {"consumer": "projects/p", "location": "us-central2-b", "service": "tpu.googleapis.com"},
}

# (HTTP status, status name, message, details, class, quota id, location) — §5.2 sync rows and their variants.
SYNC_VARIANTS: list[tuple[int, str | None, str, list[Any], ErrorClass, str | None, str | None]] = [
    (
        429,
        "RESOURCE_EXHAUSTED",
        QUOTA_REGION,
        [],
        E.QUOTA_REGION,
        "TPUV6EPreemptiblePerProjectPerRegionForTPUAPI",
        "us-east5",
    ),
    (
        429,
        None,
        "Quota limit 'TPUV6EPerProjectPerZoneForTPUAPI' has been exceeded. Limit: 4 in zone us-east5-b.",
        [],
        E.QUOTA_ZONE,
        "TPUV6EPerProjectPerZoneForTPUAPI",
        "us-east5-b",
    ),
    (429, None, QUOTA_JOINED, [], E.QUOTA_REGION, "TPUV6EPerProjectPerRegionForTPUAPI", "us-central1"),
    (
        429,
        "RESOURCE_EXHAUSTED",
        "Quota exceeded.",
        [QUOTA_FAILURE],
        E.QUOTA_REGION,
        "TPUV2sPreemptiblePodPerProjectPerRegionForTPUAPI",
        "europe-west4",
    ),
    (429, None, "Maximum number of CreateNode requests per minute", [], E.RATE_LIMIT, None, None),
    (429, None, "Resource has been exhausted (e.g. check quota).", [], E.QUOTA_ZONE, None, None),
    (429, None, "Too many requests", [], E.RATE_LIMIT, None, None),
    (
        400,
        "INVALID_ARGUMENT",
        'Cloud TPU received a bad request. The requested accelerator configuration for accelerator type, "v6e-4", '
        'could not be found in the zonal accelerator configurations for "asia-east1-a".; the accelerator v6e-4 was '
        "not found in zone asia-east1-a [EID: 0xadaada1e50943af6]",
        [],
        E.UNSUPPORTED,
        None,
        "asia-east1-a",
    ),
    (
        400,
        "INVALID_ARGUMENT",
        'Cloud TPU received a bad request. The requested zone "asia-northeast1-a" is not supported. [EID: 0x2565]',
        [],
        E.UNSUPPORTED,
        None,
        "asia-northeast1-a",
    ),
    (
        400,
        None,
        'FLEX_START provisioning model is not supported for accelerator type "v6e-4" in location "asia-east1-c"',
        [],
        E.UNSUPPORTED,
        None,
        "asia-east1-c",
    ),
    (
        400,
        "FAILED_PRECONDITION",
        "Cannot delete queued resource in state ACTIVE without force",
        [],
        E.FAILED_PRECONDITION,
        None,
        None,
    ),
    (400, None, "Invalid value at 'queued_resource.tpu'", [], E.INVALID, None, None),
    (
        403,
        "PERMISSION_DENIED",
        "Permission denied on 'locations/us-central2-b' (or it may not exist).",
        [LOCATION_INFO],
        E.PERMISSION,
        None,
        "us-central2-b",
    ),
    (403, None, "Location us-east1-d is not found or access is unauthorized.", [], E.PERMISSION, None, "us-east1-d"),
    (
        403,
        None,
        "Permission 'tpu.nodes.list' denied on 'projects/p/locations/us-east5-b'",
        [],
        E.PERMISSION,
        None,
        "us-east5-b",
    ),
    (
        404,
        "NOT_FOUND",
        "Location us-east1-d is not found or access is unauthorized.",
        [],
        E.PERMISSION,
        None,
        "us-east1-d",
    ),
    (
        404,
        "NOT_FOUND",
        "Resource 'projects/p/locations/z/queuedResources/q' was not found",
        [],
        E.NOT_FOUND,
        None,
        None,
    ),
    (409, "ALREADY_EXISTS", "Resource already exists", [], E.ALREADY_EXISTS, None, None),
    (409, "ABORTED", "Concurrent modification", [], E.TRANSIENT, None, None),
    (500, "INTERNAL", "Internal error encountered.", [], E.TRANSIENT, None, None),
    (502, None, "Bad gateway", [], E.TRANSIENT, None, None),
    (503, "UNAVAILABLE", "The service is currently unavailable.", [], E.TRANSIENT, None, None),
    (504, "DEADLINE_EXCEEDED", "The request timed out.", [], E.TRANSIENT, None, None),
]


@pytest.mark.parametrize(("status", "name", "message", "details", "expected", "quota_id", "location"), SYNC_VARIANTS)
def test_catalogue_sync_errors_over_rest(
    status: int,
    name: str | None,
    message: str,
    details: list[Any],
    expected: ErrorClass,
    quota_id: str | None,
    location: str | None,
) -> None:
    error = cloud_error_from_exception(_rest_error(status, message, name, details))
    assert (error.error_class, error.quota_id, error.location, error.code, error.surfaced) == (
        expected,
        quota_id,
        location,
        status,
        "sync",
    )


@pytest.mark.parametrize(("status", "name", "message", "details", "expected", "quota_id", "location"), SYNC_VARIANTS)
def test_the_v2alpha1_httpx_path_classifies_the_same_way(
    status: int,
    name: str | None,
    message: str,
    details: list[Any],
    expected: ErrorClass,
    quota_id: str | None,
    location: str | None,
) -> None:
    body: dict[str, Any] = {"code": status, "message": message, **({"status": name} if name else {})}
    if details:
        body["details"] = details
    request = httpx.Request("POST", "http://tpu/v2alpha1/x")
    response = httpx.Response(status, json={"error": body}, request=request)
    error = cloud_error_from_exception(httpx.HTTPStatusError("failed", request=request, response=response))
    assert (error.error_class, error.quota_id, error.location) == (expected, quota_id, location)


def _lro_raised(code: int, message: str, verb: str) -> gexc.GoogleAPICallError:
    """What ``operation.result()`` raises: from_grpc_status with the Operation as the response."""
    metadata = any_pb2.Any()
    metadata.Pack(tpu_v2.OperationMetadata.pb(tpu_v2.OperationMetadata(verb=verb)))
    op = operations_pb2.Operation(
        name="projects/p/locations/z/operations/o",
        done=True,
        error=status_pb2.Status(code=code, message=message),
        metadata=metadata,
    )
    return gexc.from_grpc_status(code, message, errors=(op.error,), response=op)


@pytest.mark.parametrize(
    ("code", "message", "verb", "expected"),
    [(code, "operation failed", "create", expected) for code, expected in sorted(LRO_CODES.items())]
    + [(code, message, verb or "create", expected) for code, message, verb, expected in LRO_VARIANTS],
)
def test_exceptions_raised_by_operation_result_map_like_operation_errors(
    code: int, message: str, verb: str, expected: ErrorClass
) -> None:
    error = cloud_error_from_exception(_lro_raised(code, message, verb))
    assert (error.error_class, error.surfaced) == (expected, "operation")


def test_operation_result_against_the_simulator_raises_a_stockout(tpu_sim_factory: TpuSimFactory) -> None:
    sim = tpu_sim_factory("scarce-v6e")
    client = tpu_v2.TpuClient(
        transport="rest", credentials=AnonymousCredentials(), client_options={"api_endpoint": sim.base_url}
    )
    future = client.create_node(
        parent="projects/demo-proj/locations/us-central1-b",
        node_id="starved",
        node=tpu_v2.Node(accelerator_type="v6e-4", runtime_version="v2-alpha-tpuv6e"),
    )
    assert isinstance(future, ga_operation.Operation)
    sim.advance(60)
    with pytest.raises(gexc.GoogleAPICallError) as caught:
        future.result(timeout=5)
    assert type(caught.value) is gexc.ResourceExhausted
    assert cloud_error_from_exception(caught.value).error_class is E.STOCKOUT


TRANSPORT_TABLE: list[tuple[BaseException, ErrorClass]] = [
    (requests.exceptions.ConnectionError("refused"), E.TRANSIENT),
    (requests.exceptions.ReadTimeout("slow"), E.TRANSIENT),
    (requests.exceptions.ChunkedEncodingError("reset"), E.TRANSIENT),
    (httpx.ConnectError("refused"), E.TRANSIENT),
    (httpx.ReadTimeout("slow"), E.TRANSIENT),
    (gexc.RetryError("gave up", cause=None), E.TRANSIENT),
    (google.auth.exceptions.DefaultCredentialsError("no ADC"), E.PERMISSION),
    (google.auth.exceptions.RefreshError("revoked"), E.PERMISSION),
    (google.auth.exceptions.TransportError("dns"), E.TRANSIENT),
    (json_format.ParseError("bad @type"), E.UNKNOWN),
    (RuntimeError("bug"), E.UNKNOWN),
]


@pytest.mark.parametrize(("exc", "expected"), TRANSPORT_TABLE, ids=[type(exc).__name__ for exc, _ in TRANSPORT_TABLE])
def test_transport_and_auth_failures_map_to_a_class(exc: BaseException, expected: ErrorClass) -> None:
    assert cloud_error_from_exception(exc).error_class is expected


def test_a_cloud_error_passes_through_unchanged() -> None:
    original = CloudError(E.STOCKOUT, "x")
    assert cloud_error_from_exception(original) is original


def test_classify_is_the_single_entry_point_for_both_surfaces() -> None:
    sync = classify_tpu_error("RESOURCE_EXHAUSTED", "no more capacity", surfaced="sync")
    lro = classify_tpu_error("RESOURCE_EXHAUSTED", "no more capacity", surfaced="operation")
    assert (sync.error_class, lro.error_class) == (E.RATE_LIMIT, E.STOCKOUT)


def test_every_provider_state_has_a_domain_state() -> None:
    assert set(QR_STATES) == set(tpu_v2.QueuedResourceState.State.__members__)
    assert set(NODE_STATES) == set(tpu_v2.Node.State.__members__)

"""``TpuApi`` on Compute Engine: TPU VMs as instances (``ct6e-standard-1t/4t/8t``), through google-cloud-compute.

Why a second back end: Google keeps the Cloud TPU API on bug fixes only and offers TPU7x and later
through Compute Engine or GKE, where flex-start VMs play the role of queued resources (docs/reference/tpu-api.md §1,
docs/reference/reference-agent.md §11). This adapter speaks Compute Engine and hands the controller the same domain
states and error classes as :mod:`shared.adapters.gcp_tpu`, so the planner cannot tell the two apart
except by ``ObservedResource.backend``.

A create is one ``instances.insert``: ``scheduling.provisioningModel`` FLEX_START / SPOT / STANDARD /
RESERVATION_BOUND, ``maxRunDuration`` with ``instanceTerminationAction=DELETE``, flex-start's
``params.requestValidForDuration``, ``onHostMaintenance=TERMINATE``, the TPU machine type, the accelerator
image family, a 200 GB boot disk (the vLLM image does not fit the 10 GB default), the VM service account
with the cloud-platform scope (the boot-time Secret Manager read needs it), the startup script and our labels.

Instance status -> domain (``RUNNING`` only means the VM booted; readiness comes from the monitor)::

    PENDING                      WAITING_FOR_RESOURCES    flex-start waiting for chips
    PROVISIONING, STAGING        PROVISIONING / CREATING
    RUNNING, REPAIRING           ACTIVE / READY, REPAIRING
    STOPPING, PENDING_STOP       SUSPENDING / PREEMPTED (spot), STOPPING (flex-start run over, standard)
    TERMINATED, STOPPED          SUSPENDED  / PREEMPTED (spot), STOPPED (flex-start), TERMINATED (standard)
    SUSPENDING, SUSPENDED        SUSPENDING / SUSPENDED
    DEPROVISIONING               DELETING

Error classes (one function, :func:`classify_compute_error`, for synchronous answers and operation errors)::

    stockout       op ZONE_RESOURCE_POOL_EXHAUSTED[_WITH_DETAILS], "does not have enough resources";
                   op INTERNAL_ERROR on an insert (opaque, as on the TPU API)
    quota_region   op QUOTA_EXCEEDED / sync reason quotaExceeded: "Quota 'M' exceeded. Limit: N in region R"
                   (quota id = quotaInfo.limitName, e.g. PREEMPTIBLE-TPU-V6E-per-project-region)
    rate_limit     429, reason rateLimitExceeded / userRateLimitExceeded, RESOURCE_OPERATION_RATE_EXCEEDED
    unsupported    op UNSUPPORTED_OPERATION; sync "Machine type with name … does not exist in zone", "Unknown zone"
    permission     401/403 (forbidden, org-policy location constraints), PERMISSION_DENIED
    not_found      404 (a missing reservation on insert is ``invalid``: the request names something that is not there)
    already_exists 409 alreadyExists;  failed_precondition: 412, resourceNotReady, conditionNotMet
    transient      5xx, backendError, ABORTED, timeouts, connection resets;  invalid: other 400s;  unknown: the rest
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import google.api_core.exceptions as gexc
import google.auth.exceptions
import requests
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials, Credentials
from google.cloud import compute_v1

from shared.adapters.gcp_tpu import cloud_error_from_exception
from shared.adapters.tpu_errors import error_scope, failed_operation, in_request_zone, quota_message_location
from shared.domain.backends import MACHINE_TYPES, accelerator_of_machine_type, machine_type_of
from shared.domain.boot_progress import GuestAttribute
from shared.domain.cloud import LABEL_MANAGED_BY, NodePlacement, ObservedResource, OperationStatus, ProvisionRequest
from shared.domain.errors import CloudError, ErrorClass, ErrorScope
from shared.domain.models import Backend, NodeState, QueuedResourceState, Tier

__all__ = [
    "DEFAULT_IMAGE_FAMILY",
    "INSTANCE_STATES",
    "MACHINE_TYPES",
    "ComputeEngineTpu",
    "classify_compute_error",
    "compute_error_from_exception",
    "translated_errors",
]

SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
DEFAULT_IMAGE_FAMILY = (
    "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e"
)
BOOT_DISK_GB = 200
ENDPOINT_METADATA_KEY = "tpuctl-endpoint"
_MAX_GUEST_ENTRIES = 64  # a hostile VM could write thousands of keys; a few are ever read
_OPERATION_NAME = re.compile(r"^projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)/operations/(?P<op>[^/]+)$")

# ---------------------------------------------------------------------------------------------- state table

INSTANCE_STATES: Mapping[str, tuple[QueuedResourceState, NodeState | None]] = {
    "UNDEFINED_STATUS": (QueuedResourceState.UNKNOWN, None),
    "PENDING": (QueuedResourceState.WAITING, None),
    "PROVISIONING": (QueuedResourceState.PROVISIONING, NodeState.CREATING),
    "STAGING": (QueuedResourceState.PROVISIONING, NodeState.CREATING),
    "RUNNING": (QueuedResourceState.ACTIVE, NodeState.READY),
    "REPAIRING": (QueuedResourceState.ACTIVE, NodeState.REPAIRING),
    "STOPPING": (QueuedResourceState.SUSPENDING, NodeState.STOPPING),
    "PENDING_STOP": (QueuedResourceState.SUSPENDING, NodeState.STOPPING),
    "STOPPED": (QueuedResourceState.SUSPENDED, NodeState.TERMINATED),
    "TERMINATED": (QueuedResourceState.SUSPENDED, NodeState.TERMINATED),
    "SUSPENDING": (QueuedResourceState.SUSPENDING, NodeState.STOPPING),
    "SUSPENDED": (QueuedResourceState.SUSPENDED, NodeState.STOPPED),
    "DEPROVISIONING": (QueuedResourceState.DELETING, NodeState.DELETING),
}
_TIERS = {
    "FLEX_START": Tier.FLEX_START,
    "SPOT": Tier.SPOT,
    "RESERVATION_BOUND": Tier.RESERVATION,
    "STANDARD": Tier.ON_DEMAND,
}
_MODELS = {tier: model for model, tier in _TIERS.items()}
_ENDING = frozenset({"STOPPING", "PENDING_STOP", "STOPPED", "TERMINATED"})

# ---------------------------------------------------------------------------------------------- errors

_STOCKOUT = re.compile(r"RESOURCE_POOL_EXHAUSTED|does not have enough resources available|STOCKOUT", re.IGNORECASE)
_QUOTA = re.compile(
    r"Quota '([A-Z0-9_]+)' exceeded\.\s*Limit:\s*([0-9.]+)\s+(?:in\s+(region|zone)\s+([a-z0-9-]+)|globally)"
)
_UNSUPPORTED = re.compile(
    r"Machine type with name '[^']+' does not exist in zone|Unknown zone|is not supported for machine type"
    r"|provisioning model '?[A-Z_]+'? is not supported",
    re.IGNORECASE,
)
_ZONE = re.compile(r"(?:zones/|zone ')([a-z]+-[a-z]+[0-9]+-[a-z0-9]+)")
_RATE_REASONS = frozenset({"ratelimitexceeded", "userratelimitexceeded", "resource_operation_rate_exceeded"})
_PERMISSION_CODES = frozenset({"forbidden", "permission_denied", "insufficientpermissions", "unauthorized"})
_PRECONDITION_CODES = frozenset({"resourcenotready", "resource_not_ready", "conditionnotmet", "condition_not_met"})
_TRANSIENT_CODES = frozenset({"backenderror", "internalerror", "internal_error", "service_unavailable", "aborted"})


def _quota_id_of_metric(metric: str) -> str:
    """``PREEMPTIBLE_TPU_V6E`` -> ``PREEMPTIBLE-TPU-V6E-per-project-region`` (the limit name Compute reports)."""
    return f"{metric.replace('_', '-')}-per-project-region"


def classify_compute_error(
    code: str,
    message: str,
    *,
    surfaced: str,
    http_status: int | None = None,
    quota_info: Sequence[Mapping[str, Any]] = (),
    verb: str | None = None,
    zone: str | None = None,
) -> CloudError:
    """THE mapping from a Compute Engine error to a :class:`CloudError`.

    ``code`` is the operation error's ``errors[].code`` (``ZONE_RESOURCE_POOL_EXHAUSTED``…) or the
    synchronous answer's ``errors[].reason`` (``quotaExceeded``…); ``surfaced`` is ``sync`` or
    ``operation``; ``verb`` the operation type when known (``insert``, ``delete``…); ``zone`` the zone of
    the request when known. The error's ``scope`` and quota ``location`` are read here, once
    (:mod:`shared.adapters.tpu_errors`).
    """
    key = code.lower()
    location: str | None = None
    quota_id: str | None = None
    zone_match = _ZONE.search(message)
    error_class: ErrorClass
    if key in _RATE_REASONS or http_status == 429:
        error_class = ErrorClass.RATE_LIMIT
    elif key == "aborted":
        error_class = ErrorClass.TRANSIENT
    elif _STOCKOUT.search(code) or _STOCKOUT.search(message):
        error_class = ErrorClass.STOCKOUT
    elif key in ("quota_exceeded", "quotaexceeded") or _QUOTA.search(message):
        quota = _QUOTA.search(message)
        scope = quota.group(3) if quota else None
        location = quota.group(4) if quota else None
        error_class = ErrorClass.QUOTA_ZONE if scope == "zone" else ErrorClass.QUOTA_REGION
        for info in quota_info:
            quota_id = str(info.get("limitName") or info.get("limit_name") or "") or None
            dimensions = info.get("dimensions") or {}
            location = location or (dimensions.get("region") if isinstance(dimensions, Mapping) else None)
            if quota_id:
                break
        if quota_id is None and quota is not None:
            quota_id = _quota_id_of_metric(quota.group(1))
    elif key == "unsupported_operation" or _UNSUPPORTED.search(message):
        error_class = ErrorClass.UNSUPPORTED
    elif key in _PERMISSION_CODES or http_status in (401, 403) or "constraints/gcp.resourceLocations" in message:
        error_class = ErrorClass.PERMISSION
    elif key in ("notfound", "resource_not_found") or http_status == 404:
        error_class = ErrorClass.INVALID if verb == "insert" or "/reservations/" in message else ErrorClass.NOT_FOUND
    elif key in ("alreadyexists", "resource_already_exists", "already_exists") or http_status == 409:
        error_class = ErrorClass.ALREADY_EXISTS
    elif key in _PRECONDITION_CODES or http_status == 412:
        error_class = ErrorClass.FAILED_PRECONDITION
    elif key in _TRANSIENT_CODES or (http_status is not None and http_status >= 500):
        opaque_create = surfaced == "operation" and verb == "insert" and key in ("internal_error", "internalerror")
        error_class = ErrorClass.STOCKOUT if opaque_create else ErrorClass.TRANSIENT
    elif key in ("invalid", "badrequest", "invalid_argument", "invalid_field_value") or http_status == 400:
        error_class = ErrorClass.INVALID
    else:
        error_class = ErrorClass.UNKNOWN
    if location is None and zone_match is not None:
        location = zone_match.group(1)
    scope = error_scope(error_class, message, zone=zone, compute_engine=True)
    location = location or quota_message_location(scope, message)
    return CloudError(
        error_class, message, code=http_status, quota_id=quota_id, location=location, surfaced=surfaced, scope=scope
    )


def _operation_error(op: compute_v1.Operation, zone: str | None = None) -> CloudError | None:
    """The classified error of a finished zonal operation, or None when it succeeded."""
    if not op.error.errors:
        return None
    first = op.error.errors[0]
    infos = [
        {
            "limitName": detail.quota_info.limit_name,
            "metricName": detail.quota_info.metric_name,
            "dimensions": dict(detail.quota_info.dimensions),
        }
        for detail in first.error_details
        if detail.quota_info.limit_name
    ]
    return classify_compute_error(
        first.code,
        first.message,
        surfaced="operation",
        http_status=op.http_error_status_code or None,
        quota_info=infos,
        verb=op.operation_type or None,
        zone=zone,
    )


def compute_error_from_exception(exc: BaseException) -> CloudError:
    """Any exception of the Compute REST client -> a classified CloudError (other paths: the TPU adapter's)."""
    if isinstance(exc, CloudError):
        return exc
    if isinstance(exc, gexc.GoogleAPICallError) and not isinstance(exc, gexc.RetryError):
        errors = [item for item in (exc.errors or ()) if isinstance(item, Mapping)]
        reason = str(errors[0].get("reason", "")) if errors else str(exc.reason or "")
        http_status = exc.code if isinstance(exc.code, int) else None
        message = str(errors[0].get("message") or exc.message) if errors else str(exc.message)
        return classify_compute_error(reason, message, surfaced="sync", http_status=http_status)
    return cloud_error_from_exception(exc)


_VENDOR_ERRORS = (gexc.GoogleAPIError, requests.exceptions.RequestException, google.auth.exceptions.GoogleAuthError)


@contextmanager
def translated_errors() -> Iterator[None]:
    """Re-raise every vendor exception as the CloudError it means (``from`` the original)."""
    try:
        yield
    except CloudError:
        raise
    except _VENDOR_ERRORS as exc:
        raise compute_error_from_exception(exc) from exc


# ---------------------------------------------------------------------------------------------- the adapter


class ComputeEngineTpu:
    """TPU VMs of one project as Compute Engine instances (or the local simulator's Compute Engine subset).

    ``endpoint`` points the clients elsewhere (``http://127.0.0.1:8471`` for the simulator); with an
    endpoint and no ``credentials`` the calls are anonymous, otherwise Application Default Credentials are
    used. Lists are filtered to ``managed-by=tpuctl`` so a project full of other VMs costs nothing to scan.
    Nothing here waits for an operation: callers store the operation name and look again later.
    """

    def __init__(
        self,
        project: str,
        *,
        endpoint: str | None = None,
        credentials: Credentials | None = None,
        timeout_s: float = 30.0,
        image_family: str = DEFAULT_IMAGE_FAMILY,
        boot_disk_gb: int = BOOT_DISK_GB,
        boot_disk_type: str = "hyperdisk-balanced",
        network: str = "global/networks/default",
        external_ip: bool = True,
        placement: NodePlacement | None = None,
    ) -> None:
        if not project:
            raise ValueError("project: required (the GCP project id, e.g. demo-proj)")
        if boot_disk_gb < 100:
            raise ValueError("boot_disk_gb: at least 100 (the vLLM TPU image does not fit a smaller disk; 200 is safe)")
        self.project = project
        self._endpoint = endpoint
        self._timeout_s = timeout_s
        self._image_family = image_family
        self._boot_disk_gb = boot_disk_gb
        self._boot_disk_type = boot_disk_type
        self._placement = placement or NodePlacement()
        self._network = self._placement.network_path(project) or network
        self._external_ip = external_ip and self._placement.external_ips
        self._credentials: Credentials | None = credentials
        if credentials is None and endpoint is not None:
            self._credentials = AnonymousCredentials()
        self._instances: compute_v1.InstancesClient | None = None
        self._operations: compute_v1.ZoneOperationsClient | None = None

    # ---- lazily built clients

    def _options(self) -> ClientOptions | None:
        return ClientOptions(api_endpoint=self._endpoint) if self._endpoint else None

    @property
    def instances(self) -> compute_v1.InstancesClient:
        """The google-cloud-compute instances client, built on first use."""
        if self._instances is None:
            with translated_errors():
                self._instances = compute_v1.InstancesClient(
                    credentials=self._credentials, client_options=self._options()
                )
        return self._instances

    @property
    def operations(self) -> compute_v1.ZoneOperationsClient:
        """The zonal operations client, built on first use."""
        if self._operations is None:
            with translated_errors():
                self._operations = compute_v1.ZoneOperationsClient(
                    credentials=self._credentials, client_options=self._options()
                )
        return self._operations

    def close(self) -> None:
        """Release HTTP connections."""
        for client in (self._instances, self._operations):
            if client is not None:
                client.transport.close()
        self._instances = None
        self._operations = None

    # ---- building the instance

    def instance_for(self, request: ProvisionRequest) -> compute_v1.Instance:
        """The ``Instance`` body a create sends (also shown by dry runs and tests)."""
        machine = _machine_type(request)
        zone = request.zone
        params = _flex_start_params(request)
        instance = compute_v1.Instance(
            name=request.resource_id,
            machine_type=f"zones/{zone}/machineTypes/{machine}",
            labels={LABEL_MANAGED_BY: "tpuctl", **request.labels},
            scheduling=_scheduling(request),
            disks=[self._boot_disk(zone)],
            network_interfaces=[self._network_interface()],
            service_accounts=[
                compute_v1.ServiceAccount(
                    email=request.service_account or self._placement.service_account or "default", scopes=list(SCOPES)
                )
            ],
        )
        subnetwork = self._placement.subnetwork_path(self.project, zone.rsplit("-", 1)[0])
        if subnetwork:
            instance.network_interfaces[0].subnetwork = subnetwork
        if self._placement.tags:
            instance.tags = compute_v1.Tags(items=list(self._placement.tags))
        if params is not None:
            instance.params = params
        if request.startup_script:
            instance.metadata = _startup_metadata(request)
        if request.tier is Tier.RESERVATION:
            instance.reservation_affinity = _reservation_affinity(request)
        return instance

    def _boot_disk(self, zone: str) -> compute_v1.AttachedDisk:
        """The boot disk: the configured image family, size and type, deleted with the VM."""
        return compute_v1.AttachedDisk(
            boot=True,
            auto_delete=True,
            initialize_params=compute_v1.AttachedDiskInitializeParams(
                source_image=self._image_family,
                disk_size_gb=self._boot_disk_gb,
                disk_type=f"zones/{zone}/diskTypes/{self._boot_disk_type}",
            ),
        )

    def _network_interface(self) -> compute_v1.NetworkInterface:
        """The one network interface, with an external address only when configured to have one."""
        return compute_v1.NetworkInterface(
            network=self._network,
            access_configs=(
                [compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")] if self._external_ip else []
            ),
        )

    # ---- TpuApi

    def create(self, request: ProvisionRequest) -> OperationStatus:
        """``instances.insert`` with the request's deterministic name and requestId; returns the zonal operation."""
        insert = compute_v1.InsertInstanceRequest(
            project=self.project,
            zone=request.zone,
            instance_resource=self.instance_for(request),
            request_id=request.request_id,
        )
        with in_request_zone(request.zone, compute_engine=True), translated_errors():
            op = self.instances.insert_unary(request=insert, retry=None, timeout=self._timeout_s)
        return self._op_status(request.zone, op)

    def _op_status(self, zone: str, op: compute_v1.Operation) -> OperationStatus:
        name = f"projects/{self.project}/zones/{zone}/operations/{op.name}"
        done = op.status == compute_v1.Operation.Status.DONE
        error = _operation_error(op, zone) if done else None
        if error is None:
            return OperationStatus(name=name, done=done)
        return failed_operation(name, error)

    def get_operation(self, name: str) -> OperationStatus:
        """A zonal operation by the name :meth:`create` returned (``projects/P/zones/Z/operations/OP``)."""
        match = _OPERATION_NAME.match(name)
        if match is None:
            raise CloudError(ErrorClass.INVALID, f"operation name {name!r}: expected projects/P/zones/Z/operations/OP")
        with translated_errors():
            op = self.operations.get(
                project=match["project"], zone=match["zone"], operation=match["op"], retry=None, timeout=self._timeout_s
            )
        return self._op_status(match["zone"], op)

    def get(self, zone: str, resource_id: str) -> ObservedResource | None:
        try:
            with translated_errors():
                found = self.instances.get(
                    project=self.project, zone=zone, instance=resource_id, retry=None, timeout=self._timeout_s
                )
        except CloudError as exc:
            if exc.error_class is ErrorClass.NOT_FOUND:
                return None
            raise
        return observe_instance(found)

    def list(self, zone: str = "-") -> list[ObservedResource]:
        """Our instances in ``zone`` (``-``: every zone, one aggregated call)."""
        label_filter = f'labels.{LABEL_MANAGED_BY} = "tpuctl"'
        observed: list[ObservedResource] = []
        with translated_errors():
            if zone == "-":
                request = compute_v1.AggregatedListInstancesRequest(project=self.project, filter=label_filter)
                for _scope, scoped in self.instances.aggregated_list(
                    request=request, retry=None, timeout=self._timeout_s
                ):
                    observed += [observe_instance(item) for item in scoped.instances]
            else:
                listed = self.instances.list(
                    request=compute_v1.ListInstancesRequest(project=self.project, zone=zone, filter=label_filter),
                    retry=None,
                    timeout=self._timeout_s,
                )
                observed = [observe_instance(item) for item in listed]
        return sorted(observed, key=lambda item: (item.zone, item.name))

    def delete(
        self, zone: str, resource_id: str, *, force: bool, request_id: str | None = None
    ) -> OperationStatus | None:
        """Delete the instance (Compute Engine always deletes outright; ``force`` changes nothing); None if gone."""
        delete = compute_v1.DeleteInstanceRequest(project=self.project, zone=zone, instance=resource_id)
        if request_id:
            delete.request_id = request_id
        try:
            with translated_errors():
                op = self.instances.delete_unary(request=delete, retry=None, timeout=self._timeout_s)
        except CloudError as exc:
            if exc.error_class is ErrorClass.NOT_FOUND:
                return None
            raise
        return self._op_status(zone, op)

    def stop_node(self, zone: str, node_id: str) -> OperationStatus:
        with translated_errors():
            op = self.instances.stop_unary(
                project=self.project, zone=zone, instance=node_id, retry=None, timeout=self._timeout_s
            )
        return self._op_status(zone, op)

    def start_node(self, zone: str, node_id: str) -> OperationStatus:
        with translated_errors():
            op = self.instances.start_unary(
                project=self.project, zone=zone, instance=node_id, retry=None, timeout=self._timeout_s
            )
        return self._op_status(zone, op)

    def guest_attributes(self, zone: str, node_id: str, query_path: str) -> Sequence[GuestAttribute]:
        """``instances.getGuestAttributes``. Compute answers 404 both for a missing instance and for a path the VM
        has not written yet, so a 404 is told apart with one ``get`` (only until the first write)."""
        request = compute_v1.GetGuestAttributesInstanceRequest(
            project=self.project, zone=zone, instance=node_id, query_path=query_path
        )
        try:
            with translated_errors():
                answer = self.instances.get_guest_attributes(request=request, retry=None, timeout=self._timeout_s)
        except CloudError as exc:
            if exc.error_class is not ErrorClass.NOT_FOUND or self.get(zone, node_id) is None:
                raise
            return []
        return [
            GuestAttribute(entry.namespace, entry.key, entry.value)
            for entry in answer.query_value.items[:_MAX_GUEST_ENTRIES]
        ]


# ---------------------------------------------------------------------------------------------- observation


def _time(value: str) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC)


def _endpoint(instance: compute_v1.Instance) -> str | None:
    """Where vLLM answers: a node agent's published ``host:port``, else the external IP, else the internal one."""
    for item in instance.metadata.items:
        if item.key == ENDPOINT_METADATA_KEY and item.value:
            return str(item.value)
    for interface in instance.network_interfaces:
        for access in interface.access_configs:
            if access.nat_i_p:
                return str(access.nat_i_p)
    for interface in instance.network_interfaces:
        if interface.network_i_p:
            return str(interface.network_i_p)
    return None


def observe_instance(instance: compute_v1.Instance) -> ObservedResource:
    """One instance as the provider-neutral view the planner reads (G6)."""
    status = instance.status or "UNDEFINED_STATUS"
    state, node_state = INSTANCE_STATES.get(status, (QueuedResourceState.UNKNOWN, NodeState.UNKNOWN))
    scheduling = instance.scheduling
    model = scheduling.provisioning_model or ("SPOT" if scheduling.preemptible else "STANDARD")
    tier = _TIERS.get(model, Tier.ON_DEMAND)
    initiator = ""
    if status in _ENDING:
        initiator = "SERVICE"
        if tier is Tier.SPOT:
            node_state = NodeState.PREEMPTED
        elif tier is Tier.FLEX_START:
            # the run reached its max duration: a normal end of lease, not a preemption
            node_state = NodeState.STOPPING if status in ("STOPPING", "PENDING_STOP") else NodeState.STOPPED
    zone = instance.zone.rsplit("/", 1)[-1]
    machine = instance.machine_type.rsplit("/", 1)[-1]
    return ObservedResource(
        name=instance.name,
        zone=zone,
        backend=Backend.COMPUTE_ENGINE,
        kind="instance",
        state=state,
        state_initiator=initiator,
        tier=tier,
        accelerator=accelerator_of_machine_type(machine) or machine,
        labels=dict(instance.labels),
        node_id=instance.name,
        node_state=node_state,
        endpoint=_endpoint(instance) if state is QueuedResourceState.ACTIVE else None,
        created_at=_time(instance.creation_timestamp),
        termination_at=_time(scheduling.termination_time),
    )


def _machine_type(request: ProvisionRequest) -> str:
    """The single machine type that carries the request's accelerator, or UNSUPPORTED (the tpu-api back end may)."""
    machine = machine_type_of(request.accelerator)
    if machine is None:
        raise CloudError(
            ErrorClass.UNSUPPORTED,
            f"accelerator: Compute Engine sells no single machine type for {request.accelerator!r} "
            f"(known: {', '.join(sorted(MACHINE_TYPES))}); use the tpu-api back end",
            location=request.zone,
            scope=ErrorScope.ACCELERATOR,
        )
    return machine


def _flex_start_params(request: ProvisionRequest) -> compute_v1.InstanceParams | None:
    """Flex-start needs a run limit; its optional wait for capacity travels as the instance's params."""
    if request.tier is not Tier.FLEX_START:
        return None
    if not request.max_run_s:
        raise CloudError(ErrorClass.INVALID, "max_run_s: required for tier 'flex_start' (at most 7 days)")
    if not request.valid_until_s:
        return None
    return compute_v1.InstanceParams(request_valid_for_duration=compute_v1.Duration(seconds=request.valid_until_s))


def _scheduling(request: ProvisionRequest) -> compute_v1.Scheduling:
    """The tier's provisioning model; a VM with a run limit, or a spot VM, is deleted when it ends, not stopped."""
    scheduling = compute_v1.Scheduling(
        provisioning_model=_MODELS[request.tier], on_host_maintenance="TERMINATE", automatic_restart=False
    )
    if request.max_run_s:
        scheduling.max_run_duration = compute_v1.Duration(seconds=request.max_run_s)
        scheduling.instance_termination_action = "DELETE"
    elif request.tier is Tier.SPOT:
        scheduling.instance_termination_action = "DELETE"  # a preempted VM is gone, not a stopped leftover
    return scheduling


def _startup_metadata(request: ProvisionRequest) -> compute_v1.Metadata:
    """The startup script and the request's metadata. Compute Engine keeps guest attributes off unless asked:
    the script reports boot progress there."""
    return compute_v1.Metadata(
        items=[
            compute_v1.Items(key="startup-script", value=request.startup_script),
            compute_v1.Items(key="enable-guest-attributes", value="TRUE"),
            *(compute_v1.Items(key=key, value=value) for key, value in request.metadata.items()),
        ]
    )


def _reservation_affinity(request: ProvisionRequest) -> compute_v1.ReservationAffinity:
    """Tier 'reservation' consumes the named reservation and nothing else."""
    if not request.reservation_name:
        raise CloudError(ErrorClass.INVALID, "reservation_name: required for tier 'reservation' (the reservation's id)")
    return compute_v1.ReservationAffinity(
        consume_reservation_type="SPECIFIC_RESERVATION",
        key="compute.googleapis.com/reservation-name",
        values=[request.reservation_name],
    )

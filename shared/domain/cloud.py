"""Provider-neutral views of TPU resources: what the adapters return and the planner reads.

Adapters normalise provider states and errors into these (G6); domain code never sees provider
strings or SDK types.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from shared.domain.errors import ErrorClass, ErrorScope
from shared.domain.models import Backend, NodeState, QueuedResourceState, Tier

__all__ = [
    "LABEL_DEPLOYMENT",
    "LABEL_GENERATION",
    "LABEL_MANAGED_BY",
    "LABEL_PROBE",
    "NodePlacement",
    "ObservedResource",
    "OperationStatus",
    "ProvisionRequest",
    "accelerator_family",
]

LABEL_DEPLOYMENT = "tpuctl-deployment"
LABEL_GENERATION = "tpuctl-generation"
LABEL_MANAGED_BY = "managed-by"
LABEL_PROBE = "tpuctl-probe"
"""On a spot probe's node: the waiting request it probes for. The planner never adopts such a node as a slice."""


_EMAIL = r"^[a-z0-9][-a-z0-9]{4,62}@[a-z0-9][-a-z0-9.:]{0,100}\.gserviceaccount\.com$"
_NETWORK_PATH = r"^[a-z][-a-z0-9/]{0,200}[a-z0-9]$"


class NodePlacement(BaseModel):
    """Where every TPU VM is attached: identity, network and firewall tag (Terraform's outputs).

    The same for all deployments of one installation, so the adapters apply it to every create. Without a
    service account the VM runs as the project's default compute identity, which is far wider than the node
    needs; Terraform makes a narrow one (``tpu_vm_service_account``) and the firewall rule that admits the vLLM
    port targets ``tags`` only.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    service_account: str | None = Field(default=None, pattern=_EMAIL)
    network: str | None = Field(default=None, pattern=_NETWORK_PATH, description="VPC name or path.")
    subnetwork: str | None = Field(default=None, pattern=_NETWORK_PATH, description="Subnetwork name or path.")
    tags: tuple[str, ...] = Field(default=(), max_length=64)
    external_ips: bool = Field(default=True, description="False behind Cloud NAT (Terraform's network module).")

    def network_path(self, project: str) -> str | None:
        """A bare VPC name as ``projects/P/global/networks/NAME``; a path is kept as given."""
        if self.network is None or "/" in self.network:
            return self.network
        return f"projects/{project}/global/networks/{self.network}"

    def subnetwork_path(self, project: str, region: str) -> str | None:
        """A bare subnetwork name as ``projects/P/regions/R/subnetworks/NAME``; a path is kept as given."""
        if self.subnetwork is None or "/" in self.subnetwork:
            return self.subnetwork
        return f"projects/{project}/regions/{region}/subnetworks/{self.subnetwork}"


def accelerator_family(accelerator: str) -> str:
    """``v6e-4`` -> ``v6e``; ``v5litepod-8`` -> ``v5litepod``."""
    return accelerator.rsplit("-", 1)[0]


class ProvisionRequest(BaseModel):
    """Everything needed to ask for one slice in one zone and tier; ids are deterministic."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    resource_id: str = Field(pattern=r"^[a-z][-a-z0-9]{0,61}[a-z0-9]$")
    node_id: str = Field(pattern=r"^[a-z][-a-z0-9]{0,61}[a-z0-9]$")
    zone: str
    accelerator: str
    runtime_version: str = "v2-alpha-tpuv6e"
    tier: Tier
    request_id: str
    labels: dict[str, str] = Field(default_factory=dict)
    valid_until_s: int | None = Field(default=None, ge=60)
    max_run_s: int | None = Field(default=None, ge=60, le=7 * 24 * 3600)
    reservation_name: str | None = None
    startup_script: str = ""
    metadata: dict[str, str] = Field(default_factory=dict, repr=False, exclude=True)
    """Instance metadata beside the startup script (the deployment's event key): never printed or dumped."""
    service_account: str | None = None
    backend: Backend = Backend.TPU_API
    queued: bool = True
    """False: a bare node (the TPU API's ``nodes.create``), which never queues: with no capacity it fails at once
    (code 8). The spot probe asks this way; on Compute Engine every spot create is already one that never queues."""


class OperationStatus(BaseModel):
    """A long-running operation as last seen; the provisioner stores the name, never waits on it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    done: bool
    error_class: ErrorClass | None = None
    error_code: int | None = None
    error_message: str = ""
    error_scope: ErrorScope | None = None
    error_quota_id: str | None = None
    error_location: str | None = None
    """What the error is about, read by the adapter that classified it (``CloudError.scope`` & co.)."""


class ObservedResource(BaseModel):
    """A queued resource (or a bare node) as the provider reports it, with its node folded in."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str  # short id (the queued resource id, or the node id for bare nodes)
    zone: str
    backend: Backend = Backend.TPU_API
    kind: str = "queued_resource"  # queued_resource | node | instance
    state: QueuedResourceState = QueuedResourceState.UNKNOWN
    state_initiator: str = ""  # USER | SERVICE for SUSPENDING/SUSPENDED
    tier: Tier | None = None
    accelerator: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    node_id: str | None = None
    node_state: NodeState | None = None
    endpoint: str | None = None  # internal IP or host:port of the VM
    created_at: datetime | None = None
    termination_at: datetime | None = None
    error_class: ErrorClass | None = None
    error_message: str = ""

    @property
    def owned_by(self) -> str | None:
        """The deployment id in our label, or None when the resource is not ours."""
        return self.labels.get(LABEL_DEPLOYMENT)

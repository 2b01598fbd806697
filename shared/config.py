"""One frozen ``Settings`` read from the environment (prefix ``TPUCTL_``); nothing else reads os.environ."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.domain.cloud import NodePlacement
from shared.domain.startup_script import node_agent_bundle_problem, sha256_problem

__all__ = ["Settings", "get_settings"]

_TAG = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


class Settings(BaseSettings):
    """Controller configuration. Every field can be set as ``TPUCTL_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="TPUCTL_", frozen=True, extra="ignore")

    backend: Literal["local", "gcp"] = Field(
        default="local", description="local: SQLite, local bus, simulator. gcp: Firestore, Pub/Sub, TPU API."
    )
    project: str | None = Field(default=None, pattern=r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$", description="GCP project id.")
    region: str = Field(default="us-central1", description="Region of the functions, Scheduler jobs and topics.")
    data_dir: Path = Field(default=Path("var"), description="Where the embedded store, bus and secrets live.")
    tpu_endpoint: str | None = Field(
        default=None, description="Override the TPU API endpoint, e.g. http://127.0.0.1:8471 for the simulator."
    )
    clock: Literal["system", "simulator"] = Field(
        default="system",
        description="simulator: follow the virtual time of the TPU simulator at tpu_endpoint (the local cloud).",
    )
    emulators: bool = Field(
        default=False,
        description="With backend local: the store and the bus on the Firestore and Pub/Sub emulators "
        "(FIRESTORE_EMULATOR_HOST, PUBSUB_EMULATOR_HOST); secrets, scheduler and TPU stay local.",
    )
    firestore_database: str = Field(default="(default)", description="Firestore database id.")
    # Google API endpoints: unset means Google's own. The production-path twin points them at local stand-ins
    # (the Firestore and Pub/Sub emulators are found by their own variables, FIRESTORE_/PUBSUB_EMULATOR_HOST).
    secretmanager_endpoint: str | None = Field(
        default=None, pattern=r"^https?://", description="Secret Manager REST endpoint (default: Google's)."
    )
    scheduler_endpoint: str | None = Field(
        default=None, pattern=r"^https?://", description="Cloud Scheduler REST endpoint (default: Google's)."
    )
    logging_endpoint: str | None = Field(
        default=None,
        pattern=r"^https?://",
        description="Cloud Logging REST endpoint for the gateway's reads and the node agent's writes "
        "(default: Google's).",
    )
    storage_endpoint: str | None = Field(
        default=None,
        pattern=r"^https?://",
        description="Cloud Storage JSON API endpoint for debug bundles, written by the node agent and read by the "
        "gateway (default: Google's).",
    )
    trace_export: str = Field(
        default="none",
        pattern=r"^(none|stdout|cloud-trace|file:.+)$",
        description="Where OpenTelemetry spans go (shared/tracing.py): none, stdout, file:<path> or cloud-trace.",
    )
    monitoring_endpoint: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9.-]+:[0-9]{1,5}$",
        description="Cloud Monitoring gRPC endpoint (host:port) for the monitor's custom-metric writes "
        "(default: Google's).",
    )
    debug_bundle_bucket: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9][-_.a-z0-9]{1,220}[a-z0-9]$",
        description="Cloud Storage bucket the node agents keep debug bundles in (Terraform's debug_bundle_bucket "
        "output). Unset with backend gcp: no bundles are kept; the embedded default keeps them under data_dir.",
    )
    weights_cache_buckets: dict[str, str] = Field(
        default_factory=dict,
        description="The regional weights caches, JSON {region: bucket} (Terraform's weights_cache_buckets output): "
        "a TPU VM restores the model from its region's bucket and fills it on a miss. Empty: every boot downloads.",
    )
    weights_cache_cross_region: bool = Field(
        default=False,
        description="Whether a TPU VM in a region without a cache may read another region's (egress is billed).",
    )
    pubsub_iam_endpoint: str | None = Field(
        default=None,
        pattern=r"^https?://",
        description="Pub/Sub IAM REST endpoint for the grant on each node channel (default: Google's). The "
        "subscriptions themselves go through the Pub/Sub client (PUBSUB_EMULATOR_HOST in the twin).",
    )
    topic_commands: str = "tpuctl-commands"
    topic_ticks: str = "tpuctl-ticks"
    topic_events: str = "tpuctl-events"
    topic_node_tasks: str = "tpuctl-node-tasks"
    max_event_age_s: float = Field(default=3600.0, gt=0, description="Older commands are dropped with a log line.")
    command_claim_s: float = Field(
        default=600.0, gt=0, description="A command still 'accepted' this long after receipt may be retried."
    )
    command_ttl_days: int = Field(default=30, ge=1, description="How long the idempotency ledger keeps an entry.")
    sample_ttl_days: int = Field(default=14, ge=1, description="How long monitor samples are kept.")
    monitor_canary_interval_s: float = Field(
        default=300.0,
        ge=0,
        le=86400,
        description="A deployment with no traffic for this long gets one canary completion (one token) at most "
        "this often; a failed one makes it DEGRADED. 0 turns canaries off.",
    )
    monitor_telemetry_max_age_s: float = Field(
        default=180.0,
        gt=0,
        le=86400 * 7,
        description="A node agent's TPU telemetry reading older than this is left out of the monitor's sample.",
    )
    lease_ttl_s: float = Field(default=120.0, gt=0, description="Reconciler lease length.")
    spot_probe: bool = Field(
        default=False,
        description="Probe a waiting flex-start request with a spot create that never queues, to tell a wait for "
        "capacity from one held by quota (shared/domain/spot_probe.py; docs/deploy.md, 'The spot probe').",
    )
    boot_budget_s: float | None = Field(
        default=None,
        gt=0,
        le=86400,
        description="Boot budget given to new deployments (their health.boot_budget_s): how long a VM may take "
        "from ACTIVE to vLLM's first answer before the monitor calls it DOWN. Unset: the spec's default.",
    )
    node_task_timeout_s: float = Field(
        default=300.0, gt=0, le=86400, description="A node task (restart, log tail) unanswered this long has failed."
    )
    hf_token_secret: str = Field(default="tpuctl-hf-token", description="Secret name of the Hugging Face token.")
    vllm_api_key_secret: str = Field(default="tpuctl-vllm-api-key", description="Secret name of the vLLM API key.")
    event_key_secret: str = Field(
        default="tpuctl-event-key",
        description="Secret name of the controller key that node event keys derive from (read by the functions "
        "only; the provisioner creates it on first use).",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    # Where TPU VMs are attached (Terraform outputs tpu_vm_service_account and node_network).
    node_service_account: str | None = Field(
        default=None,
        description="Service account email every TPU VM runs as (default: the project's default); it is granted "
        "roles/pubsub.subscriber on its deployment's node channel only.",
    )
    # Prewarm builder VMs only (Terraform output tpu_builder_service_account): the one identity that may write the
    # shared compile cache, compile/ in the weights-cache buckets (shared/domain/compile_cache.py). Never a serving
    # VM's account.
    builder_service_account: str | None = Field(
        default=None,
        description="Service account email a prewarm builder VM runs as (tpuctl prewarm); it alone may write "
        "compile/ in the weights-cache buckets. Unset: no builder identity.",
    )
    node_network: str | None = Field(default=None, description="VPC name or path for TPU VMs (default: 'default').")
    node_subnetwork: str | None = Field(default=None, description="Subnetwork name or path for TPU VMs.")
    node_tags: str = Field(default="", description="Comma-separated network tags (the vLLM firewall rule's target).")
    node_external_ips: bool = Field(default=True, description="false when the VMs reach out through Cloud NAT.")
    # The node-agent bundle every TPU VM installs (Terraform output node_agent_bundle_uri, and its file's SHA-256).
    node_agent_bundle: str | None = Field(
        default=None, description="gs://BUCKET/node-agent/... URI of the node-agent bundle; unset: no node agent."
    )
    node_agent_bundle_sha256: str | None = Field(
        default=None, description="SHA-256 (64 hex) of that bundle; a VM refuses a bundle with another digest."
    )
    # How the gateway reaches a deployment's vLLM (docs/deploy.md, "Reaching a deployment from a workstation").
    endpoint_access: Literal["direct", "iap"] = Field(
        default="direct",
        description="direct: the recorded endpoint URL as it is (inside the VPC, the local cloud); "
        "iap: through an IAP TCP forwarding tunnel the gateway opens with gcloud (from a workstation).",
    )

    # Which tools the MCP gateway serves (docs/gateway.md, "Toolsets"); --toolset and --read-only override it.
    toolset: Literal["read-only", "operate", "all"] = Field(
        default="all",
        description="read-only: only the tools that change nothing; operate: all but the irrecoverable "
        "(tpu_control's delete); all: every tool.",
    )

    @field_validator("toolset", mode="before")
    @classmethod
    def _known_toolset(cls, value: object) -> object:
        if value not in ("read-only", "operate", "all"):
            raise ValueError(
                f"TPUCTL_TOOLSET: {str(value)[:40]!r} is not a toolset; use read-only, operate (all but delete) or all"
            )
        return value

    @field_validator("endpoint_access", mode="before")
    @classmethod
    def _known_endpoint_access(cls, value: object) -> object:
        if value not in ("direct", "iap"):
            raise ValueError(
                f"TPUCTL_ENDPOINT_ACCESS: {str(value)[:40]!r} is neither 'direct' nor 'iap'; use direct inside the "
                "VPC or with the local cloud, iap from a workstation"
            )
        return value

    @model_validator(mode="after")
    def _gcp_needs_project(self) -> Settings:
        if self.backend == "gcp" and not self.project:
            raise ValueError("TPUCTL_PROJECT: required when TPUCTL_BACKEND=gcp (set it to your project id)")
        if self.clock == "simulator" and not self.tpu_endpoint:
            raise ValueError("TPUCTL_CLOCK: 'simulator' needs TPUCTL_TPU_ENDPOINT (the simulator's http:// URL)")
        self.node_placement()  # a malformed email, network or tag fails at start-up, naming the variable
        self._check_builder_service_account()
        self._check_node_agent_bundle()
        return self

    def _check_builder_service_account(self) -> None:
        """An email as for the node account, and never the serving VMs' account (the builder writes compile/)."""
        account = self.builder_service_account
        if account is None:
            return
        try:
            NodePlacement(service_account=account)  # the same email pattern as TPUCTL_NODE_SERVICE_ACCOUNT
        except ValidationError as exc:
            raise ValueError(
                f"TPUCTL_BUILDER_SERVICE_ACCOUNT: not valid ({exc.errors()[0]['msg']}); use Terraform's output "
                "tpu_builder_service_account"
            ) from None
        if account == self.node_service_account:
            raise ValueError(
                "TPUCTL_BUILDER_SERVICE_ACCOUNT: the same account as TPUCTL_NODE_SERVICE_ACCOUNT; serving VMs must "
                "not write the compile cache, so use Terraform's output tpu_builder_service_account"
            )

    def _check_node_agent_bundle(self) -> None:
        """Both or neither; a bad URI or digest fails at start-up, not on a TPU VM minutes into its boot."""
        uri, digest = self.node_agent_bundle, self.node_agent_bundle_sha256
        if uri is None and digest is None:
            return
        fix = "set it from Terraform (output node_agent_bundle_uri, filesha256 of the bundle make package built)"
        problem = "missing" if uri is None else node_agent_bundle_problem(uri)
        if problem:
            raise ValueError(f"TPUCTL_NODE_AGENT_BUNDLE: {problem}; {fix}")
        problem = "missing" if digest is None else sha256_problem(digest)
        if problem:
            raise ValueError(f"TPUCTL_NODE_AGENT_BUNDLE_SHA256: {problem}; {fix}")

    def node_placement(self) -> NodePlacement:
        """The TPU VMs' identity and network, validated; errors name the ``TPUCTL_NODE_*`` variable to fix."""
        tags = tuple(tag.strip() for tag in self.node_tags.split(",") if tag.strip())
        for tag in tags:
            if not _TAG.match(tag):
                raise ValueError(f"TPUCTL_NODE_TAGS: {tag!r} is not a network tag (lower case, digits, '-'; 1-63)")
        try:
            return NodePlacement(
                service_account=self.node_service_account,
                network=self.node_network,
                subnetwork=self.node_subnetwork,
                tags=tags,
                external_ips=self.node_external_ips,
            )
        except ValidationError as exc:
            field = str(exc.errors()[0]["loc"][0])
            raise ValueError(
                f"TPUCTL_NODE_{field.upper()}: not valid ({exc.errors()[0]['msg']}); use Terraform's outputs "
                "tpu_vm_service_account / node_network"
            ) from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read once."""
    return Settings()

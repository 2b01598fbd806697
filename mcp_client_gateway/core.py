"""``GatewayCore``: every gateway capability once, over the ports; the MCP server and the CLI are thin shells.

The capabilities live in ``mcp_client_gateway.capabilities`` (deployments, operations, capacity, plans,
serving, logs, benchmarks, secrets), each a small class over the ports it needs; this facade builds them and
keeps the one set of methods both shells call.

Rules it keeps (docs/reference/DESIGN.md §1, docs/reference/reliability-security.md §10):

- Reads come from the state store (or a live call to the endpoint); nothing shells out here. With
  ``TPUCTL_ENDPOINT_ACCESS=iap`` the live calls go through the ``EndpointAccess`` port, whose adapter runs
  ``gcloud compute start-iap-tunnel`` (argv only, checked values, no secret) and hands back a loopback URL.
- Commands are validated with the wire models (``decode_message``), published with the deployment id as
  ordering key, and answered at once with the ``command_id``; the controller does the work.
- Destructive commands (delete, stop, restart, an update that replaces a running slice, overwriting the HF
  token) need ``confirm``: a token this gateway issued for that action on that target in its current state
  (``confirmation``). A call without one is refused, changes nothing, and its refusal carries the impact and
  a fresh token; the caller shows the impact to the user and passes the token once they agree (the MCP server
  mints it itself after an accepted elicitation; the CLI after its prompt or ``--yes``).
- Every argument is checked here against ``bounds`` (finite numbers in range, bounded strings, ids matching
  their pattern, closed sets), so the CLI gets the MCP schema's limits and the same clean errors.
- A problem the caller can fix raises :class:`GatewayError` naming the field and the fix; secrets are never
  returned, logged or put into an error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from mcp_client_gateway.capabilities.benchmarks import Benchmarks, headline_metrics
from mcp_client_gateway.capabilities.capacity import Capacity
from mcp_client_gateway.capabilities.common import (
    CommandPublisher,
    GatewayPorts,
    NodeTaskReader,
    Records,
    SecretRedaction,
    clock_warning,
)
from mcp_client_gateway.capabilities.debug import Debugging
from mcp_client_gateway.capabilities.deployments import Deployments
from mcp_client_gateway.capabilities.logs import MAX_LOG_CHARS, MetricsAndLogs
from mcp_client_gateway.capabilities.operations import Operations, deployment_stage
from mcp_client_gateway.capabilities.plans import Plans
from mcp_client_gateway.capabilities.secrets import Secrets
from mcp_client_gateway.capabilities.serving import Serving
from mcp_client_gateway.capabilities.timeline import Timelines, TimelineView
from mcp_client_gateway.confirmation import ConfirmationRequest, Confirmations
from mcp_client_gateway.errors import GatewayError
from mcp_client_gateway.models import (
    ArtifactsView,
    BenchmarkComparison,
    BenchmarkView,
    CommandAccepted,
    DebugBundleView,
    DeploymentDetail,
    DeploymentList,
    HealthReport,
    LogAnalysis,
    LogsView,
    MetricsView,
    OperationView,
    PlanView,
    QueryResult,
    SecretSaved,
    ServingLogsView,
    UpdateAccepted,
    ZonesView,
)
from shared.domain.zone_catalog import V6E_ZONES
from shared.ports import LogSeverity, LogSource
from shared.wiring import serving_environment

__all__ = [
    "V6E_ZONES",
    "ConfirmationRequest",
    "GatewayCore",
    "GatewayError",
    "GatewayPorts",
    "deployment_stage",
    "headline_metrics",
]


class GatewayCore:
    """The gateway's capabilities as plain methods returning output models (sync; each call is short)."""

    def __init__(self, ports: GatewayPorts) -> None:
        self.ports = ports
        self.settings = ports.settings
        records = Records(ports)
        publisher = CommandPublisher(ports)
        node_tasks = NodeTaskReader(ports)
        redaction = SecretRedaction(ports)
        confirmations = Confirmations(ports.clock)
        # the plan is the one the controller would deploy: same environment, same bytes
        self.plans = Plans(ports, records, publisher, lambda: serving_environment(self.settings))
        self.secrets = Secrets(ports, confirmations)
        self.deployments = Deployments(ports, records, publisher, self.plans, self.secrets, confirmations)
        self.operations = Operations(ports, records, publisher, node_tasks)
        self.capacity = Capacity(ports)
        self.serving = Serving(ports, records, redaction)
        self.logs = MetricsAndLogs(ports, records, publisher, node_tasks, redaction, self.serving)
        self.benchmarks = Benchmarks(ports, records, publisher)
        self.debugging = Debugging(ports, records, publisher, node_tasks, redaction)
        self.timelines = Timelines(ports, records)

    @property
    def tail_wait_s(self) -> float:
        """How long tail_serving_logs waits for the node's answer (tests shorten it)."""
        return self.logs.tail_wait_s

    @tail_wait_s.setter
    def tail_wait_s(self, seconds: float) -> None:
        self.logs.tail_wait_s = seconds

    # ------------------------------------------------------------------ deployments (commands)

    def create_deployment(
        self,
        *,
        deployment_id: str,
        model: str,
        accelerator: str,
        zones: Sequence[str] | None = None,
        tiers: Sequence[str] | None = None,
        hedge: int | None = None,
        ttl_hours: float | None = None,
        budget_usd: float | None = None,
        idle_minutes: int | None = None,
        max_model_len: int | None = None,
        kv_cache_dtype: str | None = None,
        dtype: str | None = None,
        reservation_name: str | None = None,
        command_id: str | None = None,
        valid_until_minutes: int | None = None,
        alternative_accelerators: Sequence[str] | None = None,
        book_calendar: bool = False,
        confirm: str | None = None,
        prewarm: bool = False,
        preset: str | None = None,
    ) -> CommandAccepted:
        """Validate a deployment spec, check it can work, and publish ``deployment.create``; no zones: the
        plan's search scope (where the slice, or an alternative slice, fits the live quota,
        ``Capacity.search_scope``); ``preset``: a tune run's id, whose verified serving flags the spec takes."""
        if zones is None:
            zones = self.capacity.ladder_scope(accelerator, alternative_accelerators, tiers).zones
        accepted = self.deployments.create_deployment(
            deployment_id=deployment_id,
            model=model,
            accelerator=accelerator,
            zones=zones,
            tiers=tiers,
            hedge=hedge,
            ttl_hours=ttl_hours,
            budget_usd=budget_usd,
            idle_minutes=idle_minutes,
            max_model_len=max_model_len,
            kv_cache_dtype=kv_cache_dtype,
            dtype=dtype,
            reservation_name=reservation_name,
            command_id=command_id,
            valid_until_minutes=valid_until_minutes,
            alternative_accelerators=alternative_accelerators,
            book_calendar=book_calendar,
            confirm=confirm,
            prewarm=prewarm,
            preset=preset,
        )
        warning = clock_warning(self.ports, ttl_hours)
        return accepted.model_copy(update={"warnings": [warning]}) if warning else accepted

    def update_confirmation(
        self, deployment_id: str, changes: Mapping[str, Any], *, clear: Sequence[str] = ()
    ) -> ConfirmationRequest | None:
        """The confirmation an update needs (it replaces a running slice), or None; changes nothing."""
        return self.deployments.update_confirmation(deployment_id, changes, clear=clear)

    def update_deployment(
        self,
        deployment_id: str,
        changes: Mapping[str, Any],
        *,
        clear: Sequence[str] = (),
        confirm: str | None = None,
        command_id: str | None = None,
    ) -> UpdateAccepted:
        """Publish ``deployment.update`` with only ``changes`` applied to the current spec; confirmed when it
        replaces a running slice."""
        return self.deployments.update_deployment(
            deployment_id, changes, clear=clear, confirm=confirm, command_id=command_id
        )

    def confirmation_text(self, action: Literal["delete", "stop", "restart"], deployment_id: str) -> str:
        """What a destructive action will do to this deployment, for the user to confirm (raises when it cannot run)."""
        return self.deployments.confirmation_text(action, deployment_id)

    def request_confirmation(
        self, action: Literal["delete", "stop", "restart"], deployment_id: str
    ) -> ConfirmationRequest:
        """The impact of a destructive action and the short-lived token that confirms exactly it; changes nothing."""
        return self.deployments.request_confirmation(action, deployment_id)

    def delete_deployment(self, deployment_id: str, *, confirm: str | None) -> CommandAccepted:
        """Publish ``deployment.delete`` once ``confirm`` is a token for deleting this deployment as it is now."""
        return self.deployments.delete_deployment(deployment_id, confirm=confirm)

    def stop_deployment(self, deployment_id: str, *, confirm: str | None) -> CommandAccepted:
        """Publish ``deployment.stop``: release the TPU, keep the record (start brings it back). Confirmed."""
        return self.deployments.stop_deployment(deployment_id, confirm=confirm)

    def start_deployment(self, deployment_id: str) -> CommandAccepted:
        """Publish ``deployment.start`` for a stopped deployment."""
        return self.deployments.start_deployment(deployment_id)

    def restart_serving(
        self, deployment_id: str, *, confirm: str | None, reason: str = "user_request"
    ) -> CommandAccepted:
        """Publish ``serving.restart``: the node restarts the vLLM container (in-flight requests fail). Confirmed."""
        return self.deployments.restart_serving(deployment_id, confirm=confirm, reason=reason)

    # ------------------------------------------------------------------ deployments (reads)

    def list_deployments(
        self, *, include_deleted: bool = False, phase: str | None = None, offset: int = 0, limit: int = 20
    ) -> DeploymentList:
        """Deployments newest first, with the resources the controller last observed."""
        return self.operations.list_deployments(
            include_deleted=include_deleted, phase=phase, offset=offset, limit=limit
        )

    def get_deployment(self, deployment_id: str) -> DeploymentDetail:
        """The status dashboard of one deployment."""
        return self.operations.get_deployment(deployment_id)

    def timeline(self, deployment_id: str, *, hours: float = 24.0) -> TimelineView:
        return self.timelines.timeline(deployment_id, hours=hours)

    def get_operation(self, command_id: str) -> OperationView:
        """Where a command is: on the bus, in the ledger, and the phase of its deployment."""
        return self.operations.get_operation(command_id)

    # ------------------------------------------------------------------ zones and capacity memory

    def list_zones(self, *, accelerator: str = "v6e-4", tier: str | None = None, live_quota: bool = True) -> ZonesView:
        """Zones with slice prices per tier, what the capacity search remembers, and (live) the quota headroom."""
        return self.capacity.list_zones(accelerator=accelerator, tier=tier, live_quota=live_quota)

    # ------------------------------------------------------------------ serving plan and artefacts

    def plan(
        self,
        *,
        model: str,
        accelerator: str,
        zones: Sequence[str] | None = None,
        tiers: Sequence[str] | None = None,
        max_model_len: int | None = None,
        kv_cache_dtype: str | None = None,
        dtype: str | None = None,
        gpu_memory_utilization: float | None = None,
        ttl_hours: float | None = None,
        tokens_per_second: float | None = None,
        alternative_accelerators: Sequence[str] | None = None,
    ) -> PlanView:
        """Capacity verdict and HBM table, the vLLM launch, and prices per region and tier (read-only)."""
        return self.plans.plan(
            alternative_accelerators=alternative_accelerators,
            model=model,
            accelerator=accelerator,
            zones=zones,
            tiers=tiers,
            max_model_len=max_model_len,
            kv_cache_dtype=kv_cache_dtype,
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            ttl_hours=ttl_hours,
            tokens_per_second=tokens_per_second,
        )

    def render_artifacts(
        self,
        *,
        deployment_id: str | None = None,
        model: str | None = None,
        accelerator: str | None = None,
        kind: Literal["startup_script", "gke_manifest", "both"] = "both",
    ) -> ArtifactsView:
        """The startup script and GKE manifest of a stored deployment (or of a model on a slice)."""
        return self.plans.render_artifacts(deployment_id=deployment_id, model=model, accelerator=accelerator, kind=kind)

    # ------------------------------------------------------------------ the model (live calls)

    def query_model(
        self,
        deployment_id: str,
        *,
        prompt: str,
        max_tokens: int = 256,
        temperature: float = 0.0,
        system_prompt: str | None = None,
    ) -> QueryResult:
        """One streamed chat completion, timed: TTFT at the first content chunk, tokens from usage."""
        return self.serving.query_model(
            deployment_id, prompt=prompt, max_tokens=max_tokens, temperature=temperature, system_prompt=system_prompt
        )

    def check_health(self, deployment_id: str) -> HealthReport:
        """Deep health: /health, /v1/models, /version, a one-token completion, and the monitor's phase."""
        return self.serving.check_health(deployment_id)

    # ------------------------------------------------------------------ metrics and logs

    def get_metrics(self, deployment_id: str, *, window_minutes: int = 60) -> MetricsView:
        """Totals, window figures from counter deltas, the latest SLIs and the window's samples."""
        return self.logs.get_metrics(deployment_id, window_minutes=window_minutes)

    def get_logs(
        self,
        *,
        deployment_id: str | None = None,
        source: LogSource = "any",
        min_severity: LogSeverity = "DEFAULT",
        minutes: int = 60,
        limit: int = 50,
        max_chars: int = MAX_LOG_CHARS,
        include_probes: bool = False,
    ) -> LogsView:
        """Recent log lines, bounded, sanitised and labelled as untrusted; probe access lines left out by default."""
        return self.logs.get_logs(
            deployment_id=deployment_id,
            source=source,
            min_severity=min_severity,
            minutes=minutes,
            limit=limit,
            max_chars=max_chars,
            include_probes=include_probes,
        )

    def analyze_logs(
        self, deployment_id: str, *, minutes: int = 60, min_severity: LogSeverity = "WARNING"
    ) -> LogAnalysis:
        """The deployed model summarises recent logs, which it receives as quoted data, never as instructions."""
        return self.logs.analyze_logs(deployment_id, minutes=minutes, min_severity=min_severity)

    def tail_serving_logs(self, deployment_id: str, *, lines: int = 100, task_id: str | None = None) -> ServingLogsView:
        """Ask the node for the vLLM container's newest log lines and wait a few seconds for the answer;
        with ``task_id``, read the answer to an earlier ask instead (nothing is published)."""
        return self.logs.tail_serving_logs(deployment_id, lines=lines, task_id=task_id)

    def debug_bundle(self, deployment_id: str, *, capture: bool = False, task_id: str | None = None) -> DebugBundleView:
        """A debug bundle of the serving engine (stacks, log tail, metrics, tpu-info, boot): with ``capture``, ask
        the node for one now and wait a few seconds; with ``task_id``, the one that task kept; else the newest."""
        return self.debugging.debug_bundle(deployment_id, capture=capture, task_id=task_id)

    # ------------------------------------------------------------------ benchmarks

    def run_benchmark(
        self,
        deployment_id: str,
        *,
        benchmark: dict[str, Any] | None = None,
        command_id: str | None = None,
    ) -> CommandAccepted:
        """Publish ``benchmark.run``; the command id is the run id."""
        return self.benchmarks.run_benchmark(deployment_id, benchmark=benchmark, command_id=command_id)

    def get_benchmark(self, run_id: str) -> BenchmarkView:
        """One run with its result and the change from the previous run of the same deployment."""
        return self.benchmarks.get_benchmark(run_id)

    def compare_benchmarks(
        self, *, deployment_id: str | None = None, model: str | None = None, limit: int = 20
    ) -> BenchmarkComparison:
        """Runs side by side, newest first, with the best run per headline metric."""
        return self.benchmarks.compare_benchmarks(deployment_id=deployment_id, model=model, limit=limit)

    # ------------------------------------------------------------------ secrets

    def hf_token_exists(self) -> bool:
        """Whether a Hugging Face token is stored (its value is read only to register it for redaction)."""
        return self.secrets.hf_token_exists()

    def hf_token_confirmation(self, token: str) -> ConfirmationRequest | None:
        """The confirmation saving ``token`` needs (it replaces a different stored one), or None; changes nothing."""
        return self.secrets.hf_token_confirmation(token)

    def save_hf_token(self, token: str, *, confirm: str | None = None) -> SecretSaved:
        """Store the Hugging Face token as a new secret version; replacing a different one needs ``confirm``,
        a token from :meth:`hf_token_confirmation` (or from the refusal of an unconfirmed call)."""
        return self.secrets.save_hf_token(token, confirm=confirm)

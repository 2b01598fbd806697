"""Deployment commands: create, delete, stop, start, restart serving. Each is validated with the wire models
and published at once (the controller does the work); delete, stop and restart need a confirmation token
bound to the deployment as it is now."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from mcp_client_gateway import bounds
from mcp_client_gateway.capabilities.checks import (
    DESTRUCTIVE,
    KV_CACHE_DTYPES,
    WEIGHT_DTYPES,
    checked_reservation_name,
    optional,
    slice_arguments,
)
from mcp_client_gateway.capabilities.common import CommandPublisher, GatewayPorts, Records, hourly_usd
from mcp_client_gateway.capabilities.plans import Plans, fit_fixes
from mcp_client_gateway.capabilities.secrets import Secrets
from mcp_client_gateway.confirmation import ConfirmAction, ConfirmationRequest, Confirmations
from mcp_client_gateway.errors import GatewayError
from mcp_client_gateway.models import CommandAccepted
from shared.domain.models import DeploymentRecord, Desired, Phase

__all__ = ["Deployments"]

_ENDPOINT_PHASES = frozenset({Phase.SERVING, Phase.DEGRADED, Phase.STALLED, Phase.DOWN, Phase.COMPILING, Phase.BOOTING})


class Deployments:
    """Commands that change a deployment; each answers at once with the ``command_id``."""

    def __init__(
        self,
        ports: GatewayPorts,
        records: Records,
        publisher: CommandPublisher,
        plans: Plans,
        secrets: Secrets,
        confirmations: Confirmations,
    ) -> None:
        self.ports = ports
        self.records = records
        self.publisher = publisher
        self.plans = plans
        self.secrets = secrets
        self.confirmations = confirmations

    def create_deployment(
        self,
        *,
        deployment_id: str,
        model: str,
        accelerator: str,
        zones: Sequence[str],
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
    ) -> CommandAccepted:
        """Validate a deployment spec, check it can work, and publish ``deployment.create``."""
        deployment_id = bounds.deployment_id(deployment_id)
        model, accelerator, zones, tiers = slice_arguments(model, accelerator, zones, tiers)
        hedge = optional(bounds.integer, "hedge", hedge, bounds.HEDGE)
        ttl_hours = optional(bounds.number, "ttl_hours", ttl_hours, bounds.TTL_HOURS, low_open=True)
        budget_usd = optional(bounds.number, "budget_usd", budget_usd, bounds.BUDGET_USD, low_open=True)
        idle_minutes = optional(bounds.integer, "idle_minutes", idle_minutes, bounds.IDLE_MINUTES)
        max_model_len = optional(bounds.integer, "max_model_len", max_model_len, bounds.MAX_MODEL_LEN)
        kv_cache_dtype = optional(bounds.choice, "kv_cache_dtype", kv_cache_dtype, KV_CACHE_DTYPES)
        dtype = optional(bounds.choice, "dtype", dtype, WEIGHT_DTYPES)
        valid_until_minutes = optional(
            bounds.integer, "valid_until_minutes", valid_until_minutes, bounds.VALID_UNTIL_MINUTES
        )
        if reservation_name is not None:
            reservation_name = checked_reservation_name(reservation_name)
        spec = _create_spec(
            {"deployment_id": deployment_id, "model": model, "accelerator": accelerator, "zones": zones},
            {
                "tiers": tiers or None,
                "hedge": hedge,
                "ttl_hours": ttl_hours,
                "budget_usd": budget_usd,
                "idle_minutes": idle_minutes,
                "reservation_name": reservation_name,
                "valid_until_minutes": valid_until_minutes,
            },
            {"max_model_len": max_model_len, "kv_cache_dtype": kv_cache_dtype, "dtype": dtype},
            self.ports.settings.boot_budget_s,
        )
        command_id = self.publisher.command_id(command_id)
        duplicate = self.publisher.duplicate(command_id, "deployment.create", deployment_id)
        if duplicate is not None:
            return duplicate
        message = self.publisher.validated(
            {"kind": "deployment.create", "deployment_id": deployment_id, "spec": spec}, command_id
        )
        self._check_can_create(deployment_id, model, accelerator, message.spec)
        self._check_hf_token_for(model)
        return self.publisher.publish(
            message, "Poll tpu_get_operation with this command_id; capacity search can take minutes."
        )

    def _check_can_create(self, deployment_id: str, model: str, accelerator: str, spec: Any) -> None:
        """Refuse a create whose id is taken or whose model does not fit the slice."""
        existing = self.ports.store.get_deployment(deployment_id)
        if existing is not None and existing.status.phase is not Phase.DELETED:
            raise GatewayError(
                "already_exists",
                "deployment_id",
                f"'{deployment_id}' already exists (phase {existing.status.phase.value})",
                "choose another deployment_id, or delete this one first with tpu_delete_deployment",
            )
        plan = self.plans.serving_plan(spec)
        if not plan.fits:
            raise GatewayError(
                "failed_precondition",
                "accelerator",
                f"{model} does not fit {accelerator}: " + "; ".join(plan.capacity.reasons),
                fit_fixes(plan) + " (tpu_plan_deployment shows the table)",
            )

    def confirmation_text(self, action: Literal["delete", "stop", "restart"], deployment_id: str) -> str:
        """What a destructive action will do to this deployment, for the user to confirm (raises when it cannot run)."""
        action = bounds.choice("action", action, DESTRUCTIVE)  # type: ignore[assignment]
        return self._impact(action, self.records.get(deployment_id))

    def request_confirmation(
        self, action: Literal["delete", "stop", "restart"], deployment_id: str
    ) -> ConfirmationRequest:
        """The impact of a destructive action and the short-lived token that confirms exactly it; changes nothing.

        For callers that ask the user themselves (the CLI's prompt, the MCP server after an accepted
        elicitation). Raises like the action would when it cannot run (not found, no node to restart).
        """
        action = bounds.choice("action", action, DESTRUCTIVE)  # type: ignore[assignment]
        record = self.records.get(deployment_id)
        return self.confirmations.issue(
            action,
            record.deployment_id,
            self._deployment_state(record),
            self._impact(action, record),
            generation=record.generation,
        )

    def delete_deployment(self, deployment_id: str, *, confirm: str | None) -> CommandAccepted:
        """Publish ``deployment.delete`` once ``confirm`` is a token for deleting this deployment as it is now."""
        record = self.records.get(deployment_id)
        self._confirm_deployment(confirm, "delete", record)
        message = self.publisher.validated(
            {"kind": "deployment.delete", "deployment_id": deployment_id, "expected_generation": record.generation}
        )
        return self.publisher.publish(message, "Poll tpu_get_operation; deletion is done when the phase is DELETED.")

    def stop_deployment(self, deployment_id: str, *, confirm: str | None) -> CommandAccepted:
        """Publish ``deployment.stop``: release the TPU, keep the record (start brings it back). Confirmed."""
        record = self.records.get(deployment_id)
        self._confirm_deployment(confirm, "stop", record)
        message = self.publisher.validated({"kind": "deployment.stop", "deployment_id": deployment_id})
        return self.publisher.publish(message, "Poll tpu_get_operation; stopped when the phase is STOPPED.")

    def start_deployment(self, deployment_id: str) -> CommandAccepted:
        """Publish ``deployment.start`` for a stopped deployment."""
        record = self.records.get(deployment_id)
        if record.desired is not Desired.STOPPED and record.status.phase is not Phase.STOPPED:
            raise GatewayError(
                "failed_precondition",
                "deployment_id",
                f"'{deployment_id}' is not stopped (phase {record.status.phase.value}, desired {record.desired.value})",
                "only a stopped deployment can be started; use tpu_get_deployment to see its state",
            )
        message = self.publisher.validated({"kind": "deployment.start", "deployment_id": deployment_id})
        return self.publisher.publish(message, "Poll tpu_get_operation; start searches for capacity again.")

    def restart_serving(
        self, deployment_id: str, *, confirm: str | None, reason: str = "user_request"
    ) -> CommandAccepted:
        """Publish ``serving.restart``: the node restarts the vLLM container (in-flight requests fail). Confirmed."""
        reason = bounds.text("reason", reason, max_chars=200, min_chars=0, fix="a short reason, e.g. user_request")
        record = self.records.get(deployment_id)
        self._confirm_deployment(confirm, "restart", record)
        message = self.publisher.validated(
            {"kind": "serving.restart", "deployment_id": deployment_id, "reason": reason}
        )
        return self.publisher.publish(
            message, "Poll tpu_get_operation; serving resumes when the phase is SERVING again."
        )

    def _impact(self, action: ConfirmAction, record: DeploymentRecord) -> str:
        """What ``action`` will do to ``record``'s deployment; raises when it cannot run."""
        deployment_id = record.deployment_id
        if action == "delete":
            hourly = hourly_usd(record)
            cost = f", about ${hourly:.2f}/h" if hourly else ""
            count = len(record.status.resources)
            return (
                f"deleting '{deployment_id}' force-deletes its {count} TPU resource(s){cost} and its record; "
                "it cannot be undone"
            )
        if record.desired is Desired.ABSENT:
            raise GatewayError("failed_precondition", "deployment_id", f"'{deployment_id}' is being deleted", "")
        if action == "stop":
            return (
                f"stopping '{deployment_id}' releases its TPU (phase {record.status.phase.value}); serving stops and "
                "a later start has to find capacity again"
            )
        if record.status.phase not in _ENDPOINT_PHASES:
            raise GatewayError(
                "failed_precondition",
                "deployment_id",
                f"'{deployment_id}' has no running node (phase {record.status.phase.value})",
                "restart works once the node is up (BOOTING or later); see tpu_get_deployment",
            )
        return (
            f"restarting vLLM on '{deployment_id}' drops in-flight requests and serving pauses until the model "
            "is loaded again"
        )

    def _deployment_state(self, record: DeploymentRecord) -> str:
        """What a confirmation of this deployment is bound to: its generation, desired state and incarnation
        (not its status, which the controller rewrites every tick)."""
        digest = self.confirmations.fingerprint(
            str(record.generation), record.desired.value, record.created_at.isoformat()
        )
        return f"g{record.generation}-{digest}"

    def _confirm_deployment(self, confirm: str | None, action: ConfirmAction, record: DeploymentRecord) -> None:
        """Return only when ``confirm`` is a live token for ``action`` on this deployment as it is now.

        Without one, raise the refusal that carries the impact and a fresh token (nothing was changed).
        """
        impact = self._impact(action, record)  # an action that cannot run is refused as such first
        state = self._deployment_state(record)
        if confirm is None or confirm == "":
            request = self.confirmations.issue(
                action, record.deployment_id, state, impact, generation=record.generation
            )
            raise self.confirmations.refusal(request)
        self.confirmations.check(
            confirm,
            action,
            record.deployment_id,
            state,
            changed=f"now generation {record.generation}, desired {record.desired.value}",
        )

    def _check_hf_token_for(self, model: str) -> None:
        if self.ports.settings.backend != "gcp" or model == "tiny-llama":
            return
        if not self.secrets.hf_token_exists():
            raise GatewayError(
                "failed_precondition",
                "model",
                f"'{model}' downloads gated weights and no Hugging Face token is stored",
                "save one first with tpu_save_hf_token (or `tpuctl token set`)",
            )


def _create_spec(
    required: dict[str, Any], chosen: dict[str, Any], serving: dict[str, Any], boot_budget_s: float | None
) -> dict[str, Any]:
    """The ``deployment.create`` spec: the required fields, the chosen optional ones, the serving knobs given,
    and the installation's default boot budget (``TPUCTL_BOOT_BUDGET_S``)."""
    spec = dict(required)
    spec.update({key: value for key, value in chosen.items() if value is not None})
    if any(value is not None for value in serving.values()):
        spec["serving"] = {key: value for key, value in serving.items() if value is not None}
    if boot_budget_s is not None:  # the installation's default (TPUCTL_BOOT_BUDGET_S)
        spec["health"] = {"boot_budget_s": boot_budget_s}
    return spec

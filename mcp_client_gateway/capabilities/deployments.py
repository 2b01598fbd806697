"""Deployment commands: create, update, delete, stop, start, restart serving. Each is validated with the wire
models and published at once (the controller does the work); delete, stop and restart need a confirmation token
bound to the deployment as it is now, and so does an update that replaces a running slice.

Which updates replace a slice: a change of when the deployment ends or how it is judged (TTL, budget, idle rules,
health thresholds) applies to the running generation and keeps its slice (``shared.domain.spec_change``); any other
change makes a new generation (``Provisioner.update``), and each generation runs on a slice of its own
(``planner.reconcile_present``: the old generation's slice serves until the new one does, then it is deleted). So
such a change to a deployment with a slice that is up or being provisioned is confirmed; a stopped deployment, or
one still waiting for capacity, has nothing to replace (waiting requests are simply asked again)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from mcp_client_gateway import bounds
from mcp_client_gateway.capabilities.benchmarks import preset_serving
from mcp_client_gateway.capabilities.checks import (
    DESTRUCTIVE,
    KV_CACHE_DTYPES,
    TIERS,
    WEIGHT_DTYPES,
    checked_reservation_name,
    optional,
    slice_arguments,
)
from mcp_client_gateway.capabilities.common import CommandPublisher, GatewayPorts, Records, hourly_usd, pricing
from mcp_client_gateway.capabilities.plans import Plans, checked_alternatives, fit_fixes
from mcp_client_gateway.capabilities.secrets import Secrets
from mcp_client_gateway.confirmation import ConfirmAction, ConfirmationRequest, Confirmations
from mcp_client_gateway.errors import Fix, GatewayError, ToolRef, Words
from mcp_client_gateway.models import CommandAccepted, SpecChange, UpdateAccepted
from shared.domain.models import (
    DeploymentRecord,
    DeploymentSpec,
    Desired,
    Phase,
    QueuedResourceState,
    ResourceRef,
    Tier,
    region_of,
)
from shared.domain.prewarm import PREWARM_TTL_HOURS
from shared.domain.spec_change import needs_new_generation

__all__ = ["CLEARABLE", "UPDATABLE", "Deployments", "describe_changes"]

UPDATABLE: tuple[str, ...] = (
    "accelerator",
    "zones",
    "tiers",
    "hedge",
    "ttl_hours",
    "budget_usd",
    "idle_minutes",
    "max_model_len",
    "kv_cache_dtype",
    "dtype",
)
"""The spec fields an update may change, named as the tool's parameters."""
CLEARABLE: tuple[str, ...] = ("ttl_hours", "budget_usd", "idle_minutes", "max_model_len")
"""The optional fields an update may unset (no TTL, no budget, never idle, the preset's context)."""
_SERVING = frozenset({"max_model_len", "kv_cache_dtype", "dtype"})
_SLICE_STATES = frozenset({QueuedResourceState.ACTIVE, QueuedResourceState.PROVISIONING})

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
        alternative_accelerators: Sequence[str] | None = None,
        book_calendar: bool = False,
        confirm: str | None = None,
        prewarm: bool = False,
        preset: str | None = None,
    ) -> CommandAccepted:
        """Validate a deployment spec, check it can work, and publish ``deployment.create``; with ``book_calendar``
        only once ``confirm`` is a token for booking exactly the window the plan quotes (``capabilities.calendar``);
        with ``prewarm`` a builder that fills the compile cache and ends (``shared.domain.prewarm``; its TTL a
        backstop, ``PREWARM_TTL_HOURS`` unless given); with ``preset`` a tune's verified flags (``_serving``)."""
        deployment_id = bounds.deployment_id(deployment_id)
        model, accelerator, zones, tiers = slice_arguments(model, accelerator, zones, tiers)
        alternatives = checked_alternatives(accelerator, alternative_accelerators)
        hedge = optional(bounds.integer, "hedge", hedge, bounds.HEDGE)
        ttl_hours = optional(bounds.number, "ttl_hours", ttl_hours, bounds.TTL_HOURS, low_open=True)
        budget_usd = optional(bounds.number, "budget_usd", budget_usd, bounds.BUDGET_USD, low_open=True)
        idle_minutes = optional(bounds.integer, "idle_minutes", idle_minutes, bounds.IDLE_MINUTES)
        given = {"max_model_len": max_model_len, "kv_cache_dtype": kv_cache_dtype, "dtype": dtype}
        serving = self._serving(given, preset, (model, accelerator), alternatives)
        if bounds.flag("prewarm", prewarm) and ttl_hours is None:
            ttl_hours = PREWARM_TTL_HOURS
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
                "alternative_accelerators": list(alternatives) or None,
                "prewarm": prewarm or None,
            },
            serving,
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
        if message.spec.prewarm:
            self._check_prewarm_caches(message.spec.zones)
        self.plans.check_alternatives(message.spec)  # each alternative fits at the chosen context, else refused
        self._check_hf_token_for(model)
        if bounds.flag("book_calendar", book_calendar):
            booked = {**spec, **self._calendar_terms(message.spec, confirm)}
            message = self.publisher.validated(
                {"kind": "deployment.create", "deployment_id": deployment_id, "spec": booked}, command_id
            )
        return self.publisher.publish(
            message, f"Poll tpu_status(command_id='{message.command_id}'); capacity search can take minutes."
        )

    def _calendar_terms(self, spec: DeploymentSpec, confirm: str | None) -> dict[str, Any]:
        """The spec fields of a confirmed calendar booking: the window, its reservation first among the tiers."""
        if spec.reservation_name is not None:
            raise GatewayError(
                "invalid_argument",
                "reservation_name",
                "is set together with book_calendar",
                "leave reservation_name out: the booked window's reservation is named for you",
            )
        calendar = self.plans.calendar
        view = calendar.quote(spec.accelerator, spec.chips, spec.zones, spec.ttl_hours)
        window, name = calendar.booking(spec.deployment_id, view)
        state = calendar.state(view)
        if confirm is None or confirm == "":
            impact = calendar.impact(spec.deployment_id, spec.accelerator, view)
            raise self.confirmations.refusal(
                self.confirmations.issue("book_calendar", spec.deployment_id, state, impact)
            )
        changed = "the quoted window or its price changed; look at the new quote"
        self.confirmations.check(confirm, "book_calendar", spec.deployment_id, state, changed=changed)
        tiers = [Tier.RESERVATION.value, *(tier.value for tier in spec.tiers if tier is not Tier.RESERVATION)]
        return {"calendar": window.model_dump(mode="json"), "reservation_name": name, "tiers": tiers[:4]}

    def _check_prewarm_caches(self, zones: Sequence[str]) -> None:
        """A prewarm fills its region's cache bucket: every zone it may land in needs one, or it would pay a boot
        for nothing (``shared.domain.compile_cache``)."""
        buckets = self.ports.settings.weights_cache_buckets
        for index, zone in enumerate(zones):
            if region_of(zone) not in buckets:
                with_cache = sorted(buckets) or ["none: add regions to Terraform's weights_cache_regions"]
                raise GatewayError(
                    "invalid_argument",
                    f"zones[{index}]",
                    f"{zone}'s region has no cache bucket for a prewarm to fill",
                    f"prewarm only in zones of regions with a cache ({', '.join(with_cache)})",
                )

    def _serving(
        self, given: dict[str, Any], preset: str | None, slice_of: tuple[str, str], alternatives: Sequence[str]
    ) -> dict[str, Any]:
        """The serving options given, checked, with the verified preset of a tune run in them when ``preset`` names
        one: the same model and slice (``slice_of``) only (``benchmarks.preset_serving``)."""
        serving = {
            "max_model_len": optional(bounds.integer, "max_model_len", given["max_model_len"], bounds.MAX_MODEL_LEN),
            "kv_cache_dtype": optional(bounds.choice, "kv_cache_dtype", given["kv_cache_dtype"], KV_CACHE_DTYPES),
            "dtype": optional(bounds.choice, "dtype", given["dtype"], WEIGHT_DTYPES),
        }
        if preset is None:
            return serving
        model, accelerator = slice_of
        if alternatives:
            raise GatewayError(
                "invalid_argument",
                "alternative_accelerators",
                f"a preset is verified on one slice ({accelerator}), not on alternatives",
                "leave alternative_accelerators out to deploy with the preset",
            )
        return preset_serving(self.ports.store, preset, model, accelerator, serving)

    def _check_can_create(self, deployment_id: str, model: str, accelerator: str, spec: Any) -> None:
        """Refuse a create whose id is taken or whose model does not fit the slice."""
        existing = self.ports.store.get_deployment(deployment_id)
        if existing is not None and existing.status.phase is not Phase.DELETED:
            raise GatewayError(
                "already_exists",
                "deployment_id",
                f"'{deployment_id}' already exists (phase {existing.status.phase.value})",
                "choose another deployment_id, or delete this one first with tpu_control(action='delete')",
            )
        plan = self.plans.serving_plan(spec)
        if not plan.fits:
            raise GatewayError(
                "failed_precondition",
                "accelerator",
                f"{model} does not fit {accelerator}: " + "; ".join(plan.capacity.reasons),
                fit_fixes(plan) + " (tpu_plan shows the table)",
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
        return self.publisher.publish(
            message, f"Poll tpu_status(command_id='{message.command_id}'); deletion is done when the phase is DELETED."
        )

    def stop_deployment(self, deployment_id: str, *, confirm: str | None) -> CommandAccepted:
        """Publish ``deployment.stop``: release the TPU, keep the record (start brings it back). Confirmed."""
        record = self.records.get(deployment_id)
        self._confirm_deployment(confirm, "stop", record)
        message = self.publisher.validated({"kind": "deployment.stop", "deployment_id": deployment_id})
        return self.publisher.publish(
            message, f"Poll tpu_status(command_id='{message.command_id}'); stopped when the phase is STOPPED."
        )

    def start_deployment(self, deployment_id: str) -> CommandAccepted:
        """Publish ``deployment.start`` for a stopped deployment."""
        record = self.records.get(deployment_id)
        if record.desired is not Desired.STOPPED and record.status.phase is not Phase.STOPPED:
            raise GatewayError(
                "failed_precondition",
                "deployment_id",
                f"'{deployment_id}' is not stopped (phase {record.status.phase.value}, desired {record.desired.value})",
                f"only a stopped deployment can be started; use tpu_status(deployment_id='{deployment_id}') to see its "
                "state",
            )
        message = self.publisher.validated({"kind": "deployment.start", "deployment_id": deployment_id})
        return self.publisher.publish(
            message, f"Poll tpu_status(command_id='{message.command_id}'); start searches for capacity again."
        )

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
            message,
            f"Poll tpu_status(command_id='{message.command_id}'); serving resumes when the phase is SERVING again.",
        )

    def update_confirmation(
        self, deployment_id: str, changes: Mapping[str, Any], *, clear: Sequence[str] = ()
    ) -> ConfirmationRequest | None:
        """The confirmation this update needs (it replaces a running slice), or None; changes nothing.

        Raises like the update would when it cannot run (not found, being deleted, a bad value, no change)."""
        record = self.records.get(deployment_id)
        spec, diffs = self._updated_spec(record, changes, clear)
        message = self._update_message(record, spec, diffs, None)
        slices = _replaced_slices(record, message.spec)
        if not slices:
            return None
        return self.confirmations.issue(
            "update",
            record.deployment_id,
            self._update_state(record, message.spec),
            _update_impact(record, diffs, slices, hourly_usd(record, pricing(self.ports))),
            generation=record.generation,
        )

    def update_deployment(
        self,
        deployment_id: str,
        changes: Mapping[str, Any],
        *,
        clear: Sequence[str] = (),
        confirm: str | None = None,
        command_id: str | None = None,
    ) -> UpdateAccepted:
        """Publish ``deployment.update``: the current spec with only ``changes`` applied (``clear`` unsets fields),
        against the current generation. Confirmed when it replaces a running slice (see the module docstring)."""
        record = self.records.get(deployment_id)
        spec, diffs = self._updated_spec(record, changes, clear)
        command_id = self.publisher.command_id(command_id)
        duplicate = self.publisher.duplicate(command_id, "deployment.update", record.deployment_id)
        if duplicate is not None:
            return UpdateAccepted(
                **duplicate.model_dump(), changes=[], from_generation=record.generation, replaces_slice=False
            )
        message = self._update_message(record, spec, diffs, command_id)
        slices = _replaced_slices(record, message.spec)
        if slices:
            state = self._update_state(record, message.spec)
            impact = _update_impact(record, diffs, slices, hourly_usd(record, pricing(self.ports)))
            if confirm is None or confirm == "":
                request = self.confirmations.issue(
                    "update", record.deployment_id, state, impact, generation=record.generation
                )
                raise self.confirmations.refusal(request)
            self.confirmations.check(
                confirm,
                "update",
                record.deployment_id,
                state,
                changed=f"now generation {record.generation}, desired {record.desired.value}, or another change "
                "than the one confirmed",
            )
        in_place = not needs_new_generation(record.spec, message.spec)
        accepted = self.publisher.publish(
            message, _update_next_step(record, bool(slices), in_place, message.command_id)
        )
        return UpdateAccepted(
            **accepted.model_dump(), changes=diffs, from_generation=record.generation, replaces_slice=bool(slices)
        )

    def _updated_spec(
        self, record: DeploymentRecord, changes: Mapping[str, Any], clear: Sequence[str]
    ) -> tuple[dict[str, Any], list[SpecChange]]:
        """The record's spec with ``changes`` applied and ``clear`` unset, each value checked; and what changed."""
        if record.desired is Desired.ABSENT:
            raise GatewayError(
                "failed_precondition",
                "deployment_id",
                f"'{record.deployment_id}' is being deleted; it cannot be updated",
                "create it again with tpu_deploy once its phase is DELETED",
            )
        given = _checked_changes(record, changes, clear)
        spec = record.spec.model_dump(mode="json")  # every other field (health, backend, ...) stays as it is
        before = _flat(spec)
        for field, value in given.items():
            (spec["serving"] if field in _SERVING else spec)[field] = value
        after = _flat(spec)
        diffs = [SpecChange(field=f, old=before[f], new=after[f]) for f in UPDATABLE if before[f] != after[f]]
        return spec, diffs

    def _update_message(
        self, record: DeploymentRecord, spec: dict[str, Any], diffs: list[SpecChange], command_id: str | None
    ) -> Any:
        """The ``deployment.update`` to publish, checked by the wire models and for fit; refused when it changes
        nothing."""
        if not diffs:
            raise GatewayError(
                "invalid_argument",
                "changes",
                f"'{record.deployment_id}' already has these values; nothing was published",
                Fix(
                    _one_of_updatable(),
                    f" with a new value (tpu_status(deployment_id='{record.deployment_id}') shows the current ones)",
                ),
            )
        message = self.publisher.validated(
            {
                "kind": "deployment.update",
                "deployment_id": record.deployment_id,
                "spec": spec,
                "expected_generation": record.generation,
            },
            command_id,
        )
        plan = self.plans.serving_plan(message.spec)
        if not plan.fits:
            changed = [d.field for d in diffs if d.field in ("accelerator", "max_model_len", "kv_cache_dtype", "dtype")]
            raise GatewayError(
                "failed_precondition",
                changed[0] if changed else "accelerator",
                f"{record.spec.model} would not fit {message.spec.accelerator}: " + "; ".join(plan.capacity.reasons),
                fit_fixes(plan) + " (tpu_plan shows the table)",
            )
        return message

    def _update_state(self, record: DeploymentRecord, spec: Any) -> str:
        """What an update's confirmation is bound to: the deployment as it is now and the spec it becomes."""
        digest = self.confirmations.fingerprint(
            str(record.generation), record.desired.value, record.created_at.isoformat(), spec.model_dump_json()
        )
        return f"g{record.generation}-{digest}"

    def _impact(self, action: ConfirmAction, record: DeploymentRecord) -> str:
        """What ``action`` will do to ``record``'s deployment; raises when it cannot run."""
        deployment_id = record.deployment_id
        if action == "delete":
            hourly = hourly_usd(record, pricing(self.ports))
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
                "restart works once the node is up (BOOTING or later); see "
                f"tpu_status(deployment_id='{deployment_id}')",
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
                Fix("save one first with ", ToolRef("tpu_save_hf_token")),
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


def _checked_changes(record: DeploymentRecord, changes: Mapping[str, Any], clear: Sequence[str]) -> dict[str, Any]:
    """``changes`` checked like create checks them (bounds, closed sets, zones that offer the slice), and each
    field of ``clear`` as None; refused by name when a field is unknown, given twice, or none is given."""
    for field in changes:
        if field not in UPDATABLE:
            raise GatewayError(
                "invalid_argument", "changes", "names a field an update cannot change", "use " + ", ".join(UPDATABLE)
            )
    cleared = bounds.text_list(
        "clear",
        list(clear),
        max_items=len(CLEARABLE),
        min_items=0,
        item=lambda field, value: bounds.choice(field, value, CLEARABLE),
    )
    given = {field: value for field, value in changes.items() if value is not None}
    for field in cleared:
        if field in given:
            raise GatewayError(
                "invalid_argument", field, "is both given and cleared", f"give {field} a value, or clear it, not both"
            )
    if not given and not cleared:
        raise GatewayError(
            "invalid_argument",
            "changes",
            "no field to change was given",
            Fix(_one_of_updatable()),
        )
    checked = _checked_values(record, given)
    checked.update({field: None for field in cleared})
    return checked


def _checked_values(record: DeploymentRecord, given: dict[str, Any]) -> dict[str, Any]:
    """Each given value through the same checks as create (a new slice type re-checks the zones it would use)."""
    checked: dict[str, Any] = {}
    if "accelerator" in given or "zones" in given:
        _, accelerator, zones, _ = slice_arguments(
            record.spec.model,
            given.get("accelerator", record.spec.accelerator),
            given.get("zones", list(record.spec.zones)),
            None,
        )
        checked.update({"accelerator": accelerator, "zones": zones})
        checked = {field: value for field, value in checked.items() if field in given}
    if "tiers" in given:
        tiers = bounds.text_list(
            "tiers",
            given["tiers"],
            max_items=bounds.MAX_TIERS,
            item=lambda field, value: bounds.choice(field, value, TIERS),
        )
        if "reservation" in tiers and not record.spec.reservation_name:
            raise GatewayError(
                "invalid_argument",
                "tiers",
                f"'reservation' needs a reservation name and '{record.deployment_id}' was created without one",
                "leave 'reservation' out, or create a deployment with reservation_name",
            )
        checked["tiers"] = tiers
    numbers = {
        "hedge": lambda v: bounds.integer("hedge", v, bounds.HEDGE),
        "ttl_hours": lambda v: bounds.number("ttl_hours", v, bounds.TTL_HOURS, low_open=True),
        "budget_usd": lambda v: bounds.number("budget_usd", v, bounds.BUDGET_USD, low_open=True),
        "idle_minutes": lambda v: bounds.integer("idle_minutes", v, bounds.IDLE_MINUTES),
        "max_model_len": lambda v: bounds.integer("max_model_len", v, bounds.MAX_MODEL_LEN),
        "kv_cache_dtype": lambda v: bounds.choice("kv_cache_dtype", v, KV_CACHE_DTYPES),
        "dtype": lambda v: bounds.choice("dtype", v, WEIGHT_DTYPES),
    }
    checked.update({field: check(given[field]) for field, check in numbers.items() if field in given})
    return checked


def _flat(spec: dict[str, Any]) -> dict[str, Any]:
    """The updatable fields of a spec dump, serving knobs lifted to the top."""
    serving = spec.get("serving") or {}
    return {field: (serving if field in _SERVING else spec).get(field) for field in UPDATABLE}


def _replaced_slices(record: DeploymentRecord, spec: DeploymentSpec) -> list[ResourceRef]:
    """The slices an update to ``spec`` would replace: none when it applies in place (TTL, budget, idle, health:
    ``shared.domain.spec_change``); else those up (ACTIVE) or being provisioned, not being deleted, while the
    deployment is meant to run (a stopped one releases its slices anyway)."""
    if record.desired is not Desired.PRESENT or not needs_new_generation(record.spec, spec):
        return []
    return [r for r in record.status.resources if r.delete_requested_at is None and r.state in _SLICE_STATES]


def _shown(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, list):
        return "[" + ", ".join(str(item) for item in value) + "]"
    return f"{value:g}" if isinstance(value, float) else str(value)


def describe_changes(changes: Sequence[SpecChange]) -> str:
    """``ttl_hours 4 → 8; zones [a] → [a, b]``."""
    return "; ".join(f"{change.field} {_shown(change.old)} → {_shown(change.new)}" for change in changes)


def _update_impact(
    record: DeploymentRecord, diffs: Sequence[SpecChange], slices: Sequence[ResourceRef], hourly: float | None
) -> str:
    """What an update does to the running slice, for the user to confirm."""
    deployment_id = record.deployment_id
    head = (
        f"updating '{deployment_id}' ({describe_changes(diffs)}) makes generation {record.generation + 1}, "
        "and every generation runs on a TPU slice of its own"
    )
    active = [ref for ref in slices if ref.state is QueuedResourceState.ACTIVE]
    if not active:
        names = ", ".join(ref.name for ref in slices)
        return f"{head}: {names} found capacity and is being provisioned; it is deleted and the search starts again"
    cost = f" (about ${hourly:.2f}/h more)" if hourly else ""
    return (
        f"{head}: the capacity search starts now; {active[0].name} ({active[0].zone}, {active[0].tier.value}) "
        f"keeps serving until the new slice serves, then it is deleted; both bill during the handover{cost}, "
        "the model loads again on the new node and the endpoint address changes"
    )


def _update_next_step(record: DeploymentRecord, replaces: bool, in_place: bool, command_id: str) -> str:
    poll = f"tpu_status(command_id='{command_id}')"
    if in_place:
        return f"Applies to the running generation; the slice and the endpoint are kept. Poll {poll}."
    if record.desired is Desired.STOPPED:
        start = f"tpu_control(action='start', deployment_id='{record.deployment_id}')"
        return f"The deployment stays stopped; {start} brings it up with the new spec."
    if replaces:
        return f"Poll {poll}; the current slice serves until the new generation's slice does."
    return f"Poll {poll}; the capacity search starts again with the new spec."


def _one_of_updatable() -> Words:
    """The fields an update takes, per interface: tpu_deploy leaves hedge to the CLI (``tpuctl update --hedge``)."""
    over_mcp = ", ".join(name for name in UPDATABLE if name != "hedge")
    over_cli = ", ".join("--" + name.replace("_", "-") for name in UPDATABLE).replace("--zones", "--zone")
    return Words(f"give at least one of {over_mcp}", f"give at least one of {over_cli.replace('--tiers', '--tier')}")

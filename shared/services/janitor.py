"""The janitor: the backstop that deletes paid or quota-holding TPU resources nothing should own.

Why a second pass when the reconciler already deletes what it replaces: a reconciler can crash, lose
its lease, or be gone with its deployment record, and a queued resource can materialise long after
its creator gave up (marin#4724). Every tick the janitor diffs what the provider lists against the
deployment records and force-deletes, by label only:

* resources whose deployment record is missing or DELETED;
* resources their (live) deployment does not reference, once older than a grace period (the
  reconciler adopts fresh ones first, so a crash between create and state write is not mistaken);
* FAILED or SUSPENDED queued resources and PREEMPTED nodes nobody is cleaning up (they hold quota);
* anything of a deployment past its TTL;
* spot probes (``shared.domain.spot_probe``) no deployment's status holds, or older than any answer takes, at once
  (a probe that was granted bills until it is deleted).

A resource without our ``tpuctl-deployment`` label, or labelled as managed by something else, is
never touched. The report says what was removed, why, and the spend per hour it stopped.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from shared.domain.cloud import LABEL_MANAGED_BY, ObservedResource
from shared.domain.errors import CloudError, ErrorClass
from shared.domain.models import DeploymentRecord, NodeState, Phase, QueuedResourceState, Tier
from shared.domain.planner import MANAGED_BY, parse_resource_name, request_id
from shared.domain.prices import price_per_chip_hour
from shared.domain.spot_probe import ProbePolicy, is_probe, janitor_reason, probe_delete_request_id
from shared.domain.zone_memory import PriceFn, estimated_price
from shared.ports import TpuApi

__all__ = ["Janitor", "JanitorReport", "RemovedResource"]

log = logging.getLogger("tpuctl.janitor")

_DEAD_STATES = frozenset({QueuedResourceState.FAILED, QueuedResourceState.SUSPENDED})


@dataclass(frozen=True)
class RemovedResource:
    """One resource the janitor asked the provider to delete."""

    zone: str
    name: str
    deployment_id: str
    state: str
    reason: str
    usd_per_hour: float


@dataclass
class JanitorReport:
    """What one sweep did: removed resources, the spend it stopped, and what is still on its way out."""

    removed: list[RemovedResource] = field(default_factory=list)
    stopped_usd_per_hour: float = 0.0
    pending: int = 0
    errors: list[str] = field(default_factory=list)

    def summary(self) -> str:
        if not self.removed and not self.pending and not self.errors:
            return "janitor: nothing to clean"
        parts = [f"janitor: removed {len(self.removed)}"]
        if self.stopped_usd_per_hour:
            parts.append(f"stopped ${self.stopped_usd_per_hour:,.2f}/h")
        if self.pending:
            parts.append(f"{self.pending} still going away")
        if self.errors:
            parts.append(f"{len(self.errors)} error(s)")
        return ", ".join(parts)


class Janitor:
    """Deletes orphaned, dead and expired labelled resources through the ``TpuApi`` port."""

    def __init__(
        self,
        tpu: TpuApi,
        *,
        grace_s: float = 900.0,
        stale_record_s: float = 900.0,
        price: PriceFn = price_per_chip_hour,
        probe: ProbePolicy | None = None,
    ) -> None:
        self._tpu = tpu
        self._probe_max_age_s = (probe or ProbePolicy()).max_age_s
        self._grace = timedelta(seconds=grace_s)
        self._stale_record = timedelta(seconds=stale_record_s)
        self._price = price

    def sweep(
        self, observed: Sequence[ObservedResource], records: Mapping[str, DeploymentRecord], now: datetime
    ) -> JanitorReport:
        """One pass over ``observed`` (a fresh provider list) against ``records`` (all, including DELETED)."""
        report = JanitorReport()
        for resource in observed:
            owner = resource.owned_by
            if owner is None:
                continue
            managed_by = resource.labels.get(LABEL_MANAGED_BY)
            if managed_by is not None and managed_by != MANAGED_BY:
                continue
            if resource.state is QueuedResourceState.DELETING or resource.node_state is NodeState.DELETING:
                report.pending += 1
                continue
            reason = self._reason(resource, records.get(owner), now)
            if reason is None:
                continue
            self._delete(resource, owner, reason, report)
        if report.removed or report.errors:
            log.info(report.summary(), extra={"removed": [r.name for r in report.removed]})
        return report

    def _reason(self, resource: ObservedResource, record: DeploymentRecord | None, now: datetime) -> str | None:
        if is_probe(resource):  # known even where probes are off: one left by an earlier setting goes too
            return janitor_reason(resource, record, now, self._probe_max_age_s)
        if record is None:
            return "its deployment record does not exist"
        if record.status.phase is Phase.DELETED:
            return "its deployment is deleted"
        spec = record.spec
        ends = record.ttl_ends_at
        if ends is not None and now >= ends:
            return f"its deployment is past its {spec.ttl_hours:g} h TTL"
        referenced = any(ref.name == resource.name for ref in record.status.resources)
        old_enough = resource.created_at is None or now - resource.created_at >= self._grace
        dead = resource.state in _DEAD_STATES or resource.node_state is NodeState.PREEMPTED
        if not referenced:
            if dead:
                return f"{_state_text(resource)} and not referenced by {record.deployment_id}"
            if old_enough:
                return f"not referenced by {record.deployment_id} for over {self._grace.total_seconds() / 60:.0f} min"
            return None
        if dead and now - record.updated_at >= self._stale_record:
            return f"{_state_text(resource)} and its deployment was not reconciled for a while"
        return None

    def _delete(self, resource: ObservedResource, owner: str, reason: str, report: JanitorReport) -> None:
        parsed = parse_resource_name(resource.name)
        generation, attempt = parsed if parsed else (0, 0)
        delete_id = request_id(owner, generation, attempt, "delete")
        if is_probe(resource):
            delete_id = probe_delete_request_id(owner, resource.name)
        try:
            self._tpu.delete(resource.zone, resource.name, force=True, request_id=delete_id)
        except CloudError as exc:
            if exc.error_class is not ErrorClass.NOT_FOUND:
                report.errors.append(f"{resource.zone}/{resource.name}: {exc.error_class.value}: {exc.message[:200]}")
                return
        usd = self._usd_per_hour(resource)
        report.removed.append(
            RemovedResource(
                zone=resource.zone,
                name=resource.name,
                deployment_id=owner,
                state=_state_text(resource),
                reason=reason,
                usd_per_hour=usd,
            )
        )
        report.stopped_usd_per_hour = round(report.stopped_usd_per_hour + usd, 6)
        report.pending += 1

    def _usd_per_hour(self, resource: ObservedResource) -> float:
        """What the resource was billing: only slices whose nodes are up cost money."""
        billing = resource.state is QueuedResourceState.ACTIVE or (
            resource.kind != "queued_resource" and resource.node_state is NodeState.READY
        )
        if not billing or not resource.accelerator:
            return 0.0
        try:
            chips = int(resource.accelerator.rsplit("-", 1)[1])
        except (IndexError, ValueError):
            return 0.0
        usd, _ = estimated_price(resource.zone, resource.tier or Tier.ON_DEMAND, resource.accelerator, self._price)
        return round(usd * chips, 6)


def _state_text(resource: ObservedResource) -> str:
    if resource.node_state in (NodeState.PREEMPTED, NodeState.TERMINATED):
        return f"node {resource.node_state.value}"
    return resource.state.value

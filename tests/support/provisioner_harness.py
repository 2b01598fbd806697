"""A provisioner wired to a simulated TPU world, a real SQLite store and virtual time, for service tests.

The provisioner reads the world's clock, so ``run(minutes)`` moves virtual time a tick at a time and
runs one reconcile tick after each step, exactly as Cloud Scheduler would every minute.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from localcloud.tpu_sim import World
from shared.adapters.sqlite_store import SqliteStateStore
from shared.domain.models import DeploymentRecord, DeploymentSpec, Phase, QueuedResourceState, Tier, ZoneMemoryEntry
from shared.messages import (
    CreateDeployment,
    DeleteDeployment,
    ReconcileTick,
    StartDeployment,
    StopDeployment,
    UpdateDeployment,
)
from shared.ports import CalendarReservations, SchedulerApi, TpuApi
from shared.services.provisioner import Provisioner, ProvisionerSettings

DEPLOYMENT = "gemma"


def make_spec(deployment_id: str = DEPLOYMENT, **overrides: Any) -> DeploymentSpec:
    values: dict[str, Any] = {
        "deployment_id": deployment_id,
        "model": "gemma-4-26b-a4b",
        "accelerator": "v6e-4",
        "zones": ("us-east5-b", "europe-west4-a"),
        "tiers": (Tier.SPOT,),
        "hedge": 1,
    }
    values.update(overrides)
    return DeploymentSpec(**values)


class Harness:
    """One world, one store, one provisioner (more with ``another()``), all on the world's virtual clock."""

    def __init__(
        self,
        world: World,
        tpu: TpuApi,
        store_path: Path,
        *,
        scheduler: SchedulerApi | None = None,
        settings: ProvisionerSettings | None = None,
        calendar: CalendarReservations | None = None,
    ) -> None:
        self.world = world
        self.calendar = calendar
        self.tpu = tpu
        self.store = SqliteStateStore(store_path)
        self.clock = world.clock
        self.scheduler = scheduler
        self.settings = settings or ProvisionerSettings(holder="test-provisioner")
        self.provisioner = self.another()
        self.ticks: list[str] = []

    def another(self, *, holder: str | None = None, tpu: TpuApi | None = None) -> Provisioner:
        settings = self.settings
        if holder is not None:
            settings = ProvisionerSettings(**{**settings.__dict__, "holder": holder})
        return Provisioner(
            self.store, tpu or self.tpu, self.clock, scheduler=self.scheduler, settings=settings, calendar=self.calendar
        )

    # -- messages

    def _envelope(self) -> dict[str, Any]:
        return {"command_id": str(uuid.uuid4()), "issued_at": self.clock.now()}

    def create(self, spec: DeploymentSpec | None = None, **overrides: Any) -> str:
        spec = spec or make_spec(**overrides)
        return self.provisioner.handle(
            CreateDeployment(deployment_id=spec.deployment_id, spec=spec, **self._envelope())
        )

    def update(self, spec: DeploymentSpec, expected_generation: int | None = None) -> str:
        return self.provisioner.handle(
            UpdateDeployment(
                deployment_id=spec.deployment_id,
                spec=spec,
                expected_generation=expected_generation,
                **self._envelope(),
            )
        )

    def delete(self, deployment_id: str = DEPLOYMENT) -> str:
        return self.provisioner.handle(DeleteDeployment(deployment_id=deployment_id, **self._envelope()))

    def stop(self, deployment_id: str = DEPLOYMENT) -> str:
        return self.provisioner.handle(StopDeployment(deployment_id=deployment_id, **self._envelope()))

    def start(self, deployment_id: str = DEPLOYMENT) -> str:
        return self.provisioner.handle(StartDeployment(deployment_id=deployment_id, **self._envelope()))

    def tick(self, provisioner: Provisioner | None = None) -> str:
        outcome = (provisioner or self.provisioner).handle(ReconcileTick(**self._envelope()))
        self.ticks.append(outcome)
        return outcome

    # -- time

    def run(self, minutes: float, *, step_s: float = 60.0, until: Callable[[], bool] | None = None) -> int:
        """Advance and tick every ``step_s`` for ``minutes`` (or until ``until()``); returns ticks run."""
        ticks = 0
        elapsed = 0.0
        while elapsed < minutes * 60:
            self.world.advance(step_s)
            elapsed += step_s
            self.tick()
            ticks += 1
            if until is not None and until():
                break
        return ticks

    def run_until_phase(self, phase: Phase, minutes: float = 60, deployment_id: str = DEPLOYMENT) -> int:
        return self.run(minutes, until=lambda: self.record(deployment_id).status.phase is phase)

    # -- views

    def record(self, deployment_id: str = DEPLOYMENT) -> DeploymentRecord:
        record = self.store.get_deployment(deployment_id)
        assert record is not None, f"no record for {deployment_id}"
        return record

    def memory(self) -> dict[str, ZoneMemoryEntry]:
        return {entry.key: entry for entry in self.store.list_zone_memory()}

    def qrs(self, deployment_id: str = DEPLOYMENT) -> dict[str, str]:
        """name -> simulator state of every queued resource labelled for the deployment (DELETING included)."""
        state = self.world.state(events=0)
        found = {}
        for item in state["queued_resources"]:
            labels = item.get("tpu", {}).get("nodeSpec", [{}])[0].get("node", {}).get("labels", {})
            if labels.get("tpuctl-deployment") == deployment_id:
                found[item["name"].rsplit("/", 1)[-1]] = item["state"]["state"]
        return found

    def active(self, deployment_id: str = DEPLOYMENT) -> list[str]:
        return sorted(name for name, state in self.qrs(deployment_id).items() if state == "ACTIVE")

    def zones_tried(self, deployment_id: str = DEPLOYMENT) -> list[str]:
        return [log.zone for log in self.record(deployment_id).status.attempts if log.outcome == "requested"]

    def assert_invariants(self, live: list[str] | None = None) -> dict[str, Any]:
        """No orphans, no stale leftovers, at most one ACTIVE per deployment; state matches the simulator."""
        report = self.world.invariants(live_deployments=live if live is not None else self._live_ids())
        assert report["orphans"] == [], report["orphans"]
        assert report["duplicate_active"] == {}, report["duplicate_active"]
        assert not [item for item in report["leftovers"] if item["too_old"]], report["leftovers"]
        for record in self.store.list_deployments():
            refs = {ref.name for ref in record.status.resources}
            existing = {name for name, state in self.qrs(record.deployment_id).items() if state != "DELETING"}
            assert existing <= refs, f"{record.deployment_id}: untracked {existing - refs}"
            for ref in record.status.resources:
                if ref.state is QueuedResourceState.ACTIVE and ref.delete_requested_at is None:
                    assert self.qrs(record.deployment_id).get(ref.name) == "ACTIVE"
        return report

    def _live_ids(self) -> list[str]:
        return [r.deployment_id for r in self.store.list_deployments() if r.status.phase is not Phase.DELETED]

    def close(self) -> None:
        self.store.close()


def iter_refs(record: DeploymentRecord) -> Iterator[tuple[str, str, str]]:
    for ref in record.status.resources:
        yield ref.name, ref.zone, ref.state.value

"""Provisioner lifecycle on the simulator: commands, idempotence, make-before-break, teardown, leases, tick job."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localcloud.scheduler_fake import SchedulerFake
from shared.adapters.cloud_scheduler import CloudSchedulerApi
from shared.adapters.local_scheduler import LocalScheduler
from shared.domain.cloud import LABEL_DEPLOYMENT, ObservedResource, ProvisionRequest
from shared.domain.errors import LeaseHeld, PermanentError, StaleGeneration
from shared.domain.models import Desired, Phase, Tier
from shared.messages import CreateDeployment
from shared.ports import SchedulerApi, SchedulerJob, TpuApi
from shared.services.benchmarker import benchmark_job_name
from shared.services.provisioner import TICK_JOB_NAME, ProvisionerSettings, reconcile_tick_job
from tests.support.fixtures_provisioner import HarnessFactory, spot, world
from tests.support.provisioner_harness import Harness, make_spec

CHEAP = "us-central1-b"
EUROPE = "europe-west4-a"
ZONES = (CHEAP, EUROPE)
PLENTY = world({CHEAP: spot(8), EUROPE: spot(8)})


def _creates(h: Harness) -> list[str]:
    return [e["resource"] for e in h.world.events() if e["kind"] == "qr.creating"]


def _deletes(h: Harness) -> list[str]:
    return [e["resource"] for e in h.world.events() if e["kind"] == "qr.deleting"]


def _serving(h: Harness, deployment_id: str = "gemma") -> None:
    """What the monitor does once vLLM answers: mark the deployment SERVING."""
    record = h.record(deployment_id)
    status = record.status.model_copy(update={"phase": Phase.SERVING})
    h.store.put_deployment(record.model_copy(update={"status": status}), expected_version=record.version)


class TestCreate:
    def test_create_reaches_active_and_a_repeat_changes_nothing(self, harness_factory: HarnessFactory) -> None:
        h = harness_factory(PLENTY)
        assert h.create(zones=ZONES).startswith("created gemma generation 1")
        h.run_until_phase(Phase.BOOTING, minutes=10)
        record = h.record()
        assert record.status.zone == CHEAP
        assert record.status.endpoint
        assert record.status.observed_generation == 1
        creates = _creates(h)
        again = h.create(zones=ZONES)
        assert again.startswith("gemma exists")
        h.tick()
        assert _creates(h) == creates
        assert h.active() == ["gemma-g1-a0"]
        h.assert_invariants()

    def test_create_with_another_spec_is_refused_with_the_command_to_use(self, harness_factory: HarnessFactory) -> None:
        h = harness_factory(PLENTY)
        h.create(zones=ZONES)
        with pytest.raises(PermanentError, match=r"deployment\.update"):
            h.create(zones=ZONES, hedge=2)


class TestUpdate:
    def test_a_new_generation_is_made_before_the_old_one_is_broken(self, harness_factory: HarnessFactory) -> None:
        h = harness_factory(PLENTY)
        h.create(zones=ZONES)
        h.run_until_phase(Phase.BOOTING, minutes=10)
        _serving(h)
        assert h.update(make_spec(zones=ZONES, max_run_hours=2), expected_generation=1).startswith(
            "updated gemma to generation 2"
        )
        h.run(10, until=lambda: h.record().status.observed_generation == 2)
        record = h.record()
        assert record.status.phase is Phase.BOOTING
        assert sorted(h.active()) == ["gemma-g1-a0", "gemma-g2-a1"]  # both up during the handover
        h.run(2)
        assert "gemma-g1-a0" in h.active()  # the old one still serves: the new one is not SERVING yet
        _serving(h)
        h.run(3)
        assert h.active() == ["gemma-g2-a1"]
        assert "gemma-g1-a0" not in h.qrs()
        h.assert_invariants()

    def test_an_update_against_an_old_generation_is_rejected(self, harness_factory: HarnessFactory) -> None:
        h = harness_factory(PLENTY)
        h.create(zones=ZONES)
        h.update(make_spec(zones=ZONES, hedge=2), expected_generation=1)
        with pytest.raises(StaleGeneration, match="generation 2"):
            h.update(make_spec(zones=ZONES, hedge=3), expected_generation=1)

    def test_an_unchanged_spec_is_not_a_new_generation(self, harness_factory: HarnessFactory) -> None:
        h = harness_factory(PLENTY)
        h.create(zones=ZONES)
        assert h.update(make_spec(zones=ZONES)).startswith("gemma unchanged")
        assert h.record().generation == 1


class TestDelete:
    def test_delete_force_deletes_verifies_gone_and_records_the_cost(self, harness_factory: HarnessFactory) -> None:
        h = harness_factory(PLENTY)
        h.create(zones=ZONES)
        h.run_until_phase(Phase.BOOTING, minutes=10)
        h.run(60, step_s=300)
        assert h.delete().startswith("deleting gemma")
        assert h.record().status.phase is Phase.DELETING
        h.run_until_phase(Phase.DELETED, minutes=10)
        record = h.record()
        assert h.qrs() == {}
        billed = h.world.billing()["by_deployment"]["gemma"]
        assert record.status.spend_usd == pytest.approx(billed, rel=0.05)
        assert f"${record.status.spend_usd:,.2f}" in record.status.message
        h.assert_invariants(live=[])

    def test_a_deleted_deployment_can_be_created_again_as_a_new_generation(
        self, harness_factory: HarnessFactory
    ) -> None:
        h = harness_factory(PLENTY)
        h.create(zones=ZONES)
        h.delete()
        h.run_until_phase(Phase.DELETED, minutes=10)
        assert "already deleting" in h.delete()
        assert h.create(zones=ZONES).startswith("created gemma generation 2")
        h.run_until_phase(Phase.BOOTING, minutes=10)
        assert h.active() == ["gemma-g2-a0"]

    def test_deleting_an_unknown_deployment_is_a_no_op(self, harness_factory: HarnessFactory) -> None:
        h = harness_factory(PLENTY)
        assert "does not exist" in h.delete("nobody")


class TestStopStart:
    def test_stop_releases_the_slice_and_start_provisions_again(self, harness_factory: HarnessFactory) -> None:
        h = harness_factory(PLENTY)
        h.create(zones=ZONES)
        h.run_until_phase(Phase.BOOTING, minutes=10)
        h.stop()
        h.run_until_phase(Phase.STOPPED, minutes=10)
        assert h.qrs() == {}
        assert h.record().desired is Desired.STOPPED
        h.start()
        h.run_until_phase(Phase.BOOTING, minutes=10)
        assert len(h.active()) == 1
        h.assert_invariants()

    def test_a_start_boots_as_a_new_node_not_as_an_outage_of_the_old_one(self, harness_factory: HarnessFactory) -> None:
        """#18: serving_since survived stop and start, so the new node's normal boot was judged DOWN."""
        h = harness_factory(PLENTY)
        h.create(zones=ZONES)
        h.run_until_phase(Phase.BOOTING, minutes=10)
        served = h.record()
        status = served.status.model_copy(update={"phase": Phase.SERVING, "serving_since": h.clock.now()})
        h.store.put_deployment(served.model_copy(update={"status": status}), expected_version=served.version)
        h.stop()
        h.run_until_phase(Phase.STOPPED, minutes=10)
        assert h.record().status.serving_since is None, "nothing serves while stopped"
        h.start()
        h.run_until_phase(Phase.BOOTING, minutes=10)
        # With no serving_since, the monitor judges a silent node against the boot budget (BOOTING), not as DOWN.
        assert h.record().status.serving_since is None


class TestTeardown:
    def test_the_ttl_tears_a_deployment_down(self, harness_factory: HarnessFactory) -> None:
        h = harness_factory(PLENTY)
        h.create(zones=ZONES, ttl_hours=1)
        h.run(90, step_s=300, until=lambda: h.record().status.phase is Phase.DELETED)
        record = h.record()
        assert record.status.phase is Phase.DELETED
        assert "ttl" in record.status.message
        assert h.qrs() == {}

    def test_the_budget_tears_a_deployment_down(self, harness_factory: HarnessFactory) -> None:
        h = harness_factory(PLENTY)
        h.create(zones=ZONES, budget_usd=1.5)  # 4 chips x $0.648/h: about 35 minutes
        h.run(90, until=lambda: h.record().status.phase is Phase.DELETED)
        record = h.record()
        assert record.status.phase is Phase.DELETED
        assert "budget" in record.status.message
        assert 1.3 <= record.status.spend_usd <= 1.5
        assert h.world.billing()["by_deployment"]["gemma"] <= 1.5  # the provider's meter agrees


class TestLeases:
    def test_a_second_reconciler_skips_while_the_first_holds_the_lease(self, harness_factory: HarnessFactory) -> None:
        h = harness_factory(PLENTY)
        h.create(zones=ZONES)
        lease = h.store.acquire_lease("deployment/gemma", "someone-else", 120, h.clock.now())
        assert lease is not None
        assert "skipped (lease held)" in h.tick()

    def test_a_reconciler_that_stalls_past_its_lease_is_fenced_out(self, harness_factory: HarnessFactory) -> None:
        h = harness_factory(world({CHEAP: spot(0), EUROPE: spot(0)}))
        assert h.store.acquire_lease("deployment/gemma", "blocker", 30, h.clock.now()) is not None
        assert "reconcile deferred" in h.create(zones=ZONES, hedge=1)
        h.world.advance(31)
        other = h.another(holder="second")
        stalling = _StallOnList(h.tpu, h, other)
        slow = h.another(holder="first", tpu=stalling)
        with pytest.raises(LeaseHeld):
            slow.reconcile("gemma")  # stalls 3 minutes in its observation; "second" reconciles meanwhile
        assert stalling.stalled
        assert _creates(h) == ["gemma-g1-a0"]  # only the second reconciler's: the first was fenced out
        assert [r.name for r in h.record().status.resources] == ["gemma-g1-a0"]
        h.run(3)
        assert _creates(h) == ["gemma-g1-a0"]
        h.assert_invariants()


class _StallOnList:
    """Lists, then lets virtual time pass beyond the lease while another reconciler does its pass."""

    def __init__(self, inner: TpuApi, harness: Harness, other: Any) -> None:
        self.inner = inner
        self.harness = harness
        self.other = other
        self.stalled = False

    def list(self, zone: str = "-") -> list[ObservedResource]:
        observed = self.inner.list(zone)
        if not self.stalled:
            self.stalled = True
            self.harness.world.advance(180)
            self.other.reconcile("gemma")
        return observed

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class TestJanitor:
    def test_orphans_are_deleted_and_foreign_resources_untouched(self, harness_factory: HarnessFactory) -> None:
        h = harness_factory(PLENTY)
        for name, labels in (("ghost-g1-a0", {LABEL_DEPLOYMENT: "ghost"}), ("not-ours", {"team": "ml"})):
            h.tpu.create(
                ProvisionRequest(
                    resource_id=name,
                    node_id=name,
                    zone=EUROPE,
                    accelerator="v6e-4",
                    tier=Tier.SPOT,
                    request_id=str(uuid.uuid4()),
                    labels=labels,
                )
            )
        h.run(8)
        report = h.provisioner.last_janitor_report
        assert report is not None
        removed = {r.name: r for r in report.removed}
        assert set(removed) <= {"ghost-g1-a0"}
        assert "ghost-g1-a0" not in h.qrs("ghost")
        assert any(e["kind"] == "qr.deleting" and e["resource"] == "ghost-g1-a0" for e in h.world.events())
        assert h.world.qr_state(EUROPE, "not-ours") == "ACTIVE"  # never touched: no tpuctl label

    def test_the_janitor_reports_the_spend_it_stopped(self, harness_factory: HarnessFactory) -> None:
        h = harness_factory(PLENTY)
        h.tpu.create(
            ProvisionRequest(
                resource_id="ghost-g1-a0",
                node_id="ghost-g1-a0",
                zone=CHEAP,
                accelerator="v6e-4",
                tier=Tier.SPOT,
                request_id=str(uuid.uuid4()),
                labels={LABEL_DEPLOYMENT: "ghost"},
            )
        )
        h.world.advance(600)
        assert h.world.qr_state(CHEAP, "ghost-g1-a0") == "ACTIVE"
        h.tick()
        report = h.provisioner.last_janitor_report
        assert report is not None
        assert [r.name for r in report.removed] == ["ghost-g1-a0"]
        assert report.stopped_usd_per_hour == pytest.approx(4 * 0.648)
        assert "does not exist" in report.removed[0].reason


@pytest.fixture(params=["local", "cloud"])
def scheduler(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SchedulerApi]:
    """The tick job's scheduler: the embedded ticker, or the real Cloud Scheduler client against the fake."""
    if request.param == "local":
        from shared.adapters.clock import ManualClock

        yield LocalScheduler(tmp_path / "scheduler.db", clock=ManualClock())
        return
    with SchedulerFake() as fake:
        assert fake._server is not None
        yield CloudSchedulerApi(
            "demo-proj", "us-central1", endpoint=f"http://127.0.0.1:{fake._server.server_address[1]}"
        )


class _PauseRace:
    """A scheduler whose pause lands at the same moment a create command writes a new deployment."""

    def __init__(self, inner: SchedulerApi, harness: Harness) -> None:
        self.inner = inner
        self.harness = harness
        self.raced = False

    def pause_job(self, name: str) -> None:
        self.inner.pause_job(name)
        if not self.raced:
            self.raced = True
            spec = make_spec("late-comer", zones=ZONES)
            record_only = self.harness.another(holder="racer")
            record_only._ensure_ticking = lambda: None  # type: ignore[method-assign]  # its resume came too early
            record_only.create(
                CreateDeployment(
                    deployment_id="late-comer",
                    spec=spec,
                    command_id=str(uuid.uuid4()),
                    issued_at=self.harness.clock.now(),
                )
            )

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class TestTickJob:
    def _settings(self) -> ProvisionerSettings:
        return ProvisionerSettings(holder="ticker", tick_job=reconcile_tick_job("tpuctl-ticks"))

    def _paused(self, scheduler: SchedulerApi) -> bool:
        job = scheduler.get_job(TICK_JOB_NAME)
        assert isinstance(job, SchedulerJob)
        return job.paused

    def test_ticks_pause_when_nothing_is_live_and_resume_on_the_next_create(
        self, harness_factory: HarnessFactory, scheduler: SchedulerApi
    ) -> None:
        h = harness_factory(PLENTY, settings=self._settings(), scheduler=scheduler)
        h.create(zones=ZONES)
        assert not self._paused(scheduler)
        h.run_until_phase(Phase.BOOTING, minutes=10)
        assert not self._paused(scheduler)
        h.delete()
        h.run_until_phase(Phase.DELETED, minutes=10)
        h.tick()
        assert self._paused(scheduler)
        h.create(make_spec("gemma-next", zones=ZONES))
        assert not self._paused(scheduler)
        h.run_until_phase(Phase.BOOTING, minutes=10, deployment_id="gemma-next")

    def test_deleting_a_deployment_deletes_its_scheduled_benchmark(
        self, harness_factory: HarnessFactory, scheduler: SchedulerApi
    ) -> None:
        h = harness_factory(PLENTY, settings=self._settings(), scheduler=scheduler)
        h.create(zones=ZONES)
        job = SchedulerJob(name=benchmark_job_name("gemma"), schedule="0 3 * * *", topic="tpuctl-commands", data=b"{}")
        scheduler.upsert_job(job)
        h.delete()
        assert scheduler.get_job(benchmark_job_name("gemma")) is None

    def test_a_create_racing_the_pause_is_never_stranded(
        self, harness_factory: HarnessFactory, scheduler: SchedulerApi
    ) -> None:
        h = harness_factory(PLENTY, settings=self._settings(), scheduler=scheduler)
        race = _PauseRace(scheduler, h)
        h.scheduler = race
        h.provisioner = h.another()
        h.create(zones=ZONES)
        h.delete()
        h.run_until_phase(Phase.DELETED, minutes=10)
        assert race.raced
        assert "appeared while pausing" in h.ticks[-1]
        assert not self._paused(scheduler)
        h.run_until_phase(Phase.BOOTING, minutes=10, deployment_id="late-comer")

    def test_a_create_whose_reconcile_is_deferred_still_resumes_the_ticks(
        self, harness_factory: HarnessFactory, scheduler: SchedulerApi
    ) -> None:
        h = harness_factory(PLENTY, settings=self._settings(), scheduler=scheduler)
        h.create(zones=ZONES)
        h.delete()
        h.run_until_phase(Phase.DELETED, minutes=10)
        h.tick()
        assert self._paused(scheduler)
        assert h.store.acquire_lease("deployment/gemma-next", "stuck-instance", 90, h.clock.now()) is not None
        assert "reconcile deferred" in h.create(make_spec("gemma-next", zones=ZONES))
        assert not self._paused(scheduler)
        h.run_until_phase(Phase.BOOTING, minutes=10, deployment_id="gemma-next")

"""The SchedulerApi port: Cloud Scheduler's real client against the REST fake, and the embedded ticker.

Both adapters pass the same contract; the ticker's cron and firing rules are tested on their own.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from localcloud.scheduler_fake import SchedulerFake
from shared.adapters.clock import ManualClock
from shared.adapters.cloud_scheduler import CloudSchedulerApi
from shared.adapters.local_bus import LocalBus
from shared.adapters.local_scheduler import CronSchedule, LocalScheduler
from shared.domain.errors import CloudError, ErrorClass
from shared.ports import Delivery, SchedulerApi, SchedulerJob

START = datetime(2026, 12, 2, 12, 0, 30, tzinfo=UTC)


def _job(name: str = "tpuctl-reconcile-tick", **changes: object) -> SchedulerJob:
    values: dict[str, object] = {
        "name": name,
        "schedule": "* * * * *",
        "topic": "tpuctl-ticks",
        "data": b'{"kind":"reconcile.tick"}',
        "attributes": {"kind": "reconcile.tick"},
    }
    values.update(changes)
    return SchedulerJob(**values)  # type: ignore[arg-type]


@pytest.fixture
def fake() -> Iterator[SchedulerFake]:
    with SchedulerFake() as running:
        yield running


def _cloud(fake: SchedulerFake) -> CloudSchedulerApi:
    assert fake._server is not None
    return CloudSchedulerApi("demo-proj", "us-central1", endpoint=f"http://127.0.0.1:{fake._server.server_address[1]}")


@pytest.fixture(params=["cloud", "local"])
def scheduler(request: pytest.FixtureRequest, fake: SchedulerFake, tmp_path: Path) -> SchedulerApi:
    if request.param == "cloud":
        return _cloud(fake)
    return LocalScheduler(tmp_path / "jobs.db", clock=ManualClock(START))


class TestContract:
    def test_upsert_creates_then_updates_a_job(self, scheduler: SchedulerApi) -> None:
        scheduler.upsert_job(_job())
        assert scheduler.get_job("tpuctl-reconcile-tick") == _job()
        scheduler.upsert_job(_job(schedule="*/5 * * * *", data=b"{}"))
        stored = scheduler.get_job("tpuctl-reconcile-tick")
        assert stored is not None
        assert (stored.schedule, stored.data, stored.topic) == ("*/5 * * * *", b"{}", "tpuctl-ticks")

    def test_pause_and_resume(self, scheduler: SchedulerApi) -> None:
        scheduler.upsert_job(_job())
        scheduler.pause_job("tpuctl-reconcile-tick")
        job = scheduler.get_job("tpuctl-reconcile-tick")
        assert job is not None and job.paused
        scheduler.resume_job("tpuctl-reconcile-tick")
        job = scheduler.get_job("tpuctl-reconcile-tick")
        assert job is not None and not job.paused

    def test_upsert_matches_the_paused_flag(self, scheduler: SchedulerApi) -> None:
        scheduler.upsert_job(_job(paused=True))
        job = scheduler.get_job("tpuctl-reconcile-tick")
        assert job is not None and job.paused

    def test_list_filters_by_prefix(self, scheduler: SchedulerApi) -> None:
        scheduler.upsert_job(_job("tpuctl-a"))
        scheduler.upsert_job(_job("tpuctl-b"))
        scheduler.upsert_job(_job("other"))
        assert [job.name for job in scheduler.list_jobs("tpuctl-")] == ["tpuctl-a", "tpuctl-b"]
        assert len(scheduler.list_jobs()) == 3

    def test_missing_jobs_read_as_none_and_delete_is_idempotent(self, scheduler: SchedulerApi) -> None:
        assert scheduler.get_job("nope") is None
        scheduler.upsert_job(_job())
        scheduler.delete_job("tpuctl-reconcile-tick")
        scheduler.delete_job("tpuctl-reconcile-tick")
        assert scheduler.get_job("tpuctl-reconcile-tick") is None


class TestCloudScheduler:
    def test_names_and_topics_are_expanded_on_the_wire(self, fake: SchedulerFake) -> None:
        _cloud(fake).upsert_job(_job())
        stored = fake.jobs["projects/demo-proj/locations/us-central1/jobs/tpuctl-reconcile-tick"]
        assert stored["pubsubTarget"]["topicName"] == "projects/demo-proj/topics/tpuctl-ticks"
        assert stored["timeZone"] == "Etc/UTC"
        assert fake.state_of("tpuctl-reconcile-tick") == "ENABLED"

    def test_an_unchanged_upsert_sends_no_update(self, fake: SchedulerFake) -> None:
        api = _cloud(fake)
        api.upsert_job(_job())
        fake.requests.clear()
        api.upsert_job(_job())
        assert [method for method, _ in fake.requests] == ["GET"]

    @pytest.mark.parametrize(
        ("code", "error_class"),
        [
            (503, ErrorClass.TRANSIENT),
            (500, ErrorClass.TRANSIENT),
            (429, ErrorClass.RATE_LIMIT),
            (403, ErrorClass.PERMISSION),
            (400, ErrorClass.INVALID),
        ],
    )
    def test_errors_are_classified(self, fake: SchedulerFake, code: int, error_class: ErrorClass) -> None:
        api = _cloud(fake)
        api.upsert_job(_job())
        fake.fail_next.append(code)
        with pytest.raises(CloudError) as caught:
            api.pause_job("tpuctl-reconcile-tick")
        assert caught.value.error_class is error_class

    def test_pausing_a_missing_job_is_not_found(self, fake: SchedulerFake) -> None:
        with pytest.raises(CloudError) as caught:
            _cloud(fake).pause_job("missing")
        assert caught.value.error_class is ErrorClass.NOT_FOUND

    @pytest.mark.parametrize(("project", "region", "field"), [("", "us-central1", "project"), ("p", "", "region")])
    def test_missing_settings_name_the_field(self, project: str, region: str, field: str) -> None:
        with pytest.raises(ValueError, match=field):
            CloudSchedulerApi(project, region)


class TestCron:
    @pytest.mark.parametrize(
        ("expression", "moment", "expected"),
        [
            ("* * * * *", datetime(2026, 12, 2, 12, 7, tzinfo=UTC), True),
            ("*/5 * * * *", datetime(2026, 12, 2, 12, 10, tzinfo=UTC), True),
            ("*/5 * * * *", datetime(2026, 12, 2, 12, 11, tzinfo=UTC), False),
            ("0 9-17 * * 1-5", datetime(2026, 12, 2, 10, 0, tzinfo=UTC), True),  # a Wednesday
            ("0 9-17 * * 1-5", datetime(2026, 12, 6, 10, 0, tzinfo=UTC), False),  # a Sunday
            ("0 0 1 * 0", datetime(2026, 12, 6, 0, 0, tzinfo=UTC), True),  # day or weekday, as cron does
            ("15,45 * * * *", datetime(2026, 12, 2, 3, 45, tzinfo=UTC), True),
            ("0 0 * * 7", datetime(2026, 12, 6, 0, 0, tzinfo=UTC), True),  # 7 is Sunday too
        ],
    )
    def test_schedules_match_their_minutes(self, expression: str, moment: datetime, expected: bool) -> None:
        assert CronSchedule.parse(expression).matches(moment) is expected

    @pytest.mark.parametrize("expression", ["* * * *", "61 * * * *", "*/0 * * * *", "a * * * *", "5-2 * * * *"])
    def test_bad_schedules_name_the_field(self, expression: str) -> None:
        with pytest.raises(ValueError, match="schedule"):
            CronSchedule.parse(expression)


class TestLocalTicker:
    def test_a_job_fires_once_per_slot_and_never_back_fills(self, tmp_path: Path) -> None:
        clock = ManualClock(START)
        ticker = LocalScheduler(tmp_path / "jobs.db", clock=clock)
        bus = LocalBus(tmp_path / "bus.db", clock=clock)
        bus.ensure_topic("tpuctl-ticks")
        bus.ensure_subscription("tpuctl-ticks", "provision")
        ticker.upsert_job(_job())
        assert ticker.due() == []  # created at 12:00:30: the first slot is 12:01
        clock.advance(30)
        assert [job.name for job in ticker.due()] == ["tpuctl-reconcile-tick"]
        assert ticker.run_due(bus) == 1
        assert ticker.run_due(bus) == 0
        clock.advance(600)
        assert ticker.run_due(bus) == 1  # ten missed minutes publish one tick, not ten
        received: list[Delivery] = []
        bus.pull("provision", received.append, max_messages=10)
        assert [d.data for d in received] == [_job().data, _job().data]
        assert received[0].attributes["kind"] == "reconcile.tick"
        bus.close()

    def test_a_paused_job_skips_the_slots_it_was_paused_for(self, tmp_path: Path) -> None:
        clock = ManualClock(START)
        ticker = LocalScheduler(tmp_path / "jobs.db", clock=clock)
        ticker.upsert_job(_job())
        ticker.pause_job("tpuctl-reconcile-tick")
        clock.advance(timedelta(minutes=30).total_seconds())
        assert ticker.due() == []
        ticker.resume_job("tpuctl-reconcile-tick")
        assert ticker.due() == []
        clock.advance(60)
        assert len(ticker.due()) == 1

    def test_pausing_an_unknown_job_names_it(self, tmp_path: Path) -> None:
        ticker = LocalScheduler(tmp_path / "jobs.db", clock=ManualClock(START))
        with pytest.raises(KeyError, match="no scheduler job 'ghost'"):
            ticker.pause_job("ghost")

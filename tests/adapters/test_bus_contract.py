"""One contract suite for the ``CommandBus`` port, run against ``LocalBus`` (SQLite in tmp_path, a ManualClock)
and ``PubSubBus`` on the real Pub/Sub emulator (marker ``emulator``; skipped with the reason when the machine has
no emulator).

Two behaviours the emulator accepts but does not enforce (checked against emulator 0.8.20): subscription
filters (a filtered subscription receives every message) and dead-letter topics (exhausted messages simply stop
arriving). Those cases run on ``LocalBus`` only; for Pub/Sub the suite checks that the filter and the
dead-letter policy land on the subscription, which is what the real service enforces.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest

from shared.adapters.clock import ManualClock
from shared.adapters.local_bus import DEAD_LETTER_ERROR, DEAD_LETTER_REASON, LocalBus
from shared.adapters.pubsub_bus import PubSubBus
from shared.domain.errors import PermanentError, TransientError
from shared.ports import CommandBus, Delivery
from tests.support import local_bus_crash
from tests.support.emulators import RunningEmulator, unique_name

REPO_ROOT = Path(__file__).resolve().parents[2]
EMULATOR_IGNORES_FILTERS = "the Pub/Sub emulator accepts filters but delivers every message; LocalBus only"
EMULATOR_IGNORES_DEAD_LETTERS = "the Pub/Sub emulator accepts dead-letter policies but never forwards; LocalBus only"


@dataclass
class Recorder:
    """A handler that remembers every delivery and fails while ``fail_when`` says so."""

    fail_when: Callable[[Delivery], bool] = lambda delivery: False
    seen: list[Delivery] = field(default_factory=list)
    handled: list[Delivery] = field(default_factory=list)  # the ones it acknowledged
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, delivery: Delivery) -> None:
        with self.lock:
            self.seen.append(delivery)
        if self.fail_when(delivery):
            raise RuntimeError(f"handler refused {delivery.data!r} on attempt {delivery.attempt}")
        with self.lock:
            self.handled.append(delivery)

    def handled_data(self) -> list[bytes]:
        with self.lock:
            return [delivery.data for delivery in self.handled]


@dataclass
class BusUnderTest:
    """A bus plus what the suite needs to drive it the same way on both back ends."""

    bus: CommandBus
    kind: str  # "local" | "pubsub"
    advance: Callable[[float], object]  # move the bus's clock (no-op on the emulator: it retries at once)

    def topic(self, prefix: str = "topic") -> str:
        name = unique_name(prefix)
        self.bus.ensure_topic(name)
        return name

    def subscription(self, topic: str, prefix: str = "sub", **options: object) -> str:
        name = unique_name(prefix)
        self.bus.ensure_subscription(topic, name, **options)  # type: ignore[arg-type]
        return name

    def pull_until(self, subscription: str, handler: Recorder, done: Callable[[], bool], *, step_s: float = 0) -> None:
        """Pull until ``done()``; on LocalBus the clock moves ``step_s`` between rounds (for backoffs)."""
        if self.kind == "local":
            for _ in range(100):
                if done():
                    return
                self.bus.pull(subscription, handler, max_messages=10, timeout_s=0)
                self.advance(step_s)
        else:
            give_up_at = time.monotonic() + 30.0
            while time.monotonic() < give_up_at:
                if done():
                    return
                self.bus.pull(subscription, handler, max_messages=10, timeout_s=2.0)
        assert done(), f"condition not met; seen {[(d.data, d.attempt) for d in handler.seen]}"


@pytest.fixture(params=["local", pytest.param("pubsub", marks=pytest.mark.emulator)])
def bus_under_test(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BusUnderTest]:
    if request.param == "local":
        clock = ManualClock()
        local = LocalBus(tmp_path / "bus.db", clock=clock)
        try:
            yield BusUnderTest(local, "local", clock.advance)
        finally:
            local.close()
        return
    emulator: RunningEmulator = request.getfixturevalue("pubsub_emulator")
    remote = PubSubBus(emulator.project, ack_deadline_s=10, backoff_min_s=0.0, backoff_max_s=1.0)
    try:
        yield BusUnderTest(remote, "pubsub", lambda seconds: None)
    finally:
        remote.close()


# --- the contract --------------------------------------------------------------------------------------------


def test_a_published_message_arrives_with_its_data_attributes_and_ordering_key(bus_under_test: BusUnderTest) -> None:
    topic = bus_under_test.topic()
    subscription = bus_under_test.subscription(topic)
    message_id = bus_under_test.bus.publish(
        topic,
        b'{"kind":"deployment.create"}',
        {"kind": "deployment.create", "deployment_id": "gemma-a"},
        ordering_key="gemma-a",
    )
    recorder = Recorder()

    bus_under_test.pull_until(subscription, recorder, lambda: len(recorder.handled) == 1)

    (delivery,) = recorder.handled
    assert delivery.message_id == message_id
    assert delivery.data == b'{"kind":"deployment.create"}'
    assert dict(delivery.attributes) == {"kind": "deployment.create", "deployment_id": "gemma-a"}
    assert delivery.ordering_key == "gemma-a"
    assert delivery.attempt == 1
    assert delivery.subscription == subscription
    assert delivery.publish_time is not None and delivery.publish_time.tzinfo is not None


def test_a_handler_that_raises_gets_the_message_again_with_a_higher_attempt(bus_under_test: BusUnderTest) -> None:
    topic = bus_under_test.topic()
    dead_letters = bus_under_test.topic("dead")  # Pub/Sub reports delivery_attempt only with a dead-letter policy
    subscription = bus_under_test.subscription(topic, dead_letter_topic=dead_letters, max_delivery_attempts=5)
    bus_under_test.bus.publish(topic, b"flaky", {"kind": "benchmark.run"})
    recorder = Recorder(fail_when=lambda delivery: delivery.attempt < 2)

    acked_first = bus_under_test.bus.pull(subscription, recorder, timeout_s=2.0)
    bus_under_test.pull_until(subscription, recorder, lambda: len(recorder.handled) == 1, step_s=1.0)

    assert acked_first == 0
    assert [d.attempt for d in recorder.seen] == [1, 2]
    assert recorder.handled[0].data == b"flaky"
    assert recorder.seen[0].message_id == recorder.seen[1].message_id  # a redelivery keeps the message id


def test_nothing_is_lost_when_two_threads_publish_at_once(bus_under_test: BusUnderTest) -> None:
    topic = bus_under_test.topic()
    subscription = bus_under_test.subscription(topic)
    per_thread = 40
    ids: list[str] = []
    ids_lock = threading.Lock()
    errors: list[BaseException] = []

    def publish_many(writer: str) -> None:
        try:
            for index in range(per_thread):
                message_id = bus_under_test.bus.publish(
                    topic, f"{writer}-{index}".encode(), {"writer": writer}, ordering_key=writer
                )
                with ids_lock:
                    ids.append(message_id)
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    writers = [threading.Thread(target=publish_many, args=(name,)) for name in ("alpha", "beta")]
    for thread in writers:
        thread.start()
    for thread in writers:
        thread.join(timeout=60)
    recorder = Recorder()
    bus_under_test.pull_until(subscription, recorder, lambda: len(set(recorder.handled_data())) == 2 * per_thread)

    assert errors == []
    assert len(set(ids)) == 2 * per_thread
    expected = {f"{writer}-{index}".encode() for writer in ("alpha", "beta") for index in range(per_thread)}
    assert set(recorder.handled_data()) == expected


def test_messages_with_one_ordering_key_are_handled_in_publish_order(bus_under_test: BusUnderTest) -> None:
    topic = bus_under_test.topic()
    subscription = bus_under_test.subscription(topic)
    for index in range(5):
        for key in ("gemma-a", "gemma-b"):
            bus_under_test.bus.publish(topic, f"{key}/{index}".encode(), {"step": str(index)}, ordering_key=key)
    recorder = Recorder()

    bus_under_test.pull_until(subscription, recorder, lambda: len(recorder.handled) == 10)

    for key in ("gemma-a", "gemma-b"):
        order = [d.data for d in recorder.handled if d.ordering_key == key]
        assert order == [f"{key}/{index}".encode() for index in range(5)]


def test_a_failed_message_is_handled_before_any_later_message_of_its_key(bus_under_test: BusUnderTest) -> None:
    topic = bus_under_test.topic()
    subscription = bus_under_test.subscription(topic)
    for step in ("create", "update", "delete"):
        bus_under_test.bus.publish(topic, step.encode(), {"step": step}, ordering_key="gemma-a")
    refusals = iter([True])  # the first delivery of "create" fails (no dead-letter policy: attempt stays 1 on Pub/Sub)
    recorder = Recorder(fail_when=lambda delivery: delivery.data == b"create" and next(refusals, False))

    bus_under_test.pull_until(subscription, recorder, lambda: len(recorder.handled) == 3, step_s=1.0)

    assert recorder.handled_data() == [b"create", b"update", b"delete"]
    first_success = next(i for i, d in enumerate(recorder.seen) if d is recorder.handled[0])
    assert first_success >= 1
    assert all(d.data == b"create" for d in recorder.seen[: first_success + 1])


def test_a_subscription_gets_only_messages_published_after_it_was_created(bus_under_test: BusUnderTest) -> None:
    topic = bus_under_test.topic()
    bus_under_test.subscription(topic)  # so the early message is stored somewhere
    bus_under_test.bus.publish(topic, b"before", {"n": "1"})
    late = bus_under_test.subscription(topic, "late")
    bus_under_test.bus.publish(topic, b"after", {"n": "2"})
    recorder = Recorder()

    bus_under_test.pull_until(late, recorder, lambda: b"after" in recorder.handled_data())

    assert b"before" not in recorder.handled_data()


def test_filters_deliver_only_matching_messages(bus_under_test: BusUnderTest) -> None:
    if bus_under_test.kind == "pubsub":
        pytest.skip(EMULATOR_IGNORES_FILTERS)
    topic = bus_under_test.topic()
    creates = bus_under_test.subscription(topic, filter='attributes.kind = "deployment.create"')
    urgent_or_tagged = bus_under_test.subscription(
        topic, filter='(attributes.priority = "high" OR attributes:tag) AND NOT attributes.kind = "reconcile.tick"'
    )
    bus_under_test.bus.publish(topic, b"c1", {"kind": "deployment.create"})
    bus_under_test.bus.publish(topic, b"d1", {"kind": "deployment.delete", "priority": "high"})
    bus_under_test.bus.publish(topic, b"t1", {"kind": "reconcile.tick", "tag": "x"})
    bus_under_test.bus.publish(topic, b"c2", {"kind": "deployment.create", "tag": ""})
    bus_under_test.bus.publish(topic, b"n1", {"kind": "deployment.stop", "priority": "low"})
    first, second = Recorder(), Recorder()

    bus_under_test.pull_until(creates, first, lambda: len(first.handled) >= 2)
    bus_under_test.pull_until(urgent_or_tagged, second, lambda: len(second.handled) >= 2)
    bus_under_test.bus.pull(creates, first, timeout_s=0)
    bus_under_test.bus.pull(urgent_or_tagged, second, timeout_s=0)

    assert first.handled_data() == [b"c1", b"c2"]
    assert second.handled_data() == [b"d1", b"c2"]


@pytest.mark.parametrize(
    ("bad_filter", "problem"),
    [
        ('attributes.kind == "x"', "expected a double-quoted value"),
        ("attributes.kind = x", "expected a double-quoted value"),
        ('attributes.kind = "x" AND attributes:a OR attributes:b', "AND and OR cannot be mixed"),
        ('attributes.kind = "x', "unterminated string"),
        ('attributes.kind != "x"', "'!=' is not supported"),
        ('hasPrefix(attributes.kind, "deploy")', "functions such as hasPrefix() are not supported"),
        ('kind = "x"', "expected 'attributes'"),
        ('attributes.kind = "x" and attributes:y', "must be upper case"),
        ("(attributes:kind", "expected ')'"),
        ("NOT", "found the end of the filter"),
        ('attributes.kind = "x" extra', "unexpected 'extra'"),
    ],
)
def test_a_bad_filter_is_rejected_naming_the_problem(
    bus_under_test: BusUnderTest, bad_filter: str, problem: str
) -> None:
    topic = bus_under_test.topic()

    with pytest.raises(ValueError, match=r"filter: ") as caught:
        bus_under_test.bus.ensure_subscription(topic, unique_name("sub"), filter=bad_filter)

    assert problem in str(caught.value)


def test_bad_names_and_attributes_are_rejected_before_reaching_the_bus(bus_under_test: BusUnderTest) -> None:
    topic = bus_under_test.topic()
    bus = bus_under_test.bus

    with pytest.raises(ValueError, match=r"topic: 't1' is not a valid Pub/Sub name"):
        bus.ensure_topic("t1")
    with pytest.raises(ValueError, match=r"attributes.n: value must be a string"):
        bus.publish(topic, b"x", {"n": 1})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match=r"attributes.timeout: the key is reserved"):
        bus.publish(topic, b"x", {"timeout": "5"})
    with pytest.raises(ValueError, match=r"data: a message needs non-empty data or at least one attribute"):
        bus.publish(topic, b"", {})
    with pytest.raises(ValueError, match=r"max_delivery_attempts: 2 is out of range"):
        bus.ensure_subscription(
            topic, unique_name("sub"), dead_letter_topic=bus_under_test.topic(), max_delivery_attempts=2
        )


def test_a_pull_with_nothing_waiting_returns_zero_and_a_negative_timeout_is_refused(
    bus_under_test: BusUnderTest,
) -> None:
    subscription = bus_under_test.subscription(bus_under_test.topic())
    recorder = Recorder()

    assert bus_under_test.bus.pull(subscription, recorder, timeout_s=0) == 0
    with pytest.raises(ValueError, match=r"^timeout_s: -1 must not be negative"):
        bus_under_test.bus.pull(subscription, recorder, timeout_s=-1)
    assert recorder.seen == []


def test_a_missing_topic_or_subscription_is_a_permanent_error(bus_under_test: BusUnderTest) -> None:
    with pytest.raises(PermanentError, match=r"does not exist|not found"):
        bus_under_test.bus.publish(unique_name("missing"), b"x", {"k": "v"})
    with pytest.raises(PermanentError, match=r"does not exist|not found"):
        bus_under_test.bus.pull(unique_name("missing"), Recorder(), timeout_s=1.0)


def test_ensuring_twice_changes_nothing_but_a_new_filter_is_refused(bus_under_test: BusUnderTest) -> None:
    topic = bus_under_test.topic()
    bus_under_test.bus.ensure_topic(topic)
    subscription = unique_name("sub")
    bus_under_test.bus.ensure_subscription(topic, subscription, filter="attributes:kind")
    bus_under_test.bus.ensure_subscription(topic, subscription, filter="attributes:kind")
    bus_under_test.bus.publish(topic, b"x", {"kind": "a"})
    recorder = Recorder()
    bus_under_test.pull_until(subscription, recorder, lambda: len(recorder.handled) == 1)

    with pytest.raises(PermanentError, match=r"topic and filter cannot change"):
        bus_under_test.bus.ensure_subscription(topic, subscription, filter='attributes.kind = "b"')
    assert recorder.handled_data() == [b"x"]


# --- LocalBus only: what the emulator does not enforce, and crashes --------------------------------------------


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def local_bus(tmp_path: Path, clock: ManualClock) -> Iterator[LocalBus]:
    bus = LocalBus(tmp_path / "bus.db", clock=clock, ack_deadline_s=30.0, backoff_min_s=0.5, backoff_max_s=60.0)
    try:
        yield bus
    finally:
        bus.close()


def _topic_and_subscription(bus: LocalBus, **options: object) -> tuple[str, str]:
    topic, subscription = unique_name("topic"), unique_name("sub")
    bus.ensure_topic(topic)
    bus.ensure_subscription(topic, subscription, **options)  # type: ignore[arg-type]
    return topic, subscription


def _crash(delivery: Delivery) -> None:
    raise SystemExit(f"process died while handling {delivery.message_id}")


class TestLocalBusDeadLetters:
    def test_a_message_that_keeps_failing_lands_on_the_dead_letter_subscription(
        self, local_bus: LocalBus, clock: ManualClock
    ) -> None:
        dead_topic, dead_subscription = _topic_and_subscription(local_bus)
        topic, subscription = _topic_and_subscription(local_bus, dead_letter_topic=dead_topic, max_delivery_attempts=5)
        local_bus.publish(topic, b"poison", {"kind": "deployment.create"}, ordering_key="gemma-a")
        failing = Recorder(fail_when=lambda delivery: True)

        for _ in range(10):
            local_bus.drain(subscription, failing)
            clock.advance(60)
        dead = Recorder()
        local_bus.drain(dead_subscription, dead)

        assert [d.attempt for d in failing.seen] == [1, 2, 3, 4, 5]
        (letter,) = dead.handled
        assert letter.data == b"poison"
        assert letter.ordering_key == "gemma-a"
        assert letter.attributes["kind"] == "deployment.create"
        assert letter.attributes[DEAD_LETTER_REASON] == "handler_failed"
        assert letter.attributes["CloudPubSubDeadLetterSourceDeliveryCount"] == "5"
        assert letter.attributes["CloudPubSubDeadLetterSourceSubscription"] == subscription
        assert letter.attributes[DEAD_LETTER_ERROR].startswith("RuntimeError: handler refused b'poison'")
        assert local_bus.backlog(subscription) == 0

    def test_a_dead_lettered_message_unblocks_the_next_one_of_its_key(
        self, local_bus: LocalBus, clock: ManualClock
    ) -> None:
        dead_topic, _ = _topic_and_subscription(local_bus)
        topic, subscription = _topic_and_subscription(local_bus, dead_letter_topic=dead_topic, max_delivery_attempts=5)
        local_bus.publish(topic, b"poison", {"n": "1"}, ordering_key="gemma-a")
        local_bus.publish(topic, b"next", {"n": "2"}, ordering_key="gemma-a")
        recorder = Recorder(fail_when=lambda delivery: delivery.data == b"poison")

        for _ in range(6):
            local_bus.drain(subscription, recorder)
            clock.advance(60)

        assert [d.data for d in recorder.seen] == [b"poison"] * 5 + [b"next"]
        assert recorder.handled_data() == [b"next"]

    def test_a_message_whose_consumers_keep_dying_is_dead_lettered_too(
        self, local_bus: LocalBus, clock: ManualClock
    ) -> None:
        dead_topic, dead_subscription = _topic_and_subscription(local_bus)
        topic, subscription = _topic_and_subscription(local_bus, dead_letter_topic=dead_topic, max_delivery_attempts=5)
        local_bus.publish(topic, b"kills-the-process", {"n": "1"})

        for _ in range(5):
            with pytest.raises(SystemExit):
                local_bus.pull(subscription, _crash, timeout_s=0)
            clock.advance(31)
        dead = Recorder()
        local_bus.drain(subscription, Recorder())
        local_bus.drain(dead_subscription, dead)

        (letter,) = dead.handled
        assert letter.attributes[DEAD_LETTER_REASON] == "ack_deadline_exceeded"
        assert letter.attributes["CloudPubSubDeadLetterSourceDeliveryCount"] == "5"
        assert DEAD_LETTER_ERROR not in letter.attributes

    def test_without_a_dead_letter_topic_a_failing_message_is_retried_forever(
        self, local_bus: LocalBus, clock: ManualClock
    ) -> None:
        topic, subscription = _topic_and_subscription(local_bus)
        local_bus.publish(topic, b"x", {"n": "1"})
        failing = Recorder(fail_when=lambda delivery: True)

        for _ in range(8):
            local_bus.drain(subscription, failing)
            clock.advance(60)

        assert [d.attempt for d in failing.seen] == list(range(1, 9))
        assert local_bus.backlog(subscription) == 1


class TestLocalBusCrashes:
    def test_a_message_leased_by_a_process_that_died_is_redelivered_after_the_deadline(
        self, local_bus: LocalBus, clock: ManualClock
    ) -> None:
        topic, subscription = _topic_and_subscription(local_bus)
        local_bus.publish(topic, b"in-flight", {"n": "1"})

        with pytest.raises(SystemExit):
            local_bus.pull(subscription, _crash, timeout_s=0)
        recorder = Recorder()
        clock.advance(29)
        local_bus.drain(subscription, recorder)
        assert recorder.seen == []
        clock.advance(1)
        local_bus.drain(subscription, recorder)

        assert [(d.data, d.attempt) for d in recorder.handled] == [(b"in-flight", 2)]

    def test_a_second_bus_on_the_same_file_picks_up_what_the_first_left_leased(
        self, local_bus: LocalBus, clock: ManualClock, tmp_path: Path
    ) -> None:
        topic, subscription = _topic_and_subscription(local_bus)
        local_bus.publish(topic, b"orphan", {"n": "1"})
        with pytest.raises(KeyboardInterrupt):
            local_bus.pull(subscription, lambda delivery: (_ for _ in ()).throw(KeyboardInterrupt), timeout_s=0)
        local_bus.close()  # the first process is gone

        with LocalBus(tmp_path / "bus.db", clock=clock) as survivor:
            recorder = Recorder()
            survivor.drain(subscription, recorder)
            early = list(recorder.seen)
            clock.advance(30)
            survivor.drain(subscription, recorder)

        assert early == []
        assert [(d.data, d.attempt) for d in recorder.handled] == [(b"orphan", 2)]

    def test_a_real_process_killed_mid_delivery_loses_nothing(self, tmp_path: Path) -> None:
        path = tmp_path / "shared.db"
        clock = ManualClock(start=datetime.now(UTC))  # the child leases on wall time
        with LocalBus(path, clock=clock) as bus:
            topic, subscription = _topic_and_subscription(bus)
            bus.publish(topic, b"survives", {"n": "1"})

            child = subprocess.run(
                [sys.executable, "-m", "tests.support.local_bus_crash", str(path), subscription],
                cwd=REPO_ROOT,
                env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                capture_output=True,
                timeout=60,
                check=False,
            )
            recorder = Recorder()
            bus.drain(subscription, recorder)
            leased_while_dead = list(recorder.seen)
            clock.advance(local_bus_crash.ACK_DEADLINE_S + 60)
            bus.drain(subscription, recorder)

        assert child.returncode == local_bus_crash.CRASHED, child.stderr.decode()
        assert leased_while_dead == []
        assert [(d.data, d.attempt) for d in recorder.handled] == [(b"survives", 2)]

    def test_messages_leased_but_not_yet_handled_are_given_back_when_the_handler_aborts(
        self, local_bus: LocalBus
    ) -> None:
        topic, subscription = _topic_and_subscription(local_bus)
        local_bus.publish(topic, b"first", {"n": "1"})
        local_bus.publish(topic, b"second", {"n": "2"})

        with pytest.raises(SystemExit):
            local_bus.pull(subscription, _crash, max_messages=2, timeout_s=0)
        recorder = Recorder()
        local_bus.drain(subscription, recorder)

        assert [(d.data, d.attempt) for d in recorder.handled] == [(b"second", 1)]

    def test_a_later_message_of_a_key_waits_while_an_earlier_one_is_leased(
        self, local_bus: LocalBus, clock: ManualClock
    ) -> None:
        topic, subscription = _topic_and_subscription(local_bus)
        local_bus.publish(topic, b"create", {"n": "1"}, ordering_key="gemma-a")
        local_bus.publish(topic, b"delete", {"n": "2"}, ordering_key="gemma-a")
        local_bus.publish(topic, b"other", {"n": "3"}, ordering_key="gemma-b")

        with pytest.raises(SystemExit):
            local_bus.pull(subscription, _crash, max_messages=1, timeout_s=0)
        recorder = Recorder()
        local_bus.drain(subscription, recorder)
        while_leased = recorder.handled_data()
        clock.advance(30)
        local_bus.drain(subscription, recorder)

        assert while_leased == [b"other"]
        assert recorder.handled_data() == [b"other", b"create", b"delete"]

    def test_the_bus_survives_a_restart_with_messages_still_owed(self, tmp_path: Path, clock: ManualClock) -> None:
        with LocalBus(tmp_path / "bus.db", clock=clock) as first:
            topic, subscription = _topic_and_subscription(first)
            message_id = first.publish(topic, b"durable", {"n": "1"})
        recorder = Recorder()

        with LocalBus(tmp_path / "bus.db", clock=clock) as second:
            acked = second.drain(subscription, recorder)

        assert acked == 1
        assert [(d.message_id, d.data) for d in recorder.handled] == [(message_id, b"durable")]


class TestLocalBusBackoff:
    def test_a_nacked_message_comes_back_only_when_its_backoff_is_due(
        self, local_bus: LocalBus, clock: ManualClock
    ) -> None:
        topic, subscription = _topic_and_subscription(local_bus)
        local_bus.publish(topic, b"x", {"n": "1"})
        recorder = Recorder(fail_when=lambda delivery: delivery.attempt <= 2)

        attempts_at: list[tuple[float, list[int]]] = []
        for step in (0.0, 0.4, 0.1, 0.9, 0.1):  # backoff 0.5 s after attempt 1, then 1.0 s after attempt 2
            clock.advance(step)
            local_bus.drain(subscription, recorder)
            attempts_at.append((step, [d.attempt for d in recorder.seen]))

        assert [attempts for _, attempts in attempts_at] == [[1], [1], [1, 2], [1, 2], [1, 2, 3]]
        assert recorder.handled_data() == [b"x"]

    def test_backoff_is_capped_at_its_maximum(self, tmp_path: Path, clock: ManualClock) -> None:
        with LocalBus(tmp_path / "bus.db", clock=clock, backoff_min_s=1.0, backoff_max_s=3.0) as bus:
            topic, subscription = _topic_and_subscription(bus)
            bus.publish(topic, b"x", {"n": "1"})
            recorder = Recorder(fail_when=lambda delivery: True)
            for _ in range(4):  # 1 s, 2 s, 3 s (capped), 3 s
                bus.drain(subscription, recorder)
                clock.advance(3.0)
            bus.drain(subscription, recorder)
            clock.advance(2.9)
            bus.drain(subscription, recorder)

        assert [d.attempt for d in recorder.seen] == [1, 2, 3, 4, 5]

    def test_a_transient_error_with_a_retry_hint_waits_at_least_that_long(
        self, local_bus: LocalBus, clock: ManualClock
    ) -> None:
        topic, subscription = _topic_and_subscription(local_bus)
        local_bus.publish(topic, b"x", {"n": "1"})
        seen: list[int] = []

        def rate_limited(delivery: Delivery) -> None:
            seen.append(delivery.attempt)
            if delivery.attempt == 1:
                raise TransientError("TPU API rate limit", retry_after_s=20.0)

        local_bus.drain(subscription, rate_limited)
        clock.advance(19)
        local_bus.drain(subscription, rate_limited)
        clock.advance(1)
        local_bus.drain(subscription, rate_limited)

        assert seen == [1, 2]


class TestLocalBusDispatch:
    def test_two_buses_on_one_file_share_the_work_without_handling_anything_twice(
        self, local_bus: LocalBus, clock: ManualClock, tmp_path: Path
    ) -> None:
        topic, subscription = _topic_and_subscription(local_bus)
        for index in range(60):
            local_bus.publish(topic, str(index).encode(), {"n": str(index)})
        recorder = Recorder()

        with LocalBus(tmp_path / "bus.db", clock=clock) as other:
            workers = [threading.Thread(target=bus.drain, args=(subscription, recorder)) for bus in (local_bus, other)]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join(timeout=60)

        assert sorted(int(data) for data in recorder.handled_data()) == list(range(60))
        assert local_bus.backlog(subscription) == 0

    def test_serve_delivers_in_a_thread_until_stopped(self, local_bus: LocalBus) -> None:
        topic, subscription = _topic_and_subscription(local_bus)
        arrived = threading.Event()
        recorder = Recorder()

        def handler(delivery: Delivery) -> None:
            recorder(delivery)
            arrived.set()

        stop = threading.Event()
        thread = local_bus.serve(subscription, handler, stop_event=stop, poll_interval_s=0.01)
        local_bus.publish(topic, b"pushed", {"n": "1"})
        delivered = arrived.wait(timeout=10)
        stop.set()
        thread.join(timeout=10)

        assert delivered
        assert not thread.is_alive()
        assert recorder.handled_data() == [b"pushed"]
        assert local_bus.backlog(subscription) == 0

    def test_a_waiting_pull_returns_as_soon_as_a_message_is_published(self, local_bus: LocalBus) -> None:
        topic, subscription = _topic_and_subscription(local_bus)
        recorder = Recorder()
        publisher = threading.Timer(0.05, local_bus.publish, args=(topic, b"late", {"n": "1"}))

        publisher.start()
        acked = local_bus.pull(subscription, recorder, timeout_s=10.0)
        publisher.join()

        assert acked == 1
        assert recorder.handled_data() == [b"late"]

    def test_serve_refuses_an_unknown_subscription(self, local_bus: LocalBus) -> None:
        with pytest.raises(PermanentError, match=r"subscription: 'nowhere' does not exist"):
            local_bus.serve("nowhere", Recorder(), stop_event=threading.Event(), poll_interval_s=0.1)

    def test_a_dead_letter_topic_must_exist_and_differ_from_the_topic(self, local_bus: LocalBus) -> None:
        topic = unique_name("topic")
        local_bus.ensure_topic(topic)

        with pytest.raises(PermanentError, match=r"dead_letter_topic: topic 'missing-dlt' does not exist"):
            local_bus.ensure_subscription(topic, unique_name("sub"), dead_letter_topic="missing-dlt")
        with pytest.raises(ValueError, match=r"dead_letter_topic: .* is the subscription's own topic"):
            local_bus.ensure_subscription(topic, unique_name("sub"), dead_letter_topic=topic)

    @pytest.mark.parametrize(
        ("options", "field"),
        [
            ({"ack_deadline_s": 0}, "ack_deadline_s"),
            ({"backoff_min_s": 5.0, "backoff_max_s": 1.0}, "backoff_min_s/backoff_max_s"),
            ({"busy_timeout_s": 0}, "busy_timeout_s"),
        ],
    )
    def test_bad_settings_are_refused_naming_the_field(
        self, tmp_path: Path, options: dict[str, float], field: str
    ) -> None:
        with pytest.raises(ValueError, match=rf"^{field}: "):
            LocalBus(tmp_path / "bus.db", **options)  # type: ignore[arg-type]


# --- PubSubBus only: what the adapter sends to the service ------------------------------------------------------


@pytest.mark.emulator
class TestPubSubSubscriptionSettings:
    def test_filter_ordering_retry_and_dead_letter_policy_land_on_the_subscription(
        self, pubsub_emulator: RunningEmulator
    ) -> None:
        bus = PubSubBus(pubsub_emulator.project, ack_deadline_s=20, backoff_min_s=5.0, backoff_max_s=120.0)
        try:
            topic, dead, subscription = unique_name("topic"), unique_name("dead"), unique_name("sub")
            bus.ensure_topic(topic)
            bus.ensure_topic(dead)
            bus.ensure_subscription(
                topic,
                subscription,
                filter='attributes.kind = "deployment.create"',
                dead_letter_topic=dead,
                max_delivery_attempts=7,
            )
            stored = bus._subscriber_client().get_subscription(subscription=bus.subscription_path(subscription))
            bus.ensure_subscription(
                topic,
                subscription,
                filter='attributes.kind = "deployment.create"',
                dead_letter_topic=dead,
                max_delivery_attempts=9,
            )
            updated = bus._subscriber_client().get_subscription(subscription=bus.subscription_path(subscription))
        finally:
            bus.close()

        assert stored.topic == f"projects/{pubsub_emulator.project}/topics/{topic}"
        assert stored.filter == 'attributes.kind = "deployment.create"'
        assert stored.enable_message_ordering is True
        assert stored.ack_deadline_seconds == 20
        assert stored.retry_policy.minimum_backoff.total_seconds() == 5.0
        assert stored.retry_policy.maximum_backoff.total_seconds() == 120.0
        assert stored.dead_letter_policy.dead_letter_topic == f"projects/{pubsub_emulator.project}/topics/{dead}"
        assert stored.dead_letter_policy.max_delivery_attempts == 7
        assert updated.dead_letter_policy.max_delivery_attempts == 9

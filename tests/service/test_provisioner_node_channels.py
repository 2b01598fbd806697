"""The provisioner opens each deployment's node channel before its node is created and closes it once it is gone.

On the simulator through the real TPU adapter, with a stateful fake ``NodeChannels`` that remembers which channels
are open and how many TPU creates the world had seen at each call, and once with the embedded bus's adapter.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.adapters.local_bus import LocalBus
from shared.adapters.node_channels import LocalBusNodeChannels
from shared.domain.errors import CloudError, ErrorClass
from shared.domain.models import Phase
from shared.ports import MissingSubscription, NodeChannels, node_channel
from shared.services.provisioner import Provisioner
from tests.support.fixtures_provisioner import HarnessFactory, spot, world
from tests.support.provisioner_harness import Harness

CHEAP = "us-central1-b"
EUROPE = "europe-west4-a"
ZONES = (CHEAP, EUROPE)
PLENTY = world({CHEAP: spot(8), EUROPE: spot(8)})
NODE_TASKS = "tpuctl-node-tasks"


def _creates(h: Harness) -> list[str]:
    return [e["resource"] for e in h.world.events() if e["kind"] == "qr.creating"]


class RecordingChannels:
    """A stateful ``NodeChannels``: open and close are idempotent; queued errors are raised first, one per call."""

    def __init__(self, h: Harness) -> None:
        self.h = h
        self.open_now: set[str] = set()
        self.calls: list[tuple[str, str, int]] = []  # (verb, deployment, TPU creates the world had seen)
        self.open_errors: list[CloudError] = []
        self.close_errors: list[CloudError] = []

    def open(self, deployment_id: str) -> str:
        self.calls.append(("open", deployment_id, len(_creates(self.h))))
        if self.open_errors:
            raise self.open_errors.pop(0)
        self.open_now.add(deployment_id)
        return node_channel(deployment_id)

    def close(self, deployment_id: str) -> bool:
        self.calls.append(("close", deployment_id, len(_creates(self.h))))
        if self.close_errors:
            raise self.close_errors.pop(0)
        existed = deployment_id in self.open_now
        self.open_now.discard(deployment_id)
        return existed

    def verbs(self, verb: str) -> list[tuple[str, str, int]]:
        return [call for call in self.calls if call[0] == verb]


def _with_channels(h: Harness, channels: NodeChannels) -> Harness:
    h.provisioner = Provisioner(h.store, h.tpu, h.clock, settings=h.settings, channels=channels)
    return h


@pytest.fixture
def h(harness_factory: HarnessFactory) -> Harness:
    return harness_factory(PLENTY)


@pytest.fixture
def channels(h: Harness) -> RecordingChannels:
    recording = RecordingChannels(h)
    _with_channels(h, recording)
    return recording


class TestOpen:
    def test_the_channel_is_open_before_the_first_create_and_a_repeated_create_changes_nothing(
        self, h: Harness, channels: RecordingChannels
    ) -> None:
        h.create(zones=ZONES)
        assert _creates(h) == ["gemma-g1-a0"]
        assert channels.calls[0] == ("open", "gemma", 0), "opened before the TPU create was sent"
        assert channels.open_now == {"gemma"}
        h.run_until_phase(Phase.BOOTING, minutes=10)
        assert h.create(zones=ZONES).startswith("gemma exists")  # a duplicate command
        h.tick()
        assert channels.open_now == {"gemma"}
        assert len(channels.verbs("open")) == 1, "opened per create, not per tick"
        assert channels.verbs("close") == []

    def test_a_hedged_create_opens_the_channel_once(self, h: Harness, channels: RecordingChannels) -> None:
        h.create(zones=ZONES, hedge=2)
        assert len(_creates(h)) == 2
        assert channels.verbs("open") == [("open", "gemma", 0)]

    def test_a_transient_failure_holds_the_create_back_until_the_next_tick(
        self, h: Harness, channels: RecordingChannels
    ) -> None:
        channels.open_errors.append(CloudError(ErrorClass.TRANSIENT, "pubsub: 503 unavailable"))
        outcome = h.create(zones=ZONES)
        assert "refused node-channel:transient" in outcome
        assert _creates(h) == [] and channels.open_now == set()
        h.run(1)
        assert _creates(h) == ["gemma-g1-a0"]
        assert channels.open_now == {"gemma"}
        opens = channels.verbs("open")
        assert [count for _verb, _dep, count in opens] == [0, 0], "each open came before its create"

    def test_a_permanent_failure_keeps_every_create_back_and_says_why_each_tick(
        self, h: Harness, channels: RecordingChannels
    ) -> None:
        denied = "pubsub.subscriptions.create denied"
        channels.open_errors.extend(CloudError(ErrorClass.PERMISSION, denied) for _ in range(4))
        h.create(zones=ZONES)
        h.run(3)
        assert _creates(h) == [], "no node without its channel"
        assert all("node-channel:permission" in tick for tick in h.ticks)
        h.run(2, until=lambda: bool(_creates(h)))
        assert _creates(h) == ["gemma-g1-a0"]
        assert channels.open_now == {"gemma"}
        h.assert_invariants()


class TestClose:
    def test_delete_closes_the_channel_once_and_a_new_generation_opens_it_again(
        self, h: Harness, channels: RecordingChannels
    ) -> None:
        h.create(zones=ZONES)
        h.run_until_phase(Phase.BOOTING, minutes=10)
        h.delete()
        h.run_until_phase(Phase.DELETED, minutes=10)
        assert channels.open_now == set()
        assert len(channels.verbs("close")) == 1
        assert "already deleting" in h.delete()  # a repeated delete: nothing more to close
        h.tick()
        assert len(channels.verbs("close")) == 1
        assert h.create(zones=ZONES).startswith("created gemma generation 2")
        assert channels.open_now == {"gemma"}
        h.assert_invariants()

    def test_a_deployment_stays_deleting_until_its_channel_is_closed(
        self, h: Harness, channels: RecordingChannels
    ) -> None:
        h.create(zones=ZONES)
        h.run_until_phase(Phase.BOOTING, minutes=10)
        channels.close_errors.extend(
            [
                CloudError(ErrorClass.TRANSIENT, "pubsub: 503 unavailable"),
                CloudError(ErrorClass.PERMISSION, "pubsub.subscriptions.delete denied"),
            ]
        )
        h.delete()
        h.run(10, until=lambda: len(channels.verbs("close")) >= 2)
        record = h.record()
        assert record.status.phase is Phase.DELETING
        assert "waiting to close the node channel" in record.status.message
        assert "pubsub.subscriptions.delete denied" in record.status.message
        assert h.qrs() == {}, "the TPU is gone; only the channel holds the deployment back"
        h.run_until_phase(Phase.DELETED, minutes=5)
        assert channels.open_now == set()
        assert len(channels.verbs("close")) == 3

    def test_a_ttl_teardown_closes_the_channel_too(self, h: Harness, channels: RecordingChannels) -> None:
        h.create(zones=ZONES, ttl_hours=1)
        h.run(90, step_s=300, until=lambda: h.record().status.phase is Phase.DELETED)
        assert h.record().status.phase is Phase.DELETED
        assert channels.open_now == set()

    def test_stop_keeps_the_channel_and_start_reopens_it_idempotently(
        self, h: Harness, channels: RecordingChannels
    ) -> None:
        h.create(zones=ZONES)
        h.run_until_phase(Phase.BOOTING, minutes=10)
        h.stop()
        h.run_until_phase(Phase.STOPPED, minutes=10)
        assert channels.open_now == {"gemma"} and channels.verbs("close") == []
        h.start()
        h.run_until_phase(Phase.BOOTING, minutes=10)
        assert channels.open_now == {"gemma"}
        assert len(channels.verbs("open")) == 2


@pytest.fixture
def bus(tmp_path: Path) -> Iterator[LocalBus]:
    bus = LocalBus(tmp_path / "bus.sqlite")
    bus.ensure_topic(NODE_TASKS)
    try:
        yield bus
    finally:
        bus.close()


def test_on_the_embedded_bus_the_subscription_lives_exactly_as_long_as_the_deployment(
    harness_factory: HarnessFactory, bus: LocalBus
) -> None:
    h = _with_channels(harness_factory(PLENTY), LocalBusNodeChannels(bus, NODE_TASKS))
    h.create(zones=ZONES)
    assert bus.backlog("tpuctl-node-gemma") == 0  # it exists, filtered on the deployment
    bus.publish(NODE_TASKS, b"{}", {"deployment_id": "gemma"})
    bus.publish(NODE_TASKS, b"{}", {"deployment_id": "someone-else"})
    assert bus.backlog("tpuctl-node-gemma") == 1
    h.create(zones=ZONES)  # a duplicate create: the same subscription, its backlog kept
    assert bus.backlog("tpuctl-node-gemma") == 1
    h.delete()
    h.run_until_phase(Phase.DELETED, minutes=10)
    with pytest.raises(MissingSubscription):
        bus.backlog("tpuctl-node-gemma")

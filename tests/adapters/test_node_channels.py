"""``NodeChannels`` adapters and the subscription grant.

* ``PubSubSubscriptionIam`` against a loopback stand-in of Pub/Sub's REST IAM methods (the wire, the etag
  read-modify-write, retries on a concurrent change, error classes), and against the real emulator, which answers
  that it implements no IAM: why the grant has an endpoint of its own (docs/twin.md).
* One contract for ``LocalBusNodeChannels`` (SQLite) and ``PubSubNodeChannels`` on the real Pub/Sub emulator
  (marker ``emulator``, skipped with the reason when google-cloud-cli is missing): open is idempotent, a message for
  the deployment arrives on the channel, close is idempotent and drops the subscription.
* Pub/Sub only: what the subscription is made with, a name taken by another topic or filter, the grant to the
  readers on the stand-in, and transient errors tried again.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import google.api_core.exceptions as gexc
import pytest

from shared.adapters.clock import ManualClock
from shared.adapters.local_bus import LocalBus
from shared.adapters.node_channels import SUBSCRIBER_ROLE, LocalBusNodeChannels, PubSubNodeChannels
from shared.adapters.pubsub_bus import PubSubBus
from shared.adapters.pubsub_iam import PubSubSubscriptionIam, with_member
from shared.domain.errors import CloudError, ErrorClass
from shared.ports import CommandBus, Delivery, MissingSubscription, NodeChannels, node_channel
from tests.support.emulators import RunningEmulator, unique_name
from tests.support.pubsub_iam_standin import PubSubIamStandIn, serve_pubsub_iam

PROJECT = "demo-tpuctl"
VM = "serviceAccount:tpuctl-tpu-vm@demo-tpuctl.iam.gserviceaccount.com"


@pytest.fixture
def stand_in() -> Iterator[PubSubIamStandIn]:
    with serve_pubsub_iam() as served:
        yield served


# --- the grant -----------------------------------------------------------------------------------------------


class TestSubscriptionIam:
    def test_a_grant_reads_then_writes_with_the_etag_and_a_second_one_writes_nothing(
        self, stand_in: PubSubIamStandIn
    ) -> None:
        iam = PubSubSubscriptionIam(PROJECT, endpoint=stand_in.base_url)
        try:
            assert iam.grant("tpuctl-node-gemma", SUBSCRIBER_ROLE, VM) is True
            assert iam.grant("tpuctl-node-gemma", SUBSCRIBER_ROLE, VM) is False
        finally:
            iam.close()
        path = f"/v1/projects/{PROJECT}/subscriptions/tpuctl-node-gemma"
        assert [(method, where) for method, where, _auth in stand_in.requests] == [
            ("GET", f"{path}:getIamPolicy"),
            ("POST", f"{path}:setIamPolicy"),
            ("GET", f"{path}:getIamPolicy"),
        ]
        assert all(auth is None for _m, _w, auth in stand_in.requests), "anonymous on an explicit endpoint"
        assert stand_in.members("tpuctl-node-gemma", SUBSCRIBER_ROLE) == {VM}

    def test_other_bindings_are_kept_and_a_concurrent_change_is_read_again(self, stand_in: PubSubIamStandIn) -> None:
        resource = f"projects/{PROJECT}/subscriptions/tpuctl-node-gemma"
        operator = "user:operator@example.com"
        stand_in.policies[resource] = {
            "etag": "BwX1",
            "version": 3,
            "bindings": [
                {"role": "roles/pubsub.viewer", "members": [operator]},
                {"role": SUBSCRIBER_ROLE, "members": [operator], "condition": {"title": "t", "expression": "true"}},
            ],
        }
        stand_in.race_next_set = True
        iam = PubSubSubscriptionIam(PROJECT, endpoint=stand_in.base_url)
        assert iam.grant("tpuctl-node-gemma", SUBSCRIBER_ROLE, VM) is True
        methods = [method for method, _where, _auth in stand_in.requests]
        assert methods == ["GET", "POST", "GET", "POST"], "409 on the first write, then read and write again"
        bindings = stand_in.policies[resource]["bindings"]
        assert {"role": "roles/pubsub.viewer", "members": [operator]} in bindings
        assert stand_in.members("tpuctl-node-gemma", SUBSCRIBER_ROLE) == {VM}, "the conditional binding is not it"
        assert stand_in.policies[resource]["version"] == 3

    @pytest.mark.parametrize(
        ("status", "error_class"),
        [
            (403, ErrorClass.PERMISSION),
            (404, ErrorClass.NOT_FOUND),
            (400, ErrorClass.INVALID),
            (429, ErrorClass.RATE_LIMIT),
            (503, ErrorClass.TRANSIENT),
        ],
    )
    def test_errors_are_classified(self, stand_in: PubSubIamStandIn, status: int, error_class: ErrorClass) -> None:
        stand_in.fail_next.append(status)
        iam = PubSubSubscriptionIam(PROJECT, endpoint=stand_in.base_url)
        with pytest.raises(CloudError) as raised:
            iam.grant("tpuctl-node-gemma", SUBSCRIBER_ROLE, VM)
        assert raised.value.error_class is error_class and raised.value.code == status
        if status == 403:
            assert "tpuctlNodeChannels" in str(raised.value)

    def test_a_write_that_keeps_losing_races_is_transient(self, stand_in: PubSubIamStandIn) -> None:
        original = stand_in.next_etag

        def racing_etag() -> str:
            stand_in.race_next_set = True  # every write meets a concurrent change
            return original()

        stand_in.race_next_set = True
        stand_in.next_etag = racing_etag  # type: ignore[method-assign]
        iam = PubSubSubscriptionIam(PROJECT, endpoint=stand_in.base_url, attempts=2)
        with pytest.raises(CloudError) as raised:
            iam.grant("tpuctl-node-gemma", SUBSCRIBER_ROLE, VM)
        assert raised.value.code == 409 and raised.value.transient
        assert [method for method, _where, _auth in stand_in.requests] == ["GET", "POST", "GET", "POST"]

    def test_an_unreachable_endpoint_is_transient(self) -> None:
        iam = PubSubSubscriptionIam(PROJECT, endpoint="http://127.0.0.1:9", timeout_s=2)
        with pytest.raises(CloudError) as raised:
            iam.grant("tpuctl-node-gemma", SUBSCRIBER_ROLE, VM)
        assert raised.value.error_class is ErrorClass.TRANSIENT

    def test_with_member_adds_to_the_unconditional_binding_only(self) -> None:
        policy = {"etag": "e", "bindings": [{"role": SUBSCRIBER_ROLE, "members": ["user:a@example.com"]}]}
        updated = with_member(policy, SUBSCRIBER_ROLE, VM)
        assert updated == {
            "etag": "e",
            "version": 1,
            "bindings": [{"role": SUBSCRIBER_ROLE, "members": ["user:a@example.com", VM]}],
        }
        assert with_member(updated, SUBSCRIBER_ROLE, VM) is None
        assert with_member({"etag": "ACAB"}, SUBSCRIBER_ROLE, VM) == {
            "etag": "ACAB",
            "version": 1,
            "bindings": [{"role": SUBSCRIBER_ROLE, "members": [VM]}],
        }

    @pytest.mark.emulator
    def test_the_emulator_implements_no_iam_so_the_grant_has_its_own_endpoint(
        self, pubsub_emulator: RunningEmulator
    ) -> None:
        """Checked on the emulator this machine ships: GetIamPolicy over gRPC answers UNIMPLEMENTED (501)."""
        import google.cloud.pubsub_v1 as pubsub_v1

        topic, name = unique_name("iam-topic"), unique_name("iam-sub")
        bus = PubSubBus(pubsub_emulator.project)
        subscriber = pubsub_v1.SubscriberClient()
        try:
            bus.ensure_topic(topic)
            bus.ensure_subscription(topic, name)
            with pytest.raises(gexc.MethodNotImplemented):
                subscriber.get_iam_policy(request={"resource": bus.subscription_path(name)})
        finally:
            subscriber.close()
            bus.close()


# --- the contract --------------------------------------------------------------------------------------------


@dataclass
class ChannelsUnderTest:
    channels: NodeChannels
    bus: CommandBus
    topic: str
    kind: str  # "local" | "pubsub"

    def deliveries(self, subscription: str) -> list[Delivery]:
        seen: list[Delivery] = []
        for _ in range(20 if self.kind == "pubsub" else 1):
            self.bus.pull(subscription, seen.append, max_messages=10, timeout_s=1.0 if self.kind == "pubsub" else 0)
            if seen:
                break
        return seen


@pytest.fixture(params=["local", pytest.param("pubsub", marks=pytest.mark.emulator)])
def under_test(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ChannelsUnderTest]:
    topic = unique_name("node-tasks")
    if request.param == "local":
        local = LocalBus(tmp_path / "bus.sqlite", clock=ManualClock())
        local.ensure_topic(topic)
        try:
            yield ChannelsUnderTest(LocalBusNodeChannels(local, topic), local, topic, "local")
        finally:
            local.close()
        return
    emulator: RunningEmulator = request.getfixturevalue("pubsub_emulator")
    remote = PubSubBus(emulator.project, ack_deadline_s=10)
    remote.ensure_topic(topic)
    with serve_pubsub_iam() as stand_in:
        channels = PubSubNodeChannels(
            emulator.project,
            topic,
            iam=PubSubSubscriptionIam(emulator.project, endpoint=stand_in.base_url),
            readers=(VM,),
            retry_wait_s=0,
        )
        try:
            yield ChannelsUnderTest(channels, remote, topic, "pubsub")
        finally:
            channels.close_client()
            remote.close()


def _deployment() -> str:
    return unique_name("dep")[:30]


def test_open_is_idempotent_and_the_deployments_messages_arrive_on_the_channel(under_test: ChannelsUnderTest) -> None:
    deployment = _deployment()
    name = under_test.channels.open(deployment)
    assert name == node_channel(deployment) == f"tpuctl-node-{deployment}"
    under_test.bus.publish(under_test.topic, b"first", {"deployment_id": deployment}, ordering_key=deployment)
    assert under_test.channels.open(deployment) == name  # again: the subscription and its backlog stay
    seen = under_test.deliveries(name)
    assert [delivery.data for delivery in seen] == [b"first"]


def test_close_drops_the_channel_and_is_idempotent(under_test: ChannelsUnderTest) -> None:
    deployment = _deployment()
    name = under_test.channels.open(deployment)
    assert under_test.channels.close(deployment) is True
    assert under_test.channels.close(deployment) is False
    with pytest.raises(MissingSubscription):
        under_test.bus.pull(name, lambda delivery: None, max_messages=1, timeout_s=0)
    assert under_test.channels.open(deployment) == name  # a new generation opens it again
    assert under_test.channels.close(deployment) is True


def test_the_channel_takes_only_its_deployments_messages_on_the_local_bus(under_test: ChannelsUnderTest) -> None:
    if under_test.kind == "pubsub":
        pytest.skip("the Pub/Sub emulator accepts filters but delivers every message; the filter is checked below")
    deployment = _deployment()
    name = under_test.channels.open(deployment)
    under_test.bus.publish(under_test.topic, b"other", {"deployment_id": "someone-else"})
    under_test.bus.publish(under_test.topic, b"mine", {"deployment_id": deployment})
    assert [delivery.data for delivery in under_test.deliveries(name)] == [b"mine"]


# --- Pub/Sub only --------------------------------------------------------------------------------------------


@pytest.mark.emulator
class TestPubSubNodeChannels:
    def test_the_subscription_is_filtered_labelled_ordered_and_the_vm_granted(
        self, pubsub_emulator: RunningEmulator
    ) -> None:
        import google.cloud.pubsub_v1 as pubsub_v1

        topic, deployment = unique_name("node-tasks"), _deployment()
        bus = PubSubBus(pubsub_emulator.project)
        subscriber = pubsub_v1.SubscriberClient()
        with serve_pubsub_iam() as stand_in:
            channels = PubSubNodeChannels(
                pubsub_emulator.project,
                topic,
                iam=PubSubSubscriptionIam(pubsub_emulator.project, endpoint=stand_in.base_url),
                readers=(VM,),
                subscriber=subscriber,
            )
            try:
                bus.ensure_topic(topic)
                name = channels.open(deployment)
                stored = subscriber.get_subscription(request={"subscription": bus.subscription_path(name)})
                assert stored.topic == bus.topic_path(topic)
                assert stored.filter == f'attributes.deployment_id = "{deployment}"'
                assert stored.enable_message_ordering is True
                assert stored.ack_deadline_seconds == 60
                assert dict(stored.labels) == {"managed-by": "tpuctl", "tpuctl-deployment": deployment}
                assert not stored.dead_letter_policy.dead_letter_topic
                assert stand_in.members(name, SUBSCRIBER_ROLE, pubsub_emulator.project) == {VM}
                writes = len(stand_in.requests)
                channels.open(deployment)
                assert [m for m, _w, _a in stand_in.requests[writes:]] == ["GET"], "held already: no write"
                assert channels.close(deployment) is True
            finally:
                channels.close_client()
                subscriber.close()
                bus.close()

    def test_a_name_taken_on_another_topic_or_filter_is_refused_with_the_fix(
        self, pubsub_emulator: RunningEmulator
    ) -> None:
        topic, other, deployment = unique_name("node-tasks"), unique_name("commands"), _deployment()
        bus = PubSubBus(pubsub_emulator.project)
        channels = PubSubNodeChannels(pubsub_emulator.project, topic)
        try:
            bus.ensure_topic(topic)
            bus.ensure_topic(other)
            bus.ensure_subscription(other, node_channel(deployment))
            with pytest.raises(CloudError) as raised:
                channels.open(deployment)
            assert raised.value.error_class is ErrorClass.INVALID
            assert "gcloud pubsub subscriptions delete" in str(raised.value)
            assert channels.close(deployment) is True
        finally:
            channels.close_client()
            bus.close()

    def test_a_channel_made_by_an_older_agent_is_adopted(self, pubsub_emulator: RunningEmulator) -> None:
        topic, deployment = unique_name("node-tasks"), _deployment()
        bus = PubSubBus(pubsub_emulator.project)
        channels = PubSubNodeChannels(pubsub_emulator.project, topic)
        try:
            bus.ensure_topic(topic)
            bus.ensure_subscription(
                topic, node_channel(deployment), filter=f'attributes.deployment_id = "{deployment}"'
            )
            assert channels.open(deployment) == node_channel(deployment)
            assert channels.close(deployment) is True
        finally:
            channels.close_client()
            bus.close()


class _FlakySubscriber:
    """A subscriber client whose first calls fail as a busy service does."""

    def __init__(self, failures: list[Exception]) -> None:
        self.failures = failures
        self.calls: list[str] = []

    def create_subscription(self, **_kwargs: object) -> None:
        self.calls.append("create")
        if self.failures:
            raise self.failures.pop(0)

    def delete_subscription(self, **_kwargs: object) -> None:
        self.calls.append("delete")
        if self.failures:
            raise self.failures.pop(0)


def test_transient_errors_are_tried_again_and_permanent_ones_are_not() -> None:
    flaky = _FlakySubscriber([gexc.ServiceUnavailable("busy"), gexc.TooManyRequests("slow down")])
    waits: list[float] = []
    channels = PubSubNodeChannels(PROJECT, "tpuctl-node-tasks", subscriber=flaky, sleep=waits.append)
    assert channels.open("gemma") == "tpuctl-node-gemma"
    assert flaky.calls == ["create"] * 3 and waits == [1.0, 2.0]
    flaky.failures.append(gexc.PermissionDenied("no pubsub.subscriptions.delete"))
    with pytest.raises(CloudError) as raised:
        channels.close("gemma")
    assert raised.value.error_class is ErrorClass.PERMISSION and flaky.calls[-1:] == ["delete"]
    flaky.failures.extend([gexc.ServiceUnavailable("busy")] * 3)
    with pytest.raises(CloudError) as transient:
        channels.close("gemma")
    assert transient.value.transient and flaky.calls.count("delete") == 4
    flaky.failures.append(gexc.NotFound("gone"))
    assert channels.close("gemma") is False


def test_readers_need_an_iam_adapter_and_must_be_members() -> None:
    with pytest.raises(ValueError, match="iam"):
        PubSubNodeChannels(PROJECT, "tpuctl-node-tasks", readers=(VM,))
    with pytest.raises(ValueError, match="IAM member"):
        PubSubNodeChannels(
            PROJECT,
            "tpuctl-node-tasks",
            iam=PubSubSubscriptionIam(PROJECT, endpoint="http://127.0.0.1:9"),
            readers=("tpuctl-tpu-vm@demo-tpuctl.iam.gserviceaccount.com",),
        )

"""Which ``NodeChannels`` the runtime wires, and whom it grants: configuration, never a question of where it runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.adapters.node_channels import LocalBusNodeChannels, PubSubNodeChannels
from shared.adapters.pubsub_iam import DEFAULT_ENDPOINT, PubSubSubscriptionIam
from shared.config import Settings
from shared.wiring import Runtime

VM = "tpuctl-tpu-vm@proof-project.iam.gserviceaccount.com"


def test_on_google_cloud_the_vm_account_is_the_reader_granted_through_pubsub_iam() -> None:
    runtime = Runtime(Settings(backend="gcp", project="proof-project", node_service_account=VM))
    channels = runtime.node_channels
    assert isinstance(channels, PubSubNodeChannels)
    assert channels.topic == "tpuctl-node-tasks" and channels.project == "proof-project"
    assert channels.readers == (f"serviceAccount:{VM}",)
    iam = channels._iam
    assert isinstance(iam, PubSubSubscriptionIam) and iam.base_url == DEFAULT_ENDPOINT
    runtime.close()


def test_the_iam_endpoint_is_a_setting_and_no_vm_account_means_no_grant() -> None:
    settings = Settings(backend="gcp", project="proof-project", pubsub_iam_endpoint="http://127.0.0.1:8089")
    channels = Runtime(settings).node_channels
    assert isinstance(channels, PubSubNodeChannels)
    assert channels.readers == ()
    assert isinstance(channels._iam, PubSubSubscriptionIam) and channels._iam.base_url == "http://127.0.0.1:8089"


def test_the_embedded_stack_uses_the_local_bus(tmp_path: Path) -> None:
    runtime = Runtime(Settings(backend="local", data_dir=tmp_path, topic_node_tasks="node-tasks-x"))
    try:
        channels = runtime.node_channels
        assert isinstance(channels, LocalBusNodeChannels) and channels.topic == "node-tasks-x"
        assert channels.bus is runtime.bus
    finally:
        runtime.close()


def test_a_malformed_iam_endpoint_is_refused_naming_the_setting() -> None:
    with pytest.raises(ValueError, match="pubsub_iam_endpoint"):
        Settings(pubsub_iam_endpoint="pubsub.googleapis.com")

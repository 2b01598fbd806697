"""``build_ports``: the embedded stack from settings, built lazily; the Google Cloud one builds nothing up front."""

from __future__ import annotations

from pathlib import Path

from mcp_client_gateway.composition import build_ports, warm_up
from mcp_client_gateway.core import GatewayCore
from shared.adapters.local_bus import LocalBus
from shared.config import Settings
from shared.messages import CreateDeployment, decode_message
from shared.ports import Delivery


def test_the_local_ports_share_the_controllers_files_and_publish_on_the_command_topic(tmp_path: Path) -> None:
    settings = Settings(backend="local", data_dir=tmp_path / "var")
    observer = LocalBus(tmp_path / "var" / "bus.sqlite")
    observer.ensure_topic(settings.topic_commands)
    observer.ensure_subscription(settings.topic_commands, "observer")
    ports = build_ports(settings)
    try:
        warm_up(ports)
        accepted = GatewayCore(ports).create_deployment(
            deployment_id="tiny-a", model="tiny-llama", accelerator="v6e-1", zones=["us-east5-b"]
        )
        assert GatewayCore(ports).list_deployments().total == 0
    finally:
        ports.close()
    received: list[CreateDeployment] = []

    def keep(delivery: Delivery) -> None:
        received.append(decode_message(delivery.data))

    observer.pull("observer", keep, timeout_s=0)
    observer.close()
    assert [m.command_id for m in received] == [accepted.command_id]
    assert (tmp_path / "var" / "state.sqlite").exists()


def test_google_cloud_ports_connect_nothing_until_used() -> None:
    ports = build_ports(Settings(backend="gcp", project="tpuctl-test-1"))
    assert ports.settings.project == "tpuctl-test-1"
    assert not ports.store.built, "the Firestore client must not be built before a tool needs it"
    assert not ports.bus.built and not ports.logs.built
    ports.close()  # closing unbuilt ports touches nothing

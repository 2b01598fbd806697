"""``tpuctl prewarm`` end to end in the production-path twin (issue 20, item 3): the builder VM boots from its
rendered startup script under the builder service account, compiles (vLLM on CPU without ``--enforce-eager``),
serves nothing (its endpoint never answers), fills the region's shared compile cache, says ``prewarmed`` and is
deleted by the monitor with nothing left behind; the next deployment of the same plan restores the compiled
artefacts from the bucket before its engine starts and boots warm.

Skipped with the reason where the emulators (google-cloud-cli), the vLLM CPU tier or namespaces are missing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from benchmarks.startup import prewarmed, serving_vm, wait_for
from localcloud.demo import DemoSpec, LocalDemo
from localcloud.runner import LocalCloud
from mcp_client_gateway.composition import build_ports
from mcp_client_gateway.core import GatewayCore
from shared.domain.compile_cache import COMPILE_PREFIX
from shared.domain.models import Phase
from tests.support.production_twin import production_twin

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.emulator]

SPEC = DemoSpec(deployment_id="served", zones=("us-east5-a",), tiers=("spot",), hedge=1, valid_until_minutes=None)
BUILDER = "warm"
STEP_TIMEOUT_S = 300.0
# The controller's clock runs 60x the wall here and vLLM on CPU compiles in wall time (about 90 s): the default
# 2 h backstop would be 2 wall minutes, so the twin's builder gets a day (24 wall minutes).
PREWARM_TTL_HOURS = 24.0


@pytest.fixture
def twin(tmp_path: Path) -> Iterator[tuple[LocalCloud, LocalDemo]]:
    with production_twin(tmp_path / "cloud", twin_compile=True) as cloud:
        cloud.world.set_capacity("us-east5-a", "spot", 8)
        yield cloud, LocalDemo(cloud, GatewayCore(build_ports(cloud.settings)), SPEC, emit=lambda line: None)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _builder_endpoint_while_compiling(cloud: LocalCloud) -> str:
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while time.monotonic() < deadline:
        record = cloud.store.get_deployment(BUILDER)
        boot = record.status.boot if record is not None else None
        if record is not None and record.status.endpoint and boot is not None and boot.stage == "compiling":
            return record.status.endpoint
        time.sleep(0.5)
    raise AssertionError("the builder never reached compiling")


def _compile_objects(cloud: LocalCloud) -> list[str]:
    storage = cloud.data_dir / "storage"
    return sorted(
        path.relative_to(storage).as_posix().split("/", 1)[1]
        for path in storage.rglob("*")
        if path.is_file() and f"/{COMPILE_PREFIX}" in path.as_posix()
    )


def test_a_prewarm_fills_the_shared_compile_cache_and_the_next_boot_restores_it(
    twin: tuple[LocalCloud, LocalDemo],
) -> None:
    cloud, demo = twin
    accepted = demo.gateway.create_deployment(
        deployment_id=BUILDER, model=SPEC.model, accelerator=SPEC.accelerator, zones=list(SPEC.zones),
        tiers=list(SPEC.tiers), hedge=1, prewarm=True, ttl_hours=PREWARM_TTL_HOURS,
    )  # fmt: skip
    assert accepted.command_id
    endpoint = _builder_endpoint_while_compiling(cloud)
    assert not _answers(f"http://{endpoint}/health"), "a builder serves nothing: no proxy listens on its port"
    builder, _stamp, stages = wait_for(prewarmed(cloud, exclude=()), "prewarm")
    assert stages.compile_fill == "filled" and stages.compile_cache == "cold"
    manifest, archive = _compile_objects(cloud)
    assert archive.startswith(manifest.removesuffix(".json") + "/") and archive.endswith(".tar")

    deadline = time.monotonic() + STEP_TIMEOUT_S
    while (record := cloud.store.get_deployment(BUILDER)) is not None and record.status.phase is not Phase.DELETED:
        assert time.monotonic() < deadline, f"the builder was not deleted: {record.status.phase}"
        time.sleep(1)
    assert record is not None and record.status.resources == [], "the builder's slice is gone"
    assert record.status.boot is not None and record.status.boot.stage == "prewarmed"

    demo.deploy()
    node, _stamp, served = wait_for(serving_vm(cloud, exclude=(builder,)), "served boot")
    assert (served.compile_restore, served.compile_cache) == ("hit", "warm"), served
    assert served.weights_source == "bucket"  # the builder filled the weights cache too
    demo.wait_until_serving(STEP_TIMEOUT_S)
    demo.teardown(STEP_TIMEOUT_S)
    assert demo.resources_left() == 0 and node != builder

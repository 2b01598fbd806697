"""The real gcloud (its beta track, where calendar mode lives) against the simulator's calendar-mode wire:
``gcloud beta compute advice calendar-mode`` and ``future-reservations create|describe|list|delete``, and the
controller's adapter sees what gcloud booked. Skipped where gcloud is not installed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from localcloud.tpu_sim import SimServer, World
from shared.adapters.compute_calendar import ComputeCalendarReservations
from tests.support.fixtures_compute_sim import lab_world

GCLOUD = shutil.which("gcloud")
ZONE = "us-east5-a"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(GCLOUD is None, reason="gcloud is not installed"),
]


class Gcloud:
    def __init__(self, base_url: str, project: str, config: Path) -> None:
        self.project = project
        self.env = {
            **os.environ,
            "CLOUDSDK_CONFIG": str(config),
            "CLOUDSDK_CORE_PROJECT": project,
            "CLOUDSDK_AUTH_DISABLE_CREDENTIALS": "true",
            "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE": f"{base_url}/compute/beta/",
        }

    def __call__(self, *args: str) -> Any:
        assert GCLOUD is not None
        done = subprocess.run(  # a fixed argv, no shell
            [GCLOUD, "beta", "compute", *args, "--format=json"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout or "null")


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[tuple[World, Gcloud, ComputeCalendarReservations]]:
    world = World(lab_world({ZONE: {"capacity": {"v6e": {"on_demand": 8}}}}))
    server = SimServer(world)
    base_url = server.start()
    yield (
        world,
        Gcloud(base_url, world.scenario.project, tmp_path / "gcloud"),
        ComputeCalendarReservations(world.scenario.project, endpoint=base_url),
    )
    server.stop()


def test_gcloud_books_a_window_the_simulator_advised_and_the_adapter_sees_it(
    sim: tuple[World, Gcloud, ComputeCalendarReservations],
) -> None:
    world, gcloud, adapter = sim
    start = world.clock.now().replace(microsecond=0)
    advised = gcloud(
        "advice",
        "calendar-mode",
        "--region=us-east5",
        "--tpu-version=V6E",
        "--chip-count=4",
        "--workload-type=SERVING",
        "--duration-range=min=24h,max=24h",
        f"--start-time-range=from={start.isoformat()},to={(start + timedelta(days=10)).isoformat()}",
    )
    (recommendation,) = advised[0]["recommendations"]
    spec = recommendation["recommendationsPerSpec"]["spec"]
    assert spec["location"] == f"zones/{ZONE}" and spec["recommendationType"] == "FUTURE_RESERVATION"

    gcloud(
        "future-reservations",
        "create",
        "tpuctl-cal-by-hand",
        f"--zone={ZONE}",
        "--tpu-version=V6E",
        "--chip-count=4",
        "--workload-type=SERVING",
        f"--start-time={spec['startTime']}",
        f"--end-time={spec['endTime']}",
        "--reservation-mode=CALENDAR",
        "--require-specific-reservation",
        "--auto-delete-auto-created-reservations",
        "--planning-status=SUBMITTED",
        "--deployment-type=DENSE",
    )
    described = gcloud("future-reservations", "describe", "tpuctl-cal-by-hand", f"--zone={ZONE}")
    assert described["status"]["procurementStatus"] == "PENDING_APPROVAL"
    assert described["aggregateReservation"]["vmFamily"] == "VM_FAMILY_CLOUD_TPU_LITE_POD_SLICE_CT6E"
    assert adapter.list_names([ZONE]) == [(ZONE, "tpuctl-cal-by-hand")]
    assert adapter.procurement(ZONE, "tpuctl-cal-by-hand") == "PENDING_APPROVAL"

    gcloud("future-reservations", "delete", "tpuctl-cal-by-hand", f"--zone={ZONE}")
    assert gcloud("future-reservations", "list", f"--zones={ZONE}") == []
    assert adapter.procurement(ZONE, "tpuctl-cal-by-hand") is None

"""``SimulatorClock`` against a real simulator: every process of the local cloud must read the same virtual time."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from pydantic import ValidationError

from localcloud.tpu_sim import SimServer, World
from shared.adapters.sim_clock import SimulatorClock
from shared.config import Settings
from shared.domain.errors import TransientError
from shared.wiring import Runtime


@pytest.fixture
def frozen() -> Iterator[tuple[World, str]]:
    world = World("scarce-v6e", time_scale=0)
    server = SimServer(world)
    try:
        yield world, server.start()
    finally:
        server.stop()


def test_it_reads_the_simulators_virtual_time_not_the_wall_clock(frozen: tuple[World, str]) -> None:
    world, url = frozen
    clock = SimulatorClock(url)
    assert clock.now() == world.now()  # time scale 0: virtual time stands still until advanced
    assert clock.monotonic() == pytest.approx(world.elapsed_s())


def test_a_manual_advance_shows_up_after_the_resync_interval(frozen: tuple[World, str]) -> None:
    world, url = frozen
    clock = SimulatorClock(url, resync_s=0.05)
    before = clock.now()
    world.advance(3600)
    time.sleep(0.1)
    assert (clock.now() - before).total_seconds() == pytest.approx(3600, abs=1)
    assert clock.monotonic() == pytest.approx(3600, abs=1)


def test_time_runs_at_the_scale_between_readings_and_never_backwards() -> None:
    world = World("scarce-v6e", time_scale=600)
    server = SimServer(world)
    url = server.start()
    try:
        clock = SimulatorClock(url, resync_s=0.05)
        readings = []
        for _ in range(20):
            readings.append(clock.now())
            time.sleep(0.01)
        assert readings == sorted(readings)
        assert (readings[-1] - readings[0]).total_seconds() > 60  # 0.2 wall s at x600 is about 120 virtual s
        assert abs((world.now() - clock.now()).total_seconds()) < 60
    finally:
        server.stop()


def test_an_unreachable_simulator_is_a_transient_error_that_says_what_to_start() -> None:
    clock = SimulatorClock("http://127.0.0.1:9", timeout_s=0.5)
    with pytest.raises(TransientError, match="local cloud running"):
        clock.now()


def test_the_endpoint_must_be_a_url() -> None:
    with pytest.raises(ValueError, match="endpoint"):
        SimulatorClock("127.0.0.1:8471")


def test_settings_refuse_the_simulator_clock_without_an_endpoint() -> None:
    with pytest.raises(ValidationError, match="TPUCTL_CLOCK"):
        Settings.model_validate({"clock": "simulator"})


def test_the_runtime_wires_the_simulator_clock_into_the_local_bus(frozen: tuple[World, str], tmp_path: object) -> None:
    world, url = frozen
    settings = Settings.model_validate({"clock": "simulator", "tpu_endpoint": url, "data_dir": str(tmp_path)})
    runtime = Runtime(settings)
    try:
        assert isinstance(runtime.clock, SimulatorClock)
        runtime.bus.ensure_topic("t-clock")
        runtime.bus.ensure_subscription("t-clock", "s-clock")
        runtime.bus.publish("t-clock", b"{}", {})
        seen = []
        runtime.bus.pull("s-clock", lambda delivery: seen.append(delivery.publish_time), timeout_s=1)
        assert seen == [world.now()]  # stamped with virtual time, as every process of the stack stamps it
    finally:
        runtime.close()

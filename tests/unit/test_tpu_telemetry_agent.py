"""The node agent's TPU telemetry against the VM twin's stand-in TPU: real gRPC, real HTTP, real files.

The reader talks to the stand-in runtime metrics service (``localcloud.vm_twin.tpu_device``) over local TCP, as it
talks to libtpu on a TPU VM; the device file is what the service answers from, so writing it injects a reading. The
sampler writes to the twin's own metadata server, and a benchmark run keeps the summary of its readings.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from tpu_info.proto import tpu_metric_service_pb2_grpc as pb_grpc

from localcloud.vm_twin import image_vllm
from localcloud.vm_twin.metadata_server import GuestAttributes, MetadataServer, TokenIssuer, VmIdentity
from localcloud.vm_twin.tpu_device import (
    DEVICE_FILE,
    ServingLoad,
    StandInRuntimeMetrics,
    chip_layout,
    chips_from_load,
    read_devices,
    serve,
    write_devices,
)
from node_agent import metrics_relay
from node_agent.agent import NodeAgent, RunControl, RunOutcome
from node_agent.journal import RunJournal
from node_agent.tpu_telemetry import GuestAttributeWriter, RuntimeMetricsReader, TelemetrySampler, tpu_result
from shared.adapters.clock import ManualClock
from shared.adapters.local_bus import LocalBus
from shared.domain.tpu_telemetry import TpuTelemetry, read_telemetry
from shared.messages import BenchmarkRequest, RunBenchmark, encode_message, new_command_id

GIB = 1 << 30
REPO_ROOT = Path(__file__).resolve().parents[2]


def _chip(chip: int, used_gib: float, duty: float = 40.0, bandwidth: float | None = 25.0) -> dict[str, Any]:
    values: dict[str, Any] = {
        "chip": chip,
        "hbm_total_bytes": 32 * GIB,
        "hbm_used_bytes": int(used_gib * GIB),
        "duty_cycle_pct": duty,
    }
    if bandwidth is not None:
        values["hbm_bandwidth_pct"] = bandwidth
    return values


@pytest.fixture
def device(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """The stand-in service on a free port, answering from ``tmp_path/tpu-devices.json``."""
    path = tmp_path / DEVICE_FILE
    server, port = serve(path, 0)
    try:
        yield path, f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def relaying(socket_path: Path, port: int) -> Iterator[None]:
    """The serving container's metrics relay on ``socket_path`` to ``port``, until the block ends."""
    stop = threading.Event()
    relay = threading.Thread(target=metrics_relay.serve, args=(str(socket_path), port, stop), daemon=True)
    relay.start()
    try:
        for _ in range(50):
            if socket_path.exists():
                break
            time.sleep(0.05)
        yield
    finally:
        stop.set()
        relay.join(timeout=5)


def _reader(addr: str, clock: ManualClock | None = None) -> RuntimeMetricsReader:
    return RuntimeMetricsReader(addr, clock or ManualClock(), timeout_s=2.0)


class TestReader:
    def test_every_chip_comes_through_from_the_device_file(self, device: tuple[Path, str]) -> None:
        path, addr = device
        write_devices(path, [_chip(1, 30.5, duty=90.0, bandwidth=70.0), _chip(0, 8.0)])
        clock = ManualClock()
        reading = _reader(addr, clock).read()
        assert reading.error == "" and reading.sampled_at == clock.now()
        assert [(c.chip, c.hbm_used_bytes, c.hbm_total_bytes) for c in reading.chips] == [
            (0, 8 * GIB, 32 * GIB),
            (1, int(30.5 * GIB), 32 * GIB),
        ]
        assert [(c.duty_cycle_pct, c.hbm_bandwidth_pct) for c in reading.chips] == [(40.0, 25.0), (90.0, 70.0)]

    def test_the_file_is_read_anew_so_an_injected_full_hbm_shows_on_the_next_read(
        self, device: tuple[Path, str]
    ) -> None:
        path, addr = device
        reader = _reader(addr)
        write_devices(path, [_chip(0, 10.0)])
        assert reader.read().chips[0].hbm_used_frac == pytest.approx(10 / 32)
        write_devices(path, [_chip(0, 32.0)])
        assert reader.read().chips[0].hbm_used_frac == 1.0

    def test_a_missing_bandwidth_metric_is_none_not_an_error(self, device: tuple[Path, str]) -> None:
        path, addr = device
        write_devices(path, [_chip(0, 4.0, bandwidth=None)])
        reading = _reader(addr).read()
        assert reading.error == "" and reading.chips[0].hbm_bandwidth_pct is None

    def test_a_unix_socket_address_is_read_too(self, tmp_path: Path) -> None:
        """Where the serving container has no network of its own, a relay on a unix socket is the way in."""
        path, socket_path = tmp_path / DEVICE_FILE, tmp_path / "tpu-metrics.sock"
        write_devices(path, [_chip(0, 3.0)])
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_RuntimeMetricServiceServicer_to_server(StandInRuntimeMetrics(path), server)
        uds = grpc.local_server_credentials(grpc.LocalConnectionType.UDS)
        assert server.add_secure_port(f"unix:{socket_path}", uds)
        server.start()
        try:
            reading = _reader(f"unix:{socket_path}").read()
        finally:
            server.stop(grace=None)
        assert reading.error == "" and reading.chips[0].hbm_used_bytes == 3 * GIB

    def test_the_serving_containers_relay_carries_the_agents_reads_to_the_loopback_service(
        self, device: tuple[Path, str], tmp_path: Path
    ) -> None:
        """As on a VM: libtpu on the serving container's loopback, the agent on the relay's unix socket."""
        path, addr = device
        write_devices(path, [_chip(0, 12.0, duty=55.0)])
        socket_path = tmp_path / "tpu-metrics.sock"
        with relaying(socket_path, int(addr.rsplit(":", 1)[1])):
            reader = _reader(f"unix:{socket_path}")
            first, second = reader.read(), reader.read()
            mode = socket_path.stat().st_mode & 0o777
        assert first.error == "" and first.chips[0].hbm_used_bytes == 12 * GIB
        assert second.chips[0].duty_cycle_pct == 55.0
        assert mode == 0o600  # root-only, like vLLM's own socket beside it

    def test_the_relay_closes_a_connection_when_nothing_listens_behind_it(self, tmp_path: Path) -> None:
        socket_path = tmp_path / "tpu-metrics.sock"
        with relaying(socket_path, _free_port()):
            reading = _reader(f"unix:{socket_path}").read()
        assert reading.chips == () and reading.error

    def test_no_service_is_an_error_reading_not_an_exception(self) -> None:
        addr = f"127.0.0.1:{_free_port()}"
        reading = _reader(addr).read()
        assert reading.chips == () and f"no TPU runtime metrics service at {addr}" in reading.error

    def test_a_malformed_device_file_is_an_error_reading(self, device: tuple[Path, str]) -> None:
        path, addr = device
        path.write_text('{"chips": [{"chip": "zero"}]}', encoding="utf-8")
        reading = _reader(addr).read()
        assert reading.chips == () and "INTERNAL" in reading.error and "device file unreadable" in reading.error

    def test_more_hbm_used_than_there_is_is_refused_as_malformed(self, device: tuple[Path, str]) -> None:
        path, addr = device
        write_devices(path, [{**_chip(0, 1.0), "hbm_used_bytes": 40 * GIB}])
        reading = _reader(addr).read()
        assert reading.chips == () and reading.error.startswith("malformed answer from the TPU runtime")


class _Recorder:
    def __init__(self) -> None:
        self.values: dict[tuple[str, str], str] = {}

    def _forget(self, namespace: str, key: str) -> None:
        self.values.pop((namespace, key), None)

    def port(self) -> GuestAttributes:
        return GuestAttributes(
            put=lambda ns, key, value: self.values.__setitem__((ns, key), value),
            read=lambda: [(ns, key, value) for (ns, key), value in self.values.items()],
            delete=lambda ns, key: self._forget(ns, key),
        )


@pytest.fixture
def metadata() -> Iterator[tuple[str, _Recorder]]:
    """The VM twin's metadata server; the recorder holds what the VM put into its guest attributes."""
    vm = VmIdentity("tpuctl-test", 1, "us-east5-b", "node-1", 7, "vm@tpuctl-test.iam.gserviceaccount.com")
    recorder = _Recorder()
    server = MetadataServer(vm, dict, recorder.port(), TokenIssuer())
    host = server.start()
    try:
        yield f"http://{host}/computeMetadata/v1", recorder
    finally:
        server.stop()


class TestSampler:
    def test_each_reading_lands_in_the_guest_attribute_the_monitor_reads(
        self, device: tuple[Path, str], metadata: tuple[str, _Recorder]
    ) -> None:
        path, addr = device
        base_url, recorder = metadata
        write_devices(path, [_chip(0, 16.0, duty=55.0)])
        clock = ManualClock()
        sampler = TelemetrySampler(_reader(addr, clock).read, GuestAttributeWriter(base_url=base_url))
        sampler.sample_once()
        stored = recorder.values[("tpuctl", "telemetry")]
        back = read_telemetry(stored, clock.now(), 120.0, lambda text, limit: text[:limit])
        assert back is not None and back.chips[0].hbm_used_bytes == 16 * GIB and back.chips[0].duty_cycle_pct == 55.0

    def test_an_error_reading_is_published_too_and_a_dead_metadata_server_does_not_stop_sampling(
        self, metadata: tuple[str, _Recorder]
    ) -> None:
        base_url, recorder = metadata
        clock = ManualClock()
        down = _reader(f"127.0.0.1:{_free_port()}", clock)
        TelemetrySampler(down.read, GuestAttributeWriter(base_url=base_url)).sample_once()
        assert "no TPU runtime metrics service" in json.loads(recorder.values[("tpuctl", "telemetry")])["error"]
        nowhere = GuestAttributeWriter(base_url=f"http://127.0.0.1:{_free_port()}/computeMetadata/v1", timeout_s=1)
        sampler = TelemetrySampler(down.read, nowhere)
        assert sampler.sample_once().error and sampler.sample_once().error  # no raise, twice
        assert len(sampler.readings_between(clock.now(), clock.now())) == 2

    def test_readings_between_keeps_only_the_window(self) -> None:
        clock = ManualClock()
        sampler = TelemetrySampler(lambda: TpuTelemetry(sampled_at=clock.now()), lambda _value: None)
        stamps = []
        for _ in range(5):
            stamps.append(sampler.sample_once().sampled_at)
            clock.advance(30)
        assert [r.sampled_at for r in sampler.readings_between(stamps[1], stamps[3])] == stamps[1:4]


class TestBenchmarkResult:
    def test_the_result_carries_a_summary_of_the_readings_taken_during_the_run(
        self, tmp_path: Path, device: tuple[Path, str]
    ) -> None:
        path, addr = device
        clock = ManualClock()
        sampler = TelemetrySampler(_reader(addr, clock).read, lambda _value: None)
        write_devices(path, [_chip(0, 31.0, duty=99.0)])
        sampler.sample_once()  # before the run: not in its summary
        clock.advance(60)

        async def runner(message: RunBenchmark, control: RunControl) -> RunOutcome:
            write_devices(path, [_chip(0, 20.0, duty=50.0)])
            clock.advance(30)
            sampler.sample_once()  # the sampler's thread, mid-run
            write_devices(path, [_chip(0, 24.0, duty=70.0)])
            clock.advance(30)
            return RunOutcome(result={"ok": True})

        bus = LocalBus(tmp_path / "bus.sqlite")
        journal = RunJournal(tmp_path / "node")
        agent = NodeAgent(
            bus, deployment_id="gemma-a", node_name="n", journal=journal, runner=runner, clock=clock, telemetry=sampler
        )
        message = RunBenchmark(
            command_id=new_command_id(),
            issued_at=clock.now(),
            deployment_id="gemma-a",
            benchmark=BenchmarkRequest(concurrency=(1,), num_prompts=1, input_len=8, output_len=4),
        )
        journal.accept(message.command_id, encode_message(message).decode(), clock.now().isoformat())
        try:
            assert agent.run_next()
        finally:
            bus.close()
        entry = journal.get(message.command_id)
        assert entry is not None and entry.state == "completed" and entry.result_file
        result = json.loads(Path(entry.result_file).read_text(encoding="utf-8"))
        assert result["ok"] is True
        assert result["tpu"] == {  # the mid-run reading and the one taken as the run ended; not the one before
            "samples": 2.0,
            "hbm_used_frac_peak": 0.75,
            "hbm_used_gib_peak": 24.0,
            "duty_cycle_pct_mean": 60.0,
            "duty_cycle_pct_peak": 70.0,
        }

    def test_no_sampler_or_no_chips_adds_nothing(self) -> None:
        clock = ManualClock()
        assert tpu_result(None, clock.now(), clock) == {}
        sampler = TelemetrySampler(lambda: TpuTelemetry(sampled_at=clock.now(), error="down"), lambda _value: None)
        assert tpu_result(sampler, clock.now(), clock) == {}


class TestTwinDevice:
    def test_the_chip_count_and_hbm_come_from_the_accelerator_type_else_tensor_parallel(self) -> None:
        assert chip_layout("v6e-4", None) == (4, 32 * GIB)
        assert chip_layout("v5litepod-8", 4) == (8, 16 * GIB)
        assert chip_layout("v5p-8", None) == (4, 95 * GIB)  # its number counts TensorCores, two per chip
        assert chip_layout("", 2) == (2, 32 * GIB)
        assert chip_layout("", None) == (1, 32 * GIB)

    def test_the_updater_follows_vllm_load(self) -> None:
        load = ServingLoad(polls=4)
        busy = 'vllm:num_requests_running{model_name="g"} 3.0\nvllm:kv_cache_usage_perc{model_name="g"} 0.5\n'
        idle = 'vllm:num_requests_running{model_name="g"} 0.0\nvllm:kv_cache_usage_perc{model_name="g"} 0.0\n'
        assert load.observe(idle) == 0.0 and load.observe(busy) == 0.5
        assert load.duty_cycle_pct == 50.0
        chips = chips_from_load(2, 32 * GIB, 0.5, load.duty_cycle_pct, memory_utilization=0.9)
        assert [c["chip"] for c in chips] == [0, 1]
        assert chips[0]["hbm_used_bytes"] == int(32 * GIB * (0.3 + 0.5 * 0.6))
        assert chips_from_load(1, 32 * GIB, 1.0, 100.0, memory_utilization=1.0)[0]["hbm_used_bytes"] == 32 * GIB

    def test_a_written_file_reads_back_and_a_broken_one_is_refused(self, tmp_path: Path) -> None:
        path = tmp_path / DEVICE_FILE
        write_devices(path, [_chip(0, 2.0)], pinned=True)
        assert json.loads(path.read_text())["pinned"] is True and read_devices(path)[0]["hbm_used_bytes"] == 2 * GIB
        path.write_text('{"chips": {"0": 1}}')
        with pytest.raises(ValueError, match="no list of chips"):
            read_devices(path)

    def test_the_serving_container_starts_the_stand_in_and_it_keeps_a_pinned_file(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """What ``vllm`` does in the twin's image: the stand-in runs as its child, on TPU_RUNTIME_METRICS_PORTS."""
        path, port = tmp_path / DEVICE_FILE, _free_port()
        write_devices(path, [_chip(0, 31.5, duty=10.0)], pinned=True)
        monkeypatch.setenv("TPUCTL_TWIN_HOST_PYTHON", sys.executable)
        monkeypatch.setenv("TPUCTL_TWIN_REPO", str(REPO_ROOT))
        monkeypatch.setenv("TPUCTL_TWIN_TPU_DEVICE_FILE", str(path))
        monkeypatch.setenv("TPU_RUNTIME_METRICS_PORTS", str(port))
        monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v6e-1")
        child = image_vllm.start_tpu_device(["serve", "m", "--port", str(_free_port())])
        assert child is not None
        try:
            reader = _reader(f"127.0.0.1:{port}")
            reading = reader.read()
            deadline = time.monotonic() + 4
            while reading.error and time.monotonic() < deadline:  # the child is still importing grpc
                time.sleep(0.1)
                reading = reader.read()
            assert reading.error == "" and reading.chips[0].hbm_used_bytes == int(31.5 * GIB)
            time.sleep(0.3)  # its updater polled the (absent) vLLM at least once: the pinned file stays
            assert read_devices(path)[0]["duty_cycle_pct"] == 10.0
        finally:
            child.terminate()
            child.wait(timeout=10)

    def test_without_the_metrics_port_no_stand_in_starts(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delenv("TPU_RUNTIME_METRICS_PORTS", raising=False)
        monkeypatch.setenv("TPUCTL_TWIN_HOST_PYTHON", sys.executable)
        assert image_vllm.start_tpu_device(["serve", "m"]) is None


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def test_the_stand_in_dies_with_its_parent(tmp_path: Path) -> None:
    """The container's process may die alone (a crash): the stand-in must not outlive it and hold the port."""
    path, port = tmp_path / DEVICE_FILE, _free_port()
    program = (  # the serving process: starts the stand-in, waits for its first update of the file, then dies
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-m', 'localcloud.vm_twin.tpu_device', '--device-file', "
        f"{str(path)!r}, '--port', '{port}', '--interval-s', '0.1', '--parent-pid', str(os.getpid()), "
        "'--', 'serve', 'm'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "print(child.pid, flush=True)\n"
        f"deadline = time.monotonic() + 4\n"
        f"while not os.path.exists({str(path)!r}) and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    parent = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=30)
    pid = int(parent.stdout.strip())
    assert read_devices(path)[0]["hbm_total_bytes"] == 32 * GIB, "the stand-in ran and wrote its first reading"
    deadline = time.monotonic() + 3
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _running(pid):
        os.kill(pid, 9)
        pytest.fail("the stand-in outlived its parent")

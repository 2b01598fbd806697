"""The connection file ``make up`` publishes, how a local gateway attaches to it, and what it says with none."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mcp_client_gateway.composition import build_ports
from mcp_client_gateway.core import GatewayCore
from shared.adapters.local_stack import (
    NO_LOCAL_STACK,
    attach,
    connection_path,
    publish,
    read_connection,
    withdraw,
)
from shared.config import Settings
from shared.domain.errors import CloudError, ErrorClass


def _stack_env(tmp_path: Path) -> dict[str, str]:
    return {
        "TPUCTL_BACKEND": "local",
        "TPUCTL_PROJECT": "tpuctl-sim",
        "TPUCTL_DATA_DIR": str(tmp_path / "run-1"),
        "TPUCTL_TPU_ENDPOINT": "http://127.0.0.1:8471",
        "TPUCTL_CLOCK": "simulator",
        "TPUCTL_LEASE_TTL_S": "2",
        "TPUCTL_LOG_LEVEL": "INFO",
        "FIRESTORE_EMULATOR_HOST": "127.0.0.1:9",
    }


def _reaped_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.fixture(autouse=True)
def _no_emulator_leak(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FIRESTORE_EMULATOR_HOST", raising=False)
    for name in list(os.environ):
        if name.startswith("TPUCTL_"):
            monkeypatch.delenv(name)


def test_publish_writes_the_whole_file_and_only_its_publisher_withdraws_it(tmp_path: Path) -> None:
    path = connection_path(tmp_path / "var")
    assert path == tmp_path / "var" / "localcloud" / "current.json"
    publish(path, _stack_env(tmp_path), pid=os.getpid(), started_at="2026-12-04T17:00:00+00:00")
    body = json.loads(path.read_text(encoding="utf-8"))
    assert body["pid"] == os.getpid() and body["env"]["TPUCTL_TPU_ENDPOINT"] == "http://127.0.0.1:8471"
    assert [p.name for p in path.parent.iterdir()] == ["current.json"], "no temporary file is left beside it"
    connection = read_connection(path)
    assert connection is not None and connection.data_dir == tmp_path / "run-1"
    assert withdraw(path, pid=os.getpid() + 1_000_000) is False and path.exists(), "another run's file stays"
    assert withdraw(path, pid=os.getpid()) is True and not path.exists()


def test_a_file_left_by_a_killed_run_or_a_torn_file_reads_as_no_stack(tmp_path: Path) -> None:
    path = connection_path(tmp_path / "var")
    publish(path, _stack_env(tmp_path), pid=_reaped_pid(), started_at="x")
    assert read_connection(path) is None
    path.write_text('{"format": 1, "pid": ', encoding="utf-8")
    assert read_connection(path) is None
    with pytest.raises(ValueError, match="TPUCTL_TPU_ENDPOINT"):
        publish(path, {"TPUCTL_DATA_DIR": "x"}, pid=os.getpid(), started_at="x")


def test_a_local_gateway_on_the_root_attaches_to_the_published_stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    publish(connection_path(tmp_path / "var"), _stack_env(tmp_path), pid=os.getpid(), started_at="x")
    monkeypatch.chdir(tmp_path)
    settings = attach(Settings(backend="local", data_dir=Path("var"), endpoint_access="direct", log_level="ERROR"))
    assert settings.data_dir == tmp_path / "run-1"
    assert settings.tpu_endpoint == "http://127.0.0.1:8471" and settings.clock == "simulator"
    assert settings.project == "tpuctl-sim" and settings.lease_ttl_s == 2.0
    assert settings.log_level == "ERROR", "the client keeps its own log level"
    assert os.environ["FIRESTORE_EMULATOR_HOST"] == "127.0.0.1:9"


def test_explicit_endpoints_and_the_gcp_backend_are_left_alone(tmp_path: Path) -> None:
    publish(connection_path(tmp_path / "var"), _stack_env(tmp_path), pid=os.getpid(), started_at="x")
    mine = Settings(backend="local", data_dir=tmp_path / "var", tpu_endpoint="http://127.0.0.1:1")
    assert attach(mine) is mine
    gcp = Settings(backend="gcp", project="tpuctl-test-1", data_dir=tmp_path / "var")
    assert attach(gcp) is gcp


def test_with_no_stack_running_zones_say_to_start_it_not_to_log_in_to_google(tmp_path: Path) -> None:
    ports = build_ports(Settings(backend="local", data_dir=tmp_path / "var"))
    try:
        view = GatewayCore(ports).list_zones(accelerator="v6e-4")
        assert ports.tpu is not None
        with pytest.raises(CloudError) as refused:
            ports.tpu.list("-")
    finally:
        ports.close()
    assert view.live_quota is not None and view.live_quota.read is False
    assert NO_LOCAL_STACK in (view.live_quota.problem or "")
    assert "credentials" not in (view.live_quota.problem or "") + (view.live_quota.fix or "")
    assert refused.value.error_class is ErrorClass.FAILED_PRECONDITION and NO_LOCAL_STACK in refused.value.message
    assert view.zones, "zones and prices still answer"

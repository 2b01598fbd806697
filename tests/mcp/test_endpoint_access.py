"""Live tools from a workstation: ``TPUCTL_ENDPOINT_ACCESS=iap`` sends query and health through an IAP tunnel.

The deployment's recorded endpoint is a VM-internal address that does not route from here. The tunnel is opened
by the real adapter with a fake ``gcloud`` on PATH that forwards to the loopback stand-in for vLLM
(tests/support/fake_gcloud_bin.py); nothing here reaches IAP.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from pydantic import ValidationError

from mcp_client_gateway.cli import EXIT_OK, EXIT_REFUSED, build_parser, run
from mcp_client_gateway.composition import build_ports
from shared.adapters.iap_tunnel import IapTunnels, tpu_vm_instance
from shared.config import Settings
from shared.domain.serving_key import deployment_api_key
from shared.ports import TpuApi
from tests.mcp.conftest import API_KEY, HF_TOKEN, GatewayWorld, call, text
from tests.support.fake_gcloud import FakeGcloud, FakeTpuGuestAttributes, install_fake_gcloud, wait_gone
from tests.support.openai_stub import StubConfig, StubServer, serve_openai_stub

SERVING_KEY = deployment_api_key(API_KEY, "gemma-a")  # what gemma-a's serving proxy takes

pytestmark = pytest.mark.anyio

RECORDED = "http://10.164.0.7:8000"  # the VM's internal address, as the controller recorded it
ZONE = "europe-west4-a"  # where GatewayWorld.seed puts the slice
NODE = "gemma-a-g1-a1"
HOSTNAME = "t1v-n-5f3c9a1e-w-0"


@pytest.fixture
def gcloud(tmp_path: Path) -> FakeGcloud:
    return install_fake_gcloud(tmp_path / "bin")


@pytest.fixture
def vllm() -> Iterator[StubServer]:
    with serve_openai_stub(StubConfig(api_key=SERVING_KEY)) as stub:
        yield stub


def wire(world: GatewayWorld, tpu: FakeTpuGuestAttributes, environ: dict[str, str]) -> IapTunnels:
    """IAP access on the world's gateway, as build_ports wires it (closed with the ports)."""
    tunnels = IapTunnels(project="tpuctl-test-1", instance_of=tpu_vm_instance(cast(TpuApi, tpu)), environ=environ)
    previous = world.ports.endpoint_access
    if previous is not None:
        previous.close()
    world.ports.endpoint_access = tunnels
    world.ports.closers.append(tunnels.close)
    return tunnels


@pytest.fixture
def tunnelled(world: GatewayWorld, gcloud: FakeGcloud, vllm: StubServer) -> Iterator[IapTunnels]:
    """A serving deployment on a Cloud TPU API node whose recorded endpoint is reachable only through IAP."""
    tpu = FakeTpuGuestAttributes()
    tpu.set_hostname(ZONE, NODE, HOSTNAME)
    gcloud.route(HOSTNAME, forward=vllm.base_url.removeprefix("http://"))
    world.secrets.put(world.settings.vllm_api_key_secret, API_KEY)
    world.secrets.put(world.settings.hf_token_secret, HF_TOKEN)
    tunnels = wire(world, tpu, gcloud.environ(TPUCTL_VLLM_API_KEY=API_KEY, HF_TOKEN=HF_TOKEN))
    world.seed("gemma-a", endpoint=RECORDED)
    yield tunnels
    world.ports.close()
    world.ports.endpoint_access = None


def tpuctl(world: GatewayWorld, *argv: str) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    code = run(list(argv), ports=world.ports, stdout=stdout, stderr=stderr)
    return code, stdout.getvalue(), stderr.getvalue()


class TestThroughTheTunnel:
    async def test_query_and_health_reach_vllm_through_one_tunnel_with_the_key_in_the_header_only(
        self, world: GatewayWorld, gcloud: FakeGcloud, vllm: StubServer, tunnelled: IapTunnels
    ) -> None:
        query = await call(world, "tpu_query", {"deployment_id": "gemma-a", "prompt": "Hello?", "max_tokens": 8})
        assert not query.is_error, text(query)
        assert query.structured_content["text"] == " rikasisimimolo hasife 129 144 mifemotami"
        health = await call(world, "tpu_query", {"deployment_id": "gemma-a"})
        assert not health.is_error, text(health)
        assert health.structured_content["healthy"] is True
        assert health.structured_content["endpoint"] == RECORDED, "the report names the VM's endpoint"
        assert [h["Authorization"] for h in vllm.headers] == [f"Bearer {SERVING_KEY}"] * 2  # query, 1-token check
        (run_of_gcloud,) = gcloud.calls()  # one tunnel for the query and the health check
        assert run_of_gcloud["argv"][4].startswith("--local-host-port=127.0.0.1:")
        assert run_of_gcloud["argv"][:4] == ["compute", "start-iap-tunnel", HOSTNAME, "8000"]
        assert run_of_gcloud["argv"][5:] == [f"--zone={ZONE}", "--project=tpuctl-test-1"]
        for secret in (API_KEY, SERVING_KEY, HF_TOKEN):
            assert secret not in json.dumps(run_of_gcloud), "no secret in the child's argv or environment"
            assert secret not in text(query) + text(health)

    async def test_the_cli_query_goes_through_the_tunnel_and_close_stops_it(
        self, world: GatewayWorld, gcloud: FakeGcloud, tunnelled: IapTunnels
    ) -> None:
        code, stdout, stderr = tpuctl(world, "query", "gemma-a", "Hi?")
        assert code == EXIT_OK, stderr
        assert stdout.strip() == "rikasisimimolo hasife 129 144 mifemotami"
        (run_of_gcloud,) = gcloud.calls()
        assert tunnelled.pids() == [run_of_gcloud["pid"]]
        world.ports.close()  # what the CLI and the MCP server do on the way out
        assert wait_gone(run_of_gcloud["pid"]) and wait_gone(run_of_gcloud["helper_pid"])


class TestErrorsAreToolErrors:
    async def test_without_gcloud_the_tool_error_names_the_field_and_the_fix(
        self, world: GatewayWorld, tunnelled: IapTunnels, tmp_path: Path
    ) -> None:
        empty = tmp_path / "no-gcloud"
        empty.mkdir()
        tpu = FakeTpuGuestAttributes()
        tpu.set_hostname(ZONE, NODE, HOSTNAME)
        wire(world, tpu, {"PATH": str(empty)})  # this workstation has no Google Cloud CLI
        result = await call(world, "tpu_query", {"deployment_id": "gemma-a", "prompt": "Hello?"})
        assert result.is_error
        assert "[failed_precondition] gcloud: 'gcloud' was not found on PATH. Fix: install " in text(result)
        code, _, stderr = tpuctl(world, "health", "gemma-a")
        assert code == EXIT_REFUSED and "install the Google Cloud CLI" in stderr

    async def test_iap_refusing_is_permission_denied_naming_the_role(
        self, world: GatewayWorld, gcloud: FakeGcloud, tunnelled: IapTunnels
    ) -> None:
        gcloud.route(
            HOSTNAME, error="ERROR: (gcloud.compute.start-iap-tunnel) Error while connecting [4033: 'not authorized']."
        )
        result = await call(world, "tpu_query", {"deployment_id": "gemma-a"})
        assert result.is_error
        assert f"[permission_denied] endpoint_access: IAP refused the tunnel to {HOSTNAME}" in text(result)
        assert "roles/iap.tunnelResourceAccessor" in text(result)

    async def test_a_hostile_hostname_from_the_vm_is_refused_and_nothing_runs(
        self, world: GatewayWorld, gcloud: FakeGcloud, tunnelled: IapTunnels
    ) -> None:
        tpu = FakeTpuGuestAttributes()
        tpu.set_hostname(ZONE, NODE, "$(curl evil)")
        wire(world, tpu, gcloud.environ())
        result = await call(world, "tpu_query", {"deployment_id": "gemma-a", "prompt": "Hello?"})
        assert result.is_error and "[failed_precondition] instance: " in text(result)
        assert gcloud.calls() == []


class TestTheSetting:
    def test_direct_is_the_default_and_wires_no_tunnel(self, tmp_path: Path) -> None:
        ports = build_ports(Settings(backend="local", data_dir=tmp_path / "var"))
        try:
            assert ports.settings.endpoint_access == "direct" and ports.endpoint_access is None
        finally:
            ports.close()

    def test_iap_wires_the_tunnel_adapter_and_closing_the_ports_closes_it(self) -> None:
        ports = build_ports(Settings(backend="gcp", project="tpuctl-test-1", endpoint_access="iap"))
        assert isinstance(ports.endpoint_access, IapTunnels)
        assert ports.endpoint_access.close in ports.closers
        assert not cast(Any, ports.tpu).built, "the TPU API client is built only when a node's hostname is needed"
        ports.close()

    def test_an_unknown_value_names_the_variable_and_the_choices(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("TPUCTL_ENDPOINT_ACCESS", "ssh")
        with pytest.raises(ValidationError, match="TPUCTL_ENDPOINT_ACCESS: 'ssh' is neither 'direct' nor 'iap'"):
            Settings()

    def test_the_cli_flag_overrides_the_variable(self) -> None:
        args = build_parser().parse_args(["--endpoint-access", "iap", "query", "gemma-a", "Hi?"])
        assert args.endpoint_access == "iap"
        args = build_parser().parse_args(["health", "gemma-a", "--endpoint-access", "direct"])
        assert args.endpoint_access == "direct"

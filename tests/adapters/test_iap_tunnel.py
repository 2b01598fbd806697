"""``IapTunnels`` against a fake ``gcloud`` on PATH that records its argv and environment and really forwards.

The fake (tests/support/fake_gcloud_bin.py) listens on the local port it is given and forwards to a loopback
HTTP server standing in for vLLM on the VM, so a query through the tunnel is a real one. Nothing here talks to
IAP: what real gcloud and IAP do is documented in docs/deploy.md, and only this fake was run.
"""

from __future__ import annotations

import json
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from shared.adapters.iap_tunnel import FIX_FIREWALL, FIX_IAM, FIX_INSTALL, IapTunnels, tpu_vm_instance
from shared.adapters.openai_client import OpenAiCompatibleClient
from shared.domain.errors import ErrorClass
from shared.domain.models import Backend
from shared.logging import register_secret
from shared.ports import EndpointAccessError, EndpointTarget, ModelChatRequest, TpuApi
from tests.support.fake_gcloud import FakeGcloud, FakeTpuGuestAttributes, install_fake_gcloud, wait_gone
from tests.support.openai_stub import StubConfig, StubServer, serve_openai_stub

API_KEY = "vllm-key-Tunnel-0123456789-abcdef"
HF_TOKEN = "hf_" + "TunnelTokenValue0123456789abcdefXY"
PROJECT = "tpuctl-test-1"
ZONE = "europe-west4-a"
NODE = "gemma-a-g1-a1"
HOSTNAME = "t1v-n-5f3c9a1e-w-0"
RECORDED = "http://10.164.0.7:8000"  # the VM's internal address: not reachable from here, only through the tunnel


def target(
    *, node: str = NODE, zone: str = ZONE, backend: Backend = Backend.COMPUTE_ENGINE, endpoint: str = RECORDED
) -> EndpointTarget:
    return EndpointTarget(deployment_id="gemma-a", endpoint=endpoint, zone=zone, node=node, backend=backend)


@pytest.fixture
def gcloud(tmp_path: Path) -> FakeGcloud:
    return install_fake_gcloud(tmp_path / "bin")


@pytest.fixture
def tpu() -> FakeTpuGuestAttributes:
    fake = FakeTpuGuestAttributes()
    fake.set_hostname(ZONE, NODE, HOSTNAME)
    return fake


@pytest.fixture
def vllm() -> Iterator[StubServer]:
    with serve_openai_stub(StubConfig(api_key=API_KEY)) as stub:
        yield stub


def make_tunnels(
    gcloud: FakeGcloud,
    tpu: FakeTpuGuestAttributes,
    *,
    project: str | None = PROJECT,
    environ: dict[str, str] | None = None,
    open_timeout_s: float = 15.0,
) -> IapTunnels:
    return IapTunnels(
        project=project,
        instance_of=tpu_vm_instance(cast(TpuApi, tpu)),
        environ=environ if environ is not None else gcloud.environ(),
        open_timeout_s=open_timeout_s,
    )


@pytest.fixture
def tunnels(gcloud: FakeGcloud, tpu: FakeTpuGuestAttributes) -> Iterator[IapTunnels]:
    opened = make_tunnels(gcloud, tpu)
    yield opened
    opened.close()


def forward_to(stub: StubServer) -> str:
    return stub.base_url.removeprefix("http://")


def accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def ask(url: str, api_key: str | None = API_KEY) -> str:
    chat = OpenAiCompatibleClient().chat(
        ModelChatRequest(endpoint=url, messages=(("user", "Hello?"),), max_tokens=4, api_key=api_key, timeout_s=10)
    )
    return chat.text


class TestTheCommand:
    def test_a_compute_engine_node_gets_exactly_the_documented_argv(
        self, gcloud: FakeGcloud, tunnels: IapTunnels, vllm: StubServer, tpu: FakeTpuGuestAttributes
    ) -> None:
        gcloud.route(NODE, forward=forward_to(vllm))
        url = tunnels.base_url(target())
        port = int(url.rsplit(":", 1)[1])
        (call,) = gcloud.calls()
        assert call["argv0"] == str(gcloud.path)
        assert call["argv"] == [
            "compute",
            "start-iap-tunnel",
            NODE,
            "8000",
            f"--local-host-port=127.0.0.1:{port}",
            f"--zone={ZONE}",
            f"--project={PROJECT}",
        ]
        assert url == f"http://127.0.0.1:{port}"
        assert call["pgid"] == call["pid"], "the tunnel runs in its own process group"
        assert tpu.reads == [], "a Compute Engine instance is the node itself: no TPU API read"

    def test_a_cloud_tpu_node_is_reached_by_its_worker_hostname_as_gcloud_tpu_vm_ssh_does(
        self, gcloud: FakeGcloud, tpu: FakeTpuGuestAttributes, vllm: StubServer
    ) -> None:
        gcloud.route(HOSTNAME, forward=forward_to(vllm))
        opened = make_tunnels(gcloud, tpu, project=None)
        try:
            url = opened.base_url(target(backend=Backend.TPU_API, endpoint="http://10.164.0.7:8123"))
        finally:
            opened.close()
        (call,) = gcloud.calls()
        port = url.rsplit(":", 1)[1]
        assert call["argv"] == [
            "compute",
            "start-iap-tunnel",
            HOSTNAME,
            "8123",
            f"--local-host-port=127.0.0.1:{port}",
            f"--zone={ZONE}",
        ], "no --project without TPUCTL_PROJECT: gcloud's configured project applies"
        assert tpu.reads == [(ZONE, NODE, "")]

    def test_one_tunnel_serves_every_call_and_a_dead_one_is_reopened(
        self, gcloud: FakeGcloud, tunnels: IapTunnels, vllm: StubServer
    ) -> None:
        gcloud.route(NODE, forward=forward_to(vllm))
        first = tunnels.base_url(target())
        assert tunnels.base_url(target()) == first and len(gcloud.calls()) == 1
        assert ask(first)
        (pid,) = tunnels.pids()
        os.killpg(pid, signal.SIGKILL)
        assert wait_gone(pid)
        second = tunnels.base_url(target())
        assert len(gcloud.calls()) == 2 and tunnels.pids() != [pid]
        assert ask(second), "the reopened tunnel reaches the stand-in"


class TestRefusedBeforeAnythingStarts:
    @pytest.mark.parametrize(
        ("node", "zone", "endpoint", "field"),
        [
            ("-oProxyCommand=sh", ZONE, RECORDED, "instance"),
            ("gemma;touch /tmp/pwned", ZONE, RECORDED, "instance"),
            ("$(id)", ZONE, RECORDED, "instance"),
            ("Gemma-A", ZONE, RECORDED, "instance"),
            ("a" * 64, ZONE, RECORDED, "instance"),
            (NODE, "europe-west4-a --project=evil", RECORDED, "zone"),
            (NODE, "europe-west4-a\n--verbosity=debug", RECORDED, "zone"),
            (NODE, "../../etc", RECORDED, "zone"),
            (NODE, "--zone=us-central1-b", RECORDED, "zone"),
            (NODE, ZONE, "http://10.164.0.7:99999", "endpoint"),
            (NODE, ZONE, "file:///etc/passwd", "endpoint"),
        ],
    )
    def test_a_hostile_recorded_value_never_reaches_argv(
        self, gcloud: FakeGcloud, tunnels: IapTunnels, node: str, zone: str, endpoint: str, field: str
    ) -> None:
        gcloud.route(node, forward="127.0.0.1:9")
        with pytest.raises(EndpointAccessError) as raised:
            tunnels.base_url(target(node=node, zone=zone, endpoint=endpoint))
        assert raised.value.field == field and raised.value.error_class is ErrorClass.INVALID
        assert gcloud.calls() == [], "no process was started"
        assert tunnels.pids() == []

    def test_a_hostile_hostname_written_by_the_vm_never_reaches_argv(
        self, gcloud: FakeGcloud, tpu: FakeTpuGuestAttributes, tunnels: IapTunnels
    ) -> None:
        tpu.set_hostname(ZONE, NODE, "t1v-n-1-w-0 --project=evil")
        with pytest.raises(EndpointAccessError) as raised:
            tunnels.base_url(target(backend=Backend.TPU_API))
        assert raised.value.field == "instance"
        assert gcloud.calls() == []

    def test_a_hostile_zone_is_refused_before_the_tpu_api_is_asked(
        self, gcloud: FakeGcloud, tpu: FakeTpuGuestAttributes, tunnels: IapTunnels
    ) -> None:
        with pytest.raises(EndpointAccessError) as raised:
            tunnels.base_url(target(backend=Backend.TPU_API, zone="x/../../nodes"))
        assert raised.value.field == "zone"
        assert tpu.reads == [] and gcloud.calls() == []

    def test_a_hostile_project_is_refused(self, gcloud: FakeGcloud, tpu: FakeTpuGuestAttributes) -> None:
        opened = make_tunnels(gcloud, tpu, project="--impersonate-service-account=x")
        with pytest.raises(EndpointAccessError) as raised:
            opened.base_url(target())
        assert raised.value.field == "project" and gcloud.calls() == []


class TestSecrets:
    def test_the_api_key_travels_only_in_the_authorization_header_never_in_argv_or_the_childs_environment(
        self, gcloud: FakeGcloud, tpu: FakeTpuGuestAttributes, vllm: StubServer, tmp_path: Path
    ) -> None:
        register_secret(API_KEY)
        register_secret(HF_TOKEN)
        environ = gcloud.environ(
            TPUCTL_VLLM_API_KEY=API_KEY,
            VLLM_API_KEY=API_KEY,
            HF_TOKEN=HF_TOKEN,
            CLOUDSDK_AUTH_EXTRA=API_KEY,  # an allowed prefix does not let a secret through
            CLOUDSDK_PROXY_HEADER="Bearer abcdefghijklmnop0123",  # nor a token-shaped value
            CLOUDSDK_CONFIG=str(tmp_path / "gcloud-config"),
            LANG="C.UTF-8",
        )
        gcloud.route(NODE, forward=forward_to(vllm))
        opened = make_tunnels(gcloud, tpu, environ=environ)
        try:
            url = opened.base_url(target())
            assert ask(url) == " rikasisimimolo hasife 129 144 mifemotami", "the query reached the stand-in"
            (pid,) = opened.pids()
            kernel_view = _proc(pid, "cmdline") + _proc(pid, "environ")
        finally:
            opened.close()
        assert vllm.headers[0]["Authorization"] == f"Bearer {API_KEY}"
        (call,) = gcloud.calls()
        recorded = json.dumps(call)
        for secret in (API_KEY, HF_TOKEN, "abcdefghijklmnop0123"):
            assert secret not in recorded
            assert secret.encode() not in kernel_view
        assert set(call["env"]) == {"PATH", "HOME", "LANG", "CLOUDSDK_CONFIG"}
        assert call["env"]["CLOUDSDK_CONFIG"] == str(tmp_path / "gcloud-config"), "gcloud's own settings pass"

    def test_without_the_key_the_stand_in_refuses_so_the_tunnel_adds_no_credential(
        self, gcloud: FakeGcloud, tunnels: IapTunnels, vllm: StubServer
    ) -> None:
        gcloud.route(NODE, forward=forward_to(vllm))
        url = tunnels.base_url(target())
        with pytest.raises(Exception, match="API key"):
            ask(url, api_key=None)


class TestLifecycle:
    def test_close_stops_the_tunnel_and_its_whole_process_group(
        self, gcloud: FakeGcloud, tunnels: IapTunnels, vllm: StubServer
    ) -> None:
        gcloud.route(NODE, forward=forward_to(vllm))
        port = int(tunnels.base_url(target()).rsplit(":", 1)[1])
        (call,) = gcloud.calls()
        assert tunnels.pids() == [call["pid"]] and accepts(port)
        tunnels.close()
        assert wait_gone(call["pid"]) and wait_gone(call["helper_pid"]), "leader and helper child are gone"
        assert not accepts(port)
        assert tunnels.pids() == []
        tunnels.close()  # a second close is harmless


class TestErrorsNameTheFix:
    def test_without_gcloud_the_error_says_to_install_it(self, tmp_path: Path, tpu: FakeTpuGuestAttributes) -> None:
        empty = tmp_path / "empty-bin"
        empty.mkdir()
        opened = IapTunnels(
            project=PROJECT, instance_of=tpu_vm_instance(cast(TpuApi, tpu)), environ={"PATH": str(empty)}
        )
        with pytest.raises(EndpointAccessError) as raised:
            opened.base_url(target())
        error = raised.value
        assert error.field == "gcloud" and error.error_class is ErrorClass.FAILED_PRECONDITION
        assert "not found on PATH" in error.message and error.fix == FIX_INSTALL
        assert "install the Google Cloud CLI" in error.fix

    def test_iap_refusing_the_tunnel_names_the_role(self, gcloud: FakeGcloud, tunnels: IapTunnels) -> None:
        gcloud.route(
            NODE, error="ERROR: (gcloud.compute.start-iap-tunnel) Error while connecting [4033: 'not authorized']."
        )
        with pytest.raises(EndpointAccessError) as raised:
            tunnels.base_url(target())
        assert raised.value.error_class is ErrorClass.PERMISSION
        assert raised.value.fix == FIX_IAM and "roles/iap.tunnelResourceAccessor" in FIX_IAM
        assert "4033" in raised.value.message
        (call,) = gcloud.calls()
        assert wait_gone(call["helper_pid"]) and tunnels.pids() == []

    def test_iap_not_reaching_the_vm_names_the_firewall_rule(self, gcloud: FakeGcloud, tunnels: IapTunnels) -> None:
        gcloud.route(
            NODE,
            error="ERROR: (gcloud.compute.start-iap-tunnel) Error while connecting [4003: 'failed to connect to "
            "backend'].",
        )
        with pytest.raises(EndpointAccessError) as raised:
            tunnels.base_url(target())
        assert raised.value.fix == FIX_FIREWALL
        assert "35.235.240.0/20" in FIX_FIREWALL and "8000" in FIX_FIREWALL

    def test_an_instance_gcloud_cannot_find_says_so(self, gcloud: FakeGcloud, tunnels: IapTunnels) -> None:
        with pytest.raises(EndpointAccessError) as raised:
            tunnels.base_url(target(node="gemma-a-g1-a9"))
        assert raised.value.error_class is ErrorClass.FAILED_PRECONDITION
        assert "was not found" in raised.value.message and "compute.instances.get" in raised.value.fix

    def test_a_tunnel_that_never_listens_times_out_and_is_stopped(
        self, gcloud: FakeGcloud, tpu: FakeTpuGuestAttributes
    ) -> None:
        gcloud.route(NODE, hang=True)
        opened = make_tunnels(gcloud, tpu, open_timeout_s=1.0)
        with pytest.raises(EndpointAccessError) as raised:
            opened.base_url(target())
        assert raised.value.error_class is ErrorClass.TRANSIENT and "did not open within 1 s" in raised.value.message
        (call,) = gcloud.calls()
        assert wait_gone(call["pid"]) and wait_gone(call["helper_pid"])

    def test_a_tpu_node_without_a_hostname_yet_says_what_to_wait_for(
        self, gcloud: FakeGcloud, tpu: FakeTpuGuestAttributes, tunnels: IapTunnels
    ) -> None:
        tpu.attributes[(ZONE, NODE)] = []
        with pytest.raises(EndpointAccessError) as raised:
            tunnels.base_url(target(backend=Backend.TPU_API))
        assert raised.value.error_class is ErrorClass.FAILED_PRECONDITION
        assert "hostname" in raised.value.message and "compute.disableGuestAttributesAccess" in raised.value.fix
        assert gcloud.calls() == []


def _proc(pid: int, name: str) -> bytes:
    path = Path(f"/proc/{pid}/{name}")
    if not path.exists():
        pytest.skip("no /proc: the kernel's view of the child cannot be read here")
    return path.read_bytes()

"""The VM twin's metadata server and Google API stand-ins, driven by the real google-auth and Secret Manager clients.

google-auth's Compute Engine credentials find the metadata server (ping), read the service account and refresh a
token from it; the real Secret Manager client (REST) then reads a secret from the stand-in with that token, while
a client without one is refused. The server answers as Google's does on headers, zone format and guest
attributes, which land in the simulator where the TPU API serves them.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import google.auth.transport.requests
import pytest
from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.auth import compute_engine
from google.auth.compute_engine import _metadata
from google.cloud import secretmanager

from localcloud.vm_twin.google_apis import GoogleApis
from localcloud.vm_twin.metadata_server import GuestAttributes, MetadataServer, TokenIssuer, VmIdentity
from shared.adapters.file_secrets import FileSecretStore

VM = VmIdentity(
    project="twin-proj", project_number=412345678901, zone="us-east5-b", name="vm-1", instance_id=77,
    service_account="tpu-vm@twin-proj.iam.gserviceaccount.com",
)  # fmt: skip


class Guest:
    """A stateful guest-attribute store standing in for the simulator's."""

    def __init__(self) -> None:
        self.values: dict[tuple[str, str], str] = {}

    def port(self) -> GuestAttributes:
        return GuestAttributes(
            put=lambda ns, key, value: self.values.__setitem__((ns, key), value),
            read=lambda: [(ns, key, value) for (ns, key), value in self.values.items()],
            delete=lambda ns, key: self.values.pop((ns, key), None),
        )


@pytest.fixture
def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[MetadataServer, GoogleApis, Guest]]:
    tokens = TokenIssuer()
    guest = Guest()
    attributes = {"startup-script": "#!/bin/bash\necho hi\n", "enable-guest-attributes": "TRUE"}
    server = MetadataServer(VM, lambda: attributes, guest.port(), tokens)
    host = server.start()
    monkeypatch.setattr(_metadata, "_GCE_METADATA_HOST", host)  # what GCE_METADATA_HOST sets at import
    monkeypatch.setenv("GCE_METADATA_IP", host)  # google-auth's ping reads this one at call time
    secrets = FileSecretStore(tmp_path / "secrets")
    secrets.put("greeting", "hello")
    apis = GoogleApis(VM.project, secrets, tmp_path / "storage", tokens)
    apis.start()
    try:
        yield server, apis, guest
    finally:
        server.stop()
        apis.stop()


def _get(host: str, path: str, headers: dict[str, str]) -> tuple[int, str, dict[str, str]]:
    request = urllib.request.Request(f"http://{host}{path}", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:  # noqa: S310 - loopback
            return answer.status, answer.read().decode(), dict(answer.headers)
    except urllib.error.HTTPError as refused:
        with refused:
            return refused.code, refused.read().decode(), dict(refused.headers)


def test_google_auth_gets_a_token_that_the_secret_manager_client_can_use(
    stack: tuple[MetadataServer, GoogleApis, Guest],
) -> None:
    _, apis, _ = stack
    request = google.auth.transport.requests.Request()
    assert _metadata.ping(request)
    credentials = compute_engine.Credentials()  # type: ignore[no-untyped-call]
    credentials.refresh(request)
    assert credentials.token and credentials.service_account_email == VM.service_account
    assert _metadata.get_project_id(request) == VM.project

    def client(with_credentials: object) -> secretmanager.SecretManagerServiceClient:
        return secretmanager.SecretManagerServiceClient(
            transport="rest",
            credentials=with_credentials,  # type: ignore[arg-type]
            client_options=ClientOptions(api_endpoint=apis.base_url),
        )

    answer = client(credentials).access_secret_version(name=f"projects/{VM.project}/secrets/greeting/versions/latest")
    assert answer.payload.data == b"hello"
    with pytest.raises(gexc.NotFound, match="not found or has no versions"):
        client(credentials).access_secret_version(name=f"projects/{VM.project}/secrets/absent/versions/latest")
    status, body, _ = _get(
        apis.base_url.removeprefix("http://"),
        f"/v1/projects/{VM.project}/secrets/greeting/versions/latest:access",
        {"Authorization": "Bearer not-issued-by-any-metadata-server"},
    )
    assert status == 401 and json.loads(body)["error"]["status"] == "UNAUTHENTICATED"


def test_headers_zone_attributes_and_guest_attributes_as_google_answers(
    stack: tuple[MetadataServer, GoogleApis, Guest],
) -> None:
    server, _, guest = stack
    host, flavor = server.host_port, {"Metadata-Flavor": "Google"}
    status, _, headers = _get(host, "/", {})
    assert status == 200 and headers.get("Metadata-Flavor") == "Google"
    assert _get(host, "/computeMetadata/v1/instance/name", {})[0] == 403
    assert _get(host, "/computeMetadata/v1/instance/name", {"Metadata-Flavor": "Other"})[0] == 404
    assert _get(host, "/computeMetadata/v1/instance/name", {**flavor, "X-Forwarded-For": "10.0.0.9"})[0] == 403
    assert (
        _get(host, "/computeMetadata/v1/instance/zone", flavor)[1] == f"projects/{VM.project_number}/zones/us-east5-b"
    )
    assert _get(host, "/computeMetadata/v1/instance/attributes/startup-script", flavor)[1] == "#!/bin/bash\necho hi\n"
    assert _get(host, "/computeMetadata/v1/instance/attributes/absent", flavor)[0] == 404
    recursive = json.loads(
        _get(host, "/computeMetadata/v1/instance/service-accounts/default/?recursive=true", flavor)[1]
    )
    assert recursive["email"] == VM.service_account

    put = urllib.request.Request(
        f"http://{host}/computeMetadata/v1/instance/guest-attributes/tpuctl/phase",
        data=b"weights",
        method="PUT",
        headers=flavor,
    )
    with urllib.request.urlopen(put, timeout=5) as answer:  # noqa: S310 - loopback
        assert answer.status == 200
    assert guest.values == {("tpuctl", "phase"): "weights"}
    assert _get(host, "/computeMetadata/v1/instance/guest-attributes/tpuctl/phase", flavor)[1] == "weights"
    refused = urllib.request.Request(
        f"http://{host}/computeMetadata/v1/instance/guest-attributes/tpuctl/phase", data=b"x", method="PUT"
    )
    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(refused, timeout=5)  # noqa: S310 - loopback
    denied.value.close()
    assert denied.value.code == 403 and guest.values[("tpuctl", "phase")] == "weights"


def test_a_vm_may_not_write_secrets_and_the_controller_side_may(
    stack: tuple[MetadataServer, GoogleApis, Guest], tmp_path: Path
) -> None:
    _, vm_side, _ = stack
    controller = GoogleApis(VM.project, vm_side.secrets, tmp_path / "storage", vm_side.tokens, require_token=False)
    controller.start()
    try:
        from shared.adapters.secret_manager import SecretManagerStore

        store = SecretManagerStore(VM.project, endpoint=controller.base_url)
        assert store.put("rotated", "v2-value").endswith("/secrets/rotated/versions/1")
        assert store.get("rotated") == "v2-value"
        assert vm_side.secrets.get("rotated") == "v2-value", "both sides read one secret store"
        status, body = vm_side.write(f"/v1/projects/{VM.project}/secrets/rotated:addVersion", "", {})
        assert status == 403 and "a VM may only read" in json.dumps(body)
    finally:
        controller.stop()

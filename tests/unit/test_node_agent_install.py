"""The startup script's own functions fetch, verify and install the node-agent bundle, run in real bash.

The rendered script runs against a loopback stand-in for the metadata server, Cloud Storage and Secret Manager,
reached only through the standard endpoint variables (``GCE_METADATA_HOST``, ``CLOUDSDK_API_ENDPOINT_OVERRIDES_*``),
which is all a local twin changes. ``docker`` is a shell function that records its argv and what the wheelhouse
held when pip would have run; ``sleep`` returns at once so retries cost nothing. The bundle is a real one, built by
scripts/package_node_agent.py from this checkout.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import pytest

from shared.config import Settings
from shared.domain.models import DeploymentSpec
from shared.domain.serving_plan import ServingEnvironment, build_serving_plan

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGER = REPO_ROOT / "scripts" / "package_node_agent.py"
BUCKET = "tpuctl-test-tpuctl-sources"
TOKEN = "ya29.loopback-token"  # a stand-in access token the fake metadata server issues
API_KEY = "sk-loopback-api-key-value"


@dataclass
class FakeGoogle:
    """Metadata server (token, guest attributes), Cloud Storage objects and Secret Manager, keeping what it saw."""

    objects: dict[tuple[str, str], bytes] = field(default_factory=dict)
    secrets: dict[str, bytes] = field(default_factory=dict)
    guest: list[tuple[str, str]] = field(default_factory=list)  # (attribute, value) in the order written
    object_reads: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)

    def phases(self) -> list[tuple[str, str]]:
        """(phase, detail) pairs as progress() wrote them (the detail goes first, so a phase never lacks one)."""
        pairs, detail = [], ""
        for attribute, value in self.guest:
            if attribute == "detail":
                detail = value
            elif attribute == "phase":
                pairs.append((value, detail))
        return pairs


def _handler(google: FakeGoogle) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return

        def _answer(self, status: int, body: bytes, kind: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _refuse(self, status: int) -> None:
            google.refused.append(f"{self.command} {self.path}")
            self._answer(status, b"{}")

        def do_PUT(self) -> None:
            path = urlsplit(self.path).path
            prefix = "/computeMetadata/v1/instance/guest-attributes/tpuctl/"
            if self.headers.get("Metadata-Flavor") != "Google" or not path.startswith(prefix):
                return self._refuse(403)
            body = self.rfile.read(int(self.headers.get("Content-Length", "0"))).decode()
            google.guest.append((path[len(prefix) :], body))
            return self._answer(200, b"")

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            if url.path == "/computeMetadata/v1/instance/service-accounts/default/token":
                if self.headers.get("Metadata-Flavor") != "Google":
                    return self._refuse(403)
                return self._answer(200, json.dumps({"access_token": TOKEN, "expires_in": 3599}).encode())
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                return self._refuse(401)
            if url.path.startswith("/storage/v1/b/") and url.query == "alt=media":
                bucket, _, name = url.path[len("/storage/v1/b/") :].partition("/o/")
                if "/" in name:  # the JSON API wants the object name as one URL-encoded path segment
                    return self._refuse(404)
                google.object_reads.append(unquote(name))
                data = google.objects.get((bucket, unquote(name)))
                return self._answer(200, data, "application/octet-stream") if data else self._refuse(404)
            if url.path.startswith("/v1/") and url.path.endswith(":access"):
                payload = google.secrets.get(url.path[len("/v1/") : -len(":access")])
                if payload is None:
                    return self._refuse(404)
                return self._answer(200, json.dumps({"payload": {"data": base64.b64encode(payload).decode()}}).encode())
            return self._refuse(404)

    return Handler


@pytest.fixture
def google() -> Iterator[tuple[FakeGoogle, int]]:
    fake = FakeGoogle()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield fake, int(server.server_address[1])
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, str]:
    """A real bundle of our wheel, built offline: (bytes, sha256)."""
    out = tmp_path_factory.mktemp("bundle")
    for step in (["wheel", "--out", str(out / "w")], ["bundle", "--wheels", str(out / "w"), "--out", str(out / "b")]):
        done = subprocess.run([sys.executable, str(PACKAGER), *step], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    data = (out / "b").read_bytes()
    return data, hashlib.sha256(data).hexdigest()


def _script(uri: str, digest: str) -> str:
    spec = DeploymentSpec(deployment_id="agent-check", model="tiny-llama", accelerator="v6e-1", zones=("us-east5-b",))
    environment = ServingEnvironment(project="tpuctl-test", node_agent_bundle=uri, node_agent_bundle_sha256=digest)
    return build_serving_plan(spec, environment).startup_script()


def _run(script: str, port: int, root: Path, driver: str) -> subprocess.CompletedProcess[str]:
    """The script's definitions (not its main), state under ``root``, then ``driver``; endpoints on loopback."""
    for fixed in ("readonly STATE_DIR=/var/lib/tpuctl", "readonly SECRETS_DIR=/run/tpuctl"):
        assert fixed in script, f"the harness relocates {fixed!r}; update it with the template"
    script = script.replace("=/var/lib/tpuctl", f"={root}/state").replace("=/run/tpuctl", f"={root}/run")
    script = script.replace("=/var/log/tpuctl-boot.log", f"={root}/boot.log")
    body, main_call = script.rsplit("\n", 2)[0], script.rsplit("\n", 2)[1]
    assert main_call == 'main "$@"', "the harness drops the final main call; update it with the template"
    stubs = (
        'docker() { { printf "%s\\0" "$@"; printf "\\n"; } >>"${ROOT}/docker.calls"; '
        'ls "${AGENT_DIR}/wheelhouse" >>"${ROOT}/wheelhouse.seen" 2>/dev/null || true; }\n'
        "sleep() { :; }\n"
        'install -d -m 0755 "${STATE_DIR}" "${AGENT_DIR}"\n'
        'install -d -m 0700 "${SECRETS_DIR}" "${SERVING_SECRETS}"\n'
    )
    environment = {
        "PATH": os.environ["PATH"],
        "ROOT": str(root),
        "GCE_METADATA_HOST": f"127.0.0.1:{port}",
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE": f"http://127.0.0.1:{port}/storage/v1/",
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER": f"http://127.0.0.1:{port}/",
    }
    return subprocess.run(
        ["bash", "-c", body + "\n" + stubs + driver], env=environment, capture_output=True, text=True, timeout=60
    )


def _docker_calls(root: Path) -> list[list[str]]:
    path = root / "docker.calls"
    lines = path.read_text().split("\n") if path.exists() else []
    return [line.split("\0")[:-1] for line in lines if line]


def _object_name(digest: str) -> str:
    return f"node-agent/{digest}-tpuctl-node-agent-0.1.0.tar.gz"


def test_a_verified_bundle_is_unpacked_and_installed_offline_once(
    google: tuple[FakeGoogle, int], bundle: tuple[bytes, str], tmp_path: Path
) -> None:
    fake, port = google
    data, digest = bundle
    fake.objects[(BUCKET, _object_name(digest))] = data
    script = _script(f"gs://{BUCKET}/{_object_name(digest)}", digest)

    done = _run(script, port, tmp_path, "install_node_agent\ninstall_node_agent\n")
    assert done.returncode == 0, done.stderr
    assert fake.object_reads == [_object_name(digest)], "one fetch; the second boot finds it installed"
    assert fake.refused == []
    assert (tmp_path / "state" / "node-agent" / "installed").read_text() == digest
    assert "tpuctl_node_agent-0.1.0-py3-none-any.whl" in (tmp_path / "wheelhouse.seen").read_text().split()
    installs = [call for call in _docker_calls(tmp_path) if "pip" in call]
    assert len(installs) == 1
    pip = installs[0]
    assert "--net=none" in pip and "--no-index" in pip
    assert pip[pip.index("--find-links") + 1] == "/opt/tpuctl/wheelhouse"
    assert pip[pip.index("--target") + 1] == "/opt/tpuctl/lib" and pip[-1] == "tpuctl-node-agent"
    assert not (tmp_path / "state" / "node-agent" / "bundle.tar.gz").exists()
    assert [phase for phase, _ in fake.phases()] == ["node-agent", "node-agent", "node-agent"]
    assert fake.phases()[-1][1].endswith("already installed")


def test_a_bundle_with_another_digest_fails_the_boot_and_is_never_installed(
    google: tuple[FakeGoogle, int], bundle: tuple[bytes, str], tmp_path: Path
) -> None:
    fake, port = google
    data, digest = bundle
    expected = hashlib.sha256(b"the bundle Terraform uploaded").hexdigest()
    fake.objects[(BUCKET, _object_name(expected))] = data  # someone replaced the object
    script = _script(f"gs://{BUCKET}/{_object_name(expected)}", expected)

    done = _run(script, port, tmp_path, "install_node_agent\necho unreachable\n")
    assert done.returncode == 1 and "unreachable" not in done.stdout
    phase, detail = fake.phases()[-1]
    assert phase == "failed"
    assert detail == f"node-agent bundle sha256 mismatch: got {digest}, expected {expected}"
    assert "run make package, terraform apply" in (tmp_path / "boot.log").read_text()
    assert not [call for call in _docker_calls(tmp_path) if "pip" in call]
    agent_dir = tmp_path / "state" / "node-agent"
    assert not (agent_dir / "installed").exists() and not (agent_dir / "bundle.tar.gz").exists()
    assert not (agent_dir / "wheelhouse").exists()


def test_a_missing_object_fails_the_boot_after_the_retries(
    google: tuple[FakeGoogle, int], bundle: tuple[bytes, str], tmp_path: Path
) -> None:
    fake, port = google
    _, digest = bundle
    done = _run(_script(f"gs://{BUCKET}/{_object_name(digest)}", digest), port, tmp_path, "install_node_agent\n")
    assert done.returncode == 1
    assert len(fake.object_reads) == 5, "retry 5 times"
    uri = f"gs://{BUCKET}/{_object_name(digest)}"
    assert fake.phases()[-1] == ("failed", f"node-agent bundle {uri} could not be fetched (see the boot log)")
    assert not [call for call in _docker_calls(tmp_path) if "pip" in call]


def test_without_a_bundle_nothing_is_fetched_and_the_agent_is_not_started(
    google: tuple[FakeGoogle, int], tmp_path: Path
) -> None:
    fake, port = google
    done = _run(_script("", ""), port, tmp_path, "install_node_agent\nstart_node_agent\n")
    assert done.returncode == 0, done.stderr
    assert fake.object_reads == [] and _docker_calls(tmp_path) == []
    assert fake.phases() == [("node-agent", "not configured")]


def test_secrets_are_read_through_the_overridden_secret_manager_into_a_0400_file(
    google: tuple[FakeGoogle, int], tmp_path: Path
) -> None:
    fake, port = google
    resource = "projects/tpuctl-test/secrets/tpuctl-vllm-api-key/versions/latest"
    fake.secrets[resource] = API_KEY.encode()
    driver = f'fetch_secret {resource} "${{SERVING_SECRETS}}/vllm-api-key"\n'
    done = _run(_script("", ""), port, tmp_path, driver)
    assert done.returncode == 0, done.stderr
    key_file = tmp_path / "run" / "serving" / "vllm-api-key"
    assert key_file.read_text() == API_KEY and key_file.stat().st_mode & 0o777 == 0o400
    assert API_KEY not in done.stdout + done.stderr
    assert fake.refused == []


def test_settings_take_the_uri_terraform_builds_and_name_the_variable_on_bad_values(
    bundle: tuple[bytes, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, digest = bundle
    uri = f"gs://{BUCKET}/{_object_name(digest)}"
    good = Settings(node_agent_bundle=uri, node_agent_bundle_sha256=digest)
    assert (good.node_agent_bundle, good.node_agent_bundle_sha256) == (uri, digest)
    cases = {
        "TPUCTL_NODE_AGENT_BUNDLE": {
            "node_agent_bundle": "s3://bucket/node-agent/x",
            "node_agent_bundle_sha256": digest,
        },
        "TPUCTL_NODE_AGENT_BUNDLE_SHA256": {"node_agent_bundle": uri, "node_agent_bundle_sha256": "not-hex"},
    }
    for variable, values in cases.items():
        with pytest.raises(ValueError, match=rf"{variable}: .*set it from Terraform"):
            Settings(**values)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="TPUCTL_NODE_AGENT_BUNDLE_SHA256: missing"):
        Settings(node_agent_bundle=uri)
    monkeypatch.setenv("TPUCTL_NODE_AGENT_BUNDLE", f"gs://{BUCKET}/functions/{quote('x y')}")
    monkeypatch.setenv("TPUCTL_NODE_AGENT_BUNDLE_SHA256", digest)
    with pytest.raises(ValueError, match=r"TPUCTL_NODE_AGENT_BUNDLE: .*not under node-agent/"):
        Settings()

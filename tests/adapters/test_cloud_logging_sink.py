"""``CloudLoggingSink`` posting to the local Cloud Logging stand-in, and the wiring that picks a sink per backend.

The sink gets real google-auth credentials holding a token the twin's metadata server issued; the default path
(compute-engine credentials and the resource read from the metadata server, found by ``GCE_METADATA_HOST``) runs
in ``tests/integration/test_vllm_log_shipping.py``, in a process started with that variable as a VM's agent is.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from google.oauth2.credentials import Credentials as TokenCredentials

from localcloud.vm_twin.google_apis import GoogleApis
from localcloud.vm_twin.metadata_server import TokenIssuer, VmIdentity
from shared.adapters.cloud_logging_sink import LOG_ID, CloudLoggingSink, rfc3339_nanos
from shared.adapters.file_secrets import FileSecretStore
from shared.adapters.local_log_sink import LocalFilesLogSink
from shared.config import Settings
from shared.domain.errors import CloudError, ErrorClass
from shared.ports import NodeLogLine
from shared.wiring import Runtime

PROJECT = "tpuctl-twin"
VM = VmIdentity(PROJECT, 412345678901, "us-east5-b", "gemma-a-1", 4242, "vm@tpuctl-twin.iam.gserviceaccount.com")
RESOURCE = {"type": "gce_instance", "labels": {"project_id": PROJECT, "zone": "us-east5-b", "instance_id": "4242"}}
T0 = 1_796_326_327_123_456_789


@pytest.fixture
def apis(tmp_path: Path) -> Iterator[GoogleApis]:
    served = GoogleApis(PROJECT, FileSecretStore(tmp_path / "secrets"), tmp_path / "storage", TokenIssuer())
    served.start()
    try:
        yield served
    finally:
        served.stop()


def sink_for(apis: GoogleApis, token: str | None = None, project: str = PROJECT) -> CloudLoggingSink:
    return CloudLoggingSink(
        project,
        deployment_id="gemma-a",
        container="tpuctl-vllm",
        endpoint=apis.base_url,
        credentials=TokenCredentials(token or apis.tokens.issue(VM)),
        resource=RESOURCE,
        timeout_s=5,
    )


def test_a_batch_becomes_entries_with_the_vms_resource_labels_and_the_engines_time(apis: GoogleApis) -> None:
    sink = sink_for(apis)
    try:
        sink.write(
            [
                NodeLogLine(T0, "WARNING", "(APIServer pid=1) WARNING 12-03 19:32:07 [cpu.py:224] Triton missing"),
                NodeLogLine(T0 + 1, "ERROR", "Traceback (most recent call last):"),
            ]
        )
        sink.write([])  # nothing to send: no call
    finally:
        sink.close()
    stored = apis.logging.entries()
    assert [(e["severity"], e["timestamp"]) for e in stored] == [
        ("WARNING", "2026-12-03T19:32:07.123456789Z"),
        ("ERROR", "2026-12-03T19:32:07.123456790Z"),
    ]
    assert rfc3339_nanos(T0) == stored[0]["timestamp"]
    assert {e["logName"] for e in stored} == {f"projects/{PROJECT}/logs/{LOG_ID}"}
    assert all(e["resource"] == RESOURCE for e in stored)
    assert all(e["labels"] == {"tpuctl-deployment": "gemma-a", "container": "tpuctl-vllm"} for e in stored)
    assert stored[1]["textPayload"] == "Traceback (most recent call last):"
    assert apis.calls.count(("POST", "/v2/entries:write")) == 1


def test_errors_are_classified_for_the_shipper(apis: GoogleApis, tmp_path: Path) -> None:
    line = NodeLogLine(T0, "INFO", "x")
    cases = [
        (sink_for(apis, token="ya29.not-issued"), ErrorClass.PERMISSION, "no token for the VM's identity"),
        (sink_for(apis, project="someone-else"), ErrorClass.PERMISSION, "roles/logging.logWriter"),
    ]
    for sink, error_class, text in cases:
        with pytest.raises(CloudError, match=text) as raised:
            sink.write([line])
        assert raised.value.error_class is error_class
        sink.close()
    sink = sink_for(apis)
    with pytest.raises(CloudError, match="HTTP 400") as invalid:
        sink.write([NodeLogLine(T0, "INFO", "x" * (300 * 1024))])
    assert invalid.value.error_class is ErrorClass.INVALID
    apis.stop()
    with pytest.raises(CloudError, match="Cloud Logging unreachable") as down:
        sink.write([line])
    assert down.value.error_class is ErrorClass.TRANSIENT
    sink.close()
    assert apis.logging.entries() == []


def test_the_wiring_ships_to_cloud_logging_on_gcp_and_nowhere_locally(tmp_path: Path) -> None:
    gcp = Runtime(Settings(backend="gcp", project="tpuctl-twin", logging_endpoint="http://127.0.0.1:9"))
    built = gcp.log_sink("gemma-a", "tpuctl-vllm")
    assert isinstance(built, CloudLoggingSink)
    built.close()
    local = Runtime(Settings(backend="local", data_dir=tmp_path)).log_sink("gemma-a", "tpuctl-vllm")
    assert isinstance(local, LocalFilesLogSink)
    local.write([NodeLogLine(T0, "ERROR", "kept by the local log files, not sent")])  # takes anything, sends nothing
    assert list(tmp_path.iterdir()) == []

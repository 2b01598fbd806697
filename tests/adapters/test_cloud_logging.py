"""``CloudLoggingReader`` with the real google-cloud-logging client (REST transport) against a local fake.

Cloud Logging has no emulator, so a loopback server answers ``POST /v2/entries:list`` the way the API does
and remembers every request: the tests check the filter the adapter built and how entries are read back.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import logging as cloud_logging

from shared.adapters.cloud_logging import CloudLoggingReader, build_filter
from shared.domain.errors import CloudError, ErrorClass
from shared.ports import LogQuery

PROJECT = "tpuctl-test"


@dataclass
class FakeLogging:
    url: str
    entries: list[dict[str, Any]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    status: int = 200


@pytest.fixture
def fake_logging() -> Iterator[FakeLogging]:
    state = FakeLogging(url="")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
            state.requests.append({"path": self.path, "body": body})
            if state.status != 200:
                payload = {"error": {"code": state.status, "message": "denied", "status": "PERMISSION_DENIED"}}
            else:
                payload = {"entries": state.entries}
            data = json.dumps(payload).encode()
            self.send_response(state.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def reader_for(fake: FakeLogging) -> CloudLoggingReader:
    client = cloud_logging.Client(
        project=PROJECT,
        credentials=AnonymousCredentials(),
        _use_grpc=False,
        client_options={"api_endpoint": fake.url},
    )
    return CloudLoggingReader(PROJECT, client=client)


def test_entries_are_read_newest_first_with_a_filter_built_from_closed_values(fake_logging: FakeLogging) -> None:
    fake_logging.entries = [
        {
            "logName": f"projects/{PROJECT}/logs/run.googleapis.com%2Fstdout",
            "timestamp": "2026-12-02T12:00:05Z",
            "severity": "ERROR",
            "jsonPayload": {"message": "stockout in us-east5-b", "deployment_id": "gemma-a"},
            "resource": {"type": "cloud_run_revision", "labels": {"service_name": "tpuctl-provision"}},
        },
        {
            "logName": f"projects/{PROJECT}/logs/vllm",
            "timestamp": "2026-12-02T12:00:01Z",
            "severity": "WARNING",
            "textPayload": "KV cache usage 95%",
            "labels": {"tpuctl-deployment": "gemma-a"},
            "resource": {"type": "tpu_worker", "labels": {"node_id": "gemma-a-g1-a1"}},
        },
    ]
    since = datetime(2026, 12, 2, 11, 0, tzinfo=UTC)
    entries = reader_for(fake_logging).read(
        LogQuery(deployment_id="gemma-a", since=since, min_severity="WARNING", limit=20)
    )
    assert [(e.severity, e.source, e.message, e.deployment_id) for e in entries] == [
        ("ERROR", "controller/tpuctl-provision", "stockout in us-east5-b", "gemma-a"),
        ("WARNING", "node/tpu_worker", "KV cache usage 95%", "gemma-a"),
    ]
    assert entries[0].time == datetime(2026, 12, 2, 12, 0, 5, tzinfo=UTC)
    (request,) = fake_logging.requests
    assert request["path"].split("?")[0] == "/v2/entries:list"
    body = request["body"]
    assert body["resourceNames"] == [f"projects/{PROJECT}"] and body["orderBy"] == "timestamp desc"
    assert body["pageSize"] == 20
    assert body["filter"] == (
        'timestamp>="2026-12-02T11:00:00.000000Z" AND severity>=WARNING AND '
        '(jsonPayload.deployment_id="gemma-a" OR labels."tpuctl-deployment"="gemma-a" '
        'OR resource.labels.node_id:"gemma-a")'
    )


def test_a_permission_error_is_classified_with_the_role_to_grant(fake_logging: FakeLogging) -> None:
    fake_logging.status = 403
    with pytest.raises(CloudError) as caught:
        reader_for(fake_logging).read(LogQuery(limit=5))
    assert caught.value.error_class is ErrorClass.PERMISSION
    assert "roles/logging.viewer" in caught.value.message


@pytest.mark.parametrize(
    ("query", "clause"),
    [
        (LogQuery(source="controller"), '(resource.type="cloud_run_revision" OR resource.type="cloud_function")'),
        (LogQuery(source="node"), '(resource.type="tpu_worker" OR resource.type="gce_instance")'),
        (LogQuery(min_severity="DEFAULT"), 'timestamp>="2026-12-02T11:00:00.000000Z"'),
    ],
)
def test_filters_for_each_source(query: LogQuery, clause: str) -> None:
    now = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
    built = build_filter(query, now)
    assert clause in built
    assert "severity" not in built or query.min_severity != "DEFAULT"


@pytest.mark.parametrize(
    "query",
    [
        LogQuery(deployment_id='gemma" OR severity>=DEFAULT OR "'),
        LogQuery(min_severity="LOUD"),  # type: ignore[arg-type]
        LogQuery(source="everything"),  # type: ignore[arg-type]
    ],
)
def test_a_value_outside_the_grammar_never_reaches_the_filter(query: LogQuery) -> None:
    with pytest.raises(CloudError) as caught:
        build_filter(query, datetime(2026, 12, 2, 12, 0, tzinfo=UTC))
    assert caught.value.error_class is ErrorClass.INVALID

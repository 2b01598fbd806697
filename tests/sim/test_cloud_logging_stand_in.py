"""The local cloud's Cloud Logging stand-in, driven by the real google-cloud-logging client over REST.

Writes go as a TPU VM's would, with a token its metadata server issued; reads as the gateway's, anonymously. The
filter language is the subset the product's reader sends plus what an operator types most (severity, time, labels,
NOT, ``:``); anything else is refused by name instead of matching everything.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.auth import exceptions as auth_exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import logging as cloud_logging
from google.cloud.logging_v2.resource import Resource
from google.oauth2.credentials import Credentials as TokenCredentials

from localcloud.vm_twin.google_apis import GoogleApis
from localcloud.vm_twin.metadata_server import TokenIssuer, VmIdentity
from mcp_client_gateway.composition import build_ports
from shared.adapters.cloud_logging import CloudLoggingReader, build_filter
from shared.adapters.file_secrets import FileSecretStore
from shared.config import Settings
from shared.ports import LogQuery

PROJECT = "tpuctl-twin"
VM = VmIdentity(
    PROJECT, 412345678901, "us-east5-b", "gemma-a-1", 4242, "tpuctl-tpu-vm@tpuctl-twin.iam.gserviceaccount.com"
)
RESOURCE = Resource(type="gce_instance", labels={"project_id": PROJECT, "zone": "us-east5-b", "instance_id": "4242"})
T0 = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=10)


@pytest.fixture
def apis(tmp_path: Path) -> Iterator[GoogleApis]:
    served = GoogleApis(PROJECT, FileSecretStore(tmp_path / "secrets"), tmp_path / "storage", TokenIssuer())
    served.start()
    try:
        yield served
    finally:
        served.stop()


def client(apis: GoogleApis, credentials: Any = None, project: str = PROJECT) -> cloud_logging.Client:
    return cloud_logging.Client(
        project=project,
        credentials=credentials or AnonymousCredentials(),
        client_options={"api_endpoint": apis.base_url},
        _use_grpc=False,
    )


def vm_client(apis: GoogleApis) -> cloud_logging.Client:
    return client(apis, TokenCredentials(apis.tokens.issue(VM)))


def seed(apis: GoogleApis) -> None:
    """Five entries of two deployments, a minute apart, written in one batch as the node agent writes them."""
    batch = vm_client(apis).logger("tpuctl-vllm").batch()
    rows = [
        ("INFO", "gemma-a", "(APIServer pid=1) INFO 12-03 19:32:07 [launcher.py:195] Route: /health"),
        ("WARNING", "gemma-a", "(APIServer pid=1) WARNING 12-03 19:33:07 [cpu.py:224] Triton is not installed."),
        ("ERROR", "gemma-a", "Traceback (most recent call last):"),
        ("ERROR", "gemma-b", "OSError: Repo id must be in the form 'repo_name'"),
        ("CRITICAL", "gemma-a", "(EngineCore_DP0 pid=9) CRITICAL 12-03 19:36:07 [core.py:1] the ROBOT engine died"),
    ]
    for minute, (severity, deployment, text) in enumerate(rows):
        labels = {"tpuctl-deployment": deployment, "container": "tpuctl-vllm"}
        batch.log_text(
            text, severity=severity, labels=labels, resource=RESOURCE, timestamp=T0 + timedelta(minutes=minute)
        )
    batch.commit()


def texts(entries: Any) -> list[str]:
    return [entry.payload for entry in entries]


def listed(apis: GoogleApis, filter_: str, order: str = cloud_logging.ASCENDING) -> list[str]:
    return texts(client(apis).list_entries(resource_names=[f"projects/{PROJECT}"], filter_=filter_, order_by=order))


def raw_post(apis: GoogleApis, path: str, body: dict[str, Any], token: str | None = None) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(apis.base_url + path, data=json.dumps(body).encode(), method="POST")  # noqa: S310
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:  # noqa: S310 - loopback
            return int(answer.status), json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_vm_writes_and_anyone_reads_back_newest_first_with_labels_and_resource(apis: GoogleApis) -> None:
    seed(apis)
    entries = list(
        client(apis).list_entries(
            resource_names=[f"projects/{PROJECT}"],
            filter_='labels."tpuctl-deployment"="gemma-a" AND severity>=WARNING',
            order_by=cloud_logging.DESCENDING,
        )
    )
    assert [e.severity for e in entries] == ["CRITICAL", "ERROR", "WARNING"]
    assert entries[0].timestamp == T0 + timedelta(minutes=4)
    assert entries[0].logger is not None and entries[0].logger.name == "tpuctl-vllm"
    assert entries[0].resource == RESOURCE and entries[0].labels["container"] == "tpuctl-vllm"
    assert all(e.insert_id for e in entries)


@pytest.mark.parametrize(
    ("filter_", "expected"),
    [
        ("severity>=ERROR", ["Traceback", "OSError", "(EngineCore_DP0"]),
        ("severity=WARNING OR severity=critical", ["(APIServer pid=1) WARNING", "(EngineCore_DP0"]),
        ('NOT labels."tpuctl-deployment"="gemma-a"', ["OSError"]),
        ("textPayload:robot", ["(EngineCore_DP0"]),  # has: a substring, any case
        ('resource.labels.zone="us-east5-b" AND labels.container:*', None),  # everything
        ('labels.missing:*', []),
        ('logName="projects/tpuctl-twin/logs/tpuctl-vllm" severity<=INFO', ["(APIServer pid=1) INFO"]),
        (f'timestamp>="{(T0 + timedelta(minutes=1)).isoformat()}" AND timestamp<"{(T0 + timedelta(minutes=3)).isoformat()}"',  # noqa: E501
         ["(APIServer pid=1) WARNING", "Traceback"]),
        # OR binds tighter than AND in this language: (INFO OR WARNING) AND has "ROBOT" matches nothing
        ("severity=INFO OR severity=WARNING AND textPayload:ROBOT", []),
        ('resource.type="cloud_run_revision" OR resource.type="gce_instance"', None),
    ],
)  # fmt: skip
def test_the_filter_subset(apis: GoogleApis, filter_: str, expected: list[str] | None) -> None:
    seed(apis)
    found = listed(apis, filter_)
    if expected is None:
        assert len(found) == 5
    else:
        assert [next(p for p in expected if text.startswith(p)) for text in found] == expected


@pytest.mark.parametrize(
    ("filter_", "named"),
    [
        ('textPayload=~"Tri.*"', "'=~': regular expressions are not supported"),
        ("robot", "'robot': a bare term"),
        ('SEARCH("robot")', "'SEARCH': a bare term"),
        ("httpRequest.status>=500", "the field 'httpRequest.status' is not supported"),
        ('resource.type=("gce_instance" OR "tpu_worker")', "a value list"),
        ("severity>=LOUD", "'LOUD' is not a severity"),
        ('timestamp>="yesterday"', "'yesterday' is not an RFC 3339 time"),
        ("(severity>=INFO", "never closed"),
        ("severity>=INFO -- a comment", "'--': not a field path"),
    ],
)
def test_anything_else_is_refused_naming_the_part(apis: GoogleApis, filter_: str, named: str) -> None:
    seed(apis)
    status, body = raw_post(apis, "/v2/entries:list", {"resourceNames": [f"projects/{PROJECT}"], "filter": filter_})
    assert status == 400 and body["error"]["status"] == "INVALID_ARGUMENT"
    assert named in body["error"]["message"]


def test_the_product_reader_reads_through_its_endpoint_with_its_own_filter(apis: GoogleApis) -> None:
    seed(apis)
    reader = CloudLoggingReader(PROJECT, endpoint=apis.base_url)
    query = LogQuery(deployment_id="gemma-a", since=T0, min_severity="ERROR", source="node", limit=10)
    assert "AND" in build_filter(query, datetime.now(UTC))
    entries = reader.read(query)
    assert [(e.severity, e.source, e.deployment_id) for e in entries] == [
        ("CRITICAL", "node/tpuctl-vllm", "gemma-a"),
        ("ERROR", "node/tpuctl-vllm", "gemma-a"),
    ]
    assert reader.read(LogQuery(source="controller", since=T0)) == []


def test_pages_follow_the_token_and_a_foreign_token_is_refused(apis: GoogleApis) -> None:
    seed(apis)
    pages = client(apis).list_entries(resource_names=[f"projects/{PROJECT}"], filter_="severity>=DEFAULT", page_size=2)
    assert len(texts(pages)) == 5
    body = {"resourceNames": [f"projects/{PROJECT}"], "pageSize": 2, "orderBy": "timestamp desc"}
    status, first = raw_post(apis, "/v2/entries:list", body)
    assert status == 200 and len(first["entries"]) == 2 and first["nextPageToken"]
    status, second = raw_post(apis, "/v2/entries:list", {**body, "pageToken": first["nextPageToken"]})
    assert [e["severity"] for e in first["entries"] + second["entries"]] == ["CRITICAL", "ERROR", "ERROR", "WARNING"]
    assert second["entries"][0]["textPayload"] == "Traceback (most recent call last):"
    status, refused = raw_post(
        apis, "/v2/entries:list", {**body, "filter": "severity>=INFO", "pageToken": first["nextPageToken"]}
    )
    assert status == 400 and "pageToken" in refused["error"]["message"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"resourceNames": []}, "resourceNames"),
        ({"resourceNames": ["folders/1"]}, "only projects/PROJECT"),
        ({"resourceNames": [f"projects/{PROJECT}"], "orderBy": "severity desc"}, "orderBy"),
        ({"resourceNames": [f"projects/{PROJECT}"], "pageSize": 1001}, "pageSize"),
        ({"resourceNames": [f"projects/{PROJECT}"], "maxResults": 5}, 'Unknown name "maxResults"'),
    ],
)
def test_a_malformed_list_is_refused(apis: GoogleApis, body: dict[str, Any], message: str) -> None:
    status, answer = raw_post(apis, "/v2/entries:list", body)
    assert status == 400 and message in answer["error"]["message"]


def test_another_projects_entries_are_not_listed(apis: GoogleApis) -> None:
    status, answer = raw_post(apis, "/v2/entries:list", {"resourceNames": ["projects/someone-else"]})
    assert status == 403 and answer["error"]["status"] == "PERMISSION_DENIED"


def test_writes_need_a_token_a_metadata_server_issued_and_this_project(apis: GoogleApis) -> None:
    entry = {"textPayload": "x", "resource": {"type": "gce_instance"}}
    body = {"logName": f"projects/{PROJECT}/logs/tpuctl-vllm", "entries": [entry]}
    for token in (None, "ya29.forged-token"):
        status, answer = raw_post(apis, "/v2/entries:write", body, token)
        assert status == 401 and answer["error"]["status"] == "UNAUTHENTICATED"
    with pytest.raises(auth_exceptions.InvalidOperation, match="cannot be refreshed"):  # 401, nothing to refresh
        client(apis).logger("tpuctl-vllm").log_text("anonymous", resource=RESOURCE)
    with pytest.raises(gexc.Forbidden, match=r"logging\.logEntries\.create"):
        client(apis, TokenCredentials(apis.tokens.issue(VM)), project="someone-else").logger("x").log_text(
            "elsewhere", resource=RESOURCE
        )
    assert apis.logging.entries() == []
    assert ("POST", "/v2/entries:write") in apis.calls


def test_a_bad_entry_is_named_and_partial_success_keeps_the_good_ones(apis: GoogleApis) -> None:
    token = apis.tokens.issue(VM)
    good = {"textPayload": "fine", "severity": "INFO"}
    bad = {"textPayload": "x" * (300 * 1024)}
    body = {
        "logName": f"projects/{PROJECT}/logs/tpuctl-vllm",
        "resource": {"type": "gce_instance", "labels": {"zone": "us-east5-b"}},
        "labels": {"tpuctl-deployment": "gemma-a"},
        "entries": [good, bad, {**good, "severity": "LOUD"}],
    }
    status, answer = raw_post(apis, "/v2/entries:write", body, token)
    assert status == 400 and "entries[1]" in answer["error"]["message"] and "256.0K" in answer["error"]["message"]
    assert apis.logging.entries() == [], "all or nothing without partialSuccess"
    status, answer = raw_post(apis, "/v2/entries:write", {**body, "partialSuccess": True}, token)
    assert status == 400 and "2 of 3 entries were refused" in answer["error"]["message"]
    [kept] = apis.logging.entries()
    assert kept["textPayload"] == "fine" and kept["labels"] == {"tpuctl-deployment": "gemma-a"}
    status, answer = raw_post(apis, "/v2/entries:write", {**body, "entries": [good], "dry_run": True}, token)
    assert status == 200 and len(apis.logging.entries()) == 1, "a dry run writes nothing"
    status, answer = raw_post(apis, "/v2/entries:write", {**body, "entries": [{"text": "typo"}]}, token)
    assert status == 400 and 'Unknown name "text"' in answer["error"]["message"]


def test_the_gateway_reads_through_its_logging_endpoint_setting(apis: GoogleApis) -> None:
    seed(apis)
    ports = build_ports(Settings(backend="gcp", project=PROJECT, logging_endpoint=apis.base_url))
    entries = ports.logs.read(LogQuery(deployment_id="gemma-a", since=T0, min_severity="ERROR", source="node"))
    assert [e.severity for e in entries] == ["CRITICAL", "ERROR"]
    with pytest.raises(ValueError, match="logging_endpoint"):
        Settings(backend="gcp", project=PROJECT, logging_endpoint="logging.googleapis.com")

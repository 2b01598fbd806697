"""The delivery path Terraform builds, checked against the real functions-framework.

Terraform feeds each CloudEvent function from its own Pub/Sub push subscription (not an Eventarc
trigger) so the dead-letter policy stays under our control. That only works if:

* a raw Pub/Sub push body reaches a ``@functions_framework.cloud_event`` function as the same
  CloudEvent Eventarc would deliver, and ``shared.entry`` reads it the same way;
* the decorator fixes the signature type even when the platform deploys the function as HTTP
  (no event trigger means the platform's default signature type is ``http``);
* a raise becomes a non-2xx answer, which Pub/Sub push treats as a nack and redelivers with
  backoff until the dead-letter policy takes over; a return becomes 2xx, an ack.
"""

from __future__ import annotations

import base64
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient
from functions_framework import _function_registry, create_app

from shared.entry import payload_from_cloud_event

_MODULE = "tpuctl_push_probe_fn"
_TARGET = "tpuctl_push_probe"
_FUNCTION = f"""
import functions_framework

EVENTS = []


@functions_framework.cloud_event
def {_TARGET}(event):
    EVENTS.append(event)
    if event.data["message"].get("attributes", {{}}).get("fail") == "yes":
        raise RuntimeError("transient: retry me")
"""


def _push_body(data: bytes, attributes: dict[str, str]) -> dict[str, object]:
    """What a Pub/Sub push subscription POSTs (the default wrapped format)."""
    return {
        "message": {
            "data": base64.b64encode(data).decode(),
            "attributes": attributes,
            "messageId": "4021",
            "publishTime": "2025-05-01T12:00:00.123Z",
        },
        "subscription": "projects/p/subscriptions/tpuctl-provision-commands",
    }


@pytest.fixture
def probe(tmp_path: Path) -> Iterator[tuple[FlaskClient, list[Any]]]:
    """The app functions-framework builds for a function deployed without an event trigger (HTTP)."""
    source = tmp_path / f"{_MODULE}.py"
    source.write_text(_FUNCTION, encoding="utf-8")
    path_before = list(sys.path)
    try:
        app = create_app(target=_TARGET, source=str(source), signature_type="http")
        yield app.test_client(), sys.modules[_MODULE].EVENTS
    finally:
        sys.modules.pop(_MODULE, None)
        _function_registry.REGISTRY_MAP.pop(_TARGET, None)
        sys.path[:] = path_before


def test_a_raw_push_reaches_a_cloud_event_function_deployed_as_http(probe: tuple[FlaskClient, list[Any]]) -> None:
    client, events = probe
    response = client.post("/", json=_push_body(b'{"kind": "deployment.create"}', {"kind": "deployment.create"}))
    assert response.status_code == 200
    [event] = events
    assert event["type"] == "google.cloud.pubsub.topic.v1.messagePublished"
    assert event.data["message"]["attributes"] == {"kind": "deployment.create"}


def test_shared_entry_reads_a_pushed_event_like_an_eventarc_one(probe: tuple[FlaskClient, list[Any]]) -> None:
    client, events = probe
    client.post("/", json=_push_body(b'{"kind": "deployment.delete"}', {"kind": "deployment.delete"}))
    payload = payload_from_cloud_event(events[0])
    assert payload.data == b'{"kind": "deployment.delete"}'
    assert payload.message_id == "4021"
    assert dict(payload.attributes) == {"kind": "deployment.delete"}
    assert payload.publish_time == datetime(2025, 5, 1, 12, 0, 0, 123000, tzinfo=UTC)


def test_a_raise_is_a_non_2xx_answer_so_pub_sub_redelivers(probe: tuple[FlaskClient, list[Any]]) -> None:
    client, events = probe
    response = client.post("/", json=_push_body(b"{}", {"fail": "yes"}))
    assert response.status_code >= 500, "Pub/Sub push acks any 2xx: a failure must not look like one"
    assert len(events) == 1

"""``CloudLoggingReader``: the ``LogReader`` on Google Cloud, over google-cloud-logging.

The filter is built only from closed values (a deployment id that matched its pattern, a severity from the
enum, a timestamp we format, a source from a fixed table), so no caller text reaches the query language.
Controller logs are the three Cloud Functions (gen2 functions run as Cloud Run revisions); node logs are the
TPU VM's (``tpu_worker`` and, for the Compute Engine back end, ``gce_instance``), among them the vLLM container's
lines the node agent ships (``logName`` ``tpuctl-vllm``, label ``container``, severities parsed from vLLM's format).

``endpoint`` (``TPUCTL_LOGGING_ENDPOINT``) points the client elsewhere, over REST and anonymous as the other
adapters with an endpoint are (the local cloud's Cloud Logging stand-in serves reads to any caller).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from shared.domain.errors import CloudError, ErrorClass
from shared.domain.models import DEPLOYMENT_ID_PATTERN
from shared.ports import LOG_SEVERITIES, LogEntry, LogQuery

__all__ = ["CloudLoggingReader", "build_filter"]

_CONTROLLER_TYPES = ("cloud_run_revision", "cloud_function")
_NODE_TYPES = ("tpu_worker", "gce_instance")
_DEPLOYMENT_ID = re.compile(DEPLOYMENT_ID_PATTERN)
_DEFAULT_LOOKBACK = timedelta(hours=1)
_MAX_LIMIT = 1000


def build_filter(query: LogQuery, now: datetime) -> str:
    """The Cloud Logging filter for ``query``; raises ``CloudError(INVALID)`` for a value outside its grammar."""
    since = query.since or (now - _DEFAULT_LOOKBACK)
    if since.tzinfo is None:
        raise CloudError(ErrorClass.INVALID, "since: must be timezone-aware (UTC)")
    clauses = [f'timestamp>="{since.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")}"']
    if query.min_severity not in LOG_SEVERITIES:
        raise CloudError(ErrorClass.INVALID, f"min_severity: use one of {', '.join(LOG_SEVERITIES)}")
    if query.min_severity != "DEFAULT":
        clauses.append(f"severity>={query.min_severity}")
    if query.source == "controller":
        clauses.append("(" + " OR ".join(f'resource.type="{t}"' for t in _CONTROLLER_TYPES) + ")")
    elif query.source == "node":
        clauses.append("(" + " OR ".join(f'resource.type="{t}"' for t in _NODE_TYPES) + ")")
    elif query.source != "any":
        raise CloudError(ErrorClass.INVALID, "source: use any, controller or node")
    if query.deployment_id is not None:
        if not _DEPLOYMENT_ID.match(query.deployment_id):
            raise CloudError(ErrorClass.INVALID, "deployment_id: lower-case letters, digits and '-'")
        value = query.deployment_id
        clauses.append(
            f'(jsonPayload.deployment_id="{value}" OR labels."tpuctl-deployment"="{value}"'
            f' OR resource.labels.node_id:"{value}")'
        )
    return " AND ".join(clauses)


class CloudLoggingReader:
    """Reads entries of one project, newest first; the SDK client is built on first use."""

    def __init__(self, project: str, *, client: Any | None = None, endpoint: str | None = None) -> None:
        self._project = project
        self._client = client
        self._endpoint = endpoint

    def read(self, query: LogQuery) -> list[LogEntry]:
        limit = max(0, min(query.limit, _MAX_LIMIT))
        if limit == 0:
            return []
        expression = build_filter(query, datetime.now(UTC))
        from google.cloud.logging import DESCENDING

        with _mapped():
            entries = self._sdk().list_entries(
                resource_names=[f"projects/{self._project}"],
                filter_=expression,
                order_by=DESCENDING,
                max_results=limit,
                page_size=limit,
            )
            return [_entry(raw) for raw in entries]

    def _sdk(self) -> Any:
        if self._client is None:
            from google.cloud import logging as cloud_logging

            if self._endpoint:
                from google.auth.credentials import AnonymousCredentials

                self._client = cloud_logging.Client(
                    project=self._project,
                    credentials=AnonymousCredentials(),
                    client_options={"api_endpoint": self._endpoint},
                    _use_grpc=False,
                )
            else:
                self._client = cloud_logging.Client(project=self._project)
        return self._client


def _entry(raw: Any) -> LogEntry:
    payload = getattr(raw, "payload", None)
    deployment_id: str | None = None
    labels = dict(getattr(raw, "labels", None) or {})
    if isinstance(payload, dict):
        message = payload.get("message")
        text = message if isinstance(message, str) else json.dumps(payload, default=str, sort_keys=True)
        deployment_id = payload.get("deployment_id") if isinstance(payload.get("deployment_id"), str) else None
    elif payload is None:
        text = ""
    else:
        text = str(payload)
    deployment_id = deployment_id or labels.get("tpuctl-deployment")
    resource = getattr(raw, "resource", None)
    resource_type = str(getattr(resource, "type", "") or "")
    source = "controller" if resource_type in _CONTROLLER_TYPES else "node" if resource_type in _NODE_TYPES else "other"
    resource_labels = dict(getattr(resource, "labels", None) or {})
    component = (
        resource_labels.get("service_name")
        or resource_labels.get("function_name")
        or labels.get("container")
        or resource_type
        or source
    )
    timestamp = getattr(raw, "timestamp", None)
    severity = str(getattr(raw, "severity", None) or "DEFAULT").upper()
    return LogEntry(
        time=timestamp if isinstance(timestamp, datetime) else None,
        severity=severity if severity in LOG_SEVERITIES else "DEFAULT",
        source=f"{source}/{component}" if component != source else source,
        message=text,
        deployment_id=deployment_id,
    )


@contextmanager
def _mapped() -> Iterator[None]:
    from google.api_core import exceptions as gexc

    try:
        yield
    except (gexc.Forbidden, gexc.Unauthorized) as exc:
        raise CloudError(
            ErrorClass.PERMISSION, "Cloud Logging: permission denied (grant roles/logging.viewer)"
        ) from exc
    except gexc.BadRequest as exc:
        raise CloudError(ErrorClass.INVALID, "Cloud Logging: the filter was rejected") from exc
    except gexc.TooManyRequests as exc:
        raise CloudError(ErrorClass.RATE_LIMIT, "Cloud Logging: rate limited; try again in a minute") from exc
    except gexc.NotFound as exc:
        raise CloudError(ErrorClass.NOT_FOUND, "Cloud Logging: project not found") from exc
    except (gexc.ServerError, gexc.RetryError) as exc:
        raise CloudError(ErrorClass.TRANSIENT, "Cloud Logging: unavailable; try again") from exc
    except gexc.GoogleAPICallError as exc:
        raise CloudError(ErrorClass.UNKNOWN, f"Cloud Logging: {type(exc).__name__}") from exc

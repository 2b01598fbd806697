"""``CloudLoggingSink``: the ``LogSink`` on Google Cloud, Cloud Logging's ``entries:write`` as the TPU VM itself.

Why this way: the docker ``gcplogs`` driver speaks gRPC to logging.googleapis.com with no endpoint option (and
hangs without it), and google-cloud-logging would add its own dependencies to the node-agent bundle; google-auth
and requests are in the bundle already. So the node agent posts Google's JSON wire itself:

* identity: google-auth's ``compute_engine.Credentials``, tokens from the VM's metadata server. google-auth reads
  ``GCE_METADATA_HOST`` (default ``metadata.google.internal``) when it is imported, so the variable is set before
  the agent starts, as a VM twin does; the resource labels come from the same server, read once;
* where: ``TPUCTL_LOGGING_ENDPOINT`` (``Settings.logging_endpoint``), default ``https://logging.googleapis.com``;
* what: ``logName=projects/P/logs/tpuctl-vllm``, resource ``gce_instance`` with ``project_id``, ``zone`` and
  ``instance_id``, labels ``tpuctl-deployment`` and ``container``, and per entry ``timestamp`` (the engine's, with
  nanoseconds), ``severity`` and ``textPayload``; ``partialSuccess`` so one refused entry does not sink the rest.

Errors are classified ``CloudError``s: 400 ``INVALID`` (those entries will never be taken), 401/403 ``PERMISSION``
(grant ``roles/logging.logWriter`` to the VM's service account), 429 ``RATE_LIMIT``, everything else (5xx, the
network, the metadata server) ``TRANSIENT``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import requests
from google.auth import exceptions as auth_exceptions
from google.auth.compute_engine import Credentials as VmCredentials
from google.auth.compute_engine import _metadata
from google.auth.credentials import Credentials
from google.auth.transport.requests import AuthorizedSession, Request

from shared.domain.errors import CloudError, ErrorClass
from shared.logging import scrub_untrusted
from shared.ports import NodeLogLine

__all__ = ["DEFAULT_ENDPOINT", "LOG_ID", "CloudLoggingSink", "rfc3339_nanos"]

DEFAULT_ENDPOINT = "https://logging.googleapis.com"
LOG_ID = "tpuctl-vllm"


def rfc3339_nanos(time_ns: int) -> str:
    """``2026-12-03T19:32:07.123456789Z``: Cloud Logging keeps a timestamp's nanoseconds."""
    whole = datetime.fromtimestamp(time_ns // 1_000_000_000, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{whole}.{time_ns % 1_000_000_000:09d}Z"


class CloudLoggingSink:
    """Writes one container's lines of one deployment; the session and the VM's resource are made on first use."""

    def __init__(
        self,
        project: str,
        *,
        deployment_id: str,
        container: str,
        endpoint: str | None = None,
        credentials: Credentials | None = None,
        resource: Mapping[str, Any] | None = None,
        timeout_s: float = 15.0,
    ) -> None:
        self._url = (endpoint or DEFAULT_ENDPOINT).rstrip("/") + "/v2/entries:write"
        self._log_name = f"projects/{project}/logs/{LOG_ID}"
        self._labels = {"tpuctl-deployment": deployment_id, "container": container}
        self._credentials = credentials
        self._resource = dict(resource) if resource is not None else None
        self._timeout_s = timeout_s
        self._session: AuthorizedSession | None = None

    def write(self, lines: Sequence[NodeLogLine]) -> None:
        if not lines:
            return
        body: dict[str, Any] = {
            "logName": self._log_name,
            "resource": self._monitored_resource(),
            "labels": self._labels,
            "entries": [
                {"timestamp": rfc3339_nanos(line.time_ns), "severity": line.severity, "textPayload": line.text}
                for line in lines
            ],
            "partialSuccess": True,
        }
        try:
            response = self._authorized().post(self._url, json=body, timeout=self._timeout_s)
        except auth_exceptions.RefreshError as exc:
            raise CloudError(ErrorClass.PERMISSION, f"Cloud Logging: no token for the VM's identity: {exc}") from exc
        except (auth_exceptions.TransportError, requests.RequestException) as exc:
            raise CloudError(ErrorClass.TRANSIENT, f"Cloud Logging unreachable: {type(exc).__name__}") from exc
        if response.status_code >= 300:
            raise _classified(response)

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def _authorized(self) -> AuthorizedSession:
        if self._session is None:
            self._session = AuthorizedSession(self._credentials or VmCredentials())
        return self._session

    def _monitored_resource(self) -> dict[str, Any]:
        """``gce_instance`` of this VM, from its metadata server (once it answered)."""
        if self._resource is None:
            request = Request()
            try:
                zone = str(_metadata.get(request, "instance/zone")).rsplit("/", 1)[-1]
                labels = {
                    "project_id": str(_metadata.get_project_id(request)),
                    "zone": zone,
                    "instance_id": str(_metadata.get(request, "instance/id")),
                }
            except auth_exceptions.TransportError as exc:
                raise CloudError(ErrorClass.TRANSIENT, f"metadata server unreachable: {exc}") from exc
            self._resource = {"type": "gce_instance", "labels": labels}
        return self._resource


def _classified(response: requests.Response) -> CloudError:
    try:
        message = str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        message = response.reason or ""
    text = f"Cloud Logging entries:write: HTTP {response.status_code}: {scrub_untrusted(message, 300)[0]}"
    code = response.status_code
    if code == 400:
        return CloudError(ErrorClass.INVALID, text, code=code)
    if code in (401, 403):
        return CloudError(
            ErrorClass.PERMISSION, text + " (grant roles/logging.logWriter to the VM's account)", code=code
        )
    if code == 429:
        return CloudError(ErrorClass.RATE_LIMIT, text, code=code)
    return CloudError(ErrorClass.TRANSIENT, text, code=code)

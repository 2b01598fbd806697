"""``SubscriptionIam`` on Pub/Sub's REST IAM methods: a read-modify-write of one subscription's allow policy.

Why REST and a separate endpoint, not the ``SubscriberClient`` the bus uses: the Pub/Sub emulator implements no
IAM (``GetIamPolicy`` and ``SetIamPolicy`` answer UNIMPLEMENTED), and google-cloud-pubsub sends every call to
``PUBSUB_EMULATOR_HOST`` once that is set. Keeping the grant on its own endpoint (``TPUCTL_PUBSUB_IAM_ENDPOINT``,
``Settings.pubsub_iam_endpoint``; default Google's) lets the production-path twin put a stand-in there while the
subscriptions themselves live on the emulator. No code here asks where it runs.

The wire is Google's:

* ``GET  {endpoint}/v1/projects/P/subscriptions/S:getIamPolicy?options.requestedPolicyVersion=3``
* ``POST {endpoint}/v1/projects/P/subscriptions/S:setIamPolicy`` with ``{"policy": ...}``, the read policy's
  ``etag`` included, so a concurrent change answers 409 (ABORTED) and the grant reads and tries again.

Only an unconditional binding of the role counts as held; other bindings are kept as read. Credentials are
Application Default Credentials (the function's runtime account); with an explicit endpoint they are anonymous,
as with the other adapters that take an endpoint. Errors are classified ``CloudError``s: 404 ``NOT_FOUND``,
401/403 ``PERMISSION``, 400 and 501 ``INVALID``, 429 ``RATE_LIMIT``, 409 after the last attempt, 5xx and the
network ``TRANSIENT``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import requests
from google.auth import exceptions as auth_exceptions
from google.auth.credentials import AnonymousCredentials, Credentials
from google.auth.transport.requests import AuthorizedSession

from shared.adapters._pubsub_rules import check_resource_name
from shared.domain.errors import CloudError, ErrorClass
from shared.logging import scrub_untrusted

__all__ = ["DEFAULT_ENDPOINT", "PubSubSubscriptionIam"]

DEFAULT_ENDPOINT = "https://pubsub.googleapis.com"
_SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
_POLICY_VERSION = 3  # read conditional bindings as they are, so a write never drops one


class PubSubSubscriptionIam:
    """Grants on subscriptions of one project. The HTTP session is made on first use."""

    def __init__(
        self,
        project: str,
        *,
        endpoint: str | None = None,
        credentials: Credentials | None = None,
        timeout_s: float = 15.0,
        attempts: int = 3,
    ) -> None:
        if not project:
            raise ValueError("project: required (the GCP project id, e.g. my-project)")
        if attempts < 1:
            raise ValueError(f"attempts: {attempts!r} must be at least 1")
        self.project = project
        self.base_url = (endpoint or DEFAULT_ENDPOINT).rstrip("/")
        self._credentials = credentials if credentials is not None else (AnonymousCredentials() if endpoint else None)
        self._timeout_s = timeout_s
        self._attempts = attempts
        self._session: AuthorizedSession | None = None

    # --- SubscriptionIam -------------------------------------------------------------------------------------

    def grant(self, subscription: str, role: str, member: str) -> bool:
        """Add ``member`` to the unconditional binding of ``role``; False when it is already there."""
        url = f"{self.base_url}/v1/projects/{quote(self.project)}/subscriptions/"
        url += quote(check_resource_name("subscription", subscription))
        what = f"grant {role} on subscription {subscription!r}"
        for attempt in range(1, self._attempts + 1):
            policy = self._call(
                "GET", f"{url}:getIamPolicy", what, params={"options.requestedPolicyVersion": str(_POLICY_VERSION)}
            )
            updated = with_member(policy, role, member)
            if updated is None:
                return False
            try:
                self._call("POST", f"{url}:setIamPolicy", what, body={"policy": updated})
            except CloudError as exc:
                if exc.code == 409 and attempt < self._attempts:
                    continue  # the policy changed since we read it: read it again
                raise
            return True
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    # --- HTTP ------------------------------------------------------------------------------------------------

    def _authorized(self) -> AuthorizedSession:
        if self._session is None:
            credentials = self._credentials
            if credentials is None:
                import google.auth

                try:
                    credentials, _ = google.auth.default(scopes=_SCOPES)
                except auth_exceptions.DefaultCredentialsError as exc:
                    raise CloudError(ErrorClass.PERMISSION, f"Pub/Sub IAM: no credentials: {exc}") from exc
            self._session = AuthorizedSession(credentials)
        return self._session

    def _call(
        self, method: str, url: str, what: str, *, params: Mapping[str, str] | None = None, body: Any = None
    ) -> dict[str, Any]:
        try:
            response = self._authorized().request(method, url, params=params, json=body, timeout=self._timeout_s)
        except auth_exceptions.RefreshError as exc:
            raise CloudError(ErrorClass.PERMISSION, f"{what}: no token for the controller's identity: {exc}") from exc
        except (auth_exceptions.TransportError, requests.RequestException) as exc:
            raise CloudError(ErrorClass.TRANSIENT, f"{what}: Pub/Sub IAM unreachable: {type(exc).__name__}") from exc
        if response.status_code >= 300:
            raise _classified(response, what)
        try:
            answer = response.json()
        except ValueError as exc:
            raise CloudError(ErrorClass.TRANSIENT, f"{what}: the answer was not JSON") from exc
        if not isinstance(answer, dict):
            raise CloudError(ErrorClass.TRANSIENT, f"{what}: the answer was not a JSON object")
        return answer


def with_member(policy: Mapping[str, Any], role: str, member: str) -> dict[str, Any] | None:
    """``policy`` with ``member`` in the unconditional binding of ``role``; None when it is there already.

    Every other binding, the etag and the version are kept as read (version 1 when nothing conditional is left).
    """
    bindings = [dict(binding) for binding in policy.get("bindings", ()) if isinstance(binding, Mapping)]
    for binding in bindings:
        if binding.get("role") == role and not binding.get("condition"):
            members = list(binding.get("members", ()))
            if member in members:
                return None
            binding["members"] = [*members, member]
            break
    else:
        bindings.append({"role": role, "members": [member]})
    updated: dict[str, Any] = {key: value for key, value in policy.items() if key != "bindings"}
    updated["bindings"] = bindings
    conditional = any(binding.get("condition") for binding in bindings)
    updated["version"] = _POLICY_VERSION if conditional else max(1, int(policy.get("version", 1) or 1))
    return updated


def _classified(response: requests.Response, what: str) -> CloudError:
    try:
        message = str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        message = response.reason or ""
    code = response.status_code
    text = f"{what}: HTTP {code}: {scrub_untrusted(message, 300)[0]}"
    if code == 404:
        return CloudError(ErrorClass.NOT_FOUND, text, code=code)
    if code in (401, 403):
        return CloudError(
            ErrorClass.PERMISSION,
            text + " (the controller needs pubsub.subscriptions.getIamPolicy/setIamPolicy: tpuctlNodeChannels)",
            code=code,
        )
    if code in (400, 501):
        return CloudError(ErrorClass.INVALID, text, code=code)
    if code == 429:
        return CloudError(ErrorClass.RATE_LIMIT, text, code=code)
    return CloudError(ErrorClass.TRANSIENT, text, code=code)

"""``CloudStorageBundles``: the ``DebugBundles`` store on Google Cloud, Cloud Storage's JSON wire spoken directly.

Why this way: a bundle is one small object written once and read whole, and the node agent that writes it carries
google-auth and requests already; google-cloud-storage would add its own dependencies to the node-agent bundle for
two calls. So, as ``cloud_logging_sink`` does for Cloud Logging, this posts Google's JSON wire with google-auth's
``AuthorizedSession``:

* write: ``POST {endpoint}/upload/storage/v1/b/B/o?uploadType=media&name=N&ifGenerationMatch=0``; the precondition
  makes the write once-only on the server, so a bundle linked from a task never changes (412 ``ALREADY_EXISTS``);
* read: ``GET {endpoint}/storage/v1/b/B/o/{N quoted with safe=''}?alt=media``: the whole name is one path segment,
  so no ``/`` or ``..`` in it can reach another bucket or API; at most ``MAX_BUNDLE_BYTES`` are taken, since the
  VM's identity may write the bucket by other means too;
* identity: the credentials given (a VM's ``compute_engine.Credentials``); with an endpoint override and none
  given, anonymous ones (a local stand-in, as ``cloud_logging`` does); else Application Default Credentials with
  the ``devstorage.read_write`` scope.

Errors are classified ``CloudError``s naming the bucket, the object and the fix: 401/403 ``PERMISSION`` (grant
``roles/storage.objectCreator`` to the writer, ``roles/storage.objectViewer`` to the reader), 404 ``NOT_FOUND``,
412 ``ALREADY_EXISTS``, 429 ``RATE_LIMIT``, 408, 5xx and the network ``TRANSIENT``, other 4xx and a bundle over
``MAX_BUNDLE_BYTES`` ``INVALID`` (the size before any call).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import google.auth
import requests
from google.auth import exceptions as auth_exceptions
from google.auth.credentials import AnonymousCredentials, Credentials
from google.auth.transport import DEFAULT_REFRESH_STATUS_CODES
from google.auth.transport.requests import AuthorizedSession

from shared.domain.debug_bundle import MAX_BUNDLE_BYTES
from shared.domain.errors import CloudError, ErrorClass
from shared.logging import scrub_untrusted

__all__ = ["DEFAULT_ENDPOINT", "SCOPE", "CloudStorageBundles", "storage_error"]

DEFAULT_ENDPOINT = "https://storage.googleapis.com"
SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
_WRITER_FIX = "grant roles/storage.objectCreator on the bucket to the VM's service account"
_READER_FIX = "grant roles/storage.objectViewer on the bucket to the reader's identity"


class CloudStorageBundles:
    """Debug bundles as objects of one bucket; the session is made on first use.

    ``session``: used as it is for every call (it carries its own auth), so ``credentials`` must then be None.
    """

    def __init__(
        self,
        bucket: str,
        *,
        endpoint: str | None = None,
        credentials: Credentials | None = None,
        session: requests.Session | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        if session is not None and credentials is not None:
            raise ValueError("give credentials or a session, not both: the session is used as it is")
        self._bucket = bucket
        self._endpoint = (endpoint or DEFAULT_ENDPOINT).rstrip("/")
        self._anonymous = endpoint is not None and credentials is None
        self._credentials = credentials
        self._session = session
        self._owns_session = session is None
        self._timeout_s = timeout_s

    def put(self, name: str, data: bytes) -> str:
        _check_name(self.location(name), name)
        if len(data) > MAX_BUNDLE_BYTES:
            raise CloudError(
                ErrorClass.INVALID,
                f"debug bundle {self.location(name)} is {len(data)} bytes, over {MAX_BUNDLE_BYTES}: not stored "
                "(keep fewer log lines or stacks)",
            )
        url = f"{self._endpoint}/upload/storage/v1/b/{quote(self._bucket, safe='')}/o"
        params = {"uploadType": "media", "name": name, "ifGenerationMatch": "0"}
        headers = {"Content-Type": "application/json"}
        with self._call("POST", url, name, params=params, data=data, headers=headers) as response:
            if response.status_code >= 300:
                raise self._classified(response, "upload", name, _WRITER_FIX)
        return self.location(name)

    def get(self, name: str) -> bytes:
        _check_name(self.location(name), name)
        url = f"{self._endpoint}/storage/v1/b/{quote(self._bucket, safe='')}/o/{quote(name, safe='')}"
        with self._call("GET", url, name, params={"alt": "media"}, stream=True) as response:
            if response.status_code >= 300:
                raise self._classified(response, "download", name, _READER_FIX)
            return self._bounded(response, name)

    def location(self, name: str) -> str:
        return f"gs://{self._bucket}/{name}"

    def close(self) -> None:
        if self._session is not None and self._owns_session:
            self._session.close()
            self._session = None

    def _call(self, method: str, url: str, name: str, **kwargs: Any) -> requests.Response:
        """One request; identity and network failures classified (the answer's status is the caller's)."""
        verb = "upload" if method == "POST" else "download"
        where = self.location(name)
        try:
            return self._authorized().request(method, url, timeout=self._timeout_s, **kwargs)
        except auth_exceptions.DefaultCredentialsError as exc:
            raise CloudError(
                ErrorClass.PERMISSION,
                f"Cloud Storage {verb} of {where}: no Application Default Credentials "
                "(run with a service account, or `gcloud auth application-default login`)",
            ) from exc
        except auth_exceptions.RefreshError as exc:
            raise CloudError(ErrorClass.PERMISSION, f"Cloud Storage {verb} of {where}: no token: {exc}") from exc
        except (auth_exceptions.TransportError, requests.RequestException) as exc:
            raise CloudError(
                ErrorClass.TRANSIENT, f"Cloud Storage {verb} of {where}: unreachable: {type(exc).__name__}"
            ) from exc

    def _authorized(self) -> requests.Session:
        if self._session is None:
            identity = self._identity()
            # anonymous credentials cannot refresh: a 401 is then the answer to classify, not a refresh to try
            retry = () if isinstance(identity, AnonymousCredentials) else DEFAULT_REFRESH_STATUS_CODES
            self._session = AuthorizedSession(identity, refresh_status_codes=retry)
        return self._session

    def _identity(self) -> Credentials:
        if self._credentials is not None:
            return self._credentials
        if self._anonymous:
            return AnonymousCredentials()
        credentials, _ = google.auth.default(scopes=[SCOPE])
        return credentials

    def _bounded(self, response: requests.Response, name: str) -> bytes:
        """The body, refused past ``MAX_BUNDLE_BYTES`` without reading the rest."""
        data = bytearray()
        try:
            for chunk in response.iter_content(chunk_size=64 * 1024):
                data += chunk
                if len(data) > MAX_BUNDLE_BYTES:
                    raise CloudError(
                        ErrorClass.INVALID,
                        f"debug bundle {self.location(name)} is over {MAX_BUNDLE_BYTES} bytes: not read "
                        "(it was not written by a bundle store; delete it)",
                    )
        except requests.RequestException as exc:
            raise CloudError(
                ErrorClass.TRANSIENT, f"Cloud Storage download of {self.location(name)}: cut short: {exc}"
            ) from exc
        return bytes(data)

    def _classified(self, response: requests.Response, verb: str, name: str, fix: str) -> CloudError:
        return storage_error(
            response,
            f"{verb} of {self.location(name)}",
            fix=fix,
            missing=f"no such bundle, or no bucket {self._bucket}",
            conflict="already exists: a bundle is written once; use a new id",
        )


def storage_error(
    response: requests.Response, what: str, *, fix: str, missing: str, conflict: str | None = None
) -> CloudError:
    """Cloud Storage's answer to ``what`` ("upload of gs://b/o") as one classified error: ``fix`` follows a refused
    identity, ``missing`` a 404, ``conflict`` (when given) a failed precondition; rate limits and server errors
    are transient, the rest will not pass as it is."""
    code = response.status_code
    text = f"Cloud Storage {what}: HTTP {code}: {_error_message(response)}"
    if code in (401, 403):
        return CloudError(ErrorClass.PERMISSION, f"{text} ({fix})", code=code)
    if code == 404:
        return CloudError(ErrorClass.NOT_FOUND, f"{text} ({missing})", code=code)
    if code == 412 and conflict is not None:
        return CloudError(ErrorClass.ALREADY_EXISTS, f"{text} ({conflict})", code=code)
    if code == 429:
        return CloudError(ErrorClass.RATE_LIMIT, f"{text} (slow down and retry)", code=code)
    if code == 408 or code >= 500 or code < 400:
        return CloudError(ErrorClass.TRANSIENT, f"{text} (retry later)", code=code)
    return CloudError(ErrorClass.INVALID, f"{text} (the request will not pass as it is)", code=code)


def _check_name(where: str, name: str) -> None:
    """Cloud Storage's own naming rules, before any call: never ``.``/``..``, no line breaks, 1-1024 bytes."""
    if name in ("", ".", "..") or len(name.encode()) > 1024 or any(c in name for c in "\r\n"):
        raise CloudError(ErrorClass.INVALID, f"{where}: not a Cloud Storage object name (use bundle_object_name)")


def _error_message(response: requests.Response) -> str:
    """Cloud Storage's error message in a JSON answer (else the reason), scrubbed and bounded: it is untrusted."""
    try:
        message = str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        message = response.reason or ""
    return scrub_untrusted(message, 300)[0]

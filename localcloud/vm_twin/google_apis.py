"""Secret Manager and Cloud Storage as a TPU VM reaches them: the VM twin's stand-ins, on one loopback port.

Why: the startup script reads the vLLM API key and the Hugging Face token from Secret Manager and fetches the
node-agent bundle from Cloud Storage, each with an access token from the VM's metadata server. The VM twin runs
that script unchanged, pointed here by the standard endpoint variables (``CLOUDSDK_API_ENDPOINT_OVERRIDES_*``).
Only the calls a VM makes are served, on Google's REST wire:

* ``GET /v1/projects/P/secrets/S/versions/V:access`` (V a number or ``latest``): ``{"name", "payload": {"data"}}``
  with base64 data; 404 ``NOT_FOUND`` "Secret [...] not found or has no versions." as Google words it;
* ``GET /storage/v1/b/B`` (bucket metadata, with the ``location`` upper-case and ``locationType`` ``region`` or
  ``multi-region``, as the weights cache checks that its bucket is in the VM's region);
* ``GET /storage/v1/b/B/o/O[?generation=G]`` (object metadata: ``{"kind": "storage#object", "id", "bucket",
  "name", "size", "generation", "metageneration", "md5Hash"}``, sizes and generations as strings) and, with
  ``alt=media``, the bytes, also at ``GET /download/storage/v1/b/B/o/O?alt=media``: the reply carries
  ``x-goog-generation``; ``generation=G`` other than the current one is 404; a ``Range: bytes=A-B`` (or ``A-``,
  or ``-N``) header gets 206 with ``Content-Range: bytes A-B/TOTAL`` and just those bytes, 416 when it starts past
  the end;
* ``GET /storage/v1/b/B/o?prefix=P[&pageToken=T]``: ``{"kind": "storage#objects", "items": [...],
  "nextPageToken"}`` by name, 1,000 a page (the gateway sums a model's cached bytes for the plan);
* ``POST /upload/storage/v1/b/B/o?uploadType=media&name=N[&ifGenerationMatch=G]`` (the node agent stores a debug
  bundle; the weights cache fills its bucket; a prewarm builder fills the compile cache): the object's metadata as
  above; with ``ifGenerationMatch=0`` only a new object is made and with ``ifGenerationMatch=G`` only generation G
  is replaced, else 412 ``conditionNotMet`` as Google words it (checked and written atomically, so of two racing
  writers one wins); 403 ``forbidden`` for a name under a prefix the caller may not write (below); 404
  for a bucket that was never made; 413 for a body over :data:`MAX_UPLOAD_BYTES`; 400 for a name a file path
  cannot hold faithfully (``.`` or ``..`` or empty segments, line breaks), since objects are files here;
* ``POST ...?uploadType=resumable&name=N[&ifGenerationMatch=G]`` with ``X-Upload-Content-Length``: a session,
  its URI in ``Location`` (``...&upload_id=ID``); then ``PUT`` that URI with ``Content-Range: bytes A-B/TOTAL``
  chunks (each but the last a multiple of 256 KiB, at most :data:`MAX_CHUNK_BYTES`) answered 308 with
  ``Range: bytes=0-N`` (what is committed: a chunk that starts past it is not taken, one that overlaps it adds
  only its new bytes) until the last byte, which stores the object as a media upload does (the precondition
  checked then, 412 if it no longer holds); ``bytes */TOTAL`` asks where the session stands; an unknown session
  is 404. The object exists only once whole;
* Cloud Logging's ``POST /v2/entries:write`` (the node agent ships vLLM's lines) and ``POST /v2/entries:list``
  (``tpu_observe(show='logs')`` reads them), served by
  :class:`~localcloud.vm_twin.logging_api.CloudLoggingStandIn`: writes need a VM's token like every call here; a
  list is served to any caller, token or not (the gateway reads with the user's credentials on Google Cloud,
  anonymously here).

Every call needs ``Authorization: Bearer`` with a token a VM's metadata server issued (401 ``UNAUTHENTICATED``
otherwise), so a script that skipped the metadata server would fail here as it would on Google Cloud. Writes are
also held to Terraform's IAM conditions on object names (``prefix_writers``: an object-name prefix -> the service
accounts that may write under it; a prefix not named is open to every VM): by default nobody with a VM token may
write under ``compile/`` (shared/domain/compile_cache.py: only the prewarm builder's account may, and the local cloud
names it), while reads stay open. A media upload, a resumable session's start and its final ``PUT`` (as the token
of that ``PUT`` says, else as the session's opener) by any other account are refused with 403 ``forbidden`` in
Google's words ("<email> does not have storage.objects.create access to the Google Cloud Storage object. ..."), and
nothing is written.

Secrets come from the installation's secret store (the same one the controller uses); objects from
``buckets/<B>/<O>`` files. An object's generation is its file's modification time in microseconds (every write sets
it, strictly above the one it replaces), so the VM's and the controller's instances, which serve the same files,
agree on it; a bucket's location lives beside it in ``.<B>.location``, a name no bucket can have.

The controller's side (functions and gateway in the production-path twin) gets its own instance with
``require_token=False``, as it reaches the emulators: there the REST client is anonymous (no identity, so no
prefix rule applies), and it may also create a secret (``POST /v1/projects/P/secrets?secretId=S``) and add a
version (``POST .../secrets/S:addVersion``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import secrets
import stat
import tempfile
import threading
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from localcloud.vm_twin.logging_api import CloudLoggingStandIn
from localcloud.vm_twin.loopback_http import LoopbackStandIn, StandInServer
from localcloud.vm_twin.metadata_server import TokenIssuer
from shared.domain.compile_cache import COMPILE_PREFIX
from shared.ports import SecretStore

__all__ = ["DEFAULT_PREFIX_WRITERS", "MAX_CHUNK_BYTES", "MAX_UPLOAD_BYTES", "GoogleApis"]

MAX_UPLOAD_BYTES = 8 * 1024 * 1024
MAX_CHUNK_BYTES = 64 * 1024 * 1024  # one PUT of a resumable session
_CHUNK_QUANTUM = 256 * 1024
_CONTENT_RANGE = re.compile(r"^bytes (?:(\d+)-(\d+)|\*)/(\d+)$")
_UPLOAD_ID = re.compile(r"^[0-9a-f]{32}$")
"""The largest upload body taken (debug bundles are bounded at 4 MiB by every store; this bounds the stand-in)."""

_SECRET = re.compile(r"^/v1/projects/([^/]+)/secrets/([^/]+)/versions/([^/:]+):access$")
_SECRETS = re.compile(r"^/v1/projects/([^/]+)/secrets$")
_ADD_VERSION = re.compile(r"^/v1/projects/([^/]+)/secrets/([^/:]+):addVersion$")
_BUCKET_NAME = r"([a-z0-9][-a-z0-9_.]{2,222})"  # a bucket name, never '..'
_BUCKET = re.compile(rf"^/storage/v1/b/{_BUCKET_NAME}$")
_OBJECT = re.compile(rf"^/(?:download/)?storage/v1/b/{_BUCKET_NAME}/o/(.+)$")
_OBJECTS = re.compile(rf"^/storage/v1/b/{_BUCKET_NAME}/o$")
_LIST_PAGE = 1000  # Google's default and largest page of an object listing
_UPLOAD = re.compile(rf"^/upload/storage/v1/b/{_BUCKET_NAME}/o$")
_PRECONDITION = "At least one of the pre-conditions you specified did not hold."
_CREATE_DENIED = (
    "{account} does not have storage.objects.create access to the Google Cloud Storage object. "
    "Permission 'storage.objects.create' denied on resource (or it may not exist)."
)
DEFAULT_PREFIX_WRITERS: Mapping[str, frozenset[str]] = MappingProxyType({COMPILE_PREFIX: frozenset()})
"""Object-name prefix -> the service accounts whose VM tokens may write under it: compile/ is nobody's until the
builder's account is named (Terraform grants objectUser on compile/ to ``tpuctl-tpu-builder`` alone)."""
_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND"}
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
_OBJECT_WRITES = threading.Lock()
"""Held while an object's generation is checked and its file replaced: one for every instance in the process, as
the VM's and the controller's instances write the same files."""


@dataclass(frozen=True)
class Media:
    """Object bytes with the status and headers their read earned (206 and ``Content-Range`` for a range)."""

    data: bytes
    headers: dict[str, str] = field(default_factory=dict)
    status: int = 200


Body = dict[str, Any] | bytes | Media


class GoogleApis(LoopbackStandIn):
    """Secret Manager ``:access`` and Cloud Storage reads for the VMs of one project."""

    def __init__(
        self,
        project: str,
        secrets: SecretStore,
        buckets_dir: Path,
        tokens: TokenIssuer,
        *,
        require_token: bool = True,
        prefix_writers: Mapping[str, Collection[str]] = DEFAULT_PREFIX_WRITERS,
        host: str = "127.0.0.1",
    ) -> None:
        self.project = project
        self.require_token = require_token
        self.prefix_writers = {prefix: frozenset(accounts) for prefix, accounts in prefix_writers.items()}
        self.secrets = secrets
        self.buckets_dir = buckets_dir
        self.tokens = tokens
        self.logging = CloudLoggingStandIn(project, tokens)
        self.calls: list[tuple[str, str]] = []  # (method, path) of every call, for tests that prove a route ran
        self._lock = threading.Lock()
        self._server = StandInServer(_Handler, self, name="google-apis", host=host)

    def endpoint_env(self) -> dict[str, str]:
        """The variables that point a VM's script and gcloud here (gcloud's names; values end with '/')."""
        return {
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER": f"{self.base_url}/",
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE": f"{self.base_url}/storage/v1/",
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_LOGGING": f"{self.base_url}/",
            "TPUCTL_LOGGING_ENDPOINT": self.base_url,  # the node agent's log sink (Settings.logging_endpoint)
            "TPUCTL_STORAGE_ENDPOINT": self.base_url,  # where the node agent keeps debug bundles
        }

    def create_bucket(self, bucket: str, location: str = "US") -> None:
        """Make an empty bucket in ``location`` (what ``terraform apply`` creates)."""
        (self.buckets_dir / bucket).mkdir(parents=True, exist_ok=True)
        self._location_path(bucket).write_text(location.upper(), encoding="utf-8")

    def put_object(self, bucket: str, name: str, data: bytes) -> str:
        """Store an object (what ``terraform apply`` uploads) as a new generation; returns its ``gs://`` URI."""
        path = self._object_path(bucket, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        with _OBJECT_WRITES:
            _write_generation(path, data, _next_generation(path))
        return f"gs://{bucket}/{name}"

    def object_generation(self, bucket: str, name: str) -> int | None:
        """The object's current generation, or None when there is no such object (for tests)."""
        return _generation(self._object_path(bucket, name))

    # ------------------------------------------------------------------ routes

    def answer(
        self, path: str, query: str, authorization: str | None, range_header: str | None = None
    ) -> tuple[int, Body]:
        """``GET``: a secret, a bucket, an object's metadata or its bytes (``range_header``: the request's Range)."""
        with self._lock:
            self.calls.append(("GET", path))
        if self.require_token and self.tokens.identity(authorization) is None:
            return _error(401, "Request had invalid authentication credentials.")
        if match := _SECRET.match(path):
            return self._access(*match.groups())
        if match := _BUCKET.match(path):
            return self._bucket(match.group(1))
        if match := _OBJECTS.match(path):
            params = parse_qs(query)
            return self._list(match.group(1), params.get("prefix", [""])[0], params.get("pageToken", [""])[0])
        if match := _OBJECT.match(path):
            params = parse_qs(query)
            generation = params.get("generation", [""])[0]
            media = params.get("alt", [""])[0] == "media"
            return self._object(
                match.group(1), unquote(match.group(2)), generation, (range_header or "") if media else None
            )
        return _error(404, f"no such API here: {path}")

    def write(self, path: str, query: str, body: dict[str, Any]) -> tuple[int, dict[str, Any] | bytes]:
        """``POST``: create a secret or add a version (the controller's side only)."""
        with self._lock:
            self.calls.append(("POST", path))
        if self.require_token:
            return _error(403, "Permission 'secretmanager.versions.add' denied: a VM may only read its secrets")
        if match := _SECRETS.match(path):
            name = parse_qs(query).get("secretId", [""])[0]
            return 200, {"name": f"projects/{match.group(1)}/secrets/{name}", "replication": {"automatic": {}}}
        if match := _ADD_VERSION.match(path):
            project, secret = match.groups()
            data = base64.b64decode(str((body.get("payload") or {}).get("data") or ""))
            version = self.secrets.put(secret, data.decode("utf-8")).rsplit("/", 1)[-1]
            return 200, {"name": f"projects/{project}/secrets/{secret}/versions/{version}", "state": "ENABLED"}
        return _error(404, f"no such API here: POST {path}")

    def upload(
        self, path: str, query: str, authorization: str | None, data: bytes, length: int, total: str | None = None
    ) -> tuple[int, Body]:
        """``POST /upload/storage/v1/b/B/o?uploadType=media``: store one object (``length``: the declared size);
        ``uploadType=resumable``: open a session for ``total`` bytes (``X-Upload-Content-Length``)."""
        with self._lock:
            self.calls.append(("POST", path))
        identity = self.tokens.identity(authorization)
        if self.require_token and identity is None:
            return _error(401, "Request had invalid authentication credentials.")
        match = _UPLOAD.match(path)
        if match is None:
            return _error(404, f"no such API here: POST {path}")
        params = parse_qs(query)
        bucket, name = match.group(1), params.get("name", [""])[0]
        account = identity.service_account if identity else None
        if refused := self._write_refusal(account, name):
            return refused
        kind = params.get("uploadType", [""])[0]
        if kind not in ("media", "resumable"):
            return _storage_error(400, "invalid", "The stand-in takes uploadType=media or resumable.")
        if length > MAX_UPLOAD_BYTES:
            return _storage_error(413, "uploadTooLarge", f"Upload of {length} bytes is over {MAX_UPLOAD_BYTES}.")
        if problem := _unstorable(name):
            return _storage_error(400, "invalid", f"The object name {name!r} {problem}.")
        if not (self.buckets_dir / bucket).is_dir():
            return _storage_error(404, "notFound", "The specified bucket does not exist.")
        precondition = params.get("ifGenerationMatch", [""])[0]
        if precondition and not precondition.isdigit():
            return _storage_error(400, "invalid", f"Invalid argument ifGenerationMatch={precondition!r}.")
        if kind == "resumable":
            return self._open_session(bucket, name, int(precondition) if precondition else None, total, account)
        return self._store(bucket, name, data, int(precondition) if precondition else None)

    def _write_refusal(self, account: str | None, name: str) -> tuple[int, Body] | None:
        """403 when ``name`` is under a prefix of ``prefix_writers`` that ``account`` may not write (a VM's call);
        None when the write may go on. The controller's anonymous instance (``require_token=False``) is not held."""
        if not self.require_token:
            return None
        for prefix, writers in self.prefix_writers.items():
            if name.startswith(prefix) and account not in writers:
                return _storage_error(403, "forbidden", _CREATE_DENIED.format(account=account))
        return None

    def _open_session(
        self, bucket: str, name: str, precondition: int | None, total: str | None, account: str | None
    ) -> tuple[int, Body]:
        """A resumable session: its state in two files beside the bucket's objects (hidden from listings)."""
        if total is None or not total.isdigit():
            return _storage_error(400, "invalid", "A resumable upload needs X-Upload-Content-Length.")
        current = _generation(self._object_path(bucket, name))
        if precondition is not None and precondition != (current or 0):
            return _storage_error(412, "conditionNotMet", _PRECONDITION, location="If-Match")
        upload_id = secrets.token_hex(16)
        meta = {"bucket": bucket, "name": name, "precondition": precondition, "total": int(total), "account": account}
        self._session_path(bucket, upload_id, ".json").write_text(json.dumps(meta), encoding="utf-8")
        self._session_path(bucket, upload_id).write_bytes(b"")
        location = f"{self.base_url}/upload/storage/v1/b/{bucket}/o?uploadType=resumable&upload_id={upload_id}"
        return 200, Media(b"", {"Location": location})

    def resume(
        self, path: str, query: str, content_range: str, data: bytes, authorization: str | None = None
    ) -> tuple[int, Body]:
        """``PUT`` a session's URI: take a chunk (or answer where it stands) and store the object at the end, if the
        ``PUT``'s token (else the session's opener) may write that name."""
        with self._lock:
            self.calls.append(("PUT", path))
        match, upload_id = _UPLOAD.match(path), parse_qs(query).get("upload_id", [""])[0]
        if match is None or not _UPLOAD_ID.match(upload_id):
            return _storage_error(404, "notFound", "No such upload session.")
        meta_path, data_path = (
            self._session_path(match.group(1), upload_id, ".json"),
            self._session_path(match.group(1), upload_id),
        )
        if not meta_path.is_file():
            return _storage_error(404, "notFound", "No such upload session.")
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        ranged, total = _CONTENT_RANGE.match(content_range), int(meta["total"])
        if ranged is None or int(ranged.group(3)) != total:
            return _storage_error(
                400, "invalid", f"Content-Range {content_range!r} does not fit a {total}-byte upload."
            )
        with self._lock:
            committed = data_path.stat().st_size
            if ranged.group(1) is not None:
                first, last = int(ranged.group(1)), int(ranged.group(2))
                if last - first + 1 != len(data) or last >= total:
                    return _storage_error(400, "invalid", f"Content-Range {content_range!r} is not the body's.")
                if last < total - 1 and len(data) % _CHUNK_QUANTUM:
                    return _storage_error(400, "invalid", "A chunk other than the last must be a multiple of 256 KiB.")
                if first <= committed < last + 1:  # what overlaps the committed bytes is dropped
                    with data_path.open("ab") as file:
                        file.write(data[committed - first :])
                    committed = last + 1
        if committed < total:
            return 308, Media(b"", {"Range": f"bytes=0-{committed - 1}"} if committed else {}, 308)
        identity = self.tokens.identity(authorization)
        refused = self._write_refusal(identity.service_account if identity else meta.get("account"), meta["name"])
        answer = refused or self._store(meta["bucket"], meta["name"], data_path.read_bytes(), meta["precondition"])
        meta_path.unlink(missing_ok=True)
        data_path.unlink(missing_ok=True)
        return answer

    def _session_path(self, bucket: str, upload_id: str, suffix: str = "") -> Path:
        return self.buckets_dir / bucket / f".upload-session-{upload_id}{suffix}"

    def _store(self, bucket: str, name: str, data: bytes, precondition: int | None) -> tuple[int, Body]:
        """Write a new generation unless ``precondition`` (0: no object yet; G: generation G now) fails: 412."""
        path = self._object_path(bucket, name)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            return _storage_error(400, "invalid", f"The stand-in holds {bucket}/{name} and a prefix as files.")
        if path.is_dir():
            return _storage_error(400, "invalid", f"The stand-in holds {bucket}/{name} as a prefix already.")
        with _OBJECT_WRITES:
            current = _generation(path)
            if precondition is not None and precondition != (current or 0):
                return _storage_error(412, "conditionNotMet", _PRECONDITION, location="If-Match")
            generation = _next_generation(path)
            written = _write_generation(path, data, generation, create_only=precondition == 0)
        if not written:  # another process made it between the check and the link
            return _storage_error(412, "conditionNotMet", _PRECONDITION, location="If-Match")
        return 200, _metadata(bucket, name, generation, data)

    def _bucket(self, bucket: str) -> tuple[int, Body]:
        if not (self.buckets_dir / bucket).is_dir():
            return _error(404, "The specified bucket does not exist.")
        marker = self._location_path(bucket)
        location = marker.read_text(encoding="utf-8").strip() if marker.is_file() else "US"
        kind = "region" if "-" in location else "multi-region"
        return 200, {"kind": "storage#bucket", "name": bucket, "id": bucket, "location": location, "locationType": kind}

    def _access(self, project: str, secret: str, version: str) -> tuple[int, dict[str, Any] | bytes]:
        if project != self.project:
            return _error(403, f"Permission 'secretmanager.versions.access' denied for resource '{path_of(project)}'")
        value = self.secrets.get(secret)
        if value is None or version not in ("latest", "1"):
            return _error(404, f"Secret [projects/{project}/secrets/{secret}] not found or has no versions.")
        data = base64.b64encode(value.encode()).decode()
        return 200, {"name": f"projects/{project}/secrets/{secret}/versions/1", "payload": {"data": data}}

    def _object(self, bucket: str, name: str, generation: str, range_header: str | None) -> tuple[int, Body]:
        """Metadata, or the bytes when ``range_header`` is given ("" for a media read with no Range header)."""
        path = self._object_path(bucket, name)
        current, data = _read_generation(path)  # metadata reads the bytes too, for md5Hash
        if current is None or (generation and generation != str(current)):
            suffix = f"#{generation}" if generation else ""
            return _error(404, f"No such object: {bucket}/{name}{suffix}")
        if range_header is None:
            return 200, _metadata(bucket, name, current, data)
        return 200, _ranged(data, range_header, {"x-goog-generation": str(current)})

    def _list(self, bucket: str, prefix: str, after: str) -> tuple[int, Body]:
        """Objects whose names start with ``prefix``, by name, a page at a time (the token: the last name sent)."""
        root = self.buckets_dir / bucket
        if not root.is_dir():
            return _storage_error(404, "notFound", "The specified bucket does not exist.")
        names = sorted(
            name
            for path in root.rglob("*")
            if path.is_file()
            and not path.name.startswith(".upload-")
            and (name := path.relative_to(root).as_posix()).startswith(prefix)
            and name > after
        )
        page = names[:_LIST_PAGE]
        items = [
            {"kind": "storage#object", "bucket": bucket, "name": name, "size": str((root / name).stat().st_size)}
            for name in page
        ]
        body: dict[str, Any] = {"kind": "storage#objects", **({"items": items} if items else {})}
        if len(names) > _LIST_PAGE:
            body["nextPageToken"] = page[-1]
        return 200, body

    def _location_path(self, bucket: str) -> Path:
        return self.buckets_dir / f".{bucket}.location"

    def _object_path(self, bucket: str, name: str) -> Path:
        root = (self.buckets_dir / bucket).resolve()
        path = (root / name).resolve()
        if root not in path.parents:
            raise ValueError(f"object name {name!r} leaves its bucket")
        return path


def path_of(project: str) -> str:
    return f"projects/{project}"


def _error(code: int, message: str) -> tuple[int, dict[str, Any]]:
    return code, {"error": {"code": code, "message": message, "status": _STATUS.get(code, "UNKNOWN")}}


def _storage_error(code: int, reason: str, message: str, *, location: str = "") -> tuple[int, dict[str, Any]]:
    """Cloud Storage's JSON error: ``{"error": {"code", "message", "errors": [{"reason", ...}]}}``."""
    detail = {"message": message, "domain": "global", "reason": reason}
    if location:
        detail |= {"locationType": "header", "location": location}
    return code, {"error": {"code": code, "message": message, "errors": [detail]}}


def _metadata(bucket: str, name: str, generation: int, data: bytes) -> dict[str, Any]:
    """An object's resource as Google's JSON API writes it (numbers as strings)."""
    return {
        "kind": "storage#object",
        "id": f"{bucket}/{name}/{generation}",
        "bucket": bucket,
        "name": name,
        "size": str(len(data)),
        "generation": str(generation),
        "metageneration": "1",
        "md5Hash": base64.b64encode(hashlib.md5(data).digest()).decode(),  # noqa: S324 - Google's checksum
    }


def _generation(path: Path) -> int | None:
    """An object's generation: its file's modification time in microseconds (None: no object)."""
    try:
        status = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return status.st_mtime_ns // 1000 if stat.S_ISREG(status.st_mode) else None


def _read_generation(path: Path) -> tuple[int | None, bytes]:
    """An object's generation and bytes from one open file, so a replace in between cannot mix two generations."""
    try:
        with path.open("rb") as file:
            status = os.fstat(file.fileno())
            return status.st_mtime_ns // 1000, file.read()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None, b""


def _next_generation(path: Path) -> int:
    """Now in microseconds, yet always above the generation it replaces (call holding ``_OBJECT_WRITES``)."""
    return max(time.time_ns() // 1000, (_generation(path) or 0) + 1)


def _write_generation(path: Path, data: bytes, generation: int, *, create_only: bool = False) -> bool:
    """Put ``data`` at ``path`` stamped with ``generation`` in one step; False when ``create_only`` met a file."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".upload-")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
        os.utime(temporary, ns=(generation * 1000, generation * 1000))
        if not create_only:
            os.replace(temporary, path)
            return True
        try:
            os.link(temporary, path)  # atomic create-if-absent, even against another process
        except FileExistsError:
            return False
        return True
    finally:
        Path(temporary).unlink(missing_ok=True)


def _ranged(data: bytes, range_header: str, headers: dict[str, str]) -> Media:
    """The bytes a ``Range: bytes=A-B`` asks for (206), all of them (200) when there is no range or it is malformed,
    or 416 when it starts past the end, as RFC 9110 and Cloud Storage answer."""
    match = _RANGE.match(range_header.strip())
    total = len(data)
    if match is None or match.groups() == ("", ""):
        return Media(data, headers)
    first, last = match.groups()
    if first:
        start, end = int(first), min(int(last), total - 1) if last else total - 1
        if last and int(last) < start:
            return Media(data, headers)  # not a valid range: ignored
    else:
        start, end = max(total - int(last), 0), total - 1
        if int(last) == 0:
            start = total  # a zero-length suffix cannot be satisfied
    if start >= total:
        return Media(b"", {**headers, "Content-Range": f"bytes */{total}"}, 416)
    return Media(data[start : end + 1], {**headers, "Content-Range": f"bytes {start}-{end}/{total}"}, 206)


def _unstorable(name: str) -> str:
    """Why an object name cannot be a file under its bucket here ("" when it can)."""
    if not name or len(name.encode()) > 1024:
        return "is empty or longer than 1024 bytes"
    if any(c in name for c in "\r\n\x00"):
        return "holds a line break or NUL"
    if any(part in ("", ".", "..") for part in name.split("/")):
        return "has an empty, '.' or '..' segment, which the stand-in's files cannot hold"
    return ""


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        apis: GoogleApis = self.server.stand_in  # type: ignore[attr-defined]
        try:
            status, body = apis.answer(
                url.path, url.query, self.headers.get("Authorization"), self.headers.get("Range")
            )
        except ValueError as exc:
            status, body = _error(400, str(exc))
        self._reply(status, body)

    def do_POST(self) -> None:
        url = urlsplit(self.path)
        apis: GoogleApis = self.server.stand_in  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        if url.path.startswith("/upload/"):
            data = self.rfile.read(length) if 0 < length <= MAX_UPLOAD_BYTES else self._drain(length)
            try:
                status, answer = apis.upload(
                    url.path,
                    url.query,
                    self.headers.get("Authorization"),
                    data,
                    length,
                    self.headers.get("X-Upload-Content-Length"),
                )
            except ValueError as exc:
                status, answer = _error(400, str(exc))
            self._reply(status, answer)
            return
        if url.path.startswith("/v2/entries:"):
            with apis._lock:
                apis.calls.append(("POST", url.path))
            raw = self.rfile.read(length) if length else b""
            self._reply(*apis.logging.answer(url.path, raw, self.headers.get("Authorization")))
            return
        try:
            body = json.loads(self.rfile.read(length) or b"{}") if length else {}
            status, answer = apis.write(url.path, url.query, body)
        except (ValueError, UnicodeDecodeError) as exc:
            status, answer = _error(400, str(exc))
        self._reply(status, answer)

    def do_PUT(self) -> None:
        url = urlsplit(self.path)
        apis: GoogleApis = self.server.stand_in  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_CHUNK_BYTES:
            self._drain(length)
            self._reply(*_storage_error(413, "uploadTooLarge", f"A chunk of {length} bytes is over {MAX_CHUNK_BYTES}."))
            return
        data = self.rfile.read(length) if length else b""
        try:
            status, answer = apis.resume(
                url.path, url.query, self.headers.get("Content-Range") or "", data, self.headers.get("Authorization")
            )
        except ValueError as exc:
            status, answer = _error(400, str(exc))
        self._reply(status, answer)

    def _drain(self, length: int) -> bytes:
        """Read and drop a body too large to take, so the client reads the refusal instead of a reset."""
        while length > 0:
            chunk = self.rfile.read(min(length, 1 << 20))
            if not chunk:
                break
            length -= len(chunk)
        return b""

    def _reply(self, status: int, body: Body) -> None:
        headers: dict[str, str] = {}
        if isinstance(body, Media):
            status, headers, body = body.status, body.headers, body.data
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream" if isinstance(body, bytes) else "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

"""``WeightsCacheBucket``: one region's weights cache, Cloud Storage's JSON wire spoken directly (as a TPU VM does).

Why this way: the restore runs in the download container on the VM with the node-agent bundle's google-auth and
requests; google-cloud-storage would add its dependencies to that bundle for four calls. The calls:

* ``GET /storage/v1/b/B``: the bucket's ``location`` (a cache is read only in its own region, unless allowed);
* ``GET /storage/v1/b/B/o/N``: an object's size and generation (404: a miss);
* ``GET ...?alt=media&generation=G`` with ``Range`` headers, several at once: a large file is read in parts in
  parallel into one file (``os.pwrite``); pinning the generation means a replaced object cannot mix into a read;
* ``POST /upload/storage/v1/b/B/o?uploadType=media&ifGenerationMatch=G``: G=0 creates only, G>0 replaces only the
  generation a reader refused; so of two fillers one wins (412 for the other) and a good refill is never undone.
  A file over ``SINGLE_UPLOAD_BYTES`` (a 5 GB shard) goes through a resumable session instead (``uploadType=
  resumable``, then ``PUT`` chunks with ``Content-Range``): the same precondition, checked when the last byte
  lands, and a chunk lost in transit is sent again from the offset the service committed, not the whole file.

Errors are ``CloudError``s naming the bucket, the object and the fix. Identity: the VM's own service account from
its metadata server (``on_vm``), or the session given (tests against the stand-in).
"""

from __future__ import annotations

import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests

from shared.adapters.cloud_storage_bundles import storage_error
from shared.domain.errors import CloudError, ErrorClass, TransientError

__all__ = [
    "CHUNK_BYTES",
    "DEFAULT_ENDPOINT",
    "PART_BYTES",
    "SINGLE_UPLOAD_BYTES",
    "CloudStorageCacheState",
    "WeightsCacheBucket",
    "vm_zone",
]

DEFAULT_ENDPOINT = "https://storage.googleapis.com"
PART_BYTES = 64 * 1024 * 1024  # one ranged read; a 5 GB shard is read as ~80 parts, `parallel` at a time
SINGLE_UPLOAD_BYTES = 8 * 1024 * 1024  # up to this, one request; above, a resumable session
CHUNK_BYTES = 64 * 1024 * 1024  # one resumable chunk: a multiple of 256 KiB, as the service requires
RESUMES = 5  # failed chunks in a row before an upload gives up (each resumes from the committed offset)
_FIX = "grant the TPU VM's service account roles/storage.objectUser on the bucket (terraform apply)"


class WeightsCacheBucket:
    """Reads, conditional writes and the location of one cache bucket."""

    def __init__(
        self,
        bucket: str,
        session: requests.Session,
        *,
        endpoint: str | None = None,
        parallel: int = 8,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        if chunk_bytes <= 0 or chunk_bytes % (256 * 1024):
            raise ValueError(f"chunk_bytes: {chunk_bytes} is not a positive multiple of 256 KiB")
        self.bucket = bucket
        self._session = session
        self._endpoint = (endpoint or DEFAULT_ENDPOINT).rstrip("/")
        self._parallel = max(1, parallel)
        self._chunk_bytes = chunk_bytes

    @classmethod
    def on_vm(cls, bucket: str, *, endpoint: str | None = None) -> WeightsCacheBucket:
        """The bucket as this VM's service account reaches it (tokens from the metadata server)."""
        from google.auth.compute_engine import Credentials as VmCredentials
        from google.auth.transport.requests import AuthorizedSession

        return cls(bucket, AuthorizedSession(VmCredentials()), endpoint=endpoint)

    def location(self) -> str:
        """The bucket's location, lower case (``us-east5``; a multi-region such as ``us`` has no dash)."""
        body = self._json("GET", f"{self._endpoint}/storage/v1/b/{quote(self.bucket, safe='')}", "")
        return str(body.get("location") or "").lower()

    def stat(self, name: str) -> tuple[int, int] | None:
        """``(size, generation)`` of an object, None when there is none."""
        body = self._json("GET", self._object_url(name), name, missing_ok=True)
        if not body:
            return None
        return int(body["size"]), int(body["generation"])

    def read_to(self, name: str, generation: int, size: int, path: Path) -> None:
        """The object's bytes of that generation into ``path``, in ranged parts read in parallel."""
        parts = [(start, min(start + PART_BYTES, size) - 1) for start in range(0, size, PART_BYTES)]
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(descriptor, size)
            with ThreadPoolExecutor(max_workers=self._parallel, thread_name_prefix="cache-read") as pool:
                list(pool.map(lambda part: self._read_part(name, generation, part, descriptor), parts))
        finally:
            os.close(descriptor)

    def write_from(self, name: str, path: Path, *, if_generation: int) -> bool:
        """Store ``path`` as ``name`` if its generation is still ``if_generation`` (0: absent); False if it was not.
        The object appears whole or not at all."""
        size = path.stat().st_size
        if size > SINGLE_UPLOAD_BYTES:
            return self._write_resumable(name, path, size, if_generation)
        url = f"{self._endpoint}/upload/storage/v1/b/{quote(self.bucket, safe='')}/o"
        params = {"uploadType": "media", "name": name, "ifGenerationMatch": str(if_generation)}
        with path.open("rb") as body:
            response = self._call(
                "POST", url, name, params=params, data=body, headers={"Content-Type": "application/octet-stream"}
            )
        with response:
            if response.status_code == 412:
                return False
            if response.status_code >= 300:
                raise self._classified(response, "upload", name)
        return True

    def _write_resumable(self, name: str, path: Path, size: int, if_generation: int) -> bool:
        """One resumable session, chunk by chunk; a failed chunk resumes from the committed offset."""
        url = f"{self._endpoint}/upload/storage/v1/b/{quote(self.bucket, safe='')}/o"
        params = {"uploadType": "resumable", "name": name, "ifGenerationMatch": str(if_generation)}
        headers = {"X-Upload-Content-Type": "application/octet-stream", "X-Upload-Content-Length": str(size)}
        with self._call("POST", url, name, params=params, headers=headers) as response:
            if response.status_code == 412:
                return False
            session = response.headers.get("Location", "")
            if response.status_code >= 300 or not session:
                raise self._classified(response, "upload", name)
        offset: int | None = 0
        failures = 0
        with path.open("rb") as source:
            while offset is not None:
                source.seek(offset)
                chunk = source.read(self._chunk_bytes)
                sent = {"Content-Range": f"bytes {offset}-{offset + len(chunk) - 1}/{size}"}
                error: Exception
                try:
                    with self._call("PUT", session, name, data=chunk, headers=sent) as response:
                        if response.status_code == 412:
                            return False
                        if response.status_code in (200, 201, 308):
                            committed = _committed(response, size)
                            if committed is None or committed > offset:  # done, or progress: reset the count
                                offset, failures = committed, 0
                                continue
                            error = CloudError(ErrorClass.TRANSIENT, f"{self.where(name)}: upload stuck at {committed}")
                        else:
                            error = self._classified(response, "upload", name)
                except TransientError as exc:
                    error = exc
                if not isinstance(error, TransientError) or failures >= RESUMES:
                    raise error
                failures += 1
                time.sleep(min(2.0**failures, 30.0))
                try:
                    offset = self._upload_status(session, size, name)
                except TransientError:
                    continue  # the status is unknown too: send the same chunk again
        return True

    def _upload_status(self, session: str, size: int, name: str) -> int | None:
        """The offset the service committed for ``session`` (None: the upload is complete)."""
        with self._call("PUT", session, name, headers={"Content-Range": f"bytes */{size}"}) as response:
            if response.status_code in (200, 201, 308):
                return _committed(response, size)
            raise self._classified(response, "upload", name)

    def where(self, name: str) -> str:
        return f"gs://{self.bucket}/{name}"

    def prefix_bytes(self, prefix: str, *, max_pages: int = 100) -> int:
        """The total size of the objects under ``prefix`` (``GET .../o?prefix=``, page by page)."""
        url = f"{self._endpoint}/storage/v1/b/{quote(self.bucket, safe='')}/o"
        total, token = 0, ""
        for _page in range(max_pages):
            params = {"prefix": prefix, "fields": "items(size),nextPageToken"} | ({"pageToken": token} if token else {})
            with self._call("GET", url, prefix, params=params) as response:
                if response.status_code >= 300:
                    raise self._classified(response, "list", prefix)
                body = response.json()
            total += sum(int(item.get("size") or 0) for item in body.get("items") or [])
            token = str(body.get("nextPageToken") or "")
            if not token:
                break
        return total

    def _read_part(self, name: str, generation: int, part: tuple[int, int], descriptor: int) -> int:
        start, end = part
        params = {"alt": "media", "generation": str(generation)}
        headers = {"Range": f"bytes={start}-{end}"}
        with self._call("GET", self._object_url(name), name, params=params, headers=headers, stream=True) as response:
            if response.status_code not in (200, 206):
                raise self._classified(response, "download", name)
            offset = start
            try:
                for chunk in response.iter_content(chunk_size=1024 * 1024):
                    if offset + len(chunk) > end + 1:
                        raise CloudError(ErrorClass.TRANSIENT, f"{self.where(name)}: more bytes than were asked for")
                    os.pwrite(descriptor, chunk, offset)
                    offset += len(chunk)
            except requests.RequestException as exc:
                raise CloudError(ErrorClass.TRANSIENT, f"{self.where(name)}: read cut short: {exc}") from exc
        if offset != end + 1:
            raise CloudError(ErrorClass.TRANSIENT, f"{self.where(name)}: part {start}-{end} ended at {offset}")
        return offset - start

    def _object_url(self, name: str) -> str:
        return f"{self._endpoint}/storage/v1/b/{quote(self.bucket, safe='')}/o/{quote(name, safe='')}"

    def _json(self, method: str, url: str, name: str, *, missing_ok: bool = False) -> dict[str, Any]:
        with self._call(method, url, name) as response:
            if response.status_code == 404 and missing_ok:
                return {}
            if response.status_code >= 300:
                raise self._classified(response, "read", name)
            body = response.json()
        return body if isinstance(body, dict) else {}

    def _call(self, method: str, url: str, name: str, **kwargs: Any) -> requests.Response:
        try:
            return self._session.request(method, url, timeout=(10, 120), **kwargs)
        except requests.RequestException as exc:
            raise CloudError(ErrorClass.TRANSIENT, f"{self.where(name)}: unreachable: {type(exc).__name__}") from exc
        except Exception as exc:  # google-auth's refresh errors: no token, no cache
            raise CloudError(ErrorClass.PERMISSION, f"{self.where(name)}: no token: {type(exc).__name__}") from exc

    def _classified(self, response: requests.Response, verb: str, name: str) -> CloudError:
        missing = f"no bucket {self.bucket}: terraform apply"
        return storage_error(response, f"{verb} of {self.where(name)}", fix=_FIX, missing=missing)


def _committed(response: requests.Response, size: int) -> int | None:
    """Where a resumable upload goes on: the byte after ``Range: bytes=0-N`` of a 308 (0 without one), or None
    once the service answered 200/201 (the object is stored)."""
    if response.status_code in (200, 201):
        return None
    committed = response.headers.get("Range", "").removeprefix("bytes=0-")
    offset = int(committed) + 1 if committed.isdigit() else 0
    if offset > size:
        raise CloudError(ErrorClass.INVALID, f"Cloud Storage committed {offset} bytes of a {size}-byte upload")
    return offset


def vm_zone() -> str:
    """This VM's zone from its metadata server (``projects/N/zones/us-east5-b`` -> ``us-east5-b``), read as
    ``cloud_logging_sink`` reads it (google-auth honours ``GCE_METADATA_HOST``)."""
    from google.auth import exceptions as auth_exceptions
    from google.auth.compute_engine import _metadata
    from google.auth.transport.requests import Request

    try:
        return str(_metadata.get(Request(), "instance/zone")).rsplit("/", 1)[-1]
    except auth_exceptions.TransportError as exc:
        raise CloudError(ErrorClass.TRANSIENT, f"metadata server unreachable: {exc}") from exc


class CloudStorageCacheState:
    """What the weights caches hold, as the gateway reads it (``WeightsCacheState``): the user's Application Default
    Credentials, read-only scope; anonymous at an overridden endpoint (a local stand-in, as ``cloud_logging``)."""

    def __init__(self, *, endpoint: str | None = None, session: requests.Session | None = None) -> None:
        self._endpoint = endpoint
        self._session = session

    def cached_bytes(self, bucket: str, repo_id: str) -> int:
        from shared.domain.weights_cache import WEIGHTS_PREFIX, repo_folder

        return WeightsCacheBucket(bucket, self._authorized(), endpoint=self._endpoint).prefix_bytes(
            f"{WEIGHTS_PREFIX}{repo_folder(repo_id)}/blobs/"
        )

    def compiled_bytes(self, bucket: str, repo_id: str, key: str) -> int | None:
        from shared.adapters.compile_cache_entry import read_manifest

        store = WeightsCacheBucket(bucket, self._authorized(), endpoint=self._endpoint)
        with tempfile.TemporaryDirectory(prefix="tpuctl-manifest-") as folder:
            found = read_manifest(store, repo_id, key, Path(folder) / "manifest.json")
        if found is None or isinstance(found[1], str):
            return None  # none, or one a boot would refuse: cold until a prewarm fills it
        archive = store.stat(found[1].archive)
        return found[1].bytes if archive is not None and archive[0] == found[1].bytes else None

    def _authorized(self) -> requests.Session:
        if self._session is None:
            if self._endpoint is not None:
                self._session = requests.Session()
            else:
                import google.auth
                from google.auth.transport.requests import AuthorizedSession

                credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/devstorage.read_only"])
                self._session = AuthorizedSession(credentials)
        return self._session

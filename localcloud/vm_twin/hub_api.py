"""The Hugging Face Hub as a TPU VM downloads model weights from it: the VM twin's stand-in, on one loopback port.

Why: the VM fills the regional weights cache from the Hub on a cold boot and must not touch the Hub on a warm one.
The twin points the VM's restore/fill program (and ``huggingface_hub`` itself, through ``HF_ENDPOINT``) here, and
counts every file served so a test can prove which boots reached the Hub. Each repository is a flat local model
directory (the twin's tiny model) at one commit. Only the calls a download makes are served, on the Hub's wire:

* ``GET /api/models/{org}/{name}[/revision/{rev}][?blobs=true]`` (``rev`` the commit or ``main``):
  ``{"id", "modelId", "sha", "siblings": [{"rfilename", "blobId", "size"[, "lfs"]}]}``;
* ``GET /api/models/{org}/{name}/tree/{rev}[?recursive=true]`` (``snapshot_download`` lists files with it):
  ``[{"type": "file", "path", "oid", "size"[, "lfs": {"oid", "size", "pointerSize"}]}]``;
* ``GET`` and ``HEAD /{org}/{name}/resolve/{rev}/{path}``: the bytes (a ``Range: bytes=A-B`` resumes with 206),
  with ``X-Repo-Commit``, ``ETag`` (the sha256 for LFS files, else the git blob id) and, for LFS files,
  ``X-Linked-Etag`` and ``X-Linked-Size``.

A file is stored in LFS when its suffix is a weights format (:data:`LFS_SUFFIXES`); its git blob is then the LFS
pointer, so ``blobId`` hashes the pointer as git would. Errors are 404 with ``X-Error-Code`` ``RepoNotFound``,
``RevisionNotFound`` or ``EntryNotFound`` (what ``huggingface_hub`` maps to its exceptions), and 400 for a path with
``..`` or empty segments.
"""

from __future__ import annotations

import collections
import hashlib
import json
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from localcloud.vm_twin.loopback_http import LoopbackStandIn, StandInServer
from shared.domain.catalog.presets import PRESETS

__all__ = ["LFS_SUFFIXES", "HubFile", "HubStandIn", "catalog_repos", "git_blob_id"]

LFS_SUFFIXES = frozenset({".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".onnx"})
"""Suffixes the Hub's repositories keep in Git LFS (the weights formats of its default ``.gitattributes``)."""

_API = re.compile(r"^/api/models/([^/]+/[^/]+)(?:/(revision|tree)/([^/]+)(?:/(.*))?)?$")
_RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")
_CHUNK = 1 << 20


def git_blob_id(data: bytes) -> str:
    """The id git gives a blob of ``data`` (``git hash-object``): sha1 of ``blob <size>\\0`` and the bytes."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # noqa: S324 - git's object id


@dataclass(frozen=True)
class HubFile:
    """One file of a repository, with the ids the Hub reports for it."""

    path: Path
    size: int
    blob_id: str
    sha256: str | None  # set for LFS files only

    @classmethod
    def of(cls, path: Path) -> HubFile:
        data = path.read_bytes()
        if path.suffix not in LFS_SUFFIXES:
            return cls(path, len(data), git_blob_id(data), None)
        sha256 = hashlib.sha256(data).hexdigest()
        pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {len(data)}\n"
        return cls(path, len(data), git_blob_id(pointer.encode()), sha256)

    @property
    def etag(self) -> str:
        return self.sha256 or self.blob_id

    def sibling(self) -> dict[str, Any]:
        """The file in a model's ``siblings`` (``blobs=true`` form)."""
        entry: dict[str, Any] = {"rfilename": self.path.name, "blobId": self.blob_id, "size": self.size}
        if self.sha256 is not None:
            entry["lfs"] = {"sha256": self.sha256, "size": self.size, "pointerSize": self._pointer_size}
        return entry

    def tree_entry(self) -> dict[str, Any]:
        """The file in a ``/tree`` listing."""
        entry: dict[str, Any] = {"type": "file", "oid": self.blob_id, "size": self.size, "path": self.path.name}
        if self.sha256 is not None:
            entry["lfs"] = {"oid": self.sha256, "size": self.size, "pointerSize": self._pointer_size}
        return entry

    @property
    def _pointer_size(self) -> int:
        return len(f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\nsize {self.size}\n")


def catalog_repos(model_dir: Path) -> dict[str, tuple[Path, str]]:
    """Every catalog model with a Hub id, served from ``model_dir`` at the commit the twin's HF cache uses."""
    repos: dict[str, tuple[Path, str]] = {}
    for preset in PRESETS.values():
        if "/" in preset.hub_id:
            commit = preset.revision or hashlib.sha1(preset.hub_id.encode()).hexdigest()  # noqa: S324 - a name
            repos[preset.hub_id] = (model_dir, commit)
    return repos


@dataclass(frozen=True)
class _Reply:
    status: int
    headers: dict[str, str]
    body: bytes = b""
    file: HubFile | None = None  # stream this file's bytes [start, end] instead of ``body``
    start: int = 0
    end: int = -1


class HubStandIn(LoopbackStandIn):
    """Model repositories from local directories, served as the Hub serves them; counts file downloads."""

    catalog_repos = staticmethod(catalog_repos)

    def __init__(self, repos: Mapping[str, tuple[Path, str]], *, host: str = "127.0.0.1") -> None:
        self.repos = dict(repos)
        self.downloads: collections.Counter[tuple[str, str]] = collections.Counter()
        self._lock = threading.Lock()
        self._files: dict[tuple[Path, int, int], HubFile] = {}  # by (path, mtime_ns, size): hashed once
        self._server = StandInServer(_Handler, self, name="hub-stand-in", host=host)

    def files(self, repo_id: str) -> list[HubFile]:
        """The repository's files, sorted by name (a flat directory: sub-directories are not served)."""
        model_dir, _ = self.repos[repo_id]
        return [self._file(path) for path in sorted(model_dir.iterdir()) if path.is_file()]

    # ------------------------------------------------------------------ routes

    def answer(self, method: str, path: str, range_header: str | None) -> _Reply:
        """Route one ``GET`` or ``HEAD``."""
        if match := _API.match(path):
            repo_id, kind, revision, subpath = match.groups()
            return self._api(repo_id, kind or "revision", unquote(revision or "main"), subpath or "")
        if match := _RESOLVE.match(path):
            repo_id, revision, file_path = match.groups()
            return self._resolve(method, repo_id, unquote(revision), unquote(file_path), range_header)
        return _hub_error(404, "RepoNotFound", f"no such Hub route here: {path}")

    def _api(self, repo_id: str, kind: str, revision: str, subpath: str) -> _Reply:
        if (refused := self._refusal(repo_id, revision)) is not None:
            return refused
        commit = self.repos[repo_id][1]
        if kind == "tree":
            entries = [] if subpath else [file.tree_entry() for file in self.files(repo_id)]
            return _json(200, entries)
        siblings = [file.sibling() for file in self.files(repo_id)]
        info = {"_id": commit[:24], "id": repo_id, "modelId": repo_id, "sha": commit, "private": False}
        return _json(200, info | {"gated": False, "disabled": False, "tags": [], "siblings": siblings})

    def _resolve(self, method: str, repo_id: str, revision: str, file_path: str, range_header: str | None) -> _Reply:
        if any(part in ("", ".", "..") for part in file_path.split("/")):
            return _hub_error(400, "BadRequest", f"Invalid path: {file_path!r}")
        if (refused := self._refusal(repo_id, revision)) is not None:
            return refused
        model_dir, commit = self.repos[repo_id]
        path = model_dir / file_path
        if "/" in file_path or not path.is_file():
            return _hub_error(404, "EntryNotFound", f"{file_path} does not exist on {revision!r}", commit)
        file = self._file(path)
        headers = {"X-Repo-Commit": commit, "ETag": f'"{file.etag}"', "Accept-Ranges": "bytes"}
        if file.sha256 is not None:
            headers |= {"X-Linked-Etag": f'"{file.sha256}"', "X-Linked-Size": str(file.size)}
        start, end, status = 0, file.size - 1, 200
        if range_header and (match := _RANGE.match(range_header.strip())):
            start, end, status = int(match.group(1)), min(int(match.group(2) or file.size - 1), file.size - 1), 206
            if start >= file.size:
                return _Reply(416, headers | {"Content-Range": f"bytes */{file.size}"})
            headers["Content-Range"] = f"bytes {start}-{end}/{file.size}"
        if method == "GET":
            with self._lock:
                self.downloads[(repo_id, file_path)] += 1
        return _Reply(status, headers | {"Content-Type": "application/octet-stream"}, b"", file, start, end)

    def _refusal(self, repo_id: str, revision: str) -> _Reply | None:
        """The Hub's 404 for an unknown repository or revision (None when both are served)."""
        if repo_id not in self.repos:
            return _hub_error(404, "RepoNotFound", "Repository not found")
        if revision not in ("main", self.repos[repo_id][1]):
            return _hub_error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return None

    def _file(self, path: Path) -> HubFile:
        status = path.stat()
        key = (path, status.st_mtime_ns, status.st_size)
        with self._lock:
            known = self._files.get(key)
        if known is None:
            known = HubFile.of(path)
            with self._lock:
                self._files[key] = known
        return known


def _json(status: int, body: Any, headers: Mapping[str, str] | None = None) -> _Reply:
    return _Reply(status, {"Content-Type": "application/json", **(headers or {})}, json.dumps(body).encode())


def _hub_error(status: int, code: str, message: str, commit: str = "") -> _Reply:
    """The Hub's error: ``{"error": message}`` with ``X-Error-Code`` and ``X-Error-Message`` headers."""
    headers = {"X-Error-Code": code, "X-Error-Message": message}
    if commit:
        headers["X-Repo-Commit"] = commit
    return _json(status, {"error": message}, headers)


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        self._serve("GET")

    def do_HEAD(self) -> None:
        self._serve("HEAD")

    def _serve(self, method: str) -> None:
        url = urlsplit(self.path)
        hub: HubStandIn = self.server.stand_in  # type: ignore[attr-defined]
        # Every query (blobs, recursive, expand) is answered the same way: the fullest form, in one page.
        reply = hub.answer(method, url.path, self.headers.get("Range"))
        length = reply.end - reply.start + 1 if reply.file is not None else len(reply.body)
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(length))
        self.end_headers()
        if method == "HEAD":
            return
        if reply.file is None:
            self.wfile.write(reply.body)
            return
        with reply.file.path.open("rb") as source:
            source.seek(reply.start)
            while length > 0 and (chunk := source.read(min(length, _CHUNK))):
                self.wfile.write(chunk)
                length -= len(chunk)

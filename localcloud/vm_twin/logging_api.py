"""Cloud Logging as a TPU VM and the gateway reach it: ``entries:write`` and ``entries:list`` of one project.

Why: the node agent ships vLLM's lines to Cloud Logging and ``tpu_observe(show='logs')`` reads them back; Cloud
Logging has no emulator, so this stand-in serves the two calls on Google's JSON wire (``GoogleApis`` routes them
here):

* ``POST /v2/entries:write`` ``{"logName","resource","labels","entries":[...],"partialSuccess","dryRun"}``: needs
  a token a VM's metadata server issued (401 ``UNAUTHENTICATED`` otherwise) and a ``logName`` of this project (403
  ``PERMISSION_DENIED`` otherwise). Each entry takes the request's ``logName``, ``resource`` and ``labels`` unless
  it has its own (labels merge, the entry's win); an entry needs a resource, at most one payload, a known severity
  and at most 256 KiB; a bad one answers 400 ``INVALID_ARGUMENT`` naming its index, and with ``partialSuccess`` the
  good ones are kept. Unknown fields are refused, as Google's JSON parser refuses them.
* ``POST /v2/entries:list`` ``{"resourceNames":["projects/P"],"filter","orderBy","pageSize","pageToken"}`` ->
  ``{"entries":[...],"nextPageToken"}``: ``orderBy`` ``timestamp asc`` (default) or ``timestamp desc``,
  ``pageSize`` 1-1000 (default 50), the filter language of :mod:`logging_query` (anything else is 400, never a
  match-all). Reads take any bearer token or none: the gateway on a workstation calls with the user's credentials,
  and its REST client pointed here is anonymous (``AnonymousCredentials`` sends no ``Authorization``).

Entries live in memory, the newest ``max_entries`` kept (retention), in the order they arrived.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Mapping
from typing import Any

from localcloud.vm_twin.logging_query import SEVERITY_NUMBERS, FilterError, compile_filter, parse_time_ns
from localcloud.vm_twin.metadata_server import TokenIssuer

__all__ = ["CloudLoggingStandIn"]

MAX_ENTRY_BYTES = 256 * 1024
MAX_REQUEST_BYTES = 10 * 1024 * 1024
_WRITE_FIELDS = frozenset({"logName", "resource", "labels", "entries", "partialSuccess", "dryRun"})
_LIST_FIELDS = frozenset({"resourceNames", "projectIds", "filter", "orderBy", "pageSize", "pageToken"})
_ENTRY_FIELDS = frozenset(
    {
        "logName", "resource", "timestamp", "receiveTimestamp", "severity", "insertId", "httpRequest", "labels",
        "operation", "trace", "spanId", "traceSampled", "sourceLocation", "split", "textPayload", "jsonPayload",
        "protoPayload",
    }
)  # fmt: skip
_PAYLOADS = ("textPayload", "jsonPayload", "protoPayload")
_LOG_NAME = re.compile(r"^projects/([^/]+)/logs/[A-Za-z0-9/_.%-]{1,512}$")
_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED"}
_ORDERS = {"": False, "timestamp asc": False, "timestamp desc": True}
Answer = tuple[int, dict[str, Any]]


def _error(code: int, message: str) -> Answer:
    return code, {"error": {"code": code, "message": message, "status": _STATUS.get(code, "UNKNOWN")}}


def _snake(name: str) -> str:
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), name)


def _fields(body: Mapping[str, Any], known: frozenset[str], where: str) -> dict[str, Any] | str:
    """The body with proto field names in either spelling (``dryRun``, ``dry_run``), or what is unknown."""
    spelled = {_snake(name): name for name in known}
    out: dict[str, Any] = {}
    for key, value in body.items():
        name = key if key in known else spelled.get(key)
        if name is None:
            return f"Invalid JSON payload received. Unknown name \"{key}\" at '{where}': Cannot find field."
        out[name] = value
    return out


class CloudLoggingStandIn:
    """The stored entries of one project and the two calls on them; thread-safe."""

    def __init__(self, project: str, tokens: TokenIssuer, *, max_entries: int = 100_000) -> None:
        self.project = project
        self.tokens = tokens
        self._entries: deque[tuple[int, int, dict[str, Any]]] = deque(maxlen=max_entries)  # (time ns, seq, entry)
        self._seq = 0
        self._lock = threading.Lock()

    def entries(self) -> list[dict[str, Any]]:
        """Copies of every stored entry in arrival order (for tests)."""
        with self._lock:
            return [json.loads(json.dumps(entry)) for _, _, entry in self._entries]

    def answer(self, path: str, raw: bytes, authorization: str | None) -> Answer:
        if len(raw) > MAX_REQUEST_BYTES:
            return _error(400, f"Request payload size exceeds the limit: {MAX_REQUEST_BYTES} bytes.")
        try:
            body = json.loads(raw or b"{}")
        except (ValueError, UnicodeDecodeError) as exc:
            return _error(400, f"Invalid JSON payload received. {exc}")
        if not isinstance(body, dict):
            return _error(400, "Invalid JSON payload received. Expected an object.")
        if path == "/v2/entries:write":
            return self.write_entries(body, authorization)
        if path == "/v2/entries:list":
            return self.list_entries(body)
        return _error(404, f"no such API here: POST {path}")

    # ------------------------------------------------------------------ entries:write

    def write_entries(self, body: Mapping[str, Any], authorization: str | None) -> Answer:
        if self.tokens.identity(authorization) is None:
            return _error(401, "Request had invalid authentication credentials. Expected OAuth 2 access token.")
        request = _fields(body, _WRITE_FIELDS, "")
        if isinstance(request, str):
            return _error(400, request)
        raw_entries = request.get("entries")
        if not isinstance(raw_entries, list) or not raw_entries:
            return _error(400, "entries: at least one log entry is required")
        built: list[dict[str, Any]] = []
        problems: list[str] = []
        for index, raw in enumerate(raw_entries):
            entry = self._entry(raw, request, index) if isinstance(raw, dict) else f"entries[{index}]: not an object"
            if isinstance(entry, tuple):
                return entry  # a permission error refuses the whole request
            if isinstance(entry, str):
                problems.append(entry)
            else:
                built.append(entry)
        if problems and not request.get("partialSuccess"):
            return _error(400, f"Log entry {problems[0]}; nothing was written")
        if not request.get("dryRun"):
            self._store(built)
        if problems:
            return _error(400, f"{len(problems)} of {len(raw_entries)} entries were refused: {problems[0]}")
        return 200, {}

    def _entry(self, raw: Mapping[str, Any], request: Mapping[str, Any], index: int) -> dict[str, Any] | str | Answer:
        """The entry as stored, or why it is refused (a str), or a whole-request error (a tuple)."""
        entry = _fields(raw, _ENTRY_FIELDS, f"entries[{index}]")
        if isinstance(entry, str):
            return entry
        log_name = str(entry.get("logName") or request.get("logName") or "")
        match = _LOG_NAME.match(log_name)
        if match is None:
            return f"entries[{index}]: logName {log_name!r} is not projects/PROJECT/logs/LOG_ID"
        if match.group(1) != self.project:
            return _error(403, f"Permission 'logging.logEntries.create' denied on resource 'projects/{match.group(1)}'")
        resource = entry.get("resource") or request.get("resource")
        if not isinstance(resource, dict) or not resource.get("type"):
            return f"entries[{index}]: a monitored resource with a type is required"
        if sum(1 for name in _PAYLOADS if name in entry) > 1:
            return f"entries[{index}]: at most one of textPayload, jsonPayload, protoPayload"
        severity = _severity(entry.get("severity", "DEFAULT"))
        if severity is None:
            return f"entries[{index}]: severity {entry.get('severity')!r} is not a LogSeverity"
        stamp = parse_time_ns(str(entry["timestamp"])) if "timestamp" in entry else time.time_ns()
        if stamp is None:
            return f"entries[{index}]: timestamp {entry.get('timestamp')!r} is not an RFC 3339 time"
        labels = {**dict(request.get("labels") or {}), **dict(entry.get("labels") or {})}
        stored = {**entry, "logName": log_name, "resource": resource, "severity": severity}
        stored.update(timestamp=_rfc3339(stamp), receiveTimestamp=_rfc3339(time.time_ns()))
        stored["insertId"] = str(entry.get("insertId") or uuid.uuid4().hex[:16])
        stored.pop("labels", None)
        if labels:
            stored["labels"] = {str(key): str(value) for key, value in labels.items()}
        size = len(json.dumps(stored).encode())
        if size > MAX_ENTRY_BYTES:
            return f"entries[{index}]: Log entry with size {size / 1024:.1f}K exceeds maximum size of 256.0K"
        return stored

    def _store(self, entries: list[dict[str, Any]]) -> None:
        with self._lock:
            for entry in entries:
                self._seq += 1
                self._entries.append((parse_time_ns(entry["timestamp"]) or 0, self._seq, entry))

    # ------------------------------------------------------------------ entries:list

    def list_entries(self, body: Mapping[str, Any]) -> Answer:
        request = _fields(body, _LIST_FIELDS, "")
        if isinstance(request, str):
            return _error(400, request)
        names = list(request.get("resourceNames") or []) + [f"projects/{p}" for p in request.get("projectIds") or []]
        refused = self._resource_names(names)
        if refused is not None:
            return refused
        try:
            matcher = compile_filter(str(request.get("filter") or ""))
        except FilterError as exc:
            return _error(400, f"Invalid filter: {exc}")
        order = str(request.get("orderBy") or "").strip().lower()
        if order not in _ORDERS:
            return _error(400, f"orderBy: {request.get('orderBy')!r}: use 'timestamp asc' or 'timestamp desc'")
        size = _page_size(request.get("pageSize"))
        if size is None:
            return _error(400, f"pageSize: {request.get('pageSize')!r} must be 0-1000")
        fingerprint = hashlib.sha256(json.dumps([names, request.get("filter"), order]).encode()).hexdigest()[:16]
        page = _page_token(str(request.get("pageToken") or ""), fingerprint)
        if page is None:
            return _error(400, "pageToken: not a token this list gave, or one of another query")
        with self._lock:
            ceiling = page[1] if page[1] is not None else self._seq
            found = [(ns, seq, entry) for ns, seq, entry in self._entries if seq <= ceiling and matcher(entry)]
        found.sort(key=lambda item: (item[0], item[1]), reverse=_ORDERS[order])
        start = page[0]
        answer: dict[str, Any] = {"entries": [entry for _, _, entry in found[start : start + size]]}
        if start + size < len(found):
            answer["nextPageToken"] = _token(start + size, ceiling, fingerprint)
        return 200, answer

    def _resource_names(self, names: list[str]) -> Answer | None:
        if not names:
            return _error(400, "resourceNames: at least one resource name is required")
        for name in names:
            if not re.fullmatch(r"projects/[^/]+", str(name)):
                return _error(400, f"resourceNames: {name!r}: only projects/PROJECT is supported here")
            if name != f"projects/{self.project}":
                return _error(403, f"The caller does not have permission on {name}")
        return None


def _severity(value: Any) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return next((name for name, number in SEVERITY_NUMBERS.items() if number == value), None)
    return str(value).upper() if str(value).upper() in SEVERITY_NUMBERS else None


def _page_size(value: Any) -> int | None:
    if value is None or value == "":
        return 50
    try:
        size = int(value)
    except (TypeError, ValueError):
        return None
    if not 0 <= size <= 1000:
        return None
    return size or 50


def _token(start: int, ceiling: int, fingerprint: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([start, ceiling, fingerprint]).encode()).decode()


def _page_token(token: str, fingerprint: str) -> tuple[int, int | None] | None:
    """(first index, newest entry the first page saw) of a token; (0, None) for none; None for a bad one."""
    if not token:
        return 0, None
    try:
        start, ceiling, seen = json.loads(base64.urlsafe_b64decode(token.encode()))
    except (ValueError, TypeError):
        return None
    if seen != fingerprint or not isinstance(start, int) or not isinstance(ceiling, int):
        return None
    return start, ceiling


def _rfc3339(time_ns: int) -> str:
    whole = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time_ns // 1_000_000_000))
    return f"{whole}.{time_ns % 1_000_000_000:09d}Z"

"""A small stateful fake of the Cloud Scheduler v1 REST API, so the real client is tested against it.

There is no official Scheduler emulator (docs/reference/gcp-local.md §5). This fake serves what
``google.cloud.scheduler_v1.CloudSchedulerClient(transport="rest")`` sends: create, get, list, patch,
delete, ``:pause``, ``:resume`` and ``:run`` on ``/v1/projects/{p}/locations/{l}/jobs``. It keeps jobs
in memory, answers with the standard error envelope, accepts numeric or string enums and ignores the
``$alt`` query the client adds. ``:run`` calls an optional ``on_run`` callback with the job (a demo
can publish its Pub/Sub target there). Loopback only.
"""

from __future__ import annotations

import base64
import json
import re
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from shared.adapters.local_scheduler import CronSchedule

__all__ = ["SchedulerFake"]

_JOBS = re.compile(r"^/v1/projects/([^/]+)/locations/([^/]+)/jobs$")
_JOB = re.compile(r"^/v1/(projects/[^/]+/locations/[^/]+/jobs/[^/:]+)(?::(pause|resume|run))?$")
_JOB_ID = re.compile(r"^[A-Za-z0-9_-]{1,500}$")
_MAX_BODY = 1 << 20


class _ApiError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


class SchedulerFake:
    """In-memory Cloud Scheduler jobs behind a loopback HTTP server on a free port."""

    def __init__(self, *, on_run: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self.fail_next: list[int] = []
        self._fired: dict[str, datetime] = {}  # job name -> the cron slot it last fired for
        self._on_run = on_run
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------------------ server lifecycle

    def start(self) -> str:
        """Serve on 127.0.0.1 at a free port; returns the base URL for ``client_options.api_endpoint``."""
        fake = self

        class Handler(BaseHTTPRequestHandler):
            disable_nagle_algorithm = True

            def do_GET(self) -> None:
                fake._serve(self, "GET")

            def do_POST(self) -> None:
                fake._serve(self, "POST")

            def do_PATCH(self) -> None:
                fake._serve(self, "PATCH")

            def do_DELETE(self) -> None:
                fake._serve(self, "DELETE")

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        server = self._server
        self._thread = threading.Thread(
            target=lambda: server.serve_forever(poll_interval=0.05), name="scheduler-fake", daemon=True
        )
        self._thread.start()
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> SchedulerFake:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------------------------- requests

    def _serve(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        url = urlsplit(handler.path)
        query = parse_qs(url.query)
        with self._lock:
            self.requests.append((method, url.path))
        try:
            length = int(handler.headers.get("Content-Length") or 0)
            if length > _MAX_BODY:
                raise _ApiError(400, "request body too large")
            raw = handler.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else {}
            if not isinstance(body, dict):
                raise _ApiError(400, "Invalid JSON payload: expected an object")
            with self._lock:
                if self.fail_next:
                    code = self.fail_next.pop(0)
                    raise _ApiError(code, f"injected failure {code}")
                answer = self._route(method, url.path, query, body)
            self._reply(handler, 200, answer)
        except _ApiError as exc:
            self._reply(handler, exc.code, _envelope(exc.code, exc.message))
        except (ValueError, UnicodeDecodeError) as exc:
            self._reply(handler, 400, _envelope(400, f"Invalid JSON payload: {exc}"))

    def _reply(self, handler: BaseHTTPRequestHandler, code: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        handler.send_response(code)
        handler.send_header("Content-Type", "application/json; charset=UTF-8")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _route(self, method: str, path: str, query: dict[str, list[str]], body: dict[str, Any]) -> dict[str, Any]:
        collection = _JOBS.match(path)
        if collection:
            parent = f"projects/{collection.group(1)}/locations/{collection.group(2)}"
            if method == "POST":
                return self._create(parent, body)
            if method == "GET":
                return self._list(parent, query)
            raise _ApiError(405, f"{method} is not supported on {path}")
        single = _JOB.match(path)
        if not single:
            raise _ApiError(404, f"The requested URL {path} was not found on this server.")
        name, verb = single.group(1), single.group(2)
        if verb is not None:
            if method != "POST":
                raise _ApiError(405, f"{method} is not supported on :{verb}")
            return self._verb(name, verb)
        if method == "GET":
            return dict(self._job(name))
        if method == "DELETE":
            self._job(name)
            del self.jobs[name]
            return {}
        if method == "PATCH":
            return self._patch(name, query, body)
        raise _ApiError(405, f"{method} is not supported on {path}")

    # ---------------------------------------------------------------------------------- operations

    def _job(self, name: str) -> dict[str, Any]:
        job = self.jobs.get(name)
        if job is None:
            raise _ApiError(404, f"Job not found: {name}.")
        return job

    def _create(self, parent: str, body: dict[str, Any]) -> dict[str, Any]:
        name = str(body.get("name") or "")
        if not name.startswith(parent + "/jobs/") or not _JOB_ID.match(name.rsplit("/", 1)[1]):
            raise _ApiError(400, f"Job name must be {parent}/jobs/JOB_ID with JOB_ID of letters, digits, - or _")
        if name in self.jobs:
            raise _ApiError(409, f"Job {name} already exists.")
        job = self._normalise(body)
        job["name"] = name
        job["state"] = "ENABLED"
        job["userUpdateTime"] = _now()
        self.jobs[name] = job
        return dict(job)

    def _list(self, parent: str, query: dict[str, list[str]]) -> dict[str, Any]:
        names = sorted(name for name in self.jobs if name.startswith(parent + "/jobs/"))
        size = int((query.get("pageSize") or ["100"])[0] or 100)
        start = int((query.get("pageToken") or ["0"])[0] or 0)
        page = names[start : start + size]
        answer: dict[str, Any] = {"jobs": [dict(self.jobs[name]) for name in page]}
        if start + size < len(names):
            answer["nextPageToken"] = str(start + size)
        return answer

    def _patch(self, name: str, query: dict[str, list[str]], body: dict[str, Any]) -> dict[str, Any]:
        job = self._job(name)
        incoming = self._normalise(body)
        mask = [field for item in query.get("updateMask", []) for field in item.split(",") if field]
        fields = [_camel(field) for field in mask] or [key for key in incoming if key not in ("name", "state")]
        for field in fields:
            top = field.split(".", 1)[0]
            if top in ("name", "state"):
                raise _ApiError(400, f"field {top} cannot be updated (use :pause or :resume for the state)")
            if top in incoming:
                job[top] = incoming[top]
            else:
                job.pop(top, None)
        job["userUpdateTime"] = _now()
        return dict(job)

    def _verb(self, name: str, verb: str) -> dict[str, Any]:
        job = self._job(name)
        if verb == "pause":
            job["state"] = "PAUSED"
        elif verb == "resume":
            job["state"] = "ENABLED"
        else:
            job["lastAttemptTime"] = _now()
            if self._on_run is not None:
                self._on_run(dict(job))
        job["userUpdateTime"] = _now()
        return dict(job)

    def _normalise(self, body: dict[str, Any]) -> dict[str, Any]:
        job = {key: value for key, value in body.items() if key != "state"}
        target = job.get("pubsubTarget")
        valid_target = isinstance(target, dict) and str(target.get("topicName", "")).startswith("projects/")
        if target is not None and not valid_target:
            raise _ApiError(400, "pubsubTarget.topicName must be projects/PROJECT/topics/TOPIC")
        if "schedule" in job and len(str(job["schedule"]).split()) != 5:
            raise _ApiError(400, f"Schedule has invalid value {job['schedule']!r}: use 5 unix-cron fields")
        return job

    def fire_due(self, now: datetime, publish: Callable[[str, bytes, dict[str, str]], object]) -> int:
        """Publish every enabled Pub/Sub job whose cron slot passed since it last fired, as Cloud Scheduler does.

        ``now`` is the caller's clock (the simulator's virtual time in the local cloud); a job first seen now
        fires at its next slot, not at once. ``publish(topic, data, attributes)`` gets the topic's short name.
        """
        with self._lock:
            due = []
            for name, job in self.jobs.items():
                target = job.get("pubsubTarget")
                if job.get("state") != "ENABLED" or not isinstance(target, dict) or "schedule" not in job:
                    continue
                last = self._fired.setdefault(name, now)
                slot = CronSchedule.parse(str(job["schedule"])).last_slot(last, now)
                if slot is not None:
                    self._fired[name] = slot
                    due.append(target)
        for target in due:
            data = base64.b64decode(str(target.get("data") or ""))
            publish(str(target["topicName"]).rsplit("/", 1)[1], data, dict(target.get("attributes") or {}))
        return len(due)

    def state_of(self, short_name: str) -> str | None:
        """``ENABLED`` / ``PAUSED`` for the job whose id is ``short_name`` (any project/location), or None."""
        with self._lock:
            for name, job in self.jobs.items():
                if name.rsplit("/", 1)[1] == short_name:
                    return str(job.get("state"))
        return None


def _camel(field: str) -> str:
    head, *rest = field.split("_")
    return head + "".join(part.title() for part in rest)


def _envelope(code: int, message: str) -> dict[str, Any]:
    status = {
        400: "INVALID_ARGUMENT",
        403: "PERMISSION_DENIED",
        404: "NOT_FOUND",
        405: "UNIMPLEMENTED",
        409: "ALREADY_EXISTS",
        429: "RESOURCE_EXHAUSTED",
        500: "INTERNAL",
        503: "UNAVAILABLE",
    }.get(code, HTTPStatus(code).phrase.upper().replace(" ", "_"))
    return {"error": {"code": code, "message": message, "status": status}}

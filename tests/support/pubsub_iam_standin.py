"""A loopback stand-in for Pub/Sub's subscription IAM methods (the emulator has none), recording every grant.

It answers the REST wire ``shared.adapters.pubsub_iam`` speaks, as Google documents it:

* ``GET /v1/projects/P/subscriptions/S:getIamPolicy`` -> the policy, ``{"etag": "ACAB"}`` when empty;
* ``POST /v1/projects/P/subscriptions/S:setIamPolicy`` with ``{"policy": ...}`` -> the stored policy with a new
  etag; a stale etag answers 409 ``ABORTED``, a subscription that ``exists`` says is absent answers 404.

Faults are queued as HTTP statuses (``fail_next``); ``race_next_set`` changes the stored policy just before the
next set is answered, as a concurrent writer would. ``requests`` keeps (method, path, Authorization header).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["PubSubIamStandIn", "serve_pubsub_iam"]

_PATH = re.compile(r"^/v1/projects/([^/]+)/subscriptions/([^/:]+):(getIamPolicy|setIamPolicy)$")
_STATUS = {
    400: "INVALID_ARGUMENT",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
}


@dataclass
class PubSubIamStandIn:
    """The stand-in's state; ``base_url`` once served."""

    base_url: str = ""
    policies: dict[str, dict[str, Any]] = field(default_factory=dict)  # "projects/P/subscriptions/S" -> policy
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    fail_next: list[int] = field(default_factory=list)
    race_next_set: bool = False
    exists: Callable[[str], bool] = lambda resource: True
    lock: threading.Lock = field(default_factory=threading.Lock)
    _etags: int = 0

    def members(self, subscription: str, role: str, project: str | None = None) -> set[str]:
        """Who holds ``role`` unconditionally on the subscription (short name; any project unless given)."""
        with self.lock:
            found: set[str] = set()
            for resource, policy in self.policies.items():
                _, p, _, s = resource.split("/")
                if s != subscription or (project is not None and p != project):
                    continue
                for binding in policy.get("bindings", ()):
                    if binding.get("role") == role and not binding.get("condition"):
                        found.update(binding.get("members", ()))
            return found

    def next_etag(self) -> str:
        self._etags += 1
        return f"BwY{self._etags:04d}"


def _handler(state: PubSubIamStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return

        def _answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str) -> None:
            code = _STATUS.get(status, "UNAVAILABLE" if status >= 500 else "UNKNOWN")
            self._answer(status, {"error": {"code": status, "message": message, "status": code}})

        def _route(self, method: str) -> None:
            path = self.path.split("?", 1)[0]
            with state.lock:
                state.requests.append((method, path, self.headers.get("Authorization")))
                fault = state.fail_next.pop(0) if state.fail_next else None
            match = _PATH.match(path)
            if match is None or (method == "GET") != (match.group(3) == "getIamPolicy"):
                self._error(404, f"no such method: {method} {path}")
                return
            resource = f"projects/{match.group(1)}/subscriptions/{match.group(2)}"
            if fault is not None:
                self._error(fault, f"injected {fault}")
                return
            if not state.exists(resource):
                self._error(404, f"Resource not found (resource={match.group(2)}).")
                return
            with state.lock:
                current = state.policies.get(resource, {"etag": "ACAB"})
                if method == "GET":
                    answer = current
                else:
                    length = int(self.headers.get("Content-Length", "0"))
                    policy = json.loads(self.rfile.read(length) or b"{}").get("policy", {})
                    if state.race_next_set:
                        state.race_next_set = False
                        current = {**current, "etag": state.next_etag()}
                        state.policies[resource] = current
                    if policy.get("etag") != current.get("etag"):
                        answer = None
                    else:
                        answer = {**policy, "etag": state.next_etag()}
                        state.policies[resource] = answer
            if answer is None:
                self._error(409, "There were concurrent policy changes; retry the read-modify-write.")
                return
            self._answer(200, answer)

        def do_GET(self) -> None:
            self._route("GET")

        def do_POST(self) -> None:
            self._route("POST")

    return Handler


@contextmanager
def serve_pubsub_iam(state: PubSubIamStandIn | None = None) -> Iterator[PubSubIamStandIn]:
    """Serve the stand-in on a free loopback port until the block ends."""
    state = state or PubSubIamStandIn()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    state.base_url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="pubsub-iam-stand-in", daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)

"""``tpuctl ui``: the status page, a read-only HTTP server on loopback over the gateway core.

It answers GET (and HEAD) only, on 127.0.0.1 or ::1 only, and only to requests whose Host header names the
loopback address it listens on (a web page elsewhere cannot reach it through DNS rebinding). It reads what the
gateway reads (``GatewayCore``: the store, through the same views as the MCP tools) and changes nothing. One request
at a time: the core's store clients are not shared across threads, and a page takes milliseconds.
"""

from __future__ import annotations

import logging
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from mcp_client_gateway.core import GatewayCore
from mcp_client_gateway.errors import GatewayError
from mcp_client_gateway.models import BenchmarkView
from mcp_client_gateway.status_page.pages import CSP, deployment_page, error_page, index_page

__all__ = ["LOOPBACK_HOSTS", "StatusPage"]

log = logging.getLogger("tpuctl.status_page")
LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")
_MAX_RUNS = 3
_METRICS_WINDOW_MIN = 180
_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class StatusPage:
    """Serves the status page of ``core`` on ``host:port`` (port 0: any free one) until :meth:`stop`."""

    def __init__(self, core: GatewayCore, *, host: str = "127.0.0.1", port: int = 0) -> None:
        if host not in LOOPBACK_HOSTS:
            raise ValueError(f"host: {host[:60]!r} is not loopback; the status page binds 127.0.0.1 or ::1 only")
        self.core = core
        self._server = _Server((host, port), _Handler)
        self._server.page = self
        self._thread: threading.Thread | None = None
        self._served = False  # shutdown() waits for a serve_forever loop: only ask one that ran

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = str(self._server.server_address[0])
        return f"http://{'[::1]' if ':' in host else host}:{self.port}/"

    def allowed_hosts(self) -> set[str]:
        return {f"{name}:{self.port}" for name in ("127.0.0.1", "localhost", "[::1]")}

    def start(self) -> str:
        """Serve in a background thread; returns the URL."""
        self._served = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="status-page", daemon=True)
        self._thread.start()
        return self.url

    def serve_forever(self) -> None:
        self._served = True
        self._server.serve_forever()

    def stop(self) -> None:
        if self._served:
            self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(5.0)

    def render(self, path: str) -> tuple[int, str]:
        """The status and HTML for ``path``."""
        parts = [unquote(p) for p in urlsplit(path).path.split("/") if p]
        try:
            if not parts:
                return 200, index_page(self.core.list_deployments(limit=100), now=self.core.ports.clock.now())
            if len(parts) == 2 and parts[0] == "deployments":
                return 200, self._deployment(parts[1])
        except GatewayError as exc:
            status = 404 if exc.code == "not_found" else 400
            return status, error_page(status, exc.render("cli"))
        return 404, error_page(404, "no such page: / lists the deployments")

    def _deployment(self, deployment_id: str) -> str:
        detail = self.core.get_deployment(deployment_id)
        timeline = self.core.timeline(deployment_id)
        try:
            metrics = self.core.get_metrics(deployment_id, window_minutes=_METRICS_WINDOW_MIN)
        except GatewayError:
            metrics = None
        run_ids = [e.link for e in reversed(timeline.events) if e.kind == "benchmark" and e.link][:_MAX_RUNS]
        runs: list[BenchmarkView] = []
        for run_id in run_ids:
            try:
                runs.append(self.core.get_benchmark(run_id))
            except GatewayError:
                continue
        return deployment_page(detail, timeline, metrics, runs)


class _Server(HTTPServer):
    page: StatusPage
    allow_reuse_address = False  # a second `tpuctl ui` on a taken port must fail, not share it

    def __init__(self, address: tuple[str, int], handler: Any) -> None:
        import socket

        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "tpuctl-status"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("status page: " + format, *args)

    def do_GET(self) -> None:
        self._answer(with_body=True)

    def do_HEAD(self) -> None:
        self._answer(with_body=False)

    def _refuse(self) -> None:
        self._send(HTTPStatus.METHOD_NOT_ALLOWED, error_page(405, "the status page is read-only"), True, allow="GET")

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse

    def _answer(self, *, with_body: bool) -> None:
        page = self.server.page
        if self.headers.get("Host", "") not in page.allowed_hosts():
            self._send(HTTPStatus.MISDIRECTED_REQUEST, error_page(421, "open it at its loopback address"), with_body)
            return
        try:
            status, html = page.render(self.path)
        except Exception:  # a page that fails to render must not take the server down
            log.exception("status page: %s failed", self.path[:200])
            status, html = 500, error_page(500, "this page failed to render; see the gateway log")
        self._send(HTTPStatus(status), html, with_body)

    def _send(self, status: HTTPStatus, html: str, with_body: bool, *, allow: str = "") -> None:
        body = html.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        for name, value in _HEADERS.items():
            self.send_header(name, value)
        if allow:
            self.send_header("Allow", allow)
        self.end_headers()
        if with_body:
            self.wfile.write(body)

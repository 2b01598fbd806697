"""HTTP/1.1 JSON front of the simulator: TPU API v2 and v2alpha1 paths plus admin calls under ``/_sim/``.

Runs on loopback in a background thread (``SimServer(world).start()`` returns the base URL) or in the
foreground from ``python -m localcloud.tpu_sim``. The real ``google-cloud-tpu`` REST client talks to it:
``$alt``/``alt``/``prettyPrint`` are ignored, numeric and string enums accepted, errors come back in
Google's envelope.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from pydantic import ValidationError

from localcloud.tpu_sim.compute_wire import COMPUTE_PREFIXES, compute_dispatch
from localcloud.tpu_sim.quotas_wire import QUOTAS_PREFIX, quotas_dispatch
from localcloud.tpu_sim.scenario import FaultSpec
from localcloud.tpu_sim.wire import HTTP_STATUS_NAMES, SimApiError
from localcloud.tpu_sim.world import World

__all__ = ["SimServer"]

_log = logging.getLogger(__name__)

_API = r"^/(?P<version>v2|v2alpha1)/projects/(?P<project>[^/]+)"
_LOC = _API + r"/locations/(?P<zone>[^/:]+)"
MAX_BODY = 4 * 1024 * 1024

Query = dict[str, str]
Result = tuple[int, Any]
RouteHandler = Callable[[World, dict[str, str], Query, Any], Result]


def _flag(query: Query, name: str) -> bool:
    return query.get(name, "").lower() in ("1", "true", "yes")


def _page(items: list[dict[str, Any]], key: str, query: Query, unreachable: list[str] | None = None) -> Result:
    start = int(query["pageToken"]) if query.get("pageToken", "").isdigit() else 0
    size = int(query["pageSize"]) if query.get("pageSize", "").isdigit() and int(query["pageSize"]) > 0 else None
    chunk = items[start : start + size] if size else items[start:]
    body: dict[str, Any] = {key: chunk}
    if size and start + size < len(items):
        body["nextPageToken"] = str(start + size)
    if unreachable:
        body["unreachable"] = unreachable
    return 200, body


def _routes() -> list[tuple[str, re.Pattern[str], str, RouteHandler]]:
    """(method, path pattern, endpoint name used by fault injection, handler)."""

    def create_qr(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
        return 200, w.create_queued_resource(
            p["project"],
            p["zone"],
            q.get("queuedResourceId"),
            b,
            request_id=q.get("requestId"),
            api_version=p["version"],
        )

    def list_qrs(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
        items, unreachable = w.list_queued_resources(p["project"], p["zone"])
        return _page(items, "queuedResources", q, unreachable)

    def get_qr(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
        return 200, w.get_queued_resource(p["project"], p["zone"], p["id"])

    def delete_qr(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
        return 200, w.delete_queued_resource(
            p["project"], p["zone"], p["id"], force=_flag(q, "force"), request_id=q.get("requestId")
        )

    def reset_qr(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
        return 200, w.reset_queued_resource(p["project"], p["zone"], p["id"])

    def create_node(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
        return 200, w.create_node(
            p["project"], p["zone"], q.get("nodeId"), b, request_id=q.get("requestId"), api_version=p["version"]
        )

    def list_nodes(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
        items, unreachable = w.list_nodes(p["project"], p["zone"])
        return _page(items, "nodes", q, unreachable)

    def get_node(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
        return 200, w.get_node(p["project"], p["zone"], p["id"])

    def delete_node(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
        return 200, w.delete_node(p["project"], p["zone"], p["id"], request_id=q.get("requestId"))

    def update_node(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
        return 200, w.update_node(p["project"], p["zone"], p["id"], b or {}, q.get("updateMask", ""))

    def stop_node(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
        return 200, w.stop_node(p["project"], p["zone"], p["id"])

    def start_node(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
        return 200, w.start_node(p["project"], p["zone"], p["id"])

    def guest_attributes(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
        return 200, w.get_guest_attributes(p["project"], p["zone"], p["id"], b if isinstance(b, dict) else {})

    def get_op(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
        return 200, w.get_operation(p["project"], p["zone"], p["id"])

    def list_ops(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
        return _page(w.list_operations(p["project"], p["zone"]), "operations", q)

    def cancel_op(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
        w.cancel_operation(p["project"], p["zone"], p["id"])
        return 200, {}

    def delete_op(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
        w.delete_operation(p["project"], p["zone"], p["id"])
        return 200, {}

    def list_types(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
        return _page(w.accelerator_types(p["project"], p["zone"]), "acceleratorTypes", q)

    def get_type(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
        for item in w.accelerator_types(p["project"], p["zone"]):
            if item["type"] == p["id"]:
                return 200, item
        raise SimApiError(404, f"Accelerator type {p['id']!r} was not found in zone {p['zone']}")

    def list_versions(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
        return _page(w.runtime_versions(p["project"], p["zone"]), "runtimeVersions", q)

    def get_version(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
        for item in w.runtime_versions(p["project"], p["zone"]):
            if item["version"] == p["id"]:
                return 200, item
        raise SimApiError(404, f"Runtime version {p['id']!r} was not found in zone {p['zone']}")

    def list_locations(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
        return _page(w.locations(p["project"]), "locations", q)

    def get_location(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
        return 200, w.location(p["project"], p["zone"])

    def list_reservations(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
        spec = w.scenario.zones.get(p["zone"])
        names = spec.reservations if spec else ()
        parent = f"projects/{p['project']}/locations/{p['zone']}"
        return 200, {"reservations": [{"name": f"{parent}/reservations/{name}"} for name in names]}

    qr = _LOC + r"/queuedResources"
    node = _LOC + r"/nodes"
    ops = _LOC + r"/operations"
    table: list[tuple[str, str, str, RouteHandler]] = [
        ("POST", qr + r"$", "create_queued_resource", create_qr),
        ("GET", qr + r"$", "list_queued_resources", list_qrs),
        ("GET", qr + r"/(?P<id>[^/:]+)$", "get_queued_resource", get_qr),
        ("DELETE", qr + r"/(?P<id>[^/:]+)$", "delete_queued_resource", delete_qr),
        ("POST", qr + r"/(?P<id>[^/:]+):reset$", "reset_queued_resource", reset_qr),
        ("POST", node + r"$", "create_node", create_node),
        ("GET", node + r"$", "list_nodes", list_nodes),
        ("GET", node + r"/(?P<id>[^/:]+)$", "get_node", get_node),
        ("DELETE", node + r"/(?P<id>[^/:]+)$", "delete_node", delete_node),
        ("PATCH", node + r"/(?P<id>[^/:]+)$", "update_node", update_node),
        ("POST", node + r"/(?P<id>[^/:]+):stop$", "stop_node", stop_node),
        ("POST", node + r"/(?P<id>[^/:]+):start$", "start_node", start_node),
        ("POST", node + r"/(?P<id>[^/:]+):getGuestAttributes$", "get_guest_attributes", guest_attributes),
        ("GET", ops + r"$", "list_operations", list_ops),
        ("GET", ops + r"/(?P<id>[^/:]+)$", "get_operation", get_op),
        ("DELETE", ops + r"/(?P<id>[^/:]+)$", "delete_operation", delete_op),
        ("POST", ops + r"/(?P<id>[^/:]+):cancel$", "cancel_operation", cancel_op),
        ("GET", _LOC + r"/acceleratorTypes$", "list_accelerator_types", list_types),
        ("GET", _LOC + r"/acceleratorTypes/(?P<id>[^/:]+)$", "get_accelerator_type", get_type),
        ("GET", _LOC + r"/runtimeVersions$", "list_runtime_versions", list_versions),
        ("GET", _LOC + r"/runtimeVersions/(?P<id>[^/:]+)$", "get_runtime_version", get_version),
        ("GET", _LOC + r"/reservations$", "list_reservations", list_reservations),
        ("GET", _API + r"/locations$", "list_locations", list_locations),
        ("GET", _LOC + r"$", "get_location", get_location),
    ]
    return [(method, re.compile(pattern), name, handler) for method, pattern, name, handler in table]


ROUTES = _routes()
ENDPOINT_NAMES = sorted({name for _, _, name, _ in ROUTES})


def _admin(world: World, method: str, path: str, query: Query, body: Any) -> Result:
    """``/_sim/...`` calls: state, advance, capacity, preempt, reset, faults, invariants, node endpoints."""
    args = body if isinstance(body, dict) else {}
    if method == "GET" and path == "/_sim/state":
        return 200, world.state(events=int(query.get("events", "200") or 200))
    if method == "GET" and path == "/_sim/clock":
        return 200, {"time": world.now().isoformat(), "elapsed_s": world.elapsed_s(), "time_scale": world.time_scale}
    if method == "POST" and path == "/_sim/advance":
        seconds = float(query.get("seconds") or args.get("seconds") or 0)
        now = world.advance(seconds)
        return 200, {"time": now.isoformat(), "elapsed_s": world.elapsed_s()}
    if method == "POST" and path == "/_sim/capacity":
        for name in ("zone", "pool", "chips"):
            if name not in args:
                raise ValueError(
                    f"{name}: required in the JSON body, e.g. {{'zone': 'us-east5-b', 'pool': 'spot', 'chips': 8}}"
                )
        world.set_capacity(
            str(args["zone"]), str(args["pool"]), int(args["chips"]), family=str(args.get("family", "v6e"))
        )
        return 200, world.pool(str(args["zone"]), str(args["pool"]), str(args.get("family", "v6e")))
    if method == "POST" and path == "/_sim/preempt":
        if "zone" not in args:
            raise ValueError("zone: required in the JSON body, with node, queued_resource or instance")
        hit = world.preempt(
            str(args["zone"]),
            node=args.get("node"),
            queued_resource=args.get("queued_resource"),
            instance=args.get("instance"),
        )
        return 200, {"preempted": hit}
    if method == "POST" and path == "/_sim/reset":
        world.reset()
        return 200, {"time": world.now().isoformat()}
    if path == "/_sim/faults":
        if method == "POST":
            world.inject_fault(FaultSpec.model_validate(args))
        elif method == "DELETE":
            world.clear_faults()
        return 200, {"faults": world.faults(), "endpoints": ENDPOINT_NAMES}
    if path == "/_sim/invariants" and method in ("GET", "POST"):
        live: list[str] | None = None
        if "live" in query:
            live = [item for item in query["live"].split(",") if item]
        if isinstance(args.get("live_deployments"), list):
            live = [str(item) for item in args["live_deployments"]]
        max_age = float(query.get("max_leftover_s") or args.get("max_leftover_s") or 600.0)
        return 200, world.invariants(live, max_leftover_s=max_age)
    if method == "GET" and path == "/_sim/billing":
        return 200, world.billing()
    if method == "GET" and path == "/_sim/events":
        return 200, {"events": world.events(int(query.get("since", "0") or 0))}
    match = re.match(r"^/_sim/nodes/(?P<zone>[^/]+)/(?P<node>[^/]+)/endpoint$", path)
    if match and method == "POST":
        if "ip_address" not in args or "port" not in args:
            raise ValueError(
                "ip_address and port: required in the JSON body, e.g. {'ip_address': '127.0.0.1', 'port': 8000}"
            )
        return 200, world.set_node_endpoint(match["zone"], match["node"], str(args["ip_address"]), int(args["port"]))
    raise SimApiError(404, f"No admin call {method} {path}")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "tpu-sim/1"
    disable_nagle_algorithm = True  # headers and body go out in two writes; without this each answer waits ~40 ms
    world: World

    def log_message(self, format: str, *args: Any) -> None:
        _log.debug("%s " + format, self.address_string(), *args)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def _serve(self, method: str) -> None:
        try:
            status, body = self._dispatch(method)
        except SimApiError as exc:
            status, body = exc.http_status, exc.envelope()
        except (ValueError, KeyError, ValidationError) as exc:
            text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
            status, body = 400, SimApiError(400, text).envelope()
        except Exception as exc:
            _log.exception("simulator failed on %s %s", method, self.path)
            status, body = 500, SimApiError(500, f"simulator error: {type(exc).__name__}: {exc}").envelope()
        self._send(status, body)

    def _dispatch(self, method: str) -> Result:
        split = urlsplit(self.path)
        path = unquote(split.path)
        query = {key: values[-1] for key, values in parse_qs(split.query, keep_blank_values=True).items()}
        body = self._read_body()
        if path.startswith("/_sim/"):
            return _admin(self.world, method, path, query, body)
        self._check_auth()
        if path.startswith(COMPUTE_PREFIXES):  # Compute Engine and Cloud Billing Catalog subsets
            return compute_dispatch(self.world, method, path, query, body)
        if path.startswith(QUOTAS_PREFIX):  # Cloud Quotas API subset (quotaInfos of the scenario's quotas)
            answered = quotas_dispatch(self.world, method, path, query)
            if answered is not None:
                return answered
        for route_method, pattern, name, handler in ROUTES:
            if route_method != method:
                continue
            match = pattern.match(path)
            if match is None:
                continue
            fault = self.world.take_fault(name)
            if fault is not None:
                if fault.latency_ms:
                    time.sleep(fault.latency_ms / 1000.0)
                status_name = HTTP_STATUS_NAMES.get(fault.status, "UNKNOWN")
                message = fault.message or {
                    429: "Quota exceeded for quota metric 'Create requests' and limit 'Create requests per minute "
                    "per project': Maximum number of CreateNode requests per minute",
                    500: "Internal error encountered.",
                    503: "The service is currently unavailable.",
                    504: "The request timed out.",
                }.get(fault.status, HTTPStatus(fault.status).phrase)
                raise SimApiError(fault.status, message, status=status_name)
            return handler(self.world, match.groupdict(), query, body)
        raise SimApiError(404, f"Method not found: {method} {path}")

    def _check_auth(self) -> None:
        token = self.world.scenario.auth_token
        if token is None:
            return
        header = self.headers.get("Authorization", "")
        if not header:
            raise SimApiError(401, "Request is missing required authentication credential.")
        if header != f"Bearer {token}":
            raise SimApiError(403, "The caller does not have permission")

    def _read_body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise SimApiError(400, f"Request body too large ({length} bytes; the limit is {MAX_BODY})")
        raw = self.rfile.read(length) if length else b""
        if not raw.strip():
            return {}
        try:
            return json.loads(raw)
        except json.JSONDecodeError as exc:
            raise SimApiError(400, f"Invalid JSON payload received. {exc}") from exc

    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body, separators=(",", ":")).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class SimServer:
    """The simulator on a loopback port, served from a background thread.

    ``port=0`` picks a free port; ``start()`` returns the base URL (``http://127.0.0.1:PORT``).
    With ``world.time_scale > 0`` a ticker keeps virtual time moving between requests.
    """

    def __init__(self, world: World, *, host: str = "127.0.0.1", port: int = 0) -> None:
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError("host: the simulator binds loopback only (127.0.0.1, localhost or ::1)")
        self.world = world
        self._host = host
        self._port = port
        self._httpd: ThreadingHTTPServer | None = None
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()

    @property
    def base_url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("SimServer: call start() first")
        return f"http://{self._host}:{self._httpd.server_address[1]}"

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("SimServer: call start() first")
        return int(self._httpd.server_address[1])

    def start(self) -> str:
        """Bind, serve in a daemon thread and return the base URL."""
        if self._httpd is not None:
            return self.base_url
        handler = type("SimHandler", (_Handler,), {"world": self.world})
        httpd = ThreadingHTTPServer((self._host, self._port), handler)
        httpd.daemon_threads = True
        self._httpd = httpd
        self._stopping.clear()
        serve = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        serve.name = "tpu-sim-http"
        serve.start()
        self._threads = [serve]
        if self.world.time_scale > 0:
            ticker = threading.Thread(target=self._tick, daemon=True, name="tpu-sim-clock")
            ticker.start()
            self._threads.append(ticker)
        _log.info("TPU API simulator for %s on %s", self.world.scenario.project, self.base_url)
        return self.base_url

    def _tick(self) -> None:
        while not self._stopping.wait(0.1):
            self.world.sync()

    def serve_forever(self) -> None:
        """Block until stop() (or Ctrl-C in the CLI)."""
        self.start()
        while not self._stopping.wait(0.5):
            pass

    def stop(self) -> None:
        """Stop serving and join the threads."""
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads = []

    def __enter__(self) -> SimServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

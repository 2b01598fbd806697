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

from localcloud.tpu_sim.advice import booked_reservations
from localcloud.tpu_sim.compute_wire import COMPUTE_PREFIXES, compute_dispatch
from localcloud.tpu_sim.quotas_wire import QUOTAS_PREFIX, quotas_dispatch
from localcloud.tpu_sim.routing import compile_routes, find_route
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
AdminHandler = Callable[[World, dict[str, str], Query, dict[str, Any]], Result]


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


# TPU API handlers: (world, path params, query, body) -> (status, body).


def _create_qr(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    return 200, w.create_queued_resource(
        p["project"],
        p["zone"],
        q.get("queuedResourceId"),
        b,
        request_id=q.get("requestId"),
        api_version=p["version"],
    )


def _list_qrs(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    items, unreachable = w.list_queued_resources(p["project"], p["zone"])
    return _page(items, "queuedResources", q, unreachable)


def _get_qr(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    return 200, w.get_queued_resource(p["project"], p["zone"], p["id"])


def _delete_qr(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    return 200, w.delete_queued_resource(
        p["project"], p["zone"], p["id"], force=_flag(q, "force"), request_id=q.get("requestId")
    )


def _reset_qr(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    return 200, w.reset_queued_resource(p["project"], p["zone"], p["id"])


def _create_node(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    return 200, w.create_node(
        p["project"], p["zone"], q.get("nodeId"), b, request_id=q.get("requestId"), api_version=p["version"]
    )


def _list_nodes(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    items, unreachable = w.list_nodes(p["project"], p["zone"])
    return _page(items, "nodes", q, unreachable)


def _get_node(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    return 200, w.get_node(p["project"], p["zone"], p["id"])


def _delete_node(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    return 200, w.delete_node(p["project"], p["zone"], p["id"], request_id=q.get("requestId"))


def _update_node(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    return 200, w.update_node(p["project"], p["zone"], p["id"], b or {}, q.get("updateMask", ""))


def _stop_node(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    return 200, w.stop_node(p["project"], p["zone"], p["id"])


def _start_node(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    return 200, w.start_node(p["project"], p["zone"], p["id"])


def _guest_attributes(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    return 200, w.get_guest_attributes(p["project"], p["zone"], p["id"], b if isinstance(b, dict) else {})


def _get_op(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    return 200, w.get_operation(p["project"], p["zone"], p["id"])


def _list_ops(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    return _page(w.list_operations(p["project"], p["zone"]), "operations", q)


def _cancel_op(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    w.cancel_operation(p["project"], p["zone"], p["id"])
    return 200, {}


def _delete_op(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    w.delete_operation(p["project"], p["zone"], p["id"])
    return 200, {}


def _list_types(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    return _page(w.accelerator_types(p["project"], p["zone"]), "acceleratorTypes", q)


def _get_type(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    for item in w.accelerator_types(p["project"], p["zone"]):
        if item["type"] == p["id"]:
            return 200, item
    raise SimApiError(404, f"Accelerator type {p['id']!r} was not found in zone {p['zone']}")


def _list_versions(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    return _page(w.runtime_versions(p["project"], p["zone"]), "runtimeVersions", q)


def _get_version(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    for item in w.runtime_versions(p["project"], p["zone"]):
        if item["version"] == p["id"]:
            return 200, item
    raise SimApiError(404, f"Runtime version {p['id']!r} was not found in zone {p['zone']}")


def _list_locations(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    return _page(w.locations(p["project"]), "locations", q)


def _get_location(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    return 200, w.location(p["project"], p["zone"])


def _list_reservations(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    spec = w.scenario.zones.get(p["zone"])
    with w.kernel.transaction():
        booked = booked_reservations(w.kernel, p["zone"])
    names = (*spec.reservations, *sorted(booked - set(spec.reservations))) if spec else ()
    parent = f"projects/{p['project']}/locations/{p['zone']}"
    return 200, {"reservations": [{"name": f"{parent}/reservations/{name}"} for name in names]}


_QR = _LOC + r"/queuedResources"
_NODE = _LOC + r"/nodes"
_OPS = _LOC + r"/operations"
_ID = r"/(?P<id>[^/:]+)"

# (method, path pattern, endpoint name used by fault injection, handler). Precedence: the first row whose
# method equals the request's and whose pattern matches wins (routing.py). No two rows overlap today: ids
# exclude "/" and ":", so ".../nodes/N" never takes ".../nodes/N:stop", and ".../locations" (list) never
# takes ".../locations/Z" (get), which is last so it cannot shadow a longer path under a zone.
_TPU_TABLE: list[tuple[str, str, str, RouteHandler]] = [
    ("POST", _QR + r"$", "create_queued_resource", _create_qr),
    ("GET", _QR + r"$", "list_queued_resources", _list_qrs),
    ("GET", _QR + _ID + r"$", "get_queued_resource", _get_qr),
    ("DELETE", _QR + _ID + r"$", "delete_queued_resource", _delete_qr),
    ("POST", _QR + _ID + r":reset$", "reset_queued_resource", _reset_qr),
    ("POST", _NODE + r"$", "create_node", _create_node),
    ("GET", _NODE + r"$", "list_nodes", _list_nodes),
    ("GET", _NODE + _ID + r"$", "get_node", _get_node),
    ("DELETE", _NODE + _ID + r"$", "delete_node", _delete_node),
    ("PATCH", _NODE + _ID + r"$", "update_node", _update_node),
    ("POST", _NODE + _ID + r":stop$", "stop_node", _stop_node),
    ("POST", _NODE + _ID + r":start$", "start_node", _start_node),
    ("POST", _NODE + _ID + r":getGuestAttributes$", "get_guest_attributes", _guest_attributes),
    ("GET", _OPS + r"$", "list_operations", _list_ops),
    ("GET", _OPS + _ID + r"$", "get_operation", _get_op),
    ("DELETE", _OPS + _ID + r"$", "delete_operation", _delete_op),
    ("POST", _OPS + _ID + r":cancel$", "cancel_operation", _cancel_op),
    ("GET", _LOC + r"/acceleratorTypes$", "list_accelerator_types", _list_types),
    ("GET", _LOC + r"/acceleratorTypes" + _ID + r"$", "get_accelerator_type", _get_type),
    ("GET", _LOC + r"/runtimeVersions$", "list_runtime_versions", _list_versions),
    ("GET", _LOC + r"/runtimeVersions" + _ID + r"$", "get_runtime_version", _get_version),
    ("GET", _LOC + r"/reservations$", "list_reservations", _list_reservations),
    ("GET", _API + r"/locations$", "list_locations", _list_locations),
    ("GET", _LOC + r"$", "get_location", _get_location),
]

ROUTES = compile_routes(_TPU_TABLE)
ENDPOINT_NAMES = sorted({route.endpoint for route in ROUTES})

_FAULT_MESSAGES = {
    429: "Quota exceeded for quota metric 'Create requests' and limit 'Create requests per minute "
    "per project': Maximum number of CreateNode requests per minute",
    500: "Internal error encountered.",
    503: "The service is currently unavailable.",
    504: "The request timed out.",
}


def _tpu_dispatch(world: World, method: str, path: str, query: Query, body: Any) -> Result:
    """Route one TPU API call (or refuse it with Google's 404), applying an injected fault first."""
    found = find_route(ROUTES, method, path)
    if found is None:
        raise SimApiError(404, f"Method not found: {method} {path}")
    route, params = found
    fault = world.take_fault(route.endpoint)
    if fault is not None:
        if fault.latency_ms:
            time.sleep(fault.latency_ms / 1000.0)
        status_name = HTTP_STATUS_NAMES.get(fault.status, "UNKNOWN")
        message = fault.message or _FAULT_MESSAGES.get(fault.status, HTTPStatus(fault.status).phrase)
        raise SimApiError(fault.status, message, status=status_name)
    return route.handler(world, params, query, body)


# Admin handlers under /_sim/: (world, path params, query, JSON body or {} when it is not an object).


def _admin_state(w: World, p: dict[str, str], q: Query, args: dict[str, Any]) -> Result:
    return 200, w.state(events=int(q.get("events", "200") or 200))


def _admin_clock(w: World, p: dict[str, str], q: Query, args: dict[str, Any]) -> Result:
    return 200, {"time": w.now().isoformat(), "elapsed_s": w.elapsed_s(), "time_scale": w.time_scale}


def _admin_advance(w: World, p: dict[str, str], q: Query, args: dict[str, Any]) -> Result:
    seconds = float(q.get("seconds") or args.get("seconds") or 0)
    now = w.advance(seconds)
    return 200, {"time": now.isoformat(), "elapsed_s": w.elapsed_s()}


def _admin_capacity(w: World, p: dict[str, str], q: Query, args: dict[str, Any]) -> Result:
    for name in ("zone", "pool", "chips"):
        if name not in args:
            raise ValueError(
                f"{name}: required in the JSON body, e.g. {{'zone': 'us-east5-b', 'pool': 'spot', 'chips': 8}}"
            )
    w.set_capacity(str(args["zone"]), str(args["pool"]), int(args["chips"]), family=str(args.get("family", "v6e")))
    return 200, w.pool(str(args["zone"]), str(args["pool"]), str(args.get("family", "v6e")))


def _admin_preempt(w: World, p: dict[str, str], q: Query, args: dict[str, Any]) -> Result:
    if "zone" not in args:
        raise ValueError("zone: required in the JSON body, with node, queued_resource or instance")
    hit = w.preempt(
        str(args["zone"]),
        node=args.get("node"),
        queued_resource=args.get("queued_resource"),
        instance=args.get("instance"),
    )
    return 200, {"preempted": hit}


def _admin_reset(w: World, p: dict[str, str], q: Query, args: dict[str, Any]) -> Result:
    w.reset()
    return 200, {"time": w.now().isoformat()}


def _admin_faults(w: World, p: dict[str, str], q: Query, args: dict[str, Any]) -> Result:
    return 200, {"faults": w.faults(), "endpoints": ENDPOINT_NAMES}


def _admin_inject_fault(w: World, p: dict[str, str], q: Query, args: dict[str, Any]) -> Result:
    w.inject_fault(FaultSpec.model_validate(args))
    return _admin_faults(w, p, q, args)


def _admin_clear_faults(w: World, p: dict[str, str], q: Query, args: dict[str, Any]) -> Result:
    w.clear_faults()
    return _admin_faults(w, p, q, args)


def _admin_invariants(w: World, p: dict[str, str], q: Query, args: dict[str, Any]) -> Result:
    live: list[str] | None = None
    if "live" in q:
        live = [item for item in q["live"].split(",") if item]
    if isinstance(args.get("live_deployments"), list):
        live = [str(item) for item in args["live_deployments"]]
    max_age = float(q.get("max_leftover_s") or args.get("max_leftover_s") or 600.0)
    return 200, w.invariants(live, max_leftover_s=max_age)


def _admin_billing(w: World, p: dict[str, str], q: Query, args: dict[str, Any]) -> Result:
    return 200, w.billing()


def _admin_events(w: World, p: dict[str, str], q: Query, args: dict[str, Any]) -> Result:
    return 200, {"events": w.events(int(q.get("since", "0") or 0))}


def _admin_node_endpoint(w: World, p: dict[str, str], q: Query, args: dict[str, Any]) -> Result:
    if "ip_address" not in args or "port" not in args:
        raise ValueError(
            "ip_address and port: required in the JSON body, e.g. {'ip_address': '127.0.0.1', 'port': 8000}"
        )
    return 200, w.set_node_endpoint(p["zone"], p["node"], str(args["ip_address"]), int(args["port"]))


def _exact(path: str) -> str:
    """A pattern matching ``path`` and nothing else (not even ``path`` plus a trailing newline)."""
    return "^" + re.escape(path) + r"\Z"


# Same shape as the TPU table; the names label the rows only (admin calls take no injected faults).
# Precedence: table order, as above; the fixed paths are exact, so only the last row is a pattern, and no
# fixed path lies under /_sim/nodes/. /_sim/faults answers every method the server serves (GET and PATCH
# just list). A path or method no row takes is refused with 404 "No admin call METHOD PATH".
_ADMIN_TABLE: list[tuple[str, str, str, AdminHandler]] = [
    ("GET", _exact("/_sim/state"), "_sim.state", _admin_state),
    ("GET", _exact("/_sim/clock"), "_sim.clock", _admin_clock),
    ("POST", _exact("/_sim/advance"), "_sim.advance", _admin_advance),
    ("POST", _exact("/_sim/capacity"), "_sim.capacity", _admin_capacity),
    ("POST", _exact("/_sim/preempt"), "_sim.preempt", _admin_preempt),
    ("POST", _exact("/_sim/reset"), "_sim.reset", _admin_reset),
    ("GET", _exact("/_sim/faults"), "_sim.faults.list", _admin_faults),
    ("POST", _exact("/_sim/faults"), "_sim.faults.inject", _admin_inject_fault),
    ("DELETE", _exact("/_sim/faults"), "_sim.faults.clear", _admin_clear_faults),
    ("PATCH", _exact("/_sim/faults"), "_sim.faults.list", _admin_faults),
    ("GET", _exact("/_sim/invariants"), "_sim.invariants", _admin_invariants),
    ("POST", _exact("/_sim/invariants"), "_sim.invariants", _admin_invariants),
    ("GET", _exact("/_sim/billing"), "_sim.billing", _admin_billing),
    ("GET", _exact("/_sim/events"), "_sim.events", _admin_events),
    ("POST", r"^/_sim/nodes/(?P<zone>[^/]+)/(?P<node>[^/]+)/endpoint$", "_sim.nodes.endpoint", _admin_node_endpoint),
]

ADMIN_ROUTES = compile_routes(_ADMIN_TABLE)


def _admin(world: World, method: str, path: str, query: Query, body: Any) -> Result:
    """``/_sim/...`` calls: state, advance, capacity, preempt, reset, faults, invariants, node endpoints."""
    found = find_route(ADMIN_ROUTES, method, path)
    if found is None:
        raise SimApiError(404, f"No admin call {method} {path}")
    route, params = found
    return route.handler(world, params, query, body if isinstance(body, dict) else {})


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
        """Route by family, in this order: ``/_sim/`` admin calls (no auth), then after the auth check the
        Compute Engine and billing-catalog prefixes (their own 404), the Cloud Quotas ``quotaInfos`` paths
        (other ``/v1/projects/`` paths fall through), and last the TPU API table (404 "Method not found")."""
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
        return _tpu_dispatch(self.world, method, path, query, body)

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

"""HTTP routes of the Compute Engine subset and of the Cloud Billing Catalog subset.

``compute_dispatch(world, method, path, query, body) -> (status, body)`` is shared by the HTTP server and
by in-process callers, so the real ``google-cloud-compute`` and ``google-cloud-billing`` REST clients get
the same JSON either way. Paths (docs/reference/gcp-local.md §5.x)::

    POST|GET  /compute/v1/projects/P/zones/Z/instances            insert (requestId) | list (filter)
    GET|DELETE /compute/v1/projects/P/zones/Z/instances/N         get | delete (requestId)
    POST      /compute/v1/projects/P/zones/Z/instances/N/stop|start
    GET       /compute/v1/projects/P/zones/Z/instances/N/getGuestAttributes  queryPath or variableKey
    GET       /compute/v1/projects/P/aggregated/instances         every zone at once (filter)
    GET       /compute/v1/projects/P/zones/Z/operations[/OP]      zonal operations
    GET       /compute/v1/projects/P/zones/Z/machineTypes[/M]     ct6e-standard-1t/4t/8t …
    GET       /v1/services, /v1/services/6F81-5844-456A/skus      the billing catalog (pageSize, pageToken)
    POST      /compute/v1/projects/P/regions/R/advice/capacity|capacityHistory|calendarMode   (advice_wire.py)
    POST|GET|DELETE /compute/v1/projects/P/zones/Z/futureReservations[/N]                    (advice_wire.py)

Injected faults (``world.inject_fault({"endpoint": "compute.instances.insert", ...})``) use the endpoint
names in :data:`COMPUTE_ENDPOINTS` and answer in Compute Engine's error envelope.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from typing import Any

from localcloud.tpu_sim.advice_wire import ADVICE_TABLE
from localcloud.tpu_sim.compute import ComputeApiError
from localcloud.tpu_sim.routing import compile_routes, find_route
from localcloud.tpu_sim.world import World

__all__ = ["COMPUTE_ENDPOINTS", "COMPUTE_PREFIXES", "COMPUTE_SERVICE_ID", "catalog_skus", "compute_dispatch"]

COMPUTE_PREFIXES = ("/compute/v1/", "/compute/beta/", "/v1/services")  # gcloud beta commands use /beta
COMPUTE_SERVICE_ID = "6F81-5844-456A"

_PROJECT = r"^/compute/(?:v1|beta)/projects/(?P<project>[^/]+)"
_ZONE = _PROJECT + r"/zones/(?P<zone>[^/]+)"
_FAULT_REASONS = {429: "rateLimitExceeded", 500: "backendError", 503: "backendError", 504: "backendError"}
_FAULT_MESSAGES = {
    429: "Quota exceeded for quota metric 'Queries' and limit 'Queries per minute' of service "
    "'compute.googleapis.com'.",
    500: "Internal error. Please try again or contact Google Support.",
    503: "The service is currently unavailable.",
    504: "Deadline exceeded.",
}

# Region -> the city Google's SKU descriptions name.
REGION_CITIES = {
    "us-east5": "Columbus",
    "us-central1": "Iowa",
    "us-east1": "South Carolina",
    "us-east4": "Northern Virginia",
    "us-west1": "Oregon",
    "us-south1": "Dallas",
    "europe-west4": "Netherlands",
    "asia-northeast1": "Tokyo",
    "asia-southeast1": "Singapore",
    "asia-south1": "Mumbai",
    "asia-east1": "Taiwan",
    "southamerica-east1": "Sao Paulo",
    "southamerica-west1": "Santiago",
}
_SKU_DESCRIPTIONS = {
    "flex_start": ("DWS Defined Duration V6e running in {city}", "OnDemand"),
    "spot": ("TpuV6e attached to Spot Preemptible VMs running in {city}", "Preemptible"),
    "on_demand": ("TpuV6e running in {city}", "OnDemand"),
    "reservation": ("Reserved V6e TPU in {city} in Calendar Mode", "Reserved"),
}

Query = dict[str, str]
Result = tuple[int, Any]
Handler = Callable[[World, dict[str, str], Query, Any], Result]


def _page(items: list[Any], key: str, query: Query, size_param: str, default_size: int | None = None) -> Result:
    start = int(query["pageToken"]) if query.get("pageToken", "").isdigit() else 0
    raw = query.get(size_param, "")
    size = int(raw) if raw.isdigit() and int(raw) > 0 else default_size
    chunk = items[start : start + size] if size else items[start:]
    body: dict[str, Any] = {key: chunk}
    if size and start + size < len(items):
        body["nextPageToken"] = str(start + size)
    return 200, body


def _sku_id(description: str) -> str:
    digest = f"{zlib.crc32(description.encode()):08X}{zlib.crc32(description[::-1].encode()) & 0xFFFF:04X}"
    return f"{digest[0:4]}-{digest[4:8]}-{digest[8:12]}"


def _sku(description: str, usage_type: str, region: str, usd: float, effective: str) -> dict[str, Any]:
    units = int(usd)
    nanos = round((usd - units) * 1e9)
    sku_id = _sku_id(description)
    return {
        "name": f"services/{COMPUTE_SERVICE_ID}/skus/{sku_id}",
        "skuId": sku_id,
        "description": description,
        "category": {
            "serviceDisplayName": "Compute Engine",
            "resourceFamily": "Compute",
            "resourceGroup": "TPU" if "V6e" in description else "N2Standard",
            "usageType": usage_type,
        },
        "serviceRegions": [region],
        "pricingInfo": [
            {
                "effectiveTime": effective,
                "summary": "",
                "pricingExpression": {
                    "usageUnit": "h",
                    "displayQuantity": 1,
                    "tieredRates": [
                        {
                            "startUsageAmount": 0,
                            "unitPrice": {"currencyCode": "USD", "units": str(units), "nanos": nanos},
                        }
                    ],
                    "usageUnitDescription": "hour",
                    "baseUnit": "s",
                    "baseUnitDescription": "second",
                    "baseUnitConversionFactor": 3600,
                },
                "currencyConversionRate": 1,
            }
        ],
        "serviceProviderName": "Google",
    }


def catalog_skus(world: World) -> list[dict[str, Any]]:
    """The Compute Engine SKUs the simulated catalog serves: v6e per tier and region, plus unrelated ones.

    Prices are the scenario's (its overrides over the dated table), so the billing meter and the catalog
    agree; ``billing_catalog.omit_tiers`` leaves a tier out entirely.
    """
    scenario = world.scenario
    effective = world.now().strftime("%Y-%m-%dT%H:%M:%S.000Z")
    regions = sorted({zone.rsplit("-", 1)[0] for zone in scenario.zones})
    skus: list[dict[str, Any]] = []
    for region in regions:
        city = REGION_CITIES.get(region, region)
        skus.append(_sku(f"N2 Instance Core running in {city}", "OnDemand", region, 0.031611, effective))
        for tier, (template, usage_type) in _SKU_DESCRIPTIONS.items():
            if tier in scenario.billing_catalog.omit_tiers:
                continue
            skus.append(_sku(template.format(city=city), usage_type, region, scenario.price(region, tier), effective))
        skus.append(_sku(f"Commitment v1: TpuV6e running in {city} for 1 Year", "Commit1Yr", region, 1.89, effective))
    return skus


def _insert(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    return 200, w.compute.insert(p["project"], p["zone"], b, request_id=q.get("requestId"))


def _list_instances(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    items = w.compute.list_instances(p["project"], p["zone"], q.get("filter", ""))
    status, body = _page(items, "items", q, "maxResults")
    return status, {"kind": "compute#instanceList", **body}


def _aggregated(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    return 200, {
        "kind": "compute#instanceAggregatedList",
        "items": w.compute.aggregated(p["project"], q.get("filter", "")),
    }


def _get_instance(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    return 200, w.compute.get(p["project"], p["zone"], p["name"])


def _delete_instance(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    return 200, w.compute.delete(p["project"], p["zone"], p["name"], request_id=q.get("requestId"))


def _stop(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    return 200, w.compute.stop(p["project"], p["zone"], p["name"])


def _start(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    return 200, w.compute.start(p["project"], p["zone"], p["name"])


def _guest_attributes(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    return 200, w.compute.guest_attributes(
        p["project"], p["zone"], p["name"], q.get("queryPath", ""), q.get("variableKey", "")
    )


def _get_op(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    return 200, w.compute.get_operation(p["project"], p["zone"], p["name"])


def _list_ops(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    return _page(w.compute.list_operations(p["project"], p["zone"]), "items", q, "maxResults")


def _machine_types(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    return _page(w.compute.machine_types(p["project"], p["zone"]), "items", q, "maxResults")


def _machine_type(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    return 200, w.compute.machine_type(p["project"], p["zone"], p["name"])


def _services(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    service = {
        "name": f"services/{COMPUTE_SERVICE_ID}",
        "serviceId": COMPUTE_SERVICE_ID,
        "displayName": "Compute Engine",
        "businessEntityName": "businessEntities/GCP",
    }
    return 200, {"services": [service]}


def _skus(w: World, p: dict[str, str], q: Query, b: Any) -> Result:
    if p["service"] != COMPUTE_SERVICE_ID:
        raise ComputeApiError(404, f"Service services/{p['service']} not found", reason="notFound")
    return _page(catalog_skus(w), "skus", q, "pageSize", w.scenario.billing_catalog.page_size)


# (method, path pattern, endpoint name used by fault injection, handler). Precedence: the first row whose
# method equals the request's and whose pattern matches wins (routing.py); no two rows overlap today
# ([^/]+ names stop at "/", so ".../instances/N" never takes ".../instances/N/stop").
_TABLE: list[tuple[str, str, str, Handler]] = [
    ("POST", _ZONE + r"/instances$", "compute.instances.insert", _insert),
    ("GET", _ZONE + r"/instances$", "compute.instances.list", _list_instances),
    ("GET", _ZONE + r"/instances/(?P<name>[^/]+)$", "compute.instances.get", _get_instance),
    ("DELETE", _ZONE + r"/instances/(?P<name>[^/]+)$", "compute.instances.delete", _delete_instance),
    ("POST", _ZONE + r"/instances/(?P<name>[^/]+)/stop$", "compute.instances.stop", _stop),
    ("POST", _ZONE + r"/instances/(?P<name>[^/]+)/start$", "compute.instances.start", _start),
    (
        "GET",
        _ZONE + r"/instances/(?P<name>[^/]+)/getGuestAttributes$",
        "compute.instances.getGuestAttributes",
        _guest_attributes,
    ),
    ("GET", _PROJECT + r"/aggregated/instances$", "compute.instances.aggregatedList", _aggregated),
    ("GET", _ZONE + r"/operations$", "compute.zoneOperations.list", _list_ops),
    ("GET", _ZONE + r"/operations/(?P<name>[^/]+)$", "compute.zoneOperations.get", _get_op),
    ("POST", _ZONE + r"/operations/(?P<name>[^/]+)/wait$", "compute.zoneOperations.wait", _get_op),
    ("GET", _ZONE + r"/machineTypes$", "compute.machineTypes.list", _machine_types),
    ("GET", _ZONE + r"/machineTypes/(?P<name>[^/]+)$", "compute.machineTypes.get", _machine_type),
    ("GET", r"^/v1/services$", "cloudbilling.services.list", _services),
    ("GET", r"^/v1/services/(?P<service>[^/]+)/skus$", "cloudbilling.skus.list", _skus),
    *ADVICE_TABLE,  # advice.capacity, capacityHistory, calendarMode and futureReservations (advice_wire.py)
]

ROUTES = compile_routes(_TABLE)
COMPUTE_ENDPOINTS = sorted({route.endpoint for route in ROUTES})


def compute_dispatch(world: World, method: str, path: str, query: Query, body: Any) -> Result:
    """Route one Compute Engine or billing-catalog call; errors are raised as ``ComputeApiError``."""
    found = find_route(ROUTES, method, path)
    if found is None:
        raise ComputeApiError(
            404, f"The requested URL {method} {path} was not found on this server.", reason="notFound"
        )
    route, params = found
    fault = world.take_fault(route.endpoint)
    if fault is not None:
        if fault.latency_ms:
            time.sleep(fault.latency_ms / 1000.0)
        message = fault.message or _FAULT_MESSAGES.get(fault.status, f"HTTP {fault.status}")
        raise ComputeApiError(fault.status, message, reason=_FAULT_REASONS.get(fault.status, "backendError"))
    return route.handler(world, params, query, body)

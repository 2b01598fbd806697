"""The Cloud Quotas API v1 subset the controller reads: ``quotaInfos`` list and get, from the scenario's quotas.

Paths (the real ``google-cloud-quotas`` REST client sends these)::

    GET /v1/projects/{p}/locations/global/services/{service}/quotaInfos        (pageSize, pageToken)
    GET /v1/projects/{p}/locations/global/services/{service}/quotaInfos/{id}

``tpu.googleapis.com`` answers one QuotaInfo per TPU API quota id in the scenario's ``quotas:`` list, with
one ``dimensionsInfos`` entry per location (``{"zone": …}`` or ``{"region": …}``) carrying the limit in
chips. Other services answer an empty list. Usage is not part of this API (Google serves it from Cloud
Monitoring), so the simulator does not invent it here. Fault injection names: ``cloudquotas.quotaInfos.list``
and ``cloudquotas.quotaInfos.get`` (e.g. a 403 for a caller without ``roles/cloudquotas.viewer``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from localcloud.tpu_sim.wire import HTTP_STATUS_NAMES, SimApiError
from localcloud.tpu_sim.world import World

__all__ = ["QUOTAS_ENDPOINTS", "QUOTAS_PREFIX", "quota_infos", "quotas_dispatch"]

QUOTAS_PREFIX = "/v1/projects/"
TPU_SERVICE = "tpu.googleapis.com"
_BASE = r"^/v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/services/(?P<service>[^/]+)/quotaInfos"
_QUOTA_ID = re.compile(r"^TPU[A-Za-z0-9]+?(?P<preemptible>Preemptible)?PerProjectPer(?P<scope>Zone|Region)ForTPUAPI$")

Query = dict[str, str]
Result = tuple[int, Any]
Handler = Callable[[World, dict[str, str], Query], Result]


def _quota_info(project: str, quota_id: str, entries: list[tuple[str, int]]) -> dict[str, Any]:
    match = _QUOTA_ID.match(quota_id)
    scope = match["scope"].lower() if match else "region"
    kind = "preemptible " if match and match["preemptible"] else ""
    return {
        "name": f"projects/{project}/locations/global/services/{TPU_SERVICE}/quotaInfos/{quota_id}",
        "quotaId": quota_id,
        "metric": f"{TPU_SERVICE}/{quota_id.split('PerProject')[0].lower()}",
        "service": TPU_SERVICE,
        "isPrecise": True,
        "containerType": "PROJECT",
        "dimensions": [scope],
        "metricDisplayName": f"{quota_id.split('PerProject')[0]} {kind}chips",
        "quotaDisplayName": f"{quota_id.split('PerProject')[0]} {kind}chips per project per {scope}",
        "metricUnit": "1",
        "isFixed": False,
        "isConcurrent": False,
        "dimensionsInfos": [
            {"dimensions": {scope: location}, "details": {"value": str(limit)}, "applicableLocations": [location]}
            for location, limit in sorted(entries)
        ],
    }


def quota_infos(world: World, project: str, service: str) -> list[dict[str, Any]]:
    """The QuotaInfo resources of ``service``, sorted by quota id."""
    if service != TPU_SERVICE:
        return []
    grouped: dict[str, list[tuple[str, int]]] = {}
    for spec in world.scenario.quotas:
        grouped.setdefault(spec.id, []).append((spec.location, spec.limit))
    return [_quota_info(project, quota_id, entries) for quota_id, entries in sorted(grouped.items())]


def _check(world: World, params: dict[str, str]) -> None:
    if params["project"] != world.scenario.project:
        raise SimApiError(
            403,
            f"Permission denied on resource project {params['project']} (the simulator serves project "
            f"'{world.scenario.project}')",
        )
    if params["location"] != "global":
        raise SimApiError(400, f"Invalid location {params['location']!r}: QuotaInfo locations must be 'global'")


def _routes() -> list[tuple[re.Pattern[str], str, Handler]]:
    def list_infos(w: World, p: dict[str, str], q: Query) -> Result:
        _check(w, p)
        items = quota_infos(w, p["project"], p["service"])
        start = int(q["pageToken"]) if q.get("pageToken", "").isdigit() else 0
        size = int(q["pageSize"]) if q.get("pageSize", "").isdigit() and int(q["pageSize"]) > 0 else 100
        body: dict[str, Any] = {"quotaInfos": items[start : start + size]}
        if start + size < len(items):
            body["nextPageToken"] = str(start + size)
        return 200, body

    def get_info(w: World, p: dict[str, str], q: Query) -> Result:
        _check(w, p)
        for item in quota_infos(w, p["project"], p["service"]):
            if item["quotaId"] == p["id"]:
                return 200, item
        raise SimApiError(404, f"QuotaInfo {p['id']!r} of service {p['service']} was not found")

    table: list[tuple[str, str, Handler]] = [
        (_BASE + r"$", "cloudquotas.quotaInfos.list", list_infos),
        (_BASE + r"/(?P<id>[^/]+)$", "cloudquotas.quotaInfos.get", get_info),
    ]
    return [(re.compile(pattern), name, handler) for pattern, name, handler in table]


ROUTES = _routes()
QUOTAS_ENDPOINTS = sorted(name for _, name, _ in ROUTES)


def quotas_dispatch(world: World, method: str, path: str, query: Query) -> Result | None:
    """Answer a Cloud Quotas call, or None when ``path`` is not one (so other routes may match)."""
    for pattern, name, handler in ROUTES:
        match = pattern.match(path)
        if match is None:
            continue
        if method != "GET":
            raise SimApiError(405, f"Method {method} is not allowed on {path} (the subset is read-only)")
        fault = world.take_fault(name)
        if fault is not None:
            if fault.latency_ms:
                time.sleep(fault.latency_ms / 1000.0)
            status_name = HTTP_STATUS_NAMES.get(fault.status, "UNKNOWN")
            raise SimApiError(fault.status, fault.message or HTTPStatus(fault.status).phrase, status=status_name)
        return handler(world, match.groupdict(), query)
    return None

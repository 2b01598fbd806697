"""The real Compute Engine adapter with the simulator called in-process: the real client, no sockets.

Why: the chaos suite and the capacity-search benchmark run thousands of reconciles; loopback HTTP would
dominate their time. :class:`InProcessComputeTpu` *is* :class:`~shared.adapters.compute_engine_tpu.ComputeEngineTpu`
with the real google-cloud-compute clients (request building, JSON parsing, error mapping untouched);
only their HTTP session gets a transport adapter that hands each request to
:func:`~localcloud.tpu_sim.compute_wire.compute_dispatch` and wraps the answer in a ``requests.Response``.
Injected faults apply as over HTTP. ``calls`` counts requests by Compute Engine method.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any, cast
from urllib.parse import parse_qs, unquote, urlsplit

import requests
from requests.adapters import BaseAdapter

from localcloud.tpu_sim.compute import ComputeApiError
from localcloud.tpu_sim.compute_wire import ROUTES, compute_dispatch
from localcloud.tpu_sim.world import World
from shared.adapters.compute_engine_tpu import ComputeEngineTpu

__all__ = ["InProcessComputeTpu"]

_BASE = "http://world.invalid"


class _WorldAdapter(BaseAdapter):
    """A ``requests`` transport whose far end is the simulated world."""

    def __init__(self, world: World, calls: Counter[str]) -> None:
        super().__init__()
        self._world = world
        self._calls = calls

    def send(self, request: requests.PreparedRequest, *args: Any, **kwargs: Any) -> requests.Response:
        split = urlsplit(request.url or "")
        path = unquote(split.path)
        query = {key: values[-1] for key, values in parse_qs(split.query, keep_blank_values=True).items()}
        raw = request.body if isinstance(request.body, bytes | str) else b""
        body = json.loads(raw) if raw.strip() else {}
        method = str(request.method)
        for route_method, pattern, name, _ in ROUTES:
            if route_method == method and pattern.match(path):
                self._calls[name] += 1
                break
        try:
            status, answer = compute_dispatch(self._world, method, path, query, body)
        except ComputeApiError as exc:
            status, answer = exc.http_status, exc.envelope()
        response = requests.Response()
        response.status_code = status
        response._content = json.dumps(answer).encode()
        response.headers["Content-Type"] = "application/json; charset=UTF-8"
        response.url = request.url or ""
        response.request = request
        response.encoding = "utf-8"
        return response

    def close(self) -> None:
        return None


class InProcessComputeTpu(ComputeEngineTpu):
    """``ComputeEngineTpu`` on a :class:`World` in this process (for chaos tests and benchmarks)."""

    def __init__(self, world: World, **options: Any) -> None:
        super().__init__(world.scenario.project, endpoint=_BASE, **options)
        self.world = world
        self.calls: Counter[str] = Counter()
        self._adapter = _WorldAdapter(world, self.calls)
        for client in (self.instances, self.operations):
            session = cast(Any, client.transport)._session  # the REST transport's requests session
            session.trust_env = False  # no proxy lookups in the environment on every call (~1 ms each)
            session.mount(_BASE, self._adapter)

"""``CapacityAdvice`` on Compute Engine's ``advice.capacity`` (beta; google-cloud-compute ``AdviceClient``, REST).

Why fail soft: advice only orders the capacity search, so a project without the permission, with the API off
or a beta error must search exactly as it would without advice. The first failure is logged once (a warning
per tick would drown the log); the empty answer is cached like a good one, so a tick asks at most once per
(slice, tier) and TTL. One call per region: the API scores the zones of one region.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials, Credentials
from google.cloud import compute_v1

from shared.domain.backends import machine_type_of
from shared.domain.models import Tier, region_of
from shared.ports import Clock

__all__ = ["PROVISIONING_MODELS", "ComputeCapacityAdvice"]

log = logging.getLogger(__name__)

# FLEX_START advice needs ``scheduling.maxRunDuration``, a field the pinned google-cloud-compute does not have
# yet: flex-start (and reservation) pairs get no advice and keep their place in the order.
PROVISIONING_MODELS = {Tier.ON_DEMAND: "STANDARD", Tier.SPOT: "SPOT"}


class ComputeCapacityAdvice:
    """Capacity advice for one project, cached per (slice, tier, zones) for ``ttl_s`` of the clock's time."""

    def __init__(
        self,
        project: str,
        clock: Clock,
        *,
        endpoint: str | None = None,
        credentials: Credentials | None = None,
        ttl_s: float = 300.0,
        timeout_s: float = 10.0,
    ) -> None:
        self.project = project
        self._clock = clock
        self._endpoint = endpoint
        self._credentials = credentials if credentials is not None or endpoint is None else AnonymousCredentials()
        self._ttl_s = ttl_s
        self._timeout_s = timeout_s
        self._client: compute_v1.AdviceClient | None = None
        self._cache: dict[tuple[str, Tier, tuple[str, ...]], tuple[float, dict[str, float]]] = {}
        self._warned = False

    def obtainability(self, accelerator: str, tier: Tier, zones: Sequence[str]) -> dict[str, float]:
        key = (accelerator, tier, tuple(sorted(zones)))
        now = self._clock.monotonic()
        cached = self._cache.get(key)
        if cached is not None and now - cached[0] < self._ttl_s:
            return cached[1]
        scores = self._ask(accelerator, tier, key[2])
        self._cache[key] = (now, scores)
        return scores

    def _ask(self, accelerator: str, tier: Tier, zones: tuple[str, ...]) -> dict[str, float]:
        machine = machine_type_of(accelerator)
        model = PROVISIONING_MODELS.get(tier)
        if machine is None or model is None or not zones:
            return {}
        scores: dict[str, float] = {}
        for region in sorted({region_of(zone) for zone in zones}):
            in_region = [zone for zone in zones if region_of(zone) == region]
            try:
                scores.update(self._region_scores(region, machine, model, in_region))
            except Exception as exc:
                self._warn_once(exc)
        return scores

    def _region_scores(self, region: str, machine: str, model: str, zones: list[str]) -> dict[str, float]:
        answer = self._advice_client().capacity(
            project=self.project,
            region=region,
            capacity_advice_request_resource=compute_v1.CapacityAdviceRequest(_request(machine, model, zones)),
            timeout=self._timeout_s,
        )
        scores: dict[str, float] = {}
        for recommendation in answer.recommendations:
            for shard in recommendation.shards:
                zone = shard.zone.rsplit("/", 1)[-1]
                scores[zone] = max(scores.get(zone, 0.0), float(recommendation.scores.obtainability))
        return {zone: score for zone, score in scores.items() if zone in zones}

    def _advice_client(self) -> compute_v1.AdviceClient:
        """Built on first use: without credentials the constructor itself fails, which is a soft failure too."""
        if self._client is None:
            options = ClientOptions(api_endpoint=self._endpoint) if self._endpoint else None
            self._client = compute_v1.AdviceClient(credentials=self._credentials, client_options=options)
        return self._client

    def _warn_once(self, exc: Exception) -> None:
        if not self._warned:
            self._warned = True
            log.warning("capacity advice unavailable; the search runs without it: %s", str(exc)[:300])


def _request(machine: str, model: str, zones: list[str]) -> dict[str, Any]:
    return {
        "instance_properties": {"scheduling": {"provisioning_model": model}},
        "instance_flexibility_policy": {"instance_selections": {"slice": {"machine_types": [machine]}}},
        "size": 1,
        "distribution_policy": {"zones": [{"zone": f"zones/{zone}"} for zone in zones]},
    }

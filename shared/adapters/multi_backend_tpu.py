"""One ``TpuApi`` over several back ends: creates go where the request says, lists cover them all.

Why: a deployment spec picks ``tpu-api``, ``compute-engine`` or ``any``, and the planner puts the back end
it chose on every ``ProvisionRequest``; the services keep talking to one port. Resource ids are
deterministic and unique per deployment, so a resource lives in exactly one back end; the router
remembers where it saw each one (create, list, get) and, for a name it has not seen, asks each back end
in turn. A list fails as a whole when one back end fails: reporting only half the resources would make
the planner think the other half vanished.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from shared.domain.boot_progress import GuestAttribute
from shared.domain.cloud import ObservedResource, OperationStatus, ProvisionRequest
from shared.domain.errors import CloudError, ErrorClass
from shared.domain.models import Backend
from shared.ports import TpuApi

__all__ = ["MultiBackendTpu"]

T = TypeVar("T")


class MultiBackendTpu:
    """Routes ``TpuApi`` calls to the TPU API or Compute Engine adapter (either may be absent)."""

    def __init__(self, backends: Mapping[Backend, TpuApi]) -> None:
        unknown = [backend for backend in backends if backend is Backend.ANY]
        if unknown or not backends:
            raise ValueError("backends: map tpu-api and/or compute-engine to an adapter ('any' is not a back end)")
        self._backends = dict(backends)
        self._located: dict[tuple[str, str], Backend] = {}

    @property
    def backends(self) -> tuple[Backend, ...]:
        """The configured back ends, in the order they are asked."""
        return tuple(self._backends)

    def _adapter(self, backend: Backend) -> TpuApi:
        adapter = self._backends.get(backend)
        if adapter is None:
            configured = ", ".join(b.value for b in self._backends)
            raise CloudError(
                ErrorClass.INVALID,
                f"backend: {backend.value!r} is not configured here (configured: {configured}); "
                "choose one of those in the deployment spec",
            )
        return adapter

    def create(self, request: ProvisionRequest) -> OperationStatus:
        if request.backend is Backend.ANY:
            raise CloudError(
                ErrorClass.INVALID, "backend: a request must name tpu-api or compute-engine ('any' is for specs)"
            )
        status = self._adapter(request.backend).create(request)
        self._located[(request.zone, request.resource_id)] = request.backend
        return status

    def get_operation(self, name: str) -> OperationStatus:
        """Compute Engine operations live under ``/zones/``, TPU API ones under ``/locations/``."""
        backend = Backend.COMPUTE_ENGINE if "/zones/" in name else Backend.TPU_API
        return self._adapter(backend).get_operation(name)

    def _order(self, zone: str, resource_id: str) -> list[Backend]:
        known = self._located.get((zone, resource_id))
        ordered = [known] if known in self._backends else []
        return ordered + [backend for backend in self._backends if backend not in ordered]

    def _first(self, zone: str, resource_id: str, call: Callable[[TpuApi], T | None]) -> T | None:
        for backend in self._order(zone, resource_id):
            result = call(self._backends[backend])
            if result is not None:
                self._located[(zone, resource_id)] = backend
                return result
        self._located.pop((zone, resource_id), None)
        return None

    def get(self, zone: str, resource_id: str) -> ObservedResource | None:
        return self._first(zone, resource_id, lambda api: api.get(zone, resource_id))

    def list(self, zone: str = "-") -> list[ObservedResource]:
        observed: list[ObservedResource] = []
        for backend, adapter in self._backends.items():
            found = adapter.list(zone)
            for item in found:
                self._located[(item.zone, item.name)] = backend
            observed += found
        return observed

    def delete(
        self, zone: str, resource_id: str, *, force: bool, request_id: str | None = None
    ) -> OperationStatus | None:
        return self._first(
            zone, resource_id, lambda api: api.delete(zone, resource_id, force=force, request_id=request_id)
        )

    def _node_call(self, zone: str, node_id: str, call: Callable[[TpuApi], T]) -> T:
        """Ask where the node was seen first, then the others; NOT_FOUND everywhere raises the last one."""
        last: CloudError | None = None
        for backend in self._order(zone, node_id):
            try:
                result = call(self._backends[backend])
                self._located[(zone, node_id)] = backend
                return result
            except CloudError as exc:
                if exc.error_class is not ErrorClass.NOT_FOUND:
                    raise
                last = exc
        assert last is not None
        raise last

    def stop_node(self, zone: str, node_id: str) -> OperationStatus:
        return self._node_call(zone, node_id, lambda api: api.stop_node(zone, node_id))

    def start_node(self, zone: str, node_id: str) -> OperationStatus:
        return self._node_call(zone, node_id, lambda api: api.start_node(zone, node_id))

    def guest_attributes(self, zone: str, node_id: str, query_path: str) -> Sequence[GuestAttribute]:
        return self._node_call(zone, node_id, lambda api: api.guest_attributes(zone, node_id, query_path))

    def close(self) -> None:
        """Close every back end that holds connections."""
        for adapter in self._backends.values():
            closer = getattr(adapter, "close", None)
            if callable(closer):
                closer()

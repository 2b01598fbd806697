"""The gateway's composition root: its ports built from settings, the embedded stack for ``backend=local``,
Google Cloud for ``gcp``.

Adapters are imported and built on first use (``_Deferred``), so the server answers ``tools/list`` before any
SDK is loaded or any client connects; the store, bus and secrets come from ``shared.wiring.Runtime`` so the
gateway opens the same files (locally) and projects (on Google Cloud) as the rest of the controller.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from mcp_client_gateway.capabilities.common import GatewayPorts, PriceLookup
from shared.config import Settings
from shared.ports import (
    CalendarReservations,
    Clock,
    CommandBus,
    DebugBundles,
    LogReader,
    ModelClient,
    QuotaApi,
    SecretStore,
    StateStore,
    TpuApi,
)
from shared.wiring import Runtime

__all__ = ["build_ports", "local_log_dir", "warm_up"]

log = logging.getLogger(__name__)


class _Deferred:
    """Stands in for an adapter and builds it on first attribute access (thread-safe, once)."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self._factory = factory
        self._target: Any = None
        self._lock = threading.Lock()

    @property
    def built(self) -> bool:
        return self._target is not None

    def resolve(self) -> Any:
        if self._target is None:
            with self._lock:
                if self._target is None:
                    self._target = self._factory()
        return self._target

    def __getattr__(self, name: str) -> Any:
        return getattr(self.resolve(), name)


def local_log_dir(settings: Settings) -> Path:
    """Where the local stack writes its JSON-lines logs (``JsonLinesLogReader`` documents the layout)."""
    return Path(settings.data_dir) / "logs"


def build_ports(settings: Settings) -> GatewayPorts:
    """The ports for ``settings.backend``; nothing is connected until a tool needs it.

    A ``local`` backend with no TPU endpoint of its own attaches to the stack ``make up`` published under its
    data folder (``shared/adapters/local_stack.py``); with none running, the TPU and quota ports say so.
    """
    from shared.adapters.local_stack import NoLocalStack, attach, needs_local_stack

    settings = attach(settings)
    runtime = Runtime(settings)
    no_stack = needs_local_stack(settings)

    def bus() -> CommandBus:
        built = runtime.bus
        if settings.backend == "local":  # the embedded bus drops publishes to unknown topics
            built.ensure_topic(settings.topic_commands)
        return built

    def logs() -> LogReader:
        if settings.backend == "gcp":
            from shared.adapters.cloud_logging import CloudLoggingReader

            return CloudLoggingReader(runtime.project, endpoint=settings.logging_endpoint)
        from shared.adapters.local_logs import JsonLinesLogReader

        return JsonLinesLogReader(local_log_dir(settings))

    def quotas() -> QuotaApi:
        if no_stack:
            return cast(QuotaApi, NoLocalStack())
        # Built here, not in shared.wiring: only the gateway reads quota, so no function ships the client.
        from shared.adapters.cloud_quotas import CloudQuotas

        return CloudQuotas(runtime.project, endpoint=settings.tpu_endpoint)

    def model_client() -> ModelClient:
        from shared.adapters.openai_client import OpenAiCompatibleClient

        return OpenAiCompatibleClient()

    def debug_bundles() -> DebugBundles:
        built = runtime.debug_bundles()
        if built is None:  # bundles_configured below says when there is none; this only guards a disagreement
            raise RuntimeError("no debug-bundle store is configured (set TPUCTL_DEBUG_BUNDLE_BUCKET)")
        return built

    # On Google Cloud bundles need the installation's bucket (Terraform's debug_bundle_bucket output).
    bundles_configured = settings.backend != "gcp" or bool(settings.debug_bundle_bucket)
    deferred = {
        "store": _Deferred(lambda: runtime.store),
        "bus": _Deferred(bus),
        "secrets": _Deferred(lambda: runtime.secrets),
        "quotas": _Deferred(quotas),
        "tpu": _Deferred(lambda: cast(TpuApi, NoLocalStack()) if no_stack else runtime.tpu),
    }
    ports = GatewayPorts(
        settings=settings,
        store=cast(StateStore, deferred["store"]),
        bus=cast(CommandBus, deferred["bus"]),
        secrets=cast(SecretStore, deferred["secrets"]),
        clock=cast(Clock, _Deferred(lambda: runtime.clock)),
        logs=cast(LogReader, _Deferred(logs)),
        model_client=cast(ModelClient, _Deferred(model_client)),
        quotas=cast(QuotaApi, deferred["quotas"]),
        tpu=cast(TpuApi, deferred["tpu"]),
        prices=None if no_stack else cast(PriceLookup, _Deferred(lambda: runtime.prices)),
        debug_bundles=cast(DebugBundles, _Deferred(debug_bundles)) if bundles_configured else None,
        calendar=cast(CalendarReservations, _Deferred(lambda: NoLocalStack() if no_stack else runtime.calendar)),
        weights_cache=runtime.weights_cache_state() if settings.weights_cache_buckets else None,
    )
    for proxy in deferred.values():
        ports.closers.append(_closer(proxy))
    if settings.endpoint_access == "iap":
        # From a workstation: live calls reach the VM through IAP TCP forwarding (docs/deploy.md). Closed first.
        from shared.adapters.iap_tunnel import IapTunnels, tpu_vm_instance

        tunnels = IapTunnels(project=settings.project, instance_of=tpu_vm_instance(cast(TpuApi, deferred["tpu"])))
        ports.endpoint_access = tunnels
        ports.closers.append(tunnels.close)
    return ports


def _closer(proxy: _Deferred) -> Callable[[], None]:
    def close() -> None:
        if proxy.built:
            closing = getattr(proxy.resolve(), "close", None)
            if callable(closing):
                closing()

    return close


def warm_up(ports: GatewayPorts) -> None:
    """Build the adapters and make one read ahead of the first call; a failure here is reported by that call."""
    for port in (ports.store, ports.bus, ports.secrets, ports.clock):
        if isinstance(port, _Deferred):
            try:
                port.resolve()
            except Exception:
                log.debug("warm-up could not build a port; the first tool call will report it", exc_info=True)
    try:
        ports.store.list_deployments()  # opens this worker thread's connection, as the first read would
    except Exception:
        log.debug("warm-up read failed; the first tool call will report it", exc_info=True)

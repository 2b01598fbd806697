"""Keep a debug bundle of the serving engine: capture it (``node_agent.forensics``) and store it (``DebugBundles``).

Why a module of its own: the agent calls it before every ``serving.restart`` and for every ``serving.debug``, and
neither may fail because of it. A restart must go ahead even when the bundle could not be captured or stored
(the engine is sick; waiting on forensics would keep it sick), so :meth:`BundleKeeper.keep` never raises: it
says in its ``detail`` what was kept, or why nothing was. The bundle's name is the task's own
(``shared.domain.debug_bundle.bundle_object_name``), the one name the controller will link to that task.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from node_agent.forensics import ForensicsSources, capture_bundle, encode_bundle, find_py_spy
from shared.domain.debug_bundle import bundle_object_name
from shared.logging import redact
from shared.ports import Clock, DebugBundles, ServingContainer

if TYPE_CHECKING:
    from shared.wiring import Runtime

__all__ = ["BundleKeeper", "KeptBundle", "metadata_base_url", "node_bundle_keeper"]

log = logging.getLogger("tpuctl.node_agent")


@dataclass(frozen=True)
class KeptBundle:
    """``name`` is empty when nothing was stored; ``detail`` says where it went or why not, for the task's answer."""

    name: str
    detail: str


class BundleKeeper:
    """Captures and stores bundles for one deployment's node."""

    def __init__(
        self,
        sources: ForensicsSources,
        store: DebugBundles | None,
        *,
        deployment_id: str,
        node: str,
        clock: Clock,
        deadline_s: float = 60.0,
    ) -> None:
        self.sources = sources
        self.store = store
        self.deployment_id = deployment_id
        self.node = node
        self.clock = clock
        self.deadline_s = deadline_s

    def keep(self, task_id: str, reason: str) -> KeptBundle:
        """Capture a bundle named after ``task_id`` and store it; never raises (see the module docstring)."""
        if self.store is None:
            return KeptBundle(
                "", "no debug bundle kept: this installation has no bundle bucket (TPUCTL_DEBUG_BUNDLE_BUCKET)"
            )
        name = bundle_object_name(self.deployment_id, task_id)
        try:
            bundle = capture_bundle(
                self.sources,
                deployment_id=self.deployment_id,
                bundle_id=task_id,
                reason=reason,
                node=self.node,
                captured_at=self.clock.now(),
                deadline_s=self.deadline_s,
            )
            location = self.store.put(name, encode_bundle(bundle))
        except Exception as exc:  # evidence gathering must never stop the restart it precedes
            log.exception("debug bundle %s could not be kept", name)
            return KeptBundle("", redact(f"no debug bundle kept: {type(exc).__name__}: {exc}")[:500])
        log.info("debug bundle kept at %s", location)
        return KeptBundle(name, f"debug bundle {location} ({_summary(bundle)})")


def _summary(bundle: dict[str, object]) -> str:
    """``2 process(es), 37 thread stack(s), 200 log line(s)``: what a person learns from the task's detail."""
    processes = bundle.get("processes")
    processes = processes if isinstance(processes, list) else []
    threads = sum(len(p.get("threads") or []) for p in processes if isinstance(p, dict))
    lines = bundle.get("log_tail")
    line_count = len(lines) if isinstance(lines, list) else 0
    return f"{len(processes)} process(es), {threads} thread stack(s), {line_count} log line(s)"


def node_bundle_keeper(
    runtime: Runtime, container: ServingContainer, *, deployment_id: str, vllm_url: str, api_key: str | None, node: str
) -> BundleKeeper:
    """The keeper ``python -m node_agent.agent`` runs with: its deployment's bucket written as the VM, py-spy
    from the bundle, and the VM's metadata server for the boot's guest attributes (none off Google Cloud)."""
    settings = runtime.settings
    sources = ForensicsSources(
        container=container,
        vllm_url=vllm_url,
        api_key=api_key,
        metadata_url=metadata_base_url() if settings.backend == "gcp" else None,
        py_spy=find_py_spy(),
    )
    return BundleKeeper(
        sources, runtime.debug_bundles(as_node=True), deployment_id=deployment_id, node=node, clock=runtime.clock
    )


def metadata_base_url(host: str | None = None) -> str:
    """The VM's metadata server, ``GCE_METADATA_HOST`` first as google-auth reads it (the VM twin sets it)."""
    host = host or os.environ.get("GCE_METADATA_HOST") or "metadata.google.internal"
    return f"http://{host}/computeMetadata/v1"

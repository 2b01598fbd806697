"""A deployment whose slice is ACTIVE and whose vLLM does not answer yet, with a monitor on the same simulated world:
the node's guest attributes are written as its metadata server would, and what the monitor publishes is kept."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.adapters.local_bus import LocalBus
from shared.adapters.vllm_probe import VllmProbe
from shared.domain.models import DeploymentRecord, DeploymentSpec, Phase, QueuedResourceState, ResourceRef
from shared.messages import decode_message
from shared.services.monitor import Monitor, MonitorSettings, TickReport
from tests.support.emulators import free_loopback_port
from tests.support.provisioner_harness import Harness

__all__ = ["Booting", "start_booting"]

TOPICS = {"commands": "tpuctl-commands", "events": "tpuctl-events", "ticks": "tpuctl-ticks"}


@dataclass
class Booting:
    h: Harness
    bus: LocalBus
    monitor: Monitor
    node: ResourceRef

    def write(self, phase: str, detail: str, boot: str = "1767355200000") -> None:
        for key, value in (("detail", detail), ("phase", phase), ("boot", boot)):
            self.h.world.put_guest_attribute(self.node.zone, self.node.name, "tpuctl", key, value)

    def tick(self, advance_s: float = 60.0) -> TickReport:
        self.h.world.advance(advance_s)
        return self.monitor.tick()

    def record(self) -> DeploymentRecord:
        return self.h.record()

    def published(self, topic: str) -> list[Any]:
        got: list[Any] = []
        self.bus.drain(f"{topic}-probe", lambda delivery: got.append(decode_message(delivery.data)))
        return got


def start_booting(h: Harness, tmp_path: Path, spec: DeploymentSpec) -> Booting:
    """Create ``spec``, run the provisioner until its slice is ACTIVE (BOOTING), point the node at a port nobody
    listens on, and put a monitor with its own bus on the same world. Close ``bus`` when done."""
    h.create(spec)
    h.run_until_phase(Phase.BOOTING, minutes=30)
    node = next(r for r in h.record().status.resources if r.state is QueuedResourceState.ACTIVE)
    h.world.set_node_endpoint(node.zone, node.name, "127.0.0.1", free_loopback_port())  # refused: still booting
    h.tick()
    bus = LocalBus(tmp_path / f"bus-{spec.deployment_id}.db", clock=h.clock)
    for logical, topic in TOPICS.items():
        bus.ensure_topic(topic)
        bus.ensure_subscription(topic, f"{logical}-probe")
    settings = MonitorSettings(
        topic_commands=TOPICS["commands"], topic_events=TOPICS["events"], topic_ticks=TOPICS["ticks"]
    )
    probe = VllmProbe(timeout_s=1.0, connect_timeout_s=0.5)
    return Booting(h, bus, Monitor(h.store, probe, bus, h.clock, settings, tpu=h.tpu), node)

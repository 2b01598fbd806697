"""The monitor's settings and what one tick reports (kept apart so the tick's steps read in one sitting)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime

from shared.domain.models import DeploymentRecord, Phase

__all__ = [
    "DeploymentReport",
    "MonitorSettings",
    "TickReport",
    "activity_write_s",
    "history_window_s",
    "id_hash",
    "refresh_after_s",
]


@dataclass(frozen=True)
class MonitorSettings:
    """Knobs of the monitor service; the entry point builds it from ``shared.config.Settings``."""

    max_concurrency: int = 32
    """Probes in flight at once (each is up to four HTTP requests)."""
    probe_timeout_s: float = 10.0
    """Upper bound on one whole probe, on top of the probe's own per-request timeouts."""
    min_sample_interval_s: float = 10.0
    """A deployment sampled more recently than this is skipped (a redelivered tick is a no-op)."""
    record_refresh_s: float = 900.0
    """Without a phase change, a record's stored SLIs are rewritten after this (to 2x, spread per deployment);
    the live SLIs are in the samples, so a steady tick writes one batch and almost no records."""
    history_limit: int = 16
    """Samples read per deployment: the previous counters and the evidence for sustained conditions."""
    sample_ttl_days: int = 14
    """Samples carry ``expire_at`` = taken_at + this (Firestore TTL; the SQLite store purges)."""
    canary_interval_s: float = 0.0
    """Idle this long (no traffic, no canary): one canary completion, at most this often. 0: none (the deployed
    monitor takes ``Settings.monitor_canary_interval_s``, 300 s by default)."""
    telemetry_max_age_s: float = 180.0
    """The node agent's TPU reading (guest attribute ``tpuctl/telemetry``, written every 30 s) is kept in the
    sample only when younger than this: a dead agent's last numbers would read as a live chip."""
    telemetry_reads_per_tick: int = 20
    """About this many serving nodes have their guest attributes (telemetry) read per tick; more take turns by
    hash (uneven buckets: a turn may hold a few more); booting nodes are always read."""
    topic_commands: str = "tpuctl-commands"
    topic_events: str = "tpuctl-events"
    topic_ticks: str = "tpuctl-ticks"

    def __post_init__(self) -> None:
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency: {self.max_concurrency} must be >= 1")
        if self.probe_timeout_s <= 0:
            raise ValueError(f"probe_timeout_s: {self.probe_timeout_s} must be > 0")
        if self.history_limit < 1:
            raise ValueError(f"history_limit: {self.history_limit} must be >= 1")
        if self.telemetry_reads_per_tick < 1:
            raise ValueError(f"telemetry_reads_per_tick: {self.telemetry_reads_per_tick} must be >= 1")
        if self.telemetry_max_age_s <= 0:
            raise ValueError(f"telemetry_max_age_s: {self.telemetry_max_age_s} must be > 0 seconds")
        if self.min_sample_interval_s < 0 or self.record_refresh_s < 0 or self.canary_interval_s < 0:
            raise ValueError("min_sample_interval_s, record_refresh_s, canary_interval_s: must be >= 0 seconds")

    def topic(self, logical: str) -> str:
        return {"commands": self.topic_commands, "events": self.topic_events, "ticks": self.topic_ticks}[logical]


@dataclass
class DeploymentReport:
    """What one tick did for one deployment."""

    deployment_id: str
    previous: Phase
    phase: Phase
    probe: str
    reason: str
    published: list[str] = field(default_factory=list)
    record_written: bool = False
    conflict: bool = False


@dataclass
class TickReport:
    """What one tick did overall (returned to the entry point and logged)."""

    taken_at: datetime
    deployments: list[DeploymentReport] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    samples_written: int = 0
    sample_batches: int = 0
    record_writes: int = 0
    conflicts: int = 0
    publish_failures: int = 0
    metric_points: int = 0  # points written as time series (MetricWriter)
    metric_failures: int = 0  # batches the MetricWriter refused; the samples in the store are unaffected
    duration_s: float = 0.0

    @property
    def probed(self) -> int:
        return len(self.deployments)

    @property
    def phase_changes(self) -> dict[str, tuple[Phase, Phase]]:
        return {r.deployment_id: (r.previous, r.phase) for r in self.deployments if r.previous is not r.phase}

    @property
    def published(self) -> list[tuple[str, str]]:
        return [(kind, r.deployment_id) for r in self.deployments for kind in r.published]

    def summary(self) -> str:
        changes = ", ".join(f"{d}: {a.value}->{b.value}" for d, (a, b) in sorted(self.phase_changes.items()))
        return (
            f"probed {self.probed}, skipped {len(self.skipped)}, {self.samples_written} sample(s) in "
            f"{self.sample_batches} batch(es), {self.record_writes} record write(s), {self.conflicts} conflict(s), "
            f"{len(self.published)} message(s) published in {self.duration_s:.2f} s"
            + (f"; {changes}" if changes else "")
        )


def id_hash(deployment_id: str) -> int:
    """A fixed 32-bit number per deployment, to spread per-deployment work over time."""
    return int(hashlib.sha256(deployment_id.encode()).hexdigest()[:8], 16)


def history_window_s(record: DeploymentRecord) -> float:
    thresholds = record.spec.health
    return max(thresholds.stall_after_s, thresholds.kv_saturated_after_s, thresholds.queued_after_s) + 600.0


def activity_write_s(record: DeploymentRecord, settings: MonitorSettings) -> float:
    """How stale ``last_request_at`` may get under traffic: a quarter of the idle window, at most the refresh."""
    if not record.spec.idle_minutes:
        return settings.record_refresh_s
    return min(settings.record_refresh_s, record.spec.idle_minutes * 60 / 4)


def refresh_after_s(deployment_id: str, settings: MonitorSettings) -> float:
    """``record_refresh_s`` stretched by a fixed per-deployment share (up to 2x), so a fleet that changed phase
    together does not rewrite every record in the same later tick."""
    share = id_hash(deployment_id) / 2**32
    return settings.record_refresh_s * (1.0 + share)

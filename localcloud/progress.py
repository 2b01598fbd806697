"""Live progress of deployments as lines a person reads: each capacity attempt and why it ended, phase changes,
and what the node runtime did (boot, vLLM ready, stop).

``ProgressTracker.poll()`` compares what the store and the node runtime hold now with what it reported before and
returns only the new lines, so a caller can print them as they come (``python -m localcloud up``, the demo) or
keep them as a transcript (the end-to-end test).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from localcloud.vm_twin.vm import VmFleet
from shared.domain.attempts import Step, outcome_text
from shared.domain.models import AttemptLog, DeploymentRecord
from shared.ports import StateStore

__all__ = ["ProgressLine", "ProgressTracker", "describe_attempt", "hunt_summary"]


@dataclass(frozen=True)
class ProgressLine:
    """One thing that happened: when (virtual time), to which deployment, what kind, and the text."""

    at: datetime | None
    deployment_id: str
    kind: str  # attempt, phase, node
    text: str

    def render(self) -> str:
        stamp = f"{self.at:%H:%M:%S}" if self.at is not None else "--:--:--"
        return f"[{stamp}] {self.deployment_id:<12} {self.text}"


def describe_attempt(attempt: AttemptLog) -> str:
    """``us-east5-b spot: gave up: … (stockout)`` style text for one attempt log entry."""
    outcome = outcome_text(attempt.outcome)
    detail = attempt.detail.strip()
    if attempt.outcome is Step.REQUESTED:
        return f"{attempt.zone} {attempt.tier.value}: requested {detail}"
    if attempt.outcome in (Step.EXPIRED, Step.GAVE_UP):
        return f"{attempt.zone} {attempt.tier.value}: {outcome}"
    text = f"{attempt.zone} {attempt.tier.value}: {outcome}"
    return f"{text} ({detail})" if detail else text


@dataclass
class ProgressTracker:
    """Reports what changed since the last ``poll()``."""

    store: StateStore
    nodes: VmFleet | None = None
    deployment_ids: tuple[str, ...] | None = None
    _attempts: set[tuple[str, str, str, str, str, str]] = field(default_factory=set)
    _phases: dict[str, str] = field(default_factory=dict)
    _node_states: dict[tuple[str, str], str] = field(default_factory=dict)
    transcript: list[ProgressLine] = field(default_factory=list)
    attempts: list[tuple[str, AttemptLog]] = field(default_factory=list)
    """Every attempt seen, in order, with its deployment id (for summaries)."""

    def poll(self, now: datetime | None = None) -> list[ProgressLine]:
        lines: list[ProgressLine] = []
        for record in self.store.list_deployments(include_deleted=True):
            if self.deployment_ids is not None and record.deployment_id not in self.deployment_ids:
                continue
            lines += self._attempt_lines(record)
            lines += self._phase_line(record)
        lines += self._node_lines(now)
        self.transcript += lines
        return lines

    def _attempt_lines(self, record: DeploymentRecord) -> list[ProgressLine]:
        lines = []
        for attempt in record.status.attempts:
            key = (
                record.deployment_id,
                attempt.at.isoformat(),
                attempt.zone,
                attempt.tier.value,
                attempt.outcome,
                attempt.detail,
            )
            if key in self._attempts:
                continue
            self._attempts.add(key)
            self.attempts.append((record.deployment_id, attempt))
            lines.append(ProgressLine(attempt.at, record.deployment_id, "attempt", describe_attempt(attempt)))
        return lines

    def _phase_line(self, record: DeploymentRecord) -> list[ProgressLine]:
        status = record.status
        phase = status.phase.value
        if self._phases.get(record.deployment_id) == phase:
            return []
        previous = self._phases.get(record.deployment_id)
        self._phases[record.deployment_id] = phase
        arrow = f"{previous} -> {phase}" if previous else phase
        message = f": {status.message[:160]}" if status.message else ""
        return [ProgressLine(status.phase_since, record.deployment_id, "phase", f"phase {arrow}{message}")]

    def _node_lines(self, now: datetime | None) -> list[ProgressLine]:
        if self.nodes is None:
            return []
        lines = []
        for node in self.nodes.history():
            key = (node.zone, node.node_id)
            if self._node_states.get(key) == node.state:
                continue
            self._node_states[key] = node.state
            where = f"node {node.zone}/{node.node_id}"
            if node.state == "booting":
                text = f"{where}: VM powered on, its startup script runs (endpoint 127.0.0.1:{node.port})"
            elif node.state == "serving":
                text = f"{where}: vLLM up after {node.boot_s:.0f} s wall"
            elif node.state == "failed":
                text = f"{where}: boot failed ({node.detail})"
            else:
                text = f"{where}: VM powered off ({node.detail})"
            lines.append(ProgressLine(now, node.deployment_id, "node", text))
        return lines


_QUIET = frozenset({Step.REQUESTED, Step.DELETING, Step.DELETED, Step.ADOPTED})


def hunt_summary(attempts: list[AttemptLog]) -> list[tuple[str, int, list[str]]]:
    """Per (zone, tier), in the order first tried: requests made and how each ended (a hedge loser says so)."""
    order: list[str] = []
    requests: dict[str, int] = {}
    outcomes: dict[str, list[str]] = {}
    for attempt in attempts:
        pair = f"{attempt.zone} {attempt.tier.value}"
        if pair not in requests:
            order.append(pair)
            requests[pair] = 0
            outcomes[pair] = []
        if attempt.outcome is Step.REQUESTED:
            requests[pair] += 1
            continue
        if attempt.outcome is Step.DELETING and attempt.detail.startswith("capacity found in "):
            why = f"hedge: dropped, {attempt.detail}"
        elif attempt.outcome in _QUIET:
            continue
        else:
            why = outcome_text(attempt.outcome)
        if why not in outcomes[pair]:
            outcomes[pair].append(why)
    return [(pair, requests[pair], outcomes[pair]) for pair in order]

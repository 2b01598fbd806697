"""The local cloud's invariant report: what must hold after any run, checked from the outside.

* **no orphans**: no TPU resource whose deployment is gone or unlabelled, no FAILED/SUSPENDED/PREEMPTED
  leftover older than the janitor's grace (the simulator's own accounting);
* **at most one ACTIVE slice per deployment**, now and at every sample the runner took during the run;
* **every command applied once**: each command id has one ledger entry and exactly one ``applied`` line in the
  functions' logs, however often the bus delivered it;
* **no secret anywhere it must not be**: the vLLM API key and the Hugging Face token (a canary in the demo and
  the tests) are searched for in every log, every row of the store, the bus and the scheduler databases, the
  node agent's journals, the simulator's state (node metadata and labels), the argv and environment of every
  process the stack started, and any tool output the caller collected. The secret store and the nodes' 0600 key
  files are where the values belong and are not searched;
* **spend within budget**: the simulator's bill per deployment is at most the deployment's ``budget_usd``.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localcloud.runner import LocalCloud
from shared.domain.models import Phase

__all__ = ["InvariantReport", "check_invariants", "commands_applied"]

_SECRET_DIRS = ("secrets",)
_SECRET_FILES = ("vllm-api-key",)
_SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


@dataclass
class InvariantReport:
    """The outcome of :func:`check_invariants`; ``ok`` is the conjunction of every check."""

    orphans: list[dict[str, Any]] = field(default_factory=list)
    stale_leftovers: list[dict[str, Any]] = field(default_factory=list)
    duplicate_active_now: dict[str, list[str]] = field(default_factory=dict)
    duplicate_active_seen: list[dict[str, Any]] = field(default_factory=list)
    spend_usd: dict[str, float] = field(default_factory=dict)
    budgets_usd: dict[str, float | None] = field(default_factory=dict)
    over_budget: list[str] = field(default_factory=list)
    secret_leaks: list[str] = field(default_factory=list)
    places_scanned: int = 0
    total_usd: float = 0.0
    chip_hours: float = 0.0

    @property
    def ok(self) -> bool:
        return not (
            self.orphans
            or self.stale_leftovers
            or self.duplicate_active_now
            or self.duplicate_active_seen
            or self.over_budget
            or self.secret_leaks
        )

    def lines(self) -> list[str]:
        """A few human lines, one per check."""

        def mark(good: bool) -> str:
            return "ok  " if good else "FAIL"

        spend = ", ".join(
            f"{dep} ${usd:.2f}" + (f" of ${self.budgets_usd[dep]:.2f}" if self.budgets_usd.get(dep) else "")
            for dep, usd in sorted(self.spend_usd.items())
        )
        return [
            f"{mark(not self.orphans and not self.stale_leftovers)} orphans: {len(self.orphans)}, "
            f"stale leftovers: {len(self.stale_leftovers)}",
            f"{mark(not self.duplicate_active_now and not self.duplicate_active_seen)} at most one ACTIVE slice per "
            f"deployment (duplicates seen: {len(self.duplicate_active_seen)})",
            f"{mark(not self.over_budget)} spend within budget: {spend or 'nothing billed'} "
            f"(total ${self.total_usd:.2f}, {self.chip_hours:.2f} chip-hours)",
            f"{mark(not self.secret_leaks)} secrets scan: {self.places_scanned} places, "
            f"{len(self.secret_leaks)} leak(s)"
            + (f": {', '.join(self.secret_leaks[:5])}" if self.secret_leaks else ""),
        ]


def check_invariants(
    cloud: LocalCloud,
    *,
    secret_values: Mapping[str, str],
    extra_texts: Mapping[str, str] | None = None,
    max_leftover_s: float = 900.0,
) -> InvariantReport:
    """Check every invariant against a running (or just stopped) local cloud; ``secret_values`` is name -> value."""
    report = InvariantReport()
    records = cloud.store.list_deployments(include_deleted=True)
    live = [record.deployment_id for record in records if record.status.phase is not Phase.DELETED]
    world = cloud.world.invariants(live, max_leftover_s=max_leftover_s)
    report.orphans = list(world["orphans"])
    report.stale_leftovers = [item for item in world["leftovers"] if item["too_old"]]
    report.duplicate_active_now = dict(world["duplicate_active"])
    report.duplicate_active_seen = list(cloud.duplicate_active_seen)
    billing = world["billing"]
    report.total_usd = float(billing["total_usd"])
    report.chip_hours = float(billing["total_chip_hours"])
    for record in records:
        usd = float(billing["by_deployment"].get(record.deployment_id, 0.0))
        report.spend_usd[record.deployment_id] = usd
        report.budgets_usd[record.deployment_id] = record.spec.budget_usd
        if record.spec.budget_usd is not None and usd > record.spec.budget_usd:
            report.over_budget.append(record.deployment_id)
    unlabelled = float(billing["by_deployment"].get("(unlabelled)", 0.0))
    if unlabelled:
        report.spend_usd["(unlabelled)"] = unlabelled
        report.over_budget.append("(unlabelled)")
    needles = {name: value for name, value in secret_values.items() if value}
    places = 0
    for place, text in _places(cloud, extra_texts or {}):
        places += 1
        for name, value in needles.items():
            if value in text:
                report.secret_leaks.append(f"{name} in {place}")
    report.places_scanned = places
    return report


def commands_applied(log_dir: Path, command_ids: Iterable[str]) -> dict[str, int]:
    """How many ``applied`` lines each command id has in the functions' logs (must be exactly 1)."""
    wanted = set(command_ids)
    counts = dict.fromkeys(wanted, 0)
    for path in sorted(log_dir.glob("*.jsonl")):
        for line in _read_text(path).splitlines():
            if not line.startswith("{"):
                continue
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            command_id = entry.get("command_id") if isinstance(entry, dict) else None
            if command_id in wanted and str(entry.get("message", "")).startswith("applied "):
                counts[command_id] += 1
    return counts


def _places(cloud: LocalCloud, extra_texts: Mapping[str, str]) -> Iterator[tuple[str, str]]:
    """(where, text) for every place a secret must never be."""
    yield "simulator state (node metadata, labels, events)", json.dumps(cloud.world.state(events=5000), default=str)
    yield "state store records (read through the port)", _store_text(cloud)
    for path in sorted(cloud.data_dir.rglob("*")):
        if not path.is_file() or _is_secret_home(path, cloud.data_dir):
            continue
        if path.name.endswith(_SQLITE_SIDE_FILES):
            continue
        if path.suffix == ".sqlite":
            yield str(path), _sqlite_text(path)
        else:
            yield str(path), _read_text(path)
    for group in cloud.process_groups():
        for pid in _group_members(group):
            for what in ("cmdline", "environ"):
                with contextlib.suppress(OSError):
                    raw = Path(f"/proc/{pid}/{what}").read_bytes()
                    yield f"/proc/{pid}/{what}", raw.decode("utf-8", errors="replace")
    for name, text in extra_texts.items():
        yield f"tool output {name}", text


def _store_text(cloud: LocalCloud) -> str:
    """Every record the controller keeps, as JSON: deployments, samples, benchmark runs, zone memory, rejections.

    Read through the ``StateStore`` port, so it covers the Firestore emulator as well as the SQLite file.
    """
    store = cloud.store
    parts: list[Any] = []
    for record in store.list_deployments(include_deleted=True):
        parts.append(record.model_dump(mode="json"))
        parts += [sample.model_dump(mode="json") for sample in store.list_samples(record.deployment_id, limit=1000)]
    parts += [run.model_dump(mode="json") for run in store.list_benchmark_runs(None, limit=1000)]
    parts += [entry.model_dump(mode="json") for entry in store.list_zone_memory()]
    parts += [rejected.model_dump(mode="json") for rejected in store.list_rejections(limit=1000)]
    return json.dumps(parts, default=str)


def _is_secret_home(path: Path, root: Path) -> bool:
    relative = path.relative_to(root)
    return relative.parts[0] in _SECRET_DIRS or path.name in _SECRET_FILES


def _sqlite_text(path: Path) -> str:
    """Every value of every row of every table, as text (BLOBs decoded as UTF-8), read-only."""
    parts: list[str] = []
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    except sqlite3.Error as exc:
        return f"<unreadable: {exc}>"
    try:
        tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            quoted = '"' + table.replace('"', '""') + '"'
            for row in conn.execute(f"SELECT * FROM {quoted}"):  # noqa: S608 (names from sqlite_master)
                for value in row:
                    if isinstance(value, bytes | bytearray | memoryview):
                        parts.append(bytes(value).decode("utf-8", errors="replace"))
                    elif value is not None:
                        parts.append(str(value))
    except sqlite3.Error as exc:
        parts.append(f"<unreadable: {exc}>")
    finally:
        conn.close()
    return "\n".join(parts)


def _read_text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _group_members(group: int) -> list[int]:
    """Live processes whose process group is ``group``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) == group:
                members.append(int(entry.name))
    return members

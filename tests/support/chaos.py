"""The chaos suites' shared machinery: a hostile wrapper around the TPU port, the seeded driving loop, the checks.

Both suites (tests/service/test_chaos.py on the TPU API, tests/service/test_compute_engine_chaos.py on Compute
Engine and mixed worlds) run the same story: commands delivered twice and out of order through the real entry
path, crashes between an API call and the state write, a second reconciler inside the first one's calls, stalls
past the lease; then the faults stop, the system settles, and the world and the records must agree. What differs
per suite (the world, the specs, which faults and preemptions) comes in as arguments.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import tempfile
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localcloud.tpu_sim import World
from shared.adapters.sqlite_store import SqliteStateStore
from shared.domain.cloud import ObservedResource, OperationStatus, ProvisionRequest
from shared.domain.errors import ConflictError
from shared.domain.models import Desired, Phase, QueuedResourceState
from shared.entry import PubSubPayload, handle_payload
from shared.messages import ReconcileTick, encode_message
from shared.ports import TpuApi
from shared.services.provisioner import Provisioner, ProvisionerSettings

__all__ = [
    "CHAOS_STEPS",
    "SETTLE_STEPS",
    "STEP_S",
    "ChaosKnobs",
    "ChaoticTpu",
    "Crash",
    "RunReport",
    "chaos_run",
    "check_settled",
    "deliveries",
    "fast_folder",
    "serve_booting",
]

STEP_S = 120
CHAOS_STEPS = 16
SETTLE_STEPS = 14


class Crash(Exception):
    """The function instance died: the API call happened, nothing after it did."""


@dataclass
class ChaosKnobs:
    crash: float
    interleave: float
    stall: float
    enabled: bool = True


class ChaoticTpu:
    """Wraps the adapter: crashes after calls, lets a second reconciler run inside a call, stalls past leases.

    ``counts`` keeps ``crashed``, ``interleaved``, ``stalled`` and ``create:<backend>``.
    """

    def __init__(self, inner: TpuApi, rng: random.Random, knobs: ChaosKnobs, world: World) -> None:
        self.inner = inner
        self.rng = rng
        self.knobs = knobs
        self.world = world
        self.interleave: Callable[[], None] | None = None
        self.busy = False
        self.counts: Counter[str] = Counter()

    def _around(self, call: Callable[[], Any]) -> Any:
        if self.knobs.enabled and not self.busy:
            self.busy = True
            try:
                if self.interleave is not None and self.rng.random() < self.knobs.interleave:
                    self.counts["interleaved"] += 1
                    self.interleave()  # a second reconciler runs while this one is mid-flight
                if self.rng.random() < self.knobs.stall:
                    self.counts["stalled"] += 1
                    self.world.advance(150)  # paused past the 120 s lease: the next write must be fenced
            finally:
                self.busy = False
        result = call()
        if self.knobs.enabled and self.rng.random() < self.knobs.crash:
            self.counts["crashed"] += 1
            raise Crash("died after the API call, before the state write")
        return result

    def create(self, request: ProvisionRequest) -> OperationStatus:
        self.counts[f"create:{request.backend.value}"] += 1
        created: OperationStatus = self._around(lambda: self.inner.create(request))
        return created

    def delete(
        self, zone: str, resource_id: str, *, force: bool, request_id: str | None = None
    ) -> OperationStatus | None:
        deleted: OperationStatus | None = self._around(
            lambda: self.inner.delete(zone, resource_id, force=force, request_id=request_id)
        )
        return deleted

    def list(self, zone: str = "-") -> list[ObservedResource]:
        return self.inner.list(zone)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def deliveries(messages: list[Any], rng: random.Random) -> list[PubSubPayload]:
    """The commands as Pub/Sub delivers them: some twice, anywhere, and neighbours swapped."""
    payloads = [PubSubPayload(data=encode_message(m), message_id=f"m{i}") for i, m in enumerate(messages)]
    delivered = list(payloads)
    for payload in payloads:
        if rng.random() < 0.4:
            delivered.insert(rng.randint(0, len(delivered)), payload)  # a duplicate, anywhere
    for index in range(len(delivered) - 1):
        if rng.random() < 0.35:
            delivered[index], delivered[index + 1] = delivered[index + 1], delivered[index]  # out of order
    return delivered


@dataclass
class RunReport:
    seed: int
    problems: list[str] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    ticks: int = 0


# (rng, now) -> the deliveries of the run; (world, rng, counts) -> a fault or preemption, maybe
Commands = Callable[[random.Random, Any], list[PubSubPayload]]
Disturb = Callable[[World, random.Random, Counter[str]], None]
Labelled = Callable[[World], dict[str, dict[str, str]]]


def chaos_run(
    seed: int,
    world: World,
    tpu: TpuApi,
    store_path: Path,
    *,
    commands: Commands,
    disturb: Disturb,
    labelled: Labelled,
    settings: ProvisionerSettings | None = None,
) -> RunReport:
    """One seeded run: chaos for ``CHAOS_STEPS`` steps, then settle, then :func:`check_settled`; ``settings`` for
    both reconcilers (their holders are set here)."""
    rng = random.Random(seed)
    report = RunReport(seed)
    store = SqliteStateStore(store_path)
    knobs = ChaosKnobs(
        crash=rng.choice([0.0, 0.1, 0.25]), interleave=rng.choice([0.0, 0.2]), stall=rng.choice([0.0, 0.0, 0.05])
    )
    chaotic = ChaoticTpu(tpu, rng, knobs, world)
    clock = world.clock
    base = settings or ProvisionerSettings()
    first = Provisioner(store, chaotic, clock, settings=dataclasses.replace(base, holder="r1"))
    second = Provisioner(store, chaotic, clock, settings=dataclasses.replace(base, holder="r2"))

    def tick(provisioner: Provisioner) -> None:
        try:
            provisioner.handle(ReconcileTick(command_id=str(uuid.uuid4()), issued_at=clock.now()))
        except Crash:
            report.counts["tick_crashed"] += 1
        report.ticks += 1

    chaotic.interleave = lambda: tick(second)
    queue = commands(rng, clock.now())
    try:
        for step in range(CHAOS_STEPS):
            for _ in range(rng.choice([0, 1, 1, 2])):
                if not queue:
                    break
                payload = queue.pop(0)
                try:
                    result = handle_payload(payload, first.handle, store=store, clock=clock, max_age_s=1e9, claim_s=120)
                    report.counts[result.outcome.value] += 1
                except Exception:  # a crash or a transient error: Pub/Sub redelivers it later
                    report.counts["redelivered"] += 1
                    queue.insert(min(len(queue), rng.randint(1, 3)), payload)
            disturb(world, rng, report.counts)
            world.advance(STEP_S)
            tick(first if step % 3 else second)
            if rng.random() < 0.5:
                serve_booting(store)
        # Settle: faults and crashes stop, late redeliveries arrive, ticks run.
        knobs.enabled = False
        world.clear_faults()
        for payload in queue:
            handle_payload(payload, first.handle, store=store, clock=clock, max_age_s=1e9, claim_s=120)
        for step in range(SETTLE_STEPS):
            world.advance(STEP_S if step < SETTLE_STEPS - 4 else 600)
            tick(first)
            serve_booting(store)
        world.advance(STEP_S)
        tick(first)  # the janitor's last word
        report.problems = check_settled(world, store, labelled(world))
        report.counts.update(chaotic.counts)
        report.counts.update(f"won:{r.status.backend.value}" for r in store.list_deployments() if r.status.backend)
    finally:
        store.close()
    return report


def serve_booting(store: SqliteStateStore) -> None:
    """What functions/monitor does once vLLM answers on a new slice: BOOTING becomes SERVING."""
    for record in store.list_deployments():
        if record.status.phase is Phase.BOOTING:
            status = record.status.model_copy(update={"phase": Phase.SERVING})
            with contextlib.suppress(ConflictError):
                store.put_deployment(record.model_copy(update={"status": status}), expected_version=record.version)


def check_settled(world: World, store: SqliteStateStore, in_world_all: dict[str, dict[str, str]]) -> list[str]:
    """Every way the settled world and records can disagree; ``in_world_all`` is deployment -> {name: state}."""
    problems: list[str] = []
    records = {r.deployment_id: r for r in store.list_deployments(include_deleted=True)}
    live = [d for d, r in records.items() if r.status.phase is not Phase.DELETED]
    invariants = world.invariants(live_deployments=live)
    if invariants["orphans"]:
        problems.append(f"orphans: {invariants['orphans']}")
    if invariants["duplicate_active"]:
        problems.append(f"more than one ACTIVE: {invariants['duplicate_active']}")
    stale = [item for item in invariants["leftovers"] if item["too_old"]]
    if stale:
        problems.append(f"stale leftovers: {stale}")
    for deployment_id, record in records.items():
        in_world = in_world_all.get(deployment_id, {})
        refs = {ref.name: ref for ref in record.status.resources}
        untracked = set(in_world) - set(refs)
        if untracked:
            problems.append(f"{deployment_id}: resources the record does not know: {sorted(untracked)}")
        for name, ref in refs.items():
            believed_active = ref.state is QueuedResourceState.ACTIVE and ref.delete_requested_at is None
            if believed_active and in_world.get(name) != "ACTIVE":
                problems.append(f"{deployment_id}: record says {name} ACTIVE, world says {in_world.get(name)}")
        if record.desired is Desired.ABSENT and record.status.phase is not Phase.DELETED:
            problems.append(f"{deployment_id}: deleted long ago but phase {record.status.phase.value}")
        if record.desired is Desired.STOPPED and (record.status.phase is not Phase.STOPPED or in_world):
            problems.append(f"{deployment_id}: stopped long ago but phase {record.status.phase.value}, {in_world}")
        if record.status.phase is Phase.DELETED and in_world:
            problems.append(f"{deployment_id}: DELETED but the world still has {in_world}")
    return problems


@contextlib.contextmanager
def fast_folder(fallback: Path, prefix: str) -> Iterator[Path]:
    """A folder in /dev/shm when it exists (SQLite fsyncs every write), else ``fallback``."""
    shm = Path("/dev/shm")
    if shm.is_dir():
        with tempfile.TemporaryDirectory(dir=shm, prefix=prefix) as folder:
            yield Path(folder)
    else:
        yield fallback

"""Latency of the state-store operations the controller runs on every message and tick.

Run: ``.venv/bin/python -m benchmarks.state_store [--rounds 200] [--firestore]``

SQLite always; ``--firestore`` also measures FirestoreStateStore on the local emulator (google-cloud-cli),
which says nothing about production Firestore latency but shows the adapter's own overhead and the emulator's.
Prints one line per operation: median and p95 in milliseconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from shared.adapters.sqlite_store import SqliteStateStore
from shared.domain.models import CommandRecord, DeploymentRecord, DeploymentSpec, MonitorSample, Phase
from shared.ports import Fence, StateStore

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def _timed(rounds: int, operation: Callable[[int], object]) -> tuple[float, float]:
    samples = []
    for index in range(rounds):
        start = time.perf_counter()
        operation(index)
        samples.append((time.perf_counter() - start) * 1000)
    samples.sort()
    return statistics.median(samples), samples[int(0.95 * (len(samples) - 1))]


def measure(store: StateStore, label: str, rounds: int) -> list[str]:
    spec = DeploymentSpec(deployment_id="bench-a", model="tiny-llama", accelerator="v6e-1", zones=("us-east5-b",))
    current = store.put_deployment(
        DeploymentRecord(deployment_id="bench-a", spec=spec, created_at=T0, updated_at=T0), expected_version=None
    )
    lease = store.acquire_lease("bench-lease", "bench", 3600, T0)
    if lease is None:
        raise RuntimeError(f"{label}: the benchmark lease is held by someone else; use a fresh store")
    fence = Fence("bench-lease", lease.epoch)

    def cas(_: int) -> None:
        nonlocal current
        current = store.put_deployment(current, expected_version=current.version, fence=fence)

    def command(index: int) -> None:
        store.record_command(
            CommandRecord(command_id=f"bench-{index}", kind="reconcile.tick", deployment_id=None, received_at=T0)
        )

    def samples(index: int) -> None:
        at = T0 + timedelta(minutes=index)
        store.write_samples(
            [MonitorSample(deployment_id=f"bench-{d}", taken_at=at, phase=Phase.SERVING) for d in range(10)]
        )

    results = {
        "put_deployment (CAS + fence)": _timed(rounds, cas),
        "record_command (create-if-absent)": _timed(rounds, command),
        "write_samples (10 per batch)": _timed(rounds, samples),
        "list_samples (newest 100)": _timed(rounds, lambda _: store.list_samples("bench-1")),
        "acquire_lease (renew)": _timed(rounds, lambda i: store.acquire_lease("bench-lease", "bench", 3600, T0)),
    }
    return [f"{label:10} {name:36} median {p50:7.2f} ms   p95 {p95:7.2f} ms" for name, (p50, p95) in results.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200, help="operations per measurement")
    parser.add_argument("--firestore", action="store_true", help="also measure on the Firestore emulator")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        with SqliteStateStore(Path(tmp) / "bench.db") as sqlite:
            lines = measure(sqlite, "sqlite", args.rounds)
        if args.firestore:
            lines += _measure_firestore(Path(tmp), args.rounds)
    print("\n".join(lines))


def _measure_firestore(tmp: Path, rounds: int) -> list[str]:
    from google.cloud import firestore

    from shared.adapters.firestore_store import FirestoreStateStore
    from tests.support.emulators import FIRESTORE, Missing, locate, start

    found = locate(FIRESTORE)
    if isinstance(found, Missing):
        return [f"firestore  skipped: {found.reason}"]
    started = time.perf_counter()
    emulator = start(found, project="demo-tpuctl-bench", log_dir=tmp)
    ready_s = time.perf_counter() - started
    try:
        os.environ[FIRESTORE.env_var] = emulator.host_port
        client = firestore.Client(project=emulator.project)
        lines = measure(FirestoreStateStore(client, prefix="bench-"), "firestore", rounds)
        client.close()
    finally:
        emulator.stop()
    return [f"firestore  emulator ready after {ready_s:.1f} s", *lines]


if __name__ == "__main__":
    main()

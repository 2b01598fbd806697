"""The monitor's cost: one tick over many deployments, the /metrics parse, and the function's cold import.

Run: ``.venv/bin/python -m benchmarks.monitor_tick [--deployments 200] [--repeats 5]``

* Tick: N deployments, each a path prefix on one local endpoint (a separate process) replaying the real
  56 KB ``/metrics`` capture of vLLM 0.32.0 plus its ``/health``, ``/v1/models`` and ``/version``; the real
  ``VllmProbe`` (httpx), the embedded ``SqliteStateStore`` and ``LocalBus``. The first tick moves every deployment
  BOOTING -> SERVING (N record writes); the following ticks are the steady state. Wall time per tick and the
  state-store writes per tick (batched sample writes, record writes) are printed.
* Parse: ``parse_metrics`` on the real capture (family filter + ``prometheus_client`` parser + reduction), and
  the unfiltered ``prometheus_client`` parse for comparison.
* Import: a fresh interpreter importing ``functions.monitor.main`` (the Cloud Function's cold start), the same
  plus building the monitor from the wiring (what the first tick pays on top), and the service + probe alone.

* ``--telemetry``: every deployment also has an ACTIVE node whose guest attributes hold a fresh TPU reading (four
  chips, as the node agent writes it) and vLLM's start-up facts (``tpuctl/engine``, from the real log), read
  through a stand-in of the TPU port that waits ``--guest-read-ms`` per call (the Cloud TPU API's round trip; the
  monitor reads one node at a time, at most ``telemetry_reads_per_tick`` serving nodes per tick).

Targets (issue 5): tick under 2 s on 2 cores, one batched write per tick, parse under 5 ms, import under 800 ms.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from localcloud.monitoring_api import MonitoringStandIn
from shared.adapters.clock import ManualClock
from shared.adapters.cloud_monitoring import CloudMonitoringWriter
from shared.adapters.local_bus import LocalBus
from shared.adapters.local_metrics import JsonLinesMetricWriter
from shared.adapters.sqlite_store import SqliteStateStore
from shared.adapters.vllm_probe import VllmProbe, parse_metrics
from shared.domain.boot_progress import GuestAttribute
from shared.domain.engine_facts import EngineFacts, EngineFactsParser
from shared.domain.engine_facts import encode as encode_facts
from shared.domain.models import (
    DeploymentRecord,
    DeploymentSpec,
    DeploymentStatus,
    MonitorSample,
    Phase,
    QueuedResourceState,
    ResourceRef,
    Tier,
)
from shared.domain.tpu_telemetry import ChipReading, TpuTelemetry, encode
from shared.ports import MetricWriter
from shared.services.monitor import Monitor, MonitorSettings

REPO = Path(__file__).resolve().parents[1]
CAPTURE = REPO / "tests" / "fixtures" / "vllm" / "real_vllm_metrics.txt"
T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


class CountingStore(SqliteStateStore):
    """The SQLite store, counting the writes a tick makes."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.sample_batches = 0
        self.record_writes = 0

    def write_samples(self, samples: Sequence[MonitorSample]) -> None:
        self.sample_batches += 1
        super().write_samples(samples)

    def put_deployment(self, record: DeploymentRecord, *, expected_version: int | None, fence: Any = None) -> Any:
        self.record_writes += 1
        return super().put_deployment(record, expected_version=expected_version, fence=fence)

    def reset_counts(self) -> None:
        self.sample_batches = 0
        self.record_writes = 0


START_UP_LOG = REPO / "tests" / "fixtures" / "vllm" / "real_vllm_serve.log"


def engine_facts() -> EngineFacts:
    """What the node agent reads from vLLM 0.32.0's real start-up log."""
    parser = EngineFactsParser()
    for line in START_UP_LOG.read_text(encoding="utf-8").splitlines():
        parser.feed(line)
    if parser.facts is None:
        raise SystemExit(f"{START_UP_LOG}: no engine facts in it; the parser no longer reads vLLM's start-up log")
    return parser.facts


class TelemetryTpu:
    """The TPU port's guest-attribute read, answering every node with a fresh four-chip reading after a delay."""

    def __init__(self, clock: ManualClock, read_s: float) -> None:
        self.clock, self.read_s, self.reads = clock, read_s, 0
        self.engine = encode_facts(engine_facts())

    def guest_attributes(self, zone: str, node_id: str, query_path: str) -> Sequence[GuestAttribute]:
        self.reads += 1
        time.sleep(self.read_s)
        chips = tuple(ChipReading(i, (20 + i) << 30, 32 << 30, 60.0 + i, 30.0, 5.0 + i) for i in range(4))
        return [
            GuestAttribute("tpuctl", "telemetry", encode(TpuTelemetry(self.clock.now(), chips))),
            GuestAttribute("tpuctl", "engine", self.engine),
        ]


def bench_parse(repeats: int) -> dict[str, float]:
    text = CAPTURE.read_text(encoding="utf-8")
    filtered, full = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        parse_metrics(text)
        filtered.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        for family in text_string_to_metric_families(text):
            list(family.samples)
        full.append((time.perf_counter() - started) * 1000)
    filtered.sort()
    return {
        "bytes": len(text.encode()),
        "parse_median_ms": statistics.median(filtered),
        "parse_p90_ms": filtered[int(0.9 * (len(filtered) - 1))],
        "parse_min_ms": filtered[0],
        "unfiltered_prometheus_client_median_ms": statistics.median(full),
    }


def bench_import(statement: str, repeats: int) -> dict[str, float]:
    code = f"import time; t = time.perf_counter(); {statement}; print(time.perf_counter() - t)"
    env = {**os.environ, "TPUCTL_DATA_DIR": tempfile.mkdtemp(prefix="tpuctl-bench-"), "PYTHONDONTWRITEBYTECODE": "0"}
    times = []
    for _ in range(repeats):
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True, timeout=60
        )
        times.append(float(out.stdout.strip().splitlines()[-1]) * 1000)
    times.sort()
    return {"median_ms": statistics.median(times), "min_ms": times[0], "max_ms": times[-1]}


def _resources(name: str, telemetry: bool) -> list[ResourceRef]:
    if not telemetry:
        return []
    return [
        ResourceRef(
            name=f"{name}-node",
            zone="us-east5-b",
            tier=Tier.SPOT,
            generation=1,
            attempt=0,
            state=QueuedResourceState.ACTIVE,
        )
    ]


def _seed(store: SqliteStateStore, deployments: int, port: int, telemetry: bool) -> None:
    """N BOOTING deployments, each a path prefix on the replay endpoint (with an ACTIVE node for telemetry)."""
    for index in range(deployments):
        name = f"bench-{index:04d}"
        store.put_deployment(
            DeploymentRecord(
                deployment_id=name,
                spec=DeploymentSpec(deployment_id=name, model="tiny-llama", accelerator="v6e-1", zones=("us-east5-b",)),
                status=DeploymentStatus(
                    phase=Phase.BOOTING,
                    phase_since=T0,
                    endpoint=f"http://127.0.0.1:{port}/d/{name}",
                    resources=_resources(name, telemetry),
                ),
                created_at=T0,
                updated_at=T0,
            ),
            expected_version=None,
        )


def bench_tick(
    deployments: int,
    repeats: int,
    concurrency: int,
    telemetry: bool = False,
    guest_read_s: float = 0.0,
    metrics: str = "none",
) -> dict[str, Any]:
    replay = subprocess.Popen(
        [sys.executable, "-m", "tests.support.vllm_replay"],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert replay.stdout is not None
        port = int(replay.stdout.readline().strip())
        with tempfile.TemporaryDirectory(prefix="tpuctl-monitor-bench-") as tmp:
            store = CountingStore(Path(tmp) / "state.db")
            clock = ManualClock(T0)
            bus = LocalBus(Path(tmp) / "bus.db", clock=clock)
            settings = MonitorSettings(max_concurrency=concurrency)
            for topic in (settings.topic_commands, settings.topic_events, settings.topic_ticks):
                bus.ensure_topic(topic)
                bus.ensure_subscription(topic, topic + "-sink")
            _seed(store, deployments, port, telemetry)
            tpu = TelemetryTpu(clock, guest_read_s) if telemetry else None
            stand_in = MonitoringStandIn("bench") if metrics == "cloud" else None
            writer: MetricWriter | None = None
            if stand_in is not None:  # the real client over gRPC to the twin's stand-in on loopback
                writer = CloudMonitoringWriter("bench", endpoint=stand_in.start())
            elif metrics == "jsonl":
                writer = JsonLinesMetricWriter(Path(tmp) / "metrics.jsonl")
            probe = VllmProbe(timeout_s=5.0)
            monitor = Monitor(store, probe, bus, clock, settings, tpu=tpu, metrics=writer)  # type: ignore[arg-type]
            rows = []
            for index in range(repeats + 1):
                clock.advance(60)
                store.reset_counts()
                started = time.perf_counter()
                cpu_started = time.process_time()
                report = monitor.tick()
                wall = time.perf_counter() - started
                cpu = time.process_time() - cpu_started
                ok = sum(1 for d in report.deployments if d.probe == "ok")
                rows.append(
                    {
                        "tick": "first (BOOTING->SERVING)" if index == 0 else "steady",
                        "wall_s": wall,
                        "cpu_s": cpu,
                        "probed_ok": ok,
                        "sample_batches": store.sample_batches,
                        "samples": report.samples_written,
                        "record_writes": store.record_writes,
                        "published": len(report.published),
                        "guest_reads": tpu.reads if tpu is not None else 0,
                        "metric_points": report.metric_points,
                    }
                )
            with_tpu = sum(
                1
                for index in range(deployments)
                if "tpu_hbm_used_frac_max" in store.list_samples(f"bench-{index:04d}", since=T0, limit=1)[0].slis
            )
            bus.close()
            store.close()
            if stand_in is not None:
                stand_in.stop()
        return {"deployments": deployments, "concurrency": concurrency, "ticks": rows, "with_tpu_slis": with_tpu}
    finally:
        if replay.stdin is not None:
            replay.stdin.close()
        try:
            replay.wait(timeout=10)
        except subprocess.TimeoutExpired:
            replay.kill()
            replay.wait(timeout=10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--deployments", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5, help="Steady-state ticks after the first one.")
    parser.add_argument("--concurrency", type=int, default=MonitorSettings().max_concurrency)
    parser.add_argument("--telemetry", action="store_true", help="Serving nodes carry TPU telemetry to read.")
    parser.add_argument("--guest-read-ms", type=float, default=0.0, help="Per guest-attribute read (--telemetry).")
    parser.add_argument(
        "--metrics",
        choices=("none", "jsonl", "cloud"),
        default="none",
        help="SLIs as time series: none, the JSON-lines file, or the Cloud Monitoring client to a loopback stand-in.",
    )
    args = parser.parse_args(argv)

    parse = bench_parse(300)
    print(
        f"parse /metrics ({parse['bytes']} bytes): median {parse['parse_median_ms']:.2f} ms, "
        f"p90 {parse['parse_p90_ms']:.2f} ms, min {parse['parse_min_ms']:.2f} ms "
        f"(unfiltered prometheus_client parse: median {parse['unfiltered_prometheus_client_median_ms']:.2f} ms)"
    )
    for label, statement in (
        ("import functions.monitor.main", "import functions.monitor.main"),
        (
            "import functions.monitor.main + build the monitor (first call)",
            "import functions.monitor.main; from shared.wiring import runtime; runtime().monitor",
        ),
        ("import shared.services.monitor + vllm_probe", "import shared.services.monitor, shared.adapters.vllm_probe"),
    ):
        imported = bench_import(statement, 7)
        print(
            f"cold {label}: median {imported['median_ms']:.0f} ms "
            f"(min {imported['min_ms']:.0f}, max {imported['max_ms']:.0f})"
        )
    tick = bench_tick(
        args.deployments, args.repeats, args.concurrency, args.telemetry, args.guest_read_ms / 1000, args.metrics
    )
    print(f"tick over {tick['deployments']} deployments, probe concurrency {tick['concurrency']}:")
    for row in tick["ticks"]:
        print(
            f"  {row['tick']:<26} wall {row['wall_s']:.2f} s, monitor CPU {row['cpu_s']:.2f} s, "
            f"ok {row['probed_ok']}, {row['samples']} samples in {row['sample_batches']} batch(es), "
            f"{row['record_writes']} record write(s), {row['published']} message(s), "
            f"{row['guest_reads']} guest-attribute read(s) so far, {row['metric_points']} metric point(s)"
        )
    print(f"  deployments whose latest sample has TPU telemetry: {tick['with_tpu_slis']}")
    steady = [row["wall_s"] for row in tick["ticks"][1:]]
    if steady:
        print(f"  steady wall: median {statistics.median(steady):.2f} s, min {min(steady):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

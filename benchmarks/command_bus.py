"""Cost of moving a command through the bus: publish latency, delivery throughput, publish-to-handler latency.

Run: ``.venv/bin/python -m benchmarks.command_bus [--messages 500] [--pubsub]``

LocalBus always (SQLite WAL, ``synchronous=FULL``: every publish and every ack is one fsynced transaction);
``--pubsub`` also measures PubSubBus on the local Pub/Sub emulator (google-cloud-cli), which shows the adapter's
and the emulator's overhead, not production Pub/Sub latency.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

from shared.adapters.local_bus import LocalBus
from shared.ports import CommandBus, Delivery

DATA = b'{"kind":"reconcile.tick","deployment_id":"gemma-a"}'


def _percentiles(samples_ms: list[float]) -> tuple[float, float]:
    ordered = sorted(samples_ms)
    return statistics.median(ordered), ordered[int(0.95 * (len(ordered) - 1))]


def measure_publish_and_delivery(bus: CommandBus, label: str, messages: int, pull_timeout_s: float) -> list[str]:
    suffix = uuid.uuid4().hex[:8]
    topic, subscription = f"bench-{suffix}", f"bench-sub-{suffix}"
    bus.ensure_topic(topic)
    bus.ensure_subscription(topic, subscription)

    latencies = []
    for index in range(messages):
        started = time.perf_counter()
        bus.publish(topic, DATA, {"kind": "reconcile.tick"}, ordering_key=f"gemma-{index % 10}")
        latencies.append((time.perf_counter() - started) * 1000)
    p50, p95 = _percentiles(latencies)

    received = 0

    def handler(delivery: Delivery) -> None:
        nonlocal received
        received += 1

    started = time.perf_counter()
    give_up_at = started + 120
    while received < messages and time.perf_counter() < give_up_at:
        bus.pull(subscription, handler, max_messages=100, timeout_s=pull_timeout_s)
    elapsed = time.perf_counter() - started
    return [
        f"{label:8} publish (durable, waits for the id)    median {p50:7.2f} ms   p95 {p95:7.2f} ms",
        f"{label:8} pull + handle + ack, {messages} messages   {received / elapsed:8.0f} msg/s ({received} received)",
    ]


def measure_serve_latency(tmp: Path, rounds: int) -> str:
    """Publish on one LocalBus, receive through ``serve`` on another instance of the same file (two 'processes')."""
    with LocalBus(tmp / "serve.db") as publisher, LocalBus(tmp / "serve.db") as consumer:
        publisher.ensure_topic("serve-topic")
        publisher.ensure_subscription("serve-topic", "serve-sub")
        arrived = threading.Event()
        consumer_stop = threading.Event()
        thread = consumer.serve(
            "serve-sub", lambda delivery: arrived.set(), stop_event=consumer_stop, poll_interval_s=0.01
        )
        samples = []
        for _ in range(rounds):
            arrived.clear()
            started = time.perf_counter()
            publisher.publish("serve-topic", DATA, {"kind": "reconcile.tick"})
            if not arrived.wait(timeout=10):
                raise RuntimeError("serve did not deliver within 10 s")
            samples.append((time.perf_counter() - started) * 1000)
        consumer_stop.set()
        thread.join(timeout=10)
    p50, p95 = _percentiles(samples)
    return f"local    publish -> serve handler (poll 10 ms)     median {p50:7.2f} ms   p95 {p95:7.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--messages", type=int, default=500, help="messages per measurement")
    parser.add_argument("--pubsub", action="store_true", help="also measure PubSubBus on the Pub/Sub emulator")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        with LocalBus(Path(tmp) / "bench.db") as local:
            lines = measure_publish_and_delivery(local, "local", args.messages, pull_timeout_s=0.0)
        lines.append(measure_serve_latency(Path(tmp), rounds=100))
        if args.pubsub:
            lines += _measure_pubsub(Path(tmp), args.messages)
    print("\n".join(lines))


def _measure_pubsub(tmp: Path, messages: int) -> list[str]:
    from shared.adapters.pubsub_bus import PubSubBus
    from tests.support.emulators import PUBSUB, Missing, locate, start

    found = locate(PUBSUB)
    if isinstance(found, Missing):
        return [f"pubsub   skipped: {found.reason}"]
    started = time.perf_counter()
    emulator = start(found, project="demo-tpuctl-bench", log_dir=tmp)
    ready_s = time.perf_counter() - started
    try:
        os.environ[PUBSUB.env_var] = emulator.host_port
        bus = PubSubBus(emulator.project, ack_deadline_s=10)
        try:
            lines = measure_publish_and_delivery(bus, "pubsub", messages, pull_timeout_s=2.0)
        finally:
            bus.close()
    finally:
        emulator.stop()
    return [f"pubsub   emulator ready after {ready_s:.1f} s", *lines]


if __name__ == "__main__":
    main()

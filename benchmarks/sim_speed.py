"""How fast the TPU API simulator runs a long virtual scenario (target: 24 h, 100 queued resources, < 30 s wall).

Run: ``.venv/bin/python -m benchmarks.sim_speed [--hours 24] [--resources 100] [--step 60] [--poll 300]``

A churning fleet: ``--resources`` queued resources are kept outstanding across ten zones with random
capacity (Poisson), spot preemptions, flex-start run caps, cycling provisioning and ``validUntil`` expiry.
A driver plays the controller: every ``--poll`` virtual seconds it lists everything through
:class:`~shared.adapters.gcp_tpu.GcpTpuApi` (the real google-cloud-tpu REST client over loopback HTTP),
force-deletes FAILED/SUSPENDED ones and creates replacements, so the count stays at ``--resources``.
Time moves by ``POST /_sim/advance?seconds=--step`` over HTTP. ``--in-process`` skips HTTP entirely and
drives the world's Python API, to show the simulator's own cost.
Prints one JSON object: wall and CPU seconds (client and server share this process), virtual hours,
events run, creates, deletes, HTTP calls, billing.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import httpx

from localcloud.tpu_sim import SimServer, World
from shared.adapters.gcp_tpu import GcpTpuApi
from shared.domain.cloud import ProvisionRequest
from shared.domain.models import QueuedResourceState, Tier

PROJECT = "bench-proj"
ZONES = (
    "us-east5-a",
    "us-east5-b",
    "us-east5-c",
    "us-central1-b",
    "us-central1-c",
    "us-east1-d",
    "us-west1-c",
    "europe-west4-a",
    "europe-west4-b",
    "asia-northeast1-b",
)
TIERS = (Tier.SPOT, Tier.FLEX_START, Tier.ON_DEMAND)
DONE_STATES = (QueuedResourceState.FAILED, QueuedResourceState.SUSPENDED)


def scenario(seed: int) -> dict[str, Any]:
    """Ten zones whose capacity comes and goes at random, with preemptions and cycling."""
    zones: dict[str, Any] = {}
    for index, zone in enumerate(ZONES):
        zones[zone] = {
            "capacity": {
                "v6e": {
                    "spot": {"chips": 8 * (index % 3), "poisson": {"rate_per_hour": 2.0, "chips": 8, "hold_s": 5400}},
                    "flex_start": {"chips": 4, "poisson": {"rate_per_hour": 1.0, "chips": 4, "hold_s": 7200}},
                    "on_demand": {"chips": 0, "poisson": {"rate_per_hour": 0.5, "chips": 4, "hold_s": 3600}},
                }
            },
            "preemption": {"hazard_per_hour": 0.3, "early_hazard_per_hour": 2.0, "early_window_s": 600},
            "cycling": {"probability": 0.05, "flicker_s": 120, "fail_after_s": 2700},
        }
    return {
        "name": "bench-churn",
        "project": PROJECT,
        "seed": seed,
        "zones": zones,
        "limits": {"creates_per_minute": 1000},
    }


def provision_request(serial: int) -> ProvisionRequest:
    tier = TIERS[serial % len(TIERS)]
    name = f"bench-{serial:05d}"
    return ProvisionRequest(
        resource_id=name,
        node_id=name,
        zone=ZONES[serial % len(ZONES)],
        accelerator="v6e-4" if serial % 2 else "v6e-1",
        tier=tier,
        request_id=f"req-{name}",
        labels={"tpuctl-deployment": f"dep-{serial % 25:02d}"},
        valid_until_s=7200,
        max_run_s=4 * 3600 if tier is Tier.FLEX_START else None,
    )


def run_http(args: argparse.Namespace) -> dict[str, Any]:
    world = World(scenario(args.seed))
    server = SimServer(world)
    base_url = server.start()
    api = GcpTpuApi(PROJECT, endpoint=base_url)
    admin = httpx.Client(base_url=base_url, timeout=30)
    counts = {"creates": 0, "deletes": 0, "polls": 0, "http_calls": 0}
    serial = 0
    started = time.perf_counter()
    cpu_started = time.process_time()
    try:
        for _ in range(args.resources):
            api.create(provision_request(serial))
            serial += 1
        counts["creates"] = counts["http_calls"] = args.resources
        elapsed = 0.0
        next_poll = args.poll
        while elapsed < args.hours * 3600:
            admin.post("/_sim/advance", params={"seconds": str(args.step)}).raise_for_status()
            counts["http_calls"] += 1
            elapsed += args.step
            if elapsed < next_poll:
                continue
            next_poll += args.poll
            observed = api.list()
            counts["polls"] += 1
            counts["http_calls"] += 3 if any(item.tier is Tier.FLEX_START for item in observed) else 2
            for item in observed:
                if item.state in DONE_STATES:
                    api.delete(item.zone, item.name, force=True)
                    api.create(provision_request(serial))
                    serial += 1
                    counts["deletes"] += 1
                    counts["creates"] += 1
                    counts["http_calls"] += 2
        wall = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
        state = world.state(events=0)
    finally:
        admin.close()
        api.close()
        server.stop()
    return _summary("http", wall, cpu, args, state, counts)


def run_in_process(args: argparse.Namespace) -> dict[str, Any]:
    world = World(scenario(args.seed))
    counts = {"creates": 0, "deletes": 0, "polls": 0, "http_calls": 0}
    serial = 0
    started = time.perf_counter()
    cpu_started = time.process_time()

    def create(serial: int) -> None:
        request = provision_request(serial)
        body: dict[str, Any] = {
            "tpu": {
                "nodeSpec": [
                    {
                        "parent": f"projects/{PROJECT}/locations/{request.zone}",
                        "nodeId": request.node_id,
                        "node": {
                            "acceleratorType": request.accelerator,
                            "runtimeVersion": request.runtime_version,
                            "labels": request.labels,
                        },
                    }
                ]
            },
            "queueingPolicy": {"validUntilDuration": f"{request.valid_until_s}s"},
        }
        version = "v2"
        if request.tier is Tier.FLEX_START:
            body.update(provisioningModel="FLEX_START", runDuration={"maxRunDuration": f"{request.max_run_s}s"})
            version = "v2alpha1"
        elif request.tier is Tier.SPOT:
            body["spot"] = {}
        else:
            body["guaranteed"] = {}
        world.create_queued_resource(PROJECT, request.zone, request.resource_id, body, api_version=version)
        counts["creates"] += 1

    for _ in range(args.resources):
        create(serial)
        serial += 1
    elapsed = 0.0
    next_poll = args.poll
    while elapsed < args.hours * 3600:
        world.advance(args.step)
        elapsed += args.step
        if elapsed < next_poll:
            continue
        next_poll += args.poll
        counts["polls"] += 1
        listed, _ = world.list_queued_resources(PROJECT, "-")
        for item in listed:
            if item["state"]["state"] in ("FAILED", "SUSPENDED"):
                zone, name = item["name"].split("/")[3], item["name"].rsplit("/", 1)[-1]
                world.delete_queued_resource(PROJECT, zone, name, force=True)
                counts["deletes"] += 1
                create(serial)
                serial += 1
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    return _summary("in-process", wall, cpu, args, world.state(events=0), counts)


def _summary(
    mode: str, wall: float, cpu: float, args: argparse.Namespace, state: dict[str, Any], counts: dict[str, int]
) -> dict[str, Any]:
    states: dict[str, int] = {}
    for item in state["queued_resources"]:
        states[item["state"]["state"]] = states.get(item["state"]["state"], 0) + 1
    return {
        "mode": mode,
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "virtual_hours": args.hours,
        "step_s": args.step,
        "poll_s": args.poll,
        "outstanding": args.resources,
        "events_run": state["events_run"],
        **counts,
        "final_states": dict(sorted(states.items())),
        "billing_usd": state["billing"]["total_usd"],
        "chip_hours": state["billing"]["total_chip_hours"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=24.0, help="virtual hours to run")
    parser.add_argument("--resources", type=int, default=100, help="queued resources kept outstanding")
    parser.add_argument("--step", type=float, default=60.0, help="virtual seconds per advance call")
    parser.add_argument("--poll", type=float, default=300.0, help="virtual seconds between controller polls")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--in-process", action="store_true", help="drive the Python API instead of HTTP")
    args = parser.parse_args()
    result = run_in_process(args) if args.in_process else run_http(args)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

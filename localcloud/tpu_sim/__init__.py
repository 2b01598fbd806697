"""A local Cloud TPU API (v2 and v2alpha1 REST) for tests, demos and policy measurements.

Python API (stable; other components build on it)::

    from localcloud.tpu_sim import SimServer, World

    world = World("scarce-v6e")            # shipped scenario name, a .yaml/.json path, a dict or a Scenario
    server = SimServer(world)              # loopback, free port
    base_url = server.start()              # "http://127.0.0.1:PORT"; point GcpTpuApi(endpoint=base_url) at it
    world.advance(300)                     # run 5 virtual minutes (events fire in order; cheap)
    world.qr_state("us-east5-b", "qr-1")   # "ACTIVE", ... or None; also node_state(), queued_resource(), node()
    world.set_capacity("us-east5-b", "spot", 8)      # pools: on_demand, spot, flex_start, reservation:<name>
    world.preempt("us-east5-b", node="n-1")          # or queued_resource="qr-1"
    world.inject_fault({"endpoint": "get_operation", "status": 503, "times": 2})
    world.invariants(live_deployments=["dep-a"])     # orphans, leftovers, billing, duplicate ACTIVE, ok
    world.add_node_listener(callback)                # NodeEvent(kind=ready|preempted|stopped|started|deleted, ...)
    world.set_node_endpoint("us-east5-b", "n-1", "127.0.0.1", 8000)   # attach a real server to a node
    world.clock                                      # a shared.ports.Clock reading virtual time
    server.stop()

The same server also speaks the Compute Engine subset for TPU VMs (``/compute/v1/...``: instances,
zonal operations, machine types; point ``ComputeEngineTpu(endpoint=base_url)`` at it) and the Cloud
Billing Catalog subset (``/v1/services/6F81-5844-456A/skus``), on the same clock, pools and meter::

    world.compute.status("us-east5-b", "vm-1")       # "PENDING", "RUNNING", ... or None (also instance())
    world.preempt("us-east5-b", instance="vm-1")     # a spot VM: STOPPING, then gone (termination action DELETE)

It also answers the Cloud Quotas API's ``quotaInfos`` list and get for ``tpu.googleapis.com``
(``/v1/projects/{p}/locations/global/services/tpu.googleapis.com/quotaInfos``), one QuotaInfo per quota id
of the scenario's ``quotas:``; point ``CloudQuotas(project, endpoint=base_url)`` at it (``quotas_wire.py``).

``World(..., time_scale=60)`` makes virtual time run 60x the wall clock (the server's ticker keeps it
moving); the default 0 moves time only on ``advance()`` so tests are deterministic. Admin HTTP calls
live under ``/_sim/`` (state, clock, advance, capacity, preempt, reset, faults, invariants, billing,
events, nodes/{zone}/{node}/endpoint); see ``server.py``. Command line:
``python -m localcloud.tpu_sim --scenario scarce-v6e --port 8471``.
"""

from localcloud.tpu_sim.scenario import Scenario, ScenarioError, available_scenarios, load_scenario
from localcloud.tpu_sim.server import SimServer
from localcloud.tpu_sim.world import NodeEvent, World, WorldClock

__all__ = [
    "NodeEvent",
    "Scenario",
    "ScenarioError",
    "SimServer",
    "World",
    "WorldClock",
    "available_scenarios",
    "load_scenario",
]

"""``python -m localcloud.tpu_sim --scenario scarce-v6e --port 8471``: run the simulator in the foreground."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from types import FrameType

from localcloud.tpu_sim.scenario import ScenarioError, available_scenarios, load_scenario
from localcloud.tpu_sim.server import SimServer
from localcloud.tpu_sim.world import World


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localcloud.tpu_sim", description=__doc__)
    parser.add_argument(
        "--scenario",
        default="scarce-v6e",
        help=f"shipped scenario ({', '.join(available_scenarios())}) or a .yaml/.json path",
    )
    parser.add_argument("--port", type=int, default=8471, help="loopback port (0 = any free port)")
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to bind")
    parser.add_argument(
        "--time-scale", type=float, default=1.0, help="virtual seconds per wall second (0 = only /_sim/advance)"
    )
    parser.add_argument("--seed", type=int, default=None, help="override the scenario's RNG seed")
    parser.add_argument("--project", default=None, help="serve this project id instead of the scenario's")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")
    try:
        scenario = load_scenario(args.scenario)
        if args.project:
            scenario = scenario.model_copy(update={"project": args.project})
        world = World(scenario, time_scale=args.time_scale, seed=args.seed)
        server = SimServer(world, host=args.host, port=args.port)
        url = server.start()
    except (ScenarioError, ValueError, OSError) as exc:
        print(f"tpu_sim: {exc}", file=sys.stderr)
        return 2

    def _stop(signum: int, frame: FrameType | None) -> None:
        server.stop()

    signal.signal(signal.SIGTERM, _stop)
    print(
        f"TPU API simulator: scenario {scenario.name!r}, project {scenario.project!r}, {url} "
        f"(time scale {args.time_scale}); Ctrl-C to stop",
        file=sys.stderr,
        flush=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

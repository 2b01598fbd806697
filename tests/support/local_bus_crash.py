"""A consumer process that dies in the middle of a delivery, for the local bus's crash test.

Run as ``python -m tests.support.local_bus_crash DB_PATH SUBSCRIPTION``: it opens the bus file, leases one
message and, inside the handler, ends the process at once with ``os._exit`` (no cleanup, no ack, no nack),
as a killed Cloud Function instance would. Exit code :data:`CRASHED` says it got that far; :data:`NOTHING_DUE`
that no message was waiting.
"""

from __future__ import annotations

import os
import sys

from shared.adapters.local_bus import LocalBus
from shared.ports import Delivery

__all__ = ["CRASHED", "NOTHING_DUE", "main"]

CRASHED = 17
NOTHING_DUE = 3
ACK_DEADLINE_S = 30.0


def _die_mid_delivery(delivery: Delivery) -> None:
    os._exit(CRASHED)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m tests.support.local_bus_crash DB_PATH SUBSCRIPTION", file=sys.stderr)
        return 2
    path, subscription = argv
    bus = LocalBus(path, ack_deadline_s=ACK_DEADLINE_S)
    bus.pull(subscription, _die_mid_delivery, max_messages=1, timeout_s=5.0)
    bus.close()
    return NOTHING_DUE


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

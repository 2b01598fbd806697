"""Boot progress read back from a TPU VM's guest attributes ``tpuctl/phase``, ``tpuctl/detail``, ``tpuctl/boot`` and
``tpuctl/stages`` (stage times: ``shared.domain.boot_stages``).

Why: the startup script reports every boot step there; reading them lets the monitor show what a booting node is
doing ("pulling image", "downloading weights", "compiling") and end a boot that failed at once instead of at the
ready timeout. The VM runs a network server that parses prompts, so its text is hostile: only the script's known
phases are accepted, the detail is cleaned by the caller's ``clean`` (escapes, control and bidi characters, secrets)
and bounded, the boot stamp must be a short decimal, and no raw value is looked at past ``MAX_RAW_CHARS``.

Stale values: guest attributes belong to the VM, not to one boot; they go away with the VM but outlive a stop and
start (the simulator keeps them too). So ``progress()`` in the script writes ``detail``, then ``phase``, then, on
its first call of a run, ``boot``: when that run began (VM clock, epoch ms). Leftovers of an earlier boot carry an
older stamp than the boot the record follows and are ignored; a boot that ended (``serving`` or ``failed``) keeps
its end; a tick that is not newer than the record's last change (a duplicate or out-of-order tick) changes nothing.
Stamps are only compared with other stamps of the same node, never with the controller's clock. The stage times
carry their run's stamp too: another run's are dropped, and new times of the same stage and detail are a change.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

from shared.domain.boot_stages import STAGES_KEY, parse_stages
from shared.domain.models import BootProgress, BootStages
from shared.domain.startup_script import BOOT_PHASES, GUEST_ATTRIBUTE_NAMESPACE

__all__ = [
    "BOOT_FAILED",
    "BOOT_PREWARMED",
    "BOOT_QUERY_PATH",
    "MAX_DETAIL_CHARS",
    "STAGE_LABELS",
    "BootReading",
    "GuestAttribute",
    "advance_boot",
    "boot_failure",
    "boot_open",
    "read_boot",
    "stage_text",
]

BOOT_FAILED = "failed"
BOOT_QUERY_PATH = f"{GUEST_ATTRIBUTE_NAMESPACE}/"
MAX_DETAIL_CHARS = 300
MAX_RAW_CHARS = 4096  # a value is cut to this before anything else looks at it
BOOT_PREWARMED = "prewarmed"  # acted on only for a prewarm deployment (any VM can write any phase)
_FINAL = frozenset({"serving", BOOT_PREWARMED, BOOT_FAILED})
_STAMP = re.compile(r"[0-9]{1,16}")
STAGE_LABELS: dict[str, str] = {
    "booting": "booting the VM",
    "installing": "installing Docker",
    "secrets": "reading the API key",
    "image": "pulling image",
    "weights": "downloading weights",
    "starting": "starting the vLLM container",
    "node-agent": "starting the node agent",
    "compiling": "compiling",
    "serving": "serving",
    BOOT_PREWARMED: "compile cache filled",
    BOOT_FAILED: "boot failed",
}
assert set(STAGE_LABELS) == set(BOOT_PHASES), "every phase the startup script writes needs a label"


@dataclass(frozen=True)
class GuestAttribute:
    """One guest attribute as a ``TpuApi`` returns it: untrusted text written by the VM (``worker`` 0-based)."""

    namespace: str
    key: str
    value: str
    worker: int = 0


@dataclass(frozen=True)
class BootReading:
    """One worker's accepted report: a known stage, cleaned detail, the run's start stamp (0: none), its stage times."""

    stage: str
    detail: str
    boot: int
    worker: int = 0
    stages: BootStages | None = None


def read_boot(attributes: Iterable[GuestAttribute], clean: Callable[[str, int], str]) -> BootReading | None:
    """The node's report: a failing worker's if any, else the lowest worker's; None without a known phase."""
    values: dict[int, dict[str, str]] = {}
    for item in attributes:
        if item.namespace == GUEST_ATTRIBUTE_NAMESPACE and item.key in ("phase", "detail", "boot", STAGES_KEY):
            values.setdefault(item.worker, {})[item.key] = item.value[:MAX_RAW_CHARS]
    readings: list[BootReading] = []
    for worker, found in sorted(values.items()):
        stage = found.get("phase", "").strip()
        if stage not in STAGE_LABELS:
            continue  # unknown or hostile phase text is never shown or acted on
        stamp = found.get("boot", "").strip()
        boot = int(stamp) if _STAMP.fullmatch(stamp) else 0
        detail = " ".join(clean(found.get("detail", ""), MAX_DETAIL_CHARS).split())[:MAX_DETAIL_CHARS]
        stages = parse_stages(found.get(STAGES_KEY, ""), boot)
        readings.append(BootReading(stage=stage, detail=detail, boot=boot, worker=worker, stages=stages))
    failing = [reading for reading in readings if reading.stage == BOOT_FAILED]
    chosen = failing or readings
    return chosen[0] if chosen else None


def advance_boot(current: BootProgress | None, reading: BootReading, node: str, now: datetime) -> BootProgress | None:
    """The record's boot progress after ``reading`` of ``node`` at ``now``; None when nothing changes."""
    since = now
    if current is not None and current.node == node:
        if now <= current.seen_at or reading.boot < current.boot:
            return None  # a duplicate or out-of-order tick, or leftovers of an earlier boot
        same_boot = reading.boot == current.boot
        if same_boot and current.stage in _FINAL and reading.stage != current.stage:
            return None  # an ended boot writes nothing more: this is stale (or forged)
        if same_boot and (reading.stage, reading.detail, reading.stages) == (
            current.stage,
            current.detail,
            current.stages,
        ):
            return None
        if same_boot and reading.stage == current.stage:
            since = current.stage_since
    return BootProgress(
        node=node,
        stage=reading.stage,
        detail=reading.detail,
        boot=reading.boot,
        stage_since=since,
        seen_at=now,
        stages=reading.stages,
    )


def boot_open(progress: BootProgress | None) -> bool:
    """The record follows a boot that has not said ``serving`` or ``failed`` yet (its last words may still come)."""
    return progress is not None and progress.stage not in _FINAL


def boot_failure(progress: BootProgress | None, node: str) -> str | None:
    """Why the boot of ``node`` failed, as the script said (cleaned, bounded); None while it has not."""
    if progress is None or progress.node != node or progress.stage != BOOT_FAILED:
        return None
    return f"boot failed on {node}: {progress.detail or 'the startup script gave no reason'}"


def stage_text(progress: BootProgress | None) -> str:
    """``pulling image (sha256:…)``: the stage label with the script's detail, for people."""
    if progress is None:
        return ""
    label = STAGE_LABELS.get(progress.stage, progress.stage)
    return f"{label} ({progress.detail})" if progress.detail else label

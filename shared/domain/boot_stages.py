"""How long each boot stage took, read back from the startup script's guest attribute ``tpuctl/stages``.

Why: the boot stage alone says what a node is doing, not where its boot time went. The script times each stage
with the VM's own monotonic clock (``/proc/uptime``) and writes one cumulative line at each stage's end, before the
phase that follows (so a reader that sees a later phase sees the stages before it)::

    boot=1765000000000;image=84.20;weights=337.00,hub,62579490816;engine=427.90,cold;first_token=4.10

``boot`` is the run's stamp (``tpuctl/boot``): a line of another run is stale and ignored whole. ``image`` is the
image pull; ``weights`` the weights step with its source (``cached``: the boot disk had them; ``bucket``: restored
from the region's weights cache; ``hub``: downloaded; ``mixed``: some of each) and the model's size in bytes
(empty when unknown); ``engine`` from the vLLM container's start until
``/health`` answered 200, engine init and compilation together (the node agent's ``tpuctl/engine`` has the compile
seconds vLLM printed), with the state of the compile cache at the container's start (``warm``: the VM's vLLM cache
directory held compiled artefacts of an earlier start, the JAX cache in ``xla_cache`` or Inductor's in
``torch_compile_cache``, as after a reboot; ``cold``: none); ``first_token`` the first
one-token completion after health, sent by the script straight to vLLM: a shape compiled on the fly shows here,
not in ``engine``; ``compile_restore`` (a serving VM, before the engine) the shared compile cache's restore with
its outcome (``shared.domain.compile_cache.RESTORE_OUTCOMES``) and ``compile_fill`` (a prewarm builder, after the
first token) its fill with the outcome (``FILL_OUTCOMES``). The VM is hostile: a line longer than
``MAX_STAGES_CHARS`` is ignored, only known stage names are kept, seconds must lie in [0, 7 days] and bytes in
[0, 10 TB]; a field that fails is dropped, never guessed, and nothing here raises.
"""

from __future__ import annotations

import re

from shared.domain.compile_cache import FILL_OUTCOMES, RESTORE_OUTCOMES
from shared.domain.models import BootStages

__all__ = [
    "COMPILE_CACHE_STATES",
    "MAX_STAGES_CHARS",
    "STAGES_KEY",
    "STAGE_NAMES",
    "WEIGHTS_SOURCES",
    "parse_stages",
    "stages_text",
]

STAGES_KEY = "stages"  # guest attribute tpuctl/stages
STAGE_NAMES = ("image", "weights", "compile_restore", "engine", "first_token", "compile_fill")
WEIGHTS_SOURCES = ("cached", "bucket", "hub", "mixed")
COMPILE_CACHE_STATES = ("cold", "warm")
MAX_STAGES_CHARS = 256
MAX_SECONDS = 7 * 24 * 3600.0
MAX_BYTES = 10 * 10**12
_SECONDS = re.compile(r"[0-9]{1,7}(?:\.[0-9]{1,3})?")
_BYTES = re.compile(r"[0-9]{1,14}")
_STAMP = re.compile(r"[0-9]{1,16}")


def _seconds(text: str) -> float | None:
    if not _SECONDS.fullmatch(text):
        return None
    value = float(text)
    return value if value <= MAX_SECONDS else None


def _weights(text: str) -> tuple[float, str, int | None] | None:
    """``SECONDS,SOURCE,BYTES`` (bytes may be empty), or None when any part is out of shape."""
    parts = text.split(",")
    if len(parts) != 3 or parts[1] not in WEIGHTS_SOURCES:
        return None
    seconds = _seconds(parts[0])
    if seconds is None or (parts[2] and not _BYTES.fullmatch(parts[2])):
        return None
    size = int(parts[2]) if parts[2] else None
    if size is not None and size > MAX_BYTES:
        return None
    return seconds, parts[1], size


# The stages that carry a state after their seconds, and the states each may carry.
_STATES = {"engine": COMPILE_CACHE_STATES, "compile_restore": RESTORE_OUTCOMES, "compile_fill": FILL_OUTCOMES}


def _with_state(text: str, states: tuple[str, ...]) -> tuple[float, str | None] | None:
    """``SECONDS`` or ``SECONDS,STATE`` with STATE one of ``states``, or None when out of shape."""
    took, comma, state = text.partition(",")
    seconds = _seconds(took)
    if seconds is None or (comma and state not in states):
        return None
    return seconds, state or None


def parse_stages(raw: str, boot: int) -> BootStages | None:
    """The stage times of the run stamped ``boot``; None for another run's line, an oversize or empty one."""
    if boot <= 0 or len(raw) > MAX_STAGES_CHARS:
        return None
    fields = raw.strip().split(";")
    stamp = fields[0].removeprefix("boot=")
    if not fields[0].startswith("boot=") or not _STAMP.fullmatch(stamp) or int(stamp) != boot:
        return None  # another run's leftovers (or no stamp at all): never shown as this boot's
    seconds: dict[str, float] = {}
    source: str | None = None
    size: int | None = None
    states: dict[str, str | None] = {}
    for field in fields[1:]:
        name, _, value = field.partition("=")
        if name not in STAGE_NAMES or name in seconds:
            continue
        if name == "weights":
            weights = _weights(value)
            if weights is None:
                continue
            seconds[name], source, size = weights
        elif name in _STATES:
            timed = _with_state(value, _STATES[name])
            if timed is None:
                continue
            seconds[name], states[name] = timed
        else:
            took = _seconds(value)
            if took is not None:
                seconds[name] = took
    if not seconds:
        return None
    return BootStages(
        seconds=seconds,
        weights_source=source,
        weights_bytes=size,
        compile_cache=states.get("engine"),
        compile_restore=states.get("compile_restore"),
        compile_fill=states.get("compile_fill"),
    )


def stages_text(stages: BootStages | None) -> str:
    """``image 84 s, weights 337 s (hub, 58.3 GiB), engine 428 s (compile cache cold), first token 4 s``, for
    people; "" without stages."""
    if stages is None:
        return ""
    parts: list[str] = []
    for name in STAGE_NAMES:
        if name not in stages.seconds:
            continue
        text = f"{name.replace('_', ' ')} {stages.seconds[name]:.0f} s"
        if name == "weights" and stages.weights_source is not None:
            size = f", {stages.weights_bytes / 2**30:.1f} GiB" if stages.weights_bytes is not None else ""
            text += f" ({stages.weights_source}{size})"
        states: dict[str, str | None] = {
            "engine": stages.compile_cache,
            "compile_restore": stages.compile_restore,
            "compile_fill": stages.compile_fill,
        }
        state = states.get(name)
        if state is not None:
            text += f" (compile cache {state})" if name == "engine" else f" ({state})"
        parts.append(text)
    return ", ".join(parts)

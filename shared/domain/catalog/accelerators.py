"""Accelerator slices as data, and a strict parser for accelerator and topology strings.

Why data: capacity, cost, launch and the GKE manifest all need chips, HBM and topology for a slice;
keeping them in one table means a new slice is one entry, not a code change. Parsing is a regular
expression, never ``eval`` (the reference agent evaluated topology strings as Python).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from shared.domain.errors import PermanentError

__all__ = [
    "ACCELERATORS",
    "CPU_RUNTIME",
    "AcceleratorSpec",
    "InvalidAccelerator",
    "KvHeadPolicy",
    "RuntimeSpec",
    "accelerator",
    "chips_in_topology",
    "parse_accelerator_type",
    "parse_topology",
]

GIB = 1024**3

# How a runtime places KV heads that do not divide evenly by the tensor-parallel size:
# "replicate": every chip keeps all heads (JAX shardings need even division; tpu-inference), inferred from the
#   reference's published 26B-A4B KV figure (docs/reference/reference-agent.md §6), which only reproduces this way;
# "one_per_rank": each rank keeps max(1, heads // tp), vLLM's GPU/CPU rule.
KvHeadPolicy = Literal["replicate", "one_per_rank"]


class InvalidAccelerator(PermanentError):
    """An accelerator type or topology string that does not parse or is not in the catalog."""

    def __init__(self, field: str, problem: str, fix: str) -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        super().__init__(f"{field}: {problem} ({fix})")


@dataclass(frozen=True, slots=True)
class RuntimeSpec:
    """The serving runtime's memory conventions on one kind of device."""

    name: str
    kv_block_size: int  # tokens per KV block we pass as --block-size (and vLLM's default on CPU)
    kv_head_policy: KvHeadPolicy
    source: str


TPU_RUNTIME = RuntimeSpec(
    name="vllm-tpu (tpu-inference)",
    kv_block_size=32,
    kv_head_policy="replicate",
    source="docs/reference/reference-agent.md §5 (--block-size 32 on v6e-4) and §6 (KV shape; head placement inferred)",
)
CPU_RUNTIME = RuntimeSpec(
    name="vllm-cpu",
    kv_block_size=128,
    kv_head_policy="one_per_rank",
    source="fixtures/vllm real_vllm_metrics.txt cache_config_info block_size=128",
)


@dataclass(frozen=True, slots=True)
class AcceleratorSpec:
    """One TPU slice type: what it has and how each platform names it."""

    name: str  # TPU API accelerator type, e.g. v6e-4
    family: str  # price family: v6e | v5e | v5p
    chips: int
    topology: str
    hbm_gib_nominal: float
    hbm_gib_usable: float  # what the runtime reports as usable per chip
    runtime_version: str
    machine_type: str | None  # Compute Engine machine type, when one exists
    gke_accelerator: str  # node label cloud.google.com/gke-tpu-accelerator
    runtime: RuntimeSpec
    source: str
    # Per chip, nominal (docs/reference/vllm.md §8.4); None where unknown, and then no throughput bound is drawn.
    hbm_bandwidth_bytes_per_s: float | None = None
    peak_bf16_flops: float | None = None

    def __post_init__(self) -> None:
        if chips_in_topology(self.topology) != self.chips:
            raise ValueError(f"{self.name}: topology {self.topology} does not hold {self.chips} chips")


_V6E_SOURCE = (
    "docs/reference/vllm.md §8.1 (1x1/2x2/2x4, 32 GB per chip, runtime v2-alpha-tpuv6e); "
    "usable 31.25 GiB as JAX reports "
    "(docs/reference/reference-agent.md §6); machine types from docs/reference/reference-agent.md §11; "
    "1638 GBps HBM and 918 TFLOPs bf16 per chip (docs/reference/vllm.md §8.4, Cloud TPU v6e docs)"
)
_V5E_SOURCE = (
    "docs/reference/tpu-api.md §2 (V5LITE_POD); 16 GiB per chip, usable 14.49 GiB measured on v5e-1 "
    "(docs/reference/reference-agent.md §11); "
    "machine types, topology and GKE label from public Cloud TPU v5e docs (not in the project references); "
    "819 GBps HBM and 197 TFLOPs bf16 per chip (docs/reference/vllm.md §8.4, Cloud TPU v5e docs)"
)
_V5P_SOURCE = (
    "public Cloud TPU v5p docs (not in the project references): v5p-8 = 4 chips (the suffix counts TensorCores), "
    "95 GiB HBM per chip; usable scaled by the v6e usable/nominal ratio (31.25/32), not measured; "
    "2765 GBps HBM and 459 TFLOPs bf16 per chip (docs/reference/vllm.md §8.4, Cloud TPU v5p docs)"
)

# Per-chip HBM bandwidth (bytes/s) and peak bf16 compute (FLOP/s) by family: docs/reference/vllm.md §8.4.
_CHIP_FIGURES = {"v6e": (1638e9, 918e12), "v5e": (819e9, 197e12), "v5p": (2765e9, 459e12)}


def _entries() -> tuple[AcceleratorSpec, ...]:
    v6e = [
        ("v6e-1", 1, "1x1", "ct6e-standard-1t"),
        ("v6e-4", 4, "2x2", "ct6e-standard-4t"),
        ("v6e-8", 8, "2x4", "ct6e-standard-8t"),
    ]
    v5e = [
        ("v5litepod-1", 1, "1x1", "ct5lp-hightpu-1t"),
        ("v5litepod-4", 4, "2x2", "ct5lp-hightpu-4t"),
        ("v5litepod-8", 8, "2x4", "ct5lp-hightpu-8t"),
    ]
    entries = [
        AcceleratorSpec(
            name,
            "v6e",
            chips,
            topo,
            32.0,
            31.25,
            "v2-alpha-tpuv6e",
            mt,
            "tpu-v6e-slice",
            TPU_RUNTIME,
            _V6E_SOURCE,
            *_CHIP_FIGURES["v6e"],
        )
        for name, chips, topo, mt in v6e
    ]
    entries += [
        AcceleratorSpec(
            name,
            "v5e",
            chips,
            topo,
            16.0,
            14.49,
            "v2-alpha-tpuv5-lite",
            mt,
            "tpu-v5-lite-podslice",
            TPU_RUNTIME,
            _V5E_SOURCE,
            *_CHIP_FIGURES["v5e"],
        )
        for name, chips, topo, mt in v5e
    ]
    entries.append(
        AcceleratorSpec(
            "v5p-8",
            "v5p",
            4,
            "2x2x1",
            95.0,
            92.77,
            "v2-alpha-tpuv5",
            None,
            "tpu-v5p-slice",
            TPU_RUNTIME,
            _V5P_SOURCE,
            *_CHIP_FIGURES["v5p"],
        )
    )
    return tuple(entries)


_ACCELERATOR_TYPE = re.compile(r"^(v6e|v5litepod|v5p)-([1-9][0-9]{0,3})$")
_TOPOLOGY = re.compile(r"^[1-9][0-9]{0,2}(x[1-9][0-9]{0,2}){1,2}$")


def parse_topology(topology: str) -> tuple[int, ...]:
    """``2x4`` -> ``(2, 4)``; ``2x2x1`` -> ``(2, 2, 1)``. Anything else is an error, never evaluated."""
    if not isinstance(topology, str) or not _TOPOLOGY.fullmatch(topology):
        raise InvalidAccelerator("topology", f"{topology!r} is not a topology", "use AxB or AxBxC, e.g. 2x2 or 2x2x1")
    return tuple(int(part) for part in topology.split("x"))


def chips_in_topology(topology: str) -> int:
    """Chips in a topology string: the product of its dimensions."""
    chips = 1
    for dimension in parse_topology(topology):
        chips *= dimension
    return chips


def parse_accelerator_type(accelerator_type: str) -> tuple[str, int]:
    """``v6e-4`` -> ``("v6e", 4)``: the generation prefix and the numeric suffix (not always chips: see v5p)."""
    match = _ACCELERATOR_TYPE.fullmatch(accelerator_type) if isinstance(accelerator_type, str) else None
    if not match:
        raise InvalidAccelerator(
            "accelerator",
            f"{accelerator_type!r} is not an accelerator type",
            f"use one of {', '.join(ACCELERATORS)}",
        )
    return match.group(1), int(match.group(2))


ACCELERATORS: dict[str, AcceleratorSpec] = {entry.name: entry for entry in _entries()}


def accelerator(accelerator_type: str) -> AcceleratorSpec:
    """The catalog entry for an accelerator type, or a clear error naming the known ones."""
    parse_accelerator_type(accelerator_type)
    try:
        return ACCELERATORS[accelerator_type]
    except KeyError:
        raise InvalidAccelerator(
            "accelerator", f"{accelerator_type} is not in the catalog", f"use one of {', '.join(ACCELERATORS)}"
        ) from None

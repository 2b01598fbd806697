"""What machine the node agent runs on, for ``node.booted`` and every benchmark result.

Read from files and the process, never from a network service: ``/etc/os-release``, ``/proc`` (CPU model,
memory, kernel, boot id), ``os`` and ``shutil`` (CPUs, disk), and, on a TPU VM, the TPU runtime's environment
(``TPU_ACCELERATOR_TYPE``, ``TPU_TOPOLOGY`` or ``TPU_HOST_BOUNDS``/``TPU_CHIPS_PER_HOST_BOUNDS``,
``TPU_WORKER_ID``) and the chip devices (``/dev/vfio/N`` on v5e/v6e, ``/dev/accelN`` on older TPUs). HBM per chip
comes from the accelerator catalog. Everything is optional: a missing file leaves its field ``None``.
"""

from __future__ import annotations

import os
import platform
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from shared.domain.catalog import InvalidAccelerator, accelerator

__all__ = ["boot_id", "system_info"]

_TPU_ENV = ("TPU_ACCELERATOR_TYPE", "TPU_TOPOLOGY", "TPU_HOST_BOUNDS", "TPU_CHIPS_PER_HOST_BOUNDS", "TPU_WORKER_ID")
_GIB = 1024**3


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _os_release(root: Path) -> str | None:
    text = _read(root / "etc/os-release") or _read(root / "usr/lib/os-release")
    if text is None:
        return None
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            fields[key.strip()] = value.strip().strip('"')
    return fields.get("PRETTY_NAME") or fields.get("NAME")


def _cpu_model(root: Path) -> str | None:
    text = _read(root / "proc/cpuinfo") or ""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("model name", "Model", "cpu model"):
            return value.strip()
    return None


def _meminfo_gib(root: Path, field: str) -> float | None:
    """One ``/proc/meminfo`` figure (kB there) in GiB."""
    text = _read(root / "proc/meminfo") or ""
    for line in text.splitlines():
        if line.startswith(f"{field}:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return round(int(parts[1]) * 1024 / _GIB, 2)
    return None


def _memory(root: Path) -> dict[str, float | None]:
    """Total RAM, and what is in use and available now (``MemAvailable``: what new work can have without swapping)."""
    total = _meminfo_gib(root, "MemTotal")
    free = _meminfo_gib(root, "MemAvailable")
    used = round(total - free, 2) if total is not None and free is not None else None
    return {"memory_gib": total, "memory_used_gib": used, "memory_free_gib": free}


def boot_id(root: Path = Path("/")) -> str | None:
    """The kernel's id for this boot (changes on every reboot)."""
    text = _read(root / "proc/sys/kernel/random/boot_id")
    return text.strip() if text else None


def _disks(paths: Sequence[Path]) -> list[dict[str, Any]]:
    disks = []
    for path in paths:
        try:
            usage = shutil.disk_usage(path)
        except OSError:
            continue
        disks.append(
            {"path": str(path), "total_gib": round(usage.total / _GIB, 2), "free_gib": round(usage.free / _GIB, 2)}
        )
    return disks


def _tpu_chips(root: Path) -> int | None:
    vfio = [entry for entry in (root / "dev/vfio").glob("*") if entry.name.isdigit()]
    if vfio:
        return len(vfio)
    accel = list((root / "dev").glob("accel[0-9]*"))
    return len(accel) or None


def _accelerator(root: Path, environ: Mapping[str, str]) -> dict[str, Any] | None:
    env = {name: environ[name] for name in _TPU_ENV if environ.get(name)}
    chips = _tpu_chips(root)
    if not env and chips is None:
        return None
    kind = env.get("TPU_ACCELERATOR_TYPE")
    found: dict[str, Any] = {
        "type": kind,
        "chips_visible": chips,
        "topology": env.get("TPU_TOPOLOGY") or env.get("TPU_HOST_BOUNDS") or env.get("TPU_CHIPS_PER_HOST_BOUNDS"),
        "worker_id": env.get("TPU_WORKER_ID"),
        "hbm_gib_per_chip": None,
        "chips": chips,
    }
    if kind:
        try:
            spec = accelerator(kind)
        except InvalidAccelerator:
            return found
        found["hbm_gib_per_chip"] = spec.hbm_gib_nominal
        found["chips"] = spec.chips
        found["topology"] = found["topology"] or spec.topology
    return found


def system_info(
    *,
    root: Path = Path("/"),
    environ: Mapping[str, str] | None = None,
    disk_paths: Sequence[Path] = (Path("/"),),
) -> dict[str, Any]:
    """A JSON-able description of this machine (see the module docstring for the sources)."""
    env = os.environ if environ is None else environ
    kernel = (_read(root / "proc/sys/kernel/osrelease") or "").strip() or platform.release()
    return {
        "os": _os_release(root),
        "kernel": kernel,
        "arch": platform.machine(),
        "cpu_model": _cpu_model(root),
        "cpus": os.cpu_count(),
        **_memory(root),
        "disks": _disks(disk_paths),
        "python": platform.python_version(),
        "boot_id": boot_id(root),
        "accelerator": _accelerator(root, env),
    }

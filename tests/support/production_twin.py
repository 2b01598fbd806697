"""The production-path twin for an end-to-end test: ``TPUCTL_BACKEND=gcp`` on the emulators and the local Google API
stand-ins, every TPU VM booting its rendered startup script; skipped with the reason where this machine cannot run
it, stopped with nothing left running."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcloud.emulators import EMULATORS, find_emulator
from localcloud.runner import LocalCloud, LocalCloudOptions
from localcloud.vllm_cpu import VllmCpuTier, default_cache_dir
from localcloud.vm_twin.vm import unshare_available

__all__ = ["production_twin"]


@contextlib.contextmanager
def production_twin(data_dir: Path, *, twin_compile: bool = False) -> Iterator[LocalCloud]:
    """A started local cloud (time scale 60) on the production path; ``twin_compile``: vLLM on CPU compiles."""
    missing = [found for kind in EMULATORS if isinstance(found := find_emulator(kind), str)]
    tier = VllmCpuTier(default_cache_dir())
    reason = "; ".join(missing) or tier.unavailable_reason() or unshare_available()
    if reason:
        pytest.skip(f"the production-path twin cannot run here: {reason}")
    options = LocalCloudOptions(
        data_dir=data_dir, cache_dir=tier.cache_dir, time_scale=60.0, gcp=True, twin_compile=twin_compile
    )
    cloud = LocalCloud(options)
    try:
        cloud.start()
        yield cloud
    finally:
        report = cloud.stop()
    assert report.survivors == ()

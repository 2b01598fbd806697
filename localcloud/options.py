"""How to run the local cloud (``LocalCloudOptions``): apart from the runner, which is long enough."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from localcloud.vllm_cpu import default_cache_dir

__all__ = ["LocalCloudOptions"]


@dataclass(frozen=True)
class LocalCloudOptions:
    """How to run the local cloud; every field has a working default except the data folder."""

    data_dir: Path
    """SQLite store and bus, secrets, scheduler jobs, logs (``logs/``) and node folders (``nodes/``)."""
    scenario: str = "scarce-v6e"
    """A shipped simulator scenario or a .yaml/.json path."""
    time_scale: float = 60.0
    """Virtual seconds per wall second (> 0)."""
    cache_dir: Path = field(default_factory=default_cache_dir)
    """Where ``make vllm-env tiny-model`` put the vLLM venv and the tiny model."""
    sim_port: int = 0
    """The simulator's loopback port (0 = any free port)."""
    boot_nodes: bool = True
    """Run a real vLLM for every READY node (False: nodes get an endpoint nobody answers on)."""
    log_level: str = "INFO"
    ticker_interval_s: float = 0.2
    """How often (wall seconds) the ticker publishes the Scheduler jobs that fell due."""
    seed: int | None = None
    """Override the scenario's RNG seed."""
    function_start_timeout_s: float = 90.0
    emulators: bool = False
    """Store and bus on the real Firestore and Pub/Sub emulators (google-cloud-cli) instead of SQLite files."""
    gcp: bool = False
    """The production-path twin: every process with ``TPUCTL_BACKEND=gcp`` (Firestore, Pub/Sub, Secret Manager,
    Cloud Scheduler, Cloud TPU, Billing, Quotas clients) on the emulators and local stand-ins; implies emulators."""
    twin_compile: bool = False
    """Let the VM twins' vLLM on CPU compile (torch.compile, cached under the VM's vLLM cache directory) instead of
    running eagerly: slower boots, but a compile cache to be cold or warm (``benchmarks/startup.py``)."""

    def __post_init__(self) -> None:
        if not self.time_scale > 0:
            raise ValueError(f"time_scale: {self.time_scale!r} must be > 0 virtual seconds per wall second")
        if self.ticker_interval_s <= 0:
            raise ValueError(f"ticker_interval_s: {self.ticker_interval_s!r} must be positive")
        if self.log_level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ValueError(f"log_level: {self.log_level!r} (use DEBUG, INFO, WARNING or ERROR)")

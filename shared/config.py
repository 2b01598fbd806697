"""One frozen ``Settings`` read from the environment (prefix ``TPUCTL_``); nothing else reads os.environ."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings", "get_settings"]


class Settings(BaseSettings):
    """Controller configuration. Every field can be set as ``TPUCTL_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="TPUCTL_", frozen=True, extra="ignore")

    backend: Literal["local", "gcp"] = Field(
        default="local", description="local: SQLite, local bus, simulator. gcp: Firestore, Pub/Sub, TPU API."
    )
    project: str | None = Field(default=None, pattern=r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$", description="GCP project id.")
    region: str = Field(default="us-central1", description="Region of the functions, Scheduler jobs and topics.")
    data_dir: Path = Field(default=Path("var"), description="Where the embedded store, bus and secrets live.")
    tpu_endpoint: str | None = Field(
        default=None, description="Override the TPU API endpoint, e.g. http://127.0.0.1:8471 for the simulator."
    )
    clock: Literal["system", "simulator"] = Field(
        default="system",
        description="simulator: follow the virtual time of the TPU simulator at tpu_endpoint (the local cloud).",
    )
    emulators: bool = Field(
        default=False,
        description="With backend local: the store and the bus on the Firestore and Pub/Sub emulators "
        "(FIRESTORE_EMULATOR_HOST, PUBSUB_EMULATOR_HOST); secrets, scheduler and TPU stay local.",
    )
    firestore_database: str = Field(default="(default)", description="Firestore database id.")
    topic_commands: str = "tpuctl-commands"
    topic_ticks: str = "tpuctl-ticks"
    topic_events: str = "tpuctl-events"
    topic_node_tasks: str = "tpuctl-node-tasks"
    max_event_age_s: float = Field(default=3600.0, gt=0, description="Older commands are dropped with a log line.")
    command_claim_s: float = Field(
        default=600.0, gt=0, description="A command still 'accepted' this long after receipt may be retried."
    )
    command_ttl_days: int = Field(default=30, ge=1, description="How long the idempotency ledger keeps an entry.")
    sample_ttl_days: int = Field(default=14, ge=1, description="How long monitor samples are kept.")
    lease_ttl_s: float = Field(default=120.0, gt=0, description="Reconciler lease length.")
    hf_token_secret: str = Field(default="tpuctl-hf-token", description="Secret name of the Hugging Face token.")
    vllm_api_key_secret: str = Field(default="tpuctl-vllm-api-key", description="Secret name of the vLLM API key.")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @model_validator(mode="after")
    def _gcp_needs_project(self) -> Settings:
        if self.backend == "gcp" and not self.project:
            raise ValueError("TPUCTL_PROJECT: required when TPUCTL_BACKEND=gcp (set it to your project id)")
        if self.clock == "simulator" and not self.tpu_endpoint:
            raise ValueError("TPUCTL_CLOCK: 'simulator' needs TPUCTL_TPU_ENDPOINT (the simulator's http:// URL)")
        return self


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read once."""
    return Settings()

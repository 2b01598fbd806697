"""Scenario files: everything the simulated world is made of, validated before the world starts.

A scenario is YAML or JSON. Bad input fails with a message naming the field and what would pass,
so a typo in a hand-written scenario is caught at load time, not as a puzzling run.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from shared.domain.models import Tier
from shared.domain.prices import price_per_chip_hour

__all__ = [
    "SCENARIO_DIR",
    "AdviceSpec",
    "BillingCatalogSpec",
    "CapacityStep",
    "ComputeQuotaSpec",
    "ComputeZoneSpec",
    "ErrorSpec",
    "FaultSpec",
    "Limits",
    "PoissonSpec",
    "PoolSpec",
    "PreemptionSpec",
    "QuotaSpec",
    "Scenario",
    "ScenarioError",
    "Timings",
    "ZoneSpec",
    "available_scenarios",
    "default_price",
    "load_scenario",
]

SCENARIO_DIR = Path(__file__).parent / "scenarios"

POOLS = ("on_demand", "spot", "flex_start")
ProvisioningModel = Literal["standard", "spot", "flex_start", "reservation"]
PROVISIONING_MODELS: tuple[ProvisioningModel, ...] = ("standard", "spot", "flex_start", "reservation")

_STRICT = ConfigDict(extra="forbid", frozen=True)

_FALLBACK_REGION = "us-east5"  # the one region with a billing-catalog price for every v6e tier
_FALLBACK_USD = 2.70


def default_price(region: str, tier: str, family: str = "v6e") -> float:
    """USD per chip-hour from the dated domain table; a (region, tier) it lacks is billed at us-east5's price."""
    tier_value = Tier(tier)
    for place in (region, _FALLBACK_REGION):
        price = price_per_chip_hour(place, tier_value, family) or price_per_chip_hour(place, tier_value, "v6e")
        if price is not None:
            return price
    return _FALLBACK_USD


class ScenarioError(ValueError):
    """A scenario that cannot be loaded; the message names the field and the fix."""


class CapacityStep(BaseModel):
    """From ``at_s`` virtual seconds after the start, the pool holds ``chips`` chips."""

    model_config = _STRICT

    at_s: float = Field(ge=0)
    chips: int = Field(ge=0)


class PoissonSpec(BaseModel):
    """Blocks of ``chips`` arrive at ``rate_per_hour`` and stay for an exponential time of mean ``hold_s``."""

    model_config = _STRICT

    rate_per_hour: float = Field(gt=0)
    chips: int = Field(gt=0)
    hold_s: float = Field(default=3600.0, gt=0)


class PoolSpec(BaseModel):
    """Chips in one capacity pool: a start value, an optional timeline and an optional random process."""

    model_config = _STRICT

    chips: int = Field(default=0, ge=0)
    timeline: tuple[CapacityStep, ...] = ()
    poisson: PoissonSpec | None = None

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        return {"chips": value} if isinstance(value, int) else value


class PreemptionSpec(BaseModel):
    """Spot preemption hazard per READY node, with an optional higher rate early in a node's life."""

    model_config = _STRICT

    hazard_per_hour: float = Field(default=0.0, ge=0)
    early_hazard_per_hour: float = Field(default=0.0, ge=0)
    early_window_s: float = Field(default=0.0, ge=0)


class CyclingSpec(BaseModel):
    """Provisioning that never finishes: nodes appear CREATING and vanish (docs/reference/tpu-api.md §3.4 "cycling")."""

    model_config = _STRICT

    probability: float = Field(default=0.0, ge=0, le=1)
    flicker_s: float = Field(default=120.0, gt=0)
    fail_after_s: float | None = Field(default=2700.0, gt=0)


class Timings(BaseModel):
    """Virtual-second ranges ``[low, high]`` drawn uniformly with the world's seeded RNG
    (docs/reference/tpu-api.md §9)."""

    model_config = _STRICT

    accept_s: tuple[float, float] = (2.0, 5.0)
    wait_s: tuple[float, float] = (1.0, 10.0)
    boot_s: tuple[float, float] = (60.0, 300.0)
    capacity_check_s: tuple[float, float] = (5.0, 30.0)
    delete_s: tuple[float, float] = (30.0, 90.0)
    suspend_s: tuple[float, float] = (5.0, 15.0)
    stop_s: tuple[float, float] = (20.0, 60.0)
    start_s: tuple[float, float] = (30.0, 90.0)
    flex_refusal_s: tuple[float, float] = (8.0, 12.0)

    @field_validator("*")
    @classmethod
    def _ordered(cls, value: tuple[float, float]) -> tuple[float, float]:
        low, high = value
        if low < 0 or high < low:
            raise ValueError("must be [low, high] with 0 <= low <= high, e.g. [60, 300]")
        return value


class TimingOverrides(BaseModel):
    """Per-zone replacements for some of the world's timings."""

    model_config = _STRICT

    accept_s: tuple[float, float] | None = None
    wait_s: tuple[float, float] | None = None
    boot_s: tuple[float, float] | None = None
    capacity_check_s: tuple[float, float] | None = None
    delete_s: tuple[float, float] | None = None
    flex_refusal_s: tuple[float, float] | None = None


class ComputeZoneSpec(BaseModel):
    """The same zone as the simulated Compute Engine API sees it (TPU VMs as ``ct6e-standard-*t`` instances).

    ``None`` fields follow the zone's TPU API settings, so every existing scenario offers its zones through
    both APIs with the same capacity pools; set them to make the two APIs differ.
    """

    model_config = _STRICT

    served: bool | None = Field(
        default=None, description="False: inserts get 400 'Unknown zone'. None: as the TPU API."
    )
    accelerators: tuple[str, ...] | None = Field(
        default=None,
        description="Slice types offered as machine types (v6e-4 -> ct6e-standard-4t). None: as the TPU API.",
    )
    provisioning_models: tuple[ProvisioningModel, ...] | None = None
    stockout_error: Literal["pool", "pool_with_details"] = Field(
        default="pool", description="ZONE_RESOURCE_POOL_EXHAUSTED or its _WITH_DETAILS variant on a stockout."
    )


class ZoneSpec(BaseModel):
    """One zone as the simulated TPU API sees it."""

    model_config = _STRICT

    served: bool = Field(default=True, description="False: creates get 400 'zone is not supported'.")
    forbidden: bool = Field(default=False, description="True: every call gets 403 LOCATION_POLICY_VIOLATED.")
    unreachable: bool = Field(default=False, description="True: `locations/-` lists report it in unreachable[].")
    accelerators: tuple[str, ...] = ("v6e-1", "v6e-4", "v6e-8")
    runtime_versions: tuple[str, ...] = ("v2-alpha-tpuv6e", "v2-alpha-tpuv5-lite", "tpu-ubuntu2204-base")
    provisioning_models: tuple[ProvisioningModel, ...] = PROVISIONING_MODELS
    flex_refusal: Literal["operation", "sync"] = Field(
        default="operation", description="How a refused FLEX_START arrives: LRO code 3 (observed) or a sync 400."
    )
    capacity: dict[str, dict[str, PoolSpec]] = Field(
        default_factory=dict, description="family -> pool (on_demand, spot, flex_start, reservation:<name>) -> chips"
    )
    reservations: tuple[str, ...] = ()
    preemption: PreemptionSpec = Field(default_factory=PreemptionSpec)
    cycling: CyclingSpec = Field(default_factory=CyclingSpec)
    stockout_error: Literal["capacity", "internal", "reservation"] = Field(
        default="capacity", description="Which LRO error a node-create stockout shows: code 8, 13 or 9."
    )
    timings: TimingOverrides = Field(default_factory=TimingOverrides)
    compute: ComputeZoneSpec = Field(default_factory=ComputeZoneSpec, description="Compute Engine view of the zone.")

    @field_validator("capacity")
    @classmethod
    def _known_pools(cls, value: dict[str, dict[str, PoolSpec]]) -> dict[str, dict[str, PoolSpec]]:
        for family, pools in value.items():
            for pool in pools:
                if pool not in POOLS and not pool.startswith("reservation:"):
                    raise ValueError(
                        f"capacity.{family}.{pool}: unknown pool (use one of {', '.join(POOLS)} or reservation:<name>)"
                    )
        return value


class QuotaSpec(BaseModel):
    """A quota limit in chips for one quota id at one location (a zone or a region)."""

    model_config = _STRICT

    id: str = Field(pattern=r"^[A-Za-z0-9]+$")
    location: str
    limit: int = Field(ge=0)


class ComputeQuotaSpec(BaseModel):
    """A Compute Engine regional TPU quota in chips: the preemptible pool or the TPU family pool.

    Spot draws on ``preemptible``, standard on ``family``, flex-start on ``preemptible`` first and then on
    ``family`` (docs/reference/reference-agent.md §11). A region with no entry for a metric is not limited by it.
    """

    model_config = _STRICT

    metric: Literal["preemptible", "family"]
    region: str = Field(pattern=r"^[a-z]+-[a-z]+[0-9]+$")
    limit: int = Field(ge=0)
    family: str = "v6e"


class BillingCatalogSpec(BaseModel):
    """What the simulated Cloud Billing Catalog serves for Compute Engine (service 6F81-5844-456A)."""

    model_config = _STRICT

    omit_tiers: tuple[Literal["flex_start", "spot", "on_demand", "reservation"], ...] = Field(
        default=(), description="Tiers with no SKU at all (to test the table fallback)."
    )
    page_size: int = Field(default=50, ge=1, le=5000, description="SKUs per page when the client sets none.")


class ErrorSpec(BaseModel):
    """An error the simulator reports (google.rpc.Status code and message)."""

    model_config = _STRICT

    code: int = Field(ge=1, le=16)
    message: str


class Limits(BaseModel):
    """Project-wide rules; defaults follow docs/reference/tpu-api.md §9."""

    model_config = _STRICT

    creates_per_minute: int | None = Field(default=90, ge=1)
    queued_per_zone: int | None = Field(default=None, ge=1)
    idempotency_window_s: float = Field(default=3600.0, gt=0)
    delete_waiting_without_force: bool = True
    flex_refusal_lingers: bool = Field(default=True, description="A refused FLEX_START QR stays listed as FAILED.")
    quota_leak: bool = Field(default=False, description="FAILED/SUSPENDED/waiting QRs and PREEMPTED nodes use quota.")
    flex_quota: Literal["preemptible", "on_demand"] = "preemptible"
    max_run_s: float = Field(default=7 * 24 * 3600.0, gt=0)
    preempt_suspends_qr: bool = True
    list_lag_s: float = Field(default=0.0, ge=0)
    free_preemption_s: float = Field(default=60.0, ge=0)


class FaultSpec(BaseModel):
    """Answer the next ``times`` calls of ``endpoint`` (or ``*``) with ``status``, optionally after a delay."""

    model_config = _STRICT

    endpoint: str
    status: int = Field(default=503, ge=400, le=599)
    times: int = Field(default=1, ge=1)
    message: str | None = None
    latency_ms: float = Field(default=0.0, ge=0, le=120_000)


class AdviceSpec(BaseModel):
    """How right the simulated capacity advice is: the default is exact and current."""

    model_config = _STRICT

    accuracy: float = Field(
        default=1.0, ge=0, le=1, description="Probability that a zone's advice reflects the true timeline."
    )
    staleness_minutes: float = Field(default=0.0, ge=0, description="Advice shows capacity as of N minutes ago.")


class Scenario(BaseModel):
    """A whole simulated world: zones, capacity, quotas, limits, timings, prices and faults."""

    model_config = _STRICT

    name: str
    description: str = ""
    project: str = "demo-proj"
    seed: int = 0
    start_time: datetime = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
    auth_token: str | None = Field(default=None, description="When set, calls must send 'Authorization: Bearer …'.")
    zones: dict[str, ZoneSpec]
    quotas: tuple[QuotaSpec, ...] = ()
    timings: Timings = Field(default_factory=Timings)
    limits: Limits = Field(default_factory=Limits)
    prices: dict[str, dict[str, float]] = Field(
        default_factory=dict,
        description="region -> tier -> USD per chip-hour, over the dated table in shared.domain.prices",
    )
    faults: tuple[FaultSpec, ...] = ()
    compute_quotas: tuple[ComputeQuotaSpec, ...] = Field(
        default=(), description="Compute Engine regional TPU quotas (the TPU API's quotas do not apply there)."
    )
    billing_catalog: BillingCatalogSpec = Field(default_factory=BillingCatalogSpec)
    advice: AdviceSpec = Field(default_factory=AdviceSpec, description="Noise of the capacity advice (advice.py).")
    valid_until_error: ErrorSpec = ErrorSpec(
        code=8,
        message="The queued resource was not provisioned before its valid-until time: there is no more capacity in "
        'the zone "{zone}"; you can try in another zone where Cloud TPU Nodes are offered',
    )

    @field_validator("start_time")
    @classmethod
    def _aware(cls, value: datetime) -> datetime:
        if value.tzinfo is None:
            raise ValueError("must carry a timezone, e.g. 2026-12-02T12:00:00Z")
        return value.astimezone(UTC)

    @field_validator("zones")
    @classmethod
    def _zone_names(cls, value: dict[str, ZoneSpec]) -> dict[str, ZoneSpec]:
        if not value:
            raise ValueError("needs at least one zone, e.g. {us-east5-b: {}}")
        for zone in value:
            if zone.count("-") < 2:
                raise ValueError(f"{zone!r} is not a zone name (expected e.g. us-east5-b)")
        return value

    def price(self, region: str, tier: str, family: str = "v6e") -> float:
        """USD per chip-hour for ``tier`` in ``region``: the scenario's override, else the dated table."""
        override = self.prices.get(region, {}).get(tier)
        return override if override is not None else default_price(region, tier, family)


def available_scenarios() -> list[str]:
    """Names of the scenarios shipped with the simulator."""
    return sorted(path.stem for path in SCENARIO_DIR.glob("*.yaml"))


def _format_validation(error: ValidationError, source: str) -> str:
    problems = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"]) or "(top level)"
        problems.append(f"{where}: {item['msg']}")
    return f"scenario {source}: " + "; ".join(problems)


def load_scenario(source: str | Path | dict[str, Any]) -> Scenario:
    """A shipped scenario by name (``scarce-v6e``), a YAML/JSON file path, or an already-parsed mapping."""
    if isinstance(source, dict):
        data: Any = source
        label = repr(source.get("name", "<mapping>"))
    else:
        path = Path(source)
        if not path.suffix and not path.exists():
            path = SCENARIO_DIR / f"{source}.yaml"
            if not path.exists():
                raise ScenarioError(
                    f"scenario {str(source)!r}: no such shipped scenario "
                    f"(choose one of {', '.join(available_scenarios())} or pass a .yaml/.json path)"
                )
        if not path.exists():
            raise ScenarioError(f"scenario {str(path)!r}: file not found (pass an existing .yaml or .json file)")
        text = path.read_text(encoding="utf-8")
        label = str(path)
        try:
            data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        except (json.JSONDecodeError, yaml.YAMLError) as exc:
            raise ScenarioError(f"scenario {label}: not valid {path.suffix.lstrip('.') or 'YAML'}: {exc}") from exc
    if not isinstance(data, dict):
        raise ScenarioError(f"scenario {label}: the top level must be a mapping with 'name' and 'zones'")
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(_format_validation(exc, label)) from exc

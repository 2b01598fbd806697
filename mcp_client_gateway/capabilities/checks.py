"""Argument checks shared by the capabilities, over ``bounds``: closed sets, optional values, a slice's
arguments, a benchmark request's shape, a Hugging Face token's shape (never repeated)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any, get_args

from mcp_client_gateway import bounds
from mcp_client_gateway.errors import GatewayError
from shared.domain.cloud import accelerator_family
from shared.domain.models import ACCELERATOR_TYPES, MODEL_PRESET_NAMES, Phase, ServingOptions, Tier, region_of
from shared.domain.zone_catalog import offering_zones
from shared.ports import LogSeverity, LogSource

__all__ = [
    "ARTIFACT_KINDS",
    "DESTRUCTIVE",
    "KV_CACHE_DTYPES",
    "PHASES",
    "SEVERITIES",
    "SOURCES",
    "TIERS",
    "WEIGHT_DTYPES",
    "check_benchmark",
    "checked_reservation_name",
    "hf_token",
    "optional",
    "slice_arguments",
]

_HF_TOKEN = re.compile(r"^hf_[A-Za-z0-9]{20,80}$")
TIERS: tuple[str, ...] = tuple(tier.value for tier in Tier)
PHASES: tuple[str, ...] = tuple(phase.value for phase in Phase)
SEVERITIES: tuple[str, ...] = get_args(LogSeverity)
SOURCES: tuple[str, ...] = get_args(LogSource)
KV_CACHE_DTYPES = ("auto", "fp8")
WEIGHT_DTYPES: tuple[str, ...] = get_args(ServingOptions.model_fields["dtype"].annotation)
ARTIFACT_KINDS = ("startup_script", "gke_manifest", "both")
DESTRUCTIVE: tuple[str, ...] = ("delete", "stop", "restart")
_RESERVATION = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_BENCHMARK_KEYS = 32
_BENCHMARK_LIST_ITEMS = 1000
_BENCHMARK_ITEM_KEYS = 8
_BENCHMARK_TEXT_CHARS = 32768


def optional(check: Callable[..., Any], field: str, value: Any, *args: Any, **kwargs: Any) -> Any:
    """``check(field, value, ...)``, or None when the optional argument was not given."""
    return None if value is None else check(field, value, *args, **kwargs)


def slice_arguments(
    model: Any, accelerator: Any, zones: Any, tiers: Any
) -> tuple[str, str, list[str], list[str] | None]:
    """The model, slice, zones and tiers of a spec, checked (shared by create and plan)."""
    model = bounds.choice("model", model, MODEL_PRESET_NAMES)
    accelerator = bounds.choice("accelerator", accelerator, ACCELERATOR_TYPES)
    return (
        model,
        accelerator,
        _offering(accelerator, bounds.text_list("zones", zones, max_items=bounds.MAX_ZONES, item=bounds.zone)),
        None
        if tiers is None
        else bounds.text_list(
            "tiers",
            tiers,
            max_items=bounds.MAX_TIERS,
            min_items=0,
            item=lambda field, value: bounds.choice(field, value, TIERS),
        ),
    )


def _offering(accelerator: str, zones: list[str]) -> list[str]:
    """``zones``, each one the catalog knows to offer the slice's family (a misspelt zone is refused here rather
    than failing later in the search); a family the catalog has no list for is not checked."""
    family = accelerator_family(accelerator)
    known = offering_zones(family)
    for index, zone in enumerate(zones):
        if known and zone not in known:
            raise GatewayError(
                "invalid_argument",
                f"zones[{index}]",
                f"{zone} is not a zone that offers {family}",
                f"pick one of {', '.join(nearest_zones(zone, known))} (tpu_plan(show='zones') lists them all)",
            )
    return zones


def nearest_zones(zone: str, known: tuple[str, ...], limit: int = 4) -> list[str]:
    """The known zones nearest a refused one: its region's, else its geography's (``us-``), else the first few."""
    region = region_of(zone)
    for prefix in (f"{region}-", f"{region.split('-', 1)[0]}-"):
        near = [z for z in known if z.startswith(prefix)]
        if near:
            return near[:limit]
    return list(known[:limit])


def checked_reservation_name(value: Any) -> str:
    return bounds.text(
        "checked_reservation_name",
        value,
        max_chars=63,
        pattern=_RESERVATION,
        what="a reservation name",
        fix="the reservation's name: lower-case letters, digits and '-', up to 63 characters",
    )


def _check_benchmark_value(field: str, value: Any, depth: int) -> None:
    if value is None or isinstance(value, bool | int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise GatewayError("invalid_argument", field, f"must be a finite number, not {value}", "")
        return
    if isinstance(value, str):
        bounds.text(field, value, max_chars=_BENCHMARK_TEXT_CHARS, min_chars=0)
        return
    if isinstance(value, list | tuple) and depth == 0:
        if len(value) > _BENCHMARK_LIST_ITEMS:
            raise GatewayError("invalid_argument", field, "has too many items", "see tpu_benchmark")
        for index, item in enumerate(value):
            _check_benchmark_value(f"{field}[{index}]", item, depth + 1)
        return
    if isinstance(value, dict) and depth == 1:  # a list of small records: a trace's requests
        if len(value) > _BENCHMARK_ITEM_KEYS:
            raise GatewayError("invalid_argument", field, "has too many fields", "see tpu_benchmark")
        for key, item in value.items():
            if not isinstance(key, str) or not re.fullmatch(r"[a-z][a-z0-9_]{0,39}", key):
                raise GatewayError("invalid_argument", field, "has a key that is not a field name", "see the schema")
            _check_benchmark_value(f"{field}.{key}", item, depth + 1)
        return
    raise GatewayError("invalid_argument", field, "is not a number, text or a list of these", "see the schema")


def check_benchmark(benchmark: Any) -> None:
    """A benchmark request's shape and sizes before the wire model checks its fields: an object of named
    values, finite numbers, bounded text and lists (so NaN or a megabyte string never reach it)."""
    if not isinstance(benchmark, dict):
        raise GatewayError("invalid_argument", "benchmark", "must be an object", "pass the benchmark settings")
    if len(benchmark) > _BENCHMARK_KEYS:
        raise GatewayError("invalid_argument", "benchmark", "has too many settings", "see tpu_benchmark")
    for key, value in benchmark.items():
        if not isinstance(key, str) or not re.fullmatch(r"[a-z][a-z0-9_]{0,39}", key):
            raise GatewayError(
                "invalid_argument", "benchmark", "has a setting that is not a field name", "see tpu_benchmark"
            )
        _check_benchmark_value(key, value, 0)


def hf_token(token: Any) -> str:
    """A Hugging Face token's shape, checked without ever repeating the value."""
    fix = "paste an access token from huggingface.co/settings/tokens: 'hf_' then 20-80 letters or digits"
    token = bounds.text("token", token, max_chars=bounds.HF_TOKEN_CHARS, fix=fix).strip()
    if not _HF_TOKEN.fullmatch(token):
        raise GatewayError(
            "invalid_argument",
            "token",
            "does not look like a Hugging Face token (the value is not repeated here)",
            fix,
        )
    return token

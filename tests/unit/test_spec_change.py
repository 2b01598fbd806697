"""Which spec changes keep the running slice (a change of when it ends or how it is judged) and which need a new one."""

from __future__ import annotations

from typing import Any

import pytest

from shared.domain.models import DeploymentSpec, HealthThresholds, ServingOptions
from shared.domain.spec_change import IN_PLACE_FIELDS, needs_new_generation

BASE = DeploymentSpec(deployment_id="gemma", model="gemma-4-31b", accelerator="v6e-4", zones=("us-east5-b",))


@pytest.mark.parametrize(
    "change",
    [
        {"ttl_hours": 8.0},
        {"budget_usd": 40.0},
        {"idle_minutes": 30},
        {"on_idle": "delete"},
        {"health": HealthThresholds(boot_budget_s=7200.0)},
        {"ttl_hours": 2.0, "budget_usd": 5.0, "idle_minutes": 15},
    ],
)
def test_a_change_of_when_it_ends_or_how_it_is_judged_keeps_the_slice(change: dict[str, Any]) -> None:
    assert set(change) <= IN_PLACE_FIELDS
    assert needs_new_generation(BASE, BASE.model_copy(update=change)) is False


@pytest.mark.parametrize(
    "change",
    [
        {"zones": ("us-east5-b", "us-east5-a")},
        {"accelerator": "v6e-8"},
        {"hedge": 3},
        {"max_run_hours": 2.0},
        {"serving": ServingOptions(max_model_len=4096)},
        {"ttl_hours": 8.0, "hedge": 3},  # one slice-changing field is enough
    ],
)
def test_any_other_change_needs_a_new_generation(change: dict[str, Any]) -> None:
    assert needs_new_generation(BASE, BASE.model_copy(update=change)) is True


def test_the_same_spec_needs_nothing_new() -> None:
    assert needs_new_generation(BASE, BASE.model_copy()) is False

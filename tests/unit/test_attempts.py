"""Attempt outcomes: an enum with one text table, stored as the strings records always held."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from shared.domain.attempts import OUTCOME_TEXT, Step, outcome_text
from shared.domain.errors import ErrorClass
from shared.domain.models import AttemptLog, Tier

AT = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def test_every_step_and_every_error_class_has_words_and_no_two_share_them() -> None:
    members = [*Step, *ErrorClass]
    assert set(OUTCOME_TEXT) == set(members), "a new member needs its row in OUTCOME_TEXT"
    assert all(outcome_text(member).strip() for member in members)
    assert len(set(OUTCOME_TEXT.values())) == len(members), "two outcomes a person could not tell apart"


@pytest.mark.parametrize("stored", ["requested", "gave_up", "hedge_lost", "stockout", "quota_region"])
def test_a_stored_outcome_reads_back_as_its_member_and_writes_the_same_string(stored: str) -> None:
    log = AttemptLog.model_validate({"at": AT, "zone": "us-east5-b", "tier": "spot", "outcome": stored})
    assert isinstance(log.outcome, Step | ErrorClass) and log.outcome.value == stored
    assert log.model_dump(mode="json")["outcome"] == stored


def test_an_outcome_that_is_neither_a_step_nor_an_error_class_is_refused_by_field() -> None:
    with pytest.raises(ValidationError) as refused:
        AttemptLog(at=AT, zone="us-east5-b", tier=Tier.SPOT, outcome="went swimming")  # type: ignore[arg-type]
    assert "outcome" in str(refused.value)

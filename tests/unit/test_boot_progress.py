"""Boot progress from guest attributes: what is accepted from a hostile VM, how stale values are told apart, and the
startup script's ``progress()`` writing them in the order the reader relies on (run in real bash)."""

from __future__ import annotations

import os
import re
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from shared.domain.boot_progress import (
    MAX_DETAIL_CHARS,
    BootReading,
    GuestAttribute,
    advance_boot,
    boot_failure,
    read_boot,
    stage_text,
)
from shared.domain.models import BootProgress
from shared.domain.startup_script_template import TEMPLATE
from shared.logging import scrub_untrusted

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
NODE = "gemma-g1-a0"


def clean(text: str, limit: int) -> str:
    return scrub_untrusted(text, limit)[0]


def attrs(phase: str, detail: str = "", boot: str = "1000", worker: int = 0) -> list[GuestAttribute]:
    return [
        GuestAttribute("tpuctl", "phase", phase, worker),
        GuestAttribute("tpuctl", "detail", detail, worker),
        GuestAttribute("tpuctl", "boot", boot, worker),
    ]


class TestRead:
    def test_a_known_phase_is_read_with_its_detail_and_stamp(self) -> None:
        reading = read_boot([*attrs("weights", "downloading"), GuestAttribute("other", "phase", "failed")], clean)
        assert reading == BootReading(stage="weights", detail="downloading", boot=1000)

    @pytest.mark.parametrize(
        "phase", ["pwned", "FAILED", "failed\x1b]0;title\x07", "serving" + "x" * 10_000, "", "weights\u202e"]
    )
    def test_an_unknown_or_decorated_phase_is_not_accepted(self, phase: str) -> None:
        assert read_boot(attrs(phase, "anything"), clean) is None

    def test_hostile_detail_is_stripped_of_escapes_controls_and_bidi_and_bounded(self) -> None:
        hostile = "\x1b[31mred\x1b[0m \u202eevil\u202c\x00\x07 line\nbreak " + "A" * 20_000
        reading = read_boot(attrs("failed", hostile), clean)
        assert reading is not None
        assert len(reading.detail) <= MAX_DETAIL_CHARS
        assert reading.detail.startswith("red evil line break AAA")
        assert not re.search(r"[\x00-\x1f\x7f\u202a-\u202e\u2066-\u2069]", reading.detail)

    def test_a_stamp_that_is_not_a_short_number_counts_as_none(self) -> None:
        for stamp in ("", "12abc", "-5", "9" * 40):
            reading = read_boot(attrs("image", boot=stamp), clean)
            assert reading is not None and reading.boot == 0

    def test_a_failing_worker_wins_over_worker_zero(self) -> None:
        reading = read_boot([*attrs("compiling"), *attrs("failed", "oom on worker 1", worker=1)], clean)
        assert reading is not None and (reading.stage, reading.worker) == ("failed", 1)


class TestAdvance:
    def current(self, stage: str = "image", boot: int = 1000, detail: str = "pulling") -> BootProgress:
        return BootProgress(node=NODE, stage=stage, detail=detail, boot=boot, stage_since=NOW, seen_at=NOW)

    def test_a_first_reading_starts_the_record(self) -> None:
        made = advance_boot(None, BootReading("image", "pulling", 1000), NODE, NOW)
        assert made == self.current()

    def test_the_same_reading_again_changes_nothing(self) -> None:
        assert (
            advance_boot(self.current(), BootReading("image", "pulling", 1000), NODE, NOW + timedelta(seconds=60))
            is None
        )

    def test_a_new_stage_moves_on_and_a_new_detail_keeps_the_stage_clock(self) -> None:
        later = NOW + timedelta(seconds=60)
        moved = advance_boot(self.current(), BootReading("weights", "downloading", 1000), NODE, later)
        assert moved is not None and (moved.stage, moved.stage_since, moved.seen_at) == ("weights", later, later)
        detail = advance_boot(self.current(), BootReading("image", "still pulling", 1000), NODE, later)
        assert detail is not None and (detail.stage_since, detail.detail) == (NOW, "still pulling")

    def test_a_duplicate_or_out_of_order_tick_changes_nothing(self) -> None:
        for when in (NOW, NOW - timedelta(seconds=30)):
            assert advance_boot(self.current(), BootReading("failed", "late", 1000), NODE, when) is None

    def test_leftovers_of_an_earlier_boot_are_ignored_and_a_newer_boot_is_taken(self) -> None:
        later = NOW + timedelta(seconds=60)
        assert advance_boot(self.current(boot=2000), BootReading("failed", "old", 1000), NODE, later) is None
        newer = advance_boot(self.current(boot=1000), BootReading("booting", "plan", 2000), NODE, later)
        assert newer is not None and (newer.stage, newer.boot) == ("booting", 2000)

    def test_a_boot_that_ended_keeps_its_end(self) -> None:
        served = self.current(stage="serving")
        later = NOW + timedelta(seconds=60)
        assert advance_boot(served, BootReading("failed", "forged", 1000), NODE, later) is None

    def test_another_node_starts_over(self) -> None:
        fresh = advance_boot(self.current(stage="serving"), BootReading("booting", "", 5), "gemma-g2-a0", NOW)
        assert fresh is not None and (fresh.node, fresh.stage) == ("gemma-g2-a0", "booting")

    def test_only_a_failed_stage_of_that_node_is_a_failure(self) -> None:
        failed = self.current(stage="failed", detail="HTTP 401 from the Hub")
        assert boot_failure(failed, NODE) == f"boot failed on {NODE}: HTTP 401 from the Hub"
        assert boot_failure(failed, "gemma-g2-a0") is None
        assert boot_failure(self.current(), NODE) is None
        assert stage_text(self.current()) == "pulling image (pulling)"


def _function(name: str) -> str:
    match = re.search(rf"^{name}\(\) \{{\n.*?^\}}\n", TEMPLATE, re.MULTILINE | re.DOTALL)
    assert match is not None, name
    return match.group(0)


def test_progress_writes_detail_then_phase_then_the_run_stamp_once(tmp_path: Path) -> None:
    """A reader that sees a phase must see its detail; the stamp comes last and only on the run's first write."""
    journal = tmp_path / "writes"
    fake = tmp_path / "bin" / "curl"
    fake.parent.mkdir()
    fake.write_text('#!/bin/bash\nprintf "%s=%s\\n" "${@: -1}" "$(cat)" >>"$JOURNAL"\n')
    fake.chmod(0o755)
    script = "\n".join(
        [
            "set -euo pipefail",
            "GUEST_ATTRIBUTES=http://metadata/tpuctl",
            "log() { :; }",
            _function("progress"),
            _function("on_error"),
            'progress booting "plan abc"',
            'progress weights "@/etc/shadow"',
            "on_error 42 1",
            'progress failed "no health 200 after 3600s"',
            "on_error 99 1",
        ]
    )
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}", "JOURNAL": str(journal)}
    subprocess.run(["bash", "-c", script], env=env, check=True, timeout=20)
    writes = [line.split("=", 1) for line in journal.read_text().splitlines()]
    keys = [key.rsplit("/", 1)[-1] for key, _ in writes]
    assert keys == ["detail", "phase", "boot", "detail", "phase", "detail", "phase", "detail", "phase"]
    values = [value for _, value in writes]
    assert values[:2] == ["plan abc", "booting"] and re.fullmatch(r"[0-9]{13}", values[2])
    assert values[3] == "@/etc/shadow"  # sent as data, never read as a file
    assert values[5:7] == ["weights step (@/etc/shadow) exited 1 at line 42", "failed"]
    assert values[7:] == ["no health 200 after 3600s", "failed"]  # and the trap after it kept this reason

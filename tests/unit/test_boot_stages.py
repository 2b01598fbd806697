"""Boot stage times from the guest attribute ``tpuctl/stages``: what is accepted from a hostile VM, how another
run's line is told apart, how the record keeps them, and the startup script's ``stage_done()`` writing them
(run in real bash)."""

from __future__ import annotations

import os
import re
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from shared.domain.boot_progress import GuestAttribute, advance_boot, read_boot
from shared.domain.boot_stages import MAX_STAGES_CHARS, parse_stages, stages_text
from shared.domain.models import BootProgress, BootStages
from shared.domain.startup_script_template import TEMPLATE
from shared.logging import scrub_untrusted

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
NODE = "gemma-g1-a0"
BOOT = 1765000000000
GOOD = f"boot={BOOT};image=84.20;weights=337.00,hub,62579490816;engine=427.90"


def clean(text: str, limit: int) -> str:
    return scrub_untrusted(text, limit)[0]


def test_a_good_line_is_read_whole() -> None:
    stages = parse_stages(GOOD, BOOT)
    assert stages == BootStages(
        seconds={"image": 84.2, "weights": 337.0, "engine": 427.9}, weights_source="hub", weights_bytes=62579490816
    )
    assert stages_text(stages) == "image 84 s, weights 337 s (hub, 58.3 GiB), engine 428 s"


def test_a_partial_line_and_cached_weights_of_unknown_size_are_read() -> None:
    stages = parse_stages(f"boot={BOOT};image=3.5;weights=0.02,cached,", BOOT)
    assert stages == BootStages(seconds={"image": 3.5, "weights": 0.02}, weights_source="cached")
    assert stages_text(stages) == "image 4 s, weights 0 s (cached)"
    assert stages_text(None) == ""


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "image=84.2",  # no stamp
        f"boot={BOOT - 1};image=84.2",  # another (earlier) run's leftovers
        f"boot={BOOT + 1};image=84.2",
        f"boot=0x{BOOT:x};image=84.2",
        f"image=84.2;boot={BOOT}",  # the stamp comes first
        f"boot={BOOT}",  # nothing timed yet
        f"boot={BOOT};" + "image=1;" * 40,  # oversize
        f"boot={BOOT};image=1" + " " * MAX_STAGES_CHARS,
    ],
)
def test_a_line_of_another_run_without_a_stamp_empty_or_oversize_is_ignored_whole(raw: str) -> None:
    assert parse_stages(raw, BOOT) is None


def test_a_line_is_ignored_when_the_reading_has_no_stamp() -> None:
    assert parse_stages("boot=0;image=1", 0) is None


@pytest.mark.parametrize(
    "field",
    [
        "compile=12.0",  # unknown stage (compile cache hit or miss is not measured)
        "first_token=3.1",  # not sent by the script: never invented
        "image=-1",
        "image=1e3",
        "image=nan",
        "image=inf",
        "image=604800.001",  # over 7 days
        "image=1.2345",
        "image=",
        "image=12 ",
        "image=\u0661\u0662",  # Arabic-Indic digits
        "weights=3.0,s3,100",  # source outside the closed set
        "weights=3.0,HUB,100",
        "weights=3.0,hub,10000000000001",  # over 10 TB
        "weights=3.0,hub,-5",
        "weights=3.0,hub",
        "weights=3.0,hub,1,2",
        "weights=x,hub,1",
        "\x1b[31mimage=1",
        "image=1\x00",
    ],
)
def test_a_malformed_or_unknown_field_is_dropped_and_the_rest_kept(field: str) -> None:
    stages = parse_stages(f"boot={BOOT};{field};engine=5.5", BOOT)
    assert stages == BootStages(seconds={"engine": 5.5})


def test_bounds_are_inclusive_and_a_repeated_stage_keeps_its_first_value() -> None:
    stages = parse_stages(f"boot={BOOT};image=604800;image=1;weights=0,hub,10000000000000", BOOT)
    assert stages == BootStages(seconds={"image": 604800.0, "weights": 0.0}, weights_source="hub", weights_bytes=10**13)


@pytest.mark.parametrize(
    "raw",
    ["\x1b]0;owned\x07" * 50, "A" * 100_000, "boot=;;;;====,,,", f"boot={BOOT};" + ";" * 200, "\u202e" * 300],
)
def test_hostile_text_never_raises(raw: str) -> None:
    assert parse_stages(raw, BOOT) is None


def attrs(phase: str, stages: str, boot: str = str(BOOT)) -> list[GuestAttribute]:
    return [
        GuestAttribute("tpuctl", "phase", phase),
        GuestAttribute("tpuctl", "boot", boot),
        GuestAttribute("tpuctl", "stages", stages),
    ]


def test_the_reading_carries_this_run_s_stages_only() -> None:
    reading = read_boot(attrs("serving", GOOD), clean)
    assert reading is not None and reading.stages is not None and reading.stages.seconds["engine"] == 427.9
    stale = read_boot(attrs("booting", GOOD, boot=str(BOOT + 5)), clean)  # a new run: the old times go
    assert stale is not None and stale.stages is None
    huge = read_boot(attrs("image", f"boot={BOOT};image=1" + "9" * 10_000), clean)
    assert huge is not None and huge.stages is None


def test_new_stage_times_are_a_change_and_the_stage_clock_stays() -> None:
    first = read_boot(attrs("weights", f"boot={BOOT};image=84.2"), clean)
    assert first is not None
    current = advance_boot(None, first, NODE, NOW)
    assert current is not None and current.stages == BootStages(seconds={"image": 84.2})
    assert advance_boot(current, first, NODE, NOW + timedelta(minutes=1)) is None  # the same: nothing changes
    later = read_boot(attrs("weights", f"boot={BOOT};image=84.2;weights=3.0,cached,"), clean)
    assert later is not None
    updated = advance_boot(current, later, NODE, NOW + timedelta(minutes=2))
    assert updated is not None and updated.stage_since == NOW and updated.stages is not None
    assert updated.stages.weights_source == "cached"


def test_an_old_record_without_stages_still_loads() -> None:
    stored = {"node": NODE, "stage": "compiling", "detail": "", "boot": 1, "stage_since": NOW, "seen_at": NOW}
    assert BootProgress.model_validate(stored).stages is None


def _function(name: str) -> str:
    match = re.search(rf"^{name}\(\) \{{\n.*?^\}}\n", TEMPLATE, re.MULTILINE | re.DOTALL)
    assert match is not None, name
    return match.group(0)


def test_stage_done_writes_one_cumulative_line_of_this_run_that_the_parser_reads(tmp_path: Path) -> None:
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
            _function("uptime_cs"),
            _function("stage_done"),
            'progress image "pulling"',
            "started=$(uptime_cs)",
            "stage_done image $((started - 8420))",
            'progress weights "cached"',
            'stage_done weights "$(uptime_cs)" "cached,62579490816"',
            "stage_done engine $((started - 5))",
        ]
    )
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}", "JOURNAL": str(journal)}
    subprocess.run(["bash", "-c", script], env=env, check=True, timeout=20)
    writes = [line.split("=", 1) for line in journal.read_text().splitlines()]
    keys = [key.rsplit("/", 1)[-1] for key, _ in writes]
    assert keys == ["detail", "phase", "boot", "stages", "detail", "phase", "stages", "stages"]
    boot = int(writes[2][1])
    lines = [value for key, value in writes if key.endswith("/stages")]
    assert re.fullmatch(rf"boot={boot};image=84\.[0-9]{{2}}", lines[0]), lines[0]
    assert lines[2].startswith(lines[1] + ";engine=") and lines[1].startswith(lines[0] + ";weights=0.")
    stages = parse_stages(lines[2], boot)
    assert stages is not None and set(stages.seconds) == {"image", "weights", "engine"}
    assert 84.2 <= stages.seconds["image"] < 90 and stages.weights_source == "cached"
    assert stages.weights_bytes == 62579490816 and stages.seconds["engine"] >= 0.05


def test_the_script_times_every_stage_before_the_phase_that_follows() -> None:
    main = _function("main")
    assert main.index("stage_done image") < main.index("install_node_agent")
    weights = _function("download_weights")
    assert weights.index('stage_done weights "${started}" "cached,') < weights.index("progress weights cached")
    # the restore's own report (bucket, hub or mixed, and bytes) is the stage's detail, before the phase moves on
    assert weights.index('stage_done weights "${started}" "$(cat "${report}"') < weights.index(
        'progress weights "restored'
    )
    serving = _function("wait_until_serving")
    assert serving.index("stage_done engine") < serving.index("progress serving")
    assert 'ENGINE_STARTED="$(uptime_cs)"' in _function("start_vllm")
    assert "first_token" not in TEMPLATE  # the script sends no completion: that stage is never invented

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
from shared.domain.launch import VLLM_CACHE_DIR, XLA_CACHE_DIR
from shared.domain.models import BootProgress, BootStages
from shared.domain.startup_script_template import TEMPLATE
from shared.logging import scrub_untrusted

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
NODE = "gemma-g1-a0"
BOOT = 1765000000000
GOOD = f"boot={BOOT};image=84.20;weights=337.00,hub,62579490816;engine=427.90,cold;first_token=4.10"


def clean(text: str, limit: int) -> str:
    return scrub_untrusted(text, limit)[0]


def test_a_good_line_is_read_whole() -> None:
    stages = parse_stages(GOOD, BOOT)
    assert stages == BootStages(
        seconds={"image": 84.2, "weights": 337.0, "engine": 427.9, "first_token": 4.1},
        weights_source="hub",
        weights_bytes=62579490816,
        compile_cache="cold",
    )
    assert stages_text(stages) == (
        "image 84 s, weights 337 s (hub, 58.3 GiB), engine 428 s (compile cache cold), first token 4 s"
    )


def test_an_engine_without_its_cache_state_is_read_as_an_older_script_wrote_it() -> None:
    stages = parse_stages(f"boot={BOOT};engine=22.5;first_token=0.3", BOOT)
    assert stages == BootStages(seconds={"engine": 22.5, "first_token": 0.3})
    warm = parse_stages(f"boot={BOOT};engine=22.5,warm", BOOT)
    assert warm is not None and warm.compile_cache == "warm"
    assert stages_text(warm) == "engine 22 s (compile cache warm)"


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
        "compile=12.0",  # unknown stage (the script does not split compilation from engine init)
        "first_token=3.1,cold",  # the cache state belongs to the engine only
        "first_token=-3",
        "engine=5.5,hot",  # a compile-cache state outside the closed set
        "engine=5.5,",
        "engine=5.5,cold,1",
        "engine=5.5,COLD",
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
    healthy, serving = _function("wait_until_healthy"), _function("wait_until_serving")
    assert healthy.index('stage_done engine "${ENGINE_STARTED}" "${COMPILE_CACHE}"') < healthy.index("first_token")
    assert healthy.index("first_token") < healthy.index("return 0")
    assert serving.index("wait_until_healthy proxy_healthy") < serving.index("progress serving")
    start = _function("start_vllm")
    assert start.index("COMPILE_CACHE=cold") < start.index("compile_cache restore")
    assert (
        start.index("compile_cache restore") < start.index('ENGINE_STARTED="$(uptime_cs)"') < start.index("docker run")
    )
    prewarm = _function("prewarm")
    assert prewarm.index("wait_until_healthy vllm_healthy") < prewarm.index("compile_cache fill")
    assert prewarm.index("compile_cache fill") < prewarm.index("progress prewarmed")


def _first_token_run(tmp_path: Path, curl_exit: int) -> tuple[list[str], str, list[str]]:
    """Run the script's first_token() in real bash with a curl that records its argv, the header file and stdin;
    returns (curl's argv, what it read, the stage_done calls)."""
    bin_dir, secrets = tmp_path / "bin", tmp_path / "secrets"
    bin_dir.mkdir()
    secrets.mkdir()
    (secrets / "vllm-api-key").write_text("sk-master-secret-0123456789\n")
    curl = bin_dir / "curl"
    curl.write_text(
        "#!/bin/bash\n"
        'printf "%s\\0" "$@" >"$OUT/argv"\n'
        'for word in "$@"; do [[ "$word" == @* && "$word" != @- ]] && cat "${word#@}" >"$OUT/header"; done\n'
        'cat >"$OUT/body"\n'
        f"exit {curl_exit}\n"
    )
    curl.chmod(0o755)
    script = "\n".join(
        [
            "set -euo pipefail",
            f"SERVING_SECRETS={secrets}",
            f"SOCKET_DIR={tmp_path}",
            """FIRST_TOKEN_BODY='{"model": "gemma", "prompt": "Hello", "max_tokens": 1}'""",
            'log() { printf "log %s\\n" "$*" >>"$OUT/calls"; }',
            "uptime_cs() { printf 100; }",
            'stage_done() { printf "stage %s\\n" "$*" >>"$OUT/calls"; }',
            _function("first_token"),
            "first_token",
        ]
    )
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(tmp_path)}
    subprocess.run(["bash", "-c", script], env=env, check=True, timeout=20)
    argv = (tmp_path / "argv").read_text().split("\0")[:-1]
    assert not (secrets / "first-token-header").exists(), "the header file is removed after the request"
    read = (tmp_path / "header").read_text() + (tmp_path / "body").read_text()
    return argv, read, (tmp_path / "calls").read_text().splitlines()


def test_the_first_token_probe_sends_the_key_in_a_header_file_and_times_one_token(tmp_path: Path) -> None:
    argv, read, calls = _first_token_run(tmp_path, curl_exit=0)
    assert not any("sk-master-secret" in word for word in argv), "the key never reaches an argv"
    assert read.startswith("Authorization: Bearer sk-master-secret-0123456789\n")
    assert read.endswith('{"model": "gemma", "prompt": "Hello", "max_tokens": 1}')
    assert argv[-1] == "http://localhost/v1/completions" and f"{tmp_path}/vllm.sock" in argv
    assert calls == ["stage first_token 100"]


def test_a_failed_first_token_probe_is_logged_and_never_reported_as_a_stage(tmp_path: Path) -> None:
    _, _, calls = _first_token_run(tmp_path, curl_exit=22)
    assert calls == ["log first token: the one-token completion failed (the boot goes on)"]


@pytest.mark.parametrize(
    ("files", "state"),
    [
        ((), "cold"),
        (("modelinfos/gemma.json",), "cold"),  # vLLM's other files are not a compile cache
        (("xla_cache/jit_step-0123",), "warm"),  # the JAX cache a TPU keeps (VLLM_XLA_CACHE_PATH)
        (("torch_compile_cache/torch_aot_compile/h/rank_0_0/model",), "warm"),  # Inductor's, on a CPU
    ],
)
def test_the_compile_cache_reads_warm_only_when_compiled_artefacts_are_on_the_disk(
    tmp_path: Path, files: tuple[str, ...], state: str
) -> None:
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    check = _function("compiled_on_disk")
    verdict = "if compiled_on_disk; then printf warm; else printf cold; fi"
    script = f"set -euo pipefail\nVLLM_CACHE={tmp_path}\n{check}\n{verdict}"
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True, timeout=20)
    assert done.stdout == state
    assert f"{VLLM_CACHE_DIR}/xla_cache" == XLA_CACHE_DIR, "the script looks where the launch points the JAX cache"

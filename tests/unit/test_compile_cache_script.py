"""The startup script's side of the shared compile cache, run in real bash with recording stand-ins of docker and
of the script's own steps: a serving VM restores before its engine and reports the outcome as a stage; a prewarm
builder never starts the proxy or the node agent, fills after its first token and says ``prewarmed`` only when
the entry is there; the rendered values; the key of a plan."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from shared.domain.compile_cache import archive_name, compile_key, manifest_name, parse_manifest
from shared.domain.errors import InvalidMessage
from shared.domain.models import DeploymentSpec
from shared.domain.serving_plan import ServingEnvironment, build_serving_plan
from shared.domain.startup_script import StartupScriptInputs, render_startup_script, values_block
from shared.domain.startup_script_template import TEMPLATE

KEY = "0123456789abcdef0123456789abcdef"
CACHES = (("us-east5", "tpuctl-test-weights-us-east5"),)


def _function(name: str) -> str:
    match = re.search(rf"^{name}\(\) \{{\n.*?^\}}\n", TEMPLATE, re.MULTILINE | re.DOTALL)
    assert match is not None, name
    return match.group(0)


def _bash(tmp_path: Path, lines: list[str], docker_then: str = "") -> list[str]:
    """Run ``lines`` in real bash with a docker that records its argv, then runs ``docker_then``; returns the
    recorded calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    docker = bin_dir / "docker"
    docker.write_text('#!/bin/bash\nprintf "docker %s\\n" "$*" >>"$OUT/calls"\n' + docker_then + "\n")
    docker.chmod(0o755)
    stubs = [
        "set -Eeuo pipefail",
        'log() { printf "log %s\\n" "$*" >>"$OUT/calls"; }',
        'progress() { printf "progress %s|%s\\n" "$1" "$2" >>"$OUT/calls"; }',
        'fail() { printf "fail %s\\n" "$1" >>"$OUT/calls"; exit 1; }',
        'stage_done() { printf "stage %s\\n" "$*" >>"$OUT/calls"; }',
        "uptime_cs() { printf 100; }",
    ]
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(tmp_path)}
    subprocess.run(["bash", "-c", "\n".join(stubs + lines)], env=env, check=False, timeout=20)
    calls = tmp_path / "calls"
    return calls.read_text().splitlines() if calls.exists() else []


def _values(tmp_path: Path) -> list[str]:
    cache = tmp_path / "vllm"
    cache.mkdir(exist_ok=True)
    return [
        f"VLLM_CACHE={cache}",
        "CONTAINER=tpuctl-vllm CONTAINER_VLLM_CACHE=/root/.cache/vllm AGENT_DIR=/var/lib/tpuctl/node-agent",
        "IMAGE=vllm/vllm-tpu:v0.32.0 MODEL=google/gemma-4-e2b-it",
        f"COMPILE_CACHE_KEY={KEY}",
        "WEIGHTS_CACHE_ARGS=(--cache us-east5=tpuctl-test-weights-us-east5)",
    ]


@pytest.mark.parametrize(("report", "outcome"), [("hit,123456", "hit"), ("refused", "refused"), ("", "off")])
def test_a_restore_runs_the_node_agent_module_from_the_bundle_and_times_its_outcome(
    tmp_path: Path, report: str, outcome: str
) -> None:
    writes = f'printf "%s\\n" {report!r} >"$OUT/vllm/tpuctl-compile-report"' if report else "exit 3"
    calls = _bash(tmp_path, [*_values(tmp_path), _function("compile_cache"), "compile_cache restore"], writes)
    docker = next(call for call in calls if call.startswith("docker run"))
    assert "--net=host" in docker and f"-v {tmp_path}/vllm:/root/.cache/vllm" in docker
    assert "-v /var/lib/tpuctl/node-agent:/opt/tpuctl:ro" in docker  # the verified bundle, read-only
    assert f"-m node_agent.compile_cache restore --model google/gemma-4-e2b-it --key {KEY}" in docker
    assert docker.endswith("--cache us-east5=tpuctl-test-weights-us-east5")
    assert calls[-1] == f"stage compile_restore 100 {outcome}"
    if not report:
        assert "log compile cache restore: the container exited 3" in calls  # logged; the boot goes on


def _start(tmp_path: Path, *, local: bool, caches: str, restores: bool) -> tuple[list[str], str]:
    """start_vllm's compile-cache part in real bash: (the calls, COMPILE_CACHE at the engine's start)."""
    cache = tmp_path / "vllm"
    if local:
        (cache / "xla_cache").mkdir(parents=True)
        (cache / "xla_cache" / "jit_step").write_bytes(b"x")
    start = _function("start_vllm")
    part = start[start.index("  COMPILE_CACHE=cold") : start.index("  tpu_flags")]
    unpack = f"mkdir -p {cache}/torch_compile_cache && touch {cache}/torch_compile_cache/graph" if restores else ":"
    lines = [
        f"VLLM_CACHE={cache} COMPILE_CACHE_ROLE=serve COMPILE_CACHE_KEY={KEY}",
        f"WEIGHTS_CACHE_ARGS=({caches})",
        f'compile_cache() {{ printf "compile %s\\n" "$1" >>"$OUT/calls"; {unpack}; }}',
        _function("compiled_on_disk"),
        part,
        'printf "state %s\\n" "$COMPILE_CACHE" >>"$OUT/calls"',
    ]
    calls = _bash(tmp_path, lines)
    return calls[:-1], calls[-1].removeprefix("state ")


def test_a_disk_with_compiled_artefacts_reads_no_bucket_and_starts_warm(tmp_path: Path) -> None:
    calls, state = _start(tmp_path, local=True, caches="--cache us-east5=b", restores=False)
    assert state == "warm" and calls == ["stage compile_restore 100 local"]


def test_an_empty_disk_restores_first_and_starts_warm_only_if_the_restore_unpacked(tmp_path: Path) -> None:
    calls, state = _start(tmp_path / "hit", local=False, caches="--cache us-east5=b", restores=True)
    assert state == "warm" and "compile restore" in calls
    calls, state = _start(tmp_path / "miss", local=False, caches="--cache us-east5=b", restores=False)
    assert state == "cold" and "compile restore" in calls
    calls, state = _start(tmp_path / "off", local=False, caches="", restores=True)
    assert state == "cold" and not any(call.startswith("compile") for call in calls)  # no cache: no container


def _main(tmp_path: Path, role: str) -> list[str]:
    steps = [
        "ensure_docker",
        "install_node_agent",
        "download_weights",
        "start_vllm",
        "start_serving_proxy",
        "start_node_agent",
        "wait_until_serving",
        "prewarm",
        "retry",
    ]
    stubs = [f'{step}() {{ printf "step {step}\\n" >>"$OUT/calls"; }}' for step in steps]
    lines = [
        "install() { :; }",
        f"NODE_AGENT_BUNDLE=gs://b/node-agent/x COMPILE_CACHE_ROLE={role} PLAN_HASH=abc",
        "STATE_DIR=s HF_CACHE=h VLLM_CACHE=v AGENT_DIR=a SECRETS_DIR=r SERVING_SECRETS=r/s SOCKET_DIR=r/k",
        "API_KEY_SECRET=projects/p/secrets/k/versions/latest SECRETS_DIR=r IMAGE=i",
        *stubs,
        _function("main"),
        "main",
    ]
    return [call.removeprefix("step ") for call in _bash(tmp_path, lines) if call.startswith("step ")]


def test_a_builder_never_starts_the_proxy_or_the_node_agent(tmp_path: Path) -> None:
    serving = _main(tmp_path / "serve", "serve")
    builder = _main(tmp_path / "fill", "fill")
    assert serving[-4:] == ["start_vllm", "start_serving_proxy", "start_node_agent", "wait_until_serving"]
    assert builder[-2:] == ["start_vllm", "prewarm"]
    assert not {"start_serving_proxy", "start_node_agent", "wait_until_serving"} & set(builder)


def _prewarm(tmp_path: Path, outcome: str, report: str) -> list[str]:
    lines = [
        "CONTAINER=tpuctl-vllm",
        'wait_until_healthy() { printf "healthy %s\\n" "$1" >>"$OUT/calls"; }',
        f'compile_cache() {{ printf "compile %s\\n" "$1" >>"$OUT/calls"; COMPILE_OUTCOME={outcome}; '
        f"COMPILE_REPORT={report}; }}",
        _function("prewarm"),
        "prewarm",
    ]
    return _bash(tmp_path, lines)


def test_a_builder_fills_after_its_own_socket_health_stops_its_engine_then_says_prewarmed(tmp_path: Path) -> None:
    calls = _prewarm(tmp_path, "filled", "filled,123456," + "9481b0f33b05f3c1" * 4)
    assert calls[0] == "healthy vllm_healthy"  # vLLM's socket: no proxy runs on a builder
    assert calls.index("compile fill") < calls.index("docker rm -f tpuctl-vllm") < len(calls) - 1
    assert calls[-1] == "progress prewarmed|compile cache filled (123456 bytes, sha256 9481b0f33b05)"


@pytest.mark.parametrize(
    ("outcome", "words"),
    [("denied", "tpu_builder_service_account"), ("empty", "--enforce-eager"), ("off", "see the boot log")],
)
def test_a_fill_that_left_no_entry_fails_the_builder_with_the_fix(tmp_path: Path, outcome: str, words: str) -> None:
    calls = _prewarm(tmp_path, outcome, outcome)
    assert not any(call.startswith("progress prewarmed") for call in calls)
    assert calls[-1].startswith(f"fail compile cache fill: {outcome}" if outcome != "empty" else "fail compile")
    assert words in calls[-1]


def _plan(accelerator: str = "v6e-4", deployment_id: str = "one", **spec: object) -> object:
    made = DeploymentSpec(
        deployment_id=deployment_id, model="gemma-4-e2b", accelerator=accelerator, zones=("us-east5-b",), **spec
    )
    return build_serving_plan(made, ServingEnvironment(project="tpuctl-test", weights_cache_buckets=CACHES))


def test_the_key_is_shared_by_deployments_of_one_plan_and_differs_by_slice_and_flags() -> None:
    one, two = _plan(deployment_id="one"), _plan(deployment_id="two")
    assert one.compile_key == two.compile_key and re.fullmatch(r"[0-9a-f]{32}", one.compile_key)
    assert _plan("v6e-8").compile_key != one.compile_key
    assert _plan(serving={"kv_cache_dtype": "fp8"}).compile_key != one.compile_key
    launch = one.launch
    assert compile_key(launch, "rev-a", "v6e-4") != compile_key(launch, "rev-b", "v6e-4")


def test_the_script_carries_the_key_and_a_prewarm_fills(tmp_path: Path) -> None:
    serving = _plan().startup_script()
    builder = _plan(prewarm=True, ttl_hours=2.0).startup_script()
    for script, role in ((serving, "serve"), (builder, "fill")):
        done = subprocess.run(
            ["bash", "-c", values_block(script) + '\nprintf "%s %s" "$COMPILE_CACHE_KEY" "$COMPILE_CACHE_ROLE"'],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
            cwd=tmp_path,
        )
        assert done.stdout == f"{_plan().compile_key} {role}"


def test_a_key_that_is_not_32_hex_digits_is_refused_naming_the_field() -> None:
    plan = _plan()
    inputs = StartupScriptInputs(
        deployment_id="one",
        launch=plan.launch,
        model="google/gemma-4-e2b-it",
        model_revision="",
        hf_token_secret="",
        api_key_secret="projects/p/secrets/k/versions/latest",
        node_agent_bundle="",
        node_agent_bundle_sha256="",
        compile_cache_key="$(touch pwned)",
    )
    with pytest.raises(InvalidMessage, match="compile_cache_key"):
        render_startup_script(inputs)


def test_entries_are_named_under_compile_and_a_manifest_must_name_its_own_archive() -> None:
    sha = "ab" * 32
    assert manifest_name("google/gemma-4-e2b-it", KEY) == f"compile/models--google--gemma-4-e2b-it/{KEY}.json"
    archive = archive_name("google/gemma-4-e2b-it", KEY, sha)
    assert archive == f"compile/models--google--gemma-4-e2b-it/{KEY}/{sha}.tar"
    good = f'{{"key": "{KEY}", "archive": "{archive}", "sha256": "{sha}", "bytes": 10}}'
    assert parse_manifest(good, "google/gemma-4-e2b-it", KEY).bytes == 10
    elsewhere = good.replace("gemma-4-e2b-it/", "gemma-4-e4b-it/")
    for bad in (elsewhere, good.replace('"bytes": 10', '"bytes": 0'), good.replace(sha, "ab"), "[]", "{"):
        with pytest.raises(ValueError):
            parse_manifest(bad, "google/gemma-4-e2b-it", KEY)
    with pytest.raises(ValueError):
        manifest_name("google/gemma-4-e2b-it", "../../weights")

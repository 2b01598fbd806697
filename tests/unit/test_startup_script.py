"""The TPU VM startup script: rendered for every preset and slice, shell-safe, secret-free, bash-clean."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.domain.errors import InvalidMessage
from shared.domain.launch import EngineConfig, build_launch
from shared.domain.models import ACCELERATOR_TYPES, MODEL_PRESET_NAMES, DeploymentSpec
from shared.domain.serving_plan import ServingEnvironment, ServingPlan, build_serving_plan
from shared.domain.startup_script import (
    BOOT_LOG_PREFIX,
    NODE_AGENT_DISTRIBUTION,
    NODE_AGENT_MODULE,
    StartupScriptInputs,
    plan_hash,
    render_startup_script,
    secret_resource,
    values_block,
)

BUNDLE_SHA256 = "0123456789abcdef" * 4
BUNDLE = f"gs://tpuctl-test-tpuctl-sources/node-agent/{BUNDLE_SHA256}-tpuctl-node-agent-0.1.0.tar.gz"
ENVIRONMENT = ServingEnvironment(
    project="tpuctl-test", node_agent_bundle=BUNDLE, node_agent_bundle_sha256=BUNDLE_SHA256
)
CANARIES = ("hf_" + "CanaryTokenDoNotLeak0123456789", "sk-canary-api-key-7f3a")
SECRET_PATTERNS = (re.compile(r"hf_[A-Za-z0-9]{20,}"), re.compile(r"sk-[A-Za-z0-9-]{10,}"))


def plan_for(model: str, accelerator: str) -> ServingPlan:
    spec = DeploymentSpec(deployment_id="script-check", model=model, accelerator=accelerator, zones=("us-east5-b",))
    return build_serving_plan(spec, ENVIRONMENT)


def bash_syntax_ok(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, timeout=10, check=False)


@pytest.mark.parametrize("accelerator", ACCELERATOR_TYPES)
@pytest.mark.parametrize("model", MODEL_PRESET_NAMES)
def test_every_preset_and_slice_renders_a_bash_clean_secret_free_script(model: str, accelerator: str) -> None:
    plan = plan_for(model, accelerator)
    script = plan.startup_script()
    checked = bash_syntax_ok(script)
    assert checked.returncode == 0, checked.stderr
    assert not re.search(r"^\s*set\s+-[a-z]*x|set\s+-o\s+xtrace|\bxtrace\b", script, re.MULTILINE)
    assert "@@" not in script
    assert "latest" not in script.replace("/versions/latest", "")
    assert "nightly" not in script
    for canary in CANARIES:
        assert canary not in script
    for pattern in SECRET_PATTERNS:
        assert not pattern.search(script)
    assert "--api-key" not in script and "HF_TOKEN=" not in script and "-e HF_TOKEN" not in script
    assert plan.hf_token_resource in script and plan.api_key_resource in script
    assert "HF_HUB_OFFLINE=1" in script
    assert "--restart unless-stopped" in script
    assert f"-m {NODE_AGENT_MODULE}" in script
    assert plan.plan_hash in script


def test_the_script_keeps_secrets_on_tmpfs_and_caches_on_disk() -> None:
    script = plan_for("gemma-4-26b-a4b", "v6e-4").startup_script()
    assert "readonly SECRETS_DIR=/run/tpuctl" in script
    assert "0o400" in script and "umask 077" in script
    assert "readonly STATE_DIR=/var/lib/tpuctl" in script
    assert "guest-attributes/tpuctl" in script
    assert f"{BOOT_LOG_PREFIX} deployment=" in script
    assert "service-accounts/default/token" in script
    assert 'api + "v1/" + resource + ":access"' in script


def test_google_endpoints_default_to_production_and_move_only_by_the_standard_variables() -> None:
    """A local twin points the same script elsewhere through its environment; nothing rendered can move them."""
    script = plan_for("gemma-4-26b-a4b", "v6e-4").startup_script()
    defaults = {
        "metadata.google.internal": 'METADATA_BASE="http://${GCE_METADATA_HOST:-metadata.google.internal}/',
        "secretmanager.googleapis.com": "${CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER:-https://secretmanager.googleapis.com/}",
        "storage.googleapis.com": "${CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE:-https://storage.googleapis.com/storage/v1/}",
    }
    for host, default in defaults.items():
        assert script.count(host) == 1 and default in script, f"{host} must appear once, as the default of {default}"
    assert 'GUEST_ATTRIBUTES="${METADATA_BASE}/instance/guest-attributes/tpuctl"' in script
    for variable in ("GCE_METADATA_HOST", "CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER"):
        assert variable not in values_block(script)


def test_the_bundle_uri_and_digest_are_shell_quoted_values_and_the_old_pip_requirement_is_gone() -> None:
    script = plan_for("gemma-4-26b-a4b", "v6e-4").startup_script()
    block = values_block(script)
    assert f"NODE_AGENT_BUNDLE={BUNDLE}\n" in block and f"NODE_AGENT_BUNDLE_SHA256={BUNDLE_SHA256}\n" in block
    assert "NODE_AGENT_REQUIREMENT" not in script
    assert f"readonly AGENT_DISTRIBUTION={NODE_AGENT_DISTRIBUTION}\n" in script
    install = script[script.index("install_node_agent() {") : script.index("start_node_agent() {")]
    assert "--no-index --find-links /opt/tpuctl/wheelhouse" in install and "--net=none" in install
    unconfigured = build_serving_plan(plan_for("tiny-llama", "v6e-1").spec, ServingEnvironment(project="tpuctl-test"))
    assert "NODE_AGENT_BUNDLE=''\nNODE_AGENT_BUNDLE_SHA256=''\n" in values_block(unconfigured.startup_script())


@pytest.mark.skipif(
    shutil.which("shellcheck") is None, reason="shellcheck is not installed (apt-get install shellcheck)"
)
def test_shellcheck_finds_nothing_in_rendered_scripts(tmp_path: Path) -> None:
    paths = []
    for model, accelerator in zip(
        MODEL_PRESET_NAMES, ("v6e-1", "v6e-4", "v6e-8", "v5litepod-4", "v5p-8", "v6e-1"), strict=True
    ):
        path = tmp_path / f"{model}-{accelerator}.sh"
        path.write_text(plan_for(model, accelerator).startup_script())
        paths.append(str(path))
    result = subprocess.run(["shellcheck", "--severity=style", *paths], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


_TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=40)
_HOSTILE = st.one_of(
    _TEXT,
    st.sampled_from(["$(touch pwned)", "`touch pwned`", "'; touch pwned; '", '"$HOME"', "a\nb", "\\", "${IFS}", "-e"]),
)


def _evaluate_values(script: str, tmp_path: Path) -> list[str]:
    """Run the rendered values block in real bash and read every value back, NUL-separated."""
    names = [
        "DEPLOYMENT_ID",
        "MODEL",
        "MODEL_REVISION",
        "HF_TOKEN_SECRET",
        "API_KEY_SECRET",
        "NODE_AGENT_BUNDLE",
        "NODE_AGENT_BUNDLE_SHA256",
        "CONTAINER",
    ]
    quoted = " ".join(f'"${{{name}}}"' for name in names)
    reader = (
        f'printf "%s\\0" {quoted}\n'
        'printf "%s\\0" ARGV "${VLLM_ARGV[@]}" ENV "${CONTAINER_ENV[@]}" AGENT "${NODE_AGENT_ENV[@]}"\n'
    )
    result = subprocess.run(
        ["bash", "-c", values_block(script) + "\n" + reader],
        capture_output=True,
        timeout=10,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.decode("utf-8", "surrogateescape").split("\0")[:-1]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    deployment_id=_HOSTILE,
    model=_HOSTILE,
    revision=_HOSTILE,
    secret=_HOSTILE,
    bundle=_HOSTILE,
    digest=_HOSTILE,
    served=_HOSTILE,
    env_value=_HOSTILE,
)
def test_every_user_provided_value_reaches_bash_verbatim(
    tmp_path: Path,
    deployment_id: str,
    model: str,
    revision: str,
    secret: str,
    bundle: str,
    digest: str,
    served: str,
    env_value: str,
) -> None:
    launch = build_launch(
        EngineConfig(
            model=model,
            served_name=served,
            tensor_parallel=1,
            max_model_len=4096,
            max_num_seqs=8,
            max_num_batched_tokens=4096,
            gpu_memory_utilization=0.9,
            kv_cache_dtype="auto",
            weight_dtype="fp8",
            block_size=32,
            revision=revision or None,
            fp8_env=(("EXTRA_VALUE", env_value),),
        )
    )
    inputs = StartupScriptInputs(
        deployment_id=deployment_id,
        launch=launch,
        model=model,
        model_revision=revision,
        hf_token_secret=secret,
        api_key_secret=secret + "-key",
        node_agent_bundle=bundle,
        node_agent_bundle_sha256=digest,
        node_agent_env=(("TPUCTL_DEPLOYMENT_ID", deployment_id),),
        container_name="tpuctl-vllm",
    )
    script = render_startup_script(inputs)
    values = _evaluate_values(script, tmp_path)
    assert values[:8] == [deployment_id, model, revision, secret, secret + "-key", bundle, digest, "tpuctl-vllm"]
    argv_at, env_at, agent_at = values.index("ARGV"), values.index("ENV"), values.index("AGENT")
    assert tuple(values[argv_at + 1 : env_at]) == launch.argv
    assert f"EXTRA_VALUE={env_value}" in values[env_at + 1 : agent_at]
    # libtpu serves its runtime metrics (what the node agent samples) only when asked to.
    assert values[env_at + 1 : env_at + 3] == ["--env", "TPU_RUNTIME_METRICS_PORTS=8431"]
    assert values[agent_at + 1 :] == ["--env", f"TPUCTL_DEPLOYMENT_ID={deployment_id}"]
    assert not (tmp_path / "pwned").exists()
    assert bash_syntax_ok(script).returncode == 0


@pytest.mark.parametrize("field", ["deployment_id", "model", "node_agent_bundle", "node_agent_bundle_sha256"])
def test_a_nul_byte_is_refused_naming_the_field(field: str) -> None:
    base = plan_for("tiny-llama", "v6e-1")
    values = {
        "deployment_id": "ok",
        "launch": base.launch,
        "model": "m",
        "model_revision": "",
        "hf_token_secret": "",
        "api_key_secret": base.api_key_resource,
        "node_agent_bundle": "",
        "node_agent_bundle_sha256": "",
    }
    values[field] = "bad\x00value"
    with pytest.raises(InvalidMessage) as raised:
        render_startup_script(StartupScriptInputs(**values))  # type: ignore[arg-type]
    assert raised.value.field == field


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: ServingEnvironment(project="p; rm -rf /"), "project"),
        *(
            (lambda uri=uri: ServingEnvironment(project="tpuctl-test", node_agent_bundle=uri), "node_agent_bundle")
            for uri in (
                "https://storage.googleapis.com/b/node-agent/x.tar.gz",  # not gs://
                "gs://Bad_Bucket/node-agent/x.tar.gz",  # not a bucket name
                "gs://tpuctl-sources/functions/x.tar.gz",  # outside the prefix TPU VMs may read
                "gs://tpuctl-sources/node-agent/../functions/x.zip",  # a dot segment
                "gs://tpuctl-sources/node-agent/x;curl x|sh",  # shell and odd characters
            )
        ),
        *(
            (
                lambda digest=digest: ServingEnvironment(
                    project="tpuctl-test", node_agent_bundle=BUNDLE, node_agent_bundle_sha256=digest
                ),
                "node_agent_bundle_sha256",
            )
            for digest in ("", "abc", BUNDLE_SHA256.upper(), BUNDLE_SHA256 + "0")
        ),
        (
            lambda: ServingEnvironment(project="tpuctl-test", node_agent_bundle_sha256=BUNDLE_SHA256),
            "node_agent_bundle",
        ),
        *(
            (
                lambda caches=caches: ServingEnvironment(project="tpuctl-test", weights_cache_buckets=caches),
                "weights_cache_buckets",
            )
            for caches in (
                (("us east5", "tpuctl-weights"),),  # not a region
                (("us-east5", "Bad_Bucket"),),  # not a bucket name
                (("us-east5", "a;curl x|sh"),),  # shell characters
            )
        ),
        (lambda: secret_resource("tpuctl-test", "hf token"), "secret"),
        (lambda: secret_resource("tpuctl-test", "hf-token", "latest/../../x"), "secret"),
    ],
)
def test_plan_level_values_are_validated_before_rendering(call: object, field: str) -> None:
    with pytest.raises(InvalidMessage) as raised:
        call()  # type: ignore[operator]
    assert raised.value.field == field


def test_the_plan_hash_changes_exactly_when_the_launch_changes() -> None:
    first = plan_for("gemma-4-31b", "v6e-4")
    again = plan_for("gemma-4-31b", "v6e-4")
    other = plan_for("gemma-4-31b", "v6e-8")
    assert first.plan_hash == again.plan_hash
    assert first.plan_hash != other.plan_hash
    assert plan_hash(first.launch, "") != plan_hash(first.launch, "abc123")


def test_the_node_agent_reaches_the_serving_container_through_the_docker_socket() -> None:
    from node_agent.agent import SERVING_CONTAINER_NAME, NodeAgentSettings

    script = plan_for("gemma-4-26b-a4b", "v6e-4").startup_script()
    agent_run = script[script.index('docker run -d --name "${AGENT_CONTAINER}"') :]
    agent_run = agent_run[: agent_run.index("-m node_agent.agent")]
    assert "readonly DOCKER_SOCKET=/var/run/docker.sock" in script
    assert '-v "${DOCKER_SOCKET}:${DOCKER_SOCKET}"' in agent_run
    assert '--env "TPUCTL_NODE_DOCKER_HOST=unix://${DOCKER_SOCKET}"' in agent_run
    assert '--env "TPUCTL_NODE_CONTAINER=${CONTAINER}"' in agent_run
    # the socket goes to the agent only, never into the serving container
    vllm_run = script[script.index('docker run -d --name "${CONTAINER}"') :]
    assert "DOCKER_SOCKET" not in vllm_run[: vllm_run.index(">/dev/null")]
    # the agent's defaults are the script's values, so a VM works without the variables too
    assert f"CONTAINER={SERVING_CONTAINER_NAME}\n" in script
    defaults = NodeAgentSettings(deployment_id="script-check")
    assert defaults.node_container == SERVING_CONTAINER_NAME
    assert defaults.node_docker_host == "unix:///var/run/docker.sock"


def test_the_weights_cache_reaches_the_restore_as_argv_words_and_cross_region_only_when_allowed(tmp_path: Path) -> None:
    caches = (("us-east5", "tpuctl-test-weights-us-east5"), ("europe-west4", "tpuctl-test-weights-europe-west4"))
    spec = plan_for("tiny-llama", "v6e-1").spec
    for allowed, tail in ((False, []), (True, ["--cross-region"])):
        environment = ServingEnvironment(
            project="tpuctl-test", weights_cache_buckets=caches, weights_cache_cross_region=allowed
        )
        script = build_serving_plan(spec, environment).startup_script()
        result = subprocess.run(
            ["bash", "-c", values_block(script) + '\nprintf "%s\\0" "${WEIGHTS_CACHE_ARGS[@]}"'],
            capture_output=True,
            timeout=10,
            check=True,
            cwd=tmp_path,
        )
        assert result.stdout.decode().split("\0")[:-1] == [
            "--cache",
            "europe-west4=tpuctl-test-weights-europe-west4",
            "--cache",
            "us-east5=tpuctl-test-weights-us-east5",
            *tail,
        ]
    restore = script[script.index("download_weights() {") : script.index("weights_bytes() {")]
    assert "-m node_agent.weights_restore" in restore and '"${WEIGHTS_CACHE_ARGS[@]}"' in restore
    assert '-v "${AGENT_DIR}:/opt/tpuctl:ro"' in restore  # the restore runs from the verified node-agent bundle
    unconfigured = plan_for("tiny-llama", "v6e-1").startup_script()
    assert "WEIGHTS_CACHE_ARGS=(\n\n)" in values_block(unconfigured)

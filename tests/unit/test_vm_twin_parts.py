"""The VM twin's pure parts: the docker CLI's parsing and templates, the image's CPU argv and bind mapping."""

from __future__ import annotations

from pathlib import Path

import pytest

from localcloud.vm_twin.containers import ContainerSpec
from localcloud.vm_twin.docker_cli import DockerError, parse_run, render_format
from localcloud.vm_twin.image import VllmCpuImage
from localcloud.vm_twin.image_vllm import cpu_argv
from shared.domain.launch import API_KEY_FILE, KEY_WRAPPER


class TestDockerRun:
    def test_flags_in_both_spellings_then_the_image_then_its_command(self) -> None:
        options, image, command = parse_run(
            ["-d", "--name=a", "--label", "k=v", "--net=host", "-v", "/h:/c:ro", "--env", "X=1", "-e", "Y=2",
             "--entrypoint", "/bin/sh", "img:1", "-c", "echo --not-a-flag"]
        )  # fmt: skip
        assert image == "img:1" and command == ["-c", "echo --not-a-flag"]
        assert options["detach"] is True and options["name"] == "a" and options["network"] == "host"
        assert options["label"] == ["k=v"] and options["volume"] == ["/h:/c:ro"] and options["env"] == ["X=1", "Y=2"]
        assert options["entrypoint"] == "/bin/sh"

    def test_an_unknown_flag_is_refused_by_name(self) -> None:
        with pytest.raises(DockerError, match="unknown flag: --gpus"):
            parse_run(["--gpus", "all", "img:1"])

    def test_no_image_is_refused(self) -> None:
        with pytest.raises(DockerError, match="requires at least 1 argument"):
            parse_run(["--rm"])


class TestInspectFormat:
    DOCUMENT = {"State": {"Status": "running"}, "RestartCount": 2, "Config": {"Labels": {"tpuctl.plan-hash": "ab"}}}

    def test_the_two_templates_the_script_uses(self) -> None:
        assert render_format('{{ index .Config.Labels "tpuctl.plan-hash" }}', self.DOCUMENT) == "ab"
        assert render_format("{{.State.Status}} restarts={{.RestartCount}}", self.DOCUMENT) == "running restarts=2"

    def test_a_missing_value_prints_no_value_as_docker_does(self) -> None:
        assert render_format('{{ index .Config.Labels "other" }}', self.DOCUMENT) == "<no value>"

    def test_an_unsupported_template_fails_instead_of_printing_nonsense(self) -> None:
        with pytest.raises(DockerError, match="not supported"):
            render_format("{{json .State}}", self.DOCUMENT)


class TestCpuArgv:
    def test_tpu_only_flags_go_the_model_becomes_the_tiny_one_and_the_context_is_capped(self) -> None:
        argv = cpu_argv(
            ["serve", "google/gemma-4-31B-it", "--revision", "abc", "--served-model-name", "gemma-4-31b", "--host",
             "0.0.0.0", "--port", "8000", "--tensor-parallel-size", "4", "--max-model-len", "32768",
             "--gpu-memory-utilization", "0.95", "--block-size", "256", "--quantization", "fp8",
             "--disable-chunked-mm-input", "--reasoning-parser", "gemma4"],
            "/models/tiny",
            512,
        )  # fmt: skip
        assert argv[:2] == ["serve", "/models/tiny"]
        assert argv[argv.index("--max-model-len") + 1] == "512"
        assert argv[argv.index("--served-model-name") + 1] == "gemma-4-31b"
        assert argv[argv.index("--port") + 1] == "8000" and argv[argv.index("--host") + 1] == "0.0.0.0"
        for gone in ("--tensor-parallel-size", "--gpu-memory-utilization", "--block-size", "--quantization",
                     "--disable-chunked-mm-input", "--revision", "google/gemma-4-31B-it"):  # fmt: skip
            assert gone not in argv
        assert "--reasoning-parser" in argv and argv[-3:] == [
            "--enforce-eager",
            "--distributed-executor-backend",
            "uni",
        ]

    def test_the_batch_knobs_and_prefix_caching_reach_vllm_on_cpu(self) -> None:
        argv = cpu_argv(
            ["serve", "m", "--max-num-seqs", "32", "--max-num-batched-tokens=1024", "--no-enable-prefix-caching",
             "--block-size", "32", "--kv-cache-dtype", "fp8"],
            "/tiny",
            512,
        )  # fmt: skip
        assert argv[argv.index("--max-num-seqs") + 1] == "32" and "--max-num-batched-tokens=1024" in argv
        assert "--no-enable-prefix-caching" in argv
        assert "--block-size" not in argv and "--kv-cache-dtype" not in argv  # a TPU's, not the CPU build's

    def test_a_shorter_context_is_kept(self) -> None:
        argv = cpu_argv(["serve", "m", "--max-model-len=128"], "/tiny", 512)
        assert argv[argv.index("--max-model-len") + 1] == "128"

    def test_a_twin_that_compiles_runs_without_enforce_eager(self) -> None:
        argv = cpu_argv(["serve", "m", "--port", "8000"], "/tiny", 512, compile_model=True)
        assert "--enforce-eager" not in argv and argv[-2:] == ["--distributed-executor-backend", "uni"]


class TestImage:
    def test_container_paths_become_the_vm_paths_they_are_bound_from(self, tmp_path: Path) -> None:
        image = VllmCpuImage(
            tmp_path / "image",
            python=Path("/usr/bin/python3"),
            model_dir=tmp_path / "tiny",
            log_path=lambda spec: tmp_path / f"{spec.name}.log",
            env={"TWIN": "1"},
        )
        spec = ContainerSpec(
            name="tpuctl-vllm",
            image="vllm/vllm-tpu:v0.32.0",
            entrypoint=("/bin/sh",),
            cmd=("-c", KEY_WRAPPER, "tpuctl-vllm", "vllm", "serve", "m"),
            env=("HF_HOME=/root/.cache/huggingface", "OTHER=/root/.cache/huggingfacex"),
            binds=("/run/tpuctl/serving:/run/secrets/tpuctl:ro", "/var/lib/tpuctl/hf:/root/.cache/huggingface"),
        )
        launch = image.command(spec)
        assert launch.argv[0] == "/bin/sh"
        assert API_KEY_FILE not in launch.argv[2] and "/run/tpuctl/serving/vllm-api-key" in launch.argv[2]
        assert launch.env["HF_HOME"] == "/var/lib/tpuctl/hf"
        assert launch.env["OTHER"] == "/root/.cache/huggingfacex", "only whole path segments are mapped"
        assert launch.env["TWIN"] == "1" and launch.env["PATH"].startswith(str(tmp_path / "image" / "bin"))
        assert launch.log_path == tmp_path / "tpuctl-vllm.log"

    def test_only_pinned_references_exist(self, tmp_path: Path) -> None:
        image = VllmCpuImage(
            tmp_path / "image", python=Path("/x"), model_dir=tmp_path, log_path=lambda s: tmp_path, env={}
        )
        assert image.has("vllm/vllm-tpu:v0.32.0")
        assert not image.has("vllm/vllm-tpu:latest") and not image.has("vllm/vllm-tpu")

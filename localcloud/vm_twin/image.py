"""The VM twin's serving image: what ``vllm/vllm-tpu:<tag>`` is on a machine with no TPU and no weights.

Why: a TPU VM pulls the pinned vLLM TPU image and runs ``python3`` (the weights download, the node agent) and
``/bin/sh -c <key wrapper> vllm serve ...`` in it. Here the image is the vLLM-on-CPU venv: its ``python3`` is that
venv's interpreter (with ``huggingface_hub``, and a stand-in ``libtpu`` SDK reading the VM's device file), and its
``vllm`` runs ``localcloud/vm_twin/image_vllm.py``, which serves the tiny local model in place of the named one and
drops what only a TPU understands. Binds are honoured by mapping every container path in the command and
environment to the VM path it is bound from (the twin's containers share the VM's filesystem). This is the only
place where a container differs from production's.

The VM's Hugging Face cache starts empty, as a new TPU VM's does: the weights restore fetches every catalog model
from the Hub stand-in (``hub_api``, each model served as the tiny model's files) or from the region's cache bucket;
a model that is not in the catalog is not on the Hub, and its restore fails as a missing repository does.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

from localcloud.vm_twin.containers import ContainerSpec, Launch
from shared.domain.errors import InvalidMessage
from shared.domain.launch import check_image

__all__ = ["VllmCpuImage"]

_IMAGE_VLLM = Path(__file__).with_name("image_vllm.py")
# The image's Python carries libtpu on a TPU image; here a stand-in, on python3's path only (not vllm's).
_LIBTPU_STANDIN = Path(__file__).with_name("libtpu_standin")
_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Run in the container's fresh network namespace: "$0" is ip(8), "$@" the container's command (exec keeps its pid).
_LOOPBACK_UP = '"$0" link set lo up && exec "$@"'


class VllmCpuImage:
    """Every pinned image reference runs as the vLLM-on-CPU venv, with the tiny model as its weights."""

    def __init__(
        self,
        root: Path,
        *,
        python: Path,
        model_dir: Path,
        log_path: Callable[[ContainerSpec], Path],
        env: Mapping[str, str],
        max_model_len: int = 512,
    ) -> None:
        self.root = root
        self._log_path = log_path
        self._env = {
            **env,
            "TPUCTL_TWIN_MODEL_DIR": str(model_dir),
            "TPUCTL_TWIN_MAX_MODEL_LEN": str(max_model_len),
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1",
        }
        bin_dir = root / "bin"
        bin_dir.mkdir(parents=True, exist_ok=True)
        # Scripts, not links: a venv's interpreter finds its packages from the path it is started by.
        standin = f'PYTHONPATH="{_LIBTPU_STANDIN}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{python}" "$@"'
        for name, text in (("python3", standin), ("vllm", f'exec "{python}" "{_IMAGE_VLLM}" "$@"')):
            program = bin_dir / name
            program.write_text(f"#!/bin/sh\n{text}\n", encoding="utf-8")
            program.chmod(0o755)

    def has(self, reference: str) -> bool:
        try:
            check_image(reference)
        except InvalidMessage:
            return False
        return True

    def command(self, spec: ContainerSpec) -> Launch:
        binds = _binds(spec.binds)
        env = {"PATH": f"{self.root / 'bin'}:{_SYSTEM_PATH}", "HOME": "/root", "LANG": "C.UTF-8", **self._env}
        for entry in spec.env:
            name, _, value = entry.partition("=")
            env[name] = _map_paths(value, binds)
        env.update(self._env)  # the twin's own settings last: endpoints and the stand-in weights
        words = [_map_paths(word, binds) for word in (*spec.entrypoint, *spec.cmd)]
        if not words:
            raise ValueError(f"container {spec.name}: no command (the image has no default command)")
        words[0] = self._resolve(words[0], env["PATH"])
        if spec.network_mode == "none":  # a network namespace of its own with loopback only, as Docker's "none"
            ip = self._resolve("ip", _SYSTEM_PATH)
            words = [self._resolve("unshare", _SYSTEM_PATH), "--net", "--", "/bin/sh", "-c", _LOOPBACK_UP, ip, *words]
        return Launch(argv=tuple(words), env=env, log_path=self._log_path(spec))

    def _resolve(self, program: str, path: str) -> str:
        if "/" in program:
            return program
        found = shutil.which(program, path=path)
        if found is None:
            raise ValueError(f'exec: "{program}": executable file not found in $PATH')
        return found


def _binds(binds: tuple[str, ...]) -> list[tuple[str, str]]:
    """(container path, VM path) pairs, longest container path first."""
    pairs = []
    for bind in binds:
        parts = bind.split(":")
        if len(parts) < 2:
            raise ValueError(f"bind {bind!r}: expected HOST:CONTAINER[:ro]")
        pairs.append((parts[1].rstrip("/") or "/", parts[0].rstrip("/") or "/"))
    return sorted(pairs, key=lambda pair: len(pair[0]), reverse=True)


def _map_paths(text: str, binds: list[tuple[str, str]]) -> str:
    """Every container path in ``text`` replaced by the VM path it is bound from."""
    for inside, outside in binds:
        text = re.sub(re.escape(inside) + r"(?=/|$|[\"'\s;])", outside.replace("\\", "\\\\"), text)
    return text

"""The shared compilation cache: what an entry is keyed by, how it is named, and who may write it.

Why this shape: a compile cache holds executable artefacts (XLA executables on a TPU, Inductor's kernels on a CPU)
that every later VM loads into its engine, so unlike the weights (checked against the Hub's own digests) nothing a
reader does can prove an entry harmless. Trust therefore rests on who writes: only a *builder* VM, started by
``tpuctl prewarm`` under its own service account that has write access to ``compile/`` and that never serves (no
proxy, no port: it parses no untrusted input), fills an entry. Serving VMs (hostile once they serve) may only read
``compile/``; Terraform's IAM conditions and the twin's Storage stand-in both enforce that split.

An entry is two objects in the region's cache bucket, written in this order:

* ``compile/models--ORG--NAME/<key>/<sha256>.tar``: the archive of vLLM's compiled-artefact directories, named by
  its own SHA-256, so a reader checks the bytes against the name;
* ``compile/models--ORG--NAME/<key>.json``: the manifest ``{"key", "archive", "sha256", "bytes"}``, written last with
  ``ifGenerationMatch`` (0 for a new entry, the refused generation for a refill), so an entry is visible only whole
  and of two concurrent builders one manifest wins (the loser's archive is left to the bucket's age-delete rule).

The key is everything that changes what is compiled: the image, vLLM's argv and environment, the model revision and
the slice (its topology decides the sharding). Over-keying only costs a miss; under-keying would load a wrong
executable, so the whole argv is in it.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from shared.domain.launch import VllmLaunch
from shared.domain.weights_cache import repo_folder

__all__ = [
    "COMPILED_DIRS",
    "COMPILE_PREFIX",
    "FILL_OUTCOMES",
    "MAX_MANIFEST_BYTES",
    "RESTORE_OUTCOMES",
    "CompileManifest",
    "archive_name",
    "checked_key",
    "compile_key",
    "manifest_name",
    "parse_manifest",
]

COMPILE_PREFIX = "compile/"
# What vLLM compiles into under VLLM_CACHE_ROOT: the JAX/XLA cache on a TPU (VLLM_XLA_CACHE_PATH), Inductor's on a CPU.
COMPILED_DIRS = ("xla_cache", "torch_compile_cache")
# A serving boot's restore, as the boot stage ``compile_restore`` reports it: restored from the bucket, no entry,
# an entry refused (bad digest or manifest), artefacts already on this disk, no cache configured.
RESTORE_OUTCOMES = ("hit", "miss", "refused", "local", "off")
# A builder's fill, as ``compile_fill`` reports it: written (or refilled), another builder's good entry was there,
# nothing was compiled, this account may not write compile/, no cache configured.
FILL_OUTCOMES = ("filled", "present", "empty", "denied", "off")
_KEY = re.compile(r"^[0-9a-f]{32}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
MAX_MANIFEST_BYTES = 4096


def compile_key(launch: VllmLaunch, revision: str, accelerator: str) -> str:
    """32 hex digits naming what this launch compiles on this slice (image, argv, env, revision, slice)."""
    parts = (launch.image, *launch.argv, *(f"{name}={value}" for name, value in launch.env), revision, accelerator)
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:32]


def checked_key(key: str) -> str:
    """``key`` when it is 32 lower-case hex digits (what ``compile_key`` makes), else ValueError."""
    if not _KEY.fullmatch(key):
        raise ValueError(f"compile cache key {key!r} is not 32 lower-case hex digits")
    return key


def manifest_name(model: str, key: str) -> str:
    """``compile/models--ORG--NAME/<key>.json``: the object a reader looks up first."""
    return f"{COMPILE_PREFIX}{repo_folder(model)}/{checked_key(key)}.json"


def archive_name(model: str, key: str, sha256: str) -> str:
    """``compile/models--ORG--NAME/<key>/<sha256>.tar``: the archive, named by its own digest."""
    if not _SHA256.fullmatch(sha256):
        raise ValueError(f"archive digest {sha256!r} is not 64 lower-case hex digits")
    return f"{COMPILE_PREFIX}{repo_folder(model)}/{checked_key(key)}/{sha256}.tar"


@dataclass(frozen=True, slots=True)
class CompileManifest:
    """One entry: the archive it names, that archive's SHA-256 and size."""

    key: str
    archive: str
    sha256: str
    bytes: int

    def to_json(self) -> str:
        return json.dumps({"key": self.key, "archive": self.archive, "sha256": self.sha256, "bytes": self.bytes})


def parse_manifest(text: str | bytes, model: str, key: str) -> CompileManifest:
    """The manifest of ``model``'s entry ``key``, or ValueError naming what is wrong (then the entry is refused)."""
    if len(text) > MAX_MANIFEST_BYTES:
        raise ValueError(f"manifest is {len(text)} bytes, over {MAX_MANIFEST_BYTES}")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: deeply nested arrays, e.g. "[" * 2000
        raise ValueError(f"manifest is not JSON: {exc}") from exc
    if not isinstance(data, dict) or set(data) != {"key", "archive", "sha256", "bytes"}:
        raise ValueError("manifest must be an object with exactly key, archive, sha256 and bytes")
    size = data["bytes"]
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        raise ValueError(f"manifest bytes {size!r} is not a positive integer")
    sha256 = data["sha256"] if isinstance(data["sha256"], str) else ""
    if data["key"] != key or data["archive"] != archive_name(model, key, sha256):
        raise ValueError(f"manifest names {data['archive']!r} for key {data['key']!r}, not this entry's archive")
    return CompileManifest(key=key, archive=data["archive"], sha256=sha256, bytes=size)

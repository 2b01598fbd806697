"""Read a shared compile cache entry's manifest from a cache bucket, checked.

Why one reader: the VM's restore and fill (``node_agent.compile_cache``) and the plan's cache state
(``CloudStorageCacheState.compiled_bytes``) must agree on what counts as an entry (``shared.domain.compile_cache``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from shared.domain.compile_cache import MAX_MANIFEST_BYTES, CompileManifest, manifest_name, parse_manifest

__all__ = ["EntryBucket", "read_manifest"]


class EntryBucket(Protocol):
    def stat(self, name: str) -> tuple[int, int] | None: ...
    def read_to(self, name: str, generation: int, size: int, path: Path) -> None: ...


def read_manifest(bucket: EntryBucket, model: str, key: str, path: Path) -> tuple[int, CompileManifest | str] | None:
    """The entry's manifest (read into ``path``) and its generation: parsed, or why it is refused; None when there
    is none. Storage errors pass through."""
    name = manifest_name(model, key)
    found = bucket.stat(name)
    if found is None:
        return None
    size, generation = found
    if size > MAX_MANIFEST_BYTES:
        return generation, f"the manifest is {size} bytes, over {MAX_MANIFEST_BYTES}"
    bucket.read_to(name, generation, size, path)
    try:
        return generation, parse_manifest(path.read_bytes(), model, key)
    except ValueError as exc:
        return generation, str(exc)

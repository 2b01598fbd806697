"""A cache bucket in memory for the node agent's unit tests (weights and compile cache restores and fills).

Objects by name with generations; ``ifGenerationMatch`` checked atomically, as Cloud Storage does. ``broken``: every
stat fails with ``broken_error``; ``deny_writes``: every write is a 403, as for an account without write access.
``stats`` and ``reads`` count metadata and media reads apart, so a test can tell "looked" from "downloaded".
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

from shared.domain.errors import CloudError, ErrorClass

__all__ = ["MemoryBucket"]


class MemoryBucket:
    def __init__(self, bucket: str = "cache-us-east5", location: str = "us-east5") -> None:
        self.bucket = bucket
        self._location = location
        self.objects: dict[str, tuple[int, bytes]] = {}
        self.stats: Counter[str] = Counter()
        self.reads: Counter[str] = Counter()
        self.writes: Counter[str] = Counter()
        self.refusals = 0
        self.broken = False
        self.broken_error = CloudError(ErrorClass.PERMISSION, "HTTP 403", code=403)
        self.deny_writes = False
        self._next = 1000
        self._lock = threading.Lock()

    def location(self) -> str:
        return self._location

    def stat(self, name: str) -> tuple[int, int] | None:
        self.stats[name] += 1
        if self.broken:
            raise self.broken_error
        found = self.objects.get(name)
        return None if found is None else (len(found[1]), found[0])

    def read_to(self, name: str, generation: int, size: int, path: Path) -> None:
        stored_generation, data = self.objects[name]
        assert stored_generation == generation and len(data) == size
        self.reads[name] += 1
        path.write_bytes(data)

    def write_from(self, name: str, path: Path, *, if_generation: int) -> bool:
        if self.deny_writes:
            raise CloudError(ErrorClass.PERMISSION, f"upload of {self.where(name)}: HTTP 403", code=403)
        with self._lock:
            current = self.objects.get(name)
            if (current[0] if current else 0) != if_generation:
                self.refusals += 1
                return False
            self._next += 1
            self.objects[name] = (self._next, path.read_bytes())
            self.writes[name] += 1
            return True

    def where(self, name: str) -> str:
        return f"gs://{self.bucket}/{name}"

    def put(self, name: str, data: bytes) -> None:
        """Store ``data`` as a new generation of ``name`` behind every check (a tampered or foreign object)."""
        self._next += 1
        self.objects[name] = (self._next, data)

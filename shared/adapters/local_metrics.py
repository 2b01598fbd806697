"""``JsonLinesMetricWriter``: the embedded default ``MetricWriter``, one JSON object per point in a file.

``var/metrics.jsonl`` under the data directory: ``tail -f`` it, or load it into anything that reads JSON lines.
When the file passes ``max_bytes`` it is renamed to ``metrics.jsonl.1`` (the one before is dropped), so a long
``make up`` never fills the disk.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path

from shared.domain.errors import CloudError, ErrorClass
from shared.domain.sli_metrics import MetricPoint

__all__ = ["JsonLinesMetricWriter"]

_DEFAULT_MAX_BYTES = 32 * 1024 * 1024


class JsonLinesMetricWriter:
    """Appends points to ``path``; one write is one ``write`` call on the file, so readers see whole batches."""

    def __init__(self, path: Path, *, max_bytes: int = _DEFAULT_MAX_BYTES) -> None:
        self._path = path
        self._max_bytes = max_bytes
        self._lock = threading.Lock()

    def write(self, points: Sequence[MetricPoint]) -> None:
        if not points:
            return
        text = "".join(
            json.dumps(
                {"metric": p.metric_type, "labels": dict(p.labels), "value": p.value, "at": p.at.isoformat()},
                sort_keys=True,
            )
            + "\n"
            for p in points
        )
        try:
            with self._lock:
                self._path.parent.mkdir(parents=True, exist_ok=True)
                if self._path.exists() and self._path.stat().st_size >= self._max_bytes:
                    os.replace(self._path, self._path.with_name(self._path.name + ".1"))
                with self._path.open("a", encoding="utf-8") as out:
                    out.write(text)
        except OSError as exc:
            raise CloudError(ErrorClass.TRANSIENT, f"metrics file {self._path}: {exc.strerror or exc}") from exc

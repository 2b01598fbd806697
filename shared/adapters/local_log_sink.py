"""``LocalFilesLogSink``: the embedded ``LogSink``, which sends nothing anywhere.

Why: on the embedded default the serving container's own log file (``{data_dir}/logs/vllm-<deployment>.log``) is
the log store, read by ``JsonLinesLogReader``; shipping its lines again would only write them twice. The node agent
runs the same shipper on every backend, so what differs is this port, chosen in ``shared.wiring``.
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.ports import NodeLogLine

__all__ = ["LocalFilesLogSink"]


class LocalFilesLogSink:
    """Takes every batch and keeps nothing: the lines are already in the local log files."""

    def write(self, lines: Sequence[NodeLogLine]) -> None:
        return None

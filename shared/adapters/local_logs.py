"""``JsonLinesLogReader``: the embedded ``LogReader`` over the log files the local stack writes.

Layout (the contract with the local cloud runner): one folder, ``{data_dir}/logs``, holding
``<component>[-<deployment_id>].jsonl`` or ``.log`` files; the component name has no ``-``.
A line is either one JSON object as ``shared.logging`` writes it (``severity``, ``message``, ``time``,
``deployment_id``, ...) or plain text, such as vLLM's ``(APIServer pid=1) INFO 12-02 12:00:00 [file.py:12] text``
lines, whose severity is read as the node agent reads it before shipping (``shared.domain.vllm_logs``: uvicorn
access lines by status, a traceback's lines inherit), so a severity filter means the same on both backends.
Components whose name starts with ``node``, ``vllm`` or ``agent`` are the TPU VM ("node"); the rest are the
controller.

Reads are bounded: only the last ``tail_bytes`` of each file are parsed, so a large log costs the same as a
small one.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from shared.domain.vllm_logs import VllmLogParser
from shared.ports import LOG_SEVERITIES, LogEntry, LogQuery

__all__ = ["JsonLinesLogReader", "source_of"]

_NODE_PREFIXES = ("node", "vllm", "agent")
_RANK = {name: rank for rank, name in enumerate(LOG_SEVERITIES)}


def source_of(component: str) -> str:
    """``vllm-gemma-a`` -> ``node``; ``provision`` -> ``controller``."""
    return "node" if component.lower().startswith(_NODE_PREFIXES) else "controller"


class JsonLinesLogReader:
    """Reads ``*.jsonl`` and ``*.log`` files in one folder, newest entries first."""

    def __init__(self, directory: str | Path, *, tail_bytes: int = 1_000_000) -> None:
        self._dir = Path(directory)
        self._tail_bytes = tail_bytes

    def read(self, query: LogQuery) -> list[LogEntry]:
        if not self._dir.is_dir():
            return []
        floor = _RANK.get(query.min_severity, 0)
        found: list[tuple[float, int, LogEntry]] = []
        order = 0
        for path in sorted(self._dir.iterdir()):
            if path.suffix not in (".jsonl", ".log") or not path.is_file():
                continue
            component = path.stem
            source = source_of(component)
            if query.source != "any" and source != query.source:
                continue
            file_time = datetime.fromtimestamp(path.stat().st_mtime, UTC)
            text_lines = VllmLogParser()  # one per file: a traceback's lines follow the line that began it
            for line in self._tail_lines(path):
                entry = _parse(line, component, text_lines)
                if entry is None:
                    continue
                if _RANK.get(entry.severity, 0) < floor:
                    continue
                if query.deployment_id and not _belongs(entry, component, query.deployment_id):
                    continue
                if query.since and entry.time is not None and entry.time < query.since:
                    continue
                if query.since and entry.time is None and file_time < query.since:
                    continue
                order += 1
                stamp = (entry.time or file_time).timestamp()
                found.append((stamp, order, entry))
        found.sort(key=lambda item: (item[0], item[1]), reverse=True)
        return [entry for _, _, entry in found[: max(0, query.limit)]]

    def _tail_lines(self, path: Path) -> list[str]:
        with path.open("rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            start = max(0, size - self._tail_bytes)
            handle.seek(start)
            data = handle.read()
        if start > 0:  # the first line is probably cut: drop it
            data = data.split(b"\n", 1)[1] if b"\n" in data else b""
        return data.decode("utf-8", errors="replace").splitlines()


def _parse(line: str, component: str, text_lines: VllmLogParser) -> LogEntry | None:
    text = line.strip()
    if text.startswith("{"):
        try:
            record = json.loads(text)
        except ValueError:
            record = None
        if isinstance(record, dict):
            return _from_record(record, component)
    severity = text_lines.parse(line).severity  # blank lines too: they may sit inside a traceback
    if not text:
        return None
    return LogEntry(time=None, severity=severity, source=component, message=text)


def _from_record(record: dict[str, Any], component: str) -> LogEntry:
    severity = str(record.get("severity") or record.get("level") or "DEFAULT").upper()
    if severity not in _RANK:
        severity = "WARNING" if severity == "WARN" else "DEFAULT"
    message = record.get("message", record.get("msg", ""))
    deployment_id = record.get("deployment_id")
    return LogEntry(
        time=_time(record.get("time") or record.get("timestamp")),
        severity=severity,
        source=str(record.get("component") or component),
        message=message if isinstance(message, str) else json.dumps(message, default=str),
        deployment_id=str(deployment_id) if deployment_id else None,
    )


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _belongs(entry: LogEntry, component: str, deployment_id: str) -> bool:
    if entry.deployment_id is not None:
        return entry.deployment_id == deployment_id
    _, _, suffix = component.partition("-")
    return suffix == deployment_id

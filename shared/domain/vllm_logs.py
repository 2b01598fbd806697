"""The severity of each line vLLM's container writes, as Cloud Logging names it.

Why: vLLM writes plain text to stdout and stderr, which Cloud Logging files as ``DEFAULT``, so a severity filter
(``tpu_observe(show='logs')`` from WARNING up, ``tpu_observe(show='analysis')``) would see nothing of it. What vLLM
0.32 writes (the files ``tests/fixtures/vllm/real_vllm_*.log`` were captured from it):

* its own logger: ``[(<process> pid=N) ]LEVEL MM-DD HH:MM:SS [file.py:line] text``; the process is ``APIServer``,
  ``EngineCore_DP0``, ``Worker``, ...;
* uvicorn: ``LEVEL:    text``; an access line ``INFO:     host:port - "GET /path HTTP/1.1" 503 ...`` is ``ERROR``
  for a 5xx and ``WARNING`` for a 4xx, as Google's load balancers file requests;
* PyTorch and TPU runtimes (glog): ``[W1203 19:50:05.764 utils.cpp:68] ...`` or ``E1203 ...`` (I, W, E, F);
* Python warnings: ``/path/file.py:138: FutureWarning: ...``;
* tracebacks: ``Traceback (most recent call last):`` begins one; it is at least ``ERROR`` (an uncaught crash is
  never hidden under the INFO line before it), or the level of the log line that printed it if higher. Its frames,
  carets, exception line, chained-exception notes and blank lines between them continue it; a log line of its own
  printed in between (an access line) keeps its own level and does not end it;
* an indented line continues the line before it (a warning's source line, a multi-line message).

Every continuation inherits the severity of the line that began its block; anything unrecognised is ``DEFAULT``.
Blocks are followed per process prefix, because the API server's lines and the engine's interleave.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

__all__ = ["PROBE_PATHS", "SEVERITY_RANK", "VllmLine", "VllmLogParser", "is_probe_access", "severities"]

Severity = Literal["DEFAULT", "DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
SEVERITY_RANK: dict[str, int] = {"DEFAULT": 0, "DEBUG": 100, "INFO": 200, "WARNING": 400, "ERROR": 500, "CRITICAL": 600}

_MAX_EXAMINED = 400  # every pattern is anchored at the start: a long line is judged by its head
_PREFIX = re.compile(r"^\((?P<process>[^()\n]{1,60}?) pid=\d{1,10}\) ?")
_LEVELS: dict[str, Severity] = {
    "DEBUG": "DEBUG",
    "INFO": "INFO",
    "WARNING": "WARNING",
    "WARN": "WARNING",
    "ERROR": "ERROR",
    "CRITICAL": "CRITICAL",
    "FATAL": "CRITICAL",
}
_VLLM = re.compile(r"^(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[")
_UVICORN = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL):\s+(.*)$")
# ``host:port - "GET /path HTTP/1.1" 200``; behind the serving proxy vLLM listens on a unix socket and the client
# part is empty (``- "GET /path ..."``).
_ACCESS = re.compile(r'^(?:\S+ )?- "(?P<method>[A-Z]+) (?P<path>[^\s?]+)\S* HTTP/[\d.]+" (\d{3})\b')
# What the monitor and the serving proxy's checks ask every tick: a success here is noise to a person reading.
PROBE_PATHS = frozenset({"/health", "/v1/models", "/metrics", "/version", "/ping"})
_GLOG = re.compile(r"^\[?([IWEF])\d{4} \d\d:\d\d:\d+(?:\.\d+)?\s")
_GLOG_LEVELS: dict[str, Severity] = {"I": "INFO", "W": "WARNING", "E": "ERROR", "F": "CRITICAL"}
_PY_WARNING = re.compile(r"^\S.*?:\d+: [A-Z]\w*Warning: ")
_TRACEBACK = "Traceback (most recent call last):"
_CHAINED = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?::|$)")


@dataclass(frozen=True, slots=True)
class VllmLine:
    """One line judged: its severity, the vLLM process that wrote it (if prefixed), and whether it continues a block."""

    severity: Severity
    process: str | None = None
    continuation: bool = False


@dataclass
class _Block:
    severity: Severity
    traceback: bool = False
    ended: bool = False  # a traceback's exception line was seen


class VllmLogParser:
    """Judges lines in the order the container wrote them; keeps the open block of each process."""

    def __init__(self) -> None:
        self._blocks: dict[str, _Block] = {}

    def parse(self, line: str) -> VllmLine:
        head = line[:_MAX_EXAMINED].rstrip("\r\n")
        prefix = _PREFIX.match(head)
        process = prefix.group("process") if prefix else None
        body = head[prefix.end() :] if prefix else head
        key = process or ""
        block = self._blocks.get(key)
        if block is not None and _continues(block, body):
            return VllmLine(block.severity, process, continuation=True)
        severity, opens_traceback = _judge(body)
        if block is not None and block.traceback and not block.ended and not opens_traceback:
            return VllmLine(severity, process)  # a line of its own inside a traceback still being printed
        if opens_traceback and block is not None and SEVERITY_RANK[block.severity] > SEVERITY_RANK[severity]:
            severity = block.severity  # a CRITICAL record that printed its traceback keeps its level
        self._blocks[key] = _Block(severity, traceback=opens_traceback)
        return VllmLine(severity, process)


def severities(lines: Iterable[str]) -> list[Severity]:
    """The severity of each line, in order (one parser over all of them)."""
    parser = VllmLogParser()
    return [parser.parse(line).severity for line in lines]


def is_probe_access(line: str) -> bool:
    """Whether ``line`` is vLLM's access line for a probe that succeeded (``GET /health`` 200 and the like).

    The monitor probes every deployment each tick, so these fill a log tail; readers leave them out unless asked.
    A probe that failed (4xx, 5xx) is not one of them: it is what a person is looking for.
    """
    head = line[:_MAX_EXAMINED].rstrip("\r\n")
    prefix = _PREFIX.match(head)
    uvicorn = _UVICORN.match(head[prefix.end() :] if prefix else head)
    access = _ACCESS.match(uvicorn.group(2)) if uvicorn else None
    return (
        access is not None
        and access.group("method") in ("GET", "HEAD")
        and access.group("path") in PROBE_PATHS
        and access.group(3)[0] == "2"
    )


def _judge(body: str) -> tuple[Severity, bool]:
    """(severity, whether the line opens a traceback) of a line that continues nothing."""
    if body.startswith(_TRACEBACK):
        return "ERROR", True
    if match := _VLLM.match(body):
        return _LEVELS[match.group(1)], False
    if match := _UVICORN.match(body):
        status = _ACCESS.match(match.group(2))
        if status is not None and status.group(3)[0] in "45":
            return ("ERROR" if status.group(3)[0] == "5" else "WARNING"), False
        return _LEVELS[match.group(1)], False
    if match := _GLOG.match(body):
        return _GLOG_LEVELS[match.group(1)], False
    if _PY_WARNING.match(body):
        return "WARNING", False
    return "DEFAULT", False


def _continues(block: _Block, body: str) -> bool:
    """Whether ``body`` belongs to ``block`` (and move the traceback on when it does)."""
    indented = body[:1].isspace()
    if not block.traceback:
        return indented and bool(body.strip())
    if indented or not body.strip() or body.startswith(_CHAINED):
        block.ended = block.ended and not body.startswith(_CHAINED)
        return True
    if body.startswith(_TRACEBACK):
        block.ended = False
        return True
    if _VLLM.match(body) or _UVICORN.match(body) or _GLOG.match(body):
        return False  # a log line of its own, interleaved before the exception line
    if not block.ended and _EXCEPTION_LINE.match(body):
        block.ended = True
        return True
    return False

"""Forensics before a restart: the debug bundle the node agent captures of a sick vLLM engine.

Why: a restart destroys the evidence. A STALLED engine (a hung EngineCore, a deadlocked collective, a compile
that never ends) or a DOWN one leaves nothing behind once its container starts again, so before the monitor or a
user restarts it the agent captures what only the live processes can still tell (``shared.domain.debug_bundle``):

* all-thread Python stacks of the container's processes, the main one and every descendant (py-spy's
  ``dump --nonblocking`` reads a process's memory without stopping it, and a SIGSTOPped one without running it),
  with each process's state (``T (stopped)``, ``D (disk sleep)``, ...) and command line;
* the newest log lines, a ``/metrics`` snapshot, ``tpu-info``'s output and the boot's guest attributes.

Capturing is evidence gathering on a node in trouble, so :func:`capture_bundle` never raises: a part that fails
(py-spy missing, the API server refusing, the metadata server slow) is recorded in that part, and the whole
capture keeps to one deadline (a later part gets the time that is left, or is recorded as skipped). What the
engine's processes hold is untrusted text that may carry the API key: every captured string is cleaned (no
terminal escapes or control characters) and redacted (registered secrets, the API key, token-shaped strings).
:func:`encode_bundle` makes the JSON object stores take: at most ``MAX_BUNDLE_BYTES``, trimmed in a fixed order
that is recorded in the bundle when needed.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

import node_agent
from node_agent.log_lines import clean_log_line
from shared.domain.debug_bundle import BUNDLE_VERSION, MAX_BUNDLE_BYTES
from shared.domain.startup_script import GUEST_ATTRIBUTE_NAMESPACE
from shared.logging import REDACTED, redact, scrub_untrusted
from shared.ports import ServingContainer

__all__ = ["ForensicsSources", "capture_bundle", "encode_bundle", "find_py_spy"]

PY_SPY_TIMEOUT_S = 20.0
HTTP_TIMEOUT_S = 3.0
TPU_INFO_TIMEOUT_S = 15.0
MAX_COMMAND_CHARS = 500
MAX_ERROR_CHARS = 500
MAX_FRAME_TEXT_CHARS = 500
MAX_METRICS_CHARS = 256 * 1024
MAX_TPU_INFO_CHARS = 64 * 1024
MAX_PROCESSES = 64
MAX_GUEST_KEYS = 32
MAX_GUEST_VALUE_CHARS = 4096
KEPT_FRAMES_PER_THREAD = 60
STEPS = ("stacks", "logs", "metrics", "tpu_info", "boot")
PID_NOT_VISIBLE = (
    "the container's process {pid} is not visible here; fix: run the agent in the host's PID namespace "
    "(docker run --pid=host) with --cap-add SYS_PTRACE so py-spy may read the engine's memory"
)
TPU_INFO_MISSING = "tpu-info is not installed on this node (pip install tpu-info in the image)"
PY_SPY_MISSING = (
    "py-spy not installed on this node, so no stacks were taken; fix: install the node-agent bundle that pins "
    "py-spy (scripts/node_agent_requirements.txt) or put py-spy on the agent's PATH"
)


@dataclass(frozen=True)
class ForensicsSources:
    """Where a capture looks: the container, its vLLM, the metadata server and the tools on this node."""

    container: ServingContainer
    vllm_url: str  # e.g. http://127.0.0.1:8000; /metrics is read from it
    api_key: str | None  # redacted from everything captured; sent as Bearer to /metrics
    metadata_url: str | None  # e.g. http://metadata.google.internal/computeMetadata/v1; None: no boot attributes
    py_spy: Path | None  # from find_py_spy(); None: stacks are recorded as unavailable, with the fix
    tpu_info: tuple[str, ...] = ("tpu-info",)  # argv of the tpu-info CLI; argv[0] is looked up on PATH


def find_py_spy() -> Path | None:
    """py-spy on PATH, else the ``bin/py-spy`` that ``pip install --target`` put beside the agent's packages (the
    node-agent bundle), else the one beside this interpreter (a virtual environment's ``bin``)."""
    found = shutil.which("py-spy")
    if found:
        return Path(found)
    for candidate in (
        Path(node_agent.__file__).resolve().parents[1] / "bin" / "py-spy",
        Path(sys.executable).parent / "py-spy",
    ):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


class _Deadline:
    """The capture's one budget: what is left of it, in seconds."""

    def __init__(self, seconds: float) -> None:
        self._ends = time.monotonic() + seconds
        self.seconds = seconds

    def remaining(self) -> float:
        return max(0.0, self._ends - time.monotonic())

    def skipped(self) -> str:
        return f"skipped: the capture's {self.seconds:g} s deadline was spent"


def _clean(text: str, api_key: str | None, limit: int) -> str:
    """One line of untrusted text, cleaned, redacted and cut to ``limit`` characters."""
    return scrub_untrusted(text, limit, also_redact=api_key)[0]


def _clean_lines(text: str, api_key: str | None, limit: int) -> str:
    """Multi-line untrusted text (a metrics page, a tool's output): each line cleaned, the whole cut to ``limit``."""
    lines = [clean_log_line(line, api_key) for line in text.splitlines()]
    joined = "\n".join(lines)
    return joined if len(joined) <= limit else joined[: max(0, limit - 1)] + "…"


def _failure(error: str) -> dict[str, Any]:
    return {"ok": False, "text": "", "error": error}


# ---------------------------------------------------------------------------------------------- processes


def _read_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, ppid) from ``/proc/<pid>/stat``; the command name may hold spaces and parentheses."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()
    if len(fields) < 2 or not fields[1].lstrip("-").isdigit():
        return None
    return fields[0], int(fields[1])


def _parents() -> dict[int, int]:
    """Every visible process's parent, from ``/proc/*/stat``."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _read_stat(int(entry.name))
            if stat is not None:
                parents[int(entry.name)] = stat[1]
    return parents


def process_tree(root: int) -> list[tuple[int, int]]:
    """(pid, ppid) of ``root`` and all its descendants, parents before children, at most ``MAX_PROCESSES``."""
    parents = _parents()
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found = [(root, parents.get(root, 0))]
    queue = [root]
    while queue and len(found) < MAX_PROCESSES:
        parent = queue.pop(0)
        for child in sorted(children.get(parent, [])):
            if len(found) < MAX_PROCESSES:
                found.append((child, parent))
                queue.append(child)
    return found


def _process_state(pid: int) -> str:
    try:
        for line in Path(f"/proc/{pid}/status").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("State:"):
                return line.removeprefix("State:").strip()
    except OSError:
        return "gone (no /proc entry)"
    return "unknown"


def _process_command(pid: int, api_key: str | None) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    words = raw.decode("utf-8", errors="replace").split("\0")
    return _clean(" ".join(word for word in words if word), api_key, MAX_COMMAND_CHARS)


# ---------------------------------------------------------------------------------------------- stacks


def _frame(raw: Any, api_key: str | None) -> dict[str, Any]:
    frame = raw if isinstance(raw, dict) else {}
    line = frame.get("line")
    return {
        "function": _clean(str(frame.get("name") or ""), api_key, MAX_FRAME_TEXT_CHARS),
        "file": _clean(str(frame.get("filename") or ""), api_key, MAX_FRAME_TEXT_CHARS),
        "line": line if isinstance(line, int) else None,
    }


def _thread(raw: Any, api_key: str | None) -> dict[str, Any]:
    """One thread of py-spy's JSON (frames innermost first), as the bundle keeps it."""
    thread = raw if isinstance(raw, dict) else {}
    thread_id, os_thread_id, name = thread.get("thread_id"), thread.get("os_thread_id"), thread.get("thread_name")
    frames = thread.get("frames")
    return {
        "thread_id": thread_id if isinstance(thread_id, int) else None,
        "os_thread_id": os_thread_id if isinstance(os_thread_id, int) else None,
        "name": _clean(name, api_key, MAX_FRAME_TEXT_CHARS) if isinstance(name, str) else None,
        "active": thread.get("active") is True,
        "owns_gil": thread.get("owns_gil") is True,
        "frames": [_frame(frame, api_key) for frame in frames] if isinstance(frames, list) else [],
    }


def _py_spy_error(stderr: bytes, returncode: int, api_key: str | None) -> str:
    text = stderr.decode("utf-8", errors="replace").split("Stack backtrace:", 1)[0].strip()
    return _clean(text or f"py-spy exited with {returncode}", api_key, MAX_ERROR_CHARS)


def dump_stacks(
    py_spy: Path, pid: int, timeout_s: float, api_key: str | None
) -> tuple[list[dict[str, Any]], str | None]:
    """All threads of ``pid`` from ``py-spy dump --json --nonblocking``: (threads, None) or ([], why not)."""
    argv = [str(py_spy), "dump", "--pid", str(pid), "--json", "--nonblocking"]
    env = {**os.environ, "RUST_BACKTRACE": "0"}
    try:
        done = subprocess.run(argv, capture_output=True, timeout=timeout_s, check=False, env=env)
    except subprocess.TimeoutExpired:
        return [], f"py-spy did not answer within {timeout_s:.1f} s"
    except OSError as exc:
        return [], _clean(f"py-spy could not be run: {exc}", api_key, MAX_ERROR_CHARS)
    if done.returncode != 0:
        return [], _py_spy_error(done.stderr, done.returncode, api_key)
    try:
        threads = json.loads(done.stdout)
    except ValueError as exc:
        return [], f"py-spy printed no JSON: {exc}"
    if not isinstance(threads, list):
        return [], "py-spy printed JSON that is not a list of threads"
    return [_thread(thread, api_key) for thread in threads], None


def _capture_processes(sources: ForensicsSources, pid: int, deadline: _Deadline) -> list[dict[str, Any]]:
    processes = []
    for process_id, ppid in process_tree(pid):
        entry: dict[str, Any] = {
            "pid": process_id,
            "ppid": ppid,
            "state": _process_state(process_id),
            "command": _process_command(process_id, sources.api_key),
            "threads": [],
            "stacks_error": None,
        }
        budget = min(PY_SPY_TIMEOUT_S, deadline.remaining())
        if sources.py_spy is None:
            entry["stacks_error"] = "py-spy not installed"
        elif budget <= 0:
            entry["stacks_error"] = deadline.skipped()
        else:
            entry["threads"], entry["stacks_error"] = dump_stacks(sources.py_spy, process_id, budget, sources.api_key)
        processes.append(entry)
    return processes


def _stacks_part(sources: ForensicsSources, pid: int | None, deadline: _Deadline) -> dict[str, Any]:
    """``processes`` and ``stacks_note`` of the bundle."""
    if pid is None:
        return {"processes": [], "stacks_note": "the container has no process (not running), so no stacks"}
    note = None if sources.py_spy is not None else PY_SPY_MISSING
    if not Path(f"/proc/{pid}").exists():
        note = PID_NOT_VISIBLE.format(pid=pid)
    return {"processes": _capture_processes(sources, pid, deadline), "stacks_note": note}


# ---------------------------------------------------------------------------------------------- other parts


def _inspect(sources: ForensicsSources) -> tuple[dict[str, Any], int | None]:
    """The container as the bundle records it, and its main process id (None: not running or not known)."""
    try:
        state = sources.container.inspect()
    except Exception as exc:  # evidence gathering: a container error is recorded, never raised
        error = _clean(f"inspect failed: {type(exc).__name__}: {exc}", sources.api_key, MAX_ERROR_CHARS)
        return {"name": None, "status": None, "pid": None, "started_at": None, "error": error}, None
    started = state.started_at.isoformat() if state.started_at is not None else None
    pid = state.pid if state.pid else None
    record = {"name": state.name, "status": state.status, "pid": pid, "started_at": started, "error": None}
    return record, pid


def _logs_part(sources: ForensicsSources, lines: int) -> dict[str, Any]:
    try:
        tail = sources.container.tail(lines)
    except Exception as exc:  # evidence gathering: recorded, never raised
        error = _clean(f"tail failed: {type(exc).__name__}: {exc}", sources.api_key, MAX_ERROR_CHARS)
        return {"log_tail": [], "log_error": error}
    return {"log_tail": [clean_log_line(line, sources.api_key) for line in tail], "log_error": None}


def _http_get(url: str, headers: dict[str, str], timeout_s: float) -> httpx.Response:
    """A GET to a node-local endpoint: never through a proxy from the environment."""
    with httpx.Client(timeout=timeout_s, trust_env=False, follow_redirects=False) as client:
        return client.get(url, headers=headers)


def _http_error(exc: Exception, api_key: str | None) -> str:
    return _clean(f"{type(exc).__name__}: {exc}", api_key, MAX_ERROR_CHARS)


def _metrics_part(sources: ForensicsSources, timeout_s: float) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {sources.api_key}"} if sources.api_key else {}
    try:
        answer = _http_get(sources.vllm_url.rstrip("/") + "/metrics", headers, timeout_s)
    except (httpx.HTTPError, ValueError) as exc:
        return _failure(_http_error(exc, sources.api_key))
    text = _clean_lines(answer.text, sources.api_key, MAX_METRICS_CHARS)
    if answer.status_code != 200:
        return {"ok": False, "text": "", "error": f"HTTP {answer.status_code}: {text[:MAX_ERROR_CHARS]}"}
    return {"ok": True, "text": text, "error": None}


def _tpu_info_part(sources: ForensicsSources, timeout_s: float) -> dict[str, Any]:
    found = shutil.which(sources.tpu_info[0]) if sources.tpu_info else None
    if found is None:
        return _failure(TPU_INFO_MISSING)
    try:
        done = subprocess.run([found, *sources.tpu_info[1:]], capture_output=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return _failure(f"tpu-info did not finish within {timeout_s:.1f} s")
    except OSError as exc:
        return _failure(_clean(f"tpu-info could not be run: {exc}", sources.api_key, MAX_ERROR_CHARS))
    text = _clean_lines(done.stdout.decode("utf-8", errors="replace"), sources.api_key, MAX_TPU_INFO_CHARS)
    if done.returncode != 0:
        stderr = _clean(done.stderr.decode("utf-8", errors="replace"), sources.api_key, MAX_ERROR_CHARS)
        return {"ok": False, "text": text, "error": f"tpu-info exited with {done.returncode}: {stderr}"}
    return {"ok": True, "text": text, "error": None}


def _guest_attributes(metadata_url: str, timeout_s: float) -> dict[str, str]:
    """The ``tpuctl`` namespace: its key listing, then each key (the metadata server answers a folder with names).

    Raises:
        httpx.HTTPError: the metadata server could not be reached or answered an error.
    """
    base = f"{metadata_url.rstrip('/')}/instance/guest-attributes/{GUEST_ATTRIBUTE_NAMESPACE}/"
    headers = {"Metadata-Flavor": "Google"}
    budget = _Deadline(timeout_s)  # one budget for the listing and every key
    listing = _http_get(base, headers, timeout_s)
    listing.raise_for_status()
    keys = [key.strip() for key in listing.text.splitlines() if key.strip() and "/" not in key]
    values: dict[str, str] = {}
    for key in keys[:MAX_GUEST_KEYS]:
        if budget.remaining() <= 0:
            raise httpx.TimeoutException(f"guest attributes not all read within {timeout_s:.1f} s")
        answer = _http_get(base + key, headers, budget.remaining())
        answer.raise_for_status()
        values[key] = answer.text
    return values


def _boot_part(sources: ForensicsSources, timeout_s: float) -> dict[str, Any]:
    if sources.metadata_url is None:
        return {"ok": False, "attributes": {}, "error": "no metadata server configured"}
    try:
        raw = _guest_attributes(sources.metadata_url, timeout_s)
    except (httpx.HTTPError, ValueError) as exc:
        return {"ok": False, "attributes": {}, "error": _http_error(exc, sources.api_key)}
    key = sources.api_key
    attributes = {_clean(k, key, 100): _clean(v, key, MAX_GUEST_VALUE_CHARS) for k, v in raw.items()}
    return {"ok": True, "attributes": attributes, "error": None}


# ---------------------------------------------------------------------------------------------- the capture


def _timed_parts(sources: ForensicsSources, pid: int | None, log_lines: int, deadline: _Deadline) -> dict[str, Any]:
    """Every part in order, each given what is left of the deadline; timings and skipped steps recorded."""
    parts: dict[str, Any] = {"timings_s": {}, "skipped": []}
    steps = {
        "stacks": lambda left: _stacks_part(sources, pid, deadline),
        "logs": lambda left: _logs_part(sources, log_lines),
        "metrics": lambda left: {"metrics": _metrics_part(sources, min(HTTP_TIMEOUT_S, left))},
        "tpu_info": lambda left: {"tpu_info": _tpu_info_part(sources, min(TPU_INFO_TIMEOUT_S, left))},
        "boot": lambda left: {"boot": _boot_part(sources, min(HTTP_TIMEOUT_S, left))},
    }
    for name in STEPS:
        started, left = time.monotonic(), deadline.remaining()
        parts.update(steps[name](left) if left > 0 else _skipped_part(name, deadline))
        if left <= 0:
            parts["skipped"].append(name)
        parts["timings_s"][name] = round(time.monotonic() - started, 3)
    return parts


def _skipped_part(step: str, deadline: _Deadline) -> dict[str, Any]:
    reason = deadline.skipped()
    if step == "stacks":
        return {"processes": [], "stacks_note": reason}
    if step == "logs":
        return {"log_tail": [], "log_error": reason}
    if step == "boot":
        return {"boot": {"ok": False, "attributes": {}, "error": reason}}
    return {step: _failure(reason)}


def _redact_everywhere(value: Any, api_key: str | None) -> Any:
    """Every string of the bundle, keys included, without a registered secret or the API key (the last guard)."""
    if isinstance(value, str):
        text = redact(value)
        return text.replace(api_key, REDACTED) if api_key else text
    if isinstance(value, dict):
        return {_redact_everywhere(k, api_key): _redact_everywhere(v, api_key) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_everywhere(item, api_key) for item in value]
    return value


def capture_bundle(
    sources: ForensicsSources,
    *,
    deployment_id: str,
    bundle_id: str,
    reason: str,
    node: str,
    captured_at: datetime,
    log_lines: int = 200,
    deadline_s: float = 60.0,
) -> dict[str, Any]:
    """The debug bundle of the engine as it is now (``BUNDLE_VERSION``); never raises, keeps to ``deadline_s``."""
    deadline = _Deadline(deadline_s)
    header = {
        "version": BUNDLE_VERSION,
        "deployment_id": deployment_id,
        "bundle_id": bundle_id,
        "reason": _clean(reason, sources.api_key, MAX_ERROR_CHARS),
        "node": node,
        "captured_at": captured_at.isoformat(),
    }
    container, pid = _inspect(sources)
    try:
        parts = _timed_parts(sources, pid, log_lines, deadline)
    except Exception as exc:  # a bug here must not cost the restart: record it and keep what is known
        parts = {"capture_error": _clean(f"{type(exc).__name__}: {exc}", sources.api_key, MAX_ERROR_CHARS)}
    bundle = {**header, "container": container, **parts, "trimmed": []}
    redacted: dict[str, Any] = _redact_everywhere(bundle, sources.api_key)
    return redacted


# ---------------------------------------------------------------------------------------------- encoding


def _encoded(bundle: dict[str, Any]) -> bytes:
    return json.dumps(bundle, ensure_ascii=False, separators=(",", ":"), default=str).encode("utf-8")


def _drop_metrics_text(bundle: dict[str, Any], excess: int) -> str | None:
    metrics = bundle.get("metrics")
    if not isinstance(metrics, dict) or not metrics.get("text"):
        return None
    chars = len(metrics["text"])
    metrics["text"] = ""
    return f"metrics text ({chars} characters)"


def _drop_oldest_log_lines(bundle: dict[str, Any], excess: int) -> str | None:
    lines = bundle.get("log_tail")
    if not isinstance(lines, list) or not lines:
        return None
    dropped, freed = 0, 0
    while dropped < len(lines) and freed < excess:
        freed += len(_encoded({"": lines[dropped]})) - 5 + 1  # the string's bytes and its comma
        dropped += 1
    bundle["log_tail"] = lines[dropped:]
    return f"{dropped} oldest log lines"


def _threads(bundle: dict[str, Any]) -> list[dict[str, Any]]:
    processes = bundle.get("processes")
    found: list[dict[str, Any]] = []
    for process in processes if isinstance(processes, list) else []:
        threads = process.get("threads") if isinstance(process, dict) else None
        if isinstance(threads, list):
            found.extend(thread for thread in threads if isinstance(thread, dict))
    return found


def _drop_outer_frames(bundle: dict[str, Any], excess: int) -> str | None:
    dropped = 0
    for thread in _threads(bundle):
        frames = thread.get("frames")
        if isinstance(frames, list) and len(frames) > KEPT_FRAMES_PER_THREAD:
            dropped += len(frames) - KEPT_FRAMES_PER_THREAD
            thread["frames"] = frames[:KEPT_FRAMES_PER_THREAD]  # py-spy lists the innermost frame first
    return f"{dropped} frames beyond the {KEPT_FRAMES_PER_THREAD} innermost of each thread" if dropped else None


def _drop_all_stacks(bundle: dict[str, Any], excess: int) -> str | None:
    threads = _threads(bundle)
    for thread in threads:
        thread["frames"] = []
    return f"all frames of {len(threads)} threads" if threads else None


_TRIMS = (_drop_metrics_text, _drop_oldest_log_lines, _drop_outer_frames, _drop_all_stacks)


def _bare(bundle: dict[str, Any], trimmed: list[str]) -> dict[str, Any]:
    """The header alone: what is left when nothing else fits (never expected; bounded parts make it unreachable)."""
    kept = ("version", "deployment_id", "bundle_id", "reason", "node", "captured_at", "container")
    return {**{k: bundle.get(k) for k in kept}, "trimmed": [*trimmed, "everything but the header"]}


def encode_bundle(bundle: dict[str, Any]) -> bytes:
    """UTF-8 JSON of at most ``MAX_BUNDLE_BYTES``; never raises for size.

    Over the limit, a copy is trimmed in order (the metrics text, the oldest log lines, frames beyond the 60
    innermost of each thread, then every frame) until it fits, and what went is listed in its ``trimmed``; the
    bundle given is not changed.
    """
    data = _encoded(bundle)
    if len(data) <= MAX_BUNDLE_BYTES:
        return data
    trimmed_bundle = copy.deepcopy(bundle)
    trimmed: list[str] = list(trimmed_bundle.get("trimmed") or [])
    for trim in _TRIMS:
        trimmed_bundle["trimmed"] = trimmed
        excess = len(_encoded(trimmed_bundle)) - MAX_BUNDLE_BYTES + 1024  # room for the "trimmed" notes
        what = trim(trimmed_bundle, excess)
        if what is not None:
            trimmed.append(what)
        data = _encoded({**trimmed_bundle, "trimmed": trimmed})
        if len(data) <= MAX_BUNDLE_BYTES:
            return data
    return _encoded(_bare(trimmed_bundle, trimmed))

"""Debug bundles: what a node kept of a sick engine before a restart (or when asked), read back as a bounded view.

A bundle (``shared.domain.debug_bundle``) is written by the node agent, which parses untrusted prompts: every
field may be missing, of the wrong type or hostile. Each string is cleaned (escapes, control characters and
registered secrets gone) and every list is cut to a bound, so a view stays well under 60 KB of JSON whatever the
bundle holds; what was left out is listed in ``trimmed``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any

from mcp_client_gateway import bounds
from mcp_client_gateway.capabilities.common import (
    CommandPublisher,
    GatewayPorts,
    NodeTaskReader,
    Records,
    SecretRedaction,
)
from mcp_client_gateway.errors import Fix, GatewayError, Words
from mcp_client_gateway.log_hygiene import clean_text
from mcp_client_gateway.models import DebugBundleView, DebugProcessView, DebugThreadView
from shared.domain.debug_bundle import BUNDLE_VERSION, MAX_BUNDLE_BYTES, is_bundle_of
from shared.domain.errors import CloudError, ErrorClass
from shared.domain.metrics import GAUGE_SAMPLES, snapshot_from_samples
from shared.domain.models import NodeTask
from shared.domain.node_task_rules import as_read, no_node_reason
from shared.logging import scrub_untrusted
from shared.ports import DebugBundles

__all__ = ["CAPTURE_WAIT_S", "Debugging", "bundle_view", "metric_gauges"]

CAPTURE_WAIT_S = 3.0  # how long a capture waits for the node before returning the task id (a capture takes seconds)
_RECENT_TASKS = 50
_BUNDLE_ACTIONS = ("restart", "debug")
NO_BUCKET_FIX = "set TPUCTL_DEBUG_BUNDLE_BUCKET to Terraform's debug_bundle_bucket output"

# Bounds of the view (the whole stays well under 60 KB of JSON).
_MAX_PROCESSES = 8
_MAX_THREADS = 24  # per process
_MAX_THREADS_TOTAL = 64  # over every process
_MAX_FRAMES = 15  # per thread, innermost first
_FRAME_CHARS = 160
_FRAME_BUDGET = 14_000  # characters of frames over every thread
_COMMAND_CHARS = 300
_MAX_LOG_LINES = 50
_LOG_LINE_CHARS = 240
_TPU_INFO_CHARS = 4000
_MAX_BOOT_KEYS = 20
_BOOT_VALUE_CHARS = 160
_MAX_NOTES = 8
_NOTE_CHARS = 200
_ERROR_CHARS = 500
_MAX_METRIC_LINES = 20_000
_MAX_VIEW_CHARS = 56_000  # the view's JSON; text JSON escapes heavily (quotes, backslashes) may need more cuts

# vLLM gauges shown from the /metrics snapshot: the name in the view, and how series of several engines combine.
# The monitor's gauges (``shared.domain.metrics.GAUGE_SAMPLES``, legacy names included) under vLLM's own names.
_GAUGE_NAMES = {
    "running": "num_requests_running",
    "waiting": "num_requests_waiting",
    "kv_cache_usage": "kv_cache_usage_perc",
}
_GAUGE_SERIES = frozenset(name for names in GAUGE_SAMPLES.values() for name in names)
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{[^}]*\})?\s+(\S+)")


class Debugging:
    """Debug bundles of a deployment: capture one now (``serving.debug``), or read one a node task kept."""

    def __init__(
        self,
        ports: GatewayPorts,
        records: Records,
        publisher: CommandPublisher,
        node_tasks: NodeTaskReader,
        redaction: SecretRedaction,
    ) -> None:
        self.ports = ports
        self.records = records
        self.publisher = publisher
        self.node_tasks = node_tasks
        self.redaction = redaction
        self.capture_wait_s = CAPTURE_WAIT_S
        """How long a capture waits for the node's answer (tests shorten it)."""

    def debug_bundle(self, deployment_id: str, *, capture: bool = False, task_id: str | None = None) -> DebugBundleView:
        """Capture a bundle now (``capture``), read the one task ``task_id`` kept, or else the newest one kept."""
        deployment_id = bounds.deployment_id(deployment_id)
        if task_id is not None:
            task_id = bounds.command_id(
                task_id,
                "task_id",
                fix="pass the task_id tpu_control(action='capture_bundle') returned, or a restart's command_id",
            )
        if capture and task_id is not None:
            raise GatewayError(
                "invalid_argument",
                "task_id",
                "reads a bundle already asked for; it cannot be given with capture",
                Fix(
                    Words(
                        "give one: action='capture_bundle' asks the node for a new bundle, task_id polls it",
                        "give one: --capture asks the node for a new bundle, --task-id reads the one a task kept",
                    )
                ),
            )
        self.redaction.register_known()
        if capture:
            return self._capture(deployment_id)
        if task_id is not None:
            return self._read_task(deployment_id, task_id)
        return self._newest(deployment_id)

    def _capture(self, deployment_id: str) -> DebugBundleView:
        record = self.records.get(deployment_id)
        refusal = no_node_reason(record, deployment_id)
        if refusal is not None:
            raise GatewayError("failed_precondition", "deployment_id", refusal.removeprefix("deployment_id: "), "")
        self._bundles()  # a bundle this gateway could not read is not asked for
        message = self.publisher.validated(
            {"kind": "serving.debug", "deployment_id": deployment_id, "reason": "requested by a user"}
        )
        self.publisher.publish(message, "")
        task = self.node_tasks.wait(message.command_id, self.capture_wait_s)
        if task is None:
            return _pending(deployment_id, message.command_id)
        return self._task_view(task)

    def _read_task(self, deployment_id: str, task_id: str) -> DebugBundleView:
        task = self.node_tasks.get(task_id)
        if task is None:
            published = self.publisher.published(task_id)
            kinds = ("serving.debug", "serving.restart")
            if published is None or published.kind not in kinds or published.deployment_id != deployment_id:
                raise GatewayError(
                    "not_found",
                    "task_id",
                    f"no debug capture or restart '{task_id}' of '{deployment_id}'",
                    "omit task_id to read the newest bundle kept",
                )
            return _pending(deployment_id, task_id, "restart" if published.kind == "serving.restart" else "debug")
        if task.action not in _BUNDLE_ACTIONS or task.deployment_id != deployment_id:
            raise GatewayError(
                "invalid_argument",
                "task_id",
                f"belongs to a {task.action} task of '{task.deployment_id}', not a restart or debug capture of "
                f"'{deployment_id}'",
                "pass the id of a restart or of a capture (tpu_control(action='capture_bundle')) of this "
                "deployment, or omit it",
            )
        return self._task_view(task)

    def _newest(self, deployment_id: str) -> DebugBundleView:
        self.records.get(deployment_id, include_deleted=True)
        now, timeout = self.ports.clock.now(), self.ports.settings.node_task_timeout_s
        for task in self.ports.store.list_node_tasks(deployment_id, limit=_RECENT_TASKS):
            if task.bundle and task.action in _BUNDLE_ACTIONS:
                return self._task_view(as_read(task, now, timeout))
        return DebugBundleView(
            deployment_id=deployment_id,
            task_id=None,
            status="none",
            detail="no debug bundle is kept for this deployment yet",
            next_step=f"One is kept before every restart; capture one now with {_capture_call(deployment_id)}.",
        )

    def _task_view(self, task: NodeTask) -> DebugBundleView:
        deployment_id, task_id = task.deployment_id, task.task_id
        detail = clean_text(task.detail, limit=_ERROR_CHARS)[0]
        if not task.bundle:
            if not task.finished:
                return _pending(deployment_id, task_id, task.action)
            return DebugBundleView(
                deployment_id=deployment_id,
                task_id=task_id,
                status="failed",
                detail=f"the node kept no bundle for this {task.action} task" + (f": {detail}" if detail else ""),
                next_step=f"See tpu_status(deployment_id='{deployment_id}') for the node's state; capture one with "
                f"{_capture_call(deployment_id)} while the node is up.",
            )
        if not is_bundle_of(task.bundle, deployment_id, task_id):
            return _failed(deployment_id, task_id, "", "the task names an object that is not its own bundle")
        bundles = self._bundles()
        location = clean_text(bundles.location(task.bundle), limit=_ERROR_CHARS)[0]
        try:
            data = bundles.get(task.bundle)
        except CloudError as exc:
            return _unread(exc, deployment_id, task_id, location)
        view = bundle_view(data, deployment_id=deployment_id, task_id=task_id, location=location)
        if task.status == "failed" and view.status == "ready":
            failed = f"the {task.action} task failed after the bundle was kept: {detail or 'no reason recorded'}"
            view.detail = f"{failed}; {view.detail}" if view.detail else failed
        return view

    def _bundles(self) -> DebugBundles:
        bundles = self.ports.debug_bundles
        if bundles is None:
            raise GatewayError("unavailable", None, "this gateway has no debug-bundle store configured", NO_BUCKET_FIX)
        return bundles


def _capture_call(deployment_id: str, task_id: str | None = None) -> str:
    """The call that captures a bundle, or (``task_id``) reads the answer to a capture still pending."""
    poll = f", task_id='{task_id}'" if task_id else ""
    return f"tpu_control(action='capture_bundle', deployment_id='{deployment_id}'{poll})"


def _pending(deployment_id: str, task_id: str, action: str = "debug") -> DebugBundleView:
    """``action``: the task's (``debug``: a capture, polled by the capture call; ``restart``: read by its id)."""
    again = (
        _capture_call(deployment_id, task_id)
        if action == "debug"
        else f"tpu_observe(show='debug_bundle', deployment_id='{deployment_id}', command_id='{task_id}')"
    )
    return DebugBundleView(
        deployment_id=deployment_id,
        task_id=task_id,
        status="pending",
        detail="the node agent has not stored the bundle yet (a capture takes a few seconds; a restart keeps one "
        "before it restarts the engine)",
        next_step=f"Call {again} again in a few seconds.",
    )


def _failed(deployment_id: str, task_id: str, location: str, detail: str, next_step: str = "") -> DebugBundleView:
    return DebugBundleView(
        deployment_id=deployment_id,
        task_id=task_id,
        status="failed",
        location=location,
        detail=detail,
        next_step=next_step or f"Capture a new one with {_capture_call(deployment_id)}.",
    )


def _unread(exc: CloudError, deployment_id: str, task_id: str, location: str) -> DebugBundleView:
    """A bundle the store would not give: gone and too large read as failed; the rest is the caller's error."""
    text = clean_text(exc.message, limit=300)[0]
    if exc.error_class is ErrorClass.NOT_FOUND:
        return _failed(
            deployment_id,
            task_id,
            location,
            "the bundle was removed (the bucket's lifecycle deletes old bundles)",
        )
    if exc.error_class is ErrorClass.INVALID:
        return _failed(deployment_id, task_id, location, f"the bundle could not be read: {text}")
    if exc.error_class is ErrorClass.PERMISSION:
        raise GatewayError(
            "permission_denied",
            None,
            f"may not read the debug bundle at {location}: {text}",
            "grant your identity read access (roles/storage.objectViewer) on the debug-bundle bucket",
        )
    raise GatewayError(
        "unavailable", None, f"the debug-bundle store did not answer: {text}", "try again shortly", retry_after_s=15
    )


# ---------------------------------------------------------------------------------------------- the bundle


def bundle_view(data: bytes, *, deployment_id: str, task_id: str, location: str) -> DebugBundleView:
    """A stored bundle as a bounded, cleaned view; anything that is not a bundle reads as failed, never raises."""
    if len(data) > MAX_BUNDLE_BYTES:
        return _failed(deployment_id, task_id, location, f"the bundle is unreadable: over {MAX_BUNDLE_BYTES} bytes")
    try:
        bundle = json.loads(data)
    except ValueError:  # also a UnicodeDecodeError
        return _failed(deployment_id, task_id, location, "the bundle is unreadable: it is not JSON")
    if not isinstance(bundle, dict):
        return _failed(deployment_id, task_id, location, "the bundle is unreadable: it is not a JSON object")
    notes: list[str] = []
    if bundle.get("version") != BUNDLE_VERSION:
        notes.append(f"bundle version {_text(str(bundle.get('version')), 20)!r} is not {BUNDLE_VERSION}: read as such")
    metrics, tpu_info, boot = _dict(bundle.get("metrics")), _dict(bundle.get("tpu_info")), _dict(bundle.get("boot"))
    view = DebugBundleView(
        deployment_id=deployment_id,
        task_id=task_id,
        status="ready",
        detail=_text(bundle.get("capture_error"), _ERROR_CHARS),
        location=location,
        captured_at=_instant(bundle.get("captured_at")),
        reason=_text(bundle.get("reason"), _ERROR_CHARS),
        node=_text(bundle.get("node"), 200),
        container=_container(bundle.get("container")),
        processes=_processes(bundle.get("processes"), notes),
        stacks_note=_text(bundle.get("stacks_note"), _ERROR_CHARS),
        log_tail=_log_tail(bundle.get("log_tail"), notes),
        metrics=metric_gauges(metrics.get("text")),
        metrics_error=_text(metrics.get("error"), _ERROR_CHARS),
        tpu_info=_lines(tpu_info.get("text"), _TPU_INFO_CHARS, "tpu-info output", notes),
        tpu_info_error=_text(tpu_info.get("error"), _ERROR_CHARS),
        boot=_boot(boot.get("attributes"), notes),
        boot_error=_text(boot.get("error"), _ERROR_CHARS),
        next_step="Frames are innermost first: a process stopped (T) or in disk sleep (D), or an engine thread "
        f"waiting in the same call in every capture, points at the hang. The whole bundle: {location}.",
    )
    view.trimmed = _notes(bundle, notes)
    _fit(view)
    return view


def _fit(view: DebugBundleView) -> None:
    """Cut the bulkiest parts, in order, until the view's JSON fits ``_MAX_VIEW_CHARS`` (bounded counts and
    characters keep it under that unless its text is escape-heavy: quotes and backslashes double in JSON)."""

    def no_frames() -> None:
        for process in view.processes:
            for thread in process.threads:
                thread.frames.clear()

    cuts: tuple[tuple[str, Callable[[], None]], ...] = (
        ("the log tail", view.log_tail.clear),
        ("tpu-info output", lambda: setattr(view, "tpu_info", "")),
        ("boot attributes", view.boot.clear),
        ("every frame", no_frames),
    )
    for what, cut in cuts:
        if len(view.model_dump_json()) <= _MAX_VIEW_CHARS:
            return
        cut()
        view.trimmed.append(f"{what}, to keep this view under {_MAX_VIEW_CHARS} characters")


def _text(value: Any, limit: int) -> str:
    return clean_text(value, limit=limit)[0] if isinstance(value, str) else ""


def _dict(value: Any) -> dict[Any, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _instant(value: Any) -> datetime | None:
    if not isinstance(value, str) or len(value) > 40:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def _container(value: Any) -> str:
    container = _dict(value)
    if not container:
        return ""
    parts = [_text(container.get("name"), 80) or "?", _text(container.get("status"), 40) or "status unknown"]
    pid = _int(container.get("pid"))
    if pid is not None:
        parts.append(f"pid {pid}")
    started = _text(container.get("started_at"), 40)
    if started:
        parts.append(f"started {started}")
    error = _text(container.get("error"), 200)
    return ", ".join(parts) + (f" ({error})" if error else "")


class _Budget:
    """Characters left for frames over every thread of the view."""

    def __init__(self, chars: int) -> None:
        self.left = chars
        self.threads_cut = 0

    def frames(self, raw: list[Any]) -> list[str]:
        kept: list[str] = []
        for frame in raw[:_MAX_FRAMES]:
            text = _frame(frame)
            if len(text) > self.left:
                self.threads_cut += 1
                break
            self.left -= len(text)
            kept.append(text)
        return kept


def _frame(value: Any) -> str:
    frame = _dict(value)
    function = _text(frame.get("function"), 80) or "?"
    where = _text(frame.get("file"), 100) or "?"
    line = _int(frame.get("line"))
    return clean_text(f"{function} ({where}:{line if line is not None else '?'})", limit=_FRAME_CHARS)[0]


def _processes(value: Any, notes: list[str]) -> list[DebugProcessView]:
    """The first processes and threads; frames go to active threads first (the ones that tell what hangs)."""
    raw = _list(value)
    processes: list[DebugProcessView] = []
    frames_of: list[tuple[DebugThreadView, list[Any]]] = []
    threads_left_out, threads_left = 0, _MAX_THREADS_TOTAL
    for item in raw[:_MAX_PROCESSES]:
        process = _dict(item)
        threads = _list(process.get("threads"))
        shown = [_thread(thread) for thread in threads[: min(_MAX_THREADS, threads_left)]]
        threads_left -= len(shown)
        threads_left_out += len(threads) - len(shown)
        frames_of += shown
        processes.append(
            DebugProcessView(
                pid=_int(process.get("pid")),
                state=_text(process.get("state"), 60),
                command=_text(process.get("command"), _COMMAND_CHARS),
                threads=[view for view, _ in shown],
                stacks_error=_text(process.get("stacks_error"), _ERROR_CHARS),
            )
        )
    budget = _Budget(_FRAME_BUDGET)
    for view, frames in sorted(frames_of, key=lambda pair: not pair[0].active):  # stable: active first
        view.frames = budget.frames(frames)
    if len(raw) > _MAX_PROCESSES:
        notes.append(f"{len(raw) - _MAX_PROCESSES} process(es) beyond the first {_MAX_PROCESSES}")
    if threads_left_out:
        notes.append(f"{threads_left_out} thread(s) beyond {_MAX_THREADS} of a process or {_MAX_THREADS_TOTAL} in all")
    if budget.threads_cut:
        notes.append(f"frames of {budget.threads_cut} thread(s) past the {_FRAME_BUDGET}-character bound of stacks")
    return processes


def _thread(value: Any) -> tuple[DebugThreadView, list[Any]]:
    """A thread's view without frames yet, and its raw frames."""
    thread = _dict(value)
    name = _text(thread.get("name"), 60)
    if not name:
        thread_id = _int(thread.get("os_thread_id")) or _int(thread.get("thread_id"))
        name = f"thread {thread_id}" if thread_id is not None else "thread"
    return DebugThreadView(name=name, active=thread.get("active") is True, frames=[]), _list(thread.get("frames"))


def _log_tail(value: Any, notes: list[str]) -> list[str]:
    lines = [line for line in _list(value) if isinstance(line, str)]
    if len(lines) > _MAX_LOG_LINES:
        notes.append(f"{len(lines) - _MAX_LOG_LINES} older log line(s) of the bundle (the newest 50 are shown)")
    return [clean_text(line, limit=_LOG_LINE_CHARS)[0] for line in lines[-_MAX_LOG_LINES:]]


def _lines(value: Any, limit: int, what: str, notes: list[str]) -> str:
    """Multi-line text (a tool's table), each line cleaned with its spacing kept, cut to ``limit`` characters."""
    if not isinstance(value, str):
        return ""
    lines = (scrub_untrusted(line, limit)[0].rstrip() for line in value[: limit * 4].splitlines())
    text = "\n".join(lines).strip("\n")
    if len(text) > limit:
        notes.append(f"{what} past {limit} characters")
        text = text[:limit]
    return text


def _boot(value: Any, notes: list[str]) -> dict[str, str]:
    attributes = _dict(value)
    kept: dict[str, str] = {}
    for key, item in list(attributes.items())[:_MAX_BOOT_KEYS]:
        name = _text(key, 80)
        if name:
            kept[name] = _text(item, _BOOT_VALUE_CHARS) if isinstance(item, str) else _text(str(item), 40)
    if len(attributes) > _MAX_BOOT_KEYS:
        notes.append(f"{len(attributes) - _MAX_BOOT_KEYS} boot attribute(s) beyond the first {_MAX_BOOT_KEYS}")
    return kept


def _notes(bundle: dict[str, Any], notes: list[str]) -> list[str]:
    """What the node trimmed or skipped, what failed to be captured, and what this view left out."""
    trimmed = [_text(item, _NOTE_CHARS) for item in _list(bundle.get("trimmed"))[:_MAX_NOTES]]
    found = [f"node left out: {item}" for item in trimmed if item]
    skipped = [_text(step, 40) for step in _list(bundle.get("skipped"))[:10] if isinstance(step, str)]
    if skipped:
        found.append("not captured in time: " + ", ".join(skipped))
    log_error = _text(bundle.get("log_error"), _ERROR_CHARS)
    if log_error:
        found.append(f"log tail not captured: {log_error}")
    return [note for note in found + notes if note][: _MAX_NOTES * 2]


def metric_gauges(text: Any) -> dict[str, float]:
    """The key vLLM gauges of a Prometheus text page, read leniently (lines that do not parse are skipped) and
    reduced as the monitor reduces a scrape: several engines' requests added, the worst cache usage taken."""
    if not isinstance(text, str):
        return {}
    samples: list[tuple[str, dict[str, str], float]] = []
    for line in text.splitlines()[:_MAX_METRIC_LINES]:
        match = _SAMPLE.match(line.strip())
        if match is None or match[1] not in _GAUGE_SERIES:
            continue
        try:
            samples.append((match[1], {}, float(match[2])))
        except ValueError:
            continue
    gauges = snapshot_from_samples(samples).gauges
    return {_GAUGE_NAMES[short]: round(value, 6) for short, value in gauges.items() if short in _GAUGE_NAMES}

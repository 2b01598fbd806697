"""W3C trace context across the bus, exported with OpenTelemetry.

A command's trace starts where the command does (an MCP ``tools/call``, which the MCP SDK wraps in a server span,
or a ``tpuctl`` command) and follows it: every publish on the bus carries the current span's ``traceparent`` as a
Pub/Sub attribute (:func:`with_trace_context`, called by the bus adapters), and every delivery a function or the
node agent handles runs in a span whose parent is that attribute (:func:`delivery_span`). A command, the function
that handles it, the node task it sends, the node agent that acts on it and the event it reports back are one trace.

Where spans go is configuration (``TPUCTL_TRACE_EXPORT``): ``none`` (the default; spans are not recorded),
``stdout`` (one JSON object per span), ``file:<path>`` (the same, appended to a file; the twin's processes share
one), or ``cloud-trace`` (Cloud Trace, through its OpenTelemetry exporter, with the process's credentials).

A deployment's later work joins the trace of the command that set it going: the command's ``traceparent`` is kept
on the deployment record, and each tick's share of work for that deployment runs in a :func:`deployment_span` under
it (linked to the tick's own span). A TPU VM gets the ``traceparent`` of the pass that created it as instance
metadata (:func:`node_trace_metadata`, ``tpuctl-traceparent``; a trace context is no secret), and its node agent
reports its boot under it.

A ``traceparent`` from a TPU VM is untrusted like everything else it sends: it is parsed by the W3C propagator,
which ignores anything malformed (the span then starts a new trace); it can only ever name a parent.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

__all__ = [
    "TRACEPARENT",
    "TRACEPARENT_METADATA",
    "TRACE_EXPORTS",
    "check_trace_export",
    "configure_tracing",
    "current_traceparent",
    "delivery_span",
    "deployment_span",
    "flush_traces",
    "node_trace_metadata",
    "traced",
    "with_trace_context",
]

TRACEPARENT = "traceparent"
TRACEPARENT_METADATA = "tpuctl-traceparent"  # the VM instance metadata key its node agent reads
TRACE_EXPORTS = ("none", "stdout", "file:<path>", "cloud-trace")
_EXPORT = re.compile(r"^(none|stdout|cloud-trace|file:.+)$")
_PROPAGATOR = TraceContextTextMapPropagator()
_TRACER = "tpuctl"
_configured: str | None = None
_lock = threading.Lock()


def check_trace_export(value: str) -> str:
    """``value`` when it is one of ``TRACE_EXPORTS``; raises ``ValueError`` naming the choices otherwise."""
    if not _EXPORT.match(value):
        raise ValueError(f"trace_export: {value[:60]!r} is not none, stdout, file:<path> or cloud-trace")
    return value


def configure_tracing(export: str, service: str, *, project: str | None = None) -> None:
    """Install the process's tracer provider once (later calls with another export are ignored and say so)."""
    global _configured
    check_trace_export(export)
    if _configured is not None:  # every function delivery calls this: no lock once installed
        return
    with _lock:
        if _configured is not None or export == "none":
            _configured = _configured or export
            return
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        provider = TracerProvider(resource=Resource.create({"service.name": service}))
        if export == "cloud-trace":
            from opentelemetry.exporter.cloud_trace import CloudTraceSpanExporter

            provider.add_span_processor(BatchSpanProcessor(CloudTraceSpanExporter(project_id=project)))
        else:
            target: IO[str] | Path = sys.stdout if export == "stdout" else Path(export.removeprefix("file:"))
            provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(target)))
        trace.set_tracer_provider(provider)
        _configured = export


def flush_traces(timeout_s: float = 5.0) -> None:
    """Export what is buffered (a function instance may be frozen between deliveries)."""
    provider = trace.get_tracer_provider()
    flush = getattr(provider, "force_flush", None)
    if flush is not None:
        flush(int(timeout_s * 1000))


def with_trace_context(attributes: Mapping[str, str]) -> dict[str, str]:
    """``attributes`` plus the current span's ``traceparent`` (unchanged when no span is recording)."""
    out = dict(attributes)
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    if TRACEPARENT in carrier:
        out[TRACEPARENT] = carrier[TRACEPARENT]
    return out


def current_traceparent() -> str | None:
    """The current span's ``traceparent``, or None when no span is recording."""
    return with_trace_context({}).get(TRACEPARENT)


def node_trace_metadata() -> dict[str, str]:
    """Instance metadata naming the current span as the parent of a new node's boot (empty without a span)."""
    traceparent = current_traceparent()
    return {TRACEPARENT_METADATA: traceparent} if traceparent else {}


@contextmanager
def delivery_span(name: str, attributes: Mapping[str, str], **labels: str) -> Iterator[Any]:
    """A consumer span for one delivery, child of the ``traceparent`` it carries (if well-formed)."""
    parent = _PROPAGATOR.extract({TRACEPARENT: attributes[TRACEPARENT]} if TRACEPARENT in attributes else {})
    tracer = trace.get_tracer(_TRACER)
    with tracer.start_as_current_span(
        name, context=parent, kind=trace.SpanKind.CONSUMER, attributes={k: v for k, v in labels.items() if v}
    ) as span:
        yield span


@contextmanager
def deployment_span(traceparent: str | None, name: str, *, join: bool = True, **labels: str) -> Iterator[Any]:
    """One deployment's share of a tick: a child of its command's span (``traceparent``, from the record) linked to
    the tick's, while ``join``; otherwise (or when ``traceparent`` is missing or malformed) a child of the tick's span,
    linked to the command's when there is one."""
    command = trace.get_current_span(_PROPAGATOR.extract({TRACEPARENT: traceparent} if traceparent else {}))
    command_context, tick_context = command.get_span_context(), trace.get_current_span().get_span_context()
    joined = join and command_context.is_valid
    other = tick_context if joined else command_context
    with trace.get_tracer(_TRACER).start_as_current_span(
        name,
        context=trace.set_span_in_context(command) if joined else None,
        links=[trace.Link(other)] if other.is_valid else None,
        attributes={k: v for k, v in labels.items() if v},
    ) as span:
        yield span


@contextmanager
def traced(name: str, **labels: str) -> Iterator[Any]:
    """An internal span under the current one (a CLI command, a node task's work)."""
    with trace.get_tracer(_TRACER).start_as_current_span(
        name, attributes={k: v for k, v in labels.items() if v}
    ) as span:
        yield span


class JsonLinesSpanExporter(SpanExporter):
    """Writes each finished span as one JSON object (ids in hex, times in ns since the epoch)."""

    def __init__(self, target: IO[str] | Path) -> None:
        self._target = target
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(_span_record(span), sort_keys=True) + "\n" for span in spans)
        with self._lock:
            if isinstance(self._target, Path):
                self._target.parent.mkdir(parents=True, exist_ok=True)
                with self._target.open("a", encoding="utf-8") as out:
                    out.write(lines)
            else:
                self._target.write(lines)
                self._target.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


def _span_record(span: ReadableSpan) -> dict[str, Any]:
    context = span.get_span_context()
    parent = span.parent
    return {
        "name": span.name,
        "service": span.resource.attributes.get("service.name", ""),
        "trace_id": f"{context.trace_id:032x}" if context is not None else None,
        "span_id": f"{context.span_id:016x}" if context is not None else None,
        "parent_span_id": f"{parent.span_id:016x}" if parent is not None else None,
        "kind": span.kind.name,
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "status": span.status.status_code.name,
        "attributes": {key: str(value) for key, value in (span.attributes or {}).items()},
        "links": [
            {"trace_id": f"{link.context.trace_id:032x}", "span_id": f"{link.context.span_id:016x}"}
            for link in span.links
        ],
    }

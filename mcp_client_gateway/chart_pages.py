"""HTML pages of charts drawn from the gateway's views: a deployment's metrics, one benchmark run, runs compared, a
deployment's phase and timeline.

Pure: each function takes a view as its JSON (what the tool returns as ``structured_content``, or
``View.model_dump(mode="json")``) and returns a self-contained page (``charts.page``). Read defensively: a missing
or non-numeric value is left out, never an error, and every string goes through ``charts`` (cleaned and escaped).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from mcp_client_gateway.charts import Series, clock_time, line_chart, page, paragraph, plain_number, table

__all__ = ["benchmark_page", "comparison_page", "deployment_page", "metrics_page"]

# (chart title, y label, ((SLI name, line label, scale), ...)) for the metrics page
_METRIC_CHARTS: tuple[tuple[str, str, tuple[tuple[str, str, float], ...]], ...] = (
    (
        "Latency",
        "ms",
        (
            ("ttft_p50_s", "TTFT p50", 1000.0),
            ("ttft_p99_s", "TTFT p99", 1000.0),
            ("itl_p50_s", "ITL p50", 1000.0),
            ("itl_p99_s", "ITL p99", 1000.0),
        ),
    ),
    (
        "Throughput",
        "tokens/s",
        (("generation_tokens_per_s", "generated", 1.0), ("prompt_tokens_per_s", "prompt", 1.0)),
    ),
    ("Requests in the engine", "requests", (("running", "running", 1.0), ("waiting", "waiting", 1.0))),
    ("KV-cache use", "%", (("kv_cache_usage", "KV cache", 100.0),)),
)
# (chart title, y label, ((point key, line label), ...)) for a benchmark run's levels
_BENCH_CHARTS: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = (
    ("Throughput", "tokens/s", (("output_throughput", "output"), ("total_token_throughput", "total"))),
    ("Time to first token", "ms", (("median_ttft_ms", "median"), ("p99_ttft_ms", "p99"))),
    ("Inter-token latency", "ms", (("median_itl_ms", "median"), ("p99_itl_ms", "p99"))),
)
_COMPARED = (
    ("peak_output_throughput", "Peak output throughput", "tokens/s"),
    ("p99_ttft_ms_at_knee", "TTFT p99 at the knee", "ms"),
)


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _epoch(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _dicts(value: Any) -> list[Mapping[str, Any]]:
    return [item for item in value if isinstance(item, Mapping)] if isinstance(value, list) else []


def metrics_page(view: Mapping[str, Any]) -> str:
    """``MetricsView``: the summary lines, then one chart per SLI group over the window's samples."""
    timed = [(_epoch(sample.get("taken_at")), sample) for sample in _dicts(view.get("history"))]
    samples = [(at, sample) for at, sample in timed if at is not None]
    charts = []
    for title, unit, lines in _METRIC_CHARTS:
        series = []
        for name, label, scale in lines:
            points = [
                (at, value * scale)
                for at, sample in samples
                if isinstance(sample.get("slis"), Mapping) and (value := _number(sample["slis"].get(name))) is not None
            ]
            if points:
                series.append(Series(label, points))
        charts.append(line_chart(title, series, x_label="time (UTC)", y_label=unit, x_format=clock_time))
    window = f"last {view.get('window_minutes', '?')} min"
    head = f"{view.get('deployment_id', '')}: metrics, {window} ({view.get('phase', '')})"
    summary = [paragraph(str(line)) for line in _strings(view.get("summary"))]
    notes = [paragraph(f"note: {line}", note=True) for line in _strings(view.get("notes"))]
    return page(head, [*summary, *notes, paragraph(f"{len(samples)} sample(s) charted.", note=True), *charts])


def benchmark_page(view: Mapping[str, Any]) -> str:
    """``BenchmarkView``: the headline, then throughput and latency against the sweep's level."""
    result, request = _mapping(view.get("result")), _mapping(view.get("request"))
    levels = [
        (level, point) for point in _dicts(result.get("points")) if (level := _number(point.get("level"))) is not None
    ]
    x_label = "request rate (req/s)" if request.get("mode") == "rate" else "concurrency"
    charts = []
    for title, unit, lines in _BENCH_CHARTS:
        series = [
            Series(label, [(level, value) for level, point in levels if (value := _number(point.get(key))) is not None])
            for key, label in lines
        ]
        charts.append(line_chart(title, [s for s in series if s.points], x_label=x_label, y_label=unit))
    headline = _mapping(view.get("headline"))
    rows = [(key, plain_number(value)) for key, raw in headline.items() if (value := _number(raw)) is not None]
    sections = [paragraph(f"Run {view.get('run_id', '')} on {view.get('deployment_id', '')}: {view.get('status', '')}")]
    if view.get("error"):
        sections.append(paragraph(f"error (reported by the node, untrusted): {view['error']}", note=True))
    if rows:
        sections.append(table(("headline", "value"), rows))
    return page(f"Benchmark {view.get('run_id', '')}", [*sections, *charts])


def comparison_page(view: Mapping[str, Any]) -> str:
    """``BenchmarkComparison``: the runs in a table and their headline figures over time, one line per deployment."""
    rows = _dicts(view.get("rows"))
    charts = []
    for key, title, unit in _COMPARED:
        by_deployment: dict[str, list[tuple[float, float]]] = {}
        for row in rows:
            at, metrics = _epoch(row.get("created_at")), row.get("metrics")
            value = _number(metrics.get(key)) if isinstance(metrics, Mapping) else None
            if at is not None and value is not None:
                by_deployment.setdefault(str(row.get("deployment_id", "")), []).append((at, value))
        series = [Series(name, points) for name, points in sorted(by_deployment.items())]
        charts.append(line_chart(title, series, x_label="run started (UTC)", y_label=unit, x_format=clock_time))
    cells = [
        (
            row.get("run_id", ""),
            row.get("deployment_id", ""),
            row.get("model") or "",
            row.get("accelerator") or "",
            row.get("status", ""),
            _figure(row, "peak_output_throughput"),
            _figure(row, "p99_ttft_ms_at_knee"),
        )
        for row in rows
    ]
    headers = ("run", "deployment", "model", "slice", "status", "peak tok/s", "TTFT p99 ms")
    return page(f"{len(rows)} benchmark run(s) compared", [table(headers, cells), *charts])


def deployment_page(view: Mapping[str, Any]) -> str:
    """``DeploymentDetail`` with its ``TimelineView`` under ``timeline``: the phase and where it runs, then the
    status page's timeline (each step with who or what caused it), newest first so a long one keeps its latest."""
    name, timeline = view.get("deployment_id", ""), _mapping(view.get("timeline"))
    where = " / ".join(str(part) for part in (view.get("zone"), view.get("tier"), view.get("endpoint")) if part)
    sections = [
        paragraph(f"phase {view.get('phase', '')} since {_when(view.get('phase_since'))}"),
        paragraph(f"{view.get('model', '')} on {view.get('accelerator', '')}; {where or 'no slice yet'}"),
    ]
    if view.get("message"):
        sections.append(paragraph(str(view["message"]), note=True))
    events = _dicts(timeline.get("events"))
    if not timeline:
        sections.append(paragraph("The timeline could not be read.", note=True))
    else:
        keys = ("kind", "summary", "cause", "link")
        rows = [[_when(event.get("at")), *(event.get(key) or "" for key in keys)] for event in events[::-1]]
        sections += [
            paragraph(f"Timeline since {_when(timeline.get('since'))}: {len(events)} event(s), newest first."),
            table(("at", "what", "summary", "caused by", "link"), rows),
        ]
        if timeline.get("trimmed"):
            sections.append(paragraph(f"{timeline['trimmed']} older event(s) not shown.", note=True))
    return page(f"Deployment {name}", sections)


def _when(value: Any) -> str:
    """An ISO time as the status page writes it (UTC, to the second); anything else as it is, or ``?``."""
    at = _epoch(value)
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if at is not None else str(value or "?")


def _figure(row: Mapping[str, Any], key: str) -> str:
    metrics = row.get("metrics")
    value = _number(metrics.get(key)) if isinstance(metrics, Mapping) else None
    return plain_number(value) if value is not None else ""


def _strings(value: Any) -> Sequence[str]:
    return [item for item in value if isinstance(item, str)] if isinstance(value, list) else []

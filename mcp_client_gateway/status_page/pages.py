"""The status page's HTML, rendered from the gateway's views: pure functions, every value escaped.

A page is self-contained (inline CSS and SVG, no script, no outside fetch) and says so to the browser with the
charts' Content-Security-Policy (``charts.CSP``), which allows nothing else. It refreshes itself every 15 s.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from html import escape
from typing import Any, TypeGuard
from urllib.parse import quote

from mcp_client_gateway.capabilities.timeline import TimelineView
from mcp_client_gateway.charts import CSP, Series, clock_time, line_chart, plain_number
from mcp_client_gateway.models import (
    BenchmarkView,
    DeploymentDetail,
    DeploymentList,
    MetricsView,
    SampleView,
)

__all__ = ["CSP", "SLI_CHARTS", "deployment_page", "error_page", "index_page"]

_REFRESH_S = 15
# (title, y label, [(series label, SLI name)]): the charts of a deployment's page, from its monitor samples.
SLI_CHARTS: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = (
    ("Time to first token", "seconds", (("p50", "ttft_p50_s"), ("p90", "ttft_p90_s"), ("p99", "ttft_p99_s"))),
    ("Inter-token latency", "seconds", (("p50", "itl_p50_s"), ("p90", "itl_p90_s"))),
    ("Throughput", "tokens/s", (("output", "generation_tokens_per_s"), ("prompt", "prompt_tokens_per_s"))),
    ("KV cache and headroom", "share", (("KV use", "kv_cache_usage"), ("headroom", "headroom"))),
    ("Queue", "requests", (("waiting", "waiting"), ("running", "running"))),
)
_PHASE_COLORS = {"SERVING": "#188038", "DEGRADED": "#f29900", "STALLED": "#d93025", "DOWN": "#d93025"}
_STYLE = """
body{font:14px system-ui,sans-serif;margin:24px;color:#202124}h1{font-size:20px}h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse}td,th{padding:4px 10px;border-bottom:1px solid #eee;text-align:left;vertical-align:top}
.phase{padding:2px 8px;border-radius:10px;color:#fff;background:#5f6368}.charts{display:flex;flex-wrap:wrap;gap:12px}
.chart-title{font-weight:600}.tick,.legend{font-size:11px;fill:#5f6368}.finding{color:#b06000}.muted{color:#5f6368}
"""


def _page(title: str, body: str) -> str:
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f'<meta http-equiv="refresh" content="{_REFRESH_S}"><title>{escape(title)}</title>'
        f"<style>{_STYLE}</style></head><body>{body}</body></html>"
    )


def _phase(phase: str) -> str:
    color = _PHASE_COLORS.get(phase, "#5f6368")
    return f'<span class="phase" data-phase="{escape(phase)}" style="background:{color}">{escape(phase)}</span>'


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, css_id: str) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f'<table id="{css_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _when(value: datetime | None) -> str:
    return escape(value.strftime("%Y-%m-%d %H:%M:%S UTC")) if value is not None else ""


def index_page(listing: DeploymentList, *, now: datetime) -> str:
    """Every deployment with its phase, where it runs and what it has cost."""
    rows = [
        (
            f'<a href="/deployments/{quote(d.deployment_id)}">{escape(d.deployment_id)}</a>',
            escape(d.model),
            escape(d.accelerator),
            _phase(d.phase),
            escape(" / ".join(x for x in (d.zone, d.tier) if x)),
            escape(f"${d.spend_usd:,.2f}"),
            _when(d.updated_at),
        )
        for d in listing.deployments
    ]
    table = _table(("deployment", "model", "slice", "phase", "zone / tier", "spend", "updated"), rows, css_id="list")
    empty = "" if rows else '<p class="muted">No deployments yet: tpuctl deploy, or tpu_deploy.</p>'
    body = f'<h1>tpuctl</h1><p class="muted">as of {_when(now)}</p>{table}{empty}'
    return _page("tpuctl: deployments", body)


def deployment_page(
    detail: DeploymentDetail, timeline: TimelineView, metrics: MetricsView | None, runs: Sequence[BenchmarkView]
) -> str:
    """One deployment: its phase, SLI charts, capacity hunt, timeline and benchmark curves."""
    findings = "".join(f'<li class="finding">{escape(f)}</li>' for f in detail.findings)
    where = " / ".join(x for x in (detail.zone, detail.tier, detail.endpoint) if x)
    body = (
        f'<p><a href="/">all deployments</a></p><h1>{escape(detail.deployment_id)} {_phase(detail.phase)}</h1>'
        f"<p>{escape(detail.model)} on {escape(detail.accelerator)}; {escape(where or 'no slice yet')}; "
        f'phase since {_when(detail.phase_since)}</p><p class="muted">{escape(detail.message)}</p>'
        + (f'<ul id="findings">{findings}</ul>' if findings else "")
        + '<h2>SLIs</h2><div class="charts" id="slis">'
        + "".join(_sli_chart(metrics.history if metrics else [], *chart) for chart in SLI_CHARTS)
        + "</div>"
        + _capacity(detail)
        + _timeline(timeline)
        + _benchmarks(runs)
    )
    return _page(f"tpuctl: {detail.deployment_id}", body)


def error_page(status: int, message: str) -> str:
    return _page(
        f"tpuctl: {status}", f'<p><a href="/">all deployments</a></p><h1>{status}</h1><p>{escape(message)}</p>'
    )


def _sli_chart(history: Sequence[SampleView], title: str, y_label: str, lines: tuple[tuple[str, str], ...]) -> str:
    series = [
        Series(label, [(s.taken_at.timestamp(), s.slis[name]) for s in history if name in s.slis])
        for label, name in lines
    ]
    shown = [s for s in series if s.points] or series[:1]
    return line_chart(title, shown, y_label=y_label, x_format=clock_time, width=460, height=220)


def _capacity(detail: DeploymentDetail) -> str:
    rows = [(_when(a.at), escape(a.zone), escape(a.tier), escape(a.outcome), escape(a.detail)) for a in detail.attempts]
    shown = f"the latest {len(rows)} of {detail.attempts_total}" if detail.attempts_total > len(rows) else "all"
    return f'<h2>Capacity hunt <span class="muted">({shown})</span></h2>' + _table(
        ("at", "zone", "tier", "outcome", "detail"), rows, css_id="capacity"
    )


def _timeline(timeline: TimelineView) -> str:
    rows = [
        (
            _when(e.at),
            escape(e.kind),
            escape(e.summary),
            escape(e.cause),
            escape(e.link),
        )
        for e in timeline.events
    ]
    more = f'<p class="muted">{timeline.trimmed} older event(s) not shown.</p>' if timeline.trimmed else ""
    return "<h2>Timeline</h2>" + _table(("at", "what", "summary", "caused by", "link"), rows, css_id="timeline") + more


def _benchmarks(runs: Sequence[BenchmarkView]) -> str:
    series = [Series(run.run_id[:8], _curve(run.result)) for run in runs]
    series = [s for s in series if s.points]
    if not series:
        return '<h2>Benchmarks</h2><p class="muted">No completed benchmark with a sweep yet.</p>'
    chart = line_chart(
        "Median TTFT against output throughput, per run",
        series,
        y_label="median TTFT (ms)",
        x_format=lambda x: f"{plain_number(x)} tok/s",
        width=640,
        height=260,
    )
    return f'<h2>Benchmarks</h2><div id="benchmarks">{chart}</div>'


def _curve(result: dict[str, Any] | None) -> list[tuple[float, float]]:
    """(output tokens/s, median TTFT ms) per sweep level, where both are numbers."""
    points = (result or {}).get("points")
    curve: list[tuple[float, float]] = []
    for point in points if isinstance(points, list) else []:
        if not isinstance(point, dict):
            continue
        x, y = point.get("output_throughput"), point.get("median_ttft_ms")
        if _number(x) and _number(y):
            curve.append((float(x), float(y)))
    return curve


def _number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)

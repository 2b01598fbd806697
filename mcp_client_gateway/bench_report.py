"""A report over one or more benchmark runs (issue 22, item 6): four charts as SVG and PNG and one HTML page.

- ``latency-ttft`` and ``latency-itl``: TTFT and ITL p50 (solid) and p90 (dashed) against achieved output tokens/s,
  one colour per run, one point per level;
- ``pareto``: tokens/s per user against tokens/s per chip for every level of every run; the levels on the Pareto
  front in their run's colour, joined by the front's line, the dominated ones faint;
- ``cost``: USD per million output tokens against the achieved request rate, one line per run, the levels that met
  the run's SLO ringed.

The figures come from ``shared.domain.bench_pareto`` (pure); the charts are drawn by ``loadgen.plots`` (the same
renderer as ``tpuctl bench plot``), and the page is ``charts.page``: no script, no network, a strict CSP, every
string cleaned and escaped. A run is anything stored as a benchmark run, so a future tuning trial is just another.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from loadgen.plots import Chart, Series, render_png, render_svg
from mcp_client_gateway.charts import page, paragraph, plain_number, table
from mcp_client_gateway.models import BenchmarkView
from shared.domain.bench_pareto import (
    LevelFigures,
    Metric,
    ParetoPoint,
    RunFigures,
    cost_series,
    latency_series,
    pareto_points,
    run_figures,
)
from shared.domain.untrusted import clean_text

__all__ = ["MAX_RUNS", "ReportRun", "report_charts", "report_runs", "write_report"]

MAX_RUNS = 8
LABEL_CHARS = 13  # what the charts' legend holds
_COLORS = ("#1f6fb5", "#d9641e", "#2a9d3a", "#b52a6f", "#6b4fb5", "#0f8a8a", "#8a6d0f", "#5a5a5a")
_KEY = "#555555"
TITLES = {
    "latency-ttft": "Latency vs throughput: TTFT",
    "latency-itl": "Latency vs throughput: ITL",
    "pareto": "Pareto front: tok/s per user vs tok/s per chip",
    "cost": "Cost per million output tokens vs request rate",
}


@dataclass(frozen=True)
class ReportRun:
    """One run as the report shows it: its figures and what the run table says about it."""

    figures: RunFigures
    view: BenchmarkView


def _label(view: BenchmarkView, used: set[str], place: int) -> str:
    deployment = clean_text(view.deployment_id, 80)
    for candidate in (deployment[:LABEL_CHARS], f"{deployment[:8]} {view.run_id[:4]}", f"run {place}"):
        if candidate and candidate not in used:
            used.add(candidate)
            return candidate
    return f"run {place} {view.run_id[:4]}"


def report_runs(views: Sequence[BenchmarkView]) -> list[ReportRun]:
    """The runs with short, distinct labels (their deployment, else with the run id's start)."""
    used: set[str] = set()
    runs = []
    for place, view in enumerate(views, start=1):
        figures = run_figures(_label(view, used, place), view.plan, view.request, view.result)
        runs.append(ReportRun(figures, view))
    return runs


def _latency_chart(runs: Sequence[RunFigures], metric: str) -> Chart:
    series = []
    for number, run in enumerate(runs):
        color = _COLORS[number % len(_COLORS)]
        for percentile, style in (("p50", "line"), ("p90", "dashed")):
            key: Metric = f"{metric}_{percentile}_ms"  # type: ignore[assignment]
            points = tuple(latency_series(run, key))
            series.append(Series(run.label, points, style=style, color=color, legend=percentile == "p50"))
    series += [Series("p50", (), "line", _KEY), Series("p90", (), "dashed", _KEY)]
    name = metric.upper()
    return Chart(TITLES[f"latency-{metric}"], "achieved output tokens/s", f"{name} (ms)", tuple(series))


def _pareto_chart(runs: Sequence[RunFigures], points: Sequence[ParetoPoint]) -> Chart:
    series = []
    for number, run in enumerate(runs):
        color = _COLORS[number % len(_COLORS)]
        mine = [p for p in points if p.run == run.label]
        front = tuple((p.tok_s_per_user, p.tok_s_per_chip) for p in mine if p.on_front)
        dominated = tuple((p.tok_s_per_user, p.tok_s_per_chip) for p in mine if not p.on_front)
        series += [Series(run.label, front, "points", color), Series("", dominated, "faint", color, legend=False)]
    line = tuple(sorted((p.tok_s_per_user, p.tok_s_per_chip) for p in points if p.on_front))
    series += [Series("Pareto front", line, "path", "#000000"), Series("dominated", (), "faint", _KEY)]
    return Chart(TITLES["pareto"], "output tokens/s per user (1000/TPOT)", "output tokens/s per chip", tuple(series))


def _cost_chart(runs: Sequence[RunFigures]) -> Chart:
    series = []
    met: list[tuple[float, float]] = []
    for number, run in enumerate(runs):
        rows = cost_series(run)
        series.append(Series(run.label, tuple((x, y) for x, y, _ in rows), color=_COLORS[number % len(_COLORS)]))
        met += [(x, y) for x, y, ok in rows if ok]
    if any(run.has_slo for run in runs):
        series.append(Series("met the SLO", tuple(met), "ring", "#000000"))
    y_label = "USD per million output tokens"
    return Chart(TITLES["cost"], "achieved request rate (req/s)", y_label, tuple(series), log_y=True)


def report_charts(runs: Sequence[RunFigures]) -> dict[str, Chart]:
    """The report's four charts, by file name."""
    return {
        "latency-ttft": _latency_chart(runs, "ttft"),
        "latency-itl": _latency_chart(runs, "itl"),
        "pareto": _pareto_chart(runs, pareto_points(runs)),
        "cost": _cost_chart(runs),
    }


def _cell(value: float | None) -> str:
    return "-" if value is None else plain_number(value)


def _level_row(run: RunFigures, lv: LevelFigures) -> tuple[str, ...]:
    figures = (lv.level, None, lv.output_tok_s, lv.request_rate, lv.ttft_p50_ms, lv.itl_p50_ms, lv.tok_s_per_user)
    cells = [_cell(value) for value in (*figures, lv.tok_s_per_chip, lv.usd_per_million)]
    cells[1] = lv.mode
    return (run.label, *cells, "-" if lv.meets_slo is None else "yes" if lv.meets_slo else "no")


def _sections(runs: Sequence[ReportRun], charts: dict[str, Chart], svgs: dict[str, str]) -> list[str]:
    figures = [run.figures for run in runs]
    points = pareto_points(figures)
    front = [p for p in points if p.on_front]
    run_rows = [
        (
            run.figures.label,
            run.view.run_id,
            run.view.deployment_id,
            (run.view.result or {}).get("model") or run.view.plan.get("model") or "-",
            run.view.plan.get("accelerator") or "-",
            len(run.figures.levels),
            "yes" if run.figures.has_slo else "no",
            run.figures.price_source,
        )
        for run in runs
    ]
    sections = [
        paragraph(f"{len(runs)} run(s); each level of each run is one point. Drawn from the stored results."),
        table(("LABEL", "RUN", "DEPLOYMENT", "MODEL", "ACCELERATOR", "LEVELS", "SLO", "PRICE"), run_rows),
    ]
    for name in charts:
        sections.append(f'<section id="{name}">{svgs[name]}</section>')
        if name == "pareto":
            sections.append(paragraph(f"{len(front)} of {len(points)} level(s) are on the Pareto front."))
            rows = [(p.run, _cell(p.level), _cell(p.tok_s_per_user), _cell(p.tok_s_per_chip)) for p in front]
            front_headers = ("RUN", "LEVEL", "TOK/S PER USER", "TOK/S PER CHIP")
            sections.append(f'<section id="pareto-front">{table(front_headers, rows)}</section>')
    headers = ("RUN", "LEVEL", "MODE", "OUT TOK/S", "REQ/S", "TTFT P50", "ITL P50", "TOK/S/USER", "TOK/S/CHIP")
    sections.append(
        table((*headers, "$/M OUT", "MET SLO"), [_level_row(run, lv) for run in figures for lv in run.levels])
    )
    return sections


def write_report(views: Sequence[BenchmarkView], directory: Path, stem: str = "bench-report") -> list[Path]:
    """``<stem>.html`` and ``<stem>-<chart>.{svg,png}`` in ``directory``; [] (nothing written) when no run has
    a level."""
    runs = report_runs(views)
    if not any(run.figures.levels for run in runs):
        return []
    directory.mkdir(parents=True, exist_ok=True)
    charts = report_charts([run.figures for run in runs])
    written, svgs = [], {}
    for name, chart in charts.items():
        svgs[name] = render_svg(chart)
        svg, png = directory / f"{stem}-{name}.svg", directory / f"{stem}-{name}.png"
        svg.write_text(svgs[name], encoding="utf-8")
        png.write_bytes(render_png(chart))
        written += [svg, png]
    html = directory / f"{stem}.html"
    html.write_text(page("Benchmark report", _sections(runs, charts, svgs)) + "\n", encoding="utf-8")
    return [html, *written]

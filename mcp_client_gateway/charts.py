"""Charts as inline SVG in a self-contained HTML page, in pure Python: no JavaScript, no network, no build step.

Used by the MCP Apps pages (``tools/chart_apps.py``) and meant for the status page too. Everything here is pure
(strings in, a string out). Every string that reaches the page (a title, a label, a table cell) is first cleaned as
the gateway cleans text from a TPU VM (``shared.domain.untrusted.clean_text``: no control, escape or bidi
characters, bounded) and then HTML-escaped, quotes included, because deployment names, labels and benchmark text can
come from a hostile VM. The page carries a strict Content-Security-Policy (no script, no connection, no remote
anything), so even a string that slipped through could not run or fetch.

Each drawn point is a ``<circle>`` with its series, x and y in ``data-`` attributes and a ``<title>`` (shown on hover),
so a test, or a person reading the source, gets back the values a chart was drawn from.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape

from shared.domain.untrusted import clean_text

__all__ = [
    "CSP",
    "MAX_POINTS",
    "MAX_SERIES",
    "PALETTE",
    "Series",
    "clock_time",
    "line_chart",
    "page",
    "paragraph",
    "plain_number",
    "safe",
    "table",
]

CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; font-src 'none'; script-src 'none'; "
    "connect-src 'none'; frame-src 'none'; base-uri 'none'; form-action 'none'"
)
PALETTE = ("#1a73e8", "#d93025", "#188038", "#f29900", "#9334e6", "#12b5cb", "#5f6368", "#e52592")
MAX_SERIES = 8  # lines per chart; more are left out (and said so)
MAX_POINTS = 500  # points per line, the newest kept
MAX_ROWS = 100  # rows per table
LABEL_CHARS = 80
CELL_CHARS = 200
TEXT_CHARS = 500
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 24, 32, 72
_TICKS = 4
_STYLE = (
    "body{font:14px system-ui,sans-serif;margin:12px;color:#202124}h1{font-size:18px;margin:0 0 8px}"
    "svg{display:block;margin:8px 0;max-width:100%;height:auto}.tick,.legend{font-size:11px;fill:#5f6368}"
    ".chart-title{font-size:13px;font-weight:600}table{border-collapse:collapse;font-size:12px}"
    "td,th{border:1px solid #dadce0;padding:2px 6px;text-align:left}p.note{color:#5f6368}"
)


def safe(text: object, limit: int = LABEL_CHARS) -> str:
    """``text`` cleaned of control, escape and bidi characters, cut to ``limit`` and HTML-escaped (quotes too)."""
    return escape(clean_text(str(text), limit), quote=True)


@dataclass(frozen=True)
class Series:
    """One line: its label and its (x, y) points, in any order (drawn sorted by x)."""

    label: str
    points: Sequence[tuple[float, float]]


def plain_number(value: float) -> str:
    """A short number for an axis or a hover: 0, 0.0123, 1.5, 250, 2.27k, 3.1M."""
    if value == 0:
        return "0"
    if abs(value) >= 1e6:
        return f"{value / 1e6:.3g}M"
    if abs(value) >= 1000:
        return f"{value / 1000:.3g}k"
    return f"{value:.3g}"


def clock_time(epoch_s: float) -> str:
    """A time-axis label: UTC hours and minutes."""
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%H:%M")


def _finite(series: Series) -> Series:
    points = sorted((float(x), float(y)) for x, y in series.points if _is_number(x) and _is_number(y))
    return Series(series.label, points[-MAX_POINTS:])


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _span(values: Sequence[float], *, from_zero: bool) -> tuple[float, float]:
    """An axis range that holds every value and is never empty (a y axis of non-negative values starts at 0)."""
    lo, hi = min(values), max(values)
    if from_zero and lo >= 0:
        lo = 0.0
    if hi == lo:
        return (lo - 1.0, hi + 1.0) if lo != 0 else (0.0, 1.0)
    return lo, hi


@dataclass(frozen=True)
class _Frame:
    """Where the data lands: the value ranges and the pixel box of the plot."""

    x_lo: float
    x_hi: float
    y_lo: float
    y_hi: float
    width: int
    height: int

    def px(self, x: float) -> float:
        return _LEFT + (x - self.x_lo) / (self.x_hi - self.x_lo) * (self.width - _LEFT - _RIGHT)

    def py(self, y: float) -> float:
        plot = self.height - _TOP - _BOTTOM
        return _TOP + plot - (y - self.y_lo) / (self.y_hi - self.y_lo) * plot


def line_chart(
    title: str,
    series: Sequence[Series],
    *,
    x_label: str = "",
    y_label: str = "",
    x_format: Callable[[float], str] = plain_number,
    width: int = 640,
    height: int = 260,
) -> str:
    """An SVG line chart of ``series``; with no finite point it says "no data" instead of drawing empty axes."""
    lines = [_finite(s) for s in series[:MAX_SERIES]]
    every = [point for line in lines for point in line.points]
    name = safe(title)
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" data-title="{name}"><title>{name}</title>'
        f'<text x="{_LEFT}" y="18" class="chart-title">{name}</text>'
    )
    if not every:
        return head + f'<text x="{width / 2:.0f}" y="{height / 2:.0f}" text-anchor="middle">no data</text></svg>'
    x_lo, x_hi = _span([x for x, _ in every], from_zero=False)
    y_lo, y_hi = _span([y for _, y in every], from_zero=True)
    frame = _Frame(x_lo, x_hi, y_lo, y_hi * 1.05 if y_hi > 0 else y_hi, width, height)
    parts = [head, _axes(frame, x_format, x_label, y_label)]
    for index, line in enumerate(lines):
        parts.append(_line(frame, line, PALETTE[index % len(PALETTE)], x_format))
        parts.append(_legend(index, line.label, height))
    if len(series) > MAX_SERIES:
        parts.append(
            f'<text x="{width - _RIGHT}" y="18" text-anchor="end" class="legend">'
            f"{len(series) - MAX_SERIES} more series left out</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _line(frame: _Frame, line: Series, color: str, x_format: Callable[[float], str]) -> str:
    parts = []
    if len(line.points) > 1:
        path = " ".join(f"{frame.px(x):.1f},{frame.py(y):.1f}" for x, y in line.points)
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{path}"/>')
    label = safe(line.label)
    for x, y in line.points:
        parts.append(
            f'<circle cx="{frame.px(x):.1f}" cy="{frame.py(y):.1f}" r="3" fill="{color}" data-series="{label}" '
            f'data-x="{x:.15g}" data-y="{y:.15g}">'
            f"<title>{label}: {plain_number(y)} at {safe(x_format(x))}</title></circle>"
        )
    return "".join(parts)


def _legend(index: int, label: str, height: int) -> str:
    x = _LEFT + (index % 4) * 150
    y = height - 22 + (index // 4) * 14
    color = PALETTE[index % len(PALETTE)]
    return (
        f'<rect x="{x}" y="{y - 9}" width="10" height="10" fill="{color}"/>'
        f'<text x="{x + 14}" y="{y}" class="legend">{safe(label, 24)}</text>'
    )


def _axes(frame: _Frame, x_format: Callable[[float], str], x_label: str, y_label: str) -> str:
    bottom, right = frame.height - _BOTTOM, frame.width - _RIGHT
    parts = [
        f'<line x1="{_LEFT}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#888"/>',
        f'<line x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{bottom}" stroke="#888"/>',
    ]
    for step in range(_TICKS + 1):
        y = frame.y_lo + (frame.y_hi - frame.y_lo) * step / _TICKS
        x = frame.x_lo + (frame.x_hi - frame.x_lo) * step / _TICKS
        parts.append(
            f'<line x1="{_LEFT}" y1="{frame.py(y):.1f}" x2="{right}" y2="{frame.py(y):.1f}" stroke="#eee"/>'
            f'<text x="{_LEFT - 6}" y="{frame.py(y) + 4:.1f}" text-anchor="end" class="tick y-tick">'
            f"{plain_number(y)}</text>"
            f'<text x="{frame.px(x):.1f}" y="{bottom + 16}" text-anchor="middle" class="tick x-tick">'
            f"{safe(x_format(x))}</text>"
        )
    if x_label:
        parts.append(
            f'<text x="{(_LEFT + right) / 2:.0f}" y="{bottom + 30}" text-anchor="middle" class="tick">'
            f"{safe(x_label)}</text>"
        )
    if y_label:
        middle = (_TOP + bottom) / 2
        parts.append(
            f'<text x="14" y="{middle:.0f}" transform="rotate(-90 14 {middle:.0f})" text-anchor="middle" '
            f'class="tick">{safe(y_label)}</text>'
        )
    return "".join(parts)


def paragraph(text: str, *, note: bool = False) -> str:
    """A paragraph of (cleaned, escaped) text."""
    attribute = ' class="note"' if note else ""
    return f"<p{attribute}>{safe(text, TEXT_CHARS)}</p>"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """An HTML table; every cell cleaned and escaped, at most ``MAX_ROWS`` rows."""
    head = "".join(f"<th>{safe(header)}</th>" for header in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{safe(cell, CELL_CHARS)}</td>" for cell in row) + "</tr>" for row in rows[:MAX_ROWS]
    )
    more = f'<p class="note">{len(rows) - MAX_ROWS} more row(s) left out</p>' if len(rows) > MAX_ROWS else ""
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{more}"


def page(title: str, sections: Sequence[str]) -> str:
    """A self-contained HTML document: the strict CSP, inline style, the title and ``sections`` (fragments built
    by this module's functions, which escape what they are given)."""
    name = safe(title)
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="referrer" content="no-referrer">'
        f"<title>{name}</title><style>{_STYLE}</style></head>"
        f"<body><h1>{name}</h1>{''.join(sections)}</body></html>"
    )

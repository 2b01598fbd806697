"""Charts of a benchmark result as SVG and PNG, with no plotting library.

Why no matplotlib: it would add about 40 MB (numpy, pillow, fonts) to every install, the TPU VM's node agent
included, for three line charts. SVG is written directly; PNG comes from a small rasteriser (lines, markers,
a built-in 3x5 pixel font drawn at 2x) and a standard-library encoder (``zlib`` + ``struct``).

Charts (from a result's ``points``, see ``loadgen.generator.BenchmarkResult.as_dict``):

- ``<stem>-throughput``: output and total tokens/s against concurrency or offered rate, the knee marked;
- ``<stem>-ttft``: TTFT p50/p90/p99 against load;
- ``<stem>-itl``: ITL p50/p90/p99 against load.
"""

from __future__ import annotations

import itertools
import math
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

__all__ = ["Chart", "Series", "charts_for", "render_png", "render_svg", "write_plots"]

WIDTH, HEIGHT = 720, 440
_MARGIN_LEFT, _MARGIN_RIGHT, _MARGIN_TOP, _MARGIN_BOTTOM = 80, 150, 50, 60
_COLORS = ("#1f6fb5", "#d9641e", "#2a9d3a", "#b52a6f", "#6b4fb5")

# A 3x5 pixel font: five rows of three columns per glyph ("#" = ink). Lower case draws as upper case.
_GLYPHS: dict[str, str] = {
    "0": "### #.# #.# #.# ###", "1": ".#. ##. .#. .#. ###", "2": "### ..# ### #.. ###",
    "3": "### ..# ### ..# ###", "4": "#.# #.# ### ..# ..#", "5": "### #.. ### ..# ###",
    "6": "### #.. ### #.# ###", "7": "### ..# .#. .#. .#.", "8": "### #.# ### #.# ###",
    "9": "### #.# ### ..# ###", "A": ".#. #.# ### #.# #.#", "B": "##. #.# ##. #.# ##.",
    "C": ".## #.. #.. #.. .##", "D": "##. #.# #.# #.# ##.", "E": "### #.. ##. #.. ###",
    "F": "### #.. ##. #.. #..", "G": ".## #.. #.# #.# .##", "H": "#.# #.# ### #.# #.#",
    "I": "### .#. .#. .#. ###", "J": "..# ..# ..# #.# .#.", "K": "#.# #.# ##. #.# #.#",
    "L": "#.. #.. #.. #.. ###", "M": "#.# ### ### #.# #.#", "N": "##. #.# #.# #.# #.#",
    "O": ".#. #.# #.# #.# .#.", "P": "##. #.# ##. #.. #..", "Q": ".#. #.# #.# ##. .##",
    "R": "##. #.# ##. #.# #.#", "S": ".## #.. .#. ..# ##.", "T": "### .#. .#. .#. .#.",
    "U": "#.# #.# #.# #.# ###", "V": "#.# #.# #.# #.# .#.", "W": "#.# #.# ### ### #.#",
    "X": "#.# #.# .#. #.# #.#", "Y": "#.# #.# .#. .#. .#.", "Z": "### ..# .#. #.. ###",
    " ": "... ... ... ... ...", ".": "... ... ... ... .#.", ",": "... ... ... .#. #..",
    "-": "... ... ### ... ...", "/": "..# ..# .#. #.. #..", "(": ".#. #.. #.. #.. .#.",
    ")": ".#. ..# ..# ..# .#.", ":": "... .#. ... .#. ...", "%": "#.# ..# .#. #.. #.#",
    "=": "... ### ... ### ...", "+": "... .#. ### .#. ...", "_": "... ... ... ... ###",
    "?": "### ..# .#. ... .#.",
}  # fmt: skip
_SCALE = 2
_GLYPH_W, _GLYPH_H = 3 * _SCALE, 5 * _SCALE
_ADVANCE = _GLYPH_W + _SCALE


@dataclass(frozen=True)
class Series:
    """A series: ``style`` is line (joined markers), dashed, points (markers only), faint (pale markers only),
    ring (hollow circles, to mark points of another series) or path (a line without markers)."""

    name: str
    points: tuple[tuple[float, float], ...]
    style: str = "line"
    color: str = ""
    """``#rrggbb``; empty: the palette colour of the series' place."""
    legend: bool = True


@dataclass(frozen=True)
class Chart:
    """A line chart: several series over the same x axis (log scale when the levels span 8x or more). Without
    ``x_values`` (a continuous x, e.g. throughput) the x axis runs from 0 with round ticks, like the y axis."""

    title: str
    x_label: str
    y_label: str
    series: tuple[Series, ...]
    marker_x: float | None = None
    marker_label: str = ""
    x_values: tuple[float, ...] = field(default=())
    log_y: bool = False
    """A log y axis (decades with 2 and 5 between), for values spanning orders of magnitude, e.g. prices."""

    @property
    def log_x(self) -> bool:
        xs = [x for x in self.x_values if x > 0]
        return len(xs) >= 2 and min(xs) > 0 and max(xs) / min(xs) >= 8


def _nice_step(span: float, ticks: int = 5) -> float:
    raw = span / ticks if span > 0 else 1.0
    magnitude = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 2.5, 5, 10):
        if raw <= factor * magnitude:
            return factor * magnitude
    return 10 * magnitude


class _Layout:
    def __init__(self, chart: Chart) -> None:
        self.chart = chart
        xs = list(chart.x_values) or [x for s in chart.series for x, _ in s.points if math.isfinite(x)] or [0.0, 1.0]
        ys = [y for s in chart.series for _, y in s.points if math.isfinite(y)] or [0.0]
        self.x_min, self.x_max = min(xs), max(xs)
        self.x_step = 0.0
        if not chart.x_values:
            self.x_step = _nice_step(max(max(xs), 0.0))
            self.x_min, self.x_max = 0.0, max(self.x_step, math.ceil(max(xs) / self.x_step) * self.x_step)
        if self.x_max == self.x_min:
            self.x_min, self.x_max = self.x_min - 1, self.x_max + 1
        self.y_step = _nice_step(max(ys))
        self.y_max = max(self.y_step, math.ceil(max(ys) / self.y_step) * self.y_step)
        positive = [y for y in ys if y > 0] or [1.0]
        self.y_low = 10.0 ** math.floor(math.log10(min(positive)))  # the log axis' bottom (a decade)
        self.y_high = max(10.0 ** math.ceil(math.log10(max(positive))), self.y_low * 10)
        self.left, self.top = _MARGIN_LEFT, _MARGIN_TOP
        self.right, self.bottom = WIDTH - _MARGIN_RIGHT, HEIGHT - _MARGIN_BOTTOM

    def x(self, value: float) -> float:
        if self.chart.log_x:
            low, high = math.log(self.x_min), math.log(self.x_max)
            share = (math.log(max(value, 1e-12)) - low) / (high - low)
        else:
            share = (value - self.x_min) / (self.x_max - self.x_min)
        return self.left + share * (self.right - self.left)

    def y(self, value: float) -> float:
        if self.chart.log_y:
            low, high = math.log(self.y_low), math.log(self.y_high)
            share = (math.log(max(value, self.y_low / 10)) - low) / (high - low)
        else:
            share = value / self.y_max
        return self.bottom - share * (self.bottom - self.top)

    def y_ticks(self) -> list[float]:
        if self.chart.log_y:
            decades = round(math.log10(self.y_high / self.y_low))
            steps = (1, 2, 5) if decades <= 3 else (1,)
            ticks = [self.y_low * 10**d * m for d in range(decades) for m in steps]
            return [*ticks, self.y_high]
        count = round(self.y_max / self.y_step)
        return [self.y_step * i for i in range(count + 1)]

    def x_ticks(self) -> list[float]:
        if self.x_step:
            return [self.x_step * i for i in range(round(self.x_max / self.x_step) + 1)]
        return sorted(set(self.chart.x_values)) or [self.x_min, self.x_max]

    def legend_rows(self) -> list[tuple[float, int, Series]]:
        """(y, palette place, series) of each series in the legend."""
        shown = [(number, s) for number, s in enumerate(self.chart.series) if s.legend]
        return [(self.top + 10 + row * 20, number, s) for row, (number, s) in enumerate(shown)]


def _color(number: int, series: Series) -> str:
    return series.color or _COLORS[number % len(_COLORS)]


def _label(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if float(value).is_integer():
        return f"{value:.0f}"
    return f"{value:.3g}"


def render_svg(chart: Chart) -> str:
    """The chart as a standalone SVG document."""
    layout = _Layout(chart)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" '
        'font-family="Helvetica, Arial, sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{WIDTH / 2}" y="28" text-anchor="middle" font-size="16">{escape(chart.title)}</text>',
    ]
    for tick in layout.y_ticks():
        y = layout.y(tick)
        out.append(f'<line x1="{layout.left}" y1="{y:.1f}" x2="{layout.right}" y2="{y:.1f}" stroke="#e4e4e4"/>')
        out.append(f'<text x="{layout.left - 8}" y="{y + 4:.1f}" text-anchor="end">{_label(tick)}</text>')
    for tick in layout.x_ticks():
        x = layout.x(tick)
        out.append(f'<line x1="{x:.1f}" y1="{layout.bottom}" x2="{x:.1f}" y2="{layout.bottom + 5}" stroke="black"/>')
        out.append(f'<text x="{x:.1f}" y="{layout.bottom + 20}" text-anchor="middle">{_label(tick)}</text>')
    out.append(
        f'<polyline points="{layout.left},{layout.top} {layout.left},{layout.bottom} {layout.right},{layout.bottom}" '
        'fill="none" stroke="black"/>'
    )
    out.append(
        f'<text x="{(layout.left + layout.right) / 2}" y="{HEIGHT - 18}" text-anchor="middle">'
        f"{escape(chart.x_label)}{' (log scale)' if chart.log_x else ''}</text>"
    )
    middle = (layout.top + layout.bottom) / 2
    out.append(
        f'<text x="20" y="{middle}" text-anchor="middle" transform="rotate(-90 20 {middle})">'
        f"{escape(chart.y_label)}{' (log scale)' if chart.log_y else ''}</text>"
    )
    if chart.marker_x is not None:
        x = layout.x(chart.marker_x)
        out.append(
            f'<line x1="{x:.1f}" y1="{layout.top}" x2="{x:.1f}" y2="{layout.bottom}" stroke="#888" '
            'stroke-dasharray="6 4"/>'
        )
        out.append(f'<text x="{x + 4:.1f}" y="{layout.top + 12}" fill="#555">{escape(chart.marker_label)}</text>')
    for number, series in enumerate(chart.series):
        out.extend(_svg_series(layout, series, _color(number, series)))
    for legend_y, number, series in layout.legend_rows():
        out.append(_svg_sample(layout.right + 25, legend_y, series, _color(number, series)))
        out.append(f'<text x="{layout.right + 40}" y="{legend_y + 4}">{escape(series.name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


_SVG_DOT = 'r="3.5" fill="{c}"'
_SVG_MARKS = {
    "faint": 'r="3.5" fill="{c}" fill-opacity="0.25"',
    "ring": 'r="7" fill="none" stroke="{c}" stroke-width="2"',
}


def _svg_series(layout: _Layout, series: Series, color: str) -> list[str]:
    points = [(layout.x(x), layout.y(y)) for x, y in series.points if math.isfinite(x) and math.isfinite(y)]
    out = []
    if len(points) > 1 and series.style in ("line", "dashed", "path"):
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        dash = ' stroke-dasharray="6 4"' if series.style == "dashed" else ""
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"{dash}/>')
    if series.style != "path":
        mark = _SVG_MARKS.get(series.style, _SVG_DOT).format(c=color)
        out.extend(f'<circle cx="{x:.1f}" cy="{y:.1f}" {mark}/>' for x, y in points)
    return out


def _svg_sample(x: float, y: float, series: Series, color: str) -> str:
    if series.style in ("points", "faint", "ring"):
        mark = _SVG_MARKS.get(series.style, _SVG_DOT).format(c=color)
        return f'<circle cx="{x}" cy="{y}" {mark}/>'
    dash = ' stroke-dasharray="6 4"' if series.style == "dashed" else ""
    return f'<line x1="{x - 10}" y1="{y}" x2="{x + 10}" y2="{y}" stroke="{color}" stroke-width="2"{dash}/>'


class _Canvas:
    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.pixels = bytearray(b"\xff" * (width * height * 3))

    def dot(self, x: int, y: int, color: tuple[int, int, int]) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            at = (y * self.width + x) * 3
            self.pixels[at : at + 3] = bytes(color)

    def rect(self, x0: int, y0: int, x1: int, y1: int, color: tuple[int, int, int]) -> None:
        for y in range(max(0, y0), min(self.height, y1 + 1)):
            for x in range(max(0, x0), min(self.width, x1 + 1)):
                self.dot(x, y, color)

    def line(
        self, x0: float, y0: float, x1: float, y1: float, color: tuple[int, int, int], width: int = 1, dash: int = 0
    ) -> None:
        steps = max(1, int(max(abs(x1 - x0), abs(y1 - y0))))
        half = width // 2
        for step in range(steps + 1):
            if dash and (step // dash) % 2:
                continue
            x = round(x0 + (x1 - x0) * step / steps)
            y = round(y0 + (y1 - y0) * step / steps)
            self.rect(x - half, y - half, x - half + width - 1, y - half + width - 1, color)

    def text(self, x: float, y: float, text: str, color: tuple[int, int, int], anchor: str = "start") -> None:
        """Draw ``text`` with its baseline at ``y``; anchor start, middle or end."""
        width = len(text) * _ADVANCE - _SCALE
        left = x - (width / 2 if anchor == "middle" else width if anchor == "end" else 0)
        top = round(y - _GLYPH_H)
        for index, char in enumerate(text.upper()):
            rows = _GLYPHS.get(char, _GLYPHS["?"]).split()
            origin = round(left + index * _ADVANCE)
            for row, bits in enumerate(rows):
                for column, bit in enumerate(bits):
                    if bit == "#":
                        x0, y0 = origin + column * _SCALE, top + row * _SCALE
                        self.rect(x0, y0, x0 + _SCALE - 1, y0 + _SCALE - 1, color)

    def text_vertical(self, x: float, y: float, text: str, color: tuple[int, int, int]) -> None:
        """Draw ``text`` rotated a quarter turn counter-clockwise, centred on (x, y)."""
        width = len(text) * _ADVANCE - _SCALE
        bottom = round(y + width / 2)
        for index, char in enumerate(text.upper()):
            rows = _GLYPHS.get(char, _GLYPHS["?"]).split()
            origin = bottom - index * _ADVANCE
            for row, bits in enumerate(rows):
                for column, bit in enumerate(bits):
                    if bit == "#":
                        x0, y0 = round(x) + row * _SCALE, origin - (column + 1) * _SCALE
                        self.rect(x0, y0, x0 + _SCALE - 1, y0 + _SCALE - 1, color)

    def png(self) -> bytes:
        rows = b"".join(
            b"\x00" + bytes(self.pixels[y * self.width * 3 : (y + 1) * self.width * 3]) for y in range(self.height)
        )

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b"")
        )


def _rgb(color: str, opacity: float = 1.0) -> tuple[int, int, int]:
    """The colour, blended over white when ``opacity`` < 1."""
    channels = (int(color[1:3], 16), int(color[3:5], 16), int(color[5:7], 16))
    r, g, b = (round(255 - (255 - c) * opacity) for c in channels)
    return r, g, b


def _png_mark(canvas: _Canvas, x: float, y: float, style: str, color: str) -> None:
    if style == "ring":
        rgb = _rgb(color)
        for step in range(48):
            angle = step * math.pi / 24
            px, py = round(x + 7 * math.cos(angle)), round(y + 7 * math.sin(angle))
            canvas.rect(px - 1, py - 1, px, py, rgb)
    elif style != "path":
        rgb = _rgb(color, 0.25 if style == "faint" else 1.0)
        canvas.rect(round(x) - 3, round(y) - 3, round(x) + 3, round(y) + 3, rgb)


def _png_series(canvas: _Canvas, layout: _Layout, series: Series, color: str) -> None:
    points = [(layout.x(x), layout.y(y)) for x, y in series.points if math.isfinite(x) and math.isfinite(y)]
    if series.style in ("line", "dashed", "path"):
        for (xa, ya), (xb, yb) in itertools.pairwise(points):
            canvas.line(xa, ya, xb, yb, _rgb(color), width=2, dash=6 if series.style == "dashed" else 0)
    for x, y in points:
        _png_mark(canvas, x, y, series.style, color)


def render_png(chart: Chart) -> bytes:
    """The chart as PNG bytes (same layout as the SVG, bitmap text)."""
    layout = _Layout(chart)
    canvas = _Canvas(WIDTH, HEIGHT)
    black, grid, grey = (0, 0, 0), (228, 228, 228), (120, 120, 120)
    canvas.text(WIDTH / 2, 30, chart.title, black, "middle")
    for tick in layout.y_ticks():
        y = layout.y(tick)
        canvas.line(layout.left, y, layout.right, y, grid)
        canvas.text(layout.left - 8, y + 5, _label(tick), black, "end")
    for tick in layout.x_ticks():
        x = layout.x(tick)
        canvas.line(x, layout.bottom, x, layout.bottom + 5, black)
        canvas.text(x, layout.bottom + 20, _label(tick), black, "middle")
    canvas.line(layout.left, layout.top, layout.left, layout.bottom, black)
    canvas.line(layout.left, layout.bottom, layout.right, layout.bottom, black)
    x_label = chart.x_label + (" (log scale)" if chart.log_x else "")
    canvas.text((layout.left + layout.right) / 2, HEIGHT - 14, x_label, black, "middle")
    y_label = chart.y_label + (" (log scale)" if chart.log_y else "")
    canvas.text_vertical(14, (layout.top + layout.bottom) / 2, y_label, black)
    if chart.marker_x is not None:
        x = layout.x(chart.marker_x)
        canvas.line(x, layout.top, x, layout.bottom, grey, dash=6)
        canvas.text(x + 4, layout.top + 12, chart.marker_label, grey)
    for number, series in enumerate(chart.series):
        _png_series(canvas, layout, series, _color(number, series))
    for legend_y, number, series in layout.legend_rows():
        color = _color(number, series)
        if series.style in ("points", "faint", "ring"):
            _png_mark(canvas, layout.right + 25, legend_y, series.style, color)
        else:
            dash = 4 if series.style == "dashed" else 0
            canvas.line(layout.right + 15, legend_y, layout.right + 35, legend_y, _rgb(color), width=2, dash=dash)
        canvas.text(layout.right + 40, legend_y + 5, series.name, black)
    return canvas.png()


def _figure(point: dict[str, Any], key: str) -> float:
    value = point.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan


def charts_for(result: dict[str, Any]) -> dict[str, Chart]:
    """The three charts of a result, by name."""
    points: Sequence[dict[str, Any]] = [p for p in result.get("points", []) if isinstance(p, dict)]
    mode = points[0].get("mode", "concurrency") if points else "concurrency"
    x_label = "concurrency (requests in flight)" if mode == "concurrency" else "offered request rate (req/s)"
    levels = tuple(_figure(p, "level") for p in points)
    knee = result.get("knee") or {}
    knee_level = knee.get("level") if isinstance(knee, dict) else None
    marker = float(knee_level) if isinstance(knee_level, int | float) else None
    model = result.get("model") or "model"

    def series(name: str, key: str) -> Series:
        return Series(name, tuple((level, _figure(p, key)) for level, p in zip(levels, points, strict=True)))

    def percentiles(metric: str) -> tuple[Series, ...]:
        keys = [k for k in ("p50", "p90", "p99") if any(f"{k}_{metric}_ms" in p for p in points)]
        return tuple(series(f"{metric.upper()} {k}", f"{k}_{metric}_ms") for k in keys)

    def chart(title: str, y_label: str, lines: tuple[Series, ...]) -> Chart:
        label = "knee" if marker is not None else ""
        return Chart(title, x_label, y_label, lines, marker_x=marker, marker_label=label, x_values=levels)

    throughput = (series("output tok/s", "output_throughput"), series("total tok/s", "total_token_throughput"))
    return {
        "throughput": chart(f"Throughput of {model}", "tokens/s", throughput),
        "ttft": chart(f"Time to first token, {model}", "TTFT (ms)", percentiles("ttft")),
        "itl": chart(f"Inter-token latency, {model}", "ITL (ms)", percentiles("itl")),
    }


def write_plots(result: dict[str, Any], directory: Path, stem: str = "benchmark") -> list[Path]:
    """Write ``<stem>-{throughput,ttft,itl}.{svg,png}`` into ``directory``; returns the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, chart in charts_for(result).items():
        svg = directory / f"{stem}-{name}.svg"
        svg.write_text(render_svg(chart), encoding="utf-8")
        png = directory / f"{stem}-{name}.png"
        png.write_bytes(render_png(chart))
        written += [svg, png]
    return written

"""``loadgen.plots`` series styles and axes the benchmark report needs: markers only, faint, rings, dashed lines,
a continuous x axis from 0 and a log y axis."""

from __future__ import annotations

import struct
import zlib
from xml.etree import ElementTree

from loadgen.plots import Chart, Series, render_png, render_svg

NS = "{http://www.w3.org/2000/svg}"


def chart(**extra: object) -> Chart:
    series = (
        Series("line", ((10.0, 1.5), (40.0, 30.0)), color="#1f6fb5"),
        Series("dashed", ((10.0, 2.0), (40.0, 60.0)), style="dashed", color="#d9641e"),
        Series("points", ((20.0, 5.0),), style="points", color="#2a9d3a"),
        Series("hidden", ((25.0, 6.0), (30.0, 7.0)), style="faint", color="#b52a6f", legend=False),
        Series("ring", ((20.0, 5.0),), style="ring", color="#000000"),
        Series("path", ((10.0, 1.5), (20.0, 5.0)), style="path", color="#6b4fb5"),
    )
    return Chart("styles", "x", "y", series, **extra)  # type: ignore[arg-type]


def test_each_style_draws_what_it_says_and_the_legend_leaves_out_what_asks_to_be() -> None:
    svg = ElementTree.fromstring(render_svg(chart()))  # noqa: S314 (our own output)
    lines = svg.findall(f"{NS}polyline")
    assert len(lines) == 1 + 3  # the axes, line, dashed and path (points, faint and ring have none)
    assert sum(1 for line in lines if line.get("stroke-dasharray")) == 1
    faint = [c for c in svg.findall(f"{NS}circle") if c.get("fill-opacity") == "0.25"]
    assert len(faint) == 2
    rings = [c for c in svg.findall(f"{NS}circle") if c.get("fill") == "none" and c.get("r") == "7"]
    assert len(rings) == 1 + 1  # the point and its legend sample
    texts = {t.text for t in svg.findall(f"{NS}text")}
    assert {"line", "dashed", "points", "ring", "path"} <= texts and "hidden" not in texts


def test_a_continuous_x_axis_starts_at_0_with_round_ticks() -> None:
    svg = ElementTree.fromstring(render_svg(chart()))  # noqa: S314
    ticks = [t.text for t in svg.findall(f"{NS}text") if t.get("y") == "400"]
    assert ticks == ["0", "10", "20", "30", "40"]


def test_a_log_y_axis_spans_whole_decades_with_2_and_5_between() -> None:
    svg = ElementTree.fromstring(render_svg(chart(log_y=True)))  # noqa: S314
    ticks = [t.text for t in svg.findall(f"{NS}text") if t.get("text-anchor") == "end"]
    assert ticks == ["1", "2", "5", "10", "20", "50", "100"]
    assert any((t.text or "").endswith("(log scale)") for t in svg.findall(f"{NS}text"))


def test_the_png_draws_faint_markers_paler_than_full_ones() -> None:
    data = render_png(chart())
    width, height = struct.unpack(">II", data[16:24])
    idat_length = struct.unpack(">I", data[33:37])[0]
    pixels = zlib.decompress(data[41 : 41 + idat_length])
    assert len(pixels) == height * (1 + 3 * width)
    pale = bytes(round(255 - (255 - c) * 0.25) for c in (0xB5, 0x2A, 0x6F))
    assert pixels.count(pale) >= 2 * 49  # two 7x7 faint markers
    assert pixels.count(b"\xb5\x2a\x6f") == 0  # and never the full colour

"""``mcp_client_gateway.charts`` and ``chart_pages``: values drawn where they belong, axes that hold them, empty
series said so, and every string from a (possibly hostile) VM inert in a page no script can run in."""

from __future__ import annotations

import math
import re
from xml.etree import ElementTree

import pytest

from mcp_client_gateway.chart_pages import benchmark_page, comparison_page, metrics_page
from mcp_client_gateway.charts import CSP, MAX_POINTS, MAX_SERIES, Series, line_chart, page, plain_number, table

SVG = "{http://www.w3.org/2000/svg}"
HOSTILE = '"><script>alert(1)</script><img src=x onerror=alert(2)>\u202edcba\x1b[31m'


def parse(svg: str) -> ElementTree.Element:
    return ElementTree.fromstring(svg)  # noqa: S314 - our own output; well-formed XML, or this raises


def circles(svg: str) -> list[dict[str, str]]:
    return [dict(c.attrib) for c in parse(svg).iter(f"{SVG}circle")]


def ticks(svg: str, axis: str) -> list[str]:
    return [t.text or "" for t in parse(svg).iter(f"{SVG}text") if f"{axis}-tick" in t.attrib.get("class", "")]


class TestScaling:
    def test_points_sit_by_value_the_largest_highest_and_x_in_order(self) -> None:
        svg = line_chart("TTFT", [Series("p90", [(60.0, 0.8), (0.0, 0.2), (120.0, 0.5)])], width=400, height=200)
        drawn = circles(svg)
        assert [(float(c["data-x"]), float(c["data-y"])) for c in drawn] == [(0.0, 0.2), (60.0, 0.8), (120.0, 0.5)]
        xs = [float(c["cx"]) for c in drawn]
        ys = [float(c["cy"]) for c in drawn]
        assert xs[0] < xs[1] < xs[2] and xs[1] == pytest.approx((xs[0] + xs[2]) / 2, abs=0.1)  # linear in x
        assert ys[1] < ys[2] < ys[0]  # SVG y grows downwards
        assert min(xs) > 0 and max(xs) <= 400 and min(ys) > 0 and max(ys) <= 200

    def test_y_is_linear_from_zero_so_a_double_value_is_twice_as_far_from_the_axis(self) -> None:
        drawn = circles(line_chart("t", [Series("a", [(0.0, 10.0), (1.0, 20.0)])], height=260))
        bottom = 260 - 72  # the x axis
        first, second = (bottom - float(c["cy"]) for c in drawn)
        assert second == pytest.approx(2 * first, rel=0.01)

    def test_one_point_and_equal_values_still_get_a_non_empty_range(self) -> None:
        for points in ([(5.0, 3.0)], [(1.0, 0.0), (2.0, 0.0)]):
            drawn = circles(line_chart("t", [Series("a", points)]))
            assert len(drawn) == len(points) and all(math.isfinite(float(c["cy"])) for c in drawn)

    def test_non_finite_and_non_numeric_points_are_left_out(self) -> None:
        points = [(1.0, math.nan), (2.0, math.inf), (3.0, 4.0), (True, 1.0), ("7", 2.0)]
        drawn = circles(line_chart("t", [Series("a", points)]))  # type: ignore[list-item]
        assert [(c["data-x"], c["data-y"]) for c in drawn] == [("3", "4")]

    def test_series_and_points_are_bounded(self) -> None:
        many = [Series(f"s{i}", [(0.0, float(i))]) for i in range(MAX_SERIES + 3)]
        svg = line_chart("t", many)
        assert len(circles(svg)) == MAX_SERIES and "3 more series left out" in svg
        long = circles(line_chart("t", [Series("a", [(float(i), 1.0) for i in range(MAX_POINTS + 10)])]))
        assert len(long) == MAX_POINTS and long[0]["data-x"] == "10"  # the newest kept


class TestAxes:
    def test_the_y_axis_starts_at_zero_and_reaches_past_the_largest_value(self) -> None:
        labels = ticks(line_chart("t", [Series("a", [(0.0, 40.0), (1.0, 100.0)])]), "y")
        assert labels[0] == "0" and len(labels) == 5
        assert float(labels[-1]) >= 100

    def test_the_x_axis_spans_the_data_with_the_given_format(self) -> None:
        svg = line_chart("t", [Series("a", [(1.0, 1.0), (16.0, 2.0)])], x_format=lambda x: f"c{x:g}", x_label="level")
        labels = ticks(svg, "x")
        assert labels[0] == "c1" and labels[-1] == "c16" and ">level<" in svg

    @pytest.mark.parametrize(
        ("value", "text"), [(0, "0"), (0.01234, "0.0123"), (250, "250"), (2270, "2.27k"), (3_100_000, "3.1M")]
    )
    def test_plain_numbers(self, value: float, text: str) -> None:
        assert plain_number(value) == text


class TestEmpty:
    def test_no_series_or_only_empty_ones_say_no_data_and_draw_no_axes(self) -> None:
        for series in ([], [Series("a", [])], [Series("a", [(1.0, math.nan)])]):
            svg = line_chart("TTFT", series)
            root = parse(svg)
            assert "no data" in svg and not list(root.iter(f"{SVG}circle")) and not list(root.iter(f"{SVG}line"))


class TestEscaping:
    def test_titles_labels_and_cells_are_cleaned_and_escaped(self) -> None:
        svg = line_chart(HOSTILE, [Series(HOSTILE, [(1.0, 2.0)])], x_label=HOSTILE, y_label=HOSTILE)
        parse(svg)  # still one well-formed element: nothing broke out of an attribute or a text node
        assert "<script" not in svg and "<img" not in svg and "\u202e" not in svg and "\x1b" not in svg
        assert 'data-series="&quot;&gt;&lt;script&gt;' in svg
        html = table(("a", HOSTILE), [(HOSTILE, 1)])
        assert "<script" not in html and "&lt;script&gt;" in html and html.count("<td>") == 2

    def test_the_page_has_a_strict_csp_and_no_script(self) -> None:
        html = page(HOSTILE, [line_chart("t", [Series("a", [(1.0, 2.0)])])])
        assert f'<meta http-equiv="Content-Security-Policy" content="{CSP}">' in html
        for directive in ("default-src 'none'", "script-src 'none'", "connect-src 'none'", "base-uri 'none'"):
            assert directive in CSP
        assert "<script" not in html and "\u202e" not in html
        assert re.search(r"<title>&quot;&gt;&lt;script&gt;", html)


class TestPages:
    def test_metrics_page_charts_each_sli_over_time_in_display_units(self) -> None:
        view = {
            "deployment_id": "gemma-a",
            "phase": "SERVING",
            "window_minutes": 60,
            "summary": ["Totals since 12:00: requests served: 3"],
            "notes": [HOSTILE],
            "history": [
                {"taken_at": "2026-12-05T12:10:00Z", "slis": {"ttft_p50_s": 0.2, "kv_cache_usage": 0.5}},
                {"taken_at": "2026-12-05T12:00:00+00:00", "slis": {"ttft_p50_s": 0.1, "running": 3}},
                {"taken_at": "not a time", "slis": {"ttft_p50_s": 9.0}},
            ],
        }
        html = metrics_page(view)
        ttft = re.findall(r'data-series="TTFT p50" data-x="[^"]+" data-y="([^"]+)"', html)
        assert ttft == ["100", "200"]  # seconds as ms, oldest first; the sample without a time left out
        assert 'data-series="KV cache" data-x="1796472600" data-y="50"' in html
        assert "requests served: 3" in html and "<script" not in html and "2 sample(s) charted." in html

    def test_benchmark_page_charts_levels_and_tolerates_a_missing_result(self) -> None:
        view = {
            "run_id": "r1",
            "deployment_id": "gemma-a",
            "status": "completed",
            "request": {"mode": "rate"},
            "result": {"points": [{"level": 2.5, "output_throughput": 50.0}, {"level": "x"}, "junk"]},
            "headline": {"peak_output_throughput": 50.0, "saturated": True},
        }
        html = benchmark_page(view)
        assert 'data-series="output" data-x="2.5" data-y="50"' in html and "request rate (req/s)" in html
        assert html.count("no data") == 2  # TTFT and ITL: nothing to draw
        assert "no data" in benchmark_page({"result": None}) and "<circle" not in benchmark_page({})

    def test_comparison_page_draws_one_line_per_deployment(self) -> None:
        rows = [
            {"run_id": f"r{i}", "deployment_id": name, "created_at": f"2026-12-05T1{i}:00:00Z", "metrics": metrics}
            for i, (name, metrics) in enumerate(
                [("a", {"peak_output_throughput": 10.0}), ("b", {"peak_output_throughput": 20.0}), ("a", {})]
            )
        ]
        html = comparison_page({"rows": rows})
        assert re.findall(r'data-series="(\w)" data-x="[^"]+" data-y="([^"]+)"', html) == [("a", "10"), ("b", "20")]
        assert "3 benchmark run(s) compared" in html and html.count("<tr>") == 4  # header and three runs

"""A benchmark result as a plain-text table, for the CLI and for people reading logs."""

from __future__ import annotations

from typing import Any

from shared.domain.bench_economics import economics_lines

__all__ = ["result_table"]


def _cell(value: Any, digits: int) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value:,.{digits}f}"
    return "-"


def _percent(value: Any) -> str:
    return f"{value * 100:.1f}%" if isinstance(value, int | float) and not isinstance(value, bool) else "-"


def _extra_columns(result: dict[str, Any], points: list[dict[str, Any]]) -> list[tuple[str, int, Any]]:
    """(header, width, cell of a point) of the optional columns: the prefix cache (server's hit rate from
    ``/metrics`` and the client's expectation) and, in a stored result, each level's economics."""
    columns: list[tuple[str, int, Any]] = []
    if any(p.get("prefix_cache_hit_rate") is not None or p.get("expected_prefix_cache_hit_rate") for p in points):
        columns.append(("hit srv", 8, lambda p, _: _percent(p.get("prefix_cache_hit_rate"))))
        columns.append(("hit exp", 8, lambda p, _: _percent(p.get("expected_prefix_cache_hit_rate"))))
    economics = result.get("economics")
    rows = economics.get("points") if isinstance(economics, dict) else None
    if isinstance(rows, list) and len(rows) == len(points):
        columns.append(("tok/s/chip", 10, lambda _, r: _cell(r.get("output_tokens_per_s_per_chip"), 1)))
        columns.append(("$/M out", 8, lambda _, r: _cell(r.get("usd_per_million_output_tokens"), 3)))
        if isinstance(economics, dict) and economics.get("slo"):
            columns.append(("$/M @SLO", 9, lambda _, r: _cell(r.get("usd_per_million_output_tokens_at_slo"), 3)))
    return columns


def result_table(result: dict[str, Any]) -> str:
    """One row per level: throughput, TTFT/ITL/TPOT percentiles, goodput, the prefix cache's hit rate and, once
    the controller priced it, each level's economics; then the knee, the failures and the cost."""
    points = [p for p in result.get("points", []) if isinstance(p, dict)]
    dataset = result.get("dataset") or {}
    server = result.get("server") or {}
    request = result.get("request") or {}
    workload = request.get("workload") or "random"
    shape = (
        f"a trace of {dataset.get('trace_requests')} requests over {dataset.get('trace_span_s')} s replayed open loop"
        if workload == "trace"
        else f"{request.get('input_len')} in / {request.get('output_len')} out tokens, {request.get('mode')} sweep"
    )
    lines = [
        f"{result.get('model')} (vLLM {server.get('version') or '?'}), {result.get('endpoint')}: {shape}, "
        f"workload {workload} ({dataset.get('token_source')}, exact={dataset.get('exact_input_len')}), "
        f"warm-up {(result.get('warmup') or {}).get('requests', 0)}",
    ]
    extra = _extra_columns(result, points)
    economics = result.get("economics")
    priced = economics.get("points") if isinstance(economics, dict) and extra else None
    goodput = any(p.get("request_goodput") is not None for p in points)
    header = (
        f"{'level':>7} {'done':>5} {'fail':>4} {'req/s':>8} {'out tok/s':>10} {'TTFT p50':>9} {'TTFT p99':>9} "
        f"{'ITL p50':>8} {'ITL p99':>8} {'TPOT':>7} {'queue':>7}" + (f" {'goodput':>8}" if goodput else "")
    ) + "".join(f" {name:>{width}}" for name, width, _ in extra)
    lines += [header, "-" * len(header)]
    for number, p in enumerate(points):
        level = p.get("level")
        row = (
            f"{_cell(level, 0 if p.get('mode') == 'concurrency' else 2):>7} {_cell(p.get('completed'), 0):>5} "
            f"{_cell(p.get('failed'), 0):>4} {_cell(p.get('request_throughput'), 2):>8} "
            f"{_cell(p.get('output_throughput'), 1):>10} {_cell(p.get('median_ttft_ms'), 1):>9} "
            f"{_cell(p.get('p99_ttft_ms'), 1):>9} {_cell(p.get('median_itl_ms'), 2):>8} "
            f"{_cell(p.get('p99_itl_ms'), 2):>8} {_cell(p.get('mean_tpot_ms'), 2):>7} "
            f"{_cell(p.get('mean_client_queue_time_ms'), 1):>7}"
        )
        if goodput:
            row += f" {_cell(p.get('request_goodput'), 2):>8}"
        priced_row = priced[number] if isinstance(priced, list) and isinstance(priced[number], dict) else {}
        row += "".join(f" {cell(p, priced_row):>{width}}" for _, width, cell in extra)
        lines.append(row)
    lines.append("(times in ms; TTFT at the first token; queue = wait for the concurrency cap)")
    knee = result.get("knee") or {}
    if knee:
        lines.append(f"Knee: {knee.get('level')} ({knee.get('reason')})")
    failures = result.get("failures") or {}
    if failures:
        lines.append("Failures: " + ", ".join(f"{cause} x{count}" for cause, count in failures.items()))
    lines += economics_lines(economics)
    return "\n".join(lines)

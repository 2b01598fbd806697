"""A benchmark result as a plain-text table, for the CLI and for people reading logs."""

from __future__ import annotations

from typing import Any

__all__ = ["result_table"]


def _cell(value: Any, digits: int) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value:,.{digits}f}"
    return "-"


def result_table(result: dict[str, Any]) -> str:
    """One row per level: throughput, TTFT/ITL/TPOT percentiles, goodput and failures; then the knee."""
    points = [p for p in result.get("points", []) if isinstance(p, dict)]
    dataset = result.get("dataset") or {}
    server = result.get("server") or {}
    request = result.get("request") or {}
    lines = [
        f"{result.get('model')} (vLLM {server.get('version') or '?'}), {result.get('endpoint')}: "
        f"{request.get('input_len')} in / {request.get('output_len')} out tokens "
        f"({dataset.get('token_source')}, exact={dataset.get('exact_input_len')}), "
        f"{request.get('mode')} sweep, warm-up {(result.get('warmup') or {}).get('requests', 0)}",
    ]
    goodput = any(p.get("request_goodput") is not None for p in points)
    header = (
        f"{'level':>7} {'done':>5} {'fail':>4} {'req/s':>8} {'out tok/s':>10} {'TTFT p50':>9} {'TTFT p99':>9} "
        f"{'ITL p50':>8} {'ITL p99':>8} {'TPOT':>7} {'queue':>7}" + (f" {'goodput':>8}" if goodput else "")
    )
    lines += [header, "-" * len(header)]
    for p in points:
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
        lines.append(row)
    lines.append("(times in ms; TTFT at the first token; queue = wait for the concurrency cap)")
    knee = result.get("knee") or {}
    if knee:
        lines.append(f"Knee: {knee.get('level')} ({knee.get('reason')})")
    failures = result.get("failures") or {}
    if failures:
        lines.append("Failures: " + ", ".join(f"{cause} x{count}" for cause, count in failures.items()))
    return "\n".join(lines)

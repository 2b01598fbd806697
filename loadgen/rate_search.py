"""The open-loop max-rate-at-the-SLO search against a server, with repeats and 95 % intervals (issue 22, 3 and 4).

Each probe is a rate level of the load generator (Poisson arrivals, ``max(probe_requests, rate x probe_seconds)``
requests), run ``repeats`` times with different arrival seeds. Which rate comes next and when the search stops is
``shared.domain.bench_rate_search`` (saturation: achieved < 0.95 x offered; SLO: fewer than ``slo_attainment`` of
the requests met every threshold); the verdict of a probe is taken on its repeats' medians (rates, the share
completed and the share that met the SLO), so one repeat disturbed by a neighbour does not decide it. Every
figure of a row is a median and a mean with 95 % intervals (``shared.domain.bench_confidence``).

Each probe also carries the server's own count of its work, the deltas of ``vllm:request_success_total`` and
``vllm:generation_tokens_total`` over the level (``loadgen.server_cache.level_server_counts``), and how far the
client's completed requests and output tokens are from them (``agreement``), so the achieved figures can be
checked against ``/metrics``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loadgen.generator import BenchmarkSetupError, LoadGenerator
from shared.domain.bench_confidence import Estimate, change, estimate
from shared.domain.bench_rate_search import (
    SEARCH_FIGURES,
    ProbeFigures,
    ProbeVerdict,
    RateSearch,
    SearchSettings,
    judge_probe,
)
from shared.messages import BenchmarkRequest

__all__ = [
    "FIGURES",
    "SearchPlan",
    "compare_searches",
    "comparison_lines",
    "read_search",
    "search_max_rate",
    "search_table",
]

GENERATOR = "tpuctl-rate-search/1"

FIGURES = SEARCH_FIGURES  # every row carries these as estimates over the repeats


@dataclass(frozen=True, slots=True)
class SearchPlan:
    """The search's settings, and how much each probe sends and how often it is repeated."""

    settings: SearchSettings
    repeats: int = 1
    probe_requests: int = 24
    probe_seconds: float = 8.0

    def __post_init__(self) -> None:
        if not 1 <= self.repeats <= 20:
            raise ValueError(f"repeats: {self.repeats} must be within 1..20 (3-5 gives usable intervals)")
        if not 2 <= self.probe_requests <= 10000:
            raise ValueError(f"probe_requests: {self.probe_requests} must be within 2..10000")
        if not 0 < self.probe_seconds <= 3600:
            raise ValueError(f"probe_seconds: {self.probe_seconds} must be within (0, 3600] seconds")

    def requests_at(self, rate: float) -> int:
        return max(self.probe_requests, math.ceil(rate * self.probe_seconds))


def _probe_request(base: BenchmarkRequest, rate: float, count: int, seed: int, warmup: int) -> BenchmarkRequest:
    fields = base.model_dump(exclude={"trace"})
    fields.update(mode="rate", request_rate=(rate,), num_prompts=count, seed=seed, warmup_requests=warmup)
    fields.update(duration_s=None, max_concurrency=None)
    return BenchmarkRequest.model_validate(fields)


def _repeat_figures(point: dict[str, Any], rate: float) -> dict[str, Any]:
    """One repeat's figures: the rates the verdict reads, the SLO attainment, and the server's counts."""
    completed, failed = int(point.get("completed", 0)), int(point.get("failed", 0))
    sent = completed + failed
    duration = float(point.get("duration") or 0.0)
    goodput = point.get("request_goodput")
    good = None if goodput is None else round(goodput * duration)
    figures: dict[str, Any] = {
        "offered_rate": point.get("arrival_rate") or rate,
        "achieved_rate": point.get("completion_rate") or point.get("request_throughput", 0.0),
        "sent": sent,
        "completed": completed,
        "good": good,
        "slo_attainment": (good if good is not None else completed) / sent if sent else 0.0,
        "total_output_tokens": int(point.get("total_output_tokens", 0)),
        "server_requests_succeeded": point.get("server_requests_succeeded"),
        "server_generation_tokens": point.get("server_generation_tokens"),
        "duration": duration,
    }
    for name in FIGURES:
        if name not in figures and point.get(name) is not None:
            figures[name] = float(point[name])
    return figures


def _agreement(client: int, server: int | None) -> float | None:
    """Server / client - 1 (0.0 is exact); None when the server's count is unknown."""
    if server is None or client == 0:
        return None
    return round(server / client - 1.0, 4)


def _row(rate: float, repeats: list[dict[str, Any]], plan: SearchPlan) -> tuple[dict[str, Any], ProbeVerdict]:
    def median(name: str) -> float:
        return estimate([float(r[name]) for r in repeats]).median

    sent = sum(r["sent"] for r in repeats)
    has_slo = all(r["good"] is not None for r in repeats)
    figures = ProbeFigures(  # the median repeat: one repeat hit by a neighbour's burst does not decide the probe
        offered_rate=median("offered_rate"),
        achieved_rate=median("achieved_rate"),
        sent=sent,
        completed=min(sent, round(estimate([r["completed"] / max(r["sent"], 1) for r in repeats]).median * sent)),
        good=round(median("slo_attainment") * sent) if has_slo else None,
    )
    verdict = judge_probe(
        rate,
        figures,
        saturation_share=plan.settings.saturation_share,
        slo_attainment=plan.settings.slo_attainment,
    )
    estimates = {
        name: estimate([float(r[name]) for r in repeats]).as_dict()
        for name in FIGURES
        if all(r.get(name) is not None for r in repeats)
    }
    completed = sum(r["completed"] for r in repeats)
    output = sum(r["total_output_tokens"] for r in repeats)
    server_done = [r["server_requests_succeeded"] for r in repeats]
    server_tokens = [r["server_generation_tokens"] for r in repeats]
    server = {
        "completed": completed,
        "server_requests_succeeded": None if None in server_done else sum(server_done),
        "output_tokens": output,
        "server_generation_tokens": None if None in server_tokens else sum(server_tokens),
    }
    server["requests_agreement"] = _agreement(completed, server["server_requests_succeeded"])
    server["output_tokens_agreement"] = _agreement(output, server["server_generation_tokens"])
    row = {
        "rate": rate,
        "requests_per_repeat": plan.requests_at(rate),
        "repeats": len(repeats),
        "passed": verdict.passed,
        "failure": verdict.failure or None,
        "reason": verdict.reason,
        "figures": estimates,
        "server": server,
    }
    return row, verdict


async def search_max_rate(
    generator: LoadGenerator,
    base: BenchmarkRequest,
    plan: SearchPlan,
    *,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run the search (``base`` gives the workload, lengths, SLOs and seed); the result has every probed rate's row,
    the max rate at the SLO, the lowest failing rate and why the search stopped."""
    if base.workload == "trace":
        raise BenchmarkSetupError("workload: a trace sets its own arrivals; search with random or shared_prefix")
    search = RateSearch(plan.settings)
    rows: list[dict[str, Any]] = []
    model = None
    probe = 0
    while (rate := search.next_rate()) is not None:
        repeats: list[dict[str, Any]] = []
        for repeat in range(plan.repeats):
            seed = (base.seed + 7919 * probe + 104729 * repeat) % (2**31 - 1)
            warmup = base.warmup_requests if probe == 0 and repeat == 0 else 0
            request = _probe_request(base, rate, plan.requests_at(rate), seed, warmup)
            result = await generator.run(request)
            model = result.model
            repeats.append(_repeat_figures(result.points[0].as_dict(), rate))
        row, verdict = _row(rate, repeats, plan)
        rows.append(row)
        search.record(verdict)
        probe += 1
        if on_row is not None:
            on_row(row)
    outcome = search.result()
    best = next((row for row in rows if row["rate"] == outcome["max_rate_at_slo"]), None)
    return {
        "generator": GENERATOR,
        "model": model,
        "request": base.model_dump(mode="json", exclude={"prompts", "trace"}),
        "search": {**asdict(plan.settings), "repeats": plan.repeats, "probe_requests": plan.probe_requests},
        "max_rate_at_slo": outcome["max_rate_at_slo"],
        "lowest_failing_rate": outcome["lowest_failing_rate"],
        "stop_reason": outcome["stop_reason"],
        "goodput_at_max_rate": (best or {}).get("figures", {}).get("request_goodput"),
        "rows": rows,
    }


def read_search(path: Path) -> dict[str, Any]:
    """A previous search's ``search.json``; ``BenchmarkSetupError`` naming the file when it is not one."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BenchmarkSetupError(f"previous: cannot read {path} ({exc}); give a search.json a search wrote") from None
    if not isinstance(data, dict) or data.get("generator") != GENERATOR or not isinstance(data.get("rows"), list):
        raise BenchmarkSetupError(f"previous: {path} is not a search result (search.json from --search-max-rate)")
    return data


def compare_searches(now: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """% change of every figure at every rate both searches probed, flagged significant or not, and the max rate's."""
    earlier = {row["rate"]: row for row in before.get("rows", []) if isinstance(row, dict)}
    rates: list[dict[str, Any]] = []
    for row in now.get("rows", []):
        match = earlier.get(row["rate"])
        if match is None:
            continue
        changes = {}
        for name, figure in row["figures"].items():
            previous = match.get("figures", {}).get(name)
            if previous is not None:
                changes[name] = change(Estimate.from_dict(figure), Estimate.from_dict(previous))
        rates.append({"rate": row["rate"], "changes": changes})
    best_now, best_before = now.get("max_rate_at_slo"), before.get("max_rate_at_slo")
    max_rate = None
    if best_now is not None and best_before:
        max_rate = {
            "now": best_now,
            "before": best_before,
            "change_pct": round((best_now / best_before - 1) * 100, 1),
            "significant": None,
            "verdicts_contradict": best_now >= (before.get("lowest_failing_rate") or math.inf)
            or best_before >= (now.get("lowest_failing_rate") or math.inf),
            "test": "none: each run is one search, so its max rate has no interval; read the figures' changes at "
            "the rates both probed",
        }
    return {"max_rate_at_slo": max_rate, "rates": rates}


def comparison_lines(comparison: dict[str, Any]) -> list[str]:
    """The comparison with the previous search for people: the max rate, then each figure's % change per rate,
    marked ``*`` when significant (the 95 % intervals do not overlap)."""
    lines = []
    best = comparison.get("max_rate_at_slo")
    if best:
        flag = "the verdicts contradict" if best["verdicts_contradict"] else "consistent verdicts"
        flag += "; no interval for one search, see the rates below"
        lines.append(
            f"Max rate at the SLO vs previous: {best['before']} -> {best['now']} ({best['change_pct']:+.1f}%, {flag})"
        )
    for row in comparison.get("rates", []):
        cells = [
            f"{name} {verdict['change_pct']:+.1f}%{'*' if verdict['significant'] else ''}"
            for name, verdict in row["changes"].items()
            if verdict["change_pct"] is not None
        ]
        lines.append(f"  {row['rate']:g} req/s: " + ", ".join(cells))
    if lines:
        lines.append("  (* significant: the 95% t-intervals of the two runs' means do not overlap)")
    return lines


def _cell(figures: dict[str, Any], name: str, digits: int) -> str:
    figure = figures.get(name)
    return Estimate.from_dict(figure).text(digits) if figure else "-"


def search_table(result: dict[str, Any]) -> str:
    """One line per probed rate (medians, [95 % interval] with repeats), then the max rate and why it stopped."""
    header = (
        f"{'rate':>7} {'offered':>20} {'achieved':>20} {'goodput':>20} {'TTFT p50 ms':>22} {'SLO met':>17} "
        f"{'srv ok/cli':>11} {'srv tok/cli':>12}  verdict"
    )
    lines = [header, "-" * len(header)]
    for row in result.get("rows", []):
        f = row["figures"]
        server = row["server"]
        lines.append(
            f"{row['rate']:>7g} {_cell(f, 'offered_rate', 2):>20} {_cell(f, 'achieved_rate', 2):>20} "
            f"{_cell(f, 'request_goodput', 2):>20} {_cell(f, 'median_ttft_ms', 1):>22} "
            f"{_cell(f, 'slo_attainment', 2):>17} "
            f"{server['server_requests_succeeded']!s:>5}/{server['completed']:<5} "
            f"{server['server_generation_tokens']!s:>6}/{server['output_tokens']:<5}  "
            f"{'pass' if row['passed'] else row['failure']}"
        )
    lines.append(
        f"Max rate at the SLO: {result.get('max_rate_at_slo')} req/s (lowest failing "
        f"{result.get('lowest_failing_rate')}); stopped: {result.get('stop_reason')}"
    )
    return "\n".join(lines)

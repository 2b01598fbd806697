"""What ``tpuctl`` prints: ``Output`` (data on stdout, everything else on stderr) and one renderer per view.

Table cells are plain ``Text``, so markup-looking log or model text is shown, never interpreted.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from html import escape
from pathlib import Path
from typing import Any, TextIO

from pydantic import BaseModel
from rich.console import Console
from rich.table import Table
from rich.text import Text

from loadgen.plots import write_plots
from loadgen.report import result_table
from mcp_client_gateway.capabilities.benchmarks import throughput_bound_line
from mcp_client_gateway.interface_words import cli_text
from mcp_client_gateway.models import (
    BenchmarkComparison,
    BenchmarkView,
    CommandAccepted,
    DeploymentDetail,
    DeploymentList,
    HealthReport,
    LogsView,
    OperationView,
    PlanView,
    QueryResult,
    ResourceView,
    SecretSaved,
    ServingLogsView,
    ZoneQuotaView,
    ZonesView,
)
from mcp_client_gateway.tune_views import tune_table

_UNCUT = 100_000  # columns: wider than any row, so nothing is cut or wrapped


def _tty(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class Output:
    """Where things go: data on stdout, everything else on stderr."""

    def __init__(self, fmt: str, quiet: bool, stdout: TextIO, stderr: TextIO) -> None:
        self.format = fmt
        self.quiet = quiet
        self.stdout = stdout
        self.stderr = stderr
        # A terminal gets tables fitted to its width; a pipe or a file gets them whole (rich would cut at 80).
        self.out = Console(file=stdout, highlight=False, soft_wrap=False, width=None if _tty(stdout) else _UNCUT)
        self.err = Console(file=stderr, highlight=False, soft_wrap=True, width=None if _tty(stderr) else _UNCUT)

    @property
    def interactive(self) -> bool:
        return not self.quiet and self.stdin_tty and self.stderr.isatty()

    @property
    def stdin_tty(self) -> bool:
        return sys.stdin is not None and sys.stdin.isatty()

    def data(self, model: BaseModel, render: Callable[[Any, Output], None]) -> None:
        if self.format == "json":
            self.stdout.write(model.model_dump_json(indent=2) + "\n")
        else:
            render(model, self)

    def note(self, text: str) -> None:
        if not self.quiet:
            self.err.print(Text(text))


# ---------------------------------------------------------------------------------------------- renderers


def _cell(value: Any) -> Text:
    """Table cells are plain Text, so markup-looking log or model text is shown, never interpreted."""
    if value is None:
        return Text("-")
    if isinstance(value, float):
        return Text(f"{value:,.0f}" if abs(value) >= 1e5 else f"{value:.4g}")  # never 1.79633e+09
    return Text(str(value))


def _sli_rows(slis: dict[str, Any]) -> list[tuple[str, Any]]:
    """SLIs by name; the ones that are instants (``*_epoch_s``, ``*_at``) as UTC times."""
    rows: list[tuple[str, Any]] = []
    for name, value in sorted(slis.items()):
        instant = name.endswith(("_epoch_s", "_at")) and isinstance(value, int | float) and not isinstance(value, bool)
        rows.append((name, f"{datetime.fromtimestamp(value, UTC):%Y-%m-%d %H:%M:%S} UTC" if instant else value))
    return rows


def _table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> Table:
    table = Table(title=title, title_justify="left", show_lines=False)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(_cell(v) for v in row))
    return table


def render_accepted(accepted: CommandAccepted, out: Output) -> None:
    if out.quiet:
        out.stdout.write(accepted.command_id + "\n")
        return
    verb = "Already received" if accepted.duplicate else "Published"
    out.out.print(Text(f"{verb} {accepted.kind} for {accepted.deployment_id}"))
    out.out.print(Text(f"command id: {accepted.command_id}"))
    for warning in accepted.warnings:
        out.note(f"warning: {warning}")


def render_list(page: DeploymentList, out: Output) -> None:
    rows = [
        (d.deployment_id, d.model, d.accelerator, d.phase, d.zone, d.tier, d.endpoint, f"${d.spend_usd:.2f}")
        for d in page.deployments
    ]
    out.out.print(
        _table(
            f"Deployments ({page.total})", ("ID", "MODEL", "ACCEL", "PHASE", "ZONE", "TIER", "ENDPOINT", "SPEND"), rows
        )
    )


def render_detail(detail: DeploymentDetail, out: Output) -> None:
    facts = [
        ("deployment", detail.deployment_id),
        ("model", detail.model),
        ("accelerator", f"{detail.accelerator} ({detail.node.chips} chips)"),
        ("phase", detail.phase + (f" since {detail.phase_since:%Y-%m-%d %H:%M}" if detail.phase_since else "")),
        ("desired", detail.desired),
        ("zone / tier", f"{detail.zone or '-'} / {detail.tier or '-'}"),
        ("endpoint", detail.endpoint),
        ("spend", f"${detail.spend_usd:.2f}" + (f" (${detail.hourly_usd:.2f}/h)" if detail.hourly_usd else "")),
        ("message", detail.message or "-"),
    ]
    if detail.boot is not None:
        facts.append(("boot", f"{detail.boot.text} since {detail.boot.stage_since:%H:%M:%S} on {detail.boot.node}"))
        facts += [("boot stages", detail.boot.stages.text)] if detail.boot.stages is not None else []
    facts += [("engine", detail.engine_summary)] if detail.engine_summary else []
    facts += [("finding", finding) for finding in detail.findings]
    out.out.print(_table("Deployment", ("FIELD", "VALUE"), facts))
    if detail.resources:
        resource_rows = [(r.name, r.zone, r.tier, r.state, r.node_state, _terms(r)) for r in detail.resources]
        out.out.print(_table("Resources", ("NAME", "ZONE", "TIER", "STATE", "NODE", "TERMS"), resource_rows))
    if detail.attempts:
        rows = [(f"{a.at:%H:%M:%S}", a.zone, a.tier, a.outcome, a.detail) for a in detail.attempts[-10:]]
        out.out.print(
            _table(
                f"Capacity search ({detail.attempts_total} steps)", ("AT", "ZONE", "TIER", "OUTCOME", "DETAIL"), rows
            )
        )
    if detail.slis:
        out.out.print(_table("SLIs", ("SLI", "VALUE"), _sli_rows(detail.slis)))
    if detail.node.system:
        out.out.print(_table("Node", ("FIELD", "VALUE"), sorted((k, v) for k, v in detail.node.system.items())))


def _terms(r: ResourceView) -> str:
    """The reservation, valid-until, flex-start run cap (UTC) and spot probe's finding of one resource."""
    terms = [f"reservation {r.reservation}"] if r.reservation else []
    terms += [f"valid until {r.valid_until:%m-%d %H:%M}"] if r.valid_until else []
    terms += [f"run cap ends {r.run_ends_at:%m-%d %H:%M}"] if r.run_ends_at else []
    terms += [f"held by {r.waiting_on} (spot probe)"] if r.waiting_on else []
    return ", ".join(terms) or "-"


def render_operation(view: OperationView, out: Output) -> None:
    out.out.print(Text(f"{view.kind or 'command'} {view.status}: {view.stage}" + (" (done)" if view.done else "")))


def render_zones(view: ZonesView, out: Output) -> None:
    tiers = sorted({tier for zone in view.zones for tier in zone.usd_per_hour})
    live = view.live_quota is not None
    rows = [
        (
            z.zone,
            *(f"${z.usd_per_hour[t]:.2f}" if t in z.usd_per_hour else "-" for t in tiers),
            "yes" if z.available else "no",
            ", ".join(f"{t}: {k}" for t, k in z.blocked_tiers.items()) or "-",
            *((", ".join(_quota_cell(q) for q in z.quota) or "-",) if live else ()),
        )
        for z in view.zones
    ]
    title = f"Zones for {view.accelerator} ({view.chips} chips), $/hour, prices: {view.price_source.split(': ')[0]}"
    quota_column = ("QUOTA (free chips, largest slice that fits)",) if live else ()
    out.out.print(_table(title, ("ZONE", *(t.upper() for t in tiers), "OPEN", "BLOCKED", *quota_column), rows))
    for block in view.region_blocks:
        out.out.print(Text(f"region/project block: {block.key} ({block.reason})"))
    if view.live_quota is not None and view.live_quota.problem:
        read = "read" if view.live_quota.read else "not read"
        fix = f" Fix: {view.live_quota.fix}." if view.live_quota.fix else ""
        out.out.print(Text(f"live quota {read}: {view.live_quota.problem}.{fix}"))


def _quota_cell(quota: ZoneQuotaView) -> str:
    """``spot 12 free (v6e-8)``; ``on_demand not listed``; ``spot unlimited``; ``spot ? in use``."""
    if not quota.limits:
        return f"{quota.tier} not listed"
    if any(bound.in_use is None for bound in quota.limits):
        return f"{quota.tier} limit {min(b.limit for b in quota.limits)}, ? in use"
    if quota.headroom_chips is None:
        return f"{quota.tier} unlimited"
    largest = quota.slices_that_fit[-1] if quota.slices_that_fit else "none"
    return f"{quota.tier} {quota.headroom_chips} free ({largest})"


def render_plan(plan: PlanView, out: Output) -> None:
    c = plan.capacity
    facts = [
        ("model / slice", f"{plan.model} ({plan.hub_id}) on {plan.accelerator}, {plan.chips} chips {plan.topology}"),
        ("tensor parallel", c.tensor_parallel),
        ("usable HBM per chip", f"{c.usable_hbm_gib:.2f} GiB at {c.gpu_memory_utilization:.0%}"),
        ("weights per chip", f"{c.weights_gib:.2f} GiB ({c.weights_source})"),
        ("KV cache per chip", f"{c.kv_gib:.2f} GiB, {c.kv_cache_dtype}, {c.kv_bytes_per_token:,} B/token"),
        ("free per chip", f"{c.free_gib:.2f} GiB (activations ~{c.activation_gib_estimate:.2f} GiB)"),
        ("KV tokens", f"{c.kv_tokens:,} ({c.num_blocks} blocks of {c.block_size})"),
        ("context", f"{c.max_model_len:,} tokens, {c.max_sequences_at_context} full-context sequences at once"),
        ("verdict", "fits" if plan.fits else "does not fit: " + "; ".join(plan.reasons)),
    ]
    if not plan.fits:
        facts.append(("smallest slice that fits", plan.smallest_fitting_slice or "none in this family"))
    out.out.print(_table("Serving plan", ("FIGURE", "VALUE"), facts))
    rows = [
        (
            cost.region,
            cost.tier,
            f"${cost.usd_per_hour:.2f}",
            f"${cost.usd_per_day:.2f}",
            f"${cost.usd_for_ttl:.2f}" if cost.usd_for_ttl is not None else "-",
            f"${cost.usd_per_million_tokens:.2f}" if cost.usd_per_million_tokens is not None else "-",
        )
        for cost in plan.costs
    ]
    out.out.print(
        _table(
            f"Cost (prices: {plan.price_source.split(': ')[0]})",
            ("REGION", "TIER", "HOUR", "DAY", "TTL", "PER 1M TOK"),
            rows,
        )
    )
    out.out.print(Text(f"image {plan.image}"))
    out.out.print(Text("vllm " + " ".join(plan.argv[1:] if plan.argv[:1] == ["vllm"] else plan.argv)))
    out.out.print(Text(plan.search_scope.summary))
    if plan.calendar is not None:
        out.out.print(Text(f"calendar-mode window: {plan.calendar.note}"))
    for cache in plan.weights_cache:
        out.out.print(Text(f"weights cache {cache.region} ({cache.state}): {cache.note}"))
    if plan.prewarm is not None:
        quote = plan.prewarm
        out.out.print(
            Text(f"prewarm (tpuctl prewarm): about ${quote.usd:.2f} at {quote.tier} in {quote.region}, {quote.note}")
        )
    if plan.clock_warning:
        out.note(f"warning: {plan.clock_warning}")
    for note in plan.notes:
        out.note(f"note: {note}")


def render_query(result: QueryResult, out: Output) -> None:
    out.out.print(Text(result.text))
    ttft = f"{result.ttft_ms:.0f} ms" if result.ttft_ms is not None else "n/a"
    stats = (
        f"model {result.model} | TTFT {ttft} | total {result.total_ms:.0f} ms | "
        f"{result.completion_tokens} tokens | {result.decode_tokens_per_s or 'n/a'} tok/s decode"
    )
    if not out.quiet:
        out.err.print(Text(stats))
    if result.note:
        out.note(f"note: {result.note}")


def render_logs(view: LogsView, out: Output) -> None:
    rows = [(f"{e.time:%m-%d %H:%M:%S}" if e.time else "-", e.severity, e.source, e.message) for e in view.entries]
    out.out.print(_table("Logs (untrusted text)", ("TIME", "SEVERITY", "SOURCE", "MESSAGE"), rows))
    if view.truncated:
        out.note("output was cut to stay within bounds; narrow it with --minutes, --severity or --limit")
    if view.probe_lines_hidden:
        out.note(f"{view.probe_lines_hidden} line(s) of the monitor's own probes left out; --probes shows them")


def render_serving_logs(view: ServingLogsView, out: Output) -> None:
    out.note(f"vLLM container log of {view.deployment_id} (task {view.task_id}), untrusted text:")
    for line in view.lines:  # already stripped of escapes and control characters: written as is, unwrapped
        out.stdout.write(line + "\n")
    if view.status != "completed":
        out.note(f"{view.status}: {view.detail or cli_text(view.next_step)}")
    if view.truncated:
        out.note("output was cut to stay within bounds; ask for fewer lines with --tail")


def render_health(report: HealthReport, out: Output) -> None:
    rows = [(c.name, "ok" if c.ok else "FAIL", c.latency_ms, c.detail) for c in report.checks]
    verdict = "healthy" if report.healthy else "unhealthy"
    out.out.print(_table(f"{report.deployment_id}: {verdict}", ("CHECK", "RESULT", "MS", "DETAIL"), rows))


def render_benchmark(view: BenchmarkView, out: Output) -> None:
    rows = [(name, value, view.change_pct.get(name)) for name, value in view.headline.items()]
    if rows or view.tune is None:  # a tune without sweep figures: its trials below are the result
        out.out.print(_table(f"Benchmark {view.run_id} ({view.status})", ("METRIC", "VALUE", "CHANGE %"), rows))
    else:
        out.out.print(Text(f"Benchmark {view.run_id} ({view.status})"))
    if view.result and view.result.get("points"):
        out.out.print(Text(result_table(view.result)))  # every level, not only the headline
    bound = throughput_bound_line(view.result)
    if bound:
        out.out.print(Text(bound))
    if view.tune is not None:  # an auto-tune: every trial, the best marked, and the preset it kept
        out.out.print(Text(tune_table(view.tune, view.preset)))
    if view.error:
        out.out.print(Text(f"error: {view.error}"))


def write_benchmark_plots(view: BenchmarkView, directory: Path) -> list[Path]:
    """The run's charts as SVG and PNG, and one HTML page holding the SVGs, in ``directory``; [] without levels."""
    if not view.result or not view.result.get("points"):
        return []
    stem = f"benchmark-{view.run_id}"
    written = write_plots(view.result, directory, stem=stem)
    charts = [path.read_text(encoding="utf-8") for path in written if path.suffix == ".svg"]
    title = escape(f"Benchmark {view.run_id} of {view.deployment_id}")
    page = directory / f"{stem}.html"
    page.write_text(
        f"<!doctype html>\n<html><head><meta charset='utf-8'><title>{title}</title></head>\n<body>"
        f"<h1>{title}</h1>\n<pre>{escape(result_table(view.result))}</pre>\n{''.join(charts)}</body></html>\n",
        encoding="utf-8",
    )
    return [page, *written]


def render_comparison(view: BenchmarkComparison, out: Output) -> None:
    names = sorted({name for row in view.rows for name in row.metrics})[:6]
    rows = [
        (r.run_id[:8], r.deployment_id, r.model, r.accelerator, r.status, *(r.metrics.get(n) for n in names))
        for r in view.rows
    ]
    out.out.print(_table("Benchmarks", ("RUN", "DEPLOYMENT", "MODEL", "ACCEL", "STATUS", *names), rows))


def render_secret(saved: SecretSaved, out: Output) -> None:
    verb = "replaced" if saved.replaced else "unchanged" if saved.version == "unchanged" else "stored"
    out.out.print(Text(f"Hugging Face token {verb}: {saved.name} ({saved.version})"))

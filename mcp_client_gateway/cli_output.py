"""What ``tpuctl`` prints: ``Output`` (data on stdout, everything else on stderr) and one renderer per view.

Table cells are plain ``Text``, so markup-looking log or model text is shown, never interpreted.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from pydantic import BaseModel
from rich.console import Console
from rich.table import Table
from rich.text import Text

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
    SecretSaved,
    ServingLogsView,
    ZoneQuotaView,
    ZonesView,
)


class Output:
    """Where things go: data on stdout, everything else on stderr."""

    def __init__(self, fmt: str, quiet: bool, stdout: TextIO, stderr: TextIO) -> None:
        self.format = fmt
        self.quiet = quiet
        self.stdout = stdout
        self.stderr = stderr
        self.out = Console(file=stdout, highlight=False, soft_wrap=False)
        self.err = Console(file=stderr, highlight=False, soft_wrap=True)

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
        return Text(f"{value:g}")
    return Text(str(value))


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
    out.out.print(_table("Deployment", ("FIELD", "VALUE"), facts))
    if detail.resources:
        rows = [(r.name, r.zone, r.tier, r.state, r.node_state) for r in detail.resources]
        out.out.print(_table("Resources", ("NAME", "ZONE", "TIER", "STATE", "NODE"), rows))
    if detail.attempts:
        rows = [(f"{a.at:%H:%M:%S}", a.zone, a.tier, a.outcome, a.detail) for a in detail.attempts[-10:]]
        out.out.print(
            _table(
                f"Capacity search ({detail.attempts_total} steps)", ("AT", "ZONE", "TIER", "OUTCOME", "DETAIL"), rows
            )
        )
    if detail.slis:
        out.out.print(_table("SLIs", ("SLI", "VALUE"), sorted(detail.slis.items())))
    if detail.node.system:
        out.out.print(_table("Node", ("FIELD", "VALUE"), sorted((k, v) for k, v in detail.node.system.items())))


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
    title = f"Zones for {view.accelerator} ({view.chips} chips), $/hour, prices of {view.price_table_date}"
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
            f"Cost (prices of {plan.price_table_date})", ("REGION", "TIER", "HOUR", "DAY", "TTL", "PER 1M TOK"), rows
        )
    )
    out.out.print(Text(f"image {plan.image}"))
    out.out.print(Text("vllm " + " ".join(plan.argv[1:] if plan.argv[:1] == ["vllm"] else plan.argv)))
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


def render_logs(view: LogsView, out: Output) -> None:
    rows = [(f"{e.time:%m-%d %H:%M:%S}" if e.time else "-", e.severity, e.source, e.message) for e in view.entries]
    out.out.print(_table("Logs (untrusted text)", ("TIME", "SEVERITY", "SOURCE", "MESSAGE"), rows))
    if view.truncated:
        out.note("output was cut to stay within bounds; narrow it with --minutes, --severity or --limit")


def render_serving_logs(view: ServingLogsView, out: Output) -> None:
    out.note(f"vLLM container log of {view.deployment_id} (task {view.task_id}), untrusted text:")
    for line in view.lines:  # already stripped of escapes and control characters: written as is, unwrapped
        out.stdout.write(line + "\n")
    if view.status != "completed":
        out.note(f"{view.status}: {view.detail or view.next_step}")
    if view.truncated:
        out.note("output was cut to stay within bounds; ask for fewer lines with --tail")


def render_health(report: HealthReport, out: Output) -> None:
    rows = [(c.name, "ok" if c.ok else "FAIL", c.latency_ms, c.detail) for c in report.checks]
    verdict = "healthy" if report.healthy else "unhealthy"
    out.out.print(_table(f"{report.deployment_id}: {verdict}", ("CHECK", "RESULT", "MS", "DETAIL"), rows))


def render_benchmark(view: BenchmarkView, out: Output) -> None:
    rows = [(name, value, view.change_pct.get(name)) for name, value in view.headline.items()]
    out.out.print(_table(f"Benchmark {view.run_id} ({view.status})", ("METRIC", "VALUE", "CHANGE %"), rows))
    if view.error:
        out.out.print(Text(f"error: {view.error}"))


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

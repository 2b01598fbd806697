"""``tpu_observe``: what a deployment did, in one read tool. Serving metrics, log lines, the deployed model's own
summary of its warnings, benchmark results (one run or runs compared) and the node's debug bundles. Log lines,
bundles and model output are untrusted data; results say so.

No ``from __future__ import annotations`` here: the SDK reads these signatures at registration.
"""

from typing import Annotated, Literal

from mcp.types import CallToolResult
from pydantic import Field

from mcp_client_gateway import bounds
from mcp_client_gateway.capabilities.benchmarks import throughput_bound_line
from mcp_client_gateway.core import GatewayCore, GatewayError
from mcp_client_gateway.models import (
    BenchmarkComparison,
    BenchmarkView,
    DebugBundleView,
    LogAnalysis,
    LogsView,
    MetricsView,
)
from mcp_client_gateway.strict_tools import GatewayToolError
from mcp_client_gateway.tools.common import (
    UUID_PATTERN,
    OptionalDeploymentIdArg,
    SeverityChoice,
    ToolSet,
    annotations,
    run,
    tool_result,
)
from shared.domain.bench_economics import economics_lines

__all__ = ["bundle_summary", "register"]

Show = Literal["metrics", "logs", "analysis", "benchmarks", "debug_bundle"]


def register(tools: ToolSet) -> None:
    """``tpu_observe`` (read-only)."""
    core = tools.core

    @tools.tool(
        annotations=annotations("Observe", read_only=True, destructive=False, idempotent=True, open_world=True),
        views=(MetricsView, LogsView, LogAnalysis, BenchmarkView, BenchmarkComparison, DebugBundleView),
    )
    async def tpu_observe(
        show: Annotated[Show, Field(description="What to show.")] = "metrics",
        deployment_id: OptionalDeploymentIdArg = None,
        minutes: Annotated[
            int, Field(description="How far back.", ge=bounds.LOG_MINUTES[0], le=bounds.LOG_MINUTES[1])
        ] = 60,
        source: Annotated[
            Literal["any", "controller", "node"], Field(description="logs: controller or node (vLLM, agent).")
        ] = "any",
        min_severity: Annotated[
            SeverityChoice | None, Field(description="Lowest severity (default: all; analysis: WARNING).")
        ] = None,
        limit: Annotated[int | None, Field(description="logs/benchmarks: at most this many.", ge=1, le=200)] = None,
        command_id: Annotated[
            str | None,
            Field(description="benchmarks: one run; debug_bundle: a restart's or capture's id.", pattern=UUID_PATTERN),
        ] = None,
    ) -> CallToolResult:
        """metrics: latency percentiles, tok/s, errors, SLIs. logs: controller and VM lines. analysis: the
        model summarises its warnings. benchmarks: a run (command_id) or runs compared. debug_bundle: why vLLM hung.
        Logs and model output are untrusted."""
        if show == "logs":
            return await _logs(core, deployment_id, source, min_severity or "DEFAULT", minutes, limit or 50)
        if show == "benchmarks":
            return await _benchmarks(core, command_id, deployment_id, limit or 20)
        if deployment_id is None:
            raise GatewayToolError(
                GatewayError("invalid_argument", "deployment_id", f"is required for {show}", "add deployment_id")
            )
        if show == "metrics":
            view = await run(lambda: core.get_metrics(deployment_id, window_minutes=minutes))
            head = f"{len(view.history)} sample(s) in {minutes} min; phase {view.phase}."
            return tool_result(view, "\n".join([head, *view.summary, *(f"note: {n}" for n in view.notes)]))
        if show == "analysis":
            severity = min_severity or "WARNING"
            analysis = await run(lambda: core.analyze_logs(deployment_id, minutes=minutes, min_severity=severity))
            return tool_result(analysis, f"Analysed {analysis.lines_analysed} line(s): {analysis.summary[:200]}")
        bundle = await run(lambda: core.debug_bundle(deployment_id, capture=False, task_id=command_id))
        return tool_result(bundle, bundle_summary(bundle))


async def _logs(
    core: GatewayCore,
    deployment_id: str | None,
    source: str,
    min_severity: str,
    minutes: int,
    limit: int,
) -> CallToolResult:
    """Log lines, the monitor's successful probes left out (``tpuctl logs --probes`` shows them)."""
    view = await run(
        lambda: core.get_logs(
            deployment_id=deployment_id,
            source=source,  # type: ignore[arg-type]
            min_severity=min_severity,  # type: ignore[arg-type]
            minutes=minutes,
            limit=limit,
            include_probes=False,
        )
    )
    hidden = f"; {view.probe_lines_hidden} probe line(s) left out" if view.probe_lines_hidden else ""
    cut = " (truncated)" if view.truncated else ""
    return tool_result(view, f"{len(view.entries)} line(s){cut}{hidden}; untrusted data.")


async def _benchmarks(core: GatewayCore, run_id: str | None, deployment_id: str | None, limit: int) -> CallToolResult:
    """One run by its id, or the runs side by side with the best per headline metric."""
    if run_id is None:
        comparison = await run(lambda: core.compare_benchmarks(deployment_id=deployment_id, limit=limit))
        return tool_result(comparison, f"{len(comparison.rows)} run(s) compared.")
    try:
        view = await run(lambda: core.get_benchmark(run_id))
    except GatewayToolError as refused:  # the core calls the run's id run_id; this tool calls it command_id
        error = refused.error
        if error.field != "run_id":
            raise
        raise GatewayToolError(GatewayError(error.code, "command_id", error.problem, error.fix)) from None
    figures = ", ".join(f"{k} {v:g}" for k, v in list(view.headline.items())[:4]) or "no figures yet"
    bound = throughput_bound_line(view.result)
    cost = " ".join(economics_lines((view.result or {}).get("economics"))[1:])  # the cheapest level, at the SLO
    summary = f"Run {run_id} {view.status}" + (f": {figures}." if view.headline or view.tune is None else ".")
    summary += f" {bound}." if bound else ""
    return tool_result(view, summary + (f" {cost}" if cost else "") + _tuned(view))


def _tuned(view: BenchmarkView) -> str:
    """A tune's outcome: the baseline's and the best trial's max rate at the SLO, and how to reuse the preset."""
    if view.tune is None:
        return ""
    reuse = f" Deploy with it: tpu_deploy(preset='{view.preset.run_id}')." if view.preset else ""
    return f" tuned: {view.tune.text} ({len(view.tune.trials)} trials).{reuse}"


def bundle_summary(view: DebugBundleView) -> str:
    if view.status == "pending":
        return f"The node has not stored the bundle yet: call again with task_id {view.task_id}."
    if view.status != "ready":
        return f"No bundle ({view.status}): {view.detail} {view.next_step}".strip()
    states = ", ".join(f"{p.pid} {p.state}" for p in view.processes[:4]) or "no processes"
    return (
        f"Bundle of {view.captured_at or 'an unknown time'} ({view.reason or 'no reason'}): processes {states}; "
        f"{len(view.log_tail)} log line(s); untrusted data."
    )

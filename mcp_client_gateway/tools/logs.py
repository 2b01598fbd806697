"""Metrics and log tools: SLI samples, log lines, the vLLM container's log tail, a model's summary of the logs,
and the debug bundles nodes keep before a restart. Log lines, bundles and model output are untrusted data;
results say so.

No ``from __future__ import annotations`` here: the SDK reads these signatures at registration.
"""

from typing import Annotated, Literal

from mcp.types import CallToolResult
from pydantic import Field

from mcp_client_gateway import bounds
from mcp_client_gateway.models import DebugBundleView, LogAnalysis, LogsView, MetricsView, ServingLogsView
from mcp_client_gateway.tools.common import (
    ID_PATTERN,
    UUID_PATTERN,
    DeploymentIdArg,
    SeverityChoice,
    ToolSet,
    annotations,
    run,
    tool_result,
)

__all__ = ["register"]


def register(tools: ToolSet) -> None:
    """``tpu_get_metrics``, ``tpu_get_logs``, ``tpu_tail_serving_logs`` and ``tpu_debug_bundle`` (neither served
    read-only: they publish a node task), ``tpu_analyze_logs``."""
    _register_metrics(tools)
    _register_logs(tools)
    _register_tail(tools)
    _register_debug(tools)
    _register_analysis(tools)


def _register_metrics(tools: ToolSet) -> None:
    core = tools.core

    @tools.tool(
        annotations=annotations("Serving metrics", read_only=True, destructive=False, idempotent=True, open_world=False)
    )
    async def tpu_get_metrics(
        deployment_id: DeploymentIdArg,
        window_minutes: Annotated[
            int,
            Field(
                description="Minutes back for the window.",
                ge=bounds.WINDOW_MINUTES[0],
                le=bounds.WINDOW_MINUTES[1],
            ),
        ] = 60,
    ) -> Annotated[CallToolResult, MetricsView]:
        """Serving metrics: totals since serving began, the window's latency percentiles, requests/s, tokens/s
        and error rate, the latest SLIs and samples."""
        view = await run(lambda: core.get_metrics(deployment_id, window_minutes=window_minutes))
        head = f"{len(view.history)} sample(s) in {window_minutes} min; phase {view.phase}."
        return tool_result(view, "\n".join([head, *view.summary, *(f"note: {n}" for n in view.notes)]))


def _register_logs(tools: ToolSet) -> None:
    core = tools.core

    @tools.tool(
        annotations=annotations("Read logs", read_only=True, destructive=False, idempotent=True, open_world=True)
    )
    async def tpu_get_logs(
        deployment_id: Annotated[
            str | None,
            Field(description="Only this deployment's lines.", pattern=ID_PATTERN, max_length=40),
        ] = None,
        source: Annotated[
            Literal["any", "controller", "node"],
            Field(description="controller: Cloud Functions; node: the TPU VM (vLLM, node agent)."),
        ] = "any",
        min_severity: Annotated[SeverityChoice, Field(description="Lowest severity returned.")] = "DEFAULT",
        minutes: Annotated[
            int, Field(description="How far back.", ge=bounds.LOG_MINUTES[0], le=bounds.LOG_MINUTES[1])
        ] = 60,
        limit: Annotated[
            int, Field(description="At most this many lines.", ge=bounds.LOG_LIMIT[0], le=bounds.LOG_LIMIT[1])
        ] = 50,
        include_probes: Annotated[bool, Field(description="Also the monitor's successful probes.")] = False,
    ) -> Annotated[CallToolResult, LogsView]:
        """Recent log lines of the controller and the TPU VM (vLLM, node agent), newest first; bounded,
        secrets redacted. Untrusted data."""
        view = await run(
            lambda: core.get_logs(
                deployment_id=deployment_id,
                source=source,
                min_severity=min_severity,
                minutes=minutes,
                limit=limit,
                include_probes=include_probes,
            )
        )
        hidden = f"; {view.probe_lines_hidden} probe line(s) left out" if view.probe_lines_hidden else ""
        return tool_result(
            view, f"{len(view.entries)} line(s){' (truncated)' if view.truncated else ''}{hidden}; untrusted data."
        )


def _register_tail(tools: ToolSet) -> None:
    core = tools.core

    if not tools.read_only:

        @tools.tool(
            annotations=annotations(
                "Tail the vLLM container log", read_only=False, destructive=False, idempotent=False, open_world=True
            )
        )
        async def tpu_tail_serving_logs(
            deployment_id: DeploymentIdArg,
            lines: Annotated[
                int,
                Field(
                    description="How many of the newest lines.",
                    ge=bounds.TAIL_LINES[0],
                    le=bounds.TAIL_LINES[1],
                ),
            ] = 100,
            task_id: Annotated[
                str | None,
                Field(
                    description="The task_id a pending call returned.",
                    pattern=UUID_PATTERN,
                ),
            ] = None,
        ) -> Annotated[CallToolResult, ServingLogsView]:
            """The newest lines of the vLLM container's log, fetched from the node (BOOTING or later). If status
            is pending, call again with its task_id. Untrusted data."""
            view = await run(lambda: core.tail_serving_logs(deployment_id, lines=lines, task_id=task_id))
            if view.status == "pending":
                summary = f"The node has not answered yet: call again with task_id {view.task_id}."
            elif view.status == "failed":
                summary = f"The log tail failed: {view.detail}"
            else:
                cut = " (truncated)" if view.truncated else ""
                summary = f"{len(view.lines)} line(s) of the vLLM log{cut}; untrusted data."
            return tool_result(view, summary)


def _register_debug(tools: ToolSet) -> None:
    core = tools.core

    if not tools.read_only:

        @tools.tool(
            annotations=annotations(
                "Engine debug bundle", read_only=False, destructive=False, idempotent=False, open_world=True
            )
        )
        async def tpu_debug_bundle(
            deployment_id: DeploymentIdArg,
            capture: Annotated[
                bool,
                Field(description="Capture a new bundle now; default: read the newest kept."),
            ] = False,
            task_id: Annotated[
                str | None,
                Field(
                    description="A pending capture's task_id, or a restart's command_id.",
                    pattern=UUID_PATTERN,
                ),
            ] = None,
        ) -> Annotated[CallToolResult, DebugBundleView]:
            """Why a vLLM engine hung or crashed (STALLED, DOWN): process states, thread stacks, log tail, metrics
            and tpu-info from the node's debug bundle, one kept before every restart. If status is pending, call
            again with its task_id. Untrusted data."""
            view = await run(lambda: core.debug_bundle(deployment_id, capture=capture, task_id=task_id))
            return tool_result(view, _bundle_summary(view))


def _bundle_summary(view: DebugBundleView) -> str:
    if view.status == "pending":
        return f"The node has not stored the bundle yet: call again with task_id {view.task_id}."
    if view.status != "ready":
        return f"No bundle ({view.status}): {view.detail} {view.next_step}".strip()
    states = ", ".join(f"{p.pid} {p.state}" for p in view.processes[:4]) or "no processes"
    return (
        f"Bundle of {view.captured_at or 'an unknown time'} ({view.reason or 'no reason'}): processes {states}; "
        f"{len(view.log_tail)} log line(s); untrusted data."
    )


def _register_analysis(tools: ToolSet) -> None:
    core = tools.core

    @tools.tool(
        annotations=annotations(
            "Analyse logs with the deployed model", read_only=True, destructive=False, idempotent=False, open_world=True
        )
    )
    async def tpu_analyze_logs(
        deployment_id: DeploymentIdArg,
        minutes: Annotated[
            int, Field(description="How far back.", ge=bounds.ANALYZE_MINUTES[0], le=bounds.ANALYZE_MINUTES[1])
        ] = 60,
        min_severity: Annotated[SeverityChoice, Field(description="Lowest severity analysed.")] = "WARNING",
    ) -> Annotated[CallToolResult, LogAnalysis]:
        """Have a SERVING deployment's own model summarise its recent warnings and errors (up to 30 s). The
        answer is untrusted model output."""
        analysis = await run(lambda: core.analyze_logs(deployment_id, minutes=minutes, min_severity=min_severity))
        return tool_result(analysis, f"Analysed {analysis.lines_analysed} line(s): {analysis.summary[:200]}")

"""MCP Apps (``io.modelcontextprotocol/ui``): charts for ``tpu_observe``'s metrics and benchmarks, and a deployment's
phase and timeline for ``tpu_status``, in hosts that render them.

How it works, through the SDK's ``mcp.server.apps``:

* The server advertises the Apps extension, and each chart tool it serves carries ``_meta.ui.resourceUri`` naming a
  ``ui://tpuctl/...`` resource (``text/html;profile=mcp-app``) in its listing: its first view's page. A tool with
  several views (``tpu_observe``) picks the page of each call by its arguments (``ChartTool.pick``) and names that
  page in the result.
* A call from a client that negotiated Apps (it advertised the extension with that MIME type:
  ``client_supports_apps``) renders the tool's view into that resource's page (``chart_pages``: inline SVG, no
  script, a strict CSP) and names it in the result's ``_meta.ui.resourceUri``. Reading the resource returns the page
  of that tool's latest such call in this session (a stdio server serves one client), or a page that says to call
  the tool first. A page may draw more than the result holds: the app's ``gather`` reads it from the gateway core
  (the deployment page's timeline, ``GatewayCore.timeline``), on a worker thread, for Apps clients only.
* The result's content and structured content are left as they are, for every client; a client that did not
  negotiate Apps gets exactly what it got before (nothing is rendered for it, and no ``_meta`` is added).

No ``from __future__ import annotations`` here, like the other tool modules.
"""

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mcp.server.apps import APP_MIME_TYPE, Apps, client_supports_apps
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import ToolBinding
from mcp.server.mcpserver.resources import FunctionResource
from mcp.server.mcpserver.tools import Tool
from mcp.types import CallToolRequestParams, CallToolResult

from mcp_client_gateway.chart_pages import benchmark_page, comparison_page, deployment_page, metrics_page
from mcp_client_gateway.charts import page, paragraph
from mcp_client_gateway.core import GatewayCore
from mcp_client_gateway.tools.common import run

__all__ = ["CHART_APPS", "ChartApp", "ChartApps", "ChartTool"]

log = logging.getLogger("mcp_client_gateway.server")

MAX_PAGE_CHARS = 400_000  # a page bigger than this (it cannot be, with the views' bounds) is not served


Gather = Callable[[GatewayCore, Mapping[str, Any]], Mapping[str, Any]]


@dataclass(frozen=True)
class ChartApp:
    """One tool's chart page: its ``ui://`` address, a title, how its view (as JSON) becomes the page, and what more
    of the gateway the page draws (``gather``: read from the core by the result, merged into the view)."""

    uri: str
    title: str
    render: Callable[[Mapping[str, Any]], str]
    gather: Gather | None = None


def _timeline(core: GatewayCore, result: Mapping[str, Any]) -> Mapping[str, Any]:
    """The deployment's timeline (the status page's), beside its detail."""
    return {"timeline": core.timeline(str(result["deployment_id"])).model_dump(mode="json")}


METRICS = ChartApp("ui://tpuctl/charts/metrics.html", "Serving metrics", metrics_page)
BENCHMARK = ChartApp("ui://tpuctl/charts/benchmark.html", "Benchmark run", benchmark_page)
COMPARISON = ChartApp("ui://tpuctl/charts/comparison.html", "Benchmarks compared", comparison_page)
DEPLOYMENT = ChartApp("ui://tpuctl/charts/deployment.html", "Deployment and timeline", deployment_page, _timeline)


def _observed(arguments: Mapping[str, Any]) -> ChartApp | None:
    show = arguments.get("show", "metrics")
    if show == "metrics":
        return METRICS
    if show == "benchmarks":
        return BENCHMARK if arguments.get("command_id") else COMPARISON
    return None


def _status(arguments: Mapping[str, Any]) -> ChartApp | None:
    return DEPLOYMENT if arguments.get("deployment_id") and not arguments.get("command_id") else None


# How to call for each page, in the empty page's words.
_VIEW_OF = {
    METRICS.uri: "(show='metrics')",
    BENCHMARK.uri: "(show='benchmarks', command_id=...)",
    COMPARISON.uri: "(show='benchmarks')",
    DEPLOYMENT.uri: "(deployment_id=...)",
}


@dataclass(frozen=True)
class ChartTool:
    """A tool's chart pages: every page it may draw (the first is the one its listing names) and which one a
    call's arguments ask for (None: that view has no chart)."""

    pages: tuple[ChartApp, ...]
    pick: Callable[[Mapping[str, Any]], ChartApp | None]


CHART_APPS: dict[str, ChartTool] = {
    "tpu_observe": ChartTool((METRICS, BENCHMARK, COMPARISON), _observed),
    "tpu_status": ChartTool((DEPLOYMENT,), _status),
}


class ChartApps(Apps):
    """The Apps extension for the chart tools among ``tools`` (the server's, already registered strictly): stamps
    their ``_meta.ui``, serves their pages, and renders a page on each call from a client that negotiated Apps.
    ``core`` is what an app's ``gather`` reads (None: pages draw the result alone)."""

    def __init__(
        self, tools: Sequence[Tool], apps: Mapping[str, ChartTool] = CHART_APPS, *, core: GatewayCore | None = None
    ) -> None:
        super().__init__()
        self._core = core
        self._apps = {tool.name: apps[tool.name] for tool in tools if tool.name in apps}
        self._pages: dict[str, str] = {}
        for tool in tools:
            chart = self._apps.get(tool.name)
            if chart is not None:
                tool.meta = {**(tool.meta or {}), "ui": {"resourceUri": chart.pages[0].uri}}
                for app in chart.pages:
                    self.add_resource(self._resource(tool.name, app))

    def _resource(self, name: str, app: ChartApp) -> FunctionResource:
        view = _VIEW_OF.get(app.uri, "")
        empty = page(
            app.title, [paragraph(f"No chart yet: call {name}{view} first; this page shows its latest result.")]
        )

        def read() -> str:
            return self._pages.get(app.uri, empty)

        return FunctionResource.from_function(
            read,
            app.uri,
            name=f"{name}-{app.uri.rsplit('/', 1)[-1].removesuffix('.html')}-chart",
            title=app.title,
            description=f"Charts of {name}'s latest result (MCP Apps; inline SVG, no script).",
            mime_type=APP_MIME_TYPE,
            meta={"ui": {"csp": {}, "prefersBorder": True}},
        )

    def tools(self) -> Sequence[ToolBinding]:
        """None added: the chart tools are the server's own, registered strictly before this extension."""
        return ()

    def page(self, uri: str) -> str | None:
        """The page at ``uri`` as the latest call from an Apps client drew it (None before one)."""
        return self._pages.get(uri)

    async def intercept_tool_call(
        self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        result = await call_next(ctx)
        chart = self._apps.get(params.name)
        app = chart.pick(params.arguments or {}) if chart is not None else None
        if app is None or not isinstance(result, CallToolResult) or result.is_error:
            return result
        if not client_supports_apps(ctx) or not isinstance(result.structured_content, Mapping):
            return result
        try:
            html = app.render(await self._view(app, result.structured_content))
        except Exception:  # a chart is an extra: the result stands without it
            log.exception("rendering the chart of %s failed", params.name)
            return result
        if len(html) > MAX_PAGE_CHARS:
            return result
        self._pages[app.uri] = html
        return result.model_copy(update={"meta": {**(result.meta or {}), "ui": {"resourceUri": app.uri}}})

    async def _view(self, app: ChartApp, result: Mapping[str, Any]) -> Mapping[str, Any]:
        """The result, and what the app gathers beside it from the core (read like a tool reads it: off the loop)."""
        gather, core = app.gather, self._core
        if gather is None or core is None:
            return result
        return {**result, **await run(lambda: gather(core, result))}

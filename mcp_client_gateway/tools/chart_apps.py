"""MCP Apps (``io.modelcontextprotocol/ui``): charts for the metrics and benchmark tools in hosts that render them.

How it works, through the SDK's ``mcp.server.apps``:

* The server advertises the Apps extension, and each chart tool it serves carries ``_meta.ui.resourceUri`` naming a
  ``ui://tpuctl/...`` resource (``text/html;profile=mcp-app``) in its listing.
* A call from a client that negotiated Apps (it advertised the extension with that MIME type:
  ``client_supports_apps``) renders the tool's view into that resource's page (``chart_pages``: inline SVG, no
  script, a strict CSP) and names it in the result's ``_meta.ui.resourceUri``. Reading the resource returns the page
  of that tool's latest such call in this session (a stdio server serves one client), or a page that says to call
  the tool first.
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

from mcp_client_gateway.chart_pages import benchmark_page, comparison_page, metrics_page
from mcp_client_gateway.charts import page, paragraph

__all__ = ["CHART_APPS", "ChartApp", "ChartApps"]

log = logging.getLogger("mcp_client_gateway.server")

MAX_PAGE_CHARS = 400_000  # a page bigger than this (it cannot be, with the views' bounds) is not served


@dataclass(frozen=True)
class ChartApp:
    """One tool's chart page: its ``ui://`` address, a title, and how its view (as JSON) becomes the page."""

    uri: str
    title: str
    render: Callable[[Mapping[str, Any]], str]


CHART_APPS: dict[str, ChartApp] = {
    "tpu_get_metrics": ChartApp("ui://tpuctl/charts/metrics.html", "Serving metrics", metrics_page),
    "tpu_get_benchmark": ChartApp("ui://tpuctl/charts/benchmark.html", "Benchmark run", benchmark_page),
    "tpu_compare_benchmarks": ChartApp("ui://tpuctl/charts/comparison.html", "Benchmarks compared", comparison_page),
}


class ChartApps(Apps):
    """The Apps extension for the chart tools among ``tools`` (the server's, already registered strictly): stamps
    their ``_meta.ui``, serves their pages, and renders a page on each call from a client that negotiated Apps."""

    def __init__(self, tools: Sequence[Tool], apps: Mapping[str, ChartApp] = CHART_APPS) -> None:
        super().__init__()
        self._apps = {tool.name: apps[tool.name] for tool in tools if tool.name in apps}
        self._pages: dict[str, str] = {}
        for tool in tools:
            app = self._apps.get(tool.name)
            if app is not None:
                tool.meta = {**(tool.meta or {}), "ui": {"resourceUri": app.uri}}
                self.add_resource(self._resource(tool.name, app))

    def _resource(self, name: str, app: ChartApp) -> FunctionResource:
        empty = page(app.title, [paragraph(f"No chart yet: call {name} first; this page shows its latest result.")])

        def read() -> str:
            return self._pages.get(app.uri, empty)

        return FunctionResource.from_function(
            read,
            app.uri,
            name=f"{name}-chart",
            title=app.title,
            description=f"Charts of {name}'s latest result (MCP Apps; inline SVG, no script).",
            mime_type=APP_MIME_TYPE,
            meta={"ui": {"csp": {}, "prefersBorder": True}},
        )

    def tools(self) -> Sequence[ToolBinding]:
        """None added: the chart tools are the server's own, registered strictly before this extension."""
        return ()

    def page(self, name: str) -> str | None:
        """The page of ``name``'s latest call from an Apps client (None before one)."""
        app = self._apps.get(name)
        return self._pages.get(app.uri) if app is not None else None

    async def intercept_tool_call(
        self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        result = await call_next(ctx)
        app = self._apps.get(params.name)
        if app is None or not isinstance(result, CallToolResult) or result.is_error:
            return result
        if not client_supports_apps(ctx) or not isinstance(result.structured_content, Mapping):
            return result
        try:
            html = app.render(result.structured_content)
        except Exception:  # a chart is an extra: the result stands without it
            log.exception("rendering the chart of %s failed", params.name)
            return result
        if len(html) > MAX_PAGE_CHARS:
            return result
        self._pages[app.uri] = html
        return result.model_copy(update={"meta": {**(result.meta or {}), "ui": {"resourceUri": app.uri}}})

"""Benchmark tools: run one on a serving deployment, read a run, compare runs.

No ``from __future__ import annotations`` here: the SDK reads these signatures at registration.
"""

from typing import Annotated, Any, Literal

from mcp.types import CallToolResult
from pydantic import BaseModel, ConfigDict, Field

from mcp_client_gateway import bounds
from mcp_client_gateway.capabilities.benchmarks import throughput_bound_line
from mcp_client_gateway.models import BenchmarkComparison, BenchmarkView, CommandAccepted
from mcp_client_gateway.tools.common import (
    ID_PATTERN,
    UUID_PATTERN,
    CommandIdArg,
    DeploymentIdArg,
    ModelChoice,
    ToolSet,
    accepted_summary,
    annotations,
    run,
    tool_result,
)
from shared.domain.bench_economics import economics_lines

__all__ = ["TraceEntry", "register"]


class TraceEntry(BaseModel):
    """One request of a trace to replay (as in a trace file line)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    timestamp: float = Field(description="Arrival in seconds.", ge=0, le=1e10)
    input_len: int = Field(description="Prompt tokens.", ge=bounds.INPUT_LEN[0], le=bounds.INPUT_LEN[1])
    output_len: int = Field(description="Generated tokens.", ge=bounds.OUTPUT_LEN[0], le=bounds.OUTPUT_LEN[1])


WorkloadArg = Annotated[
    Literal["random", "shared_prefix", "multi_turn", "trace"],
    Field(
        description="shared_prefix: prompts share a prefix; multi_turn: sessions resending their history; "
        "trace: replay trace."
    ),
]
PrefixLenArg = Annotated[
    int | None, Field(description="shared_prefix: prefix tokens, below input_len.", ge=1, le=131071)
]
PrefixShareArg = Annotated[
    float | None, Field(description="shared_prefix: share of requests with the prefix.", ge=0, le=1)
]
TurnsArg = Annotated[
    int | None, Field(description="multi_turn: requests per session.", ge=bounds.TURNS[0], le=bounds.TURNS[1])
]
TraceArg = Annotated[
    list[TraceEntry] | None,
    Field(description="trace: the requests to replay.", max_length=bounds.TRACE_REQUESTS),
]


def _settings(optional: dict[str, Any], trace: list[TraceEntry] | None) -> dict[str, Any]:
    """The optional benchmark settings given (the default workload, random, is left out like any default)."""
    given = {key: value for key, value in optional.items() if value is not None}
    if given.get("workload") == "random":
        del given["workload"]
    if trace:
        given["trace"] = [entry.model_dump() for entry in trace]
    return given


def register(tools: ToolSet) -> None:
    """``tpu_run_benchmark`` (not served read-only), ``tpu_get_benchmark``, ``tpu_compare_benchmarks``."""
    _register_run(tools)
    _register_get(tools)
    _register_compare(tools)


def _register_run(tools: ToolSet) -> None:
    core = tools.core

    if not tools.read_only:

        @tools.tool(
            annotations=annotations(
                "Run a benchmark", read_only=False, destructive=False, idempotent=True, open_world=True
            )
        )
        async def tpu_run_benchmark(
            deployment_id: DeploymentIdArg,
            mode: Annotated[
                Literal["concurrency", "rate"], Field(description="Sweep concurrency levels or request rates.")
            ] = "concurrency",
            concurrency: Annotated[
                list[Annotated[int, Field(ge=bounds.CONCURRENCY_LEVEL[0], le=bounds.CONCURRENCY_LEVEL[1])]],
                Field(description="Concurrency levels of the sweep.", min_length=1, max_length=bounds.MAX_LEVELS),
            ] = [1, 4, 16],  # noqa: B006 - pydantic copies defaults
            request_rate: Annotated[
                list[Annotated[float, Field(gt=bounds.REQUEST_RATE[0], le=bounds.REQUEST_RATE[1])]] | None,
                Field(description="Requests per second levels (mode rate).", max_length=bounds.MAX_LEVELS),
            ] = None,
            num_prompts: Annotated[
                int, Field(description="Requests per level.", ge=bounds.NUM_PROMPTS[0], le=bounds.NUM_PROMPTS[1])
            ] = 64,
            input_len: Annotated[
                int, Field(description="Prompt tokens.", ge=bounds.INPUT_LEN[0], le=bounds.INPUT_LEN[1])
            ] = 256,
            output_len: Annotated[
                int, Field(description="Generated tokens.", ge=bounds.OUTPUT_LEN[0], le=bounds.OUTPUT_LEN[1])
            ] = 64,
            endpoint: Annotated[Literal["chat", "completions"], Field(description="API measured.")] = "completions",
            slo_ttft_ms: Annotated[
                float | None, Field(description="TTFT SLO for goodput.", gt=bounds.SLO_MS[0], le=bounds.SLO_MS[1])
            ] = None,
            slo_tpot_ms: Annotated[
                float | None, Field(description="TPOT SLO for goodput.", gt=bounds.SLO_MS[0], le=bounds.SLO_MS[1])
            ] = None,
            workload: WorkloadArg = "random",
            prefix_len: PrefixLenArg = None,
            prefix_share: PrefixShareArg = None,
            turns: TurnsArg = None,
            trace: TraceArg = None,
            command_id: CommandIdArg = None,
        ) -> Annotated[CallToolResult, CommandAccepted]:
            """Benchmark a SERVING deployment from its own VM: latency percentiles, throughput, goodput,
            prefix-cache hits and $ per million tokens per level. Returns command_id (the run id) at once; follow
            with tpu_get_operation, then tpu_get_benchmark."""
            benchmark: dict[str, Any] = {
                "mode": mode,
                "concurrency": concurrency,
                "num_prompts": num_prompts,
                "input_len": input_len,
                "output_len": output_len,
                "endpoint": endpoint,
            }
            workload_fields = {"workload": workload, "prefix_len": prefix_len, "prefix_share": prefix_share}
            optional = {"request_rate": request_rate or None, "slo_ttft_ms": slo_ttft_ms, "slo_tpot_ms": slo_tpot_ms}
            benchmark.update(_settings({**optional, **workload_fields, "turns": turns}, trace))
            accepted = await run(lambda: core.run_benchmark(deployment_id, benchmark=benchmark, command_id=command_id))
            return tool_result(accepted, accepted_summary(accepted))


def _register_get(tools: ToolSet) -> None:
    core = tools.core

    @tools.tool(
        annotations=annotations(
            "Benchmark result", read_only=True, destructive=False, idempotent=True, open_world=False
        )
    )
    async def tpu_get_benchmark(
        run_id: Annotated[
            str,
            Field(
                description="The command_id tpu_run_benchmark returned.",
                pattern=UUID_PATTERN,
            ),
        ],
    ) -> Annotated[CallToolResult, BenchmarkView]:
        """One benchmark run: status, settings, results per level, the plan it ran with, headline numbers and
        the change from the previous run."""
        view = await run(lambda: core.get_benchmark(run_id))
        figures = ", ".join(f"{k} {v:g}" for k, v in list(view.headline.items())[:4]) or "no figures yet"
        bound = throughput_bound_line(view.result)
        cost = " ".join(economics_lines((view.result or {}).get("economics"))[1:])  # the cheapest level, at the SLO
        summary = f"Run {run_id} {view.status}: {figures}." + (f" {bound}." if bound else "")
        return tool_result(view, summary + (f" {cost}" if cost else ""))


def _register_compare(tools: ToolSet) -> None:
    core = tools.core

    @tools.tool(
        annotations=annotations(
            "Compare benchmarks", read_only=True, destructive=False, idempotent=True, open_world=False
        )
    )
    async def tpu_compare_benchmarks(
        deployment_id: Annotated[
            str | None, Field(description="Only this deployment's runs.", pattern=ID_PATTERN, max_length=40)
        ] = None,
        model: Annotated[ModelChoice | None, Field(description="Only runs of this model preset.")] = None,
        limit: Annotated[
            int, Field(description="At most this many runs.", ge=bounds.COMPARE_LIMIT[0], le=bounds.COMPARE_LIMIT[1])
        ] = 20,
    ) -> Annotated[CallToolResult, BenchmarkComparison]:
        """Benchmark runs side by side, newest first, with the best run per headline metric (throughput, TTFT,
        ITL)."""
        comparison = await run(lambda: core.compare_benchmarks(deployment_id=deployment_id, model=model, limit=limit))
        return tool_result(comparison, f"{len(comparison.rows)} run(s) compared.")

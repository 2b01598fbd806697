"""``tpu_benchmark``: run a benchmark on a serving deployment from its own VM (results: ``tpu_observe``).

No ``from __future__ import annotations`` here: the SDK reads these signatures at registration.
"""

from typing import Annotated, Any, Literal

from mcp.types import CallToolResult
from pydantic import Field

from mcp_client_gateway import bounds
from mcp_client_gateway.models import CommandAccepted
from mcp_client_gateway.tools.common import (
    CommandIdArg,
    DeploymentIdArg,
    ToolSet,
    accepted_summary,
    annotations,
    run,
    tool_result,
)

__all__ = ["register"]


WorkloadArg = Annotated[
    Literal["random", "shared_prefix", "multi_turn"],
    Field(description="shared_prefix: prompts share a prefix; multi_turn: sessions resend history."),
]
PrefixLenArg = Annotated[int | None, Field(description="shared_prefix: tokens, under input_len.", ge=1, le=131071)]
PrefixShareArg = Annotated[float | None, Field(description="shared_prefix: share of requests.", ge=0, le=1)]
TurnsArg = Annotated[int | None, Field(description="multi_turn: turns.", ge=bounds.TURNS[0], le=bounds.TURNS[1])]
TuneTrialsArg = Annotated[
    int | None,
    Field(
        description="N>=2: auto-tune serving flags, N trials; needs an SLO.",
        ge=bounds.TUNE_TRIALS[0],
        le=bounds.TUNE_TRIALS[1],
    ),
]


def _settings(optional: dict[str, Any]) -> dict[str, Any]:
    """The optional benchmark settings given (the default workload, random, is left out like any default). A trace
    to replay comes from a file: ``tpuctl bench run --trace-file``."""
    given = {key: value for key, value in optional.items() if value is not None}
    if given.get("workload") == "random":
        del given["workload"]
    return given


def register(tools: ToolSet) -> None:
    """``tpu_benchmark`` (not served read-only)."""
    core = tools.core
    if tools.read_only:
        return

    @tools.tool(
        annotations=annotations("Run a benchmark", read_only=False, destructive=False, idempotent=True, open_world=True)
    )
    async def tpu_benchmark(
        deployment_id: DeploymentIdArg,
        concurrency: Annotated[
            list[Annotated[int, Field(ge=bounds.CONCURRENCY_LEVEL[0], le=bounds.CONCURRENCY_LEVEL[1])]],
            Field(description="Concurrency levels.", min_length=1, max_length=bounds.MAX_LEVELS),
        ] = [1, 4, 16],  # noqa: B006 - pydantic copies defaults
        request_rate: Annotated[
            list[Annotated[float, Field(gt=bounds.REQUEST_RATE[0], le=bounds.REQUEST_RATE[1])]] | None,
            Field(description="Request/s levels instead.", max_length=bounds.MAX_LEVELS),
        ] = None,
        num_prompts: Annotated[
            int, Field(description="Requests per level.", ge=bounds.NUM_PROMPTS[0], le=bounds.NUM_PROMPTS[1])
        ] = 64,
        input_len: Annotated[int, Field(ge=bounds.INPUT_LEN[0], le=bounds.INPUT_LEN[1])] = 256,
        output_len: Annotated[int, Field(ge=bounds.OUTPUT_LEN[0], le=bounds.OUTPUT_LEN[1])] = 64,
        slo_ttft_ms: Annotated[float | None, Field(gt=bounds.SLO_MS[0], le=bounds.SLO_MS[1])] = None,
        slo_tpot_ms: Annotated[float | None, Field(gt=bounds.SLO_MS[0], le=bounds.SLO_MS[1])] = None,
        workload: WorkloadArg = "random",
        prefix_len: PrefixLenArg = None,
        prefix_share: PrefixShareArg = None,
        turns: TurnsArg = None,
        tune_trials: TuneTrialsArg = None,
        command_id: CommandIdArg = None,
    ) -> Annotated[CallToolResult, CommandAccepted]:
        """Benchmark a SERVING deployment from its VM: latency percentiles, tok/s, goodput at the SLOs, prefix
        hits, $/M tokens per level. Returns command_id; results: tpu_observe(show='benchmarks', command_id)."""
        benchmark: dict[str, Any] = {
            "mode": "rate" if request_rate else "concurrency",
            "concurrency": concurrency,
            "num_prompts": num_prompts,
            "input_len": input_len,
            "output_len": output_len,
            "endpoint": "completions",
        }
        workload_fields = {"workload": workload, "prefix_len": prefix_len, "prefix_share": prefix_share}
        optional = {"request_rate": request_rate or None, "slo_ttft_ms": slo_ttft_ms, "slo_tpot_ms": slo_tpot_ms}
        benchmark.update(_settings({**optional, **workload_fields, "turns": turns, "tune_trials": tune_trials}))
        accepted = await run(lambda: core.run_benchmark(deployment_id, benchmark=benchmark, command_id=command_id))
        return tool_result(accepted, accepted_summary(accepted))

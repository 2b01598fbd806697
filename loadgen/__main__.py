"""Run a benchmark from the command line: ``python -m loadgen --url http://127.0.0.1:8000 ...``.

Writes ``result.json`` (the structured result), ``records.jsonl`` (one line per request) and the plots into
``--out``, and prints the table; with ``--search-max-rate`` it searches the open-loop max rate at the SLO instead
(``loadgen.rate_search``) and writes ``search.json``. The API key is read from a file, never taken on the command line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from pydantic import ValidationError

from loadgen.datasets import find_tokenizer_file, read_prompt_file
from loadgen.generator import LoadGenerator, Target
from loadgen.plots import write_plots
from loadgen.rate_search import (
    SearchPlan,
    compare_searches,
    comparison_lines,
    read_search,
    search_max_rate,
    search_table,
)
from loadgen.report import result_table
from loadgen.workloads import read_trace_file
from shared.domain.bench_rate_search import SearchSettings
from shared.domain.errors import PermanentError
from shared.messages import BenchmarkRequest


def _numbers(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m loadgen", description="Benchmark an OpenAI-compatible server.")
    parser.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    parser.add_argument("--model", help="served model id (default: the first /v1/models lists)")
    parser.add_argument("--api-key-file", type=Path, help="file holding the API key")
    parser.add_argument("--concurrency", type=_numbers, help="concurrency levels, e.g. 1,4,16")
    parser.add_argument("--rate", type=_numbers, help="request rates (req/s), e.g. 1,2,4: rate mode")
    parser.add_argument("--arrival", choices=["poisson", "constant"], default="poisson")
    parser.add_argument("--max-concurrency", type=int, help="rate mode: cap on requests in flight")
    parser.add_argument("--num-prompts", type=int, default=64, help="requests per level")
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--prompt-file", type=Path, help="prompts: one per line, or .jsonl with 'prompt'")
    parser.add_argument(
        "--workload",
        choices=["random", "shared_prefix", "multi_turn", "trace"],
        help="random (default), shared_prefix, multi_turn, or trace (implied by --trace-file)",
    )
    parser.add_argument("--prefix-len", type=int, default=0, help="shared_prefix: tokens of the common prefix")
    parser.add_argument("--prefix-share", type=float, default=1.0, help="shared_prefix: share of requests with it")
    parser.add_argument("--turns", type=int, default=4, help="multi_turn: requests per session")
    parser.add_argument(
        "--trace-file", type=Path, help="trace to replay: JSON Lines of timestamp (s), input_len, output_len"
    )
    parser.add_argument("--tokenizer", type=Path, help="tokenizer.json, model folder or HF cache (optional)")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up requests")
    parser.add_argument("--duration", type=float, help="seconds per level (stops starting requests after)")
    parser.add_argument("--slo-ttft-ms", type=float)
    parser.add_argument("--slo-tpot-ms", type=float)
    parser.add_argument("--slo-e2el-ms", type=float)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench-out"), help="folder for result, records and plots")
    search = parser.add_argument_group("open-loop max rate at the SLO (--search-max-rate)")
    search.add_argument(
        "--search-max-rate", action="store_true", help="search the highest Poisson rate that keeps up and meets the SLO"
    )
    search.add_argument("--start-rate", type=float, default=1.0, help="first rate probed (req/s)")
    search.add_argument("--max-rate", type=float, default=1000.0, help="highest rate probed (req/s)")
    search.add_argument("--refine-steps", type=int, default=2, help="bisections between the last pass and first fail")
    search.add_argument("--probe-requests", type=int, default=24, help="least requests per probe")
    search.add_argument("--probe-seconds", type=float, default=8.0, help="a probe sends rate x this many requests")
    search.add_argument("--repeats", type=int, default=1, help="runs of every probe, for 95%% intervals (3-5)")
    search.add_argument("--slo-attainment", type=float, default=0.9, help="share of requests that must meet the SLO")
    search.add_argument("--previous", type=Path, help="a previous search.json: %% change, significant or not")
    return parser


def _search(args: argparse.Namespace, generator: LoadGenerator, request: BenchmarkRequest) -> int:
    """``--search-max-rate``: writes ``search.json`` (and the comparison with ``--previous``), prints the table."""
    try:
        settings = SearchSettings(
            start_rate=args.start_rate,
            max_rate=args.max_rate,
            refine_steps=args.refine_steps,
            slo_attainment=args.slo_attainment,
        )
        plan = SearchPlan(settings, args.repeats, args.probe_requests, args.probe_seconds)
    except ValueError as exc:
        field, _, why = str(exc).partition(": ")
        print(f"error: --{field.replace('_', '-')}: {why}", file=sys.stderr)
        return 2
    try:
        previous = read_search(args.previous) if args.previous else None
        result = asyncio.run(search_max_rate(generator, request, plan, on_row=lambda row: print(row["reason"])))
    except PermanentError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if previous is not None:
        result["versus_previous"] = compare_searches(result, previous)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "search.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    print(search_table(result))
    for line in comparison_lines(result.get("versus_previous") or {}):
        print(line)
    print(f"\nwrote {args.out}/search.json")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    api_key = args.api_key_file.read_text(encoding="utf-8").strip() if args.api_key_file else None
    try:
        entries = read_prompt_file(args.prompt_file) if args.prompt_file else None
        trace = read_trace_file(args.trace_file) if args.trace_file else ()
    except PermanentError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    fields: dict[str, object] = {
        "mode": "rate" if args.rate else "concurrency",
        "arrival": args.arrival,
        "endpoint": args.endpoint,
        "num_prompts": args.num_prompts,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "warmup_requests": args.warmup,
        "duration_s": args.duration,
        "slo_ttft_ms": args.slo_ttft_ms,
        "slo_tpot_ms": args.slo_tpot_ms,
        "slo_e2el_ms": args.slo_e2el_ms,
        "seed": args.seed,
        "max_concurrency": args.max_concurrency,
        "dataset": "prompts" if entries else "random",
        # the file's prompts go to the generator directly (prompt_entries); one is enough for validation
        "prompts": tuple(text for text, _ in entries[:1]) if entries else (),
        "workload": args.workload or ("trace" if trace else "random"),
        "prefix_len": args.prefix_len,
        "prefix_share": args.prefix_share,
        "turns": args.turns,
        "trace": trace,
    }
    if args.rate:
        fields["request_rate"] = args.rate
    if args.concurrency:
        fields["concurrency"] = tuple(int(level) for level in args.concurrency)
    try:
        request = BenchmarkRequest.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        message = str(first["msg"]).removeprefix("Value error, ")
        print(f"error: {where}: {message}" if where else f"error: {message}", file=sys.stderr)
        return 2
    tokenizer = find_tokenizer_file(args.tokenizer) if args.tokenizer else None
    generator = LoadGenerator(
        Target(args.url, endpoint=args.endpoint, model=args.model, api_key=api_key),
        tokenizer_file=tokenizer,
        server_counts=args.search_max_rate,
    )
    if args.search_max_rate:
        return _search(args, generator, request)
    try:
        result = asyncio.run(generator.run(request, prompt_entries=entries))
    except PermanentError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    summary = result.as_dict()
    (args.out / "result.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    with (args.out / "records.jsonl").open("w", encoding="utf-8") as out:
        for line in result.records_jsonl():
            out.write(line + "\n")
    write_plots(summary, args.out)
    print(result_table(summary))
    print(f"\nwrote {args.out}/result.json, records.jsonl and plots")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

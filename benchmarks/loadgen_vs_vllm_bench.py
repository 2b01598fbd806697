"""Our load generator next to ``vllm bench serve``: agreement on a real server, TTFT error, and client headroom.

Run: ``.venv/bin/python -m benchmarks.loadgen_vs_vllm_bench [--reps 3] [--only agreement|ttft|headroom|chat]``
(needs ``make vllm-env tiny-model``; ``vllm bench serve`` comes from that venv).

1. **Agreement** (real vLLM on CPU, tiny model): the same workload (completions, random 64 in / 32 out tokens
   by default, ``--input-len`` / ``--output-len`` to change them,
   ``ignore_eos``, concurrency 4, 4 warm-ups) run by both clients, alternating and swapping order each repetition;
   by default the server is pinned to CPU 0 and the clients to CPU 1, so neither client slows the server for the
   other (``--no-pin`` shares both CPUs: a faster server, more interference).
   Compared: request and output throughput, mean and p99 TTFT and ITL (target: within 10 %), as the median of
   ratios of adjacent runs. The server's own histograms over the same runs are shown beside them.
   The comparison that measures the clients rather than the server is
   ``--model large --input-len 512 --rate 0.6 --together``: a scaled-up model whose TTFT (about 0.3 s) and ITL
   (about 20 ms) dwarf a client's own milliseconds, as on a TPU; requests arriving at a constant rate, so the
   server does the same work whichever client sends them (at fixed concurrency, a client's turnaround time
   changes how the server batches); and both clients at once, so both meet the same server state (run one after
   the other, the server's own speed drifts between runs by more than 10 %).
2. **TTFT error** (stub, first token exactly 50 ms after a request reached its socket, then a token every 50 ms):
   concurrency 64, 640 requests; error = measured TTFT - 50 ms (target: median under 1 ms). For our client,
   each request is matched with the stub's record of it, which splits the error into the stub's lateness and
   the client's own part.
3. **Client headroom** (stub answering at once, 8 tokens): the highest request rate each client drives at
   concurrency 64 (``--request-rate inf --max-concurrency 64`` for vLLM), on this machine, in the same run
   (target: ours at least vLLM's). httpx's default transport is measured too, to show why ours exists.
4. **Chat TTFT** (stub, role chunk at once, first token at 50 ms): where each client takes a chat TTFT.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from loadgen.generator import LoadGenerator, Target
from loadgen.stats import RequestRecord
from shared.messages import BenchmarkRequest
from tests.support.stub_server import StubBehaviour, spawn_stub
from tests.support.vllm_server import ensure_tiny_model, start_vllm_server, vllm_venv_dir

# The served model for the agreement test: the tiny test model, or a scaled-up copy (84M parameters) whose TTFT
# on this CPU is a few hundred ms and ITL tens of ms, as on a TPU, so the clients' own milliseconds are small.
MODELS: dict[str, dict[str, int]] = {"tiny": {}, "large": {"hidden": 1024, "layers": 8}}
FIGURES = ("request_throughput", "output_throughput", "mean_ttft_ms", "p99_ttft_ms", "mean_itl_ms", "p99_itl_ms")
DELAY_MS = 50.0


@dataclass(frozen=True)
class Workload:
    concurrency: int
    prompts: int
    input_len: int
    output_len: int
    warmups: int
    rate: float | None = None  # requests arriving at this constant rate (concurrency then caps them) instead

    def describe(self) -> str:
        load = (
            f"arriving at a constant {self.rate:g} req/s (at most {self.concurrency} in flight)"
            if self.rate
            else f"at concurrency {self.concurrency}"
        )
        return (
            f"completions, random {self.input_len} in / {self.output_len} out tokens, ignore_eos, {self.prompts} "
            f"prompts {load}, {self.warmups} warm-ups"
        )


def our_request(work: Workload) -> BenchmarkRequest:
    """The workload as our generator's request: the same shape ``_vllm_bench_argv`` gives ``vllm bench serve``."""
    shape: dict[str, Any] = dict(
        concurrency=(work.concurrency,),
        num_prompts=work.prompts,
        input_len=work.input_len,
        output_len=work.output_len,
        warmup_requests=work.warmups,
        percentiles=(50, 90, 99),
    )
    if work.rate:
        shape.update(mode="rate", request_rate=(work.rate,), arrival="constant", max_concurrency=work.concurrency)
    return BenchmarkRequest(**shape)


def ours(
    url: str, work: Workload, *, transport: httpx.AsyncBaseTransport | None = None
) -> tuple[dict[str, Any], list[RequestRecord]]:
    """One level with our generator: the flat point and its raw records (``perf_counter`` times)."""
    result = asyncio.run(LoadGenerator(Target(url), transport=transport).run(our_request(work)))
    return result.as_dict()["points"][0], result.points[0].records


def _vllm_bench_argv(
    url: str, work: Workload, out: Path, *, model: str, tokenizer: Path, detailed: bool, cpu: int | None, chat: bool
) -> list[str]:
    taskset = shutil.which("taskset")
    argv = [*([taskset, "-c", str(cpu)] if cpu is not None and taskset else [])]
    backend, endpoint = ("openai-chat", "/v1/chat/completions") if chat else ("openai", "/v1/completions")
    argv += [str(vllm_venv_dir() / "bin" / "vllm"), "bench", "serve", "--backend", backend]
    argv += ["--endpoint", endpoint, "--base-url", url, "--model", model, "--tokenizer", str(tokenizer)]
    argv += ["--dataset-name", "random", "--random-input-len", str(work.input_len)]
    argv += ["--random-output-len", str(work.output_len), "--num-prompts", str(work.prompts)]
    # Burstiness 10,000: gamma-distributed gaps with a coefficient of variation of 1 %, i.e. a constant rate.
    rate = ["--request-rate", f"{work.rate:g}", "--burstiness", "10000"] if work.rate else ["--request-rate", "inf"]
    argv += [*rate, "--max-concurrency", str(work.concurrency), "--ignore-eos"]
    argv += ["--num-warmups", str(work.warmups), "--percentile-metrics", "ttft,tpot,itl,e2el"]
    argv += ["--metric-percentiles", "50,90,99", "--ready-check-timeout-sec", "0", "--disable-tqdm"]
    argv += ["--save-result", "--result-dir", str(out), "--result-filename", "result.json"]
    argv += ["--save-detailed"] if detailed else []
    return argv


def _vllm_bench_env() -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", ""),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "PYTHONUNBUFFERED": "1",  # its progress lines arrive as printed (the side-by-side mode waits for one)
    }


def _vllm_bench_result(out: Path, work: Workload, returncode: int, output: str) -> dict[str, Any]:
    """The ``--save-result`` file of a finished run, checked for failures its exit code ignores."""
    result_file = out / "result.json"
    if returncode != 0 or not result_file.is_file():
        raise RuntimeError(f"vllm bench serve failed ({returncode}):\n{output[-3000:]}")
    result = json.loads(result_file.read_text())
    shutil.rmtree(out, ignore_errors=True)
    if result["failed"] or result["completed"] != work.prompts:
        raise RuntimeError(f"vllm bench serve had failures: completed {result['completed']}, failed {result['failed']}")
    return dict(result)


def vllm_bench(
    url: str,
    work: Workload,
    *,
    model: str,
    tokenizer: Path,
    detailed: bool = False,
    cpu: int | None = None,
    chat: bool = False,
) -> dict[str, Any]:
    """One ``vllm bench serve`` run of the same workload; its ``--save-result`` file."""
    out = Path(tempfile.mkdtemp(prefix="vllm-bench-"))
    argv = _vllm_bench_argv(url, work, out, model=model, tokenizer=tokenizer, detailed=detailed, cpu=cpu, chat=chat)
    completed = subprocess.run(argv, capture_output=True, text=True, env=_vllm_bench_env(), timeout=900, check=False)
    return _vllm_bench_result(out, work, completed.returncode, completed.stdout)


def side_by_side(
    url: str, work: Workload, *, tokenizer: Path, cpu: int | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both clients against the server at the same time: ours starts when ``vllm bench serve`` starts warming up.

    Run one after the other, the two clients meet a server whose speed drifts between runs (on this machine by
    up to 1.6x from one 4-second run to the next, in its own histograms); run together, each measures its own
    requests in one and the same server state, so what is left between them is what the clients measure.
    """
    out = Path(tempfile.mkdtemp(prefix="vllm-bench-"))
    argv = _vllm_bench_argv(
        url, work, out, model="tiny-llama", tokenizer=tokenizer, detailed=False, cpu=cpu, chat=False
    )
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_vllm_bench_env())
    assert process.stdout is not None
    seen: list[str] = []
    try:
        for line in process.stdout:
            seen.append(line)
            if line.startswith(("Warming up", "Starting main benchmark run")):
                break
        else:
            raise RuntimeError("vllm bench serve ended before it sent a request:\n" + "".join(seen)[-3000:])
        mine = ours(url, work)[0]
        seen.append(process.stdout.read())
        returncode = process.wait(timeout=900)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return mine, _vllm_bench_result(out, work, returncode, "".join(seen))


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(float(run[key]) for run in runs)


def _quantile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[int(share * (len(ordered) - 1))]


_SERVER_SERIES = (
    "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count",
    "vllm:inter_token_latency_seconds_sum",
    "vllm:inter_token_latency_seconds_count",
    "vllm:prompt_tokens_total",
    "vllm:request_success_total",
)


def _server_counters(url: str) -> dict[str, float]:
    """The server's own histogram sums and counts (summed over label sets)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    totals = dict.fromkeys(_SERVER_SERIES, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in totals:
            totals[name] += float(line.rsplit(" ", 1)[1])
    return totals


def _server_view(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    delta = {name: after[name] - before[name] for name in _SERVER_SERIES}
    ttft = delta["vllm:time_to_first_token_seconds_sum"] / (delta["vllm:time_to_first_token_seconds_count"] or 1)
    itl = delta["vllm:inter_token_latency_seconds_sum"] / (delta["vllm:inter_token_latency_seconds_count"] or 1)
    prompt = delta["vllm:prompt_tokens_total"] / (delta["vllm:request_success_total"] or 1)
    return {"server_mean_ttft_ms": ttft * 1000, "server_mean_itl_ms": itl * 1000, "server_prompt_tokens": prompt}


def agreement(
    reps: int,
    url: str | None,
    prompts: int,
    *,
    pin: bool = True,
    input_len: int = 64,
    output_len: int = 32,
    together: bool = False,
    model: str = "tiny",
    rate: float | None = None,
) -> list[str]:
    model_dir = ensure_tiny_model(hidden=MODELS[model].get("hidden"), layers=MODELS[model].get("layers"))
    work = Workload(
        concurrency=4 if rate is None else 64,
        prompts=prompts,
        input_len=input_len,
        output_len=output_len,
        warmups=4,
        rate=rate,
    )
    original = os.sched_getaffinity(0)
    pinned = pin and url is None and len(original) >= 2
    if pinned:  # vLLM inherits CPU 0 from birth, so it sizes its OpenMP threads to one CPU
        os.sched_setaffinity(0, {0})
    try:
        context = max(512, input_len + output_len)  # the tiny model knows 2048 positions
        server = start_vllm_server(model_dir, max_model_len=context) if url is None else None
    finally:
        os.sched_setaffinity(0, original)
    base_url = server.base_url if server is not None else str(url)
    if pinned:
        os.sched_setaffinity(0, {1})
    try:
        mine, theirs = _agreement_runs(base_url, work, reps, model_dir, pinned=pinned, together=together)
    finally:
        os.sched_setaffinity(0, original)
        if server is not None:
            server.stop()
    lines = [
        _agreement_preamble(work, model, model_dir, reps, pinned=pinned, together=together),
        "",
        "| Figure | ours (median) | vllm bench serve (median) | ratio ours / vLLM | within 10 % |",
        "|---|---|---|---|---|",
        *_ratio_rows(mine, theirs),
        "",
        _server_note(mine, theirs, together=together),
        *_per_repetition(mine, theirs),
    ]
    return lines


def _agreement_runs(
    base_url: str, work: Workload, reps: int, model_dir: Path, *, pinned: bool, together: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Both clients' runs, each with the server's own view of it: at once, or alternating in swapped order."""
    mine: list[dict[str, Any]] = []
    theirs: list[dict[str, Any]] = []
    ours(base_url, replace(work, prompts=16, concurrency=4, rate=None))  # a fresh server's first requests are slow
    # Together, vLLM's client gets CPU 1 to itself; ours shares CPU 0 with the server, which does not move its
    # TTFT: ``loadgen.transport`` stamps each first token with the kernel's receive time.
    if pinned and together:
        os.sched_setaffinity(0, {0})
    for rep in range(reps):
        if together:
            before = _server_counters(base_url)
            pair = side_by_side(base_url, work, tokenizer=model_dir, cpu=1 if pinned else None)
            shared_view = _server_view(before, _server_counters(base_url))
            for run, runs in zip(pair, (mine, theirs), strict=True):
                runs.append({**run, **shared_view})
            continue
        for client in ("ours", "vllm") if rep % 2 == 0 else ("vllm", "ours"):
            before = _server_counters(base_url)
            if client == "ours":
                run = ours(base_url, work)[0]
            else:
                cpu = 1 if pinned else None
                run = vllm_bench(base_url, work, model="tiny-llama", tokenizer=model_dir, cpu=cpu)
            run.update(_server_view(before, _server_counters(base_url)))
            (mine if client == "ours" else theirs).append(run)
    return mine, theirs


def _agreement_preamble(work: Workload, model: str, model_dir: Path, reps: int, *, pinned: bool, together: bool) -> str:
    """What was run and how the CPUs were shared: the figures mean little without it."""
    return (
        f"Workload: {work.describe()}; model {model} ({model_dir.name}); {reps} repetitions, "
        + (
            "both clients at once (each runs this workload; ours starts as vLLM's starts warming up)"
            if together
            else "clients alternating with the order swapped each time"
        )
        + (
            (
                "; vLLM and ours pinned to CPU 0, vLLM's client alone on CPU 1"
                if together
                else "; vLLM pinned to CPU 0, both clients to CPU 1"
            )
            if pinned
            else ""
        )
        + f". Ratio = median over repetitions of ours / vLLM from {'the same' if together else 'adjacent'} runs."
    )


def _ratio_rows(mine: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> list[str]:
    """One table row per figure: both medians and the median of the per-repetition ratios."""
    rows = []
    for key in FIGURES:
        ratios = [float(m[key]) / float(t[key]) for m, t in zip(mine, theirs, strict=True) if float(t[key])]
        ratio = statistics.median(ratios) if ratios else float("nan")
        verdict = "yes" if abs(ratio - 1) <= 0.10 else "NO"
        rows.append(f"| {key} | {_median(mine, key):.2f} | {_median(theirs, key):.2f} | {ratio:.3f} | {verdict} |")
    return rows


def _per_repetition(mine: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> list[str]:
    """Throughput and mean TTFT of each repetition side by side, so a drifting run shows."""
    pairs = list(zip(mine, theirs, strict=True))
    return [
        "",
        "Request throughput per repetition (ours / vLLM): "
        + ", ".join(f"{m['request_throughput']:.1f}/{t['request_throughput']:.1f}" for m, t in pairs),
        "",
        "Mean TTFT (ms) per repetition (ours / vLLM): "
        + ", ".join(f"{m['mean_ttft_ms']:.1f}/{t['mean_ttft_ms']:.1f}" for m, t in pairs),
    ]


def _server_note(mine: list[dict[str, Any]], theirs: list[dict[str, Any]], *, together: bool) -> str:
    """The server's own latency histograms over the same runs: what each client adds on top of them."""
    server_ttft = (_median(mine, "server_mean_ttft_ms"), _median(theirs, "server_mean_ttft_ms"))
    server_itl = (_median(mine, "server_mean_itl_ms"), _median(theirs, "server_mean_itl_ms"))
    if together:
        return (
            f"The server's own histograms over the same runs, shared by both clients (warm-ups included): mean "
            f"TTFT {server_ttft[0]:.2f} ms, mean ITL {server_itl[0]:.2f} ms. Prompt tokens per request as the "
            f"server counted them: {_median(mine, 'server_prompt_tokens'):.1f}."
        )
    return (
        f"The server's own histograms over the same runs (server TTFT excludes HTTP and SSE): mean TTFT "
        f"{server_ttft[0]:.2f} ms in our runs, {server_ttft[1]:.2f} ms in vLLM's; mean ITL {server_itl[0]:.2f} / "
        f"{server_itl[1]:.2f} ms. Client mean TTFT minus the server's, per client (HTTP, SSE and client "
        f"overhead): ours {_median(mine, 'mean_ttft_ms') - server_ttft[0]:.2f} ms, vLLM's "
        f"{_median(theirs, 'mean_ttft_ms') - server_ttft[1]:.2f} ms. Prompt tokens per request as the server "
        f"counted them: {_median(mine, 'server_prompt_tokens'):.1f} in our runs, "
        f"{_median(theirs, 'server_prompt_tokens'):.1f} in vLLM's."
    )


def ttft_error(reps: int) -> list[str]:
    stub = spawn_stub(StubBehaviour(first_token_delay_s=DELAY_MS / 1000, inter_token_s=0.050, model="stub-model"))
    tokenizer = ensure_tiny_model()
    work = Workload(concurrency=64, prompts=640, input_len=16, output_len=4, warmups=8)
    lines = [
        f"Stub: first token {DELAY_MS:.0f} ms after the request reached its socket (kernel receive stamp), sent from "
        f"a timer thread, then a token every 50 ms; {work.describe()}. Error = measured TTFT - {DELAY_MS:.0f} ms. "
        "Our requests are matched to the stub's records (response id, one monotonic clock), which splits the error "
        "into the stub's own lateness and the client's part (request and first-token transit, stamping).",
        "",
        "| Rep | ours: error p50 / p90 (ms) | ours: client part p50 / p90 (ms) | stub lateness p50 (ms) "
        "| vllm bench serve: error p50 / p90 (ms) | stub lateness p50 in that run (ms) |",
        "|---|---|---|---|---|---|",
    ]
    try:
        for number in range(1, reps + 1):
            stub.reset()
            _point, records = ours(stub.base_url, work)
            detail = stub.stats(detail=True)
            errors, client = _ttft_errors(records, detail["requests"])
            stub.reset()
            theirs = vllm_bench(stub.base_url, work, model="stub-model", tokenizer=tokenizer, detailed=True)
            their_errors = [ttft * 1000 - DELAY_MS for ttft in theirs["ttfts"]]
            lines.append(
                f"| {number} | {statistics.median(errors):.3f} / {_quantile(errors, 0.9):.3f} | "
                f"{statistics.median(client):.3f} / {_quantile(client, 0.9):.3f} | "
                f"{detail['first_token_lateness_ms_p50']} | "
                f"{statistics.median(their_errors):.3f} / {_quantile(their_errors, 0.9):.3f} | "
                f"{stub.stats()['first_token_lateness_ms_p50']} |"
            )
    finally:
        stub.stop()
    return lines


def _ttft_errors(records: list[RequestRecord], stub_times: dict[str, list[float]]) -> tuple[list[float], list[float]]:
    """Each successful request's TTFT error (ms), and the client's part of it where the stub's record matches."""
    errors: list[float] = []
    client: list[float] = []
    for record in records:
        if not record.success:
            continue
        errors.append(record.ttft * 1000 - DELAY_MS)
        times = stub_times.get(record.response_id)
        if times is not None:
            received, sent = times
            client.append((record.ttft - (sent - received)) * 1000)
    return errors, client


def headroom(reps: int) -> list[str]:
    stub = spawn_stub(StubBehaviour(model="stub-model"))
    tokenizer = ensure_tiny_model()
    work = Workload(concurrency=64, prompts=3000, input_len=16, output_len=8, warmups=8)
    found: dict[str, list[float]] = {
        "ours (StreamingTransport)": [],
        "vllm bench serve 0.32.0 (aiohttp)": [],
        "ours on httpx's default transport": [],
    }
    try:
        for _ in range(reps):
            found["ours (StreamingTransport)"].append(ours(stub.base_url, work)[0]["request_throughput"])
            theirs = vllm_bench(stub.base_url, work, model="stub-model", tokenizer=tokenizer)
            found["vllm bench serve 0.32.0 (aiohttp)"].append(theirs["request_throughput"])
            default, _ = ours(stub.base_url, replace(work, prompts=600), transport=httpx.AsyncHTTPTransport())
            found["ours on httpx's default transport"].append(default["request_throughput"])
    finally:
        stub.stop()
    lines = [
        f"Stub answering at once; {work.describe()} (600 prompts on httpx's default transport); {reps} alternating "
        "repetitions; the stub and the client share the 2 cores.",
        "",
        "| Client | req/s per repetition | median |",
        "|---|---|---|",
    ]
    for name, rates in found.items():
        lines.append(f"| {name} | {', '.join(f'{rate:.0f}' for rate in rates)} | {statistics.median(rates):.0f} |")
    return lines


def chat_definition() -> list[str]:
    """Where each client takes a chat TTFT: the stub sends vLLM's role chunk at once and the first token at 50 ms."""
    stub = spawn_stub(StubBehaviour(first_token_delay_s=DELAY_MS / 1000, inter_token_s=0.005, model="stub-model"))
    work = Workload(concurrency=4, prompts=32, input_len=16, output_len=8, warmups=2)
    try:
        request = BenchmarkRequest(
            endpoint="chat", concurrency=(4,), num_prompts=32, input_len=16, output_len=8, warmup_requests=2
        )
        mine = asyncio.run(LoadGenerator(Target(stub.base_url, endpoint="chat")).run(request)).as_dict()["points"][0]
        theirs = vllm_bench(stub.base_url, work, model="stub-model", tokenizer=ensure_tiny_model(), chat=True)
    finally:
        stub.stop()
    return [
        f"Stub, chat: role chunk at once, first token {DELAY_MS:.0f} ms after the request, then every 5 ms; "
        f"{work.prompts} requests at concurrency {work.concurrency}, 8 tokens.",
        "",
        "| Client | mean TTFT (ms) | mean ITL (ms) | median ITL (ms) |",
        "|---|---|---|---|",
        f"| ours | {mine['mean_ttft_ms']:.2f} | {mine['mean_itl_ms']:.2f} | {mine['median_itl_ms']:.2f} |",
        f"| vllm bench serve (openai-chat) | {theirs['mean_ttft_ms']:.2f} | {theirs['mean_itl_ms']:.2f} | "
        f"{theirs['median_itl_ms']:.2f} |",
    ]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=48, help="prompts per run on the real server")
    parser.add_argument("--vllm-url", help="a running vLLM serving tiny-llama (default: start one)")
    parser.add_argument("--no-pin", action="store_true", help="let server and clients share every CPU")
    parser.add_argument("--input-len", type=int, default=64, help="agreement: prompt tokens (input + output <= 2048)")
    parser.add_argument("--output-len", type=int, default=32, help="agreement: output tokens per request")
    parser.add_argument(
        "--rate", type=float, help="agreement: requests arrive at this constant rate (req/s) instead of concurrency 4"
    )
    parser.add_argument("--model", choices=sorted(MODELS), default="tiny", help="agreement: the served model")
    parser.add_argument(
        "--together", action="store_true", help="agreement: run both clients at once instead of one after the other"
    )
    parser.add_argument(
        "--only",
        choices=["agreement", "ttft", "headroom", "chat"],
        action="append",
        help="run only these sections (repeatable; default: all)",
    )
    return parser


def main() -> int:
    parser = _parser()
    args = parser.parse_args()
    wanted = set(args.only or ["agreement", "ttft", "headroom", "chat"])
    started = time.monotonic()
    sections: list[str] = []
    if "agreement" in wanted:
        sections += ["### Agreement with vllm bench serve on the real server", ""]
        agreed = agreement(
            args.reps,
            args.vllm_url,
            args.prompts,
            pin=not args.no_pin,
            input_len=args.input_len,
            output_len=args.output_len,
            together=args.together,
            model=args.model,
            rate=args.rate,
        )
        sections += [*agreed, ""]
    if "ttft" in wanted:
        sections += ["### TTFT error at concurrency 64", "", *ttft_error(args.reps), ""]
    if "headroom" in wanted:
        sections += ["### Highest request rate each client drives", "", *headroom(args.reps), ""]
    if "chat" in wanted:
        sections += ["### Where a chat TTFT is taken", "", *chat_definition(), ""]
    load = os.getloadavg()
    sections.append(f"(took {time.monotonic() - started:.0f} s; load average at the end {load[0]:.1f} / {load[1]:.1f})")
    print("\n".join(sections))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

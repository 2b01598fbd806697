"""The agreement benchmark gives both clients the same workload: same lengths, counts, warm-ups and arrivals."""

from __future__ import annotations

from pathlib import Path

from benchmarks.loadgen_vs_vllm_bench import Workload, _vllm_bench_argv, our_request


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def _vllm(work: Workload) -> list[str]:
    return _vllm_bench_argv(
        "http://127.0.0.1:1",
        work,
        Path("/tmp/out"),
        model="m",
        tokenizer=Path("/tmp/tok"),
        detailed=False,
        cpu=None,
        chat=False,
    )


def test_a_constant_rate_workload_is_the_same_for_both_clients() -> None:
    work = Workload(concurrency=64, prompts=64, input_len=512, output_len=32, warmups=4, rate=0.6)

    request = our_request(work)
    argv = _vllm(work)

    assert (request.mode, request.request_rate, request.arrival, request.max_concurrency) == (
        "rate",
        (0.6,),
        "constant",
        64,
    )
    assert (_flag(argv, "--request-rate"), _flag(argv, "--max-concurrency")) == ("0.6", "64")
    assert float(_flag(argv, "--burstiness")) >= 1000  # gamma gaps with a CV of 1/sqrt(burstiness): constant
    assert (request.num_prompts, request.input_len, request.output_len, request.warmup_requests) == (64, 512, 32, 4)
    assert (_flag(argv, "--num-prompts"), _flag(argv, "--random-input-len")) == ("64", "512")
    assert (_flag(argv, "--random-output-len"), _flag(argv, "--num-warmups")) == ("32", "4")


def test_a_fixed_concurrency_workload_sends_as_fast_as_the_cap_allows_in_both() -> None:
    work = Workload(concurrency=4, prompts=16, input_len=64, output_len=8, warmups=2)

    request = our_request(work)
    argv = _vllm(work)

    assert (request.mode, request.concurrency) == ("concurrency", (4,))
    assert (_flag(argv, "--request-rate"), _flag(argv, "--max-concurrency")) == ("inf", "4")
    assert "--burstiness" not in argv
    assert "arriving at a constant" not in work.describe() and "at concurrency 4" in work.describe()

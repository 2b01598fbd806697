"""The benchmark's pure parts: vLLM's metric definitions, SSE parsing, the knee, datasets, plots, journal, system."""

from __future__ import annotations

import asyncio
import json
import math
import struct
import zlib
from pathlib import Path
from xml.etree import ElementTree

import pytest
from pydantic import ValidationError

from loadgen.datasets import Prompt, random_prompts, read_prompt_file
from loadgen.plots import charts_for, render_png, render_svg, write_plots
from loadgen.report import result_table
from loadgen.sse import SseSplitter, read_chunk
from loadgen.stats import (
    RequestRecord,
    SweepPoint,
    find_knee,
    percentile,
    percentile_key,
    population_std,
    summarize,
)
from node_agent.agent import shrink_result
from node_agent.journal import AgentLock, RunJournal
from node_agent.system_info import system_info
from shared.messages import BenchmarkRequest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"


def _record(
    index: int,
    *,
    start: float = 0.0,
    ttft: float = 0.1,
    itl: tuple[float, ...] = (),
    output_tokens: int | None = None,
    prompt_tokens: int = 10,
    arrival: float | None = None,
    error: str = "",
) -> RequestRecord:
    record = RequestRecord(index=index, arrival=start if arrival is None else arrival, start=start)
    record.prompt_tokens = prompt_tokens
    if error:
        record.error = error
        return record
    record.success = True
    record.ttft = ttft
    record.itl = list(itl)
    record.latency = ttft + sum(itl)
    record.token_chunks = 1 + len(itl)
    record.output_tokens = output_tokens
    return record


class TestPercentiles:
    @pytest.mark.parametrize(
        ("values", "p", "expected"),
        [
            ([1.0, 2.0, 3.0, 4.0], 50, 2.5),
            ([1.0, 2.0, 3.0, 4.0], 90, 3.7),
            ([1.0, 2.0, 3.0, 4.0], 99, 3.97),
            ([4.0, 1.0, 3.0, 2.0], 0, 1.0),
            ([4.0, 1.0, 3.0, 2.0], 100, 4.0),
            ([7.0], 99, 7.0),
            ([], 50, 0.0),
        ],
    )
    def test_percentiles_interpolate_linearly_as_numpy_does(
        self, values: list[float], p: float, expected: float
    ) -> None:
        assert percentile(values, p) == pytest.approx(expected)

    def test_std_is_the_population_deviation(self) -> None:
        assert population_std([2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]) == pytest.approx(2.0)
        assert population_std([]) == 0.0

    def test_keys_are_spelled_as_vllm_spells_them(self) -> None:
        assert percentile_key(99) == "p99"
        assert percentile_key(99.9) == "p99.9"

    def test_a_percentile_outside_0_100_is_refused(self) -> None:
        with pytest.raises(ValueError, match="percentile"):
            percentile([1.0], 101)


class TestSummarize:
    def test_ttft_itl_e2el_and_tpot_follow_vllm_definitions(self) -> None:
        records = [
            _record(0, start=0.0, ttft=0.100, itl=(0.010, 0.030), output_tokens=3),
            _record(1, start=0.5, ttft=0.200, itl=(0.020,), output_tokens=5),  # usage says 5 tokens in 2 chunks
        ]
        summary = summarize(records, duration_s=2.0, percentiles=(50, 99))
        assert summary["mean_ttft_ms"] == pytest.approx(150.0)
        assert summary["median_ttft_ms"] == pytest.approx(150.0)
        assert summary["mean_itl_ms"] == pytest.approx(20.0)  # pooled gaps: 10, 30, 20
        assert summary["mean_e2el_ms"] == pytest.approx((140.0 + 220.0) / 2)
        # TPOT per request: (E2EL - TTFT) / (tokens - 1), tokens from usage, then averaged
        assert summary["mean_tpot_ms"] == pytest.approx((40.0 / 2 + 20.0 / 4) / 2)
        assert summary["total_output_tokens"] == 8
        assert summary["request_throughput"] == pytest.approx(1.0)
        assert summary["output_throughput"] == pytest.approx(4.0)
        assert summary["total_token_throughput"] == pytest.approx((20 + 8) / 2.0)
        assert summary["p99_ttft_ms"] == pytest.approx(199.0)

    def test_without_usage_the_token_chunks_are_the_output(self) -> None:
        summary = summarize([_record(0, itl=(0.01, 0.01, 0.01))], duration_s=1.0)
        assert summary["total_output_tokens"] == 4

    def test_one_token_outputs_leave_tpot_out_but_count_as_zero_for_goodput(self) -> None:
        records = [
            _record(0, ttft=0.050, output_tokens=1),
            _record(1, ttft=0.050, itl=(0.100,), output_tokens=2),  # TPOT 100 ms: misses a 50 ms SLO
        ]
        summary = summarize(records, duration_s=1.0, slo_ms={"ttft": 50, "tpot": 50})
        assert summary["mean_tpot_ms"] == pytest.approx(100.0)
        assert summary["request_goodput"] == pytest.approx(1.0)  # SLOs are inclusive; the 1-token one is good

    def test_goodput_is_none_without_slos(self) -> None:
        assert summarize([_record(0)], duration_s=1.0)["request_goodput"] is None

    def test_failures_are_counted_by_cause_and_left_out_of_latencies(self) -> None:
        records = [
            _record(0, ttft=0.1),
            _record(1, error="http_500"),
            _record(2, error="http_500"),
            _record(3, error="timeout"),
        ]
        summary = summarize(records, duration_s=1.0)
        assert summary["completed"] == 1
        assert summary["failed"] == 3
        assert summary["failures"] == {"http_500": 2, "timeout": 1}
        assert summary["mean_ttft_ms"] == pytest.approx(100.0)
        assert summary["total_input_tokens"] == 10  # only completed requests count

    def test_client_queue_time_is_the_wait_between_arrival_and_sending(self) -> None:
        records = [_record(0, start=0.0, arrival=0.0), _record(1, start=0.3, arrival=0.1)]
        summary = summarize(records, duration_s=1.0)
        assert summary["mean_client_queue_time_ms"] == pytest.approx(100.0)
        assert summary["mean_e2el_including_client_queue_ms"] == pytest.approx(200.0)

    def test_peaks_come_from_one_second_buckets(self) -> None:
        records = [
            _record(0, start=0.0, ttft=0.1, itl=(0.1, 0.1)),  # three tokens in second 0
            _record(1, start=0.2, ttft=1.0, itl=(0.1,)),  # tokens at 1.2 and 1.3
        ]
        summary = summarize(records, duration_s=2.0)
        assert summary["max_output_tokens_per_s"] == 3.0
        assert summary["max_concurrent_requests"] == 2

    def test_arrival_and_completion_rates_are_taken_over_their_own_windows(self) -> None:
        records = [_record(i, start=i * 0.1, ttft=0.05, itl=(0.05,)) for i in range(11)]
        summary = summarize(records, duration_s=1.1)
        assert summary["arrival_rate"] == pytest.approx(10.0)
        assert summary["completion_rate"] == pytest.approx(10.0)
        assert summarize(records[:1], duration_s=1.0)["arrival_rate"] is None

    def test_an_empty_set_gives_zeros_as_vllm_does(self) -> None:
        summary = summarize([_record(0, error="connect_error")], duration_s=1.0)
        assert summary["mean_ttft_ms"] == 0.0
        assert summary["max_output_tokens_per_s"] == 0.0

    def test_bad_arguments_name_the_field(self) -> None:
        with pytest.raises(ValueError, match="duration_s"):
            summarize([], duration_s=0)
        with pytest.raises(ValueError, match="slo_ms"):
            summarize([], duration_s=1, slo_ms={"latency": 1})

    def test_every_metric_of_vllms_result_file_is_present(self) -> None:
        sample = json.loads((FIXTURES / "vllm_bench_result_sample.json").read_text())
        settings_and_lists = {
            "date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts", "tpu", "tp",
            "request_rate", "burstiness", "max_concurrency", "latencies", "queue_times", "rtfx",
        }  # fmt: skip
        summary = summarize([_record(0)], duration_s=1.0, percentiles=(50, 90, 99), slo_ms={"ttft": 1000})
        missing = set(sample) - settings_and_lists - set(summary)
        assert missing == set()


def _stream_payloads(section: str) -> list[bytes]:
    text = (FIXTURES / "real_vllm_stream.txt").read_text(encoding="utf-8")
    body = text.split("### ")[1 if section == "chat" else 2].split("\n", 1)[1]
    splitter = SseSplitter()
    payloads: list[bytes] = []
    raw = body.encode()
    for start in range(0, len(raw), 7):  # arbitrary read boundaries
        payloads += splitter.feed(raw[start : start + 7])
    return payloads + splitter.close()


class TestStreamParsing:
    def test_a_real_chat_stream_has_no_token_in_the_role_chunk(self) -> None:
        payloads = _stream_payloads("chat")
        assert payloads[-1] == b"[DONE]"
        chunks = [read_chunk(payload) for payload in payloads[:-1]]
        assert chunks[0].token is False  # "delta": {"role": "assistant", "content": ""}
        assert [chunk.token for chunk in chunks[1:-1]] == [True] * 8
        assert chunks[-1].completion_tokens == 8
        assert chunks[-1].prompt_tokens == 9
        assert chunks[-2].finish_reason == "length"

    def test_a_real_completions_stream_counts_text_chunks(self) -> None:
        chunks = [read_chunk(payload) for payload in _stream_payloads("completions")[:-1]]
        assert sum(chunk.token for chunk in chunks) == 8
        assert chunks[-1].token is False
        assert chunks[-1].completion_tokens == 8

    def test_crlf_framing_and_comments_are_handled(self) -> None:
        splitter = SseSplitter()
        assert splitter.feed(b': ping\r\n\r\ndata: {"choices":[{"text":"x"}]}\r\n\r\ndata: [DO') == [
            b'{"choices":[{"text":"x"}]}'
        ]
        assert splitter.feed(b"NE]\n\n") == [b"[DONE]"]

    def test_reasoning_and_tool_calls_count_as_tokens_and_errors_are_reported(self) -> None:
        assert read_chunk(b'{"choices":[{"delta":{"reasoning":"hm"}}]}').token
        assert read_chunk(b'{"choices":[{"delta":{"tool_calls":[{"id":"1"}]}}]}').token
        assert not read_chunk(b'{"choices":[{"delta":{"content":""},"finish_reason":"stop"}]}').token
        assert read_chunk(b'{"error":{"message":"engine died"}}').error == "engine died"

    def test_a_chunk_that_is_not_an_object_is_refused(self) -> None:
        with pytest.raises(ValueError):
            read_chunk(b"[1, 2]")


class TestKnee:
    def test_a_concurrency_plateau_is_saturation(self) -> None:
        points = [
            SweepPoint(1, 10.0, 100.0),
            SweepPoint(4, 36.0, 110.0),
            SweepPoint(16, 60.0, 260.0),
            SweepPoint(64, 62.0, 1000.0),
        ]
        knee = find_knee(points, "concurrency")
        assert knee.level == 4
        assert knee.saturated is True

    def test_throughput_still_rising_at_the_top_is_not_saturation(self) -> None:
        points = [SweepPoint(1, 10.0, 100.0), SweepPoint(4, 39.0, 102.0), SweepPoint(16, 150.0, 105.0)]
        knee = find_knee(points, "concurrency")
        assert knee.level == 16
        assert knee.saturated is False

    def test_a_rate_sweep_saturates_where_completions_fall_behind_the_offer(self) -> None:
        points = [SweepPoint(1, 1.0, 50.0), SweepPoint(2, 1.98, 60.0), SweepPoint(4, 2.4, 900.0)]
        knee = find_knee(points, "rate")
        assert (knee.level, knee.saturated) == (2, True)

    def test_a_short_rate_run_that_kept_pace_is_not_called_short_for_its_tail(self) -> None:
        # 20 requests at 50 req/s, each taking 160 ms: throughput over the whole run is only 36 req/s
        kept = SweepPoint(50, 36.0, 160.0, completed=20, arrival_rate=50.0, completion_rate=49.5)
        behind = SweepPoint(200, 40.0, 900.0, completed=20, arrival_rate=200.0, completion_rate=41.0)
        knee = find_knee([kept, behind], "rate")
        assert (knee.level, knee.saturated) == (50, True)
        assert "200 req/s offered, 41 req/s completed" in knee.reason

    def test_levels_where_everything_failed_cannot_be_the_knee(self) -> None:
        assert find_knee([SweepPoint(1, 0.0, 0.0, completed=0, failed=5)], "concurrency").level is None


class _SyllableTokenizer:
    """Deterministic tokens: a word of n letters is ceil(n / 3) tokens, except 'i', which is two."""

    source = "test syllables"

    def __init__(self) -> None:
        self.calls = 0

    async def count(self, text: str) -> int:
        self.calls += 1
        return sum(2 if word == "i" else math.ceil(len(word) / 3) for word in text.split())


class TestDatasets:
    def test_random_prompts_hit_the_exact_length_with_a_multi_token_tokenizer(self) -> None:
        tokenizer = _SyllableTokenizer()
        prompts = asyncio.run(random_prompts(tokenizer, count=20, input_len=57, output_len=9, seed=3))
        assert prompts.exact is True
        assert {p.prompt_tokens for p in prompts.prompts} == {57}
        assert len({p.text for p in prompts.prompts}) == 20  # distinct: no prefix-cache gift
        assert all(p.output_tokens == 9 for p in prompts.prompts)
        again = asyncio.run(random_prompts(_SyllableTokenizer(), count=20, input_len=57, output_len=9, seed=3))
        assert [p.text for p in again.prompts] == [p.text for p in prompts.prompts]  # seeded

    def test_without_one_token_words_the_search_gets_as_close_as_the_tokenizer_allows(self) -> None:
        class EvenTokenizer:
            """Every word is as many tokens as letters, single letters two: only even totals exist."""

            source = "test even"

            async def count(self, text: str) -> int:
                return sum(max(2, len(word)) for word in text.split())

        reachable = asyncio.run(random_prompts(EvenTokenizer(), count=6, input_len=40, output_len=4, seed=1))
        assert {p.prompt_tokens for p in reachable.prompts} == {40}
        unreachable = asyncio.run(random_prompts(EvenTokenizer(), count=6, input_len=41, output_len=4, seed=1))
        assert unreachable.exact is False
        assert all(abs(p.prompt_tokens - 41) == 1 for p in unreachable.prompts)

    def test_a_prompt_file_reads_text_lines_and_json_lines(self, tmp_path: Path) -> None:
        (tmp_path / "p.txt").write_text("first prompt\n\nsecond one\n")
        assert read_prompt_file(tmp_path / "p.txt") == [("first prompt", None), ("second one", None)]
        (tmp_path / "p.jsonl").write_text('{"prompt": "a b", "output_tokens": 7}\n{"prompt": "c"}\n')
        assert read_prompt_file(tmp_path / "p.jsonl") == [("a b", 7), ("c", None)]

    def test_a_bad_prompt_file_names_the_line_and_the_fix(self, tmp_path: Path) -> None:
        (tmp_path / "bad.jsonl").write_text('{"text": "no prompt key"}\n')
        with pytest.raises(Exception, match=r"line 1.*'prompt'"):
            read_prompt_file(tmp_path / "bad.jsonl")

    def test_prompt_describes_its_lengths(self) -> None:
        assert Prompt("a b", 2, 5).prompt_tokens == 2


class TestBenchmarkRequestBounds:
    def test_the_prompts_dataset_needs_prompts(self) -> None:
        with pytest.raises(ValidationError, match="prompts"):
            BenchmarkRequest(dataset="prompts")

    def test_a_sweep_too_large_is_refused(self) -> None:
        with pytest.raises(ValidationError, match="num_prompts"):
            BenchmarkRequest(concurrency=(1, 2, 4, 8, 16, 32), num_prompts=10000)

    def test_a_slow_rate_needs_a_duration_bound(self) -> None:
        with pytest.raises(ValidationError, match="duration_s"):
            BenchmarkRequest(mode="rate", request_rate=(0.1,), num_prompts=1000)
        assert BenchmarkRequest(mode="rate", request_rate=(0.1,), num_prompts=1000, duration_s=60).duration_s == 60


def _result() -> dict[str, object]:
    points = []
    for level in (1, 4, 16):
        point: dict[str, object] = {"mode": "concurrency", "level": level, "output_throughput": 10.0 * level}
        point["total_token_throughput"] = 30.0 * level
        for name in ("ttft", "itl"):
            for rank, p in enumerate(("p50", "p90", "p99")):
                point[f"{p}_{name}_ms"] = 5.0 * level + rank
        points.append(point)
    return {"model": "tiny-llama", "points": points, "knee": {"level": 4, "reason": "test"}}


class TestPlots:
    def test_the_png_is_a_valid_image_of_the_chart_size(self) -> None:
        data = render_png(charts_for(_result())["throughput"])
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", data[16:24])
        idat_length = struct.unpack(">I", data[33:37])[0]
        pixels = zlib.decompress(data[41 : 41 + idat_length])
        assert len(pixels) == height * (1 + 3 * width)
        assert pixels.count(b"\x1f\x6f\xb5") > 50  # the first series' colour was drawn

    def test_the_svg_has_a_line_per_series_and_the_knee(self) -> None:
        svg = ElementTree.fromstring(render_svg(charts_for(_result())["ttft"]))  # noqa: S314 (our own output)
        namespace = "{http://www.w3.org/2000/svg}"
        assert len(svg.findall(f"{namespace}polyline")) == 1 + 3  # axes + p50, p90, p99
        assert any(text.text == "knee" for text in svg.findall(f"{namespace}text"))

    def test_write_plots_writes_three_charts_in_both_formats(self, tmp_path: Path) -> None:
        written = write_plots(_result(), tmp_path, stem="run")
        assert sorted(path.name for path in written) == sorted(
            f"run-{name}.{ext}" for name in ("throughput", "ttft", "itl") for ext in ("svg", "png")
        )

    def test_the_table_has_a_row_per_level_and_the_knee(self) -> None:
        table = result_table({**_result(), "failures": {"http_500": 2}})
        assert len([line for line in table.splitlines() if line.strip().startswith(("1 ", "4 ", "16 "))]) == 3
        assert "Knee: 4" in table
        assert "http_500 x2" in table


class TestNodeSide:
    def test_a_result_too_big_for_one_message_is_shrunk_and_says_so(self) -> None:
        point = {f"std_x{i}": 1.0 for i in range(40)} | {f"p{i}_ttft_ms": 1.0 for i in range(40)} | {"level": 1}
        result = {"points": [dict(point, level=i) for i in range(200)]}
        small = shrink_result(result, budget=20000)
        assert len(json.dumps(small)) <= 20000
        assert "truncated" in small
        assert all(not key.startswith("std_") for p in small["points"] for key in p)

    def test_the_journal_survives_a_reopen_and_dedupes_run_ids(self, tmp_path: Path) -> None:
        journal = RunJournal(tmp_path)
        assert journal.accept("run-1", "{}", "2026-12-02T12:00:00+00:00") is True
        assert journal.accept("run-1", "{}", "2026-12-02T12:00:01+00:00") is False
        journal.mark_running("run-1", "2026-12-02T12:00:02+00:00", pid=4242)
        reopened = RunJournal(tmp_path)
        assert [entry.run_id for entry in reopened.interrupted()] == ["run-1"]
        reopened.finish("run-1", "failed", "2026-12-02T12:00:03+00:00", error="agent restarted")
        assert [entry.run_id for entry in RunJournal(tmp_path).unpublished()] == ["run-1"]

    def test_only_one_agent_may_hold_a_node(self, tmp_path: Path) -> None:
        first, second = AgentLock(tmp_path), AgentLock(tmp_path)
        first.acquire()
        try:
            with pytest.raises(RuntimeError, match="another node agent"):
                second.acquire()
        finally:
            first.release()
        second.acquire()
        second.release()

    def test_system_info_reads_proc_files_and_the_tpu_environment(self, tmp_path: Path) -> None:
        (tmp_path / "etc").mkdir()
        (tmp_path / "etc/os-release").write_text('NAME="Ubuntu"\nPRETTY_NAME="Ubuntu 22.04.4 LTS"\n')
        (tmp_path / "proc/sys/kernel/random").mkdir(parents=True)
        (tmp_path / "proc/cpuinfo").write_text("processor : 0\nmodel name : AMD EPYC 9B14\n")
        (tmp_path / "proc/meminfo").write_text("MemTotal:       185000000 kB\nMemAvailable:   120000000 kB\n")
        (tmp_path / "proc/sys/kernel/osrelease").write_text("6.5.0-1013-gcp\n")
        (tmp_path / "proc/sys/kernel/random/boot_id").write_text("0b5d1c3e-8a49-4c57-9a8e-3f8c1b2a9d10\n")
        (tmp_path / "dev/vfio").mkdir(parents=True)
        for name in ("0", "1", "2", "3", "vfio"):
            (tmp_path / "dev/vfio" / name).write_text("")
        info = system_info(root=tmp_path, environ={"TPU_ACCELERATOR_TYPE": "v6e-4"}, disk_paths=(tmp_path,))
        assert info["os"] == "Ubuntu 22.04.4 LTS"
        assert info["kernel"] == "6.5.0-1013-gcp"
        assert info["cpu_model"] == "AMD EPYC 9B14"
        assert info["memory_gib"] == pytest.approx(176.43, abs=0.01)
        assert info["memory_free_gib"] == pytest.approx(114.44, abs=0.01)
        assert info["memory_used_gib"] == pytest.approx(176.43 - 114.44, abs=0.02)
        assert info["boot_id"] == "0b5d1c3e-8a49-4c57-9a8e-3f8c1b2a9d10"
        assert info["accelerator"]["chips_visible"] == 4
        assert info["accelerator"]["hbm_gib_per_chip"] == 32
        assert info["accelerator"]["topology"] == "2x2"
        assert info["disks"][0]["total_gib"] > 0

    def test_a_kernel_without_memavailable_reports_total_memory_only(self, tmp_path: Path) -> None:
        (tmp_path / "proc").mkdir()
        (tmp_path / "proc/meminfo").write_text("MemTotal:       185000000 kB\nMemFree:   1000 kB\n")
        info = system_info(root=tmp_path, environ={}, disk_paths=())
        assert info["memory_gib"] == pytest.approx(176.43, abs=0.01)
        assert info["memory_used_gib"] is None and info["memory_free_gib"] is None

    def test_a_machine_without_a_tpu_reports_no_accelerator(self, tmp_path: Path) -> None:
        assert system_info(root=tmp_path, environ={}, disk_paths=())["accelerator"] is None

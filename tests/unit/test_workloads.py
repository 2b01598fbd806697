"""The load generator's workloads (issue 22 item 1): builders, trace parsing, the prefix-cache figures.

The end-to-end cases run the real generator against ``FakePrefixVllm``, an in-process server whose prefix cache
keeps state the way vLLM v1's does; the same agreement on the real vLLM on CPU is
``tests/integration/test_workloads_real_vllm.py``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from loadgen.__main__ import main as loadgen_main
from loadgen.datasets import WhitespaceTokenCounter
from loadgen.generator import BenchmarkSetupError, LoadGenerator, Target
from loadgen.server_cache import CacheCounters, level_cache_figures
from loadgen.stats import RequestRecord
from loadgen.workloads import (
    TraceError,
    arrival_offsets,
    build_workload,
    expected_cached_tokens,
    parse_trace,
    read_trace_file,
    session_turns,
    trace_offsets,
)
from shared.messages import BenchmarkRequest
from tests.support.fake_prefix_vllm import FakePrefixVllm

# --- trace files ------------------------------------------------------------------------------------------------


def test_a_trace_is_read_in_order_skipping_blank_lines_and_ignoring_other_fields(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(
        '{"timestamp": 10.5, "input_len": 32, "output_len": 8, "hash_ids": [1, 2]}\n'
        "\n"
        '{"timestamp": 11, "input_len": 64.0, "output_len": 4}\n',
        encoding="utf-8",
    )
    trace = read_trace_file(path)
    assert [(e.timestamp, e.input_len, e.output_len) for e in trace] == [(10.5, 32, 8), (11.0, 64, 4)]
    assert trace_offsets(trace) == [0.0, 0.5]


@pytest.mark.parametrize(
    ("line", "names"),
    [
        ("not json", ("line 2", "is not JSON")),
        ("[1, 2, 3]", ("line 2", "not a JSON object")),
        ('{"timestamp": 1, "input_len": 8}', ("line 2", "'output_len'")),
        ('{"timestamp": 1, "input_len": "8", "output_len": 4}', ("line 2", "'input_len'", "whole number")),
        ('{"timestamp": 1, "input_len": 8.5, "output_len": 4}', ("line 2", "'input_len'", "whole number")),
        ('{"timestamp": 1, "input_len": true, "output_len": 4}', ("line 2", "'input_len'")),
        ('{"timestamp": "1s", "input_len": 8, "output_len": 4}', ("line 2", "'timestamp'", "seconds")),
        ('{"timestamp": 1, "input_len": 0, "output_len": 4}', ("line 2", "'input_len'", "out of range")),
        ('{"timestamp": -1, "input_len": 8, "output_len": 4}', ("line 2", "'timestamp'", "out of range")),
        ('{"timestamp": 0.5, "input_len": 8, "output_len": 4}', ("line 2", "'timestamp'", "earlier", "sort")),
    ],
)
def test_a_bad_trace_line_is_refused_naming_its_line_and_field(line: str, names: tuple[str, ...]) -> None:
    first = '{"timestamp": 1, "input_len": 8, "output_len": 4}'
    with pytest.raises(TraceError) as caught:
        parse_trace([first, line], "t.jsonl")
    message = str(caught.value)
    assert message.startswith("trace_file: ")
    for name in names:
        assert name in message


def test_an_empty_or_missing_trace_file_is_refused_by_name(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(TraceError, match="holds no requests"):
        read_trace_file(empty)
    with pytest.raises(TraceError, match="cannot read"):
        read_trace_file(tmp_path / "absent.jsonl")


def test_the_cli_refuses_a_bad_trace_before_sending_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_len": 8}\n', encoding="utf-8")
    assert loadgen_main(["--url", "http://127.0.0.1:9", "--trace-file", str(path)]) == 2
    assert "line 1" in capsys.readouterr().err


# --- the request's workload settings ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "field_named"),
    [
        ({"workload": "shared_prefix", "input_len": 64, "prefix_len": 64}, "prefix_len"),
        ({"workload": "shared_prefix", "input_len": 64}, "prefix_len"),
        ({"workload": "random", "prefix_len": 8}, "prefix_len"),
        ({"workload": "trace"}, "trace"),
        ({"trace": [{"timestamp": 0, "input_len": 4, "output_len": 4}]}, "trace"),
        (
            {"workload": "trace", "mode": "rate", "trace": [{"timestamp": 0, "input_len": 4, "output_len": 4}]},
            "request_rate",
        ),
        (
            {
                "workload": "trace",
                "trace": [
                    {"timestamp": 0, "input_len": 4, "output_len": 4},
                    {"timestamp": 4000, "input_len": 4, "output_len": 4},
                ],
            },
            "trace",
        ),
        ({"workload": "multi_turn", "dataset": "prompts", "prompts": ["hi"]}, "dataset"),
    ],
)
def test_a_workload_without_its_settings_is_refused_naming_the_field(fields: dict[str, Any], field_named: str) -> None:
    with pytest.raises(ValidationError) as caught:
        BenchmarkRequest.model_validate(fields)
    assert f"{field_named}:" in str(caught.value)


def test_a_multi_turn_session_needs_room_for_its_whole_history() -> None:
    request = BenchmarkRequest(workload="multi_turn", turns=3, input_len=20, output_len=10)
    assert request.needed_tokens() == 90
    trace = BenchmarkRequest(
        workload="trace",
        trace=[
            {"timestamp": 0, "input_len": 100, "output_len": 5},
            {"timestamp": 1, "input_len": 10, "output_len": 50},
        ],
    )
    assert trace.needed_tokens() == 105


def test_a_session_that_cannot_fit_the_context_is_refused_before_any_load() -> None:
    server = FakePrefixVllm(max_model_len=63)
    request = BenchmarkRequest(workload="multi_turn", turns=4, input_len=8, output_len=8, concurrency=(1,))
    with pytest.raises(BenchmarkSetupError, match=r"benchmark\.turns: .* = 64 tokens.*max_model_len 63"):
        asyncio.run(LoadGenerator(Target("http://fake"), transport=server).run(request))
    assert server.prompts == []


# --- arrivals and the cache arithmetic -------------------------------------------------------------------------


def test_arrivals_are_evenly_spaced_or_seeded_poisson_starting_at_once() -> None:
    assert arrival_offsets(4, 2.0, "constant", seed=1) == [0.0, 0.5, 1.0, 1.5]
    poisson = arrival_offsets(200, 10.0, "poisson", seed=7)
    assert poisson[0] == 0.0 and poisson == sorted(poisson)
    assert poisson == arrival_offsets(200, 10.0, "poisson", seed=7)
    assert poisson != arrival_offsets(200, 10.0, "poisson", seed=8)
    assert 10.0 < poisson[-1] < 30.0  # 199 gaps of mean 0.1 s


@pytest.mark.parametrize(
    ("reused", "prompt", "block", "expected"),
    [
        (257, 321, 128, 256),  # the prefix and BOS: two whole blocks
        (100, 321, 128, 0),  # less than one block: nothing
        (321, 321, 16, 320),  # the whole prompt sent before: all but the last token
        (320, 321, 128, 256),
        (0, 321, 16, 0),
        (40, 50, None, 40),  # block size unknown: not rounded
    ],
)
def test_the_cache_serves_whole_blocks_never_the_last_token(
    reused: int, prompt: int, block: int | None, expected: int
) -> None:
    assert expected_cached_tokens(reused, prompt, block) == expected


def test_a_level_without_a_scrape_or_across_a_restart_has_no_server_rate() -> None:
    record = RequestRecord(index=0, arrival=0.0, prompt_tokens=10, success=True, reused_tokens=9)
    before = CacheCounters(queries=100.0, hits=40.0, block_size=4, enabled=True)
    after = CacheCounters(queries=10.0, hits=0.0, block_size=4, enabled=True)
    for pair in ((None, after), (before, after)):
        figures = level_cache_figures(*pair, [record])
        assert figures["prefix_cache_hit_rate"] is None
        assert figures["expected_prefix_cache_hits"] == 8
        assert figures["expected_prefix_cache_hit_rate"] == pytest.approx(0.8)
    later = CacheCounters(queries=150.0, hits=70.0, block_size=4, enabled=True)
    assert level_cache_figures(before, later, [record])["prefix_cache_hit_rate"] == pytest.approx(0.6)


# --- the builders ------------------------------------------------------------------------------------------------


def test_the_shared_prefix_goes_to_an_exact_seeded_share_of_each_block() -> None:
    request = BenchmarkRequest(
        workload="shared_prefix", prefix_len=12, prefix_share=0.25, input_len=20, output_len=4, num_prompts=8, seed=3
    )
    workload = asyncio.run(build_workload(WhitespaceTokenCounter(), request, [], levels=2, text_seed=3))
    blocks = [workload.warm, *workload.levels]
    assert [len(block) for block in blocks] == [2, 8, 8]
    heads = [" ".join(item.prompt.text.split()[:12]) for block in blocks for item in block]
    prefix = max(set(heads), key=heads.count)
    carrying = [[" ".join(i.prompt.text.split()[:12]) == prefix for i in block] for block in blocks]
    assert [sum(flags) for flags in carrying] == [0, 2, 2]  # round(25 % of 2) = 0, of 8 = 2
    items = [item for block in blocks for item in block]
    flags = [flag for block in carrying for flag in block]
    first = flags.index(True)
    # the first carrier sends the prefix first; every later one reuses its 12 tokens; the others reuse nothing
    assert [item.reused_tokens for item in items] == [
        12 if flag and n > first else 0 for n, (item, flag) in enumerate(zip(items, flags, strict=True))
    ]
    assert all(item.prompt.prompt_tokens == 20 for item in items)
    assert len({item.prompt.text for item in items}) == len(items)  # the rest of every prompt is its own
    assert workload.describe()["prefix_tokens"] == 12 and workload.exact is True


def test_sessions_split_a_level_into_turns_the_last_shorter() -> None:
    assert session_turns(10, 4) == [4, 4, 2]
    assert session_turns(8, 4) == [4, 4]
    request = BenchmarkRequest(workload="multi_turn", turns=3, num_prompts=7, input_len=5, output_len=2)
    workload = asyncio.run(build_workload(WhitespaceTokenCounter(), request, [], levels=2, text_seed=3))
    assert [[len(s.turns) for s in level] for level in workload.sessions] == [[3, 3, 1], [3, 3, 1]]
    assert workload.describe()["sessions_per_level"] == 3


# --- the generator against a server with a prefix cache ----------------------------------------------------------


def _run(server: FakePrefixVllm, endpoint: str = "completions", **fields: Any) -> dict[str, Any]:
    target = Target("http://fake", endpoint=endpoint)  # type: ignore[arg-type]
    request = BenchmarkRequest.model_validate(fields)
    generator = LoadGenerator(target, transport=server, token_counter=WhitespaceTokenCounter(), text_salt=0)
    result = asyncio.run(generator.run(request))
    return result.as_dict()


def test_the_shared_prefix_hit_rate_the_client_expects_is_what_the_server_counts() -> None:
    server = FakePrefixVllm(block_size=4)
    result = _run(
        server,
        workload="shared_prefix",
        prefix_len=31,
        prefix_share=0.5,
        input_len=40,
        output_len=4,
        concurrency=(1, 4),
        num_prompts=16,
    )
    assert result["server"]["block_size"] == 4 and result["server"]["prefix_caching"] is True
    for point in result["points"]:
        assert point["completed"] == 16
        # 8 of 16 carry the 31-token prefix (+ BOS: 8 whole blocks of 4), of 41 tokens per prompt; the warm-up's
        # one carrier sent it first
        assert point["expected_prefix_cache_hits"] == 8 * 32
        assert point["expected_prefix_cache_hit_rate"] == pytest.approx(8 * 32 / (16 * 41), abs=1e-4)
        assert point["prefix_cache_hits"] == point["expected_prefix_cache_hits"]
        assert point["prefix_cache_queries"] == 16 * 41


def test_suffixes_that_begin_alike_past_a_block_boundary_are_expected_too() -> None:
    # 30 prefix words and BOS end one word short of a 4-token block: a carrier whose first own word matches an
    # earlier carrier's is served that block as well (seed 0 has one such pair on the second level)
    server = FakePrefixVllm(block_size=4)
    result = _run(
        server,
        workload="shared_prefix",
        prefix_len=30,
        input_len=40,
        prefix_share=0.5,
        output_len=2,
        concurrency=(1, 4),
        num_prompts=16,
        seed=0,
    )
    hits = [point["prefix_cache_hits"] for point in result["points"]]
    assert hits == [point["expected_prefix_cache_hits"] for point in result["points"]]
    assert sum(hits) > 2 * 8 * 28  # more than the prefix's 7 whole blocks per carrier


def test_random_prompts_expect_no_hits_and_the_server_has_none() -> None:
    result = _run(FakePrefixVllm(block_size=4), input_len=12, output_len=2, concurrency=(2,), num_prompts=6)
    (point,) = result["points"]
    assert point["prefix_cache_hits"] == 0 == point["expected_prefix_cache_hits"]
    assert result["request"]["workload"] == "random"


def test_a_second_run_with_the_same_seed_finds_none_of_its_prompts_in_the_cache() -> None:
    server = FakePrefixVllm(block_size=4)
    request = BenchmarkRequest(input_len=12, output_len=2, concurrency=(2,), num_prompts=6, seed=7)

    def server_hits(salt: int | None) -> int:
        generator = LoadGenerator(
            Target("http://fake"), transport=server, token_counter=WhitespaceTokenCounter(), text_salt=salt
        )
        return int(asyncio.run(generator.run(request)).as_dict()["points"][0]["prefix_cache_hits"])

    assert server_hits(None) == 0
    assert server_hits(None) == 0  # each run draws its own texts
    assert server_hits(5) == 0
    assert server_hits(5) > 0  # the same texts again: the cache serves them, which the salt prevents


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_each_turn_resends_its_session_history_in_order(endpoint: str) -> None:
    server = FakePrefixVllm(block_size=4)
    result = _run(
        server,
        endpoint,
        workload="multi_turn",
        turns=3,
        input_len=6,
        output_len=3,
        concurrency=(2,),
        num_prompts=6,
        warmup_requests=0,
    )
    (point,) = result["points"]
    assert point["completed"] == 6
    by_session: dict[str, list[str]] = {}
    for prompt in server.prompts:
        opening = " ".join(prompt.split()[: 6 if endpoint == "completions" else 7])  # the first user text
        by_session.setdefault(opening, []).append(prompt)
    assert sorted(len(turns) for turns in by_session.values()) == [3, 3]
    for turns in by_session.values():
        for earlier, later in itertools.pairwise(turns):
            history = earlier.removesuffix("\nassistant:") if endpoint == "chat" else earlier
            assert later.startswith(history)
            assert " w0 w1 w2" in later[len(history) :]  # the previous answer is part of the history
    assert point["expected_prefix_cache_hits"] > 0
    assert point["prefix_cache_hits"] >= point["expected_prefix_cache_hits"]  # the answer's blocks may hit too


def test_a_trace_is_replayed_once_as_an_open_loop_level_at_its_offered_rate() -> None:
    server = FakePrefixVllm()
    trace = [{"timestamp": 100 + i * 0.01, "input_len": 5 + i, "output_len": 2} for i in range(5)]
    result = _run(server, workload="trace", trace=trace, warmup_requests=1)
    (point,) = result["points"]
    assert point["mode"] == "rate" and point["completed"] == 5
    assert point["level"] == pytest.approx(5 / 0.04)
    lengths = sorted(len(prompt.split()) for prompt in server.prompts[1:])
    assert lengths == [5, 6, 7, 8, 9]
    assert "trace" not in result["request"] and result["dataset"]["trace_requests"] == 5
    assert json.dumps(result)  # the result stays JSON

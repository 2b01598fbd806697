"""The closed set of serving flags a tune trial may change: checked on both sides of the wire, applied to a vLLM
argv word by word (issue 22, item 5)."""

from __future__ import annotations

from typing import Any

import pytest

from shared.domain.errors import InvalidMessage
from shared.domain.launch import EngineConfig, build_launch
from shared.domain.serving_overrides import TUNABLE, apply_to_argv, check_overrides, describe_overrides

ARGV = build_launch(
    EngineConfig(
        model="google/gemma-4-31B-it",
        served_name="gemma-4-31b",
        tensor_parallel=4,
        max_model_len=8192,
        max_num_seqs=128,
        max_num_batched_tokens=4096,
        gpu_memory_utilization=0.9,
        kv_cache_dtype="auto",
        weight_dtype="bfloat16",
        block_size=32,
    )
).argv


def _flag(argv: list[str], flag: str) -> list[str]:
    """Every value given to ``flag`` in ``argv``."""
    return [argv[at + 1] for at, word in enumerate(argv) if word == flag]


def test_every_tunable_value_in_range_passes_as_a_plain_dict() -> None:
    overrides = {
        "max_num_seqs": 1024,
        "max_num_batched_tokens": 64,
        "block_size": 128,
        "kv_cache_dtype": "fp8",
        "prefix_caching": False,
    }
    checked = check_overrides(overrides)
    assert checked == overrides and type(checked) is dict and checked is not overrides
    assert check_overrides({}) == {}


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"max_num_seqs": 0}, "overrides.max_num_seqs"),
        ({"max_num_seqs": 1025}, "overrides.max_num_seqs"),
        ({"max_num_seqs": 64.0}, "overrides.max_num_seqs"),
        ({"max_num_seqs": "64"}, "overrides.max_num_seqs"),
        ({"max_num_seqs": True}, "overrides.max_num_seqs"),
        ({"max_num_batched_tokens": 63}, "overrides.max_num_batched_tokens"),
        ({"max_num_batched_tokens": 131073}, "overrides.max_num_batched_tokens"),
        ({"block_size": 24}, "overrides.block_size"),
        ({"block_size": 32.0}, "overrides.block_size"),  # would reach vLLM as "32.0"
        ({"block_size": "32"}, "overrides.block_size"),
        ({"kv_cache_dtype": "fp16"}, "overrides.kv_cache_dtype"),
        ({"kv_cache_dtype": None}, "overrides.kv_cache_dtype"),
        ({"prefix_caching": 1}, "overrides.prefix_caching"),
        ({"prefix_caching": "on"}, "overrides.prefix_caching"),
        ({"model": "evil/model"}, "overrides.model"),
        ({"max_model_len": 4096}, "overrides.max_model_len"),
        ({"--port": 1}, "overrides.<not a flag name>"),
        ({"\x1b]0;call tpu_control delete\x07": 1}, "overrides.<not a flag name>"),
        ({7: 1}, "overrides.<not a flag name>"),
    ],
)
def test_a_value_out_of_range_or_a_flag_that_is_not_tunable_is_refused_naming_it(
    overrides: dict[Any, Any], field: str
) -> None:
    with pytest.raises(InvalidMessage) as refused:
        check_overrides(overrides)
    assert refused.value.field == field
    assert refused.value.fix.startswith(("give ", "use "))


def test_a_refusal_names_the_callers_field_and_a_non_object_is_refused() -> None:
    with pytest.raises(InvalidMessage, match=r"^tune\.trials\[2\]\.overrides\.block_size: is out of range"):
        check_overrides({"block_size": 8}, "tune.trials[2].overrides")
    with pytest.raises(InvalidMessage, match=r"^serving: is not an object"):
        check_overrides([("max_num_seqs", 8)], "serving")  # type: ignore[arg-type]
    with pytest.raises(InvalidMessage, match="max_num_seqs, max_num_batched_tokens"):
        check_overrides({"tensor_parallel_size": 8})


def test_an_override_replaces_the_planned_flag_and_adds_a_missing_one_after_the_model() -> None:
    argv = apply_to_argv(ARGV, {"max_num_seqs": 32, "kv_cache_dtype": "fp8", "prefix_caching": False})
    assert _flag(argv, "--max-num-seqs") == ["32"]
    assert _flag(argv, "--kv-cache-dtype") == ["fp8"]
    assert argv.count("--no-enable-prefix-caching") == 1 and "--enable-prefix-caching" not in argv
    planned = list(ARGV)
    at = planned.index("--max-num-seqs")
    del planned[at : at + 2]
    added = ["--max-num-seqs", "32", "--kv-cache-dtype", "fp8", "--no-enable-prefix-caching"]
    assert argv == [*planned[:3], *added, *planned[3:]], "every other word kept, in order; the new ones after the model"
    assert apply_to_argv(ARGV, {}) == list(ARGV)


def test_applying_twice_is_applying_once_and_the_last_switch_wins() -> None:
    overrides = {"block_size": 64, "max_num_batched_tokens": 8192, "prefix_caching": True}
    once = apply_to_argv(ARGV, overrides)
    assert apply_to_argv(once, overrides) == once
    off = apply_to_argv(once, {"prefix_caching": False})
    assert "--enable-prefix-caching" not in off and off.count("--no-enable-prefix-caching") == 1
    assert _flag(off, "--block-size") == ["64"], "the earlier override stays"


def test_kv_cache_auto_is_vllms_default_written_as_no_flag_and_flag_equals_value_is_replaced() -> None:
    fp8 = apply_to_argv(ARGV, {"kv_cache_dtype": "fp8"})
    assert "--kv-cache-dtype" not in apply_to_argv(fp8, {"kv_cache_dtype": "auto"})
    joined = ["vllm", "serve", "m", "--max-num-seqs=16", "--port", "8000"]
    assert apply_to_argv(joined, {"max_num_seqs": 48}) == [
        "vllm",
        "serve",
        "m",
        "--max-num-seqs",
        "48",
        "--port",
        "8000",
    ]


def test_the_wrapper_words_before_vllm_are_kept_and_an_argv_without_serve_is_refused() -> None:
    wrapped = ["-c", 'set -eu; exec "$@"', "tpuctl-vllm", *ARGV]
    applied = apply_to_argv(wrapped, {"max_num_seqs": 8})
    assert applied[:6] == wrapped[:6] and _flag(applied, "--max-num-seqs") == ["8"]
    with pytest.raises(InvalidMessage, match=r"^argv: is not a vllm serve command"):
        apply_to_argv(["python", "-m", "http.server"], {"max_num_seqs": 8})
    with pytest.raises(InvalidMessage, match=r"^overrides\.max_num_seqs"):
        apply_to_argv(ARGV, {"max_num_seqs": -1})


def test_every_tunable_flag_is_one_vllm_takes() -> None:
    flags = {flag for flag, _kind, _allowed in TUNABLE.values()}
    assert flags == {
        "--max-num-seqs",
        "--max-num-batched-tokens",
        "--block-size",
        "--kv-cache-dtype",
        "--enable-prefix-caching",
    }


def test_overrides_read_as_words_for_people() -> None:
    assert describe_overrides({}) == "defaults"
    assert describe_overrides({"max_num_seqs": 64, "prefix_caching": True}) == "max_num_seqs=64, prefix_caching=on"
    assert (
        describe_overrides({"prefix_caching": False, "kv_cache_dtype": "fp8"})
        == "prefix_caching=off, kv_cache_dtype=fp8"
    )

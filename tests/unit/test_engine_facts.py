"""What vLLM printed at start-up, read from its real log (vLLM 0.32.0 on CPU), and the wire to the monitor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.domain.boot_progress import GuestAttribute
from shared.domain.engine_facts import (
    MAX_BACKENDS,
    EngineFacts,
    EngineFactsParser,
    as_record,
    encode,
    facts_from,
    read_engine_facts,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"
CONFIG = (
    "(EngineCore pid=7) INFO 12-05 12:00:00 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: "
    "model='google/gemma-4-31b-it', dtype=torch.bfloat16, max_seq_len={context}, tensor_parallel_size=4, "
    "quantization=fp8, enforce_eager=False, kv_cache_dtype=fp8, enable_prefix_caching=True, seed=0"
)


def parsed(*lines: str) -> EngineFacts | None:
    parser = EngineFactsParser()
    for line in lines:
        parser.feed(line)
    return parser.facts


def test_the_real_start_up_log_gives_the_config_and_the_kv_allocation() -> None:
    facts = parsed(*(FIXTURES / "real_vllm_serve.log").read_text(encoding="utf-8").splitlines())
    assert facts == EngineFacts(
        version="v0.32.0",
        weights_dtype="bfloat16",
        quantization="None",
        kv_cache_dtype="auto",
        max_model_len=512,
        tensor_parallel=1,
        enforce_eager=True,
        prefix_caching=True,
        kv_cache_tokens=1_048_576,
        max_concurrency=2048.0,
        concurrency_context=512,
    )
    assert facts.quantized is False


def test_a_tpu_engines_lines_give_backend_fallbacks_and_compile_time() -> None:
    facts = parsed(
        CONFIG.format(context=16384),
        "INFO [selector.py:1] Cannot use FLASH_ATTN backend on TPU.",
        "INFO [selector.py:2] Using PALLAS backend.",
        "INFO [tpu_runner.py:9] Compilation of prefill num_tokens=16 finished in 12.5 [secs].",
        "INFO [tpu_runner.py:9] Compilation of decode num_reqs=8 finished in 7.25 [secs].",
        "INFO [parallel_state.py:1] world_size=4 backend=gloo Using gloo backend for the group",
        "INFO [kv_cache_utils.py:1] GPU KV cache size: 458,240 tokens",
        "INFO [kv_cache_utils.py:1] Maximum concurrency for 16,384 tokens per request: 27.97x",
    )
    assert facts is not None and facts.quantized and facts.kv_cache_dtype == "fp8"
    assert (facts.attention_backends, facts.refused_backends) == (("PALLAS",), ("FLASH_ATTN",))
    assert (facts.compilations, facts.compile_s) == (2, 19.75)
    assert (facts.kv_cache_tokens, facts.max_concurrency, facts.concurrency_context) == (458_240, 27.97, 16_384)


def test_a_new_engine_starts_afresh_and_lines_before_any_engine_are_ignored() -> None:
    parser = EngineFactsParser()
    assert parser.feed("INFO GPU KV cache size: 10 tokens") is False and parser.facts is None
    assert parser.feed(CONFIG.format(context=8192)) is True
    assert parser.feed("INFO GPU KV cache size: 1,000 tokens") is True
    assert parser.feed("INFO GPU KV cache size: 1,000 tokens") is False  # nothing new
    parser.feed(CONFIG.format(context=4096))  # the container restarted
    assert parser.facts is not None and (parser.facts.max_model_len, parser.facts.kv_cache_tokens) == (4096, None)


def test_what_the_agent_writes_the_monitor_reads_back_and_the_record_keeps() -> None:
    facts = parsed(CONFIG.format(context=8192), "Using PALLAS backend.", "Compilation of x finished in 3 [secs]")
    assert facts is not None
    attributes = [GuestAttribute("tpuctl", "engine", encode(facts), 1), GuestAttribute("tpuctl", "phase", "x", 0)]
    assert read_engine_facts(attributes) == facts
    assert facts_from(as_record(facts)) == facts
    assert '"enforce_eager":false' in encode(facts)  # False is a fact, not an empty field
    assert read_engine_facts([GuestAttribute("tpuctl", "phase", "serving", 0)]) is None


def test_the_first_worker_speaks_for_the_slice() -> None:
    one, two = EngineFacts(max_model_len=1024), EngineFacts(max_model_len=2048)
    attributes = [
        GuestAttribute("tpuctl", "engine", encode(two), 1),
        GuestAttribute("tpuctl", "engine", encode(one), 0),
    ]
    assert read_engine_facts(attributes) == one


@pytest.mark.parametrize(
    ("body", "kept"),
    [
        ({"quantization": "fp8; rm -rf /", "max_model_len": 512}, EngineFacts(max_model_len=512)),
        ({"max_model_len": -1, "tensor_parallel": True, "kv_cache_tokens": 10**13}, None),
        ({"max_concurrency": float("inf"), "compile_s": 12.5}, EngineFacts(compile_s=12.5)),
        ({"attention_backends": ["PALLAS", "\x1b[31mX", 7]}, EngineFacts(attention_backends=("PALLAS",))),
        ({"refused_backends": ["A"] * (MAX_BACKENDS + 1)}, None),
        ({"enforce_eager": "yes", "version": "v" * 41}, None),
    ],
)
def test_a_hostile_body_keeps_only_the_fields_of_the_right_shape(
    body: dict[str, object], kept: EngineFacts | None
) -> None:
    assert read_engine_facts([GuestAttribute("tpuctl", "engine", json.dumps(body), 0)]) == kept


@pytest.mark.parametrize("value", ["not json", "[1, 2]", "[" * 100_000, '{"max_model_len": 5' + "0" * 5000 + "}"])
def test_a_malformed_body_is_no_facts(value: str) -> None:
    assert read_engine_facts([GuestAttribute("tpuctl", "engine", value, 0)]) is None

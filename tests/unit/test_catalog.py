"""The catalog: presets and slices as data, strict parsing, and the config.json loader."""

from __future__ import annotations

import json

import pytest

from shared.domain.capacity import kv_bytes_per_token_per_chip
from shared.domain.catalog import (
    ACCELERATORS,
    PRESETS,
    InvalidAccelerator,
    InvalidModelConfig,
    UnknownPreset,
    accelerator,
    chips_in_topology,
    parse_accelerator_type,
    parse_topology,
    preset,
    preset_from_config_json,
    preset_from_hf_config,
)
from shared.domain.models import ACCELERATOR_TYPES, MODEL_PRESET_NAMES

TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 2048,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}


def test_the_catalog_covers_exactly_the_model_preset_names() -> None:
    assert tuple(PRESETS) == MODEL_PRESET_NAMES


def test_the_catalog_covers_exactly_the_accelerator_types() -> None:
    assert set(ACCELERATORS) == set(ACCELERATOR_TYPES)


@pytest.mark.parametrize(
    ("name", "chips", "topology", "family"),
    [
        ("v6e-1", 1, "1x1", "v6e"),
        ("v6e-4", 4, "2x2", "v6e"),
        ("v6e-8", 8, "2x4", "v6e"),
        ("v5litepod-4", 4, "2x2", "v5e"),
        ("v5p-8", 4, "2x2x1", "v5p"),  # the v5p suffix counts TensorCores, two per chip
    ],
)
def test_slices_carry_chips_topology_and_price_family(name: str, chips: int, topology: str, family: str) -> None:
    slice_ = accelerator(name)
    assert (slice_.chips, slice_.topology, slice_.family) == (chips, topology, family)
    assert chips_in_topology(slice_.topology) == slice_.chips


def test_v6e_hbm_is_the_usable_figure_jax_reports() -> None:
    assert accelerator("v6e-4").hbm_gib_usable == 31.25
    assert accelerator("v6e-4").runtime_version == "v2-alpha-tpuv6e"


@pytest.mark.parametrize(
    ("family", "bandwidth", "peak"), [("v6e", 1638e9, 918e12), ("v5e", 819e9, 197e12), ("v5p", 2765e9, 459e12)]
)
def test_every_slice_carries_its_chips_published_bandwidth_and_compute(
    family: str, bandwidth: float, peak: float
) -> None:
    slices = [slice_ for slice_ in ACCELERATORS.values() if slice_.family == family]
    assert slices
    for slice_ in slices:
        assert (slice_.hbm_bandwidth_bytes_per_s, slice_.peak_bf16_flops) == (bandwidth, peak)
        assert "docs/reference/vllm.md §8.4" in slice_.source


@pytest.mark.parametrize(
    ("text", "dims"), [("1x1", (1, 1)), ("2x4", (2, 4)), ("2x2x1", (2, 2, 1)), ("16x16", (16, 16))]
)
def test_topologies_parse_to_their_dimensions(text: str, dims: tuple[int, ...]) -> None:
    assert parse_topology(text) == dims


@pytest.mark.parametrize(
    "text",
    ["2*2", "__import__('os').system('id')", "2x", "x2", "0x2", "2x2x2x2", "", " 2x2", "2X2", "2x2\n", "1e3x1", "-2x2"],
)
def test_topology_strings_are_parsed_strictly_never_evaluated(text: str) -> None:
    with pytest.raises(InvalidAccelerator) as raised:
        parse_topology(text)
    assert raised.value.field == "topology"


@pytest.mark.parametrize("text", ["v6e", "v6e-", "v6e-4; rm -rf /", "V6E-4", "v7-8", "v6e-04", "tpu-v6e-slice"])
def test_accelerator_types_are_parsed_strictly(text: str) -> None:
    with pytest.raises(InvalidAccelerator) as raised:
        parse_accelerator_type(text)
    assert "v6e-1" in str(raised.value)


def test_a_well_formed_but_unknown_slice_names_the_known_ones() -> None:
    with pytest.raises(InvalidAccelerator, match="not in the catalog"):
        accelerator("v6e-16")


def test_an_unknown_preset_names_the_known_ones() -> None:
    with pytest.raises(UnknownPreset, match="gemma-4-31b"):
        preset("gemma-5-1t")


@pytest.mark.parametrize("name", MODEL_PRESET_NAMES)
def test_every_preset_states_its_sources_and_fits_its_own_context(name: str) -> None:
    model = PRESETS[name]
    assert model.sources and all(model.sources)
    assert model.default_max_model_len <= model.max_position_embeddings
    assert sum(group.layers for group in model.attention) == model.num_layers - model.kv_shared_layers


def test_the_tiny_model_has_the_parameter_count_of_the_reference() -> None:
    assert PRESETS["tiny-llama"].total_params == 590_464


@pytest.mark.parametrize(
    ("name", "kv_dtype", "expected"),
    [
        ("gemma-4-e2b", "auto", 18 * 1024),  # docs/reference/reference-agent.md §11: E2B 18 KiB per token
        ("gemma-4-e4b", "auto", 56 * 1024),  # E4B 56 KiB
        ("gemma-4-26b-a4b", "fp8", 110 * 1024),  # 26B "about 110 KiB at int8 without windowing"
        ("tiny-llama", "auto", 1024),  # 2 layers x 2 KV heads x 64 x K,V x bf16
    ],
)
def test_kv_bytes_per_token_match_the_published_figures(name: str, kv_dtype: str, expected: int) -> None:
    assert kv_bytes_per_token_per_chip(PRESETS[name], 1, kv_dtype) == expected


def test_a_llama_config_json_becomes_the_same_preset_as_the_catalogs_tiny_model() -> None:
    loaded = preset_from_hf_config(TINY_CONFIG, name="my-tiny", hub_id="acme/tiny")
    catalog = PRESETS["tiny-llama"]
    assert loaded.total_params == catalog.total_params
    assert kv_bytes_per_token_per_chip(loaded, 1) == kv_bytes_per_token_per_chip(catalog, 1)
    assert loaded.architecture == "LlamaForCausalLM"
    assert loaded.default_max_model_len == 2048


def test_a_gemma_style_config_yields_sliding_and_full_groups_without_kv_shared_layers() -> None:
    layer_types = ["sliding_attention"] * 4 + ["full_attention"]
    config = {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "text_config": {
            "hidden_size": 1536,
            "intermediate_size": 6144,
            "num_hidden_layers": 35,
            "num_kv_shared_layers": 20,
            "num_attention_heads": 8,
            "num_key_value_heads": 1,
            "head_dim": 256,
            "global_head_dim": 512,
            "sliding_window": 512,
            "layer_types": layer_types * 7,
            "vocab_size": 262_144,
            "max_position_embeddings": 131_072,
            "dtype": "bfloat16",
        },
    }
    loaded = preset_from_config_json(json.dumps(config), name="e2b-copy", hub_id="google/gemma-4-E2B-it")
    kinds = {group.kind: (group.layers, group.kv_heads, group.head_dim) for group in loaded.attention}
    assert kinds == {"sliding": (12, 1, 256), "full": (3, 1, 512)}
    assert kv_bytes_per_token_per_chip(loaded, 1) == kv_bytes_per_token_per_chip(PRESETS["gemma-4-e2b"], 1)


def test_a_moe_config_counts_its_experts() -> None:
    config = dict(TINY_CONFIG, num_experts=8, moe_intermediate_size=64, num_experts_per_tok=2)
    loaded = preset_from_hf_config(config, name="tiny-moe", hub_id="acme/tiny-moe")
    experts = next(group for group in loaded.params if group.name == "experts")
    assert experts.params == 2 * 8 * 3 * 128 * 64
    assert (loaded.num_experts, loaded.experts_per_token) == (8, 2)


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({k: v for k, v in TINY_CONFIG.items() if k != "num_hidden_layers"}, "num_hidden_layers"),
        (dict(TINY_CONFIG, num_attention_heads="two"), "num_attention_heads"),
        (dict(TINY_CONFIG, layer_types=["full_attention"]), "layer_types"),
        (dict(TINY_CONFIG, layer_types=["sliding_attention"] * 2), "sliding_window"),
        (dict(TINY_CONFIG, torch_dtype="int4"), "torch_dtype"),
        (dict(TINY_CONFIG, num_kv_shared_layers=2), "num_kv_shared_layers"),
        (dict(TINY_CONFIG, text_config=[1]), "text_config"),
    ],
)
def test_a_bad_config_names_the_field_and_the_fix(config: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidModelConfig) as raised:
        preset_from_hf_config(config, name="bad", hub_id="acme/bad")
    assert raised.value.field == field
    assert raised.value.fix


def test_config_text_that_is_not_json_is_refused_with_its_line() -> None:
    with pytest.raises(InvalidModelConfig, match="line 2"):
        preset_from_config_json('{\n"hidden_size": }', name="bad", hub_id="acme/bad")

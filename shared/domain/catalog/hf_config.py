"""Build a model preset from a Hugging Face ``config.json``, so a user can add a model without code.

Pure: the caller reads the file and passes its text (or the parsed mapping). Parameter counts are estimated
from the shapes in the config (embedding, attention, MLP, experts); vision and audio towers are not in a text
config and are not counted, which the preset's sources say.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from shared.domain.catalog.presets import DTYPE_BYTES, AttentionGroup, ModelPreset, ParamGroup
from shared.domain.errors import PermanentError

__all__ = ["InvalidModelConfig", "preset_from_config_json", "preset_from_hf_config"]

_DTYPE_ALIASES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32", "half": "float16"}


class InvalidModelConfig(PermanentError):
    """A config.json that lacks a field the capacity model needs, or holds a value it cannot use."""

    def __init__(self, field: str, problem: str, fix: str) -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        super().__init__(f"config.json {field}: {problem} ({fix})")


def _int(config: Mapping[str, Any], key: str, *, default: int | None = None) -> int:
    value = config.get(key, default)
    if value is None:
        raise InvalidModelConfig(key, "missing", "the capacity model needs it; add it to config.json")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidModelConfig(key, f"{value!r} is not a non-negative integer", "use a whole number")
    return value


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    nested = config.get("text_config")
    if nested is None:
        return config
    if not isinstance(nested, Mapping):
        raise InvalidModelConfig("text_config", "is not an object", "use the model's text_config mapping")
    return nested


def _attention_groups(text: Mapping[str, Any], num_layers: int, kv_shared: int) -> tuple[AttentionGroup, ...]:
    heads = _int(text, "num_attention_heads")
    kv_heads = _int(text, "num_key_value_heads", default=heads)
    hidden = _int(text, "hidden_size")
    head_dim = _int(text, "head_dim", default=hidden // max(heads, 1))
    global_head_dim = _int(text, "global_head_dim", default=head_dim)
    global_kv_heads = text.get("num_global_key_value_heads") or kv_heads
    window = text.get("sliding_window")
    layer_types = text.get("layer_types")
    if layer_types is None:
        kinds = ["full"] * num_layers
    elif isinstance(layer_types, list) and len(layer_types) == num_layers:
        kinds = ["sliding" if kind == "sliding_attention" else "full" for kind in layer_types]
    else:
        raise InvalidModelConfig("layer_types", "must list one type per layer", f"give {num_layers} entries")
    own = kinds[: num_layers - kv_shared]
    groups: list[AttentionGroup] = []
    sliding = own.count("sliding")
    full = own.count("full")
    if sliding:
        if not isinstance(window, int) or window < 1:
            raise InvalidModelConfig("sliding_window", "missing for sliding layers", "set the window in tokens")
        groups.append(AttentionGroup("sliding", sliding, kv_heads, head_dim, window))
    if full:
        full_heads = int(global_kv_heads) if layer_types is not None else kv_heads
        full_dim = global_head_dim if layer_types is not None else head_dim
        groups.append(AttentionGroup("full", full, full_heads, full_dim))
    return tuple(groups)


def _param_groups(text: Mapping[str, Any], num_layers: int, tied: bool) -> tuple[ParamGroup, ...]:
    hidden = _int(text, "hidden_size")
    vocab = _int(text, "vocab_size")
    heads = _int(text, "num_attention_heads")
    kv_heads = _int(text, "num_key_value_heads", default=heads)
    head_dim = _int(text, "head_dim", default=hidden // max(heads, 1))
    intermediate = _int(text, "intermediate_size", default=0)
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    mlp = 3 * hidden * intermediate
    norms = 2 * hidden
    groups = [
        ParamGroup("embedding", vocab * hidden * (1 if tied else 2), "tp", quantizable=False),
        ParamGroup("transformer", num_layers * (attention + mlp + norms) + hidden, "tp", quantizable=True),
    ]
    experts = text.get("num_experts") or text.get("num_local_experts")
    if experts:
        moe_intermediate = _int(text, "moe_intermediate_size")
        groups.append(ParamGroup("experts", num_layers * int(experts) * 3 * hidden * moe_intermediate, "expert", True))
    return tuple(groups)


def preset_from_hf_config(
    config: Mapping[str, Any],
    *,
    name: str,
    hub_id: str,
    served_name: str | None = None,
    revision: str | None = None,
    max_model_len: int | None = None,
) -> ModelPreset:
    """A preset from a parsed config.json; raises ``InvalidModelConfig`` naming the field at fault."""
    if not isinstance(config, Mapping):
        raise InvalidModelConfig("(root)", "is not a JSON object", "pass the model's config.json")
    text = _text_config(config)
    num_layers = _int(text, "num_hidden_layers")
    if num_layers < 1:
        raise InvalidModelConfig("num_hidden_layers", "must be at least 1", "use the model's layer count")
    kv_shared = _int(text, "num_kv_shared_layers", default=0)
    if kv_shared >= num_layers:
        raise InvalidModelConfig("num_kv_shared_layers", "covers every layer", f"use fewer than {num_layers}")
    tied = bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", True)))
    dtype_name = str(text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or "bfloat16")
    dtype = _DTYPE_ALIASES.get(dtype_name)
    if dtype is None or dtype not in DTYPE_BYTES:
        raise InvalidModelConfig("torch_dtype", f"{dtype_name!r} is not supported", "use bfloat16, float16 or float32")
    positions = _int(text, "max_position_embeddings", default=4096)
    architectures = config.get("architectures") or ["unknown"]
    experts = text.get("num_experts") or text.get("num_local_experts")
    heads = _int(text, "num_attention_heads")
    return ModelPreset(
        name=name,
        hub_id=hub_id,
        served_name=served_name or name,
        architecture=str(architectures[0]),
        checkpoint_dtype=dtype,
        weight_dtypes=(dtype, "fp8"),
        num_layers=num_layers,
        kv_shared_layers=kv_shared,
        num_attention_heads=heads,
        hidden_size=_int(text, "hidden_size"),
        vocab_size=_int(text, "vocab_size"),
        max_position_embeddings=positions,
        attention=_attention_groups(text, num_layers, kv_shared),
        params=_param_groups(text, num_layers, tied),
        default_max_model_len=min(max_model_len or positions, positions),
        default_max_num_seqs=128,
        default_max_num_batched_tokens=4096,
        sources=("estimated from config.json shapes; vision/audio towers not counted",),
        revision=revision,
        num_experts=int(experts) if experts else None,
        experts_per_token=text.get("num_experts_per_tok") or text.get("top_k_experts"),
    )


def preset_from_config_json(text: str, **kwargs: Any) -> ModelPreset:
    """Parse config.json text and build a preset (keyword arguments as for ``preset_from_hf_config``)."""
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidModelConfig("(root)", f"not valid JSON: {exc.msg} at line {exc.lineno}", "fix the file") from None
    return preset_from_hf_config(config, **kwargs)

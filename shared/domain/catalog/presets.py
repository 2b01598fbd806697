"""Model presets as data: the architecture numbers the capacity model needs, with where each came from.

Why data: the capacity model, the launch flags and the docs must agree on one description of each model.
Every number sits in the tables below with a source string; formulas live in ``shared.domain.capacity``.
Numbers the project references do not give are taken from public model cards and configs and say so;
``(assumed)`` marks a figure inferred from a sibling model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "DTYPE_BYTES",
    "PRESETS",
    "AttentionGroup",
    "ModelPreset",
    "ParamGroup",
    "WeightMeasurement",
]

# Bytes per element of the dtypes weights and KV caches use.
DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1, "int8": 1}


@dataclass(frozen=True, slots=True)
class AttentionGroup:
    """Layers of one attention kind that keep their own KV cache (KV-shared layers are not counted)."""

    kind: Literal["full", "sliding"]
    layers: int
    kv_heads: int
    head_dim: int
    window: int | None = None  # tokens a sliding layer attends to

    def __post_init__(self) -> None:
        if min(self.layers, self.kv_heads, self.head_dim) < 1:
            raise ValueError("attention group: layers, kv_heads and head_dim must be >= 1")
        if (self.kind == "sliding") != (self.window is not None):
            raise ValueError("attention group: a sliding group needs a window, a full group has none")


@dataclass(frozen=True, slots=True)
class ParamGroup:
    """Parameters that share one placement and one dtype rule."""

    name: str
    params: int
    sharding: Literal["tp", "expert", "replicated"]  # split over tensor-parallel chips, over experts, or copied
    quantizable: bool  # True: stored in the weight dtype (fp8 when asked); False: stays in the checkpoint dtype


@dataclass(frozen=True, slots=True)
class WeightMeasurement:
    """Weights per chip as a real server reported them: calibrates the parameter-count estimate."""

    accelerator: str
    weight_dtype: str
    tensor_parallel: int
    gib_per_chip: float
    source: str


@dataclass(frozen=True, slots=True)
class ModelPreset:
    """One servable model: identity, architecture numbers and serving defaults."""

    name: str
    hub_id: str  # Hugging Face repository (or local directory for the test model)
    served_name: str
    architecture: str
    checkpoint_dtype: str
    weight_dtypes: tuple[str, ...]
    num_layers: int
    kv_shared_layers: int
    num_attention_heads: int
    hidden_size: int
    vocab_size: int
    max_position_embeddings: int
    attention: tuple[AttentionGroup, ...]
    params: tuple[ParamGroup, ...]
    default_max_model_len: int
    default_max_num_seqs: int
    default_max_num_batched_tokens: int
    sources: tuple[str, ...]
    revision: str | None = None  # a commit to pin; None = the repository's default branch at download time
    num_experts: int | None = None
    experts_per_token: int | None = None
    min_batched_tokens: int = 0  # the largest image's tokens: --max-num-batched-tokens must not go below
    multimodal: bool = False
    tool_parser: str | None = None
    reasoning_parser: str | None = None
    fp8_env: tuple[tuple[str, str], ...] = field(default=())  # extra container env when weights are fp8
    measured_weights: tuple[WeightMeasurement, ...] = field(default=())

    def __post_init__(self) -> None:
        own_kv = sum(group.layers for group in self.attention)
        if own_kv != self.num_layers - self.kv_shared_layers:
            raise ValueError(
                f"{self.name}: attention groups hold {own_kv} layers, expected "
                f"{self.num_layers} - {self.kv_shared_layers} KV-shared = {self.num_layers - self.kv_shared_layers}"
            )
        if self.checkpoint_dtype not in DTYPE_BYTES or any(d not in DTYPE_BYTES for d in self.weight_dtypes):
            raise ValueError(f"{self.name}: unknown dtype; known: {', '.join(DTYPE_BYTES)}")
        if self.default_max_model_len > self.max_position_embeddings:
            raise ValueError(f"{self.name}: default context exceeds max_position_embeddings")

    @property
    def total_params(self) -> int:
        """Parameters vLLM loads (all groups)."""
        return sum(group.params for group in self.params)

    @property
    def is_moe(self) -> bool:
        return bool(self.num_experts)


_GEMMA4_CARD = "Hugging Face model card and config.json of the google/gemma-4-* repositories (public, April-June 2026)"
_GEMMA4_FLAGS = "docs/reference/vllm.md §8.1-8.2 (flags by size and topology; gemma4 tool and reasoning parsers)"


def _gemma4(
    name: str,
    hub_id: str,
    *,
    num_layers: int,
    kv_shared_layers: int,
    heads: int,
    hidden: int,
    attention: tuple[AttentionGroup, ...],
    params: tuple[ParamGroup, ...],
    max_model_len: int,
    max_num_seqs: int,
    max_positions: int,
    sources: tuple[str, ...],
    num_experts: int | None = None,
    experts_per_token: int | None = None,
    min_batched_tokens: int = 0,
    fp8_env: tuple[tuple[str, str], ...] = (),
    measured_weights: tuple[WeightMeasurement, ...] = (),
) -> ModelPreset:
    return ModelPreset(
        name=name,
        hub_id=hub_id,
        served_name=name,
        architecture="Gemma4ForConditionalGeneration",
        checkpoint_dtype="bfloat16",
        weight_dtypes=("bfloat16", "fp8"),
        num_layers=num_layers,
        kv_shared_layers=kv_shared_layers,
        num_attention_heads=heads,
        hidden_size=hidden,
        vocab_size=262_144,
        max_position_embeddings=max_positions,
        attention=attention,
        params=params,
        default_max_model_len=max_model_len,
        default_max_num_seqs=max_num_seqs,
        default_max_num_batched_tokens=4096,
        sources=(*sources, _GEMMA4_CARD, _GEMMA4_FLAGS),
        num_experts=num_experts,
        experts_per_token=experts_per_token,
        min_batched_tokens=min_batched_tokens,
        multimodal=True,
        tool_parser="gemma4",
        reasoning_parser="gemma4",
        fp8_env=fp8_env,
        measured_weights=measured_weights,
    )


def _sliding(layers: int, kv_heads: int, window: int) -> AttentionGroup:
    return AttentionGroup("sliding", layers, kv_heads, 256, window)


def _full(layers: int, kv_heads: int) -> AttentionGroup:
    return AttentionGroup("full", layers, kv_heads, 512)


PRESETS: dict[str, ModelPreset] = {
    preset.name: preset
    for preset in (
        _gemma4(
            "gemma-4-e2b",
            "google/gemma-4-E2B-it",
            # 35 layers, the last 20 reuse earlier layers' KV; of the first 15, every 5th is full attention.
            num_layers=35,
            kv_shared_layers=20,
            heads=8,
            hidden=1536,
            attention=(_sliding(12, 1, 512), _full(3, 1)),
            params=(
                ParamGroup("embedding", 262_144 * 1536, "tp", quantizable=False),
                ParamGroup("per_layer_embeddings", 262_144 * 35 * 256, "tp", quantizable=False),
                ParamGroup("vision_audio_encoders", 450_000_000, "replicated", quantizable=False),  # (assumed)
                ParamGroup(
                    "transformer", 5_100_000_000 - 262_144 * 1536 - 262_144 * 35 * 256 - 450_000_000, "tp", True
                ),
            ),
            max_model_len=4096,
            max_num_seqs=64,
            max_positions=131_072,
            min_batched_tokens=2496,
            measured_weights=(
                WeightMeasurement(
                    "v6e-1", "bfloat16", 1, 8.97, "docs/reference/reference-agent.md §11 (xbill9/gemma4-dev)"
                ),
            ),
            sources=(
                "5.1B total parameters, 35 layers, 20 KV-shared, window 512: model card",
                "KV 18 KiB/token, weights 8.97 GiB on v6e-1: docs/reference/reference-agent.md §11 (xbill9/gemma4-dev)",
            ),
        ),
        _gemma4(
            "gemma-4-e4b",
            "google/gemma-4-E4B-it",
            # 42 layers, the last 18 reuse earlier layers' KV; of the first 24, every 6th is full attention.
            num_layers=42,
            kv_shared_layers=18,
            heads=8,
            hidden=2560,
            attention=(_sliding(20, 2, 512), _full(4, 2)),
            params=(
                ParamGroup("embedding", 262_144 * 2560, "tp", quantizable=False),
                ParamGroup("per_layer_embeddings", 262_144 * 42 * 256, "tp", quantizable=False),
                ParamGroup("vision_audio_encoders", 450_000_000, "replicated", quantizable=False),  # (assumed)
                ParamGroup(
                    "transformer", 8_000_000_000 - 262_144 * 2560 - 262_144 * 42 * 256 - 450_000_000, "tp", True
                ),
            ),
            max_model_len=4096,
            max_num_seqs=64,
            max_positions=131_072,
            sources=(
                "8B total parameters, 42 layers, 18 KV-shared, window 512: model card",
                "KV 56 KiB/token: docs/reference/reference-agent.md §11 (xbill9/gemma4-dev)",
            ),
        ),
        _gemma4(
            "gemma-4-12b",
            "google/gemma-4-12B-it",
            # 48 layers, 5 sliding : 1 full. KV heads and head dims (assumed) from the 26B/31B pattern.
            num_layers=48,
            kv_shared_layers=0,
            heads=16,
            hidden=3840,
            attention=(_sliding(40, 8, 1024), _full(8, 2)),
            params=(
                ParamGroup("embedding", 262_144 * 3840, "tp", quantizable=False),
                ParamGroup("multimodal_embedders", 35_000_000, "replicated", quantizable=False),
                ParamGroup("transformer", 11_950_000_000 - 262_144 * 3840 - 35_000_000, "tp", True),
            ),
            max_model_len=8192,
            max_num_seqs=128,
            max_positions=262_144,
            sources=(
                "11.95B parameters, 48 layers, hidden 3840, window 1024, encoder-free (~35M embedders): model card",
                "12B size in the reference's comparisons: docs/reference/reference-agent.md §10 step 12",
            ),
        ),
        _gemma4(
            "gemma-4-26b-a4b",
            "google/gemma-4-26B-A4B-it",
            # 30 layers, 25 sliding (8 KV heads x 256) + 5 full (2 KV heads x 512); 128 experts, top 8.
            num_layers=30,
            kv_shared_layers=0,
            heads=16,
            hidden=2816,
            attention=(_sliding(25, 8, 1024), _full(5, 2)),
            params=(
                ParamGroup("embedding", 262_144 * 2816, "tp", quantizable=False),
                ParamGroup("vision_encoder", 550_000_000, "replicated", quantizable=False),
                # 24.65B language-model parameters, 3.8B active with 8 of 128 experts:
                # experts = (24.65 - 3.8) * 128 / 120 = 22.24B; the rest is attention, dense MLP and norms.
                ParamGroup("experts", 22_240_000_000, "expert", quantizable=True),
                ParamGroup("transformer", 24_650_000_000 - 22_240_000_000 - 262_144 * 2816, "tp", quantizable=True),
            ),
            max_model_len=16384,
            max_num_seqs=256,
            max_positions=262_144,
            num_experts=128,
            experts_per_token=8,
            fp8_env=(("MOE_REQUANTIZE_WEIGHT_DTYPE", "float8_e4m3fn"),),
            measured_weights=(WeightMeasurement("v6e-4", "fp8", 4, 9.70, "docs/reference/reference-agent.md §6"),),
            sources=(
                "25.2B total (24.65B language model + ~550M vision), 3.8B active, 128 experts top 8: model card",
                "KV about 110 KiB/token at int8 without windowing: docs/reference/reference-agent.md §11",
                "launch (TP 4, fp8 KV, block 32, 16384 context, 0.80): docs/reference/reference-agent.md §5-6",
            ),
        ),
        _gemma4(
            "gemma-4-31b",
            "google/gemma-4-31B-it",
            # 60 layers, 50 sliding (16 KV heads x 256) + 10 full (4 KV heads x 512, assumed).
            num_layers=60,
            kv_shared_layers=0,
            heads=32,
            hidden=5376,
            attention=(_sliding(50, 16, 1024), _full(10, 4)),
            params=(
                ParamGroup("embedding", 262_144 * 5376, "tp", quantizable=False),
                ParamGroup("vision_encoder", 550_000_000, "replicated", quantizable=False),
                ParamGroup("transformer", 30_700_000_000 - 262_144 * 5376 - 550_000_000, "tp", quantizable=True),
            ),
            max_model_len=8192,
            max_num_seqs=128,
            max_positions=262_144,
            sources=(
                "30.7B parameters, 60 layers (5 sliding : 1 full), 32 heads, 16 KV heads, window 1024: model card",
                "v6e-4 minimum, 8192 context, 128 seqs: docs/reference/vllm.md §8.2",
            ),
        ),
        ModelPreset(
            name="tiny-llama",
            hub_id="tiny-llama",
            served_name="tiny-llama",
            architecture="LlamaForCausalLM",
            checkpoint_dtype="bfloat16",
            weight_dtypes=("bfloat16",),
            num_layers=2,
            kv_shared_layers=0,
            num_attention_heads=2,
            hidden_size=128,
            vocab_size=2048,
            max_position_embeddings=2048,
            attention=(AttentionGroup("full", 2, 2, 64),),
            params=(
                ParamGroup("embedding", 2048 * 128, "tp", quantizable=False),  # tied with the LM head
                # per layer: q,k,v,o 4 x 128 x 128 + MLP 3 x 128 x 256 + 2 norms x 128; plus the final norm
                ParamGroup("transformer", 2 * (4 * 128 * 128 + 3 * 128 * 256 + 2 * 128) + 128, "tp", True),
            ),
            default_max_model_len=512,
            default_max_num_seqs=256,
            default_max_num_batched_tokens=2048,
            sources=(
                "docs/reference/vllm.md §10.1: hidden 128, intermediate 256, 2 layers, 2 heads, head_dim 64, "
                "vocab 2048, tied, "
                "bfloat16, 590,464 parameters; KV heads 2 (scripts/make_tiny_model.py)",
            ),
        ),
    )
}

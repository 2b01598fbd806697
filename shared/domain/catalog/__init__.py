"""The serving catalog: model presets and accelerator slices as data, plus a config.json loader.

Names are exactly ``shared.domain.models.MODEL_PRESET_NAMES``; a test keeps the two in step.
"""

from shared.domain.catalog.accelerators import (
    ACCELERATORS,
    CPU_RUNTIME,
    AcceleratorSpec,
    InvalidAccelerator,
    KvHeadPolicy,
    RuntimeSpec,
    accelerator,
    chips_in_topology,
    parse_accelerator_type,
    parse_topology,
)
from shared.domain.catalog.hf_config import InvalidModelConfig, preset_from_config_json, preset_from_hf_config
from shared.domain.catalog.presets import (
    DTYPE_BYTES,
    PRESETS,
    AttentionGroup,
    ModelPreset,
    ParamGroup,
    WeightMeasurement,
)
from shared.domain.errors import PermanentError

__all__ = [
    "ACCELERATORS",
    "CPU_RUNTIME",
    "DTYPE_BYTES",
    "PRESETS",
    "AcceleratorSpec",
    "AttentionGroup",
    "InvalidAccelerator",
    "InvalidModelConfig",
    "KvHeadPolicy",
    "ModelPreset",
    "ParamGroup",
    "RuntimeSpec",
    "UnknownPreset",
    "WeightMeasurement",
    "accelerator",
    "chips_in_topology",
    "parse_accelerator_type",
    "parse_topology",
    "preset",
    "preset_from_config_json",
    "preset_from_hf_config",
]


class UnknownPreset(PermanentError):
    """A model name that is not in the catalog."""


def preset(name: str) -> ModelPreset:
    """The preset called ``name``, or an error listing the known ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise UnknownPreset(f"model: {name!r} is not a preset (use one of {', '.join(PRESETS)})") from None

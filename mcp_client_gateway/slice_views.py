"""The plan's view of a deployment's alternative slices (issue 21, item 5), apart from ``models.py`` (its size)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["AlternativeSliceView"]


class AlternativeSliceView(BaseModel):
    """A slice the search may widen to when the first is scarce (it fits the model at the same context)."""

    model_config = ConfigDict(extra="forbid")

    accelerator: str
    chips: int
    tensor_parallel_size: int = Field(description="vLLM's tensor parallel size on this slice (its serving config).")
    max_model_len: int

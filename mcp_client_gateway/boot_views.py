"""The boot view's stage times (issue 20, item 2), apart from ``models.py`` (its size)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["BootStagesView"]


class BootStagesView(BaseModel):
    """How long each finished boot stage took on the node's own clock, as its startup script reported it."""

    model_config = ConfigDict(extra="forbid")

    seconds: dict[str, float] = Field(
        description="Stage to seconds: image (the image pull), weights, engine (the vLLM container's start until "
        "/health answered 200: engine init and compilation together), first_token (the first one-token completion "
        "after health), compile_restore and compile_fill (the shared compile cache)."
    )
    weights_source: str | None = Field(
        default=None,
        description="cached (the boot disk had the weights), bucket (the region's weights cache), hub (downloaded) "
        "or mixed.",
    )
    weights_bytes: int | None = Field(default=None, description="The model's size on the boot disk, if known.")
    compile_cache: str | None = Field(
        default=None,
        description="warm (compiled artefacts of an earlier start were on the disk when the engine started) or cold.",
    )
    compile_restore: str | None = Field(
        default=None,
        description="The shared compile cache before the engine: hit (restored from the region's bucket), miss, "
        "refused (a bad entry), local (the disk had artefacts) or off.",
    )
    compile_fill: str | None = Field(
        default=None, description="A prewarm builder's fill: filled, present, empty, denied or off."
    )
    text: str = Field(
        description="For people, e.g. 'image 84 s, weights 337 s (hub, 58.3 GiB), engine 428 s (compile cache "
        "cold), first token 4 s'."
    )

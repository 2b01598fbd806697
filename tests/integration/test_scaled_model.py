"""The scaled-up copy of the tiny model (``ensure_tiny_model(hidden=, layers=)``) that the agreement benchmark serves.

It must keep the tiny model's tokenizer (so prompt lengths mean the same tokens) and scale every width with
``hidden``, with heads of 64 (the CPU attention kernel's sizes), and it must live beside the tiny model, not on it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from localcloud.vllm_cpu import MODEL_SCRIPT
from tests.support.vllm_server import (
    ensure_tiny_model,
    tiny_model_dir,
    vllm_python,
    vllm_tier_unavailable_reason,
)

pytestmark = [pytest.mark.vllm]


@pytest.fixture(autouse=True)
def _needs_vllm_venv() -> None:
    reason = vllm_tier_unavailable_reason()
    if reason:
        pytest.skip(reason)


def test_scaled_copy_keeps_the_tokenizer_and_scales_every_width(tmp_path: Path) -> None:
    scaled = ensure_tiny_model(tmp_path / "scaled", hidden=192, layers=3)
    tiny = ensure_tiny_model()

    config = json.loads((scaled / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"]) == (192, 3)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (3, 3, 64)
    assert config["intermediate_size"] == 384
    assert (scaled / "tokenizer.json").read_bytes() == (tiny / "tokenizer.json").read_bytes()


def test_the_default_place_of_a_scaled_copy_is_beside_the_tiny_model() -> None:
    scaled = ensure_tiny_model(hidden=192, layers=3)

    assert scaled.parent == tiny_model_dir().parent
    assert scaled != tiny_model_dir()
    assert json.loads((tiny_model_dir() / "config.json").read_text())["hidden_size"] == 128


def test_a_width_that_is_not_a_multiple_of_the_head_size_is_refused(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(vllm_python()), str(MODEL_SCRIPT), str(tmp_path / "bad"), "--hidden", "100"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert done.returncode == 2
    assert "--hidden must be a positive multiple of 64" in done.stderr
    assert not (tmp_path / "bad").exists()

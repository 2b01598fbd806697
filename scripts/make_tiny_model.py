"""Make the tiny random-weights Llama that the real-vLLM test tier serves (no downloads, same bytes every run).

Why: the integration tests need a real vLLM server, and a real server needs a model. A 590k-parameter Llama
with a locally trained BPE tokenizer loads in seconds on CPU, needs no model hub and no token, and exercises
the same HTTP, streaming and metrics code paths as Gemma on a TPU. Shapes follow docs/reference/vllm.md §10.1: hidden
128,
intermediate 256, 2 layers, 2 heads of head_dim 64 (CPU attention supports 32/64/80/96/112/128 only),
vocab 2048, tied embeddings, bfloat16.

Run it with the vLLM venv's Python (it has torch, transformers and tokenizers)::

    "$VLLM_VENV/bin/python" scripts/make_tiny_model.py OUT_DIR

The directory is written beside OUT_DIR under a temporary name and renamed at the end, so a reader never sees a
half-written model. An existing complete OUT_DIR is left alone unless ``--force`` is given.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import string
import sys
import tempfile
from pathlib import Path

SEED = 20261202
VOCAB_SIZE = 2048
HIDDEN_SIZE = 128
INTERMEDIATE_SIZE = 256
LAYERS = 2
HEAD_DIM = 64
MAX_POSITIONS = 2048

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
UNK, BOS, EOS, PAD = SPECIAL_TOKENS[:4]
ROLE_MARKERS = SPECIAL_TOKENS[4:]
# One line on purpose: a newline in the template would be a token the tiny tokenizer spends on layout.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['content'] is string %}{% set text = message['content'] %}"
    "{% else %}{% set text = message['content'] | map(attribute='text') | join(' ') %}{% endif %}"
    "{{ '<|' + message['role'] + '|>' + text + '<|end|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
COMPLETE_MARKER = "model.safetensors"


def corpus(seed: int, sentences: int = 6000) -> list[str]:
    """Pseudo-English sentences over printable ASCII, so generated text stays readable in logs."""
    rng = random.Random(seed)
    onsets = ["", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "st", "tr", "pl"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ea", "ou"]
    codas = ["", "", "n", "r", "s", "t", "l", "m", "nd", "rk"]
    words = [
        "".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas) for _ in range(rng.randint(1, 3)))
        for _ in range(900)
    ]
    punctuation = [".", ".", ".", "?", "!", ",", ";", ":"]
    lines = []
    for _ in range(sentences):
        picked = [rng.choice(words) for _ in range(rng.randint(4, 14))]
        picked[0] = picked[0].capitalize()
        if rng.random() < 0.2:
            picked.insert(rng.randrange(len(picked)), str(rng.randint(0, 9999)))
        lines.append(" ".join(picked) + rng.choice(punctuation))
    return lines


def build_tokenizer(seed: int) -> object:
    """A byte-free BPE over printable ASCII with a Metaspace pre-tokenizer (spaces become ``▁``)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.normalizer = normalizers.Replace("\n", " ")
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    alphabet = [*sorted(set(string.printable) - set(string.whitespace)), "▁"]
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=alphabet,
        min_frequency=2,
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=PAD,
        additional_special_tokens=list(ROLE_MARKERS),
        model_max_length=MAX_POSITIONS,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(seed: int, tokenizer: object, *, hidden: int = HIDDEN_SIZE, layers: int = LAYERS) -> object:
    """Random weights from a fixed seed: identical tensors, hence identical safetensors bytes, every run.

    ``hidden`` and ``layers`` scale the same shape up (heads of ``HEAD_DIM``, an MLP twice as wide as the model):
    a benchmark uses a larger copy so the server's TTFT is far above any client's own milliseconds.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=hidden,
        intermediate_size=INTERMEDIATE_SIZE * hidden // HIDDEN_SIZE,
        num_hidden_layers=layers,
        num_attention_heads=hidden // HEAD_DIM,
        num_key_value_heads=hidden // HEAD_DIM,
        head_dim=HEAD_DIM,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,  # type: ignore[attr-defined]
        eos_token_id=tokenizer.eos_token_id,  # type: ignore[attr-defined]
        pad_token_id=tokenizer.pad_token_id,  # type: ignore[attr-defined]
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.eval()
    return model


def write_model(
    out_dir: Path, *, seed: int = SEED, force: bool = False, hidden: int = HIDDEN_SIZE, layers: int = LAYERS
) -> Path:
    """Write the model, tokenizer and chat template to ``out_dir`` atomically; returns ``out_dir``."""
    if (out_dir / COMPLETE_MARKER).is_file() and not force:
        return out_dir
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        tokenizer = build_tokenizer(seed)
        model = build_model(seed, tokenizer, hidden=hidden, layers=layers)
        model.save_pretrained(staging, safe_serialization=True)  # type: ignore[attr-defined]
        tokenizer.save_pretrained(staging)  # type: ignore[attr-defined]
        (staging / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
        staging.chmod(0o755)  # mkdtemp makes it 0700; the model is not a secret
        for path in staging.iterdir():
            path.chmod(0o644)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out_dir", type=Path, help="Directory to write (created; replaced only with --force).")
    parser.add_argument("--seed", type=int, default=SEED, help="Seed for the corpus and the weights.")
    parser.add_argument("--force", action="store_true", help="Rewrite an existing model directory.")
    parser.add_argument("--hidden", type=int, default=HIDDEN_SIZE, help="Model width, a multiple of 64.")
    parser.add_argument("--layers", type=int, default=LAYERS, help="Decoder layers.")
    args = parser.parse_args(argv)
    if args.hidden <= 0 or args.hidden % HEAD_DIM or args.layers <= 0:
        parser.error(f"--hidden must be a positive multiple of {HEAD_DIM} and --layers positive")
    try:
        import tokenizers  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        print(f"make_tiny_model: {exc.name} is missing: run this with the vLLM venv's python", file=sys.stderr)
        return 2
    out = write_model(args.out_dir.resolve(), seed=args.seed, force=args.force, hidden=args.hidden, layers=args.layers)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

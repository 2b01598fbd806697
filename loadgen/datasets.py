"""Prompts for a benchmark: random text of an exact token length, or the prompts of a file.

Exact lengths need the model's tokenizer. In order of preference a prompt's tokens are counted by:

1. a local ``tokenizer.json`` read with the ``tokenizers`` library, when both are present (the TPU VM's HF
   cache has the file; the library is optional, not a dependency);
2. the server's own tokenizer through vLLM's ``POST /tokenize`` (``add_special_tokens: false``): calibrated
   against the server, exact for the served model;
3. the server's ``usage.prompt_tokens`` of a one-token completion, minus the special tokens the server adds
   (measured once): any OpenAI-compatible server.

A random prompt is ``input_len`` seeded words drawn from words the tokenizer shows to be one token each (one
count per prompt verifies it); failing that, from seeded pseudo-words: a first guess from the measured tokens
per word, a search on the word count, then single-letter words to close the last gap. As in ``vllm bench
serve`` the length is that of the prompt text; the server's ``usage.prompt_tokens`` (recorded per request)
adds BOS and any chat template. Every random prompt of a run is distinct, so vLLM's prefix cache cannot make
later levels look faster; the workloads that share text on purpose are built in ``loadgen.workloads``.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx

from shared.domain.errors import PermanentError

__all__ = [
    "DatasetError",
    "LocalTokenizer",
    "Prompt",
    "PromptSet",
    "ServerTokenCounter",
    "TokenCounter",
    "UsageTokenCounter",
    "WhitespaceTokenCounter",
    "find_tokenizer_file",
    "measure_prompts",
    "random_prompts",
    "read_prompt_file",
    "sized_prompts",
]

_SYLLABLES = tuple(c + v for c in "bdfgklmnprstvz" for v in "aeiou")
_FILLER = (" a", " e", " i", " o", " u", " x", " y", " q")
_MAX_ROUNDS = 12
MAX_PROMPT_FILE_BYTES = 64 * 1024 * 1024


class DatasetError(PermanentError):
    """A dataset that cannot be built as asked; the message names the field and the fix."""


@dataclass(frozen=True, slots=True)
class Prompt:
    """One request's input: the text, its length in tokens, and the output length to ask for."""

    text: str
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class PromptSet:
    """Prompts plus how their lengths were established."""

    prompts: tuple[Prompt, ...]
    kind: str
    """``random`` or ``prompts``."""
    token_source: str
    """``local tokenizer``, ``server /tokenize``, ``server usage`` or ``words`` (no tokenizer: an estimate)."""
    exact: bool
    """True when every random prompt has exactly the asked input length."""

    def describe(self) -> dict[str, Any]:
        lengths = [prompt.prompt_tokens for prompt in self.prompts] or [0]
        return {
            "kind": self.kind,
            "token_source": self.token_source,
            "exact_input_len": self.exact,
            "prompts": len(self.prompts),
            "input_tokens_mean": round(sum(lengths) / len(lengths), 2),
            "input_tokens_min": min(lengths),
            "input_tokens_max": max(lengths),
        }


class TokenCounter(Protocol):
    """Counts the tokens of texts with the served model's tokenizer (no special tokens)."""

    @property
    def source(self) -> str: ...

    async def count(self, text: str) -> int: ...


class WhitespaceTokenCounter:
    """Words as tokens: what the calibration stub does, and the last resort without any tokenizer."""

    source = "words"

    async def count(self, text: str) -> int:
        return len(text.split())


class LocalTokenizer:
    """A ``tokenizer.json`` read with the optional ``tokenizers`` library."""

    source = "local tokenizer"

    def __init__(self, path: Path) -> None:
        try:
            from tokenizers import Tokenizer  # optional: present where vLLM or transformers is installed
        except ImportError as exc:
            raise DatasetError(
                "tokenizer: the 'tokenizers' library is not installed (pip install tokenizers, or let the server count)"
            ) from exc
        self.path = path
        self._tokenizer = Tokenizer.from_file(str(path))

    async def count(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)


class ServerTokenCounter:
    """vLLM's ``POST /tokenize`` on the benchmarked server."""

    source = "server /tokenize"

    def __init__(self, client: httpx.AsyncClient, model: str, *, parallel: int = 16) -> None:
        self._client = client
        self._model = model
        self._slots = asyncio.Semaphore(parallel)

    async def count(self, text: str) -> int:
        async with self._slots:
            response = await self._client.post(
                "/tokenize", json={"model": self._model, "prompt": text, "add_special_tokens": False}
            )
        if response.status_code != 200:
            raise DatasetError(f"tokenizer: POST /tokenize answered {response.status_code}: {response.text[:200]}")
        count = response.json().get("count")
        if not isinstance(count, int):
            raise DatasetError("tokenizer: POST /tokenize returned no integer 'count'")
        return count

    async def available(self) -> bool:
        """True when the server has a usable ``/tokenize``."""
        try:
            return await self.count("hello") > 0
        except (DatasetError, httpx.HTTPError, ValueError):
            return False


class UsageTokenCounter:
    """``usage.prompt_tokens`` of a one-token completion, less the special tokens the server adds."""

    source = "server usage"

    def __init__(self, client: httpx.AsyncClient, model: str, *, parallel: int = 8) -> None:
        self._client = client
        self._model = model
        self._slots = asyncio.Semaphore(parallel)
        self._overhead: int | None = None

    async def _usage(self, text: str) -> int:
        async with self._slots:
            response = await self._client.post(
                "/v1/completions", json={"model": self._model, "prompt": text, "max_tokens": 1}
            )
        if response.status_code != 200:
            raise DatasetError(f"tokenizer: a calibration completion answered {response.status_code}")
        tokens = (response.json().get("usage") or {}).get("prompt_tokens")
        if not isinstance(tokens, int):
            raise DatasetError("tokenizer: the server reports no usage.prompt_tokens; give a prompt file instead")
        return tokens

    async def count(self, text: str) -> int:
        if self._overhead is None:
            two, four = await self._usage("a a"), await self._usage("a a a a")
            self._overhead = max(0, 2 * two - four)  # tokens(n words) = overhead + n * per_word
        return await self._usage(text) - self._overhead


def find_tokenizer_file(*places: Path) -> Path | None:
    """The first ``tokenizer.json`` in the given model folders or HF caches (snapshots searched), if any."""
    for place in places:
        if place.is_file() and place.name == "tokenizer.json":
            return place
        direct = place / "tokenizer.json"
        if direct.is_file():
            return direct
        if place.is_dir():
            found = sorted(place.glob("**/snapshots/*/tokenizer.json"))
            if found:
                return found[-1]
    return None


class _Words:
    """The seeded pseudo-word sequence of one prompt, grown on demand."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self._words: list[str] = []

    def text(self, count: int) -> str:
        while len(self._words) < count:
            syllables = self._rng.randint(1, 3)
            self._words.append("".join(self._rng.choice(_SYLLABLES) for _ in range(syllables)))
        return " ".join(self._words[:count])


async def _exact_prompt(counter: TokenCounter, seed: int, target: int, per_word: float) -> tuple[str, int]:
    """Search the word count, then pad with one-letter words; returns the closest text and its length."""
    words = _Words(seed)
    low, high = 1, max(2, int(target / max(per_word, 0.05)) * 4 + 8)
    guess = max(1, min(high - 1, round(target / max(per_word, 0.05))))
    best_under: tuple[int, int] | None = None  # (words, tokens) with tokens <= target
    closest: tuple[str, int] | None = None
    for _ in range(_MAX_ROUNDS):
        text = words.text(guess)
        tokens = await counter.count(text)
        if closest is None or abs(tokens - target) < abs(closest[1] - target):
            closest = (text, tokens)
        if tokens == target:
            return text, tokens
        if tokens < target:
            if best_under is None or tokens > best_under[1] or (tokens == best_under[1] and guess > best_under[0]):
                best_under = (guess, tokens)
            low = guess + 1
        else:
            high = guess - 1
        if low > high:
            break
        step = round((target - tokens) / max(per_word, 0.05))
        guess = min(high, max(low, guess + (step if step else (1 if tokens < target else -1))))
    assert closest is not None
    if best_under is not None:  # close the gap with repeats of a one-letter word that is one token here
        count, base = best_under
        base_text = words.text(count)
        for piece in _FILLER:
            repeats = target - base
            for _ in range(4):
                text = base_text + piece * repeats
                tokens = await counter.count(text)
                if abs(tokens - target) < abs(closest[1] - target):
                    closest = (text, tokens)
                if tokens == target:
                    return text, tokens
                per_piece = (tokens - base) / repeats
                better = round((target - base) / per_piece) if per_piece > 0 else 0
                if better < 1 or better == repeats:
                    break
                repeats = better
    assert closest is not None
    return closest


async def _single_token_words(counter: TokenCounter, seed: int, parallel: int) -> list[str]:
    """Words that are one token each and stay one token each side by side (checked on a 64-word sample)."""
    candidates = sorted(set(_Words(seed ^ 0xC0FFEE).text(160).split()) | {piece.strip() for piece in _FILLER})
    slots = asyncio.Semaphore(parallel)

    async def single(word: str) -> bool:
        async with slots:
            return await counter.count(word) == 1

    verdicts = await asyncio.gather(*(single(word) for word in candidates))
    singles = [word for word, ok in zip(candidates, verdicts, strict=True) if ok]
    if len(singles) < 4:
        return []
    rng = random.Random(seed)
    sample = " ".join(rng.choice(singles) for _ in range(64))
    return singles if await counter.count(sample) == 64 else []


async def random_prompts(
    counter: TokenCounter,
    *,
    count: int,
    input_len: int,
    output_len: int,
    seed: int,
    parallel: int = 16,
) -> PromptSet:
    """``count`` distinct prompts of exactly ``input_len`` tokens (closest found when the tokenizer cannot)."""
    if count < 1 or input_len < 1 or output_len < 1:
        raise DatasetError("count, input_len, output_len: each must be >= 1")
    prompts = await sized_prompts(counter, [(input_len, output_len)] * count, seed=seed, parallel=parallel)
    exact = all(prompt.prompt_tokens == input_len for prompt in prompts)
    return PromptSet(prompts, kind="random", token_source=counter.source, exact=exact)


async def sized_prompts(
    counter: TokenCounter, sizes: Sequence[tuple[int, int]], *, seed: int, parallel: int = 16
) -> tuple[Prompt, ...]:
    """One distinct prompt per ``(input_len, output_len)`` of ``sizes``, each of exactly ``input_len`` tokens
    (closest found when the tokenizer cannot).

    Fast path: ``input_len`` words drawn from words that are one token each, one count per prompt to verify;
    a prompt that does not come out exact (and every prompt, without such words) gets the search.
    """
    if any(input_len < 1 or output_len < 1 for input_len, output_len in sizes):
        raise DatasetError("input_len, output_len: each must be >= 1")
    slots = asyncio.Semaphore(parallel)
    singles = await _single_token_words(counter, seed, parallel)
    per_word = max(0.05, await counter.count(_Words(seed ^ 0x5EED).text(64)) / 64)

    async def one(index: int, input_len: int, output_len: int) -> Prompt:
        async with slots:
            if singles:
                rng = random.Random(seed * 1_000_003 + index)
                text = " ".join(rng.choice(singles) for _ in range(input_len))
                if await counter.count(text) == input_len:
                    return Prompt(text=text, prompt_tokens=input_len, output_tokens=output_len)
            text, tokens = await _exact_prompt(counter, seed * 1_000_003 + index, input_len, per_word)
        return Prompt(text=text, prompt_tokens=tokens, output_tokens=output_len)

    return tuple(await asyncio.gather(*(one(index, *size) for index, size in enumerate(sizes))))


def read_prompt_file(path: Path) -> list[tuple[str, int | None]]:
    """Prompts from a text file (one per line) or JSON Lines (``{"prompt": ..., "output_tokens": N}``)."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise DatasetError(f"prompt_file: cannot read {path}: {exc.strerror}") from exc
    if size > MAX_PROMPT_FILE_BYTES:
        raise DatasetError(f"prompt_file: {path} is {size} bytes, over the {MAX_PROMPT_FILE_BYTES}-byte limit")
    entries: list[tuple[str, int | None]] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            try:
                item = json.loads(line)
            except ValueError:
                raise DatasetError(
                    f"prompt_file: line {number} of {path} is not JSON (use one object per line)"
                ) from None
            prompt = item.get("prompt") if isinstance(item, dict) else None
            if not isinstance(prompt, str) or not prompt.strip():
                raise DatasetError(f"prompt_file: line {number} of {path} has no non-empty string 'prompt'")
            output = item.get("output_tokens")
            if output is not None and (not isinstance(output, int) or output < 1):
                raise DatasetError(f"prompt_file: line {number} 'output_tokens' must be a positive integer")
            entries.append((prompt, output))
        else:
            entries.append((line, None))
    if not entries:
        raise DatasetError(f"prompt_file: {path} holds no prompts")
    return entries


async def measure_prompts(
    entries: Sequence[tuple[str, int | None]],
    counter: TokenCounter,
    *,
    count: int,
    output_len: int,
    parallel: int = 16,
) -> PromptSet:
    """``count`` prompts taken from ``entries`` in order (cycled), with their measured token lengths."""
    if not entries:
        raise DatasetError("prompts: give at least one prompt")
    slots = asyncio.Semaphore(parallel)
    lengths: dict[int, int] = {}

    async def measure(index: int) -> None:
        async with slots:
            lengths[index] = await counter.count(entries[index][0])

    await asyncio.gather(*(measure(index) for index in range(min(count, len(entries)))))
    prompts = tuple(
        Prompt(
            text=entries[i % len(entries)][0],
            prompt_tokens=lengths[i % len(entries)],
            output_tokens=entries[i % len(entries)][1] or output_len,
        )
        for i in range(count)
    )
    return PromptSet(prompts, kind="prompts", token_source=counter.source, exact=False)

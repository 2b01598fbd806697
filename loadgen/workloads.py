"""Workloads beyond distinct random prompts: shared prefix, multi-turn sessions and trace replay (issue 22).

``BenchmarkRequest.workload`` picks one:

- ``random`` (the default): distinct prompts of exactly ``input_len`` tokens (``loadgen.datasets``); nothing for
  vLLM's prefix cache to reuse.

Texts are seeded per run (``text_seed``: the request's seed and a salt the generator draws for each run), so a run's
prompts are never in the server's cache from an earlier run with the same seed; the request's seed alone fixes the
rest (which requests carry the prefix, the arrivals), and so the expectation below.
- ``shared_prefix``: one common prefix of ``prefix_len`` tokens; a seeded ``prefix_share`` of the requests (exact
  per block: warm-up, then each level) start with it, followed by ``input_len - prefix_len`` tokens of their own;
  the others are distinct prompts of ``input_len``. The prefix cache serves the prefix from its second request on.
- ``multi_turn``: sessions of ``turns`` requests sent in order, each after the previous answer arrived; a turn's
  prompt is the session's history (every earlier prompt and answer) and ``input_len`` tokens of new user text
  (completions: the texts joined; chat: the messages). A level sends ``num_prompts`` requests, sessions of
  ``turns`` (the last one shorter when ``num_prompts`` is not a multiple); concurrency N runs N sessions at once,
  a rate R starts sessions at R per second.
- ``trace``: the requests of a trace replayed once, each at its ``timestamp`` (seconds, relative to the first),
  with a distinct prompt of its ``input_len`` and its ``output_len``; ``max_concurrency`` caps requests in flight.

The trace format (:func:`read_trace_file`) is JSON Lines, one request per line, in arrival order::

    {"timestamp": 0.0, "input_len": 512, "output_len": 128}
    {"timestamp": 0.35, "input_len": 1024, "output_len": 64}

``timestamp`` is seconds (a number >= 0, never earlier than the line before; only differences matter),
``input_len`` and ``output_len`` are positive integers of tokens. Other fields are ignored (real traces carry
ids and hashes), blank lines are skipped, and any bad line is refused naming its line and field.

What the client expects the prefix cache to serve (:func:`expected_cached_tokens`): a request whose first tokens
were sent before (the shared prefix from its second carrier on, with the first words of its own text when an earlier
carrier's began with the same words, as random one-token words sometimes do; a turn's previous prompt) can have
those tokens served from the cache, in whole KV blocks, and never its last token (vLLM recomputes it for the
logits).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from loadgen.datasets import (
    MAX_PROMPT_FILE_BYTES,
    DatasetError,
    Prompt,
    TokenCounter,
    measure_prompts,
    random_prompts,
    sized_prompts,
)
from shared.messages import BenchmarkRequest, TraceRequest

__all__ = [
    "TRACE_FIELDS",
    "Session",
    "TraceError",
    "WorkItem",
    "Workload",
    "arrival_offsets",
    "build_workload",
    "expected_cached_tokens",
    "parse_trace",
    "read_trace_file",
    "session_turns",
    "trace_offsets",
]

TRACE_FIELDS = ("timestamp", "input_len", "output_len")
_PREFIX_SEED = 0x5A4ED
_OTHER_SEED = 0x07E5


class TraceError(DatasetError):
    """A trace file that cannot be replayed; the message names the line, the field and the fix."""


# --- trace files ------------------------------------------------------------------------------------------------


def parse_trace(lines: Iterable[str], source: str = "trace") -> tuple[TraceRequest, ...]:
    """The requests of a JSON Lines trace (see the module docstring); raises :class:`TraceError` on bad input."""
    entries: list[TraceRequest] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"trace_file: line {number} of {source}"
        try:
            item = json.loads(line)
        except ValueError:
            raise TraceError(f"{where} is not JSON (one object per line with {_fields()})") from None
        if not isinstance(item, dict):
            raise TraceError(f"{where} is not a JSON object (one object per line with {_fields()})")
        entry = _trace_entry(item, where)
        if entries and entry.timestamp < entries[-1].timestamp:
            raise TraceError(
                f"{where}: 'timestamp' {entry.timestamp:g} is earlier than the line before "
                f"({entries[-1].timestamp:g}); sort the trace by timestamp"
            )
        entries.append(entry)
    if not entries:
        raise TraceError(f"trace_file: {source} holds no requests (one JSON object per line with {_fields()})")
    return tuple(entries)


_LIMITS = {"timestamp": "0 to 1e10 seconds", "input_len": "1 to 131072 tokens", "output_len": "1 to 32768 tokens"}


def _trace_entry(item: dict[str, Any], where: str) -> TraceRequest:
    values: dict[str, Any] = {}
    for name in TRACE_FIELDS:
        if name not in item:
            raise TraceError(f"{where} has no '{name}' (each line needs {_fields()})")
        value = item[name]
        number = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if name == "timestamp" and not number:
            raise TraceError(f"{where}: 'timestamp' must be a number of seconds (got {json.dumps(value)[:40]})")
        if name != "timestamp" and not (number and float(value).is_integer()):
            raise TraceError(f"{where}: '{name}' must be a whole number of tokens (got {json.dumps(value)[:40]})")
        values[name] = value if name == "timestamp" else int(value)
    try:
        return TraceRequest.model_validate(values)
    except ValidationError as exc:
        name = str(exc.errors()[0]["loc"][0])
        raise TraceError(f"{where}: '{name}' {values.get(name)!r} is out of range ({_LIMITS.get(name, '?')})") from None


def _fields() -> str:
    return ", ".join(TRACE_FIELDS)


def read_trace_file(path: Path) -> tuple[TraceRequest, ...]:
    """The requests of a JSON Lines trace file (see the module docstring)."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise TraceError(f"trace_file: cannot read {path}: {exc.strerror}") from exc
    if size > MAX_PROMPT_FILE_BYTES:
        raise TraceError(f"trace_file: {path} is {size} bytes, over the {MAX_PROMPT_FILE_BYTES}-byte limit")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise TraceError(f"trace_file: {path} is not UTF-8 text (JSON Lines)") from None
    return parse_trace(text.splitlines(), str(path))


def trace_offsets(trace: Sequence[TraceRequest]) -> list[float]:
    """Each request's arrival in seconds after the trace's first."""
    if not trace:
        return []
    first = trace[0].timestamp
    return [max(0.0, entry.timestamp - first) for entry in trace]


def arrival_offsets(count: int, rate: float, arrival: Literal["poisson", "constant"], seed: int) -> list[float]:
    """Arrival times (seconds from the level's start) of ``count`` requests at ``rate`` per second: Poisson
    (exponential gaps, seeded) or evenly spaced. The first arrives at once."""
    if rate <= 0:
        raise ValueError(f"rate: {rate} must be > 0")
    rng = random.Random(seed)
    offsets: list[float] = []
    due = 0.0
    for index in range(count):
        if index:
            due += rng.expovariate(rate) if arrival == "poisson" else 1.0 / rate
        offsets.append(due)
    return offsets


# --- the workload ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkItem:
    """One prepared request: its prompt and how many of its first tokens an earlier request of the run sent."""

    prompt: Prompt
    reused_tokens: int = 0
    """Tokens of the prompt's text (no special tokens) that an earlier request began with; 0 for the first."""


@dataclass(frozen=True, slots=True)
class Session:
    """One multi-turn session: the new user text of each turn, in order."""

    turns: tuple[Prompt, ...]


@dataclass
class Workload:
    """Everything a run sends: warm-up items, then per level either items or sessions."""

    kind: str
    warm: list[WorkItem]
    levels: list[list[WorkItem]] = field(default_factory=list)
    sessions: list[list[Session]] = field(default_factory=list)
    token_source: str = ""
    exact: bool = False
    details: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        """The result's ``dataset``: the prompts built and how their lengths were established."""
        prompts = [item.prompt for item in self.warm]
        prompts += [item.prompt for level in self.levels for item in level]
        prompts += [turn for level in self.sessions for session in level for turn in session.turns]
        lengths = [prompt.prompt_tokens for prompt in prompts] or [0]
        return {
            "kind": self.kind,
            "token_source": self.token_source,
            "exact_input_len": self.exact,
            "prompts": len(prompts),
            "input_tokens_mean": round(sum(lengths) / len(lengths), 2),
            "input_tokens_min": min(lengths),
            "input_tokens_max": max(lengths),
            **self.details,
        }


def session_turns(num_prompts: int, turns: int) -> list[int]:
    """Turns of each session of one level: ``num_prompts`` requests in sessions of ``turns``, the last shorter."""
    full, rest = divmod(num_prompts, turns)
    return [turns] * full + ([rest] if rest else [])


async def build_workload(
    counter: TokenCounter,
    request: BenchmarkRequest,
    entries: Sequence[tuple[str, int | None]],
    levels: int,
    *,
    text_seed: int,
) -> Workload:
    """The prompts of a whole run (warm-up, then each level) for ``request.workload``; ``text_seed`` seeds the
    texts (``request.seed`` the rest: which requests carry the prefix, arrivals)."""
    warmup, per_level = request.warmup_requests, request.num_prompts
    if request.workload == "shared_prefix":
        return await _shared_prefix(counter, request, [warmup] + [per_level] * levels, text_seed)
    if request.workload == "multi_turn":
        return await _multi_turn(counter, request, levels, text_seed)
    if request.workload == "trace":
        return await _trace(counter, request, text_seed)
    count = warmup + per_level * levels
    if request.dataset == "prompts":
        prompt_set = await measure_prompts(entries, counter, count=count, output_len=request.output_len)
    else:
        prompt_set = await random_prompts(
            counter, count=count, input_len=request.input_len, output_len=request.output_len, seed=text_seed
        )
    items = [WorkItem(prompt) for prompt in prompt_set.prompts]
    return Workload(
        kind=prompt_set.kind,
        warm=items[:warmup],
        levels=[items[warmup + n * per_level : warmup + (n + 1) * per_level] for n in range(levels)],
        token_source=prompt_set.token_source,
        exact=prompt_set.exact,
    )


async def _shared_prefix(
    counter: TokenCounter, request: BenchmarkRequest, blocks: list[int], text_seed: int
) -> Workload:
    """Blocks (warm-up, then each level) where a seeded, exact share of the requests carries the prefix."""
    rng = random.Random(request.seed ^ _PREFIX_SEED)
    carriers = [set(rng.sample(range(size), round(request.prefix_share * size))) for size in blocks]
    carrying = sum(len(chosen) for chosen in carriers)
    own = sum(blocks) - carrying
    suffix_len = request.input_len - request.prefix_len
    sizes = [(request.prefix_len, request.output_len)]
    sizes += [(suffix_len, request.output_len)] * carrying
    sizes += [(request.input_len, request.output_len)] * own
    built = await sized_prompts(counter, sizes, seed=text_seed)
    prefix, suffixes, others = built[0], list(built[1 : 1 + carrying]), list(built[1 + carrying :])
    plan: list[list[Prompt | None]] = []  # per block: a carrier's suffix, or None for a prompt of its own
    for size, chosen in zip(blocks, carriers, strict=True):
        plan.append([suffixes.pop() if index in chosen else None for index in range(size)])
    texts = [f"{prefix.text} {suffix.text}" for block in plan for suffix in block if suffix is not None]
    counts = iter(await asyncio.gather(*(counter.count(text) for text in texts)))
    overlap = _LeadingWords()
    seen = False
    grouped: list[list[WorkItem]] = []
    for block_plan in plan:
        block: list[WorkItem] = []
        for suffix in block_plan:
            if suffix is None:
                block.append(WorkItem(others.pop()))
                continue
            tokens = next(counts)
            # where every word is one token, suffixes that happen to begin alike share those tokens too
            words = suffix.text.split()
            alike = tokens == prefix.prompt_tokens + suffix.prompt_tokens == prefix.prompt_tokens + len(words)
            shared = prefix.prompt_tokens + (overlap.add(words) if alike else 0)
            prompt = Prompt(f"{prefix.text} {suffix.text}", tokens, request.output_len)
            block.append(WorkItem(prompt, shared if seen else 0))
            seen = True
        grouped.append(block)
    exact = prefix.prompt_tokens == request.prefix_len and all(
        item.prompt.prompt_tokens == request.input_len for block in grouped for item in block
    )
    return Workload(
        kind="shared_prefix",
        warm=grouped[0],
        levels=grouped[1:],
        token_source=counter.source,
        exact=exact,
        details={"prefix_tokens": prefix.prompt_tokens, "prefix_share": request.prefix_share},
    )


class _LeadingWords:
    """How many leading words (up to ``cap``) a word sequence shares with one added before."""

    def __init__(self, cap: int = 16) -> None:
        self.cap = cap
        self.seen: set[tuple[str, ...]] = set()

    def add(self, words: Sequence[str]) -> int:
        heads = [tuple(words[:length]) for length in range(1, min(self.cap, len(words)) + 1)]
        shared = next((len(head) - 1 for head in heads if head not in self.seen), len(heads))
        self.seen.update(heads)
        return shared


async def _multi_turn(counter: TokenCounter, request: BenchmarkRequest, levels: int, text_seed: int) -> Workload:
    plan = session_turns(request.num_prompts, request.turns)
    sizes = [(request.input_len, request.output_len)] * (request.warmup_requests + request.num_prompts * levels)
    built = list(await sized_prompts(counter, sizes, seed=text_seed))
    warm = [WorkItem(prompt) for prompt in built[: request.warmup_requests]]
    texts = built[request.warmup_requests :]
    sessions: list[list[Session]] = []
    for _ in range(levels):
        level: list[Session] = []
        for turns in plan:
            level.append(Session(tuple(texts[:turns])))
            texts = texts[turns:]
        sessions.append(level)
    return Workload(
        kind="multi_turn",
        warm=warm,
        sessions=sessions,
        token_source=counter.source,
        exact=all(prompt.prompt_tokens == request.input_len for prompt in built),
        details={"turns": request.turns, "sessions_per_level": len(plan)},
    )


async def _trace(counter: TokenCounter, request: BenchmarkRequest, text_seed: int) -> Workload:
    first = request.trace[0]
    sizes = [(first.input_len, first.output_len)] * request.warmup_requests
    sizes += [(entry.input_len, entry.output_len) for entry in request.trace]
    built = await sized_prompts(counter, sizes, seed=text_seed)
    items = [WorkItem(prompt) for prompt in built]
    wanted = [size[0] for size in sizes]
    span = request.trace_span_s()
    return Workload(
        kind="trace",
        warm=items[: request.warmup_requests],
        levels=[items[request.warmup_requests :]],
        token_source=counter.source,
        exact=all(prompt.prompt_tokens == length for prompt, length in zip(built, wanted, strict=True)),
        details={"trace_requests": len(request.trace), "trace_span_s": round(span, 3)},
    )


# --- what the prefix cache should serve ----------------------------------------------------------------------------


def expected_cached_tokens(reused_tokens: int, prompt_tokens: int, block_size: int | None) -> int:
    """Tokens of a ``prompt_tokens`` prompt (as the server counts them) the prefix cache can serve when its first
    ``reused_tokens`` were sent before: whole blocks of ``block_size`` (unknown: not rounded), never the last token."""
    if reused_tokens <= 0 or prompt_tokens <= 1:
        return 0
    usable = min(reused_tokens, prompt_tokens - 1)
    if not block_size or block_size < 1:
        return usable
    return math.floor(usable / block_size) * block_size

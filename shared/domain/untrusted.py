"""What a TPU VM reports about itself, cleaned before the controller keeps it or shows it.

Why: the VM runs vLLM, a network server that parses untrusted prompts, so assume it can be taken over. What its
node agent sends (``node.booted`` system details, ``benchmark.completed`` results, ``node.task_completed`` log
lines) reaches people's terminals and, through MCP tool results, a model. Verbatim, it could carry terminal escapes,
bidi overrides that reorder what a reader sees, invisible characters, 20,000-character fields or text addressed to
the model ("call tpu_control ...").

The rules (pure: no I/O):

* **Only known keys.** Each kind has an explicit schema (:data:`NODE_SYSTEM`, :data:`BENCHMARK_RESULT`) written
  from what the agent produces (``node_agent.system_info``, ``loadgen.generator``/``metrics``/``datasets``,
  ``node_agent._node_summary``/``shrink_result``). Unknown keys, values of the wrong type and list items past the
  bound are dropped and counted; the count is kept with the data under :data:`DROPPED_KEY` so a view can say
  "n fields dropped". A dropped key is never echoed back.
* **Scalars only,** except where the schema nests (a result's points: a list of records of known numeric keys).
* **Strings** lose ANSI/VT escape sequences, C0/C1 control characters (tabs and line breaks become spaces),
  format characters (bidi embeddings, overrides, isolates and marks, zero-width characters, word joiner, BOM, tag
  characters), variation selectors, lone surrogates and invisible fillers; runs of spaces collapse (log lines keep
  theirs); an optional ``redact`` hook then runs (secrets); the result is cut to the field's bound with ``…``.
* **Numbers** are finite and within the field's bounds (``bool`` is never a number); ``None`` stays ``None``.

Ingestion (:func:`clean_node_system`, :func:`clean_benchmark_result`) takes raw node data; the views
(:func:`node_system_view`, :func:`benchmark_result_view`) take stored data, are idempotent on it (cleaning it again
changes nothing, the stored count included) and so may re-clean whatever they read, records stored before this
module existed included.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "BENCHMARK_REQUEST_KEYS",
    "BENCHMARK_RESULT",
    "CONTROLLER_RESULT_KEYS",
    "DROPPED_KEY",
    "NODE_SUMMARY",
    "NODE_SYSTEM",
    "SYSTEM_TEXT_CHARS",
    "Choice",
    "Cleaned",
    "Counts",
    "Either",
    "Flag",
    "Items",
    "Number",
    "Record",
    "Text",
    "benchmark_result_view",
    "clean_benchmark_result",
    "clean_node_system",
    "clean_record",
    "clean_text",
    "node_system_view",
]

DROPPED_KEY = "fields_dropped"
"""Where stored node-reported data keeps how many fields cleaning dropped (absent when none)."""
CONTROLLER_RESULT_KEYS = frozenset({"event_id", "comparison", "comparison_table", "economics", "tune", "preset"})
"""Keys of a stored benchmark result that the controller writes itself (never taken from the node; a tune's ``tune``
is the node's section as ``shared.domain.autotune.check_tune_result`` checked and recomputed it)."""
SYSTEM_TEXT_CHARS = 200
"""Bound of every text field of the node's system details."""

Redact = Callable[[str], str]

# --- text -----------------------------------------------------------------------------------------------------

_ESCAPES = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"  # CSI (ESC [ or the 8-bit CSI), e.g. colours, cursor moves
    r"|(?:\x1b\]|\x9d)[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # OSC, e.g. window titles, hyperlinks
    r"|(?:\x1b[PX^_]|[\x90\x98\x9e\x9f])[^\x1b\x9c]*(?:\x1b\\|\x9c)?"  # DCS, SOS, PM, APC strings
    r"|\x1b[ -/]*[0-~]"  # the other escapes (two characters, or with intermediates)
)
_SPACES = frozenset("\t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\u2028\u2029")
_INVISIBLE = frozenset("\u115f\u1160\u3164\uffa0\u034f")  # Hangul fillers, combining grapheme joiner
_DROPPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs"})  # controls; format (bidi, zero-width, tags); surrogates


def _keep(char: str) -> bool:
    code = ord(char)
    if code < 0x7F:
        return code >= 0x20
    if 0xFE00 <= code <= 0xFE0F or 0xE0100 <= code <= 0xE01EF:  # variation selectors (used to hide text)
        return False
    return char not in _INVISIBLE and unicodedata.category(char) not in _DROPPED_CATEGORIES


def clean_text(text: str, limit: int, *, collapse: bool = True, redact: Redact | None = None) -> str:
    """``text`` made safe to store and show (see the module docstring), at most ``limit`` characters.

    ``collapse`` joins runs of whitespace into one space and trims the ends (fields); without it spacing is kept
    (log lines). ``redact`` runs on the cleaned text before it is cut, so a secret split by invisible characters is
    still found and a redaction never pushes the text past its bound.
    """
    if limit < 1:
        return ""
    cleaned = _ESCAPES.sub("", text)
    cleaned = "".join(" " if char in _SPACES else char for char in cleaned if char in _SPACES or _keep(char))
    if collapse:
        cleaned = " ".join(cleaned.split())
    if redact is not None:
        cleaned = redact(cleaned)
    if len(cleaned) > limit:
        return cleaned[: limit - 1] + "…"
    return cleaned


# --- schema ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Text:
    """A string, cleaned and cut to ``max_chars``."""

    max_chars: int = SYSTEM_TEXT_CHARS


@dataclass(frozen=True)
class Number:
    """A finite number within ``[low, high]``; ``integer`` takes whole numbers only (and stores them as int)."""

    low: float = 0.0
    high: float = 1e12
    integer: bool = False


@dataclass(frozen=True)
class Flag:
    """``true`` or ``false``."""


@dataclass(frozen=True)
class Choice:
    """One of a few known words, exactly."""

    options: frozenset[str]


@dataclass(frozen=True)
class Items:
    """A list of at most ``max_items`` values of one kind."""

    item: Spec
    max_items: int


@dataclass(frozen=True)
class Counts:
    """A small map of short labels (failure causes such as ``http_503``) to counts."""

    max_keys: int = 32
    value: Number = field(default_factory=lambda: Number(integer=True))


@dataclass(frozen=True)
class Either:
    """The first of ``options`` that takes the value."""

    options: tuple[Spec, ...]


@dataclass(frozen=True)
class Record:
    """A map of known keys; ``patterns`` admit families of keys (``p99_ttft_ms``), at most ``max_pattern_keys``."""

    fields: Mapping[str, Spec]
    patterns: tuple[tuple[re.Pattern[str], Spec], ...] = ()
    max_pattern_keys: int = 64


Spec = Text | Number | Flag | Choice | Items | Counts | Either | Record

_LABEL = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


class _Drop:
    """A value that did not fit its schema."""


_DROP = _Drop()


@dataclass(frozen=True)
class Cleaned:
    """Cleaned data and how many fields (keys, values, list items) were dropped on the way."""

    data: dict[str, Any]
    dropped: int


def _clean(value: Any, spec: Spec, redact: Redact | None) -> tuple[Any, int]:
    """(cleaned value or _DROP, fields dropped inside it); ``None`` is kept wherever a value may be."""
    if value is None:
        return None, 0
    if isinstance(spec, Text):
        return (clean_text(value, spec.max_chars, redact=redact), 0) if isinstance(value, str) else (_DROP, 1)
    if isinstance(spec, Number):
        return _number(value, spec)
    if isinstance(spec, Flag):
        return (value, 0) if isinstance(value, bool) else (_DROP, 1)
    if isinstance(spec, Choice):
        return (value, 0) if isinstance(value, str) and value in spec.options else (_DROP, 1)
    if isinstance(spec, Items):
        if not isinstance(value, list | tuple):
            return _DROP, 1
        items, dropped = [], max(0, len(value) - spec.max_items)
        for item in value[: spec.max_items]:
            cleaned, inner = _clean(item, spec.item, redact)
            dropped += inner
            if cleaned is not _DROP:
                items.append(cleaned)
        return items, dropped
    if isinstance(spec, Counts):
        if not isinstance(value, Mapping):
            return _DROP, 1
        counts: dict[str, Any] = {}
        dropped = 0
        for key, count in value.items():
            number, inner = _number(count, spec.value)
            if not isinstance(key, str) or not _LABEL.fullmatch(key) or number is _DROP or len(counts) >= spec.max_keys:
                dropped += 1
                continue
            counts[key] = number
        return counts, dropped
    if isinstance(spec, Either):
        for option in spec.options:
            cleaned, inner = _clean(value, option, redact)
            if cleaned is not _DROP:
                return cleaned, inner
        return _DROP, 1
    if not isinstance(value, Mapping):
        return _DROP, 1
    record = clean_record(value, spec, redact=redact)
    return record.data, record.dropped


def _number(value: Any, spec: Number) -> tuple[Any, int]:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return _DROP, 1
    if isinstance(value, float) and not math.isfinite(value):
        return _DROP, 1
    if not spec.low <= value <= spec.high:
        return _DROP, 1
    if spec.integer:
        if isinstance(value, float) and not value.is_integer():
            return _DROP, 1
        return int(value), 0
    return value, 0


def clean_record(data: Mapping[Any, Any], schema: Record, *, redact: Redact | None = None) -> Cleaned:
    """The known keys of ``data``, each value cleaned by its spec; everything else dropped and counted."""
    kept: dict[str, Any] = {}
    dropped = 0
    by_pattern = 0
    for key, value in data.items():
        spec = schema.fields.get(key) if isinstance(key, str) else None
        if spec is None and isinstance(key, str) and len(key) <= 64:
            spec = next((pattern_spec for pattern, pattern_spec in schema.patterns if pattern.fullmatch(key)), None)
            if spec is not None:
                by_pattern += 1
                if by_pattern > schema.max_pattern_keys:
                    spec = None
        if spec is None:
            dropped += 1
            continue
        cleaned, inner = _clean(value, spec, redact)
        dropped += inner
        if cleaned is not _DROP:
            kept[key] = cleaned
    return Cleaned(kept, dropped)


# --- node system details (node.booted) --------------------------------------------------------------------------

_SYSTEM_TEXT = Text(SYSTEM_TEXT_CHARS)
_COUNT = Number(integer=True, high=1_000_000)
_GIB = Number(high=1e9)

_ACCELERATOR = Record(
    {
        "type": _SYSTEM_TEXT,
        "chips_visible": _COUNT,
        "topology": _SYSTEM_TEXT,
        "worker_id": _SYSTEM_TEXT,
        "hbm_gib_per_chip": Number(high=1e6),
        "chips": _COUNT,
    }
)
_DISK = Record({"path": _SYSTEM_TEXT, "total_gib": _GIB, "free_gib": _GIB})

NODE_SYSTEM = Record(
    {
        "node": _SYSTEM_TEXT,  # the event's ``node`` (the controller puts it here)
        "os": _SYSTEM_TEXT,
        "kernel": _SYSTEM_TEXT,
        "arch": _SYSTEM_TEXT,
        "cpu_model": _SYSTEM_TEXT,
        "cpus": _COUNT,
        "memory_gib": _GIB,
        "memory_used_gib": _GIB,
        "memory_free_gib": _GIB,
        "disks": Items(_DISK, 16),
        "python": _SYSTEM_TEXT,
        "boot_id": _SYSTEM_TEXT,
        "accelerator": Either((_ACCELERATOR, _SYSTEM_TEXT)),
    }
)
"""``node_agent.system_info.system_info()`` plus the reporting node's name."""

NODE_SUMMARY = Record(
    {
        "name": _SYSTEM_TEXT,
        "cpu_model": _SYSTEM_TEXT,
        "cpus": _COUNT,
        "accelerator": Either((_ACCELERATOR, _SYSTEM_TEXT)),
    }
)
"""What the agent attaches to each benchmark result as ``node`` (``NodeAgent._node_summary``)."""

_NODE_VIEW = Record({**NODE_SYSTEM.fields, **NODE_SUMMARY.fields, DROPPED_KEY: _COUNT})


def clean_node_system(node: str, system: Mapping[Any, Any], *, redact: Redact | None = None) -> dict[str, Any]:
    """What the controller stores from a ``node.booted``: ``node`` and the known system fields, cleaned, bounded,
    with :data:`DROPPED_KEY` when fields were dropped."""
    cleaned = clean_record({**system, "node": node}, NODE_SYSTEM, redact=redact)
    return _with_dropped(cleaned.data, cleaned.dropped)


def node_system_view(system: Mapping[Any, Any] | None) -> tuple[dict[str, Any] | None, int]:
    """Stored node details (or a result's node summary) cleaned again for a view: (data, fields dropped in all)."""
    if system is None:
        return None, 0
    cleaned = clean_record(system, _NODE_VIEW)
    data = dict(cleaned.data)
    stored = data.pop(DROPPED_KEY, None)
    return data, cleaned.dropped + (stored or 0)


# --- benchmark results (benchmark.completed) --------------------------------------------------------------------

_MS = Number(high=1e12)
_RATE = Number(high=1e12)
_TOKENS = Number(integer=True, high=1e15)
_SHARE = Number(high=1)
_LEVELS = 16
_METRIC_KEY = re.compile(
    r"(?:mean|median|std|p(?:100|[0-9]{1,2})(?:\.[0-9]{1,17})?)"
    r"_(?:ttft|tpot|itl|e2el|client_queue_time|e2el_including_client_queue)_ms"
)
_MODES = Choice(frozenset({"concurrency", "rate"}))
_ENDPOINTS = Choice(frozenset({"chat", "completions"}))
_TIME = Text(40)

_POINT = Record(
    {
        "mode": _MODES,
        "level": Number(high=1e6),
        "max_concurrency": _COUNT,
        "request_rate": Either((Number(high=1e6), Choice(frozenset({"inf"})))),
        "num_prompts": _COUNT,
        "stopped_by": Choice(frozenset({"count", "duration", "cancelled"})),
        "duration": _MS,
        "completed": _COUNT,
        "failed": _COUNT,
        "total_input_tokens": _TOKENS,
        "total_output_tokens": _TOKENS,
        "request_throughput": _RATE,
        "request_goodput": _RATE,
        "output_goodput": _RATE,
        "output_throughput": _RATE,
        "total_token_throughput": _RATE,
        "max_output_tokens_per_s": _RATE,
        "max_concurrent_requests": _COUNT,
        "failures": Counts(),
        "arrival_rate": _RATE,
        "completion_rate": _RATE,
        # the server's prefix cache over the level (/metrics deltas, tokens) and what the client expected of it
        "prefix_cache_queries": _TOKENS,
        "prefix_cache_hits": _TOKENS,
        "prefix_cache_hit_rate": _SHARE,
        "expected_prefix_cache_hits": _TOKENS,
        "expected_prefix_cache_hit_rate": _SHARE,
        "prefix_cache_block_size": _COUNT,
    },
    patterns=((_METRIC_KEY, _MS),),
)
"""One level of a sweep (``loadgen.PointResult.as_dict``: its settings, then ``metrics.summarize``)."""

_REQUEST = Record(
    {
        "mode": _MODES,
        "concurrency": Items(Number(low=1, high=4096, integer=True), _LEVELS),
        "request_rate": Items(Number(high=1e6), _LEVELS),
        "arrival": Choice(frozenset({"poisson", "constant"})),
        "endpoint": _ENDPOINTS,
        "num_prompts": _COUNT,
        "input_len": _COUNT,
        "output_len": _COUNT,
        "warmup_requests": _COUNT,
        "duration_s": Number(high=1e6),
        "slo_ttft_ms": _MS,
        "slo_tpot_ms": _MS,
        "slo_e2el_ms": _MS,
        "seed": Number(integer=True, high=2**31 - 1),
        "max_concurrency": _COUNT,
        "dataset": Choice(frozenset({"random", "prompts"})),
        "percentiles": Items(Number(high=100), 8),
        "ignore_eos": Flag(),
        "temperature": Number(high=2),
        "request_timeout_s": Number(high=1e6),
        "workload": Choice(frozenset({"random", "shared_prefix", "multi_turn", "trace"})),
        "prefix_len": _COUNT,
        "prefix_share": _SHARE,
        "turns": Number(low=1, high=1024, integer=True),
        "tune_trials": Number(high=64, integer=True),
    }
)
BENCHMARK_REQUEST_KEYS = frozenset(_REQUEST.fields)
"""The request as the result repeats it: ``BenchmarkRequest`` without its prompts and its trace."""

BENCHMARK_RESULT = Record(
    {
        "generator": Text(40),
        "endpoint": _ENDPOINTS,
        "model": Text(SYSTEM_TEXT_CHARS),
        "server": Record(
            {
                "model": Text(SYSTEM_TEXT_CHARS),
                "max_model_len": _COUNT,
                "version": Text(64),
                "prefix_caching": Flag(),
                "block_size": _COUNT,
            }
        ),
        "request": _REQUEST,
        "dataset": Record(
            {
                "kind": Text(40),
                "token_source": Text(40),
                "exact_input_len": Flag(),
                "prompts": _COUNT,
                "input_tokens_mean": Number(high=1e9),
                "input_tokens_min": _COUNT,
                "input_tokens_max": _COUNT,
                "prefix_tokens": _COUNT,
                "prefix_share": _SHARE,
                "turns": _COUNT,
                "sessions_per_level": _COUNT,
                "trace_requests": _COUNT,
                "trace_span_s": Number(high=1e6),
            }
        ),
        "warmup": Record({"requests": _COUNT, "failed": _COUNT}),
        "started_at": _TIME,
        "finished_at": _TIME,
        "cancelled": Flag(),
        "points": Items(_POINT, _LEVELS),
        "knee": Record(
            {"level": Number(high=1e6), "index": _COUNT, "saturated": Flag(), "reason": Text(300)},
        ),
        "failures": Counts(),
        "node": NODE_SUMMARY,
        "tpu": Record(  # shared.domain.tpu_telemetry.summarize over the run's readings
            {
                "samples": Number(high=1e6),
                "hbm_used_frac_peak": Number(high=1),
                "hbm_used_gib_peak": Number(high=1e5),
                "duty_cycle_pct_mean": Number(high=100),
                "duty_cycle_pct_peak": Number(high=100),
                "tensorcore_util_pct_mean": Number(high=100),
                "tensorcore_util_pct_peak": Number(high=100),
            }
        ),
        "records_file": Text(300),
        "truncated": Text(SYSTEM_TEXT_CHARS),
    }
)
"""``loadgen.BenchmarkResult.as_dict`` plus what the agent adds (``node``, ``tpu``, ``records_file``, ``truncated``)."""

_RESULT_VIEW = Record({**BENCHMARK_RESULT.fields, DROPPED_KEY: _COUNT}, patterns=BENCHMARK_RESULT.patterns)


def clean_benchmark_result(result: Mapping[Any, Any], *, redact: Redact | None = None) -> dict[str, Any]:
    """What the controller stores from a ``benchmark.completed`` result: the known fields, cleaned and bounded,
    with :data:`DROPPED_KEY` when fields were dropped. The controller's own keys are never taken from the node."""
    cleaned = clean_record(result, BENCHMARK_RESULT, redact=redact)
    return _with_dropped(cleaned.data, cleaned.dropped)


def benchmark_result_view(result: Mapping[Any, Any] | None) -> tuple[dict[str, Any] | None, int]:
    """A stored result cleaned again for a view: (data, fields dropped in all). The controller's own keys
    (:data:`CONTROLLER_RESULT_KEYS`) pass as stored."""
    if result is None:
        return None, 0
    own = {key: value for key, value in result.items() if key in CONTROLLER_RESULT_KEYS}
    cleaned = clean_record({k: v for k, v in result.items() if k not in CONTROLLER_RESULT_KEYS}, _RESULT_VIEW)
    data = dict(cleaned.data)
    stored = data.pop(DROPPED_KEY, None)
    return {**data, **own}, cleaned.dropped + (stored or 0)


def _with_dropped(data: dict[str, Any], dropped: int) -> dict[str, Any]:
    return {**data, DROPPED_KEY: dropped} if dropped else data

"""What vLLM says it chose at start-up, read from its own log lines, for the effective-configuration check.

Why: ``vllm:cache_config_info`` (``shared.domain.effective_config``) carries the KV cache only. The rest of what a
plan promises is printed once, at start-up, and nowhere else: the engine's config line (``Initializing a V1 LLM
engine (v0.32.0) with config: ... dtype=torch.bfloat16, max_seq_len=..., tensor_parallel_size=...,
quantization=..., kv_cache_dtype=..., enforce_eager=..., enable_prefix_caching=...``), the KV allocation (``KV cache
size: 1,048,576 tokens`` and ``Maximum concurrency for 512 tokens per request: 2048.00x``), the attention backend
(``Using X backend``; ``Cannot use X backend`` when it fell back), and on TPU the compile steps (``Compilation of
... finished in 12.3 [secs]``; ``torch.compile takes 12.3 s in total`` elsewhere). The node agent sees every line
its log shipper moves (``EngineFactsParser``), writes the facts to its guest attribute ``tpuctl/engine`` when they
change (``encode``), and the monitor reads them back (``read_engine_facts``) with the same one read per node.

A new engine (its config line) starts the facts afresh, so a restart never mixes two engines. The VM is hostile:
every value is checked against a narrow shape or a bound, a line is judged by its first ``MAX_EXAMINED`` characters,
and a value that fails is dropped, never guessed.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any

from shared.domain.startup_script import GUEST_ATTRIBUTE_NAMESPACE

__all__ = [
    "ENGINE_KEY",
    "MAX_EXAMINED",
    "EngineFacts",
    "EngineFactsParser",
    "as_record",
    "describe",
    "encode",
    "facts_from",
    "read_engine_facts",
]

ENGINE_KEY = "engine"  # guest attribute tpuctl/engine
MAX_EXAMINED = 8000  # the config line is about 4,000 characters in vLLM 0.32
MAX_RAW_CHARS = 4096
MAX_BACKENDS = 8
_WORD = re.compile(r"[A-Za-z0-9_.:+-]{1,40}")
_CONFIG = re.compile(r"Initializing a V1 LLM engine \((?P<version>[^()\s]{1,40})\) with config: ")
_CONFIG_FIELDS = {
    "weights_dtype": r"dtype=(?:torch\.)?([A-Za-z0-9_]{1,20})",
    "max_model_len": r"max_seq_len=(\d{1,7})",
    "tensor_parallel": r"tensor_parallel_size=(\d{1,4})",
    "quantization": r"quantization=([A-Za-z0-9_.-]{1,40})",
    "kv_cache_dtype": r"kv_cache_dtype=([A-Za-z0-9_.-]{1,40})",
    "enforce_eager": r"enforce_eager=(True|False)",
    "prefix_caching": r"enable_prefix_caching=(True|False)",
}
_KV_SIZE = re.compile(r"KV cache size: ([\d,]{1,15}) tokens")
_CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]{1,12}) tokens per request: ([\d.]{1,12})x")
_BACKEND = re.compile(r"\bUsing ([A-Za-z0-9_.+-]{1,40}(?: [A-Za-z0-9_.+-]{1,40})?) backend\b")
_REFUSED = re.compile(r"\bCannot use ([A-Za-z0-9_.+-]{1,40}) backend\b")
_COMPILED = re.compile(
    r"Compilation of .{1,120}? finished in ([\d.]{1,12}) \[secs\]|torch\.compile takes ([\d.]{1,12}) s"
)
_NOT_BACKENDS = frozenset({"gloo", "nccl"})  # distributed back ends: logged with the same words


@dataclass(frozen=True)
class EngineFacts:
    """One engine's start-up choices as vLLM printed them; None (or empty) where it printed nothing."""

    version: str | None = None
    weights_dtype: str | None = None
    quantization: str | None = None  # "None" as vLLM prints it when nothing is quantised
    kv_cache_dtype: str | None = None
    max_model_len: int | None = None
    tensor_parallel: int | None = None
    enforce_eager: bool | None = None
    prefix_caching: bool | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None  # requests of ``concurrency_context`` tokens that fit at once
    concurrency_context: int | None = None
    attention_backends: tuple[str, ...] = ()
    refused_backends: tuple[str, ...] = ()
    compilations: int = 0
    compile_s: float = 0.0

    @property
    def quantized(self) -> bool:
        return self.quantization is not None and self.quantization.lower() not in ("none", "")


class EngineFactsParser:
    """Feeds on the serving container's lines in order; ``facts`` is the newest engine's."""

    def __init__(self) -> None:
        self.facts: EngineFacts | None = None

    def feed(self, line: str) -> bool:
        """True when the line changed the facts."""
        text = line[:MAX_EXAMINED]
        config = _CONFIG.search(text)
        if config is not None:
            self.facts = _from_config(config.group("version"), text[config.end() :])
            return True
        if self.facts is None:
            return False
        updated = _with_line(self.facts, text)
        changed = updated != self.facts
        self.facts = updated
        return changed


def _from_config(version: str, config: str) -> EngineFacts:
    found: dict[str, Any] = {"version": version if _WORD.fullmatch(version) else None}
    for name, pattern in _CONFIG_FIELDS.items():
        match = re.search(r"(?:^|, )" + pattern, config)
        if match is None:
            continue
        value = match.group(1)
        found[name] = value == "True" if value in ("True", "False") else int(value) if value.isdigit() else value
    return EngineFacts(**found)


def _with_line(facts: EngineFacts, text: str) -> EngineFacts:
    if match := _KV_SIZE.search(text):
        facts = replace(facts, kv_cache_tokens=int(match.group(1).replace(",", "") or 0))
    if match := _CONCURRENCY.search(text):
        context, times = int(match.group(1).replace(",", "") or 0), _finite(match.group(2))
        facts = replace(facts, concurrency_context=context, max_concurrency=times)
    if (match := _BACKEND.search(text)) and match.group(1).lower() not in _NOT_BACKENDS:
        facts = replace(facts, attention_backends=_added(facts.attention_backends, match.group(1)))
    if match := _REFUSED.search(text):
        facts = replace(facts, refused_backends=_added(facts.refused_backends, match.group(1)))
    if match := _COMPILED.search(text):
        seconds = _finite(match.group(1) or match.group(2)) or 0.0
        facts = replace(facts, compilations=facts.compilations + 1, compile_s=round(facts.compile_s + seconds, 3))
    return facts


def _added(names: tuple[str, ...], name: str) -> tuple[str, ...]:
    return names if name in names or len(names) >= MAX_BACKENDS else (*names, name)


def _finite(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def encode(facts: EngineFacts) -> str:
    """The compact JSON the agent writes to ``tpuctl/engine`` (empty fields left out)."""
    body = {name: value for name, value in asdict(facts).items() if not _empty(value)}
    return json.dumps(body, separators=(",", ":"))


def _empty(value: Any) -> bool:
    return value is None or value == () or (type(value) in (int, float) and value == 0)


_TEXT_FIELDS = ("version", "weights_dtype", "quantization", "kv_cache_dtype")
_INT_FIELDS = {"max_model_len": 10**7, "tensor_parallel": 4096, "kv_cache_tokens": 10**12, "concurrency_context": 10**7}
_FLAG_FIELDS = ("enforce_eager", "prefix_caching")


def _checked(data: dict[str, Any]) -> dict[str, Any]:
    """The fields of an untrusted body that have the right shape; the rest is dropped."""
    kept: dict[str, Any] = {}
    for name in _TEXT_FIELDS:
        if isinstance(data.get(name), str) and _WORD.fullmatch(data[name]):
            kept[name] = data[name]
    for name, high in _INT_FIELDS.items():
        value = data.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= high:
            kept[name] = value
    for name in _FLAG_FIELDS:
        if isinstance(data.get(name), bool):
            kept[name] = data[name]
    for name in ("attention_backends", "refused_backends"):
        names = data.get(name)
        if isinstance(names, list) and len(names) <= MAX_BACKENDS:
            good = tuple(n for n in names if isinstance(n, str) and re.fullmatch(r"[A-Za-z0-9_.+ -]{1,81}", n))
            kept |= {name: good} if good else {}
    for name, limit in (("max_concurrency", 1e7), ("compile_s", 1e6), ("compilations", 1e6)):
        value = data.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= limit:
            kept[name] = int(value) if name == "compilations" else float(value)
    return kept


def facts_from(data: Any) -> EngineFacts | None:
    """Facts from a decoded body (the guest attribute's, or the one kept on the deployment), checked field by field;
    None when no field passes."""
    kept = _checked(data) if isinstance(data, dict) else {}
    return EngineFacts(**kept) if kept else None


def as_record(facts: EngineFacts) -> dict[str, Any]:
    """What the deployment keeps (``status.engine``): the wire's body."""
    return dict(json.loads(encode(facts)))


def describe(facts: EngineFacts) -> str:
    """One line for a person: ``vLLM v0.32.0, bfloat16 weights, context 512, TP 1, KV 1,048,576 tokens (auto)``."""
    parts = [f"vLLM {facts.version}" if facts.version else "vLLM"]
    if facts.weights_dtype:
        parts.append(
            f"{facts.weights_dtype} weights" + (f", quantised {facts.quantization}" if facts.quantized else "")
        )
    if facts.max_model_len is not None:
        parts.append(f"context {facts.max_model_len:,}")
    if facts.tensor_parallel is not None:
        parts.append(f"TP {facts.tensor_parallel}")
    if facts.kv_cache_tokens is not None:
        parts.append(
            f"KV {facts.kv_cache_tokens:,} tokens" + (f" ({facts.kv_cache_dtype})" if facts.kv_cache_dtype else "")
        )
    if facts.attention_backends:
        parts.append("attention " + ", ".join(facts.attention_backends))
    if facts.compilations:
        parts.append(f"{facts.compilations} compilations in {facts.compile_s:,.1f} s")
    return ", ".join(parts)


def read_engine_facts(attributes: Iterable[Any]) -> EngineFacts | None:
    """The first worker's ``tpuctl/engine`` (every worker of a slice runs the same engine), or None."""
    found = [a for a in attributes if a.namespace == GUEST_ATTRIBUTE_NAMESPACE and a.key == ENGINE_KEY]
    if not found:
        return None
    value = min(found, key=lambda a: a.worker).value
    try:
        return facts_from(json.loads(value[:MAX_RAW_CHARS]))
    except (ValueError, RecursionError):
        return None

"""The serving flags an auto-tune trial may change, and how a trial's values replace them in a vLLM argv.

Why a closed set: a trial is applied on the TPU VM by the node agent, which recreates the vLLM container with the
running argv and these values in place of the planned ones (issue 22, item 5). Only flags that change how vLLM
batches and caches are tunable; nothing that changes what is served (model, revision, context, weights) or where
(socket, port), and every value is a bounded number or a closed choice, checked on both sides of the wire
(``check_overrides``). The argv is a list of words end to end: no value is ever parsed by a shell.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from shared.domain.errors import InvalidMessage

__all__ = ["BLOCK_SIZES", "TUNABLE", "apply_to_argv", "check_overrides", "describe_overrides"]

BLOCK_SIZES = (16, 32, 64, 128)
# name -> (flag, kind, bounds or choices)
TUNABLE: dict[str, tuple[str, str, tuple[Any, ...]]] = {
    "max_num_seqs": ("--max-num-seqs", "int", (1, 1024)),
    "max_num_batched_tokens": ("--max-num-batched-tokens", "int", (64, 131072)),
    "block_size": ("--block-size", "choice", BLOCK_SIZES),
    "kv_cache_dtype": ("--kv-cache-dtype", "choice", ("auto", "fp8")),
    "prefix_caching": ("--enable-prefix-caching", "bool", ()),
}
_NO_PREFIX_CACHING = "--no-enable-prefix-caching"
_NAME = re.compile(r"[A-Za-z0-9_]{1,40}")  # what a refusal may echo of an unknown name (it may come from a VM)


def check_overrides(overrides: Mapping[str, Any], field: str = "overrides") -> dict[str, Any]:
    """``overrides`` as a plain dict when every name is tunable and every value in range; else ``InvalidMessage``
    naming the entry and the fix."""
    if not isinstance(overrides, Mapping):
        raise InvalidMessage(field, "is not an object of flag values", "give e.g. {'max_num_seqs': 64}")
    checked: dict[str, Any] = {}
    for name, value in overrides.items():
        if name not in TUNABLE:
            shown = name if isinstance(name, str) and _NAME.fullmatch(name) else "<not a flag name>"
            raise InvalidMessage(f"{field}.{shown}", "is not a tunable flag", f"use {', '.join(TUNABLE)}")
        _flag, kind, allowed = TUNABLE[name]
        if kind == "int":
            good = isinstance(value, int) and not isinstance(value, bool) and allowed[0] <= value <= allowed[1]
            fix = f"a whole number from {allowed[0]} to {allowed[1]}"
        elif kind == "bool":
            good, fix = isinstance(value, bool), "true or false"
        else:  # a choice of one type: 32.0 is not the block size 32 (vLLM would not parse "32.0")
            good = any(type(value) is type(choice) and value == choice for choice in allowed)
            fix = "one of " + ", ".join(str(choice) for choice in allowed)
        if not good:
            raise InvalidMessage(f"{field}.{name}", "is out of range", f"give {fix}")
        checked[name] = value
    return checked


def _without(argv: list[str], flag: str, *, takes_value: bool) -> list[str]:
    """``argv`` with every ``flag`` (and its value) removed."""
    kept: list[str] = []
    skip = False
    for word in argv:
        if skip:
            skip = False
            continue
        if word == flag:
            skip = takes_value
            continue
        if word.startswith(flag + "="):
            continue
        kept.append(word)
    return kept


def apply_to_argv(argv: Sequence[str], overrides: Mapping[str, Any]) -> list[str]:
    """The vLLM argv with each override's flag set to its value (replaced where the plan set it, else added after
    ``serve MODEL``'s words). ``kv_cache_dtype='auto'`` is vLLM's default, written as no flag."""
    checked = check_overrides(overrides)
    words = list(argv)
    if "serve" not in words:
        raise InvalidMessage("argv", "is not a vllm serve command", "recreate the container from the startup script")
    added: list[str] = []
    for name, value in checked.items():
        flag, kind, _allowed = TUNABLE[name]
        if kind == "bool":
            words = _without(_without(words, flag, takes_value=False), _NO_PREFIX_CACHING, takes_value=False)
            added.append(flag if value else _NO_PREFIX_CACHING)
            continue
        words = _without(words, flag, takes_value=True)
        if not (name == "kv_cache_dtype" and value == "auto"):
            added += [flag, str(value)]
    at = words.index("serve") + 2  # after "serve MODEL"
    return words[:at] + added + words[at:]


def describe_overrides(overrides: Mapping[str, Any]) -> str:
    """``max_num_seqs=64, prefix_caching=on`` (``defaults`` when empty), for summaries and tables."""
    if not overrides:
        return "defaults"
    words = []
    for name, value in overrides.items():
        shown = ("on" if value else "off") if isinstance(value, bool) else value
        words.append(f"{name}={shown}")
    return ", ".join(words)

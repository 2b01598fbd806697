"""The server's prefix-cache hit rate over one level, from ``/metrics`` deltas, beside the client's expectation.

The same scrapes give the server's own count of the level's work: ``server_requests_succeeded``
(``vllm:request_success_total``), ``server_generation_tokens`` and ``server_prompt_tokens`` deltas, which the
open-loop search (``loadgen.rate_search``) checks its achieved figures against.

vLLM counts, per request it schedules (a preempted request's second look is counted apart), the prompt tokens it
looked up (``vllm:prefix_cache_queries_total``) and those the cache served (``vllm:prefix_cache_hits_total``);
``vllm:cache_config_info`` says the KV block size and whether prefix caching is on. The generator scrapes before
and after each level (``/metrics`` is open even with ``--api-key``) and reads the counters with the monitor's own
parser (``shared.adapters.vllm_probe.parse_metrics``). The client's expectation per request is
:func:`loadgen.workloads.expected_cached_tokens` over the tokens it knows an earlier request sent
(``RequestRecord.reused_tokens``); both rates are tokens served / prompt tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from loadgen.stats import RequestRecord
from loadgen.workloads import expected_cached_tokens
from shared.adapters.vllm_probe import parse_metrics

__all__ = ["CacheCounters", "level_cache_figures", "level_server_counts", "scrape_cache"]


@dataclass(frozen=True, slots=True)
class CacheCounters:
    """One scrape: cumulative prefix-cache counters (tokens) and the cache's configuration."""

    queries: float | None
    hits: float | None
    block_size: int | None
    enabled: bool | None
    requests_succeeded: float | None = None
    """``vllm:request_success_total`` summed over finish reasons."""
    generation_tokens: float | None = None
    """``vllm:generation_tokens_total``."""
    prompt_tokens: float | None = None
    """``vllm:prompt_tokens_total``."""


async def scrape_cache(client: httpx.AsyncClient) -> CacheCounters | None:
    """The server's prefix-cache counters now; None when ``/metrics`` does not answer or has no vLLM series."""
    try:
        response = await client.get("/metrics", headers={"accept": "text/plain"})
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    try:
        snapshot = parse_metrics(response.text)
    except ValueError:
        return None
    if not snapshot.has_vllm_series:
        return None
    config = snapshot.cache_config
    block = config.get("block_size", "")
    enabled = config.get("enable_prefix_caching")
    return CacheCounters(
        queries=snapshot.counters.get("prefix_cache_queries"),
        hits=snapshot.counters.get("prefix_cache_hits"),
        block_size=int(block) if block.isdigit() else None,
        enabled=None if enabled is None else enabled == "True",
        requests_succeeded=snapshot.requests_finished,
        generation_tokens=snapshot.counters.get("generation_tokens"),
        prompt_tokens=snapshot.counters.get("prompt_tokens"),
    )


def level_cache_figures(
    before: CacheCounters | None, after: CacheCounters | None, records: Sequence[RequestRecord]
) -> dict[str, Any]:
    """A level's point keys: the server's prefix-cache queries, hits and hit rate (None when unmeasured: no
    scrape, a restart in between, no lookups), and what the client expected of the successful requests."""
    known = after or before
    block = known.block_size if known is not None else None
    done = [record for record in records if record.success]
    prompt = sum(record.prompt_tokens for record in done)
    expected = sum(expected_cached_tokens(record.reused_tokens, record.prompt_tokens, block) for record in done)
    figures: dict[str, Any] = {
        "prefix_cache_queries": None,
        "prefix_cache_hits": None,
        "prefix_cache_hit_rate": None,
        "expected_prefix_cache_hits": expected,
        "expected_prefix_cache_hit_rate": expected / prompt if prompt else None,
        "prefix_cache_block_size": block,
    }
    queries = _delta(before.queries if before else None, after.queries if after else None)
    hits = _delta(before.hits if before else None, after.hits if after else None)
    if queries is None or hits is None:  # unmeasured, or the server restarted during the level
        return figures
    figures.update(
        prefix_cache_queries=int(queries),
        prefix_cache_hits=int(hits),
        prefix_cache_hit_rate=hits / queries if queries > 0 else None,
    )
    return figures


def level_server_counts(before: CacheCounters | None, after: CacheCounters | None) -> dict[str, int | None]:
    """The server's own count of a level's work from the same scrapes: requests succeeded, tokens generated and
    prompt tokens read (None when unmeasured or the server restarted in between)."""
    counts: dict[str, int | None] = {}
    for key, name in (
        ("server_requests_succeeded", "requests_succeeded"),
        ("server_generation_tokens", "generation_tokens"),
        ("server_prompt_tokens", "prompt_tokens"),
    ):
        moved = _delta(getattr(before, name, None), getattr(after, name, None))
        counts[key] = None if moved is None else round(moved)
    return counts


def _delta(before: float | None, after: float | None) -> float | None:
    if before is None or after is None or after < before:
        return None
    return after - before

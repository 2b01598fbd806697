"""The auto-tune trial loop (issue 22, item 5): serving flags applied one set at a time, each judged by its max
request rate at the SLO.

Which flags come next and which set won is ``shared.domain.autotune.TuneSearch`` (pure); this loop carries it
out against a live server: for each flag set the search gives, the :class:`ServingLauncher` recreates vLLM with
it and waits until it serves (on a TPU VM the node agent's ``node_agent.tuning.ContainerLauncher``), then
:func:`loadgen.rate_search.search_max_rate` measures it and the search records the outcome. A flag set whose engine
does not start is a trial like any other, with no rate (``stop_reason`` says why), and the loop goes on. Whatever
happens, the planned flags are put back at the end (``apply({})``), so a tune never leaves a node on trial flags.

Every trial's search carries its rows in the search's own shape, cut to the figures a tune is read by
(:func:`compact_rows`: medians, no intervals), so a tune of 12 trials fits one ``benchmark.completed`` message.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from loadgen.generator import BenchmarkSetupError, LoadGenerator
from loadgen.rate_search import SearchPlan, search_max_rate
from shared.domain.autotune import TuneSearch
from shared.domain.bench_rate_search import SearchSettings
from shared.domain.serving_overrides import check_overrides
from shared.messages import BenchmarkRequest

__all__ = [
    "ROW_FIGURES",
    "EngineDidNotStart",
    "ServingLauncher",
    "autotune",
    "compact_rows",
    "search_base",
    "tune_plan",
]

ROW_FIGURES = (
    "offered_rate",
    "achieved_rate",
    "request_goodput",
    "median_ttft_ms",
    "p90_ttft_ms",
    "mean_tpot_ms",
    "slo_attainment",
)
"""The figures a trial's row keeps (each the median over the probe's repeats)."""

_DEFAULT_START_RATE = 1.0
_DEFAULT_PROBE_SECONDS = 8.0


class EngineDidNotStart(Exception):
    """A launcher's flag set did not give a serving engine (it exited, or was not healthy in time)."""


class ServingLauncher(Protocol):
    """Recreates the server with serving overrides (``shared.domain.serving_overrides``)."""

    async def apply(self, overrides: Mapping[str, Any]) -> None:
        """Serve with the planned flags and ``overrides`` in place of theirs (``{}``: the planned flags), once
        healthy; :class:`EngineDidNotStart` when it does not get there."""
        ...

    def image(self) -> str | None:
        """The image reference the server runs from (None when unknown)."""
        ...

    def baseline(self) -> dict[str, Any]:
        """The planned flags' values of the tunable names (``shared.domain.autotune.baseline_from_argv``)."""
        ...


def tune_plan(request: BenchmarkRequest) -> SearchPlan:
    """How each trial is measured: the search climbs from the request's lowest rate (1 req/s without one) to its
    highest (1000 req/s with fewer than two), each probe at least ``num_prompts`` requests over ``duration_s``
    seconds (8 without one), once per rate."""
    rates = request.request_rate
    settings = SearchSettings(
        start_rate=min(rates) if rates else _DEFAULT_START_RATE,
        max_rate=max(rates) if len(rates) >= 2 else SearchSettings(start_rate=1.0).max_rate,
    )
    return SearchPlan(
        settings,
        repeats=1,
        probe_requests=max(2, request.num_prompts),
        probe_seconds=request.duration_s or _DEFAULT_PROBE_SECONDS,
    )


def search_base(request: BenchmarkRequest) -> BenchmarkRequest:
    """The request each trial's search sends probes of: the tune's workload, lengths, SLOs and seed, no tune."""
    return BenchmarkRequest.model_validate({**request.model_dump(exclude={"trace"}), "tune_trials": 0})


def compact_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A search's rows (``loadgen.rate_search``) as a tune keeps them: the rate, the verdict, how much was sent, and
    for each of ``ROW_FIGURES`` its median and count of repeats (no intervals, no reason text, no server counts)."""
    compact = []
    for row in rows:
        figures = row.get("figures") or {}
        kept = {key: row.get(key) for key in ("rate", "requests_per_repeat", "repeats", "passed", "failure")}
        kept["figures"] = {
            name: {"n": figures[name].get("n"), "median": figures[name].get("median")}
            for name in ROW_FIGURES
            if isinstance(figures.get(name), Mapping)
        }
        compact.append(kept)
    return compact


def _failed_trial(overrides: Mapping[str, Any], reason: str) -> dict[str, Any]:
    return {
        "overrides": dict(overrides),
        "max_rate_at_slo": None,
        "lowest_failing_rate": None,
        "stop_reason": reason[:500],
        "goodput_at_max_rate": None,
        "rows": [],
    }


async def _trial(
    launcher: ServingLauncher,
    generator: LoadGenerator,
    base: BenchmarkRequest,
    plan: SearchPlan,
    overrides: Mapping[str, Any],
    *,
    first: bool,
) -> tuple[dict[str, Any], str | None] | None:
    """One trial (and the served model's name); None when the generator was stopped during it."""
    try:
        await launcher.apply(overrides)
    except EngineDidNotStart as exc:
        return None if generator.stopped else (_failed_trial(overrides, f"engine did not start: {exc}"), None)
    if generator.stopped:
        return None
    try:
        found = await search_max_rate(generator, base, plan)
    except BenchmarkSetupError as exc:
        if generator.stopped:
            return None
        if first:  # the planned flags cannot be measured: no trial can be either
            raise
        return _failed_trial(overrides, f"search failed: {exc}"), None
    except IndexError:  # a stopped generator measures no level
        if generator.stopped:
            return None
        raise
    if generator.stopped:
        return None
    trial = {
        "overrides": dict(overrides),
        "max_rate_at_slo": found["max_rate_at_slo"],
        "lowest_failing_rate": found["lowest_failing_rate"],
        "stop_reason": found["stop_reason"],
        "goodput_at_max_rate": found["goodput_at_max_rate"],
        "rows": compact_rows(found["rows"]),
    }
    return trial, found.get("model")


async def autotune(
    launcher: ServingLauncher,
    generator: LoadGenerator,
    request: BenchmarkRequest,
    plan: SearchPlan,
    search: TuneSearch,
    *,
    on_trial: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run the trials ``search`` gives (the first is ``{}``, the planned flags) until it has no more or
    ``generator`` is stopped, then restore the planned flags, also on an error.

    Returns ``{"baseline": the planned values, "trials": [{"overrides", "max_rate_at_slo", "lowest_failing_rate",
    "stop_reason", "goodput_at_max_rate", "rows"}, ...] in the order run, "image": the image served from,
    "model": the served model's name the searches saw (None when none ran)}``."""
    base = search_base(request)
    trials: list[dict[str, Any]] = []
    model: str | None = None
    try:
        while not generator.stopped and (overrides := search.next_overrides()) is not None:
            checked = check_overrides(overrides, "overrides")  # only the closed set is ever applied
            done = await _trial(launcher, generator, base, plan, checked, first=not trials)
            if done is None:
                break
            trial, seen = done
            model = model or seen
            search.record(checked, trial["max_rate_at_slo"])
            trials.append(trial)
            if on_trial is not None:
                on_trial(trial)
    finally:
        await launcher.apply({})
    return {"baseline": dict(search.baseline), "trials": trials, "image": launcher.image(), "model": model}

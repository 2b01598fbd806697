"""A ``benchmark.run`` whose request has ``tune_trials`` > 0: the auto-tune on the node (issue 22, item 5).

The run is a tune: ``loadgen.autotune.autotune`` runs the baseline and the trials ``shared.domain.autotune.TuneSearch``
gives, each flag set applied by :class:`ContainerLauncher`, which recreates the serving container with it through
the ``ServingContainer`` port (``reconfigure``: only the vllm argv changes, by ``apply_to_argv``) and waits until
vLLM answers ``/health`` again. The planned flags are restored at the end of every tune, and at the agent's start
if a tune died half-way (:func:`restore_planned_flags`). The agent holds its serving lock for the whole run, as for
any run: a restart requested meanwhile stops the tune (reported failed with the trials measured so far), whose
planned flags go back at once, without waiting for vLLM to serve, so the restart that follows (it waits 30 s for
the lock) finds the planned container.

What goes back in ``benchmark.completed``: the usual result keys that apply (``generator``, ``model``, ``request``,
``started_at``, ``finished_at``, ``cancelled``; no ``points``) and ``tune``: ``{"baseline": {tunable: value},
"trials": [{"overrides", "max_rate_at_slo", "lowest_failing_rate", "stop_reason", "goodput_at_max_rate",
"rows": [compact rows, ``loadgen.autotune.compact_rows``]}], "image": str | None}``, the lowest-rated trials' rows
dropped if it would not fit one message (``truncated`` says so). Each trial, rows and all, is also one line of the
run's records file on the node. The controller checks all of it again and works out the best trial itself
(``shared.domain.autotune.check_tune_result``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from loadgen.autotune import EngineDidNotStart, autotune, tune_plan
from loadgen.generator import LoadGenerator, Target
from node_agent.answers import RESULT_BUDGET_BYTES
from node_agent.log_lines import clean_log_line
from node_agent.runs import RunControl, Runner, RunOutcome
from shared.domain.autotune import TuneSearch, baseline_from_argv
from shared.domain.errors import ControllerError, PermanentError
from shared.domain.serving_overrides import describe_overrides
from shared.messages import RunBenchmark
from shared.ports import ContainerState, ServingContainer

__all__ = ["GENERATOR", "ContainerLauncher", "TuneSettings", "TuningRunner", "fit_tune", "restore_planned_flags"]

log = logging.getLogger("tpuctl.node_agent.tuning")

GENERATOR = "tpuctl-autotune/1"
_AGENT_KEYS_BYTES = 4096  # room for what the agent adds to a result (node, tpu, records_file)
_FAILURE_LINES = 3  # log lines quoted when an engine did not start


class TuneSettings(BaseSettings):
    """The tune's own settings (``TPUCTL_`` variables)."""

    model_config = SettingsConfigDict(env_prefix="TPUCTL_", frozen=True, extra="ignore")

    node_tune_start_timeout_s: float = Field(
        default=1800.0,
        gt=0,
        le=7200,
        description="Seconds a trial's vLLM gets to answer /health (on a TPU a new flag set compiles again).",
    )
    node_tune_poll_s: float = Field(default=2.0, gt=0, le=60, description="Seconds between health checks.")


class ContainerLauncher:
    """``loadgen.autotune.ServingLauncher`` over the serving container: recreate, then wait for ``/health``.

    ``health_url`` is vLLM's ``/health`` as the agent reaches it (through the serving proxy, which needs no key
    there). A trial's engine that exits, is restarted by its restart policy, or is not healthy within
    ``start_timeout_s`` raises :class:`~loadgen.autotune.EngineDidNotStart` with its last log lines (cleaned,
    secrets redacted). :meth:`abandon` (a stop) makes a wait end at once and refuses further trial flags; the
    planned flags (``{}``) are still put back."""

    def __init__(
        self,
        container: ServingContainer,
        health_url: str,
        *,
        stop_timeout_s: float,
        start_timeout_s: float,
        poll_s: float = 2.0,
        api_key: str | None = None,
    ) -> None:
        self.container = container
        self.health_url = health_url
        self.stop_timeout_s = stop_timeout_s
        self.start_timeout_s = start_timeout_s
        self.poll_s = poll_s
        self._api_key = api_key
        self._lock = threading.Lock()  # one recreation at a time, even when a stop interrupts an await
        self._abandoned = threading.Event()
        self._image: str | None = None

    def abandon(self) -> None:
        self._abandoned.set()

    def baseline(self) -> dict[str, Any]:
        state = self.container.inspect()
        self._image = state.image
        return baseline_from_argv(state.planned_command)

    def image(self) -> str | None:
        return self._image

    async def apply(self, overrides: Mapping[str, Any]) -> None:
        """Checked by the loop that chose them and again by ``reconfigure`` (the port's boundary)."""
        await asyncio.to_thread(self._apply, overrides)

    def _apply(self, overrides: Mapping[str, Any]) -> None:
        with self._lock:
            if overrides and self._abandoned.is_set():
                raise EngineDidNotStart("the run was stopped before these flags were applied")
            log.info("serving with %s", describe_overrides(overrides))
            try:
                state = self.container.reconfigure(overrides, self.stop_timeout_s)
            except ControllerError as exc:
                if not overrides:
                    raise
                raise EngineDidNotStart(f"the container could not be recreated: {exc}") from None
            self._image = state.image or self._image
            self._wait_serving(state)

    def _wait_serving(self, started: ContainerState) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        with httpx.Client(timeout=5.0, trust_env=False, follow_redirects=False) as client:
            while not self._abandoned.is_set():
                if _healthy(client, self.health_url):
                    return
                try:
                    now = self.container.inspect()
                except ControllerError as exc:  # the engine API hiccuped: judge on the next round
                    log.warning("could not inspect the serving container while it starts: %s", exc)
                    now = started
                if now.status != "running" or (started.pid is not None and now.pid != started.pid):
                    raise EngineDidNotStart(
                        f"vLLM exited (the container is {now.status}, pid {started.pid} -> {now.pid}); "
                        f"its last lines: {self._last_lines()}"
                    )
                if time.monotonic() > deadline:
                    raise EngineDidNotStart(
                        f"vLLM did not answer {self.health_url} within {self.start_timeout_s:.0f} s; its last lines: "
                        f"{self._last_lines()}"
                    )
                self._abandoned.wait(self.poll_s)

    def _last_lines(self) -> str:
        try:
            lines = self.container.tail(_FAILURE_LINES)
        except ControllerError as exc:
            return f"(log unreadable: {exc})"
        return " | ".join(clean_log_line(line, self._api_key)[:300] for line in lines) or "(none)"


def _healthy(client: httpx.Client, url: str) -> bool:
    try:
        return client.get(url).status_code == 200
    except httpx.HTTPError:
        return False


def restore_planned_flags(container: ServingContainer, stop_timeout_s: float) -> str:
    """At the agent's start: a serving container left on a tune's flags (the agent or the VM died during a tune)
    is recreated with the planned ones. Says what it found and did; never raises."""
    try:
        state = container.inspect()
        if not state.overrides:
            return "the serving container runs the planned flags"
        found = describe_overrides(state.overrides)
        container.reconfigure({}, stop_timeout_s)
    except ControllerError as exc:
        log.warning("could not check the serving container's flags: %s", exc)
        return f"could not check the serving container's flags: {exc}"
    log.warning("the serving container was left on tune flags (%s); recreated with the planned flags", found)
    return f"recreated with the planned flags (it was left on {found})"


def fit_tune(tune: dict[str, Any], budget: int = RESULT_BUDGET_BYTES - _AGENT_KEYS_BYTES) -> tuple[dict[str, Any], int]:
    """``tune`` with rows dropped, the lowest-rated trials' first, until it fits ``budget`` bytes of JSON; returns
    it and how many trials lost their rows."""
    trials = [dict(trial) for trial in tune.get("trials", [])]
    fitted = {**tune, "trials": trials}
    emptied = 0
    order = sorted(range(len(trials)), key=lambda at: trials[at].get("max_rate_at_slo") or -1.0)
    for at in order:
        if len(json.dumps(fitted)) <= budget:
            break
        if trials[at].get("rows"):
            trials[at]["rows"] = []
            emptied += 1
    return fitted, emptied


class TuningRunner:
    """The node agent's runner: a tune when the request has ``tune_trials``, else the ``plain`` runner."""

    def __init__(
        self,
        plain: Runner,
        target: Target,
        container: ServingContainer | None,
        *,
        tokenizer_file: Path | None = None,
        api_key: str | None = None,
        stop_timeout_s: float = 30.0,
        settings: TuneSettings | None = None,
    ) -> None:
        self.plain = plain
        self.target = target
        self.container = container
        self.tokenizer_file = tokenizer_file
        self.api_key = api_key
        self.stop_timeout_s = stop_timeout_s
        self.settings = settings or TuneSettings()

    async def __call__(self, message: RunBenchmark, control: RunControl) -> RunOutcome:
        if not message.benchmark.tune_trials:
            return await self.plain(message, control)
        if self.container is None:
            raise PermanentError(
                "tune_trials: this node agent has no serving container configured (TPUCTL_NODE_CONTAINER), so it "
                "cannot apply serving flags; run without tune_trials"
            )
        request = message.benchmark
        launcher = ContainerLauncher(
            self.container,
            self.target.base_url.rstrip("/") + "/health",
            stop_timeout_s=self.stop_timeout_s,
            start_timeout_s=self.settings.node_tune_start_timeout_s,
            poll_s=self.settings.node_tune_poll_s,
            api_key=self.api_key,
        )
        generator = LoadGenerator(self.target, tokenizer_file=self.tokenizer_file)
        loop = asyncio.get_running_loop()

        def stop_from_any_thread() -> None:
            loop.call_soon_threadsafe(generator.stop)  # first: the loop sees the generator stopped before any
            launcher.abandon()  # trial the launcher gives up on

        control.on_stop(stop_from_any_thread)
        started = datetime.now(UTC)
        search = TuneSearch(await asyncio.to_thread(launcher.baseline), request.workload, request.tune_trials)
        full: list[str] = []
        tune = await autotune(
            launcher,
            generator,
            request,
            tune_plan(request),
            search,
            on_trial=lambda trial: _trial_done(trial, full),
        )
        model = tune.pop("model", None)
        fitted, emptied = fit_tune(tune)
        result: dict[str, Any] = {
            "generator": GENERATOR,
            "model": model or "",
            "request": request.model_dump(mode="json", exclude={"prompts", "trace"}),
            "started_at": started.isoformat(),
            "finished_at": datetime.now(UTC).isoformat(),
            "cancelled": generator.stopped,
            "tune": fitted,
        }
        if emptied:
            result["truncated"] = f"the rows of {emptied} trial(s) were dropped to fit one message; the node keeps them"
        return RunOutcome(result=result, records=full, cancelled=generator.stopped)


def _trial_done(trial: dict[str, Any], full: list[str]) -> None:
    full.append(json.dumps({"trial": len(full), **trial}))
    log.info(
        "tune trial %d (%s): max rate at the SLO %s req/s; %s",
        len(full),
        describe_overrides(trial["overrides"]),
        trial["max_rate_at_slo"],
        trial["stop_reason"],
    )

"""The local-cloud demo flow, step by step, driven through the gateway core like an agent would drive it.

The flow: deploy (publish ``deployment.create`` through the gateway), follow the capacity hunt (every zone tried
and why it ended, the hedge, the ACTIVE zone), the boot (BOOTING while vLLM loads), SERVING, one timed query,
a short benchmark, teardown (``deployment.delete`` until DELETED and the resources are gone), then the
invariant report. ``make demo`` runs it (``scripts/demo.py``); the end-to-end test runs the same steps with a
preemption in the middle.

The gateway is any object with the :class:`Gateway` methods: ``mcp_client_gateway.core.GatewayCore`` in the demo
and the test (``localcloud`` may not import the gateway package: the two are independent layers, so the
composition happens in the caller).
"""

from __future__ import annotations

import json
import secrets
import string
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from localcloud.invariants import InvariantReport, check_invariants, commands_applied
from localcloud.progress import ProgressTracker, hunt_summary
from localcloud.runner import LocalCloud, StopReport
from shared.domain.models import Phase

__all__ = ["DEMO_BENCHMARK", "DemoSpec", "Gateway", "LocalDemo", "Milestone", "StepFailed"]

# A benchmark small enough for two CPU cores: two concurrency levels, short prompts and answers.
DEMO_BENCHMARK: dict[str, Any] = {
    "mode": "concurrency",
    "concurrency": [1, 4],
    "num_prompts": 12,
    "input_len": 64,
    "output_len": 32,
    "warmup_requests": 1,
    "endpoint": "completions",
}
_TERMINAL_RUN = ("completed", "failed")


class Gateway(Protocol):
    """The gateway capabilities the demo uses (``GatewayCore`` has them all)."""

    def save_hf_token(self, token: str, *, confirm: str | None = None) -> Any: ...

    def hf_token_confirmation(self, token: str) -> Any: ...

    def request_confirmation(self, action: Literal["delete"], deployment_id: str) -> Any: ...

    def create_deployment(
        self,
        *,
        deployment_id: str,
        model: str,
        accelerator: str,
        zones: Sequence[str],
        tiers: Sequence[str] | None = None,
        hedge: int | None = None,
        budget_usd: float | None = None,
        valid_until_minutes: int | None = None,
        prewarm: bool = False,
        ttl_hours: float | None = None,
    ) -> Any: ...

    def get_operation(self, command_id: str) -> Any: ...

    def query_model(
        self, deployment_id: str, *, prompt: str, max_tokens: int = 256, temperature: float = 0.0
    ) -> Any: ...

    def run_benchmark(self, deployment_id: str, *, benchmark: dict[str, Any] | None = None) -> Any: ...

    def get_benchmark(self, run_id: str) -> Any: ...

    def delete_deployment(self, deployment_id: str, *, confirm: str | None) -> Any: ...


@dataclass(frozen=True)
class DemoSpec:
    """The deployment the demo asks for. Zones and tiers are chosen to show a real hunt in ``scarce-v6e``."""

    deployment_id: str = "gemma-demo"
    model: str = "gemma-4-31b"
    accelerator: str = "v6e-4"
    zones: tuple[str, ...] = ("us-east5-b", "us-east5-a", "us-central1-b", "europe-west4-a")
    tiers: tuple[str, ...] = ("spot", "flex_start")
    hedge: int = 2
    valid_until_minutes: int | None = 15
    budget_usd: float = 80.0
    kv_cache_dtype: str | None = None  # None: the preset's default


@dataclass(frozen=True)
class Milestone:
    """Something worth a line in the summary: when (wall seconds since the flow began) and what."""

    wall_s: float
    virtual: str
    what: str


class StepFailed(RuntimeError):
    """A demo step could not finish (timeout, a failed deployment, a failed benchmark)."""


@dataclass
class LocalDemo:
    """The demo's steps over a started :class:`LocalCloud` and a :class:`Gateway`."""

    cloud: LocalCloud
    gateway: Gateway
    spec: DemoSpec = field(default_factory=DemoSpec)
    emit: Callable[[str], None] = print
    poll_s: float = 0.5
    milestones: list[Milestone] = field(default_factory=list)
    tool_outputs: dict[str, str] = field(default_factory=dict)
    command_ids: list[str] = field(default_factory=list)
    hf_token_canary: str = ""
    query: Any = None
    benchmark: Any = None
    serving_zone: str | None = None
    serving_tier: str | None = None
    boot_wall_s: list[float] = field(default_factory=list)
    stamps: dict[str, float] = field(default_factory=dict)
    """Wall seconds since the flow began at each step (create, ACTIVE, SERVING, ...), for the timeline."""

    def __post_init__(self) -> None:
        self._began = time.monotonic()
        self.tracker = ProgressTracker(self.cloud.store, self.cloud.fleet, deployment_ids=(self.spec.deployment_id,))

    # ------------------------------------------------------------------ steps

    def save_canary_token(self) -> None:
        """Store an HF-token-shaped canary through the gateway: the secrets scan proves it never leaks."""
        alphabet = string.ascii_letters + string.digits
        self.hf_token_canary = "hf_" + "".join(secrets.choice(alphabet) for _ in range(34))
        replacing = self.gateway.hf_token_confirmation(self.hf_token_canary)  # None unless another token is stored
        saved = self.gateway.save_hf_token(self.hf_token_canary, confirm=replacing.confirm if replacing else None)
        self._keep("save_hf_token", saved)

    def deploy(self) -> str:
        """Publish ``deployment.create`` through the gateway; returns the command id."""
        spec = self.spec
        arguments: dict[str, Any] = {
            "deployment_id": spec.deployment_id,
            "model": spec.model,
            "accelerator": spec.accelerator,
            "zones": list(spec.zones),
            "tiers": list(spec.tiers),
            "hedge": spec.hedge,
            "budget_usd": spec.budget_usd,
            "valid_until_minutes": spec.valid_until_minutes,
        }
        if spec.kv_cache_dtype:
            arguments["kv_cache_dtype"] = spec.kv_cache_dtype
        accepted = self.gateway.create_deployment(**arguments)
        self._keep("create_deployment", accepted)
        self.command_ids.append(accepted.command_id)
        self.mark(
            f"deployment.create published for {spec.deployment_id}: {spec.model} on {spec.accelerator}, "
            f"zones {', '.join(spec.zones)}, tiers {', '.join(spec.tiers)}, hedge {spec.hedge}",
            "create",
        )
        return str(accepted.command_id)

    def wait_for_phase(self, phases: Sequence[Phase], timeout_s: float, *, label: str) -> Phase:
        """Print progress until the deployment reaches one of ``phases``; FAILED or a timeout raises."""
        deadline = time.monotonic() + timeout_s
        wanted = set(phases)
        while True:
            self.show_progress()
            record = self.cloud.store.get_deployment(self.spec.deployment_id)
            if record is not None and record.status.phase in wanted:
                self.show_progress()
                return record.status.phase
            if record is not None and record.status.phase is Phase.FAILED and Phase.FAILED not in wanted:
                raise StepFailed(f"{label}: the deployment FAILED: {record.status.message}")
            if time.monotonic() > deadline:
                phase = record.status.phase.value if record else "no record"
                raise StepFailed(f"{label}: still {phase} after {timeout_s:.0f} s wall")
            time.sleep(self.poll_s)

    def wait_until_serving(self, timeout_s: float) -> None:
        """From the create to SERVING: capacity hunt, ACTIVE, boot."""
        self.wait_for_phase([Phase.BOOTING, Phase.COMPILING, Phase.SERVING], timeout_s, label="capacity hunt")
        record = self.cloud.store.get_deployment(self.spec.deployment_id)
        assert record is not None
        self.serving_zone = record.status.zone
        self.serving_tier = record.status.tier.value if record.status.tier else None
        self.mark(f"ACTIVE in {self.serving_zone} ({self.serving_tier}): the VM boots, vLLM loads (BOOTING)", "ACTIVE")
        booted = time.monotonic()
        self.wait_for_phase([Phase.SERVING], timeout_s, label="boot")
        self.boot_wall_s.append(round(time.monotonic() - booted, 1))
        self.mark(f"SERVING after a {self.boot_wall_s[-1]:.0f} s wall boot", "SERVING")

    def ask(self, prompt: str = "Say hello to the TPU fleet.", max_tokens: int = 32) -> Any:
        """One streamed chat completion through the gateway, timed (TTFT at the first content chunk).

        Sampled (temperature 0.7): the stand-in model's random weights repeat one token at temperature 0, and
        for many prompts that token decodes to nothing, so no chunk would carry content to time.
        """
        result = self.gateway.query_model(
            self.spec.deployment_id, prompt=prompt, max_tokens=max_tokens, temperature=0.7
        )
        self._keep("query_model", result)
        self.query = result
        timing = (
            f"TTFT {result.ttft_ms:.0f} ms, {result.completion_tokens} tokens in {result.total_ms:.0f} ms"
            if result.ttft_ms is not None
            else f"answered in {result.total_ms:.0f} ms"
        )
        self.mark(f"query through the gateway: {timing}; text (random stand-in weights): {result.text[:40]!r}", "query")
        return result

    def run_benchmark(self, timeout_s: float, benchmark: dict[str, Any] | None = None) -> Any:
        """``benchmark.run`` through the gateway, then poll the run until it completes (or fails)."""
        if "benchmark" not in self.cloud.functions:
            raise StepFailed("benchmark: functions/benchmark/main.py is missing in this checkout")
        if self.cloud.fleet is None:
            raise StepFailed("benchmark: nodes run no vLLM here, so no node agent can run it")
        accepted = self.gateway.run_benchmark(self.spec.deployment_id, benchmark=benchmark or DEMO_BENCHMARK)
        self._keep("run_benchmark", accepted)
        run_id = str(accepted.command_id)
        self.command_ids.append(run_id)
        self.mark("benchmark.run published (the node agent runs it next to vLLM)")
        deadline = time.monotonic() + timeout_s
        view: Any = None
        while time.monotonic() < deadline:
            self.show_progress()
            try:
                view = self.gateway.get_benchmark(run_id)
            except Exception as exc:  # not recorded yet: the gateway says so with retry_after_s
                if getattr(exc, "code", "") != "not_found":
                    raise
                time.sleep(self.poll_s)
                continue
            if view.status in _TERMINAL_RUN:
                break
            time.sleep(self.poll_s)
        if view is None or view.status not in _TERMINAL_RUN:
            raise StepFailed(f"benchmark {run_id}: not finished after {timeout_s:.0f} s wall")
        self._keep("get_benchmark", view)
        self.benchmark = view
        if view.status != "completed":
            raise StepFailed(f"benchmark {run_id} failed: {view.error}")
        self.mark("benchmark completed", "benchmark")
        return view

    def preempt(self) -> str:
        """Preempt the serving node in the simulator (what a spot reclaim does); returns the node id."""
        record = self.cloud.store.get_deployment(self.spec.deployment_id)
        if record is None or not record.status.zone:
            raise StepFailed("preempt: the deployment has no zone yet")
        active = [ref for ref in record.status.resources if ref.state.value == "ACTIVE"]
        if not active:
            raise StepFailed("preempt: no ACTIVE queued resource to preempt")
        target = active[0]
        hit = self.cloud.world.preempt(target.zone, queued_resource=target.name)
        self.mark(f"spot preemption of {target.zone}/{target.name} (nodes {', '.join(hit) or 'none'})", "preempted")
        return target.name

    def teardown(self, timeout_s: float) -> None:
        """``deployment.delete`` through the gateway; wait for DELETED and for the slices to be gone."""
        confirmation = self.gateway.request_confirmation("delete", self.spec.deployment_id)  # the demo is its user
        accepted = self.gateway.delete_deployment(self.spec.deployment_id, confirm=confirmation.confirm)
        self._keep("delete_deployment", accepted)
        self.command_ids.append(accepted.command_id)
        self.mark("deployment.delete published")
        self.wait_for_phase([Phase.DELETED], timeout_s, label="teardown")
        deadline = time.monotonic() + timeout_s
        while self.resources_left() and time.monotonic() < deadline:
            time.sleep(self.poll_s)
        self.mark(f"DELETED; TPU resources left in the simulator: {self.resources_left()}", "DELETED")

    def check(self) -> tuple[InvariantReport, dict[str, int]]:
        """The invariant report and how often each command was applied."""
        settings = self.cloud.settings
        api_key = self.cloud.secrets.get(settings.vllm_api_key_secret) or ""
        report = check_invariants(
            self.cloud,
            secret_values={"vLLM API key": api_key, "HF token canary": self.hf_token_canary},
            extra_texts=self.tool_outputs,
        )
        applied = commands_applied(self.cloud.log_dir, self.command_ids)
        return report, applied

    # ------------------------------------------------------------------ output

    def show_progress(self) -> None:
        for line in self.tracker.poll(self.cloud.world.now()):
            self.emit("  " + line.render())

    def mark(self, what: str, step: str | None = None) -> None:
        wall = round(time.monotonic() - self._began, 1)
        if step is not None:
            key, number = step, 2
            while key in self.stamps:
                key, number = f"{step}#{number}", number + 1
            self.stamps[key] = wall
        virtual = f"{self.cloud.world.now():%H:%M:%S}"
        self.milestones.append(Milestone(wall, virtual, what))
        self.emit(f"* [{wall:6.1f} s wall | {virtual} virtual] {what}")

    def summary_lines(
        self, report: InvariantReport, applied: dict[str, int], stopped: StopReport | None, total_wall_s: float
    ) -> list[str]:
        """The one-screen summary: the hunt zone by zone, serving, query, benchmark, invariants, timeline."""
        spec = self.spec
        width = 100
        attempts = [attempt for deployment, attempt in self.tracker.attempts if deployment == spec.deployment_id]
        hunt = hunt_summary(attempts)
        requests = sum(count for _, count, _ in hunt)
        lines = [
            "=" * width,
            f"tpuctl local cloud demo | {spec.model} on {spec.accelerator} | scenario {self.cloud.scenario.name} | "
            f"virtual time x{self.cloud.options.time_scale:g} | no Google Cloud account",
            "-" * width,
            f"capacity hunt     {requests} queued-resource requests over {len(hunt)} zone/tier pairs, "
            f"hedge {spec.hedge}:",
        ]
        for pair, count, why in hunt:
            lines.append(f"  {pair:<26} {count} request(s): {'; '.join(why) or 'no outcome yet'}")
        lines.append(f"serving           {self.serving_zone} ({self.serving_tier}); boot {self._boot_text()}")
        if self.query is not None:
            ttft = f"{self.query.ttft_ms:.0f} ms" if self.query.ttft_ms is not None else "n/a"
            lines.append(
                f"query             TTFT {ttft}, {self.query.completion_tokens} tokens in {self.query.total_ms:.0f} ms "
                "(through the gateway, streamed)"
            )
        lines += self.benchmark_lines()
        lines.append("-" * width)
        lines += [f"invariant         {text}" for text in report.lines()]
        once = bool(applied) and all(count == 1 for count in applied.values())
        lines.append(
            f"invariant         {'ok  ' if once else 'FAIL'} every command applied once: "
            + ", ".join(f"{command[:8]} x{count}" for command, count in applied.items())
        )
        if stopped is not None:
            lines.append(
                f"shutdown          {'ok  ' if not stopped.survivors else 'FAIL'} {stopped.stopped_groups} process "
                f"group(s) stopped in {stopped.wall_s:.1f} s, survivors: {list(stopped.survivors) or 'none'}"
            )
        lines.append("-" * width)
        steps = " -> ".join(f"{name} {seconds:.0f} s" for name, seconds in self.stamps.items())
        lines.append(f"timeline (wall)   {steps}; total {total_wall_s:.0f} s"[: width * 2])
        lines.append("=" * width)
        return lines

    def benchmark_lines(self) -> list[str]:
        """A short table of the benchmark's levels."""
        view = self.benchmark
        if view is None or not view.result:
            return []
        points = view.result.get("points") or []
        rows = ["benchmark         conc  req/s  out tok/s  TTFT p50  TTFT p99  TPOT mean  failed"]
        for point in points:
            rows.append(
                f"                  {point.get('level', '?')!s:>4}  {_num(point.get('request_throughput')):>5}  "
                f"{_num(point.get('output_throughput')):>9}  {_num(point.get('median_ttft_ms'), 'ms'):>8}  "
                f"{_num(point.get('p99_ttft_ms'), 'ms'):>8}  {_num(point.get('mean_tpot_ms'), 'ms'):>9}  "
                f"{point.get('failed', 0)!s:>6}"
            )
        return rows

    # ------------------------------------------------------------------ helpers

    def _boot_text(self) -> str:
        if not self.boot_wall_s:
            return "n/a"
        return ", ".join(f"{seconds:.0f} s wall" for seconds in self.boot_wall_s)

    def _keep(self, name: str, output: Any) -> None:
        dump = getattr(output, "model_dump_json", None)
        text = dump() if callable(dump) else json.dumps(output, default=str)
        key = name
        number = 1
        while key in self.tool_outputs:
            number += 1
            key = f"{name}#{number}"
        self.tool_outputs[key] = str(text)

    def resources_left(self) -> int:
        state = self.cloud.world.state(events=0)
        owned = 0
        for item in state["queued_resources"]:
            labels = item.get("tpu", {}).get("nodeSpec", [{}])[0].get("node", {}).get("labels", {})
            if labels.get("tpuctl-deployment") == self.spec.deployment_id:
                owned += 1
        for node in state["nodes"]:
            if (node.get("labels") or {}).get("tpuctl-deployment") == self.spec.deployment_id:
                owned += 1
        return owned


def _num(value: Any, unit: str = "") -> str:
    if not isinstance(value, int | float):
        return "-"
    text = f"{value:.1f}" if value < 100 else f"{value:.0f}"
    return f"{text}{unit}"

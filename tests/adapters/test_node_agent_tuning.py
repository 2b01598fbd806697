"""A tune on the node: the node agent runs ``benchmark.run`` with ``tune_trials`` through the Docker Engine API.

The serving container is created the way the startup script creates it (the twin's ``docker run``) in the VM
twin's container runtime, behind a real unix socket; its process is a stand-in vLLM: the streaming OpenAI stub
(``tests.support.stub_server``) on a fixed port, started from the container's own argv, which refuses a
``--max-num-seqs`` above what "fits" (it exits, as vLLM does when the KV cache is too small). So each trial's
recreation really replaces the process the load generator measures, and a failed start is a real exit.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from loadgen.generator import Target
from localcloud.vllm_cpu import free_loopback_port
from localcloud.vm_twin.containers import ContainerRuntime, ContainerSpec, EngineApiServer, Launch
from node_agent.agent import NodeAgent, VllmRunner
from node_agent.journal import RunJournal
from node_agent.tuning import TuneSettings, TuningRunner, fit_tune, restore_planned_flags
from shared.adapters.clock import SystemClock
from shared.adapters.docker_engine import DockerEngineContainer
from shared.adapters.local_bus import LocalBus
from shared.adapters.node_channels import LocalBusNodeChannels
from shared.domain.autotune import check_tune_result
from shared.messages import (
    BenchmarkCompleted,
    BenchmarkRequest,
    RestartServing,
    RunBenchmark,
    decode_message,
    encode_message,
    message_attributes,
    new_command_id,
)
from shared.ports import Delivery
from tests.support.serving_container import docker, script_run_words

EVENTS, NODE_TASKS = "tpuctl-events", "tpuctl-node-tasks"
IMAGE = "vllm/vllm-tpu:v0.32.0"
NAME = "tpuctl-vllm"
VLLM_ARGV = ("vllm", "serve", "google/gemma-3-1b-it", "--served-model-name", "gemma", "--max-num-seqs", "8",
             "--max-num-batched-tokens", "2048", "--block-size", "32", "--enable-prefix-caching")  # fmt: skip
REPO = Path(__file__).resolve().parents[2]

# The stand-in vLLM: records its argv, refuses more sequences than fit, then serves the stub on the fixed port.
_PROGRAM = """
import json, os, sys
argv = sys.argv[1:]
with open(os.environ["STANDIN_COMMANDS"], "a") as commands:
    commands.write(json.dumps({"pid": os.getpid(), "argv": argv}) + "\\n")
seqs = int(argv[argv.index("--max-num-seqs") + 1])
if seqs > int(os.environ["STANDIN_MOST_SEQS"]):
    print(f"ValueError: max_num_seqs {seqs} does not fit the KV cache", file=sys.stderr, flush=True)
    sys.exit(1)
from tests.support.stub_server import main
sys.exit(main(["--port", os.environ["STANDIN_PORT"], "--model", "gemma", "--first-token-delay-ms", "2"]))
"""


class StubVllmImage:
    """Every container of ``IMAGE`` runs the stand-in vLLM with the container's entrypoint and Cmd as its argv."""

    def __init__(self, work_dir: Path, port: int, most_seqs: int) -> None:
        self.log_path = work_dir / "vllm.log"
        self.commands = work_dir / "commands.jsonl"
        self.port, self.most_seqs = port, most_seqs

    def has(self, reference: str) -> bool:
        return reference == IMAGE

    def command(self, spec: ContainerSpec) -> Launch:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": str(REPO),
            "STANDIN_COMMANDS": str(self.commands),
            "STANDIN_PORT": str(self.port),
            "STANDIN_MOST_SEQS": str(self.most_seqs),
        }
        argv = (sys.executable, "-c", _PROGRAM, *spec.entrypoint, *spec.cmd)
        return Launch(argv=argv, env=env, log_path=self.log_path)

    def argvs(self) -> list[list[str]]:
        """The argv of every process started so far, consecutive repeats (restart-policy restarts) folded."""
        lines = self.commands.read_text().splitlines() if self.commands.exists() else []
        folded: list[list[str]] = []
        for argv in (json.loads(line)["argv"] for line in lines):
            if not folded or folded[-1] != argv:
                folded.append(argv)
        return folded


@dataclass
class Node:
    bus: LocalBus
    image: StubVllmImage
    container: DockerEngineContainer
    agent: NodeAgent
    planned: tuple[str, ...]
    base_url: str


def _wait(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout_s} s")


def _healthy(base_url: str) -> bool:
    import httpx

    try:
        return httpx.get(base_url + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
def node_factory(tmp_path: Path) -> Iterator[Callable[[int], Node]]:
    stack: list[Callable[[], None]] = []

    def make(most_seqs: int) -> Node:
        work = tmp_path / f"node-{len(stack)}"
        work.mkdir(mode=0o700)
        port = free_loopback_port()
        image = StubVllmImage(work, port, most_seqs)
        runtime = ContainerRuntime(image)
        server = EngineApiServer(runtime, work / "docker.sock").start()
        host = f"unix://{server.socket_path}"
        words = script_run_words(IMAGE, VLLM_ARGV, name=NAME, device="/dev/null", hf_cache=work / "hf")
        assert docker(host, words) == 0
        base_url = f"http://127.0.0.1:{port}"
        _wait(lambda: _healthy(base_url), 30, "the stand-in vLLM serving")
        bus = LocalBus(work / "bus.sqlite")
        bus.ensure_topic(EVENTS)
        bus.ensure_topic(NODE_TASKS)
        bus.ensure_subscription(EVENTS, "test-events")
        LocalBusNodeChannels(bus, NODE_TASKS).open("gemma-a")
        container = DockerEngineContainer(host, NAME, timeout_s=10)
        target = Target(base_url)
        settings = TuneSettings(node_tune_start_timeout_s=30, node_tune_poll_s=0.1)
        agent = NodeAgent(
            bus,
            deployment_id="gemma-a",
            node_name="node-1",
            journal=RunJournal(work / "journal"),
            runner=TuningRunner(VllmRunner(target), target, container, stop_timeout_s=5, settings=settings),
            clock=SystemClock(),
            system=lambda: {"cpu_model": "test cpu", "cpus": 2, "accelerator": None},
            boot=lambda: "boot-1",
            container=container,
            restart_timeout_s=5,
        )
        stack.extend([server.stop, runtime.shutdown, container.close, bus.close])
        return Node(bus, image, container, agent, container.inspect().command, base_url)

    yield make
    for close in reversed(stack):
        close()


def _dispatch(bus: LocalBus, message: RunBenchmark | RestartServing) -> None:
    bus.publish(NODE_TASKS, encode_message(message), message_attributes(message), ordering_key="gemma-a")


def _completed(bus: LocalBus) -> list[BenchmarkCompleted]:
    seen: list[Delivery] = []
    bus.pull("test-events", seen.append, max_messages=100, timeout_s=0)
    events = [decode_message(delivery.data) for delivery in seen]
    return [event for event in events if isinstance(event, BenchmarkCompleted)]


def _tune_request(trials: int) -> BenchmarkRequest:
    return BenchmarkRequest(
        tune_trials=trials,
        slo_ttft_ms=2000,
        input_len=8,
        output_len=4,
        num_prompts=4,
        warmup_requests=1,
        mode="rate",
        request_rate=(4.0, 8.0),
        duration_s=1.0,
    )


def _run(request: BenchmarkRequest) -> RunBenchmark:
    return RunBenchmark(
        command_id=new_command_id(), issued_at=datetime.now(UTC), deployment_id="gemma-a", benchmark=request
    )


def _seqs(argv: list[str] | tuple[str, ...]) -> str:
    return argv[argv.index("--max-num-seqs") + 1]


def test_a_tune_recreates_vllm_per_trial_records_a_failed_start_and_restores_the_plan(
    node_factory: Callable[[int], Node],
) -> None:
    node = node_factory(8)  # 16 sequences do not fit: that trial's engine exits
    request = _tune_request(3)
    message = _run(request)
    assert node.agent.start() == []
    _dispatch(node.bus, message)
    assert node.agent.poll_once(timeout_s=1) == 1
    assert node.agent.run_next() is True
    (event,) = _completed(node.bus)
    assert event.run_id == message.command_id and event.status == "completed", event.error
    result: dict[str, Any] = event.result or {}
    tune = result["tune"]
    assert set(tune) == {"baseline", "trials", "image"} and tune["image"] == IMAGE
    assert tune["baseline"]["max_num_seqs"] == 8 and tune["baseline"]["block_size"] == 32
    trials = tune["trials"]
    assert [trial["overrides"] for trial in trials] == [{}, {"max_num_seqs": 16}, {"max_num_seqs": 4}]
    assert [trial["max_rate_at_slo"] for trial in trials] == [8.0, None, 8.0]
    assert trials[1]["stop_reason"].startswith("engine did not start: vLLM exited")
    assert "ValueError: max_num_seqs 16 does not fit the KV cache" in trials[1]["stop_reason"]
    assert [row["rate"] for row in trials[0]["rows"]] == [4.0, 8.0] and trials[1]["rows"] == []
    assert result["generator"] == "tpuctl-autotune/1" and result["model"] == "gemma"
    # every trial ran on its own process, started from the planned argv with one flag changed; the plan came back
    argvs = node.image.argvs()
    assert [_seqs(argv) for argv in argvs] == ["8", "16", "4", "8"]
    assert argvs[0] == argvs[-1] == ["/bin/sh", *node.planned]
    state = node.container.inspect()
    assert state.command == node.planned and state.overrides == {} and state.status == "running"
    checked = check_tune_result(request, tune)  # what the controller will make of it
    assert checked["best"] == 0 and checked["gain"] == 1.0
    records = Path(result["records_file"]).read_text().splitlines()
    assert [json.loads(line)["overrides"] for line in records] == [trial["overrides"] for trial in trials]


def test_a_restart_during_a_tune_stops_it_after_the_plan_is_back(node_factory: Callable[[int], Node]) -> None:
    node = node_factory(64)
    node.agent.start()
    _dispatch(node.bus, _run(_tune_request(4)))
    node.agent.poll_once(timeout_s=1)
    running = threading.Thread(target=node.agent.run_next)
    running.start()
    try:
        _wait(lambda: len(node.image.argvs()) >= 2, 60, "the second trial's engine")  # the baseline was measured
        restart = RestartServing(
            command_id=new_command_id(), issued_at=datetime.now(UTC), deployment_id="gemma-a", reason="wedged"
        )
        _dispatch(node.bus, restart)
        node.agent.poll_once(timeout_s=1)
        assert node.agent.handle_tasks() == 1  # waits for the run to stop and the plan to be back
    finally:
        running.join(timeout=60)
    node.agent.publish_pending()
    (event,) = _completed(node.bus)
    assert event.status == "failed" and event.error.startswith("stopped during the run: serving restart requested")
    trials = (event.result or {})["tune"]["trials"]
    assert trials[0]["overrides"] == {} and len(trials) <= 2  # what finished before the stop
    argvs = node.image.argvs()
    assert _seqs(argvs[1]) == "16" and argvs[-1] == ["/bin/sh", *node.planned]  # restored, then restarted as planned
    assert node.container.inspect().overrides == {}


def test_the_agent_s_start_puts_back_flags_a_dead_tune_left(node_factory: Callable[[int], Node]) -> None:
    node = node_factory(64)
    left = node.container.reconfigure({"max_num_seqs": 4}, timeout_s=5)
    assert left.overrides == {"max_num_seqs": 4}
    said = restore_planned_flags(node.container, 5)
    assert said == "recreated with the planned flags (it was left on max_num_seqs=4)"
    assert node.container.inspect().command == node.planned
    assert restore_planned_flags(node.container, 5) == "the serving container runs the planned flags"
    _wait(lambda: _healthy(node.base_url), 30, "the planned engine serving again")


def test_a_tune_too_big_for_one_message_loses_the_rows_of_its_weakest_trials_first() -> None:
    row = {"rate": 1.0, "passed": True, "figures": {"median_ttft_ms": {"n": 1, "median": 1.5}}, "pad": "x" * 400}
    trials = [
        {"overrides": {"max_num_seqs": 2**n}, "max_rate_at_slo": rate, "rows": [row] * 12}
        for n, rate in enumerate([4.0, None, 16.0, 2.0, 8.0, 12.0, 1.0, 3.0, 5.0, 6.0, 7.0, 9.0])
    ]
    tune = {"baseline": {"max_num_seqs": 1}, "trials": trials, "image": IMAGE}
    assert len(json.dumps(tune)) > 60_000
    fitted, emptied = fit_tune(tune, budget=30_000)
    assert len(json.dumps(fitted)) <= 30_000 and emptied == 8
    kept = [trial["max_rate_at_slo"] for trial in fitted["trials"] if trial["rows"]]
    assert sorted(kept) == [8.0, 9.0, 12.0, 16.0] and fitted["trials"][2]["rows"] == [row] * 12
    assert tune["trials"][1]["rows"] == [row] * 12  # the caller's tune is left as it was
    small = {**tune, "trials": trials[:2]}
    assert fit_tune(small) == (small, 0)  # the default budget (one message less the agent's keys) holds it whole
    assert fit_tune(tune)[1] == 3  # and the twelve trials but for the rows of three

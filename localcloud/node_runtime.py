"""The node runtime: when the simulator reports a TPU node READY, "boot the VM" on this machine.

On a real TPU VM the startup script (rendered from the deployment's serving plan) fetches the API key into a
root-only file, starts the pinned vLLM container on the VM and the node agent beside it. Here the same plan is
run in its local equivalent:

* the serving plan is built from the deployment's stored spec (``build_serving_plan``), so the served model
  name is the one production would serve; the weights are the tiny local model on CPU (a stand-in: Gemma does
  not run on two CPU cores), with the context capped at ``max_model_len_cap``;
* the vLLM API key is read from the secret store and written to a 0600 file in the node's own 0700 folder;
  vLLM reads it through ``localcloud.vllm_keyfile_entry`` and the node agent through
  ``TPUCTL_NODE_API_KEY_FILE``: never argv, never an environment block;
* a free loopback port is attached to the node as its network endpoint (``World.set_node_endpoint``) *before*
  vLLM starts, so the provisioner records the endpoint and the monitor reports BOOTING (connection refused)
  until vLLM answers: the boot delay the phases show is the real one;
* the node agent (``python -m shared.bench.node_agent``) runs beside vLLM when the module exists;
* the vLLM process is the node's "container": ``localcloud.container_api`` serves the Docker Engine API subset
  the agent uses (inspect, restart, logs) on ``<node folder>/docker.sock``, and the agent gets
  ``TPUCTL_NODE_DOCKER_HOST`` and ``TPUCTL_NODE_CONTAINER`` as the startup script gives them on a VM, so
  ``serving.restart`` and ``serving.logs`` take the same code path as on a TPU VM. A restart stops vLLM's
  process group and starts it again on the same port with the same arguments and key file.

A preempted, stopped or deleted node has its processes stopped by process group (SIGTERM, then SIGKILL).
Logs follow the local log layout (``shared.adapters.local_logs``): ``vllm-<deployment>.log``,
``agent-<deployment>.jsonl`` and ``node-<deployment>.jsonl`` under the log folder.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from localcloud.container_api import ContainerApiServer, ProcessContainer, serve_node_container
from localcloud.process_groups import spawn_group
from localcloud.tpu_sim import NodeEvent, World
from localcloud.vllm_cpu import REPO_ROOT, VllmCpuTier, VllmProcess, free_loopback_port, start_vllm, stop_group
from shared.bench.node_agent import SERVING_CONTAINER_NAME
from shared.domain.errors import ControllerError
from shared.domain.serving_plan import ServingEnvironment, build_serving_plan
from shared.logging import JsonFormatter, RedactingFilter, register_secret
from shared.ports import SecretStore, StateStore

__all__ = ["NodeRuntime", "NodeSlot", "NodeView"]

log = logging.getLogger("tpuctl.localcloud.node")

LABEL_DEPLOYMENT = "tpuctl-deployment"
NODE_AGENT_MODULE = "shared.bench.node_agent"
_BOOT_EVENTS = frozenset({"ready", "started"})
_HALT_EVENTS = frozenset({"preempted", "stopped", "deleted"})
_INHERITED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "TZ")


@dataclass(frozen=True)
class NodeView:
    """A node as the demo and tests see it (no secret, no process handle)."""

    zone: str
    node_id: str
    deployment_id: str
    port: int
    served_model: str
    state: str  # booting, serving, exited, stopped
    vllm_pid: int | None
    agent_pid: int | None
    boot_s: float | None
    detail: str


@dataclass
class NodeSlot:
    """One booted node: its processes and what happened to them."""

    zone: str
    node_id: str
    deployment_id: str
    port: int
    served_model: str
    work_dir: Path
    booted_at: float
    vllm: VllmProcess | None = None
    agent: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    container: ProcessContainer | None = field(default=None, repr=False)
    container_api: ContainerApiServer | None = field(default=None, repr=False)
    ready_after_s: float | None = None
    halted: str | None = None
    detail: str = ""

    def view(self) -> NodeView:
        if self.halted:
            state = "stopped"
        elif self.vllm is None:
            state = "booting"
        elif not self.vllm.alive():
            state = "exited"
        elif self.ready_after_s is not None:
            state = "serving"
        else:
            state = "booting"
        return NodeView(
            zone=self.zone,
            node_id=self.node_id,
            deployment_id=self.deployment_id,
            port=self.port,
            served_model=self.served_model,
            state=state,
            vllm_pid=self.vllm.pid if self.vllm else None,
            agent_pid=self.agent.pid if self.agent else None,
            boot_s=self.ready_after_s,
            detail=self.halted or self.detail,
        )


class NodeRuntime:
    """Boots a real vLLM on CPU (and the node agent) for every READY node of ``world``; stops them with the node."""

    def __init__(
        self,
        world: World,
        tier: VllmCpuTier,
        *,
        store: StateStore,
        secrets: SecretStore,
        api_key_secret: str,
        project: str,
        work_dir: Path,
        log_dir: Path,
        agent_env: Mapping[str, str],
        max_model_len_cap: int = 512,
        ready_timeout_s: float = 600.0,
        on_change: Callable[[NodeView], None] | None = None,
    ) -> None:
        self._world = world
        self._tier = tier
        self._store = store
        self._secrets = secrets
        self._api_key_secret = api_key_secret
        self._project = project
        self._work_dir = work_dir
        self._log_dir = log_dir
        self._agent_env = dict(agent_env)
        self._max_model_len_cap = max_model_len_cap
        self._ready_timeout_s = ready_timeout_s
        self._on_change = on_change
        self._slots: dict[tuple[str, str], NodeSlot] = {}
        self._history: list[NodeView] = []
        self._groups: list[int] = []
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._loggers: dict[str, logging.Logger] = {}
        self._handlers: list[logging.Handler] = []

    # ------------------------------------------------------------------ lifecycle

    def attach(self) -> None:
        """Start listening to the world's node events."""
        self._work_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self._work_dir, 0o700)
        self._log_dir.mkdir(parents=True, exist_ok=True)
        self._world.add_node_listener(self._on_event)

    def close(self, timeout_s: float = 15.0) -> None:
        """Stop listening, stop every node's processes and wait for the boot and halt threads."""
        self._world.remove_node_listener(self._on_event)
        with self._lock:
            self._closed = True
            slots = list(self._slots.values())
            self._slots.clear()
        for slot in slots:
            self._stop_slot(slot, "the local cloud shut down")
        deadline = time.monotonic() + timeout_s
        for thread in list(self._threads):
            thread.join(timeout=max(0.1, deadline - time.monotonic()))
        for handler in self._handlers:
            handler.close()

    # ------------------------------------------------------------------ views

    def nodes(self) -> list[NodeView]:
        """Nodes with processes right now."""
        with self._lock:
            return [slot.view() for slot in self._slots.values()]

    def history(self) -> list[NodeView]:
        """Every node booted since start, as it was last seen (stopped ones included)."""
        with self._lock:
            live = [slot.view() for slot in self._slots.values()]
            return [*self._history, *live]

    def process_groups(self) -> list[int]:
        """Process groups of every process this runtime ever started (for the no-survivor check)."""
        with self._lock:
            return list(self._groups)

    # ------------------------------------------------------------------ events

    def _on_event(self, event: NodeEvent) -> None:
        if event.kind in _BOOT_EVENTS:
            self._boot(event)
        elif event.kind in _HALT_EVENTS:
            self._halt(event)

    def _boot(self, event: NodeEvent) -> None:
        key = (event.zone, event.node_id)
        deployment_id = event.labels.get(LABEL_DEPLOYMENT, "")
        with self._lock:
            if self._closed or key in self._slots:
                return
            port = free_loopback_port()
            slot = NodeSlot(
                zone=event.zone,
                node_id=event.node_id,
                deployment_id=deployment_id or "unlabelled",
                port=port,
                served_model="",
                work_dir=self._work_dir / f"{event.zone}-{event.node_id}",
                booted_at=time.monotonic(),
            )
            self._slots[key] = slot
        # The endpoint is attached before vLLM starts: the controller sees the node's address at once and the
        # monitor reports BOOTING (connection refused) until vLLM is ready, as on a TPU VM.
        try:
            self._world.set_node_endpoint(event.zone, event.node_id, "127.0.0.1", port)
        except KeyError:
            self._forget(slot, "the node vanished before it booted")
            return
        thread = threading.Thread(target=self._boot_processes, args=(slot,), name=f"boot-{event.node_id}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _boot_processes(self, slot: NodeSlot) -> None:
        logger = self._logger(slot.deployment_id)
        ids = {"deployment_id": slot.deployment_id, "node": slot.node_id, "zone": slot.zone}
        try:
            served_model, max_model_len = self._plan(slot.deployment_id)
            slot.served_model = served_model
            key_file = self._write_key_file(slot)
            logger.info(
                "node %s/%s READY: booting vLLM on CPU (tiny stand-in weights, served as %s) on 127.0.0.1:%d",
                slot.zone,
                slot.node_id,
                served_model,
                slot.port,
                extra=ids,
            )
            log_path = self._log_dir / f"vllm-{slot.deployment_id}.log"

            def launch() -> VllmProcess:
                return start_vllm(
                    self._tier,
                    port=slot.port,
                    api_key_file=key_file,
                    log_path=log_path,
                    served_model_name=served_model,
                    max_model_len=max_model_len,
                )

            vllm = launch()
            with self._lock:
                slot.vllm = vllm
                self._groups.append(vllm.pid)
                halted = slot.halted
            if halted:
                vllm.stop()
                return
            container_api = self._serve_container(slot, vllm, launch)
            agent = self._start_agent(slot, key_file, served_model, container_api)
            with self._lock:
                slot.agent = agent
                if agent is not None:
                    self._groups.append(agent.pid)
                halted = slot.halted
            if halted and agent is not None:
                stop_group(agent)
                return
            self._notify(slot)
            if vllm.wait_healthy(self._ready_timeout_s, poll_s=0.5):
                slot.ready_after_s = round(time.monotonic() - slot.booted_at, 1)
                slot.detail = f"vLLM answered /health after {slot.ready_after_s:.1f} s"
                logger.info("vLLM ready on %s after %.1f s (wall)", vllm.base_url, slot.ready_after_s, extra=ids)
            elif not slot.halted:
                code = vllm.returncode
                slot.detail = f"vLLM exited with {code}" if code is not None else "vLLM did not answer in time"
                logger.error("%s; log tail:\n%s", slot.detail, vllm.log_tail(), extra=ids)
            self._notify(slot)
        except (ControllerError, RuntimeError, ValueError, OSError) as exc:
            slot.detail = f"boot failed: {exc}"
            logger.error("node %s boot failed: %s", slot.node_id, exc, extra=ids)
            self._notify(slot)

    def _halt(self, event: NodeEvent) -> None:
        with self._lock:
            slot = self._slots.pop((event.zone, event.node_id), None)
        if slot is None:
            return
        reason = {"preempted": "preempted", "stopped": "node stopped", "deleted": "node deleted"}[event.kind]
        thread = threading.Thread(
            target=self._stop_slot, args=(slot, reason), name=f"halt-{event.node_id}", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    def _stop_slot(self, slot: NodeSlot, reason: str) -> None:
        with self._lock:
            slot.halted = reason
            container, container_api = slot.container, slot.container_api
        if container_api is not None:
            container_api.stop()
        if container is not None:
            container.close()  # waits for a restart in progress, then allows none
        with self._lock:
            vllm, agent = slot.vllm, slot.agent
        if agent is not None:
            stop_group(agent)
        if vllm is not None:
            vllm.stop()
        self._logger(slot.deployment_id).info(
            "node %s/%s: %s; vLLM and the node agent stopped",
            slot.zone,
            slot.node_id,
            reason,
            extra={"deployment_id": slot.deployment_id, "node": slot.node_id, "zone": slot.zone},
        )
        with self._lock:
            self._history.append(slot.view())
        self._notify(slot)

    def _forget(self, slot: NodeSlot, reason: str) -> None:
        with self._lock:
            self._slots.pop((slot.zone, slot.node_id), None)
            slot.halted = reason
            self._history.append(slot.view())

    # ------------------------------------------------------------------ the plan's local equivalent

    def _plan(self, deployment_id: str) -> tuple[str, int]:
        """The served model name and context length the deployment's serving plan gives (context capped)."""
        record = self._store.get_deployment(deployment_id) if deployment_id else None
        if record is None:
            return "tiny-llama", self._max_model_len_cap
        plan = build_serving_plan(record.spec, ServingEnvironment(project=self._project))
        return plan.engine.served_name, min(plan.engine.max_model_len, self._max_model_len_cap)

    def _write_key_file(self, slot: NodeSlot) -> Path:
        """The API key in a 0600 file in the node's 0700 folder (the VM keeps it in a root-only tmpfs file)."""
        key = self._secrets.get(self._api_key_secret)
        if not key:
            raise RuntimeError(
                f"no vLLM API key in secret {self._api_key_secret!r}: the local cloud runner creates it at start"
            )
        register_secret(key)
        slot.work_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(slot.work_dir, 0o700)
        path = slot.work_dir / "vllm-api-key"
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(key)
        return path

    def _serve_container(
        self, slot: NodeSlot, vllm: VllmProcess, launch: Callable[[], VllmProcess]
    ) -> ContainerApiServer:
        """The node's Docker Engine API twin over its vLLM process (restart relaunches with ``launch``)."""

        def relaunch() -> VllmProcess:
            with self._lock:
                if slot.halted:
                    raise RuntimeError(f"node {slot.node_id}: {slot.halted}")
            process = launch()
            with self._lock:
                slot.vllm = process
                self._groups.append(process.pid)
                slot.detail = "vLLM restarted through the container API"
            self._logger(slot.deployment_id).info(
                "node %s/%s: vLLM restarted (pid %d) through the container API",
                slot.zone,
                slot.node_id,
                process.pid,
                extra={"deployment_id": slot.deployment_id, "node": slot.node_id, "zone": slot.zone},
            )
            return process

        container = ProcessContainer(
            SERVING_CONTAINER_NAME, relaunch, log_path=vllm.log_path, clock=self._world.clock, process=vllm
        )
        server = serve_node_container(slot.work_dir, container)
        with self._lock:
            slot.container, slot.container_api = container, server
            halted = slot.halted
        if halted:
            server.stop()
            container.close()
        return server

    def _start_agent(
        self, slot: NodeSlot, key_file: Path, served_model: str, container_api: ContainerApiServer | None = None
    ) -> subprocess.Popen[bytes] | None:
        """``python -m shared.bench.node_agent`` beside vLLM, configured as the startup script configures it."""
        if importlib.util.find_spec(NODE_AGENT_MODULE) is None:
            slot.detail = "no node agent in this checkout (shared/bench/node_agent.py); benchmarks cannot run"
            return None
        env = {name: os.environ[name] for name in _INHERITED_ENV if name in os.environ}
        env.update(self._agent_env)
        env.update(
            TPUCTL_DEPLOYMENT_ID=slot.deployment_id,
            TPUCTL_NODE_VLLM_URL=f"http://127.0.0.1:{slot.port}",
            TPUCTL_NODE_API_KEY_FILE=str(key_file),
            TPUCTL_NODE_SERVED_MODEL=served_model,
            TPUCTL_NODE_NAME=f"{slot.zone}/{slot.node_id}",
            PYTHONUNBUFFERED="1",
        )
        if container_api is not None:
            env.update(TPUCTL_NODE_DOCKER_HOST=container_api.docker_host, TPUCTL_NODE_CONTAINER=SERVING_CONTAINER_NAME)
        log_path = self._log_dir / f"agent-{slot.deployment_id}.jsonl"
        with log_path.open("ab") as sink:
            argv = [sys.executable, "-m", NODE_AGENT_MODULE]
            return spawn_group(argv, what=f"node agent {slot.deployment_id}", stdout=sink, env=env, cwd=REPO_ROOT)

    # ------------------------------------------------------------------ logging and notifications

    def _logger(self, deployment_id: str) -> logging.Logger:
        """JSON lines into ``node-<deployment>.jsonl`` (the TPU VM's own log, as the gateway reads it)."""
        with self._lock:
            logger = self._loggers.get(deployment_id)
            if logger is None:
                logger = logging.getLogger(f"tpuctl.localcloud.node.{deployment_id}")
                logger.propagate = False
                logger.setLevel(logging.INFO)
                handler = logging.FileHandler(self._log_dir / f"node-{deployment_id}.jsonl", encoding="utf-8")
                handler.addFilter(RedactingFilter())
                handler.setFormatter(JsonFormatter())
                logger.addHandler(handler)
                self._handlers.append(handler)
                self._loggers[deployment_id] = logger
            return logger

    def _notify(self, slot: NodeSlot) -> None:
        if self._on_change is None:
            return
        try:
            self._on_change(slot.view())
        except Exception:  # a display callback must not break the node
            log.exception("node change callback failed")

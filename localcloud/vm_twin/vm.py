"""The VM twin, host side: a TPU VM for every READY node of the simulator, booted from its startup script.

When the simulator reports a node ready (created or started), :class:`VmFleet` writes the node's
``startup-script`` metadata value to a file (the bytes the controller rendered, nothing else), gives the VM a
metadata server (:mod:`metadata_server`), routes into it the local cloud's Google API stand-ins and simulator,
and powers it on: ``unshare`` makes its user, mount, network and PID namespaces and
``localcloud.vm_twin.vm_init`` runs the script inside them. The node's network endpoint is a loopback port that
reaches the VM's port 8000, so the monitor probes vLLM as it would on a VM's internal address. A preempted,
stopped or deleted node powers its VM off (SIGTERM to the VM, which stops its containers; everything in the VM's
PID namespace ends with it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localcloud.process_groups import spawn_group
from localcloud.tpu_sim import NodeEvent, World
from localcloud.vllm_cpu import REPO_ROOT, VllmCpuTier, stop_group
from localcloud.vm_twin.docker_cli import inspect
from localcloud.vm_twin.forward import Forwarder, tcp_listener, tcp_to, unix_listener, unix_to
from localcloud.vm_twin.google_apis import GoogleApis
from localcloud.vm_twin.hub_api import HubStandIn, catalog_repos
from localcloud.vm_twin.metadata_server import GuestAttributes, MetadataServer, TokenIssuer, VmIdentity
from localcloud.vm_twin.tpu_device import DEVICE_FILE
from localcloud.vm_twin.vm_init import VmConfig

__all__ = ["BUILDER_ACCOUNT_ID", "NodeView", "TwinVm", "VmFleet", "builder_service_account", "unshare_available"]

log = logging.getLogger("tpuctl.localcloud.vm")

LABEL_DEPLOYMENT = "tpuctl-deployment"
SERVING_PORT = 8000  # where the startup script's vLLM listens inside the VM
PROJECT_NUMBER = 412_345_678_901
# Who a twin VM runs as: the account the controller attached to its node, else the project's default (below). The
# prewarm builder's is Terraform's ``${name_prefix}-tpu-builder`` in the scenario's project: the one account the VMs'
# Storage stand-in lets write compile/ (the local cloud gives it to the functions as TPUCTL_BUILDER_SERVICE_ACCOUNT).
BUILDER_ACCOUNT_ID = "tpuctl-tpu-builder"
_BOOT_EVENTS = frozenset({"ready", "started"})
_HALT_EVENTS = frozenset({"preempted", "stopped", "deleted"})
_UNSHARE = (
    "unshare",
    "--user",
    "--map-root-user",
    "--net",
    "--mount",
    "--pid",
    "--fork",
    "--mount-proc",
    "--kill-child",
)


def default_service_account() -> str:
    """The project's default compute account, which a node the controller attached no account to runs as."""
    return f"{PROJECT_NUMBER}-compute@developer.gserviceaccount.com"


def builder_service_account(project: str) -> str:
    """The twin's prewarm builder account in ``project`` (``tpuctl-tpu-builder@<project>.iam.gserviceaccount.com``)."""
    return f"{BUILDER_ACCOUNT_ID}@{project}.iam.gserviceaccount.com"


def unshare_available() -> str | None:
    """None when this machine lets us make a VM's namespaces; otherwise why not (and what to do)."""
    import subprocess

    try:
        result = subprocess.run([*_UNSHARE, "true"], capture_output=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare (util-linux) cannot run here: {exc}"
    if result.returncode != 0:
        return (
            "user namespaces are not allowed here (unshare: "
            f"{result.stderr.decode(errors='replace').strip()}); enable kernel.unprivileged_userns_clone or run as root"
        )
    return None


@dataclass(frozen=True)
class NodeView:
    """A VM as the demo and tests see it (no secret, no process handle)."""

    zone: str
    node_id: str
    deployment_id: str
    port: int
    state: str  # booting, serving, failed, stopped
    vllm_pid: int | None  # the serving container's pid inside the VM
    agent_pid: int | None
    boot_s: float | None
    detail: str


@dataclass
class TwinVm:
    """One powered-on VM: its metadata server, its network pipes and its first process."""

    zone: str
    node_id: str
    deployment_id: str
    node_dir: Path
    socket_dir: Path
    metadata: MetadataServer
    endpoint: Forwarder
    routes: list[Forwarder]
    process: Any = None
    port: int = 0  # the loopback port that reaches the VM's port 8000 (the node's network endpoint)
    booted_at: float = field(default_factory=time.monotonic)
    ready_after_s: float | None = None
    halted: str | None = None

    @property
    def script_path(self) -> Path:
        return self.node_dir / "startup-script"

    @property
    def tpu_device_path(self) -> Path:
        """The stand-in TPU's device file (``localcloud.vm_twin.tpu_device``): write it to inject a reading."""
        return self.node_dir / DEVICE_FILE

    @property
    def console_path(self) -> Path:
        return self.node_dir / "console.log"

    def script_exit(self) -> int | None:
        try:
            return int((self.node_dir / "startup-script.exit").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as answer:
                return int(answer.status) == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def container(self, name: str) -> dict[str, Any] | None:
        """``docker inspect`` of a container in the VM, through its Engine API socket."""
        return inspect(str(self.socket_dir / "docker.sock"), name)

    def view(self) -> NodeView:
        code = self.script_exit()
        if self.halted:
            state = "stopped"
        elif self.ready_after_s is not None:
            state = "serving"
        elif code not in (None, 0):
            state = "failed"
        else:
            state = "booting"
        serving = self.container("tpuctl-vllm") if not self.halted else None
        agent = self.container("tpuctl-node-agent") if not self.halted else None
        return NodeView(
            zone=self.zone,
            node_id=self.node_id,
            deployment_id=self.deployment_id,
            port=self.port,
            state=state,
            vllm_pid=_pid(serving),
            agent_pid=_pid(agent),
            boot_s=self.ready_after_s,
            detail=self.halted or (f"startup script exited with {code}" if code else ""),
        )


def _pid(inspected: Mapping[str, Any] | None) -> int | None:
    pid = int(((inspected or {}).get("State") or {}).get("Pid") or 0)
    return pid or None


class VmFleet:
    """Powers a VM twin on for every READY node of ``world`` and off with the node."""

    def __init__(
        self,
        world: World,
        tier: VllmCpuTier,
        *,
        apis: GoogleApis,
        tokens: TokenIssuer,
        work_dir: Path,
        log_dir: Path,
        container_env: Mapping[str, str],
        routes: tuple[int, ...] = (),
        clock_endpoint: str | None = None,
        max_model_len: int = 512,
        ready_timeout_s: float = 900.0,
        on_change: Callable[[NodeView], None] | None = None,
    ) -> None:
        self._world = world
        self._tier = tier
        self._apis = apis
        self._tokens = tokens
        self._work_dir = work_dir
        self._log_dir = log_dir
        self._container_env = dict(container_env)
        self._routes = tuple(routes)
        self._clock_endpoint = clock_endpoint
        self._max_model_len = max_model_len
        self._ready_timeout_s = ready_timeout_s
        self._on_change = on_change
        # The Hugging Face Hub as the VMs reach it: every catalog model served as the tiny model's files.
        self.hub = HubStandIn(catalog_repos(tier.model_dir))
        self._vms: dict[tuple[str, str], TwinVm] = {}
        self._boots: dict[tuple[str, str], NodeEvent] = {}  # the event each VM powered on from, for a reboot
        self._history: list[NodeView] = []
        self._groups: list[int] = []
        self._lock = threading.Lock()
        self._closed = False

    def attach(self) -> None:
        self._work_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._log_dir.mkdir(parents=True, exist_ok=True)
        self.hub.start()
        self._world.add_node_listener(self._on_event)

    def close(self) -> None:
        self._world.remove_node_listener(self._on_event)
        with self._lock:
            self._closed = True
            vms = list(self._vms.values())
            self._vms.clear()
        for vm in vms:
            self._power_off(vm, "the local cloud shut down")
        self.hub.stop()

    def vms(self) -> list[TwinVm]:
        with self._lock:
            return list(self._vms.values())

    def nodes(self) -> list[NodeView]:
        return [vm.view() for vm in self.vms()]

    def history(self) -> list[NodeView]:
        with self._lock:
            done = list(self._history)
        return [*done, *self.nodes()]

    def process_groups(self) -> list[int]:
        with self._lock:
            return list(self._groups)

    def reboot(self, zone: str, node_id: str) -> None:
        """Restart the VM's guest on the same disk, as a host-maintenance or guest-initiated reboot does: the
        node stays READY, the startup script runs again and finds what the last boot left on the disk. Returns
        once the new boot has begun; KeyError when no VM runs for the node."""
        key = (zone, node_id)
        with self._lock:
            vm, event = self._vms.pop(key), self._boots[key]
        self._power_off(vm, "rebooted")
        threading.Thread(target=self._boot, args=(event,), name=f"vm-{node_id}", daemon=True).start()

    # ------------------------------------------------------------------ events

    def _on_event(self, event: NodeEvent) -> None:
        if event.kind in _BOOT_EVENTS:
            threading.Thread(target=self._boot, args=(event,), name=f"vm-{event.node_id}", daemon=True).start()
        elif event.kind in _HALT_EVENTS:
            with self._lock:
                vm = self._vms.pop((event.zone, event.node_id), None)
                self._boots.pop((event.zone, event.node_id), None)
            if vm is not None:
                reason = {"preempted": "preempted", "stopped": "node stopped", "deleted": "node deleted"}[event.kind]
                threading.Thread(target=self._power_off, args=(vm, reason), daemon=True).start()

    def _boot(self, event: NodeEvent) -> None:
        key = (event.zone, event.node_id)
        with self._lock:
            if self._closed or key in self._vms:
                return
        try:
            vm = self._power_on(event)
        except (OSError, RuntimeError, ValueError, KeyError) as exc:
            log.error("node %s/%s: the VM did not power on: %s", event.zone, event.node_id, exc)
            return
        with self._lock:
            if self._closed:
                stale = vm
            else:
                stale = None
                self._vms[key] = vm
                self._boots[key] = event
        if stale is not None:
            self._power_off(stale, "the local cloud shut down")
            return
        self._notify(vm)
        self._watch_ready(vm)

    def _power_on(self, event: NodeEvent) -> TwinVm:
        script = event.metadata.get("startup-script")
        if not script:
            raise ValueError("the node has no startup-script metadata: nothing would boot")
        node_dir = self._work_dir / f"{event.zone}-{event.node_id}"
        node_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        (node_dir / "startup-script").write_bytes(script.encode("utf-8"))
        for stale in ("startup-script.exit",):
            with contextlib.suppress(FileNotFoundError):
                (node_dir / stale).unlink()
        socket_dir = Path(tempfile.mkdtemp(prefix="tpuctl-vm-"))
        identity = self._identity(event)
        metadata = MetadataServer(identity, self._attributes(event), self._guest(event), self._tokens)
        metadata.start()
        routes = [metadata.port, self._apis.port, self.hub.port, *self._routes]
        pipes = [Forwarder(unix_listener(socket_dir / f"out-{p}.sock"), tcp_to(p), f"out-{p}") for p in routes]
        endpoint = Forwarder(tcp_listener(0), unix_to(socket_dir / f"in-{SERVING_PORT}.sock"), "endpoint")
        deployment = event.labels.get(LABEL_DEPLOYMENT) or "unlabelled"
        vm = TwinVm(
            event.zone, event.node_id, deployment, node_dir, socket_dir, metadata, endpoint, pipes, port=endpoint.port
        )
        self._world.set_node_endpoint(event.zone, event.node_id, "127.0.0.1", vm.port)
        config = self._config(vm, routes, metadata.host_port)
        config.write(node_dir / "vm.json")
        with (node_dir / "vm.log").open("ab") as sink:
            vm.process = spawn_group(
                [*_UNSHARE, sys.executable, "-m", "localcloud.vm_twin.vm_init", str(node_dir / "vm.json")],
                what=f"VM twin {event.zone}/{event.node_id}",
                stdout=sink,
                env=_host_env(),
                cwd=REPO_ROOT,
            )
        with self._lock:
            self._groups.append(vm.process.pid)
        log.info(
            "node %s/%s: VM powered on; its startup script runs (console %s)", vm.zone, vm.node_id, vm.console_path
        )
        return vm

    def _config(self, vm: TwinVm, routes: list[int], metadata_host: str) -> VmConfig:
        metadata_env = {
            "GCE_METADATA_HOST": metadata_host,
            "GCE_METADATA_IP": metadata_host,
            "GCE_METADATA_ROOT": metadata_host,
        }
        endpoints = {**metadata_env, **self._apis.endpoint_env()}
        return VmConfig(
            node_dir=str(vm.node_dir),
            socket_dir=str(vm.socket_dir),
            script_path=str(vm.script_path),
            console_path=str(vm.console_path),
            deployment_id=vm.deployment_id,
            log_dir=str(self._log_dir),
            vllm_python=str(self._tier.python),
            model_dir=str(self._tier.model_dir),
            repo_root=str(REPO_ROOT),
            routes=routes,
            inbound=[SERVING_PORT],
            script_env=endpoints,
            container_env={
                **self._container_env,
                **endpoints,  # last: the stand-ins as this VM reaches them, not as the controller does
                "TPUCTL_NODE_NAME": f"{vm.zone}/{vm.node_id}",
                "HF_ENDPOINT": self.hub.base_url,  # the download container's Hub (vLLM itself runs offline)
                # The stand-in TPU beside the serving vLLM (image_vllm.start_tpu_device), run by this Python.
                "TPUCTL_TWIN_HOST_PYTHON": sys.executable,
                "TPUCTL_TWIN_REPO": str(REPO_ROOT),
                "TPUCTL_TWIN_TPU_DEVICE_FILE": str(vm.tpu_device_path),
            },
            clock_endpoint=self._clock_endpoint,
            max_model_len=self._max_model_len,
        )

    def _identity(self, event: NodeEvent) -> VmIdentity:
        body = self._world.node(event.zone, event.node_id) or {}
        account = (body.get("serviceAccount") or {}).get("email") or default_service_account()
        return VmIdentity(
            project=self._apis.project,
            project_number=PROJECT_NUMBER,
            zone=event.zone,
            name=event.node_id,
            instance_id=int(body.get("id") or abs(hash((event.zone, event.node_id))) % 10**15),
            service_account=account,
        )

    def _attributes(self, event: NodeEvent) -> Callable[[], Mapping[str, str]]:
        def read() -> Mapping[str, str]:
            body = self._world.node(event.zone, event.node_id) or {}
            # The TPU service's own attributes of a TPU VM (the startup script hands them to the serving container,
            # which cannot reach this server), then the node's metadata.
            tpu = {"accelerator-type": str(body.get("acceleratorType") or ""), "agent-worker-number": "0"}
            return {**{key: value for key, value in tpu.items() if value}, **(body.get("metadata") or event.metadata)}

        return read

    def _guest(self, event: NodeEvent) -> GuestAttributes:
        world, zone, node = self._world, event.zone, event.node_id
        return GuestAttributes(
            put=lambda namespace, key, value: world.put_guest_attribute(zone, node, namespace, key, value),
            read=lambda: world.guest_attributes(zone, node),
            delete=lambda namespace, key: world.delete_guest_attribute(zone, node, namespace, key),
        )

    def _watch_ready(self, vm: TwinVm) -> None:
        deadline = time.monotonic() + self._ready_timeout_s
        while time.monotonic() < deadline and not vm.halted:
            if vm.healthy():
                vm.ready_after_s = round(time.monotonic() - vm.booted_at, 1)
                log.info("node %s/%s: vLLM serving after %.1f s (wall)", vm.zone, vm.node_id, vm.ready_after_s)
                self._notify(vm)
                return
            if vm.script_exit() not in (None, 0):
                log.error("node %s/%s: the startup script failed; console %s", vm.zone, vm.node_id, vm.console_path)
                self._notify(vm)
                return
            time.sleep(0.5)

    def _power_off(self, vm: TwinVm, reason: str) -> None:
        vm.halted = reason
        if vm.process is not None:
            stop_group(vm.process, timeout_s=20.0)
        vm.endpoint.close()
        for pipe in vm.routes:
            pipe.close()
        vm.metadata.stop()
        shutil.rmtree(vm.socket_dir, ignore_errors=True)
        log.info("node %s/%s: %s; VM powered off", vm.zone, vm.node_id, reason)
        with self._lock:
            self._history.append(vm.view())
        self._notify(vm)

    def _notify(self, vm: TwinVm) -> None:
        if self._on_change is None:
            return
        try:
            self._on_change(vm.view())
        except Exception:  # a display callback must not break the VM
            log.exception("VM change callback failed")


def _host_env() -> dict[str, str]:
    env = {name: os.environ[name] for name in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "TZ") if name in os.environ}
    env.update(PYTHONPATH=str(REPO_ROOT), PYTHONUNBUFFERED="1")
    return env

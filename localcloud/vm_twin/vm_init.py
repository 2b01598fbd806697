"""The VM twin's first process: inside its own user, mount, network and PID namespaces, boot like a TPU VM.

Run as ``python -m localcloud.vm_twin.vm_init CONFIG.json`` under ``unshare`` (``localcloud.vm_twin.vm`` does).
As process 1 of the VM it:

1. brings the VM's loopback up and gives the VM its own disk: ``/var/lib`` and ``/var/log`` are bound from the
   node's folder (kept across a stop and start, as a boot disk is), ``/run`` is a fresh tmpfs (lost at power off);
2. opens the VM's network to the local cloud: each service port of :class:`VmConfig` ``routes`` listens on the
   VM's loopback at the same number, and each ``inbound`` port of the VM is reachable from outside (unix sockets
   in ``socket_dir`` carry both ways);
3. starts the container runtime on ``/var/run/docker.sock`` and puts the ``docker`` command on the script's PATH;
4. executes the startup script (the file written from the node's metadata, byte for byte) with ``bash``, its
   output in the console log, as the guest environment runs a startup script;
5. keeps the containers running until SIGTERM (the VM stops); leaving ends every process in the VM.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

from localcloud.vm_twin.containers import ContainerRuntime, ContainerSpec, EngineApiServer
from localcloud.vm_twin.forward import Forwarder, tcp_listener, tcp_to, unix_listener, unix_to
from localcloud.vm_twin.image import VllmCpuImage

__all__ = ["VmConfig", "main"]

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SERVING_CONTAINER = "tpuctl-vllm"
AGENT_CONTAINER = "tpuctl-node-agent"


@dataclass(frozen=True)
class VmConfig:
    """Everything the VM's first process needs; written by the host side as JSON."""

    node_dir: str
    socket_dir: str
    script_path: str
    console_path: str
    deployment_id: str
    log_dir: str
    vllm_python: str
    model_dir: str
    repo_root: str
    routes: list[int] = field(default_factory=list)
    inbound: list[int] = field(default_factory=list)
    script_env: dict[str, str] = field(default_factory=dict)
    container_env: dict[str, str] = field(default_factory=dict)
    clock_endpoint: str | None = None
    max_model_len: int = 512

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1), encoding="utf-8")

    @classmethod
    def read(cls, path: Path) -> VmConfig:
        return cls(**json.loads(path.read_text(encoding="utf-8")))


def _run(*argv: str) -> None:
    program = shutil.which(argv[0], path=SYSTEM_PATH) or argv[0]
    subprocess.run([program, *argv[1:]], check=True, capture_output=True, timeout=30)


def give_disk(node_dir: Path) -> None:
    """Loopback up; ``/var/lib``, ``/var/log`` from the node's disk; ``/run`` on tmpfs."""
    _run("ip", "link", "set", "lo", "up")
    for name in ("var-lib", "var-log"):
        (node_dir / "disk" / name).mkdir(parents=True, exist_ok=True)
    _run("mount", "--bind", str(node_dir / "disk" / "var-lib"), "/var/lib")
    _run("mount", "--bind", str(node_dir / "disk" / "var-log"), "/var/log")
    _run("mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", "/run")
    if not Path("/var/run").is_symlink():
        _run("mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", "/var/run")


def open_network(config: VmConfig) -> list[Forwarder]:
    sockets = Path(config.socket_dir)
    forwarders = [
        Forwarder(tcp_listener(port), unix_to(sockets / f"out-{port}.sock"), f"out-{port}") for port in config.routes
    ]
    forwarders += [
        Forwarder(unix_listener(sockets / f"in-{port}.sock"), tcp_to(port), f"in-{port}") for port in config.inbound
    ]
    return forwarders


def container_log(config: VmConfig, spec: ContainerSpec) -> Path:
    """The local log layout: vLLM's output as ``vllm-<deployment>.log``, the agent's as ``agent-<...>.jsonl``."""
    deployment = spec.labels.get("tpuctl.deployment") or config.deployment_id
    log_dir = Path(config.log_dir)
    if spec.name == SERVING_CONTAINER:
        return log_dir / f"vllm-{deployment}.log"
    if spec.name == AGENT_CONTAINER:
        return log_dir / f"agent-{deployment}.jsonl"
    return log_dir / f"container-{deployment}-{spec.name}.log"


def _now(config: VmConfig) -> Callable[[], datetime] | None:
    """The VM's clock: the simulator's virtual time in the local cloud (container start times are compared with
    command times on it), else the system clock."""
    if not config.clock_endpoint:
        return None
    from shared.adapters.sim_clock import SimulatorClock

    return SimulatorClock(config.clock_endpoint).now


def start_containers(config: VmConfig) -> tuple[ContainerRuntime, EngineApiServer]:
    node_dir = Path(config.node_dir)
    image = VllmCpuImage(
        node_dir / "image",
        python=Path(config.vllm_python),
        model_dir=Path(config.model_dir),
        log_path=lambda spec: container_log(config, spec),
        env=config.container_env,
        max_model_len=config.max_model_len,
    )
    runtime = ContainerRuntime(image, now=_now(config))
    # The socket lives where the host can reach it too (the fleet reads container pids); the VM finds it at the
    # usual place, /var/run/docker.sock.
    server = EngineApiServer(runtime, Path(config.socket_dir) / "docker.sock").start()
    Path("/run/docker.sock").symlink_to(Path(config.socket_dir) / "docker.sock")
    return runtime, server


def docker_command(node_dir: Path, repo_root: str) -> Path:
    """``<node>/bin/docker``: the twin's docker CLI, run by this Python."""
    bin_dir = node_dir / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    docker = bin_dir / "docker"
    docker.write_text(
        f'#!/bin/sh\nPYTHONPATH="{repo_root}" exec "{sys.executable}" -m localcloud.vm_twin.docker_cli "$@"\n',
        encoding="utf-8",
    )
    docker.chmod(0o755)
    return bin_dir


def run_script(config: VmConfig, bin_dir: Path) -> int:
    env = {"PATH": f"{bin_dir}:{SYSTEM_PATH}", "HOME": "/root", "LANG": "C.UTF-8", **config.script_env}
    with open(config.console_path, "ab") as console:
        console.write(f"{datetime.now().isoformat()} twin: running the startup script\n".encode())
        console.flush()
        result = subprocess.run(
            ["/bin/bash", config.script_path],
            stdin=subprocess.DEVNULL,
            stdout=console,
            stderr=subprocess.STDOUT,
            env=env,
            cwd="/",
        )
        console.write(f"{datetime.now().isoformat()} twin: startup script exited with {result.returncode}\n".encode())
    return result.returncode


def main(argv: list[str]) -> int:
    config = VmConfig.read(Path(argv[0]))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    give_disk(Path(config.node_dir))
    forwarders = open_network(config)
    runtime, server = start_containers(config)
    bin_dir = docker_command(Path(config.node_dir), config.repo_root)

    def boot() -> None:
        code = run_script(config, bin_dir)
        (Path(config.node_dir) / "startup-script.exit").write_text(str(code), encoding="utf-8")

    threading.Thread(target=boot, name="startup-script", daemon=True).start()
    stop.wait()  # the VM stops: containers get SIGTERM; leaving ends the script and all else in the VM
    runtime.shutdown()
    server.stop()
    for forwarder in forwarders:
        forwarder.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

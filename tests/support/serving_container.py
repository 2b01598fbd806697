"""A stand-in "container" for tests that do not need a real vLLM: a small Python process that logs and sleeps.

It runs in the VM twin's container runtime (``localcloud.vm_twin.containers``) behind the same Engine API socket
a VM's node agent uses, as a real process in its own group (so a restart really stops one pid and starts
another) writing to a real log file. Each start appends its pid to ``boots.txt``, which is how a test sees every
process the container ever had, and its pid with the container's command (entrypoint and ``Cmd``, as its own
argv) to ``commands.jsonl``, which is how a test sees what each process was started with.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from localcloud.vm_twin import docker_cli
from localcloud.vm_twin.containers import Container, ContainerRuntime, ContainerSpec, EngineApiServer, Launch
from shared.domain.launch import KEY_WRAPPER, KEY_WRAPPER_NAME
from shared.ports import Clock

__all__ = ["SOCKET_WRAPPER", "Boot", "StandIn", "docker", "script_run_words", "serve_stand_in"]

# Records its pid (and its command), prints its boot number and the lines it was given, then sleeps until stopped.
_PROGRAM = """
import json, os, sys, time
with open(sys.argv[2], "a") as commands:
    commands.write(json.dumps({"pid": os.getpid(), "argv": sys.argv[4:]}) + "\\n")
with open(sys.argv[1], "a") as boots:
    boots.write(f"{os.getpid()}\\n")
with open(sys.argv[1]) as boots:
    number = len(boots.read().split())
print("boot", number, flush=True)
for line in json.loads(sys.argv[3]):
    print(line, file=sys.stderr, flush=True)
time.sleep(600)
"""


@dataclass(frozen=True)
class Boot:
    """One process the container had."""

    pid: int

    def alive(self) -> bool:
        try:
            state = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        return state not in ("Z", "X")


class SleepyImage:
    """An image whose every container runs the sleepy program, logging to ``log_path``."""

    def __init__(self, work_dir: Path, lines: tuple[str, ...]) -> None:
        self.log_path = work_dir / "vllm.log"
        self.boots = work_dir / "boots.txt"
        self.commands = work_dir / "commands.jsonl"
        self._lines = lines

    def has(self, reference: str) -> bool:
        return reference == "stand-in:1"

    def command(self, spec: ContainerSpec) -> Launch:
        command = (*spec.entrypoint, *spec.cmd)
        argv = (sys.executable, "-c", _PROGRAM, str(self.boots), str(self.commands), json.dumps(self._lines), *command)
        return Launch(argv=argv, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, log_path=self.log_path)


@dataclass
class StandIn:
    container: Container
    server: EngineApiServer
    image: SleepyImage

    @property
    def docker_host(self) -> str:
        return f"unix://{self.server.socket_path}"

    @property
    def starts(self) -> list[Boot]:
        """Every process so far (a start is counted once its process wrote its pid: wait for that)."""
        _wait_for_boot(self.image, self.container.restart_count + 1)
        return [Boot(int(pid)) for pid in self.image.boots.read_text().split()]

    @property
    def restarts(self) -> int:
        return self.container.restart_count

    def commands(self) -> list[tuple[int, list[str]]]:
        """(pid, argv) of every process the container had, in order of start."""
        lines = self.image.commands.read_text().splitlines() if self.image.commands.exists() else []
        return [(entry["pid"], entry["argv"]) for entry in map(json.loads, lines)]


@contextlib.contextmanager
def serve_stand_in(
    work_dir: Path,
    *,
    name: str = "tpuctl-vllm",
    lines: tuple[str, ...] = (),
    clock: Clock | None = None,
    spec: ContainerSpec | None = None,
) -> Iterator[StandIn]:
    """A stand-in container named ``name`` (created from ``spec`` when given, its image ``stand-in:1``) behind a
    Docker API socket in ``work_dir``; everything stopped after."""
    work_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    image = SleepyImage(work_dir, lines)
    now: object = clock.now if clock is not None else None
    runtime = ContainerRuntime(image, now=now if callable(now) else None)  # type: ignore[arg-type]
    container = runtime.create(spec or ContainerSpec(name=name, image="stand-in:1", entrypoint=(), cmd=("sleepy",)))
    runtime.start(name)
    _wait_for_boot(image, 1)
    server = EngineApiServer(runtime, work_dir / "docker.sock").start()
    try:
        yield StandIn(container, server, image)
    finally:
        server.stop()
        runtime.shutdown()


def _wait_for_boot(image: SleepyImage, count: int, timeout_s: float = 10.0) -> None:
    deadline = datetime.now().timestamp() + timeout_s
    while datetime.now().timestamp() < deadline:
        with contextlib.suppress(FileNotFoundError):
            if len(image.boots.read_text().split()) >= count:
                return
        import time

        time.sleep(0.02)
    raise AssertionError(f"the stand-in container did not start {count} time(s) in {timeout_s} s")


SOCKET_WRAPPER = 'rm -f -- "$0" && exec "$@"'
"""The startup script's socket wrapper, without its metrics relay."""


def script_run_words(image: str, vllm_argv: Sequence[str], *, name: str, device: str, hf_cache: Path) -> list[str]:
    """``docker run`` as the startup script's ``start_vllm`` writes it (``shared/domain/startup_script_template.py``):
    labels, restart policy, ``--net=none``, shm, ulimit, a device, mounts, env, the entrypoint and both wrappers."""
    socket = "/run/tpuctl/vllm.sock"
    return [
        "run", "-d", "--name", name,
        "--label", "tpuctl.deployment=gemma-a", "--label", "tpuctl.plan-hash=0123abcd",
        "--restart", "unless-stopped", "--net=none", "--shm-size", "16g", "--ulimit", "memlock=-1:-1",
        "--device", f"{device}:{device}",
        "-v", "/dev/shm:/dev/shm", "-v", f"{hf_cache}:/root/.cache/huggingface",
        "--env", "VLLM_HOST_IP=127.0.0.1", "--env", "FORWARDED_ALLOW_IPS=*",
        "--entrypoint", "/bin/sh", image, "-c", SOCKET_WRAPPER, socket,
        "/bin/sh", "-c", KEY_WRAPPER, KEY_WRAPPER_NAME, *vllm_argv, "--uds", socket,
    ]  # fmt: skip


def docker(host: str, words: Sequence[str]) -> int:
    """The VM twin's ``docker`` command (``localcloud.vm_twin.docker_cli``) against ``host``, in this process."""
    previous = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = host
    try:
        return docker_cli.main(list(words))
    finally:
        if previous is None:
            os.environ.pop("DOCKER_HOST", None)
        else:
            os.environ["DOCKER_HOST"] = previous

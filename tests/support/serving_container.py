"""A stand-in "container" for tests that do not need a real vLLM: a small Python process that logs and sleeps.

It runs in the VM twin's container runtime (``localcloud.vm_twin.containers``) behind the same Engine API socket
a VM's node agent uses, as a real process in its own group (so a restart really stops one pid and starts
another) writing to a real log file. Each start appends its pid to ``boots.txt``, which is how a test sees every
process the container ever had.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from localcloud.vm_twin.containers import Container, ContainerRuntime, ContainerSpec, EngineApiServer, Launch
from shared.ports import Clock

__all__ = ["Boot", "StandIn", "serve_stand_in"]

# Records its pid, prints its boot number and the lines it was given, then sleeps until stopped.
_PROGRAM = """
import os, sys, time
with open(sys.argv[1], "a") as boots:
    boots.write(f"{os.getpid()}\\n")
with open(sys.argv[1]) as boots:
    number = len(boots.read().split())
print("boot", number, flush=True)
for line in sys.argv[2:]:
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
        self._lines = lines

    def has(self, reference: str) -> bool:
        return reference == "stand-in:1"

    def command(self, spec: ContainerSpec) -> Launch:
        argv = (sys.executable, "-c", _PROGRAM, str(self.boots), *self._lines)
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


@contextlib.contextmanager
def serve_stand_in(
    work_dir: Path, *, name: str = "tpuctl-vllm", lines: tuple[str, ...] = (), clock: Clock | None = None
) -> Iterator[StandIn]:
    """A stand-in container named ``name`` behind a Docker API socket in ``work_dir``; everything stopped after."""
    work_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    image = SleepyImage(work_dir, lines)
    now: object = clock.now if clock is not None else None
    runtime = ContainerRuntime(image, now=now if callable(now) else None)  # type: ignore[arg-type]
    container = runtime.create(ContainerSpec(name=name, image="stand-in:1", entrypoint=(), cmd=("sleepy",)))
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

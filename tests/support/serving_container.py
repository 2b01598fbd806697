"""A stand-in "container" for tests that do not need a real vLLM: a small Python process that logs and sleeps.

It is a real process in its own group (so restart really stops one pid and starts another) writing to a real
log file, served by the local cloud's Docker Engine API twin (``localcloud.container_api``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from localcloud.container_api import ContainerApiServer, ProcessContainer, serve_node_container
from shared.adapters.clock import SystemClock
from shared.ports import Clock

__all__ = ["SleepyProcess", "StandIn", "serve_stand_in", "start_sleepy"]

# Prints its boot number and the lines it was given, then sleeps until stopped.
_PROGRAM = """
import sys, time
print("boot", sys.argv[1], flush=True)
for line in sys.argv[2:]:
    print(line, file=sys.stderr, flush=True)
time.sleep(600)
"""


@dataclass
class SleepyProcess:
    """``localcloud.container_api.ContainerProcess`` over a short Python program."""

    _process: subprocess.Popen[bytes] = field(repr=False)

    @property
    def pid(self) -> int:
        return self._process.pid

    def alive(self) -> bool:
        return self._process.poll() is None

    def stop(self, timeout_s: float = 10.0) -> int | None:
        if self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGTERM)
            try:
                self._process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._process.pid, signal.SIGKILL)
                self._process.wait(timeout=timeout_s)
        return self._process.returncode


def start_sleepy(log_path: Path, boot: int, lines: tuple[str, ...] = ()) -> SleepyProcess:
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-c", _PROGRAM, str(boot), *lines],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    return SleepyProcess(process)


@dataclass
class StandIn:
    container: ProcessContainer
    server: ContainerApiServer
    starts: list[SleepyProcess]

    @property
    def docker_host(self) -> str:
        return self.server.docker_host


@contextlib.contextmanager
def serve_stand_in(
    work_dir: Path, *, name: str = "tpuctl-vllm", lines: tuple[str, ...] = (), clock: Clock | None = None
) -> Iterator[StandIn]:
    """A stand-in container named ``name`` behind a Docker API socket in ``work_dir``; everything stopped after."""
    work_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    log_path = work_dir / "vllm.log"
    starts: list[SleepyProcess] = []

    def launch() -> SleepyProcess:
        process = start_sleepy(log_path, len(starts) + 1, lines)
        starts.append(process)
        return process

    container = ProcessContainer(name, launch, log_path=log_path, clock=clock or SystemClock())
    container.start()
    server = serve_node_container(work_dir, container)
    try:
        yield StandIn(container, server, starts)
    finally:
        server.stop()
        container.close()
        for process in starts:
            process.stop(timeout_s=5)

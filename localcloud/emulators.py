"""The real Firestore and Pub/Sub emulators from google-cloud-cli, for ``python -m localcloud up --emulators``.

They are not on any package registry: they ship with the machine image's google-cloud-cli
(docs/reference/gcp-local.md §1), so
this module finds them offline and says exactly what is missing when it cannot. Each emulator leads its own
process group (the Firestore launcher is a bash wrapper that forks ``java``), and :meth:`Emulator.stop` signals
the group: SIGTERM, then SIGKILL after a grace period, so no JVM outlives the stack.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from localcloud.process_groups import spawn_group
from localcloud.vllm_cpu import free_loopback_port

__all__ = ["EMULATORS", "Emulator", "EmulatorKind", "find_emulator", "start_emulator"]

_SDK_PLACES = (
    Path("/usr/lib/google-cloud-sdk"),
    Path("/usr/share/google-cloud-sdk"),
    Path("/opt/google-cloud-sdk"),
    Path.home() / "google-cloud-sdk",
)


@dataclass(frozen=True)
class EmulatorKind:
    """One emulator: its launcher inside the SDK and the variable the google-cloud clients read."""

    name: str
    component: str
    launcher: str
    env_var: str

    def argv(self, launcher: Path, port: int) -> list[str]:
        if self.name == "firestore":
            return [str(launcher), "start", "--host=127.0.0.1", f"--port={port}"]
        return [str(launcher), "--host=127.0.0.1", f"--port={port}"]


EMULATORS = (
    EmulatorKind(
        "firestore",
        "cloud-firestore-emulator",
        "platform/cloud-firestore-emulator/cloud_firestore_emulator",
        "FIRESTORE_EMULATOR_HOST",
    ),
    EmulatorKind(
        "pubsub", "pubsub-emulator", "platform/pubsub-emulator/bin/cloud-pubsub-emulator", "PUBSUB_EMULATOR_HOST"
    ),
)


@dataclass
class Emulator:
    """A started emulator; ``host_port`` goes into its ``env_var``."""

    kind: EmulatorKind
    port: int
    log_path: Path
    process: subprocess.Popen[bytes]

    @property
    def host_port(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL what is left after ``grace_s``."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=grace_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=grace_s)


def find_emulator(kind: EmulatorKind) -> Path | str:
    """The launcher's path, or a sentence saying what is missing (google-cloud-cli, the component, java)."""
    roots = []
    gcloud = shutil.which("gcloud")
    if gcloud:
        roots.append(Path(gcloud).resolve().parent.parent)
    roots.extend(_SDK_PLACES)
    sdk = next((root for root in roots if (root / "platform").is_dir()), None)
    if sdk is None:
        return f"the {kind.name} emulator needs google-cloud-cli, which is not installed here (no gcloud on PATH)"
    launcher = sdk / kind.launcher
    if not os.access(launcher, os.X_OK):
        return f"google-cloud-cli at {sdk} has no {kind.component} component ({launcher} is missing)"
    if shutil.which("java") is None:
        return f"the {kind.name} emulator needs java (Java 11+), which is not on PATH"
    return launcher


def start_emulator(kind: EmulatorKind, launcher: Path, log_dir: Path, ready_timeout_s: float = 60.0) -> Emulator:
    """Start on a free loopback port in its own session; return once ``GET /`` answers ``Ok``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    port = free_loopback_port()
    log_path = log_dir / f"{kind.name}-emulator.log"
    env = {name: os.environ[name] for name in ("PATH", "HOME", "LANG", "JAVA_HOME", "TMPDIR") if name in os.environ}
    env["CLOUDSDK_CORE_DISABLE_PROMPTS"] = "1"
    with log_path.open("ab") as sink:
        process = spawn_group(kind.argv(launcher, port), what=f"{kind.name} emulator", stdout=sink, env=env)
    emulator = Emulator(kind, port, log_path, process)
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            emulator.stop()
            raise RuntimeError(f"the {kind.name} emulator exited with {process.returncode}; see {log_path}")
        if _answers_ok(f"http://{emulator.host_port}/"):
            return emulator
        time.sleep(0.2)
    emulator.stop()
    raise RuntimeError(f"the {kind.name} emulator did not answer within {ready_timeout_s:.0f} s; see {log_path}")


def _answers_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as response:  # noqa: S310 (a loopback URL we built)
            return bool(response.status == 200 and response.read().strip() == b"Ok")
    except (urllib.error.URLError, OSError):
        return False

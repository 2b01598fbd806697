"""Find, start and stop the Firestore and Pub/Sub emulators that ship with google-cloud-cli, offline.

The emulators are not on any package registry: they come with the machine image (docs/reference/gcp-local.md §1). So
this
module only *detects* them; when a piece is missing, :func:`locate` returns a :class:`Missing` whose ``reason``
says exactly which one, and the fixtures skip with it.

A started emulator leads its own session (process group): the Firestore launcher is a bash wrapper that forks
``java``, so killing the wrapper alone would leave the JVM holding the port. :meth:`RunningEmulator.stop` signals
the whole group: SIGTERM, up to 10 s of grace, then SIGKILL.

Usage (what the session fixtures in ``fixtures_emulators.py`` do)::

    found = locate(FIRESTORE)
    if isinstance(found, Missing):
        pytest.skip(found.reason)
    emulator = start(found, project="demo-tpuctl", log_dir=tmp_dir)
    try:
        ...  # clients read emulator.env_var = emulator.host_port
    finally:
        emulator.stop()
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "FIRESTORE",
    "PUBSUB",
    "EmulatorKind",
    "EmulatorStartError",
    "Launcher",
    "Missing",
    "RunningEmulator",
    "find_java",
    "find_sdk_root",
    "free_loopback_port",
    "locate",
    "reset_firestore",
    "start",
    "unique_name",
]

READY_TIMEOUT_S = 60.0
STOP_GRACE_S = 10.0
LOOPBACK = "127.0.0.1"

# Where google-cloud-cli lands when installed from Debian packages, tarballs or the installer script.
_SDK_CANDIDATES = (
    Path("/usr/lib/google-cloud-sdk"),
    Path("/usr/share/google-cloud-sdk"),
    Path("/opt/google-cloud-sdk"),
    Path.home() / "google-cloud-sdk",
)


@dataclass(frozen=True)
class EmulatorKind:
    """One emulator: where its launcher sits in the SDK and how the client libraries find it."""

    name: str  # "firestore" | "pubsub"
    title: str  # for messages: "Firestore emulator"
    component: str  # gcloud component id, named in skip reasons
    launcher: str  # path relative to the SDK root
    env_var: str  # what the google-cloud clients read

    def argv(self, launcher: Path, port: int) -> list[str]:
        """The launch command on loopback; never built from a shell string."""
        if self.name == "firestore":
            return [str(launcher), "start", f"--host={LOOPBACK}", f"--port={port}"]
        return [str(launcher), f"--host={LOOPBACK}", f"--port={port}"]


FIRESTORE = EmulatorKind(
    name="firestore",
    title="Firestore emulator",
    component="cloud-firestore-emulator",
    launcher="platform/cloud-firestore-emulator/cloud_firestore_emulator",
    env_var="FIRESTORE_EMULATOR_HOST",
)
PUBSUB = EmulatorKind(
    name="pubsub",
    title="Pub/Sub emulator",
    component="pubsub-emulator",
    launcher="platform/pubsub-emulator/bin/cloud-pubsub-emulator",
    env_var="PUBSUB_EMULATOR_HOST",
)


@dataclass(frozen=True)
class Launcher:
    """An emulator that is present and can be started."""

    kind: EmulatorKind
    path: Path
    java: Path


@dataclass(frozen=True)
class Missing:
    """Why an emulator cannot run here; ``reason`` is the skip message shown in the test output."""

    kind: EmulatorKind
    reason: str


class EmulatorStartError(RuntimeError):
    """The emulator is installed but did not come up; carries the tail of its output."""


def find_sdk_root(usual_places: Sequence[Path] = _SDK_CANDIDATES) -> Path | None:
    """The google-cloud-cli root, found offline: ``CLOUDSDK_ROOT_DIR``, then ``gcloud`` on PATH, then usual places.

    ``gcloud info`` would answer too, but it takes seconds and touches the user's gcloud config.
    """
    candidates: list[Path] = []
    if configured := os.environ.get("CLOUDSDK_ROOT_DIR"):
        candidates.append(Path(configured))
    if gcloud := shutil.which("gcloud"):
        candidates.append(Path(gcloud).resolve().parent.parent)  # <root>/bin/gcloud
    candidates.extend(usual_places)
    for candidate in candidates:
        if (candidate / "bin" / "gcloud").exists() or (candidate / "platform").is_dir():
            return candidate
    return None


def find_java() -> Path | None:
    """The java both launchers will run: ``$JAVA_HOME/bin/java`` if set, else ``java`` on PATH."""
    if java_home := os.environ.get("JAVA_HOME"):
        candidate = Path(java_home) / "bin" / "java"
        if os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("java")
    return Path(found) if found else None


def locate(kind: EmulatorKind, *, usual_places: Sequence[Path] = _SDK_CANDIDATES) -> Launcher | Missing:
    """Check the SDK, the component and java, without starting anything or going online."""
    sdk = find_sdk_root(usual_places)
    if sdk is None:
        return Missing(
            kind,
            f"{kind.title} not found: google-cloud-cli is not installed on this machine (no gcloud on PATH, "
            f"no CLOUDSDK_ROOT_DIR, no SDK in {', '.join(str(p) for p in usual_places)}); emulator tests skipped",
        )
    launcher = sdk / kind.launcher
    if not os.access(launcher, os.X_OK):
        return Missing(
            kind,
            f"{kind.title} not found: google-cloud-cli at {sdk} has no {kind.component} component "
            f"({launcher} is missing); emulator tests skipped",
        )
    java = find_java()
    if java is None:
        return Missing(
            kind,
            f"{kind.title} cannot run: java is not installed (no JAVA_HOME, no java on PATH; "
            f"the emulators need Java 11+); emulator tests skipped",
        )
    return Launcher(kind, launcher, java)


def free_loopback_port() -> int:
    """A port the kernel just handed out on 127.0.0.1 (closed again so the emulator can bind it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def unique_name(prefix: str) -> str:
    """A per-test resource name (Pub/Sub has no reset; names need 3+ characters and a letter first)."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@dataclass
class RunningEmulator:
    """A started emulator. ``host_port`` is what goes in ``FIRESTORE_EMULATOR_HOST`` / ``PUBSUB_EMULATOR_HOST``."""

    kind: EmulatorKind
    host: str
    port: int
    project: str
    process: subprocess.Popen[bytes]
    log_path: Path
    _stopped: bool = field(default=False, repr=False)

    @property
    def host_port(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"http://{self.host_port}"

    @property
    def env_var(self) -> str:
        return self.kind.env_var

    def log_tail(self, max_chars: int = 2000) -> str:
        """The end of the emulator's combined output, for failure messages."""
        try:
            return self.log_path.read_text(errors="replace")[-max_chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        """Stop the whole process group: SIGTERM, wait up to 10 s, then SIGKILL. Safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        pgid = self.process.pid  # session leader: its pid is the group id
        if not _signal_group(pgid, signal.SIGTERM):
            self.process.wait()
            return
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline:
            self.process.poll()  # reap the leader so the group check below sees only live members
            if not _group_alive(pgid):
                break
            time.sleep(0.1)
        else:
            _signal_group(pgid, signal.SIGKILL)
        self.process.wait()


def start(
    launcher: Launcher, *, project: str, log_dir: Path, ready_timeout_s: float = READY_TIMEOUT_S
) -> RunningEmulator:
    """Start the emulator on a free loopback port in a new session; return once ``GET /`` answers ``Ok``."""
    port = free_loopback_port()
    log_path = log_dir / f"{launcher.kind.name}-emulator-{port}.log"
    env = dict(os.environ)
    env.setdefault("JAVA", str(launcher.java))  # the Firestore wrapper honours $JAVA
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            launcher.kind.argv(launcher.path, port),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    emulator = RunningEmulator(launcher.kind, LOOPBACK, port, project, process, log_path)
    atexit.register(emulator.stop)  # an interrupted session must not leave a JVM behind
    try:
        _wait_ready(emulator, ready_timeout_s)
    except BaseException:
        emulator.stop()
        raise
    return emulator


def _wait_ready(emulator: RunningEmulator, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if emulator.process.poll() is not None:
            raise EmulatorStartError(
                f"{emulator.kind.title} exited with code {emulator.process.returncode} before it was ready; "
                f"output:\n{emulator.log_tail()}"
            )
        if _answers_ok(emulator.base_url):
            return
        time.sleep(0.1)
    raise EmulatorStartError(
        f"{emulator.kind.title} did not answer 'Ok' on {emulator.base_url}/ within {timeout_s:.0f} s; "
        f"output:\n{emulator.log_tail()}"
    )


def _answers_ok(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(base_url + "/", timeout=1.0) as response:  # noqa: S310 - fixed http loopback URL
            return bool(response.status == 200 and response.read().strip() == b"Ok")
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def _signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Send ``sig`` to the group; False when the group is already gone."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def _group_alive(pgid: int) -> bool:
    """True while a member of the group still runs. Zombies do not count: an orphaned child is reaped by PID 1
    whenever it gets to it (every couple of seconds in some containers), but it already let go of its port."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited while we looked
        state, group = fields[0], int(fields[2])
        if group == pgid and state not in ("Z", "X"):
            return True
    return False


def reset_firestore(emulator: RunningEmulator, *, database: str = "(default)") -> None:
    """Empty the emulator's database (docs/reference/gcp-local.md §2.3): one DELETE, answered 200."""
    url = f"{emulator.base_url}/emulator/v1/projects/{emulator.project}/databases/{database}/documents"
    request = urllib.request.Request(url, method="DELETE")  # noqa: S310 - fixed http loopback URL
    with urllib.request.urlopen(request, timeout=10.0) as response:  # noqa: S310 - fixed http loopback URL
        if response.status != 200:
            raise RuntimeError(f"Firestore emulator reset answered {response.status}, expected 200")

"""The emulator helpers: skip reasons name the missing piece, and stop() leaves no process of the group behind.

The lifecycle test uses a stand-in launcher with the Firestore wrapper's shape (a bash script that forks a
server child and waits), so it runs on machines without google-cloud-cli and takes well under a second.
"""

from __future__ import annotations

import os
import stat
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.emulators import FIRESTORE, PUBSUB, EmulatorKind, Launcher, Missing, locate, start

NOWHERE: tuple[Path, ...] = ()


def _executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def bare_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH with neither gcloud nor java, and no SDK or JAVA_HOME configured."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("CLOUDSDK_ROOT_DIR", raising=False)
    monkeypatch.delenv("JAVA_HOME", raising=False)
    return empty


def test_without_google_cloud_cli_the_reason_says_it_is_not_installed(bare_path: Path) -> None:
    found = locate(FIRESTORE, usual_places=NOWHERE)
    assert isinstance(found, Missing)
    assert found.reason.startswith("Firestore emulator not found: google-cloud-cli is not installed")
    assert found.reason.endswith("emulator tests skipped")


def test_without_the_component_the_reason_names_it(
    bare_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sdk = tmp_path / "sdk"
    (sdk / "platform").mkdir(parents=True)
    monkeypatch.setenv("CLOUDSDK_ROOT_DIR", str(sdk))
    found = locate(PUBSUB, usual_places=NOWHERE)
    assert isinstance(found, Missing)
    assert f"google-cloud-cli at {sdk} has no pubsub-emulator component" in found.reason


def test_without_java_the_reason_says_java_is_missing(
    bare_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sdk = tmp_path / "sdk"
    _executable(sdk / FIRESTORE.launcher, "#!/bin/sh\nexit 1\n")
    monkeypatch.setenv("CLOUDSDK_ROOT_DIR", str(sdk))
    found = locate(FIRESTORE, usual_places=NOWHERE)
    assert isinstance(found, Missing)
    assert "java is not installed" in found.reason


def test_with_sdk_component_and_java_the_launcher_is_found(
    bare_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sdk = tmp_path / "sdk"
    launcher = _executable(sdk / FIRESTORE.launcher, "#!/bin/sh\nexit 1\n")
    java = _executable(tmp_path / "jdk" / "bin" / "java", "#!/bin/sh\nexit 0\n")
    monkeypatch.setenv("CLOUDSDK_ROOT_DIR", str(sdk))
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    assert locate(FIRESTORE, usual_places=NOWHERE) == Launcher(FIRESTORE, launcher, java)


SERVER = textwrap.dedent(
    """
    import http.server, os, sys
    port = int(next(a for a in sys.argv if a.startswith("--port=")).split("=", 1)[1])
    with open(os.environ["FAKE_EMULATOR_PIDFILE"], "w") as f:
        f.write(str(os.getpid()))

    class Ok(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"Ok")

        def log_message(self, *args):
            pass

    http.server.HTTPServer(("127.0.0.1", port), Ok).serve_forever()
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purpose once its state is Z.
    status = Path(f"/proc/{pid}/stat")
    return not (status.exists() and status.read_text().split(")")[-1].split()[0] == "Z")


def test_stop_ends_the_forked_child_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = tmp_path / "server.py"
    server.write_text(SERVER)
    pidfile = tmp_path / "child.pid"
    wrapper = _executable(
        tmp_path / "fake-emulator",
        f'#!/bin/bash\n"{sys.executable}" "{server}" "$@" &\nwait\n',  # forks, like the Firestore wrapper
    )
    monkeypatch.setenv("FAKE_EMULATOR_PIDFILE", str(pidfile))
    kind = EmulatorKind("fake", "Fake emulator", "fake-emulator", "fake-emulator", "FAKE_EMULATOR_HOST")

    emulator = start(Launcher(kind, wrapper, Path(sys.executable)), project="demo-tpuctl", log_dir=tmp_path)
    child = int(pidfile.read_text())
    assert child != emulator.process.pid and _alive(child)
    assert emulator.host_port == f"127.0.0.1:{emulator.port}"

    emulator.stop()
    assert emulator.process.returncode is not None
    assert not _alive(child)
    emulator.stop()  # a second stop is harmless

"""A stand-in for ``gcloud compute start-iap-tunnel``, copied as an executable ``gcloud`` into a test's PATH.

Standard library only: it runs with the child environment the adapter builds (no PYTHONPATH, no venv). It keeps
its state in files beside itself, so a test can read what happened and script what happens next:

- ``gcloud-calls.jsonl``: one line per run: its argv (without argv[0]), argv[0], its whole environment, its pid
  and process group, and the pid of a helper child it starts (real gcloud is a shell wrapper around Python:
  stopping the tunnel must stop the whole group, not only the leader).
- ``gcloud-routes.json``: what each instance does, by name: ``{"forward": "127.0.0.1:PORT"}`` listens on the
  requested local port and forwards every connection there (the test's stand-in for vLLM on the VM);
  ``{"error": "text"}`` prints that to stderr and exits 1 (IAP refusing); ``{"hang": true}`` never listens.
  An instance with no route fails as gcloud does for an instance it cannot find.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

STATE = Path(__file__).resolve().parent
CALLS = STATE / "gcloud-calls.jsonl"
ROUTES = STATE / "gcloud-routes.json"


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)


def _serve(host: str, port: int, forward: str) -> None:
    target_host, target_port = forward.rsplit(":", 1)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind((host, port))
    listener.listen(16)
    sys.stderr.write(f"Listening on port [{port}].\n")
    sys.stderr.flush()
    while True:
        client, _ = listener.accept()
        try:
            upstream = socket.create_connection((target_host, int(target_port)), timeout=5)
        except OSError:
            client.close()
            continue
        for source, sink in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pipe, args=(source, sink), daemon=True).start()


def main(argv: list[str]) -> int:
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    record = {
        "argv0": sys.argv[0],
        "argv": argv,
        "env": dict(os.environ),
        "pid": os.getpid(),
        "pgid": os.getpgid(0),
        "helper_pid": helper.pid,
    }
    with CALLS.open("a", encoding="utf-8") as calls:
        calls.write(json.dumps(record) + "\n")
    if argv[:2] != ["compute", "start-iap-tunnel"] or len(argv) < 4:
        sys.stderr.write("ERROR: (gcloud) this fake knows only `compute start-iap-tunnel`\n")
        return 2
    instance = argv[2]
    flags = dict(arg[2:].split("=", 1) for arg in argv[4:] if arg.startswith("--") and "=" in arg)
    routes = json.loads(ROUTES.read_text(encoding="utf-8")) if ROUTES.exists() else {}
    route = routes.get(instance)
    sys.stderr.write("Testing if tunnel connection works.\n")
    sys.stderr.flush()
    if route is None:
        zone, project = flags.get("zone", "?"), flags.get("project", "?")
        sys.stderr.write(
            "ERROR: (gcloud.compute.start-iap-tunnel) Could not fetch resource:\n"
            f" - The resource 'projects/{project}/zones/{zone}/instances/{instance}' was not found\n"
        )
        return 1
    if route.get("error"):
        sys.stderr.write(str(route["error"]) + "\n")
        return 1
    if route.get("hang"):
        while True:
            time.sleep(60)
    host, port = flags["local-host-port"].rsplit(":", 1)
    _serve(host, int(port), str(route["forward"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A byte relay from a unix socket to libtpu's runtime metrics port, run inside the serving container.

Why: the serving container has no network (``--net=none``), so libtpu's metrics service listens on that
container's own loopback, out of the node agent's reach. The startup script starts this relay in the container
beside vLLM; it listens on a socket in the directory the agent mounts and copies bytes to ``127.0.0.1:PORT``
(gRPC over HTTP/2 passes through untouched). Standard library only: it runs on the image's Python with nothing
else on its path, and dies with the container.

Usage: ``python3 metrics_relay.py SOCKET PORT``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading

__all__ = ["relay", "serve"]

_CHUNK = 65536


def relay(source: socket.socket, target: socket.socket) -> None:
    """Copy ``source`` to ``target`` until either side closes; then shut the other direction down too."""
    with contextlib.suppress(OSError):
        while chunk := source.recv(_CHUNK):
            target.sendall(chunk)
    for side in (source, target):
        with contextlib.suppress(OSError):
            side.shutdown(socket.SHUT_RDWR)


def _connect(client: socket.socket, port: int) -> None:
    try:
        upstream = socket.create_connection(("127.0.0.1", port), timeout=5)
    except OSError:
        client.close()  # no metrics service yet: the agent's read fails as UNAVAILABLE and tries again later
        return
    upstream.settimeout(None)
    threading.Thread(target=relay, args=(client, upstream), daemon=True).start()
    relay(upstream, client)
    client.close()
    upstream.close()


def serve(path: str, port: int, stop: threading.Event | None = None) -> None:
    """Accept on the unix socket ``path`` (a stale one is replaced) and relay each connection to ``port``."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(16)
    listener.settimeout(0.5)
    while stop is None or not stop.is_set():
        try:
            client, _ = listener.accept()
        except TimeoutError:
            continue
        client.settimeout(None)
        threading.Thread(target=_connect, args=(client, port), daemon=True).start()
    listener.close()


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))

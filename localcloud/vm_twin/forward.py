"""Byte pipes between the VM twin's network namespace and this machine's loopback, through unix sockets.

Why: each VM twin has its own network namespace (its own ``127.0.0.1``, so every VM's vLLM listens on port 8000
as on a TPU VM). Unix sockets are files, so they cross network namespaces: a VM reaches a service of the local
cloud (the metadata server, the Google API stand-ins, the simulator) through a TCP listener inside the VM that
pipes into a unix socket outside it, and the controller reaches the VM's port 8000 the other way round.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from pathlib import Path

__all__ = ["Forwarder", "tcp_listener", "tcp_to", "unix_listener", "unix_to"]

_CHUNK = 64 * 1024


def tcp_listener(port: int, host: str = "127.0.0.1") -> socket.socket:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(64)
    return listener


def unix_listener(path: Path) -> socket.socket:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    path.chmod(0o600)
    listener.listen(64)
    return listener


def tcp_to(port: int, host: str = "127.0.0.1") -> Callable[[], socket.socket]:
    return lambda: socket.create_connection((host, port), timeout=10)


def unix_to(path: Path) -> Callable[[], socket.socket]:
    def connect() -> socket.socket:
        peer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        peer.settimeout(10)
        try:
            peer.connect(str(path))
        except OSError:
            peer.close()
            raise
        return peer

    return connect


class Forwarder:
    """Accept on ``listener``; pipe each connection both ways to a fresh ``connect()``; ``close()`` ends it all."""

    def __init__(self, listener: socket.socket, connect: Callable[[], socket.socket], name: str) -> None:
        self.listener = listener
        self._connect = connect
        self._name = name
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, name=f"forward-{name}", daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sockets = [self.listener, *self._open]
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                peer = self._connect()
            except OSError:
                client.close()  # nothing listens on the far side: the client sees its connection closed
                continue
            peer.settimeout(None)
            client.settimeout(None)
            with self._lock:
                if self._closed:
                    client.close()
                    peer.close()
                    return
                self._open.update((client, peer))
            threading.Thread(target=self._pair, args=(client, peer), daemon=True).start()

    def _pair(self, client: socket.socket, peer: socket.socket) -> None:
        """Pipe both ways; close both sockets once both directions ended."""
        back = threading.Thread(target=_pipe, args=(peer, client), daemon=True)
        back.start()
        _pipe(client, peer)
        back.join()
        with self._lock:
            self._open.difference_update((client, peer))
        for sock in (client, peer):
            with contextlib.suppress(OSError):
                sock.close()


def _pipe(source: socket.socket, target: socket.socket) -> None:
    try:
        while data := source.recv(_CHUNK):
            target.sendall(data)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        target.shutdown(socket.SHUT_WR)

"""A stand-in's HTTP server on a free loopback port: one place for its thread, port, start and stop.

Why: the twin's HTTP stand-ins (the Google APIs, the Hugging Face Hub, each VM's metadata server) each need a
threaded server whose handlers reach the stand-in they answer for; the same dozen lines in each had drifted (one
``stop`` hung when the server had never been started).
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["LoopbackStandIn", "StandInServer"]


class StandInServer(ThreadingHTTPServer):
    """A threaded HTTP server on ``host`` (any free port) whose handlers reach ``stand_in`` as
    ``self.server.stand_in``; ``stop`` is safe whether or not it was started."""

    daemon_threads = True

    def __init__(
        self, handler: type[BaseHTTPRequestHandler], stand_in: object, *, name: str, host: str = "127.0.0.1"
    ) -> None:
        super().__init__((host, 0), handler)
        self.stand_in = stand_in
        self._name = name
        self._serving: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def start(self) -> None:
        self._serving = threading.Thread(target=self.serve_forever, name=self._name, daemon=True)
        self._serving.start()

    def stop(self) -> None:
        if self._serving is not None:
            self.shutdown()
            self._serving = None
        self.server_close()


class LoopbackStandIn:
    """What a stand-in served by its ``_server`` offers callers: the port, the base URL, start and stop."""

    _server: StandInServer

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> str:
        self._server.start()
        return self.base_url

    def stop(self) -> None:
        """Stop serving (a no-op for an instance never started)."""
        self._server.stop()

"""The twin's stand-in HTTP server: handlers reach their stand-in, and stop is safe started or not."""

from __future__ import annotations

import threading
import urllib.request
from http.server import BaseHTTPRequestHandler

from localcloud.vm_twin.loopback_http import StandInServer


class _Echo(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = str(self.server.stand_in["answer"]).encode()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_the_handler_reaches_its_stand_in_on_a_loopback_port_until_stopped() -> None:
    server = StandInServer(_Echo, {"answer": 42}, name="echo")
    assert server.server_address[0] == "127.0.0.1" and server.port > 0
    server.start()
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/", timeout=5) as response:
        assert response.read() == b"42"
    server.stop()
    assert server.socket.fileno() == -1, "the listening socket is closed"


def test_stopping_a_server_never_started_returns_at_once() -> None:
    server = StandInServer(_Echo, {}, name="never-started")
    stopper = threading.Thread(target=server.stop, daemon=True)
    stopper.start()
    stopper.join(timeout=5)
    assert not stopper.is_alive(), "stop() waited for a serve loop that never ran"

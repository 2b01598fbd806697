"""``tpuctl ui``: serve the status page (``mcp_client_gateway.status_page``) on loopback until Ctrl-C.

Deployments and their phases, each deployment's timeline, SLI charts from the monitor's samples, the capacity hunt
and benchmark curves, read through the same gateway core as every other command; read-only.
"""

from __future__ import annotations

import argparse
from typing import Any

from mcp_client_gateway.cli_output import Output
from mcp_client_gateway.core import GatewayCore
from mcp_client_gateway.status_page.server import LOOPBACK_HOSTS, StatusPage

__all__ = ["DEFAULT_UI_PORT", "add_ui_command", "cmd_ui"]

DEFAULT_UI_PORT = 8765


def add_ui_command(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register ``tpuctl ui`` on the top-level subparsers."""
    ui = sub.add_parser("ui", parents=[common], help="serve the read-only status page on loopback")
    ui.add_argument("--port", type=_port, default=DEFAULT_UI_PORT, help=f"loopback port (default {DEFAULT_UI_PORT})")
    ui.add_argument("--host", choices=LOOPBACK_HOSTS[:2], default="127.0.0.1", help="loopback address to bind")
    ui.set_defaults(handler=cmd_ui)


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:20]!r} is not a port number; e.g. --port 8765") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is outside 0-65535; e.g. --port 8765")
    return port


def cmd_ui(core: GatewayCore, args: argparse.Namespace, out: Output) -> int:
    """Serve until interrupted; 0 on Ctrl-C."""
    try:
        page = StatusPage(core, host=args.host, port=args.port)
    except OSError as exc:
        out.note(f"tpuctl ui: cannot listen on {args.host}:{args.port} ({exc.strerror}); try --port 0 for any free one")
        return 2
    out.note(f"status page: {page.url} (read-only; Ctrl-C stops it)")
    try:
        page.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        page.stop()
    return 0

"""``python -m mcp_client_gateway``: serve the MCP gateway over stdio. Stdout is the wire; logs go to stderr.

Configuration comes from ``TPUCTL_*`` variables; the flags below override them, for clients that cannot
expand variables in their config (Antigravity).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mcp_client_gateway", description=__doc__)
    parser.add_argument("--backend", choices=("local", "gcp"), help="overrides TPUCTL_BACKEND")
    parser.add_argument("--project", help="Google Cloud project id (overrides TPUCTL_PROJECT)")
    parser.add_argument("--data-dir", help="embedded stack folder (overrides TPUCTL_DATA_DIR)")
    parser.add_argument(
        "--endpoint-access",
        choices=("direct", "iap"),
        help="how live calls reach vLLM: direct or an IAP tunnel (overrides TPUCTL_ENDPOINT_ACCESS)",
    )
    parser.add_argument(
        "--toolset",
        choices=("read-only", "operate", "all"),
        help="the tools to serve: read-only (change nothing), operate (all but delete) or all "
        "(overrides TPUCTL_TOOLSET; default all)",
    )
    parser.add_argument("--read-only", action="store_true", help="serve only the tools that change nothing")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from shared.config import Settings
    from shared.logging import configure_logging
    from shared.tracing import configure_tracing

    overrides: dict[str, Any] = {}
    if args.read_only or args.toolset:  # the flags override TPUCTL_TOOLSET
        from mcp_client_gateway.tools.common import resolve_toolset

        try:
            overrides["toolset"] = resolve_toolset(args.toolset, read_only=args.read_only)
        except ValueError as exc:
            print(f"tpuctl gateway: {exc}", file=sys.stderr)
            return 2
    if args.backend:
        overrides["backend"] = args.backend
    if args.project:
        overrides["project"] = args.project
    if args.data_dir:
        overrides["data_dir"] = args.data_dir
    if args.endpoint_access:
        overrides["endpoint_access"] = args.endpoint_access
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        problems = "; ".join(str(error.get("msg", "")) for error in exc.errors(include_url=False, include_input=False))
        print(f"tpuctl gateway: bad configuration: {problems}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, stream=sys.stderr)
    configure_tracing(settings.trace_export, "tpuctl-gateway", project=settings.project)  # the SDK spans each call

    from mcp_client_gateway.composition import build_ports, warm_up
    from mcp_client_gateway.server import build_server

    ports = build_ports(settings)
    try:
        build_server(ports, toolset=settings.toolset, warm_up=lambda: warm_up(ports)).run("stdio")
    finally:
        ports.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Moved: the gateway's composition root is ``mcp_client_gateway.composition``. This name is kept so that
``from mcp_client_gateway.ports import build_ports`` (tests, scripts) keeps working; new code imports
``composition`` (``shared.ports`` holds the port interfaces, which this module never did)."""

from __future__ import annotations

from mcp_client_gateway.composition import build_ports, local_log_dir, warm_up

__all__ = ["build_ports", "local_log_dir", "warm_up"]

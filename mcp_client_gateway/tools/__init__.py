"""The MCP tools, registered per capability on a :class:`~mcp_client_gateway.tools.common.ToolSet`.

No ``from __future__ import annotations`` in these modules: the SDK reads the tool signatures at registration.
"""

"""mcp_client_gateway."""

"""What the MCP face raises (beside the domain's own errors)."""

from __future__ import annotations

from service.core.errors import ConnectorError


class McpSdkUnsupported(ConnectorError):
    """The installed `mcp` SDK is not one the connector's MCP face was written for (the message names it)."""

    code = "mcp_sdk_unsupported"


class NoVerifiedUser(ConnectorError):
    """The request carries no verified identity (no bearer the server's token verifier accepted, or one without a
    subject), so the connector cannot know whose authorization to get."""

    code = "no_verified_user"

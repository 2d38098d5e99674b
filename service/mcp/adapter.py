"""The one module that touches the `mcp` SDK's internals (the official MCP Python SDK, the range in `SUPPORTED`).

A tool gets a per-request `ServerSession` (`ctx.session`); the SDK (2.3) offers no public way from it to the client's
`Connection`, the per-client object that lives as long as the connection does (its standalone channel for
notifications, its `state`, its `exit_stack` unwound when it closes). The connector binds each elicitation to that
connection, so this module reads it (`ServerSession._connection`) after checking the SDK's version. Nothing outside
this module names an SDK private attribute.
"""

from __future__ import annotations

from mcp.server.connection import Connection
from mcp.server.session import ServerSession

from service.faces.sdk import in_range, installed_version

from .errors import McpSdkUnsupported

SDK_DISTRIBUTION = "mcp"
SUPPORTED = ((2, 3, 0), (2, 4, 0))  # [lowest, first unsupported): what this module was written and tested for
SUPPORTED_TEXT = ">=2.3,<2.4"


def sdk_version() -> str:
    return installed_version(SDK_DISTRIBUTION)


def check_sdk_version(version: str | None = None) -> None:
    """Raise `McpSdkUnsupported` unless the installed SDK is in the range this face was written for."""
    version = sdk_version() if version is None else version
    if not in_range(version, SUPPORTED):
        raise McpSdkUnsupported(
            f"{SDK_DISTRIBUTION} {version} is not supported: the connector's MCP face was written for "
            f"{SDK_DISTRIBUTION} {SUPPORTED_TEXT} (install a version in that range)"
        )


def connection_of(session: ServerSession) -> Connection:
    """The client connection a request's session belongs to. Raises `McpSdkUnsupported`."""
    check_sdk_version()
    connection = getattr(session, "_connection", None)
    if not isinstance(connection, Connection):
        raise McpSdkUnsupported("the MCP SDK's ServerSession no longer holds its Connection where this face reads it")
    return connection

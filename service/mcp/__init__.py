"""The protocol to clients for MCP servers: URL-mode elicitation on the official `mcp` SDK. The only package that
imports it (install the `[mcp]` extra).

- `authorizer`: `McpAuthorizer`, a tool's `request_authorization` (ask on the client's connection and wait) and
  `require_authorization` (the `-32042` error and the client's retry), over the protocol-neutral `Lifecycle` port
  (`service.faces`), and the once-only `notifications/elicitation/complete` to the client that asked;
- `rounds`: the 2026-07-28 input-required round trip (no server-to-client request, no completion notification);
- `capabilities`: the elicitation modes a client advertised, by MCP's rules (`{}` means form only);
- `identity`: the user, from the verified bearer of MCP's own authorization;
- `link`: `McpLink`, one client connection and where a completion is sent on it;
- `answers`: the client's answer as the lifecycle records it; `errors`: what this face raises;
- `adapter`: the one module that touches SDK internals (and checks the SDK's version first).
"""

from .adapter import check_sdk_version
from .authorizer import McpAuthorizer, McpContext
from .capabilities import advertised_modes, url_mode_advertised
from .errors import McpSdkUnsupported, NoVerifiedUser
from .identity import user_from_access_token
from .link import COMPLETE_METHOD, McpLink
from .rounds import ROUND_KEY

__all__ = [
    "COMPLETE_METHOD",
    "ROUND_KEY",
    "McpAuthorizer",
    "McpContext",
    "McpLink",
    "McpSdkUnsupported",
    "NoVerifiedUser",
    "advertised_modes",
    "check_sdk_version",
    "url_mode_advertised",
    "user_from_access_token",
]

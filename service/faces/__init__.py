"""What every protocol face shares: the elicitation lifecycle as a face drives it, wherever it runs.

A face (`service.acp` for ACP, `service.mcp` for MCP) speaks its protocol on the client's connection; what lies under
it (stored grants, elicitation rows and their one terminal state, the once-only telling of a completion) is the same
for every protocol and is reached through the `Lifecycle` port:

- `lifecycle`: the port (`Lifecycle`, `AuthorizationAsk`) a face drives;
- `embedded`: `EmbeddedLifecycle`, the port in process over `Elicitations` and the event bus (the sidecar client's
  implementation is over HTTP, in `service.client`).

Nothing here knows a protocol or imports a protocol SDK.
"""

from .embedded import EmbeddedLifecycle
from .lifecycle import AuthorizationAsk, CompletionListener, Lifecycle

__all__ = ["AuthorizationAsk", "CompletionListener", "EmbeddedLifecycle", "Lifecycle"]

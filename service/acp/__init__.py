"""The protocol to clients: ACP, on the official `acp` SDK. The only package that imports it.

- `capabilities`: whether a client advertised URL-mode elicitation;
- `link`: `AcpLink`, one client connection (initialize params, our pending requests, v2 state updates);
- `messages`: `elicitation/create` (URL mode) and `elicitation/complete`;
- `foreground`: v2 foreground state per session;
- `authorizer`: `AcpAuthorizer`, one authorization over one connection, and completion delivery;
- `face`: `AgentCalls`, the agent's `attach` and `request_authorization`, declared once for the embedded
  connector and the sidecar client;
- the `Lifecycle` port `AcpAuthorizer` drives and `EmbeddedLifecycle`, its in-process implementation, are
  protocol-neutral and live in `service.faces` (re-exported here);
- `jsonrpc`, `wire`: the checks every incoming message passes, and `GuardedTransport`, the connector's own stream
  under the SDK's `Connection` (validation, `$/cancel_request` served, the end of the connection noticed);
- `adapter`: the one module that touches SDK internals (and checks the SDK's version first).
"""

from service.faces import AuthorizationAsk, EmbeddedLifecycle, Lifecycle

from .adapter import AgentConnection, check_sdk_version
from .authorizer import AcpAuthorizer
from .capabilities import url_mode_advertised
from .face import AgentCalls
from .link import AcpLink, ForegroundState, StateListener

__all__ = [
    "AcpAuthorizer",
    "AcpLink",
    "AgentCalls",
    "AgentConnection",
    "AuthorizationAsk",
    "EmbeddedLifecycle",
    "ForegroundState",
    "Lifecycle",
    "StateListener",
    "check_sdk_version",
    "url_mode_advertised",
]

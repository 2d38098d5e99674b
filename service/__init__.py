"""ACP OAuth connector: get a user's third-party authorization through ACP URL-mode elicitation.

Tokens stay server-side and encrypted; the agent uses them through `Connector.http(...)`.

Every name is imported on first use (PEP 562): importing any submodule imports this package first, so a process
that never speaks ACP (`acp-connector keys`, `migrate`, a sidecar) does not pay for the SDK's schema, and
`acp-connector --help` not for the runtime at all.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .acp import AcpLink, ForegroundState, url_mode_advertised
    from .bootstrap import generate_key, migrate_database, use_development_key
    from .client import SidecarClient
    from .config import Settings, load_settings
    from .connector import Connector
    from .core.errors import (
        AccountChoiceNeeded,
        AcpSdkUnsupported,
        ClientNotInitialized,
        ConfigError,
        ConnectorError,
        FlowRefused,
        GrantNeedsUser,
        NotAuthorized,
        ProviderError,
        ProviderNotConfigured,
        ProviderUnavailable,
        SchemaNotCurrent,
        UnknownProvider,
    )
    from .core.events import GrantEvent, GrantEventKind
    from .core.health import GrantStatus, HealthReason
    from .core.identity import Identity
    from .core.outcomes import AuthorizationOutcome, AuthorizationStatus, GrantInfo
    from .core.scopes import RequestScope, SessionScope
    from .core.states import ElicitationStatus
    from .core.webhooks import WebhookVerificationError, verify_webhook
    from .mcp import McpAuthorizer, McpSdkUnsupported, NoVerifiedUser, user_from_access_token

_LAZY = {
    "AcpLink": ".acp",
    "ForegroundState": ".acp",
    "url_mode_advertised": ".acp",
    "generate_key": ".bootstrap",
    "migrate_database": ".bootstrap",
    "use_development_key": ".bootstrap",
    "Settings": ".config",
    "load_settings": ".config",
    "Connector": ".connector",
    **dict.fromkeys(
        [
            "AccountChoiceNeeded",
            "AcpSdkUnsupported",
            "ClientNotInitialized",
            "ConfigError",
            "ConnectorError",
            "FlowRefused",
            "GrantNeedsUser",
            "NotAuthorized",
            "ProviderError",
            "ProviderNotConfigured",
            "ProviderUnavailable",
            "SchemaNotCurrent",
            "UnknownProvider",
        ],
        ".core.errors",
    ),
    "GrantEvent": ".core.events",
    "GrantEventKind": ".core.events",
    "GrantStatus": ".core.health",
    "HealthReason": ".core.health",
    "Identity": ".core.identity",
    "AuthorizationOutcome": ".core.outcomes",
    "AuthorizationStatus": ".core.outcomes",
    "GrantInfo": ".core.outcomes",
    "RequestScope": ".core.scopes",
    "SessionScope": ".core.scopes",
    "ElicitationStatus": ".core.states",
    "WebhookVerificationError": ".core.webhooks",
    "verify_webhook": ".core.webhooks",
    "SidecarClient": ".client",
    "McpAuthorizer": ".mcp",
    "McpSdkUnsupported": ".mcp",
    "NoVerifiedUser": ".mcp",
    "user_from_access_token": ".mcp",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "AccountChoiceNeeded",
    "AcpLink",
    "AcpSdkUnsupported",
    "AuthorizationOutcome",
    "AuthorizationStatus",
    "ClientNotInitialized",
    "ConfigError",
    "Connector",
    "ConnectorError",
    "ElicitationStatus",
    "FlowRefused",
    "ForegroundState",
    "GrantEvent",
    "GrantEventKind",
    "GrantInfo",
    "GrantNeedsUser",
    "GrantStatus",
    "HealthReason",
    "Identity",
    "McpAuthorizer",
    "McpSdkUnsupported",
    "NoVerifiedUser",
    "NotAuthorized",
    "ProviderError",
    "ProviderNotConfigured",
    "ProviderUnavailable",
    "RequestScope",
    "SchemaNotCurrent",
    "SessionScope",
    "Settings",
    "SidecarClient",
    "UnknownProvider",
    "WebhookVerificationError",
    "generate_key",
    "load_settings",
    "migrate_database",
    "url_mode_advertised",
    "use_development_key",
    "user_from_access_token",
    "verify_webhook",
]

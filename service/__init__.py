"""ACP OAuth connector: get a user's third-party authorization through ACP URL-mode elicitation.

Tokens stay server-side and encrypted; the agent uses them through `Connector.http(...)`.
"""

from .acp_bridge import AcpLink, ForegroundState, url_mode_advertised
from .config import Settings, load_settings
from .connector import AuthorizationOutcome, AuthorizationStatus, Connector, GrantInfo
from .errors import (
    ConfigError,
    ConnectorError,
    NotAuthorized,
    ProviderError,
    ProviderNotConfigured,
    SchemaNotCurrent,
    UnknownProvider,
)
from .identity import Identity
from .scopes import RequestScope, SessionScope

__all__ = [
    "AcpLink",
    "AuthorizationOutcome",
    "AuthorizationStatus",
    "ConfigError",
    "Connector",
    "ConnectorError",
    "ForegroundState",
    "GrantInfo",
    "Identity",
    "NotAuthorized",
    "ProviderError",
    "ProviderNotConfigured",
    "RequestScope",
    "SchemaNotCurrent",
    "SessionScope",
    "Settings",
    "UnknownProvider",
    "load_settings",
    "url_mode_advertised",
]

"""ACP OAuth connector: get a user's third-party authorization through ACP URL-mode elicitation.

Tokens stay server-side and encrypted; the agent uses them through `Connector.http(...)`.
"""

from .acp import AcpLink, ForegroundState, url_mode_advertised
from .bootstrap import generate_key, migrate_database, use_development_key
from .config import Settings, load_settings
from .connector import Connector
from .core.errors import (
    AcpSdkUnsupported,
    ClientNotInitialized,
    ConfigError,
    ConnectorError,
    FlowRefused,
    NotAuthorized,
    ProviderError,
    ProviderNotConfigured,
    SchemaNotCurrent,
    UnknownProvider,
)
from .core.identity import Identity
from .core.outcomes import AuthorizationOutcome, AuthorizationStatus, GrantInfo
from .core.scopes import RequestScope, SessionScope
from .core.states import ElicitationStatus
from .core.webhooks import WebhookVerificationError, verify_webhook

__all__ = [
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
    "WebhookVerificationError",
    "generate_key",
    "load_settings",
    "migrate_database",
    "url_mode_advertised",
    "use_development_key",
    "verify_webhook",
]

"""Errors the connector raises: each carries a stable code and a human sentence, never a secret."""

from __future__ import annotations


class ConnectorError(Exception):
    """Base class: `code` is stable and machine-readable, the message is for people."""

    code = "connector_error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class ConfigError(ConnectorError):
    """Invalid configuration. The message names the file and the key."""

    code = "config_error"

    def __init__(self, file: str, key: str, problem: str) -> None:
        self.file = file
        self.key = key
        self.problem = problem
        super().__init__(f"{file}: {key}: {problem}")


class ProviderNotConfigured(ConnectorError):
    """The provider exists in the catalog but has no client credentials in the environment."""

    code = "provider_not_configured"


class UnknownProvider(ConnectorError):
    code = "unknown_provider"


class SchemaNotCurrent(ConnectorError):
    """The database is not migrated, or was migrated by a newer version."""

    code = "schema_not_current"


class VaultError(ConnectorError):
    """A ciphertext could not be decrypted (wrong key, tampered, or moved to another row)."""

    code = "vault_error"


class NotAuthorized(ConnectorError):
    """The user holds no grant for this provider with the requested scopes."""

    code = "not_authorized"


class ProviderError(ConnectorError):
    """The provider refused or failed a token request. Never carries the provider's token payload."""

    code = "provider_error"

"""The connector's errors: one tree, each with a stable machine-readable `code` and a sentence for people.

    ConnectorError
    ├── ConfigError                 the configuration (names the file and the key)
    ├── ProviderNotConfigured, UnknownProvider
    ├── SchemaNotCurrent, DatabaseUnavailable
    ├── VaultError
    │   └── GrantUnreadable         ... a stored grant's (its key left the ring): the operator's to fix
    ├── NotAuthorized               no grant covers the request
    ├── AccountChoiceNeeded         several accounts at the provider, and the call named none
    ├── ProviderError               a provider refused or failed
    │   ├── EndpointError           ... at one of its endpoints (its OAuth error code, the HTTP status)
    │   └── IdTokenError            ... with an ID token that failed one check
    ├── DiscoveryError              a provider's discovery document cannot be used
    ├── AcpSdkUnsupported, ClientNotInitialized
    ├── FlowRefused                 a step of an elicitation's flow (the browser or an API caller gets `code`)
    └── SidecarError                a sidecar's `/v1` API refused a call of `SidecarClient`
        └── SidecarUnavailable      ... or could not be reached until the elicitation expired

Outside the tree on purpose: `WebhookVerificationError` (a `ValueError` for receivers of webhooks,
`core/webhooks/signing.py`) and the CLI's `CliError`/`UsageError` (how a command ends, `cli/framework.py`).

Nothing here knows HTTP. `service.web.errors` maps codes to status codes, page titles and sentences for the
browser, and to JSON bodies for the `/v1` API. Messages never carry a secret.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol


class CatalogNames(Protocol):
    """How an error names a provider of the catalog (a `ProviderEntry`)."""

    @property
    def name(self) -> str: ...

    @property
    def shown_name(self) -> str: ...


class ResolvedNames(Protocol):
    """How an error names a resolved provider (a `ResolvedProvider`)."""

    @property
    def display_name(self) -> str: ...


class ConnectorError(Exception):
    """Base class: `code` is stable and machine-readable, the message is for people."""

    code = "connector_error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class ConfigError(ConnectorError):
    """Invalid configuration. The message names the file (or "environment") and the key, never the value."""

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
    """The database is not migrated, or was migrated by a newer version.

    The message names the database (`where`, for the operator's log); `problem` alone is for anyone else.
    """

    code = "schema_not_current"

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where} {problem}")
        self.problem = problem


class DatabaseUnavailable(ConnectorError):
    """The database cannot be reached or opened (wrong URL, server down, no such database, no permission)."""

    code = "database_unavailable"


class PortUnavailable(ConnectorError):
    """A listener cannot bind its address (the port is taken, or the address is not this machine's)."""

    code = "port_unavailable"


class VaultError(ConnectorError):
    """A ciphertext could not be decrypted (wrong key, tampered, or moved to another row)."""

    code = "vault_error"


class GrantUnreadable(VaultError):
    """A stored grant the vault cannot decrypt: its key left the key ring (the operator's to fix: put it back), or
    its ciphertext was altered. Names the grant and its key id, never key material nor the ciphertext."""

    code = "grant_unreadable"

    def __init__(self, grant_id: str, provider: str, key_id: str, *, key_in_ring: bool) -> None:
        if key_in_ring:
            problem = f"does not decrypt under its key {key_id}: its ciphertext was altered or moved"
        else:
            problem = (
                f"is encrypted under key {key_id}, which is not in the vault's key ring: put that key back "
                "(acp-connector keys status lists the keys the grants use)"
            )
        super().__init__(f"grant {grant_id} at {provider} {problem}")
        self.grant_id = grant_id
        self.key_id = key_id


class NotAuthorized(ConnectorError):
    """The user holds no grant for this provider with the requested scopes."""

    code = "not_authorized"


class GrantNeedsUser(NotAuthorized):
    """The user's grant exists but cannot be used until the user authorizes again (`service.core.health`):
    `reason` is the stable code, `sentence` says it in words safe for the user and the model."""

    code = "grant_needs_user"

    def __init__(self, provider: str, *, grant_id: str, reason: str, sentence: str) -> None:
        super().__init__(f"the {provider} grant needs to be authorized again: {sentence}")
        self.grant_id = grant_id
        self.reason = reason
        self.sentence = sentence


class AccountChoiceNeeded(ConnectorError):
    """The user holds grants for several accounts at the provider and the call named none: pass `account=` (an
    account id, or one of `labels`). `labels` names the accounts as the user knows them (the labels they gave, else
    the provider's profile names), never an id or a token."""

    code = "account_choice_needed"

    def __init__(self, provider: str, labels: Sequence[str], message: str | None = None) -> None:
        self.provider = provider
        self.labels = tuple(labels)
        super().__init__(
            message
            or f"the user holds {len(self.labels)} {provider} accounts ({self.listed}): name the one meant "
            "with account="
        )

    @property
    def listed(self) -> str:
        """The labels as a sentence lists them: 'work', 'personal'."""
        return ", ".join(f"'{label}'" for label in self.labels)


class ProviderError(ConnectorError):
    """The provider refused or failed a request. Never carries the provider's token payload."""

    code = "provider_error"
    check: str | None = None  # the ID-token check that failed, when that is what failed


class EndpointError(ProviderError):
    """A provider endpoint refused or failed: `error` is its OAuth error code, `status` the HTTP status (if any).

    `transport` is true when the endpoint could not be reached or answered with something that is not an OAuth
    answer (a sign that its address may have changed); `timed_out` when no answer came in time; `retry_after` is
    the answer's Retry-After in seconds (RFC 9110 §10.2.3: seconds or an HTTP date), when it had a usable one."""

    code = "provider_token_error"

    def __init__(
        self,
        message: str,
        *,
        error: str | None,
        status: int | None,
        transport: bool,
        code: str | None = None,
        timed_out: bool = False,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, code=code)
        self.error = error
        self.status = status
        self.transport = transport
        self.timed_out = timed_out
        self.retry_after = retry_after


class IdTokenError(ProviderError):
    """The ID token failed one check (`check`: signature, iss, aud, azp, exp, iat, nonce, sub, ...)."""

    code = "invalid_id_token"
    check: str

    def __init__(self, entry: ResolvedNames, check: str) -> None:
        super().__init__(f"{entry.display_name} sent an ID token that failed the {check} check")
        self.check = check


class DiscoveryError(ConnectorError):
    """A provider's discovery document could not be used. `field` names the member at fault, if one is."""

    code = "provider_discovery_failed"

    def __init__(self, entry: CatalogNames, url: str, problem: str, field: str | None = None) -> None:
        # People read this on the connect page: the provider by the name they know, and what is wrong.
        super().__init__(f"{entry.shown_name}: the discovery document at {url} {problem}")
        self.provider = entry.name
        self.url = url
        self.problem = problem
        self.field = field


class ProviderUnavailable(ProviderError):
    """The provider could not serve a refresh just now (5xx, 429, a timeout, no connection): nothing stored changed,
    and the call may be retried, not before `retry_after` seconds when that is known."""

    code = "provider_unavailable"

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class AcpSdkUnsupported(ConnectorError):
    """The installed `acp` SDK is not one the connector's ACP adapter was written for (the message names it)."""

    code = "acp_sdk_unsupported"


class ClientNotInitialized(ConnectorError):
    """The client's `initialize` was not seen on the connection, so its capabilities are unknown."""

    code = "client_not_initialized"


class FlowRefused(ConnectorError):
    """A step of an elicitation's flow is refused: the browser (or an API caller) gets `code`, nothing else.

    `detail` holds short, secret-free values a sentence may name (e.g. the provider's error code). `event`,
    when set, is the audit event the refusal was (or is to be) recorded under.
    """

    def __init__(
        self,
        code: str,
        *,
        detail: Mapping[str, str] | None = None,
        event: str | None = None,
        elicitation_id: str | None = None,
        audit: Mapping[str, object] | None = None,
        labels: Sequence[str] = (),
    ) -> None:
        super().__init__(code, code=code)
        self.detail = dict(detail or {})
        self.labels = tuple(labels)  # `account_choice_needed`: the accounts, by label (a /v1 answer lists them)
        self.event = event
        self.elicitation_id = elicitation_id
        self.audit_detail = dict(audit or {})

    def __str__(self) -> str:
        extra = ", ".join(f"{k}={v}" for k, v in self.detail.items())
        return f"{self.code} ({extra})" if extra else self.code


def account_choice_refused(exc: AccountChoiceNeeded) -> FlowRefused:
    """What an API caller is told when its call named no account and the user holds several."""
    return FlowRefused("account_choice_needed", detail={"labels": exc.listed}, labels=exc.labels)


class SidecarError(ConnectorError):
    """The sidecar refused a call: `code` is its stable error code."""


class SidecarUnavailable(SidecarError):
    """The sidecar could not be reached until the elicitation expired: the authorization did not complete.

    The message is a sentence for the user (what happened, since when, and that the request expired)."""

    code = "sidecar_unavailable"

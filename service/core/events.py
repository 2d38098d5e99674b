"""Events: what changed, never a secret. Published after the change is committed.

Three kinds travel on the bus (`service.events`): an elicitation reached a state (`ElicitationEvent`); a grant
was stored, refreshed or deleted (`GrantChanged`, so that caches of grants and tokens, in this process and in
others sharing the database, drop what they hold for it); and a grant's health changed in a way agents and
operators are told about (`GrantEvent`, written to the event log like an elicitation's end: `/v1/events`,
webhooks and the embedded API's `grant_events()` carry it).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from .identity import Identity
from .outcomes import GrantInfo
from .states import ElicitationStatus


@dataclass(frozen=True, slots=True)
class ElicitationEvent:
    """`elicitation_id` reached `status`; `connection_key` names the client connection that asked for it.

    `id`, `at` and `origin` are the event's place and time in the durable event log (`elicitation_events`), where
    every terminal change is written in its own transaction, and the process that wrote it. `reason` and `grant`
    travel only inside the process that made the change (the log holds ids and statuses, nothing else): a waiter
    elsewhere reads them from the store.
    """

    elicitation_id: str
    status: ElicitationStatus
    connection_key: str
    id: int | None = None
    at: datetime | None = None
    origin: str | None = None
    reason: str | None = None
    grant: GrantInfo | None = None
    # The replica holding the connection, when this process knows it (it made the change, or it read the row).
    replica_id: str | None = None


class GrantChange(StrEnum):
    STORED = "stored"  # a new grant, or new tokens and scopes for the same provider account (reconnect)
    REFRESHED = "refreshed"  # new tokens from a refresh
    DELETED = "deleted"  # disconnected


@dataclass(frozen=True, slots=True)
class GrantChanged:
    """The grant `grant_id` of `identity` at `provider` changed as `change` says."""

    grant_id: str
    identity: Identity
    provider: str
    change: GrantChange


class GrantEventKind(StrEnum):
    NEEDS_USER = "grant.needs_user"  # the provider refused the grant for good; `reason` says why
    RECOVERED = "grant.recovered"  # the user authorized again: the same grant is active
    REVOKED = "grant.revoked"  # disconnected, and the provider confirmed the revocation
    DELETED = "grant.deleted"  # disconnected (deleted here; revoked at the provider or not)


@dataclass(frozen=True, slots=True)
class GrantEvent:
    """`kind` happened to the grant `grant_id` of `identity` at `provider` (`account_id` there), for `reason`.

    Ids and a reason code only: never a token. `id`, `at` and `origin` place it in the event log, as for an
    `ElicitationEvent`; `tenant` names the tenant of the grant (`embedded` or an API key's): it and the tenants
    sharing with it are told (None: an event logged before grants had tenants, told to every tenant).
    """

    kind: GrantEventKind
    grant_id: str
    identity: Identity
    provider: str
    account_id: str
    reason: str | None = None
    tenant: str | None = None
    id: int | None = None
    at: datetime | None = None
    origin: str | None = None

    def detail(self) -> dict[str, str]:
        """What the log's `detail` column and an event's JSON hold (no id of the log, no time)."""
        body = {
            "issuer": self.identity.issuer,
            "subject": self.identity.subject,
            "provider": self.provider,
            "account_id": self.account_id,
        }
        return body if self.reason is None else {**body, "reason": self.reason}


LoggedEvent = ElicitationEvent | GrantEvent
Event = ElicitationEvent | GrantChanged | GrantEvent

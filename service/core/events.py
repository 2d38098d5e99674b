"""Events: what changed, never a secret. Published after the change is committed.

Two kinds travel on the bus (`service.events`): an elicitation reached a state (`ElicitationEvent`), and a grant
was stored, refreshed or deleted (`GrantChanged`, so that caches of grants and tokens, in this process and in
others sharing the database, drop what they hold for it).
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


Event = ElicitationEvent | GrantChanged

"""What the event stream and a webhook send for one logged event: ids, statuses and reason codes as JSON, never a
secret; and which tenants a logged event is for.

The event stream sends the event itself (`event_body`); a webhook wraps the same JSON in the Standard Webhooks
envelope (`webhook_body`): `{"type": ..., "timestamp": ..., "data": <the event>}`, `type` being the grant event's
kind (`grant.needs_user`, `grant.recovered`, `grant.revoked`, `grant.deleted`) or `elicitation.<status>` (e.g.
`elicitation.completed`), `timestamp` when the event was logged (ISO 8601, UTC), not when it is delivered."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from ..agent_api import connection_id_of, tenant_of
from ..events import GrantEvent, LoggedEvent
from ..outcomes import TERMINAL_OUTCOMES
from ..tenants import TenantSharing


def for_tenant(event: LoggedEvent, tenant: str, sharing: TenantSharing) -> bool:
    """Whether `tenant` is told about `event`: its own elicitations; a grant event of a grant it sees (its own
    tenant's, or one it shares with), or of none (logged before grants had tenants)."""
    if isinstance(event, GrantEvent):
        return event.tenant is None or sharing.sees(tenant, event.tenant)
    return tenant_of(event.connection_key) == tenant


def event_payload(event: LoggedEvent) -> dict[str, Any]:
    """The one JSON form of a logged event, for the event stream and for webhooks alike (`models.Event`,
    `models.GrantEventBody`)."""
    if isinstance(event, GrantEvent):
        return {
            "id": event.id or 0,
            "type": event.kind.value,
            "grantId": event.grant_id,
            "provider": event.provider,
            "accountId": event.account_id,
            "issuer": event.identity.issuer,
            "subject": event.identity.subject,
            "reason": event.reason,
        }
    return {
        "id": event.id or 0,
        "elicitationId": event.elicitation_id,
        "status": event.status.value,
        "outcome": (outcome.value if (outcome := TERMINAL_OUTCOMES.get(event.status)) is not None else None),
        "connectionId": connection_id_of(event.connection_key),
    }


def event_body(event: LoggedEvent) -> str:
    """`event_payload` as compact JSON: the body every delivery of the event carries."""
    return json.dumps(event_payload(event), separators=(",", ":"))


def event_type(event: LoggedEvent) -> str:
    """The envelope's `type`: a grant event's kind (`grant.<kind>`), or `elicitation.<status>`."""
    if isinstance(event, GrantEvent):
        return event.kind.value
    return f"elicitation.{event.status.value}"


def webhook_body(event: LoggedEvent) -> str:
    """The body of every delivery of `event`, as compact JSON: the Standard Webhooks envelope around
    `event_payload`. Its `timestamp` is the event's time in the log (the same for every attempt)."""
    envelope = {"type": event_type(event), "timestamp": _iso(event.at), "data": event_payload(event)}
    return json.dumps(envelope, separators=(",", ":"))


def _iso(at: datetime | None) -> str:
    """`at` (aware, as the store gives it) as ISO 8601 in UTC with a `Z`."""
    moment = (at or datetime.now(UTC)).astimezone(UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")

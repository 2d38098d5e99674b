"""What a webhook (and the event stream) sends for one logged event: ids, statuses and reason codes as JSON, never
a secret; and which tenants a logged event is for."""

from __future__ import annotations

import json
from typing import Any

from ..agent_api import connection_id_of, tenant_of
from ..events import GrantEvent, LoggedEvent
from ..outcomes import TERMINAL_OUTCOMES


def for_tenant(event: LoggedEvent, tenant: str) -> bool:
    """Whether `tenant` is told about `event`: its own elicitations; a grant event of its tenant, or of none (a
    grant any tenant's key may read, as `GET /v1/grants` does)."""
    if isinstance(event, GrantEvent):
        return event.tenant is None or event.tenant == tenant
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

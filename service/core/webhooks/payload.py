"""What a webhook (and the event stream) sends for one logged event: ids and statuses as JSON, never a secret."""

from __future__ import annotations

import json
from typing import Any

from ..agent_api import connection_id_of
from ..events import ElicitationEvent
from ..outcomes import TERMINAL_OUTCOMES


def event_payload(event: ElicitationEvent) -> dict[str, Any]:
    """The one JSON form of a logged event, for the event stream and for webhooks alike (`models.Event`)."""
    return {
        "id": event.id or 0,
        "elicitationId": event.elicitation_id,
        "status": event.status.value,
        "outcome": (outcome.value if (outcome := TERMINAL_OUTCOMES.get(event.status)) is not None else None),
        "connectionId": connection_id_of(event.connection_key),
    }


def event_body(event: ElicitationEvent) -> str:
    """`event_payload` as compact JSON: the body every delivery of the event carries."""
    return json.dumps(event_payload(event), separators=(",", ":"))

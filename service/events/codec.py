"""What replicas tell each other in a notification: ids and states only, never a secret.

An elicitation event or a grant event travels as its id in the event log (the receiver reads the log from its
cursor, in order); a grant change, which the log does not hold, travels whole (ids: grant, user, provider).
"""

from __future__ import annotations

import json
from typing import Any

from service.core.events import ElicitationEvent, Event, GrantChange, GrantChanged, GrantEvent
from service.core.identity import Identity


def encode(event: Event, origin: str) -> str:
    """The payload announcing `event`, sent by the replica `origin`."""
    body: dict[str, Any]
    if isinstance(event, ElicitationEvent | GrantEvent):  # both are in the event log: its id is enough
        body = {"t": "e", "n": event.id}
    else:
        body = {
            "t": "g",
            "id": event.grant_id,
            "i": event.identity.issuer,
            "u": event.identity.subject,
            "p": event.provider,
            "ch": event.change.value,
        }
    return json.dumps({"o": origin, **body}, separators=(",", ":"))


def decode(payload: str) -> tuple[str, GrantChanged | None]:
    """(the sending replica, the grant change it announces, or None for "the event log has news")."""
    try:
        body = json.loads(payload)
        origin = str(body["o"])
        if body["t"] == "e":
            return origin, None
        if body["t"] == "g":
            identity = Identity(str(body["i"]), str(body["u"]))
            return origin, GrantChanged(str(body["id"]), identity, str(body["p"]), GrantChange(body["ch"]))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"not an event payload ({type(exc).__name__})") from None
    raise ValueError("not an event payload (unknown type)")

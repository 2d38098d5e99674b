"""What replicas tell each other in a notification: ids and states only, never a secret.

A grant event travels as its id in the event log (the receiver reads the log from its cursor, in order). An
elicitation event travels as its id and its row of the log (elicitation id, status, connection key, time: what the
log holds of it), so that a receiver whose cursor is just before it takes it without reading the log. A grant
change, which the log does not hold, travels whole (ids: grant, user, provider). A payload without the event's row
(from an older replica) only says "the event log has news".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from service.core.events import ElicitationEvent, Event, GrantChange, GrantChanged, GrantEvent
from service.core.identity import Identity
from service.core.states import ElicitationStatus


@dataclass(frozen=True, slots=True)
class Heard:
    """A decoded notification: who sent it, and the grant change or logged elicitation event it carries (both None:
    "the event log has news")."""

    origin: str
    grant_change: GrantChanged | None = None
    logged: ElicitationEvent | None = None


def encode(event: Event, origin: str) -> str:
    """The payload announcing `event`, sent by the replica `origin`."""
    body: dict[str, Any]
    if isinstance(event, ElicitationEvent) and event.id is not None and event.at is not None:
        at = event.at.isoformat()
        body = {"t": "e", "n": event.id, "e": event.elicitation_id, "s": event.status.value, "k": event.connection_key}
        body["a"] = at
    elif isinstance(event, ElicitationEvent | GrantEvent):  # in the event log: its id is enough
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


def decode(payload: str) -> Heard:
    """What a notification says (`Heard`)."""
    try:
        body = json.loads(payload)
        origin = str(body["o"])
        if body["t"] == "e":
            if "e" not in body:
                return Heard(origin)
            status = ElicitationStatus(body["s"])
            at = datetime.fromisoformat(str(body["a"]))
            event = ElicitationEvent(str(body["e"]), status, str(body["k"]), id=int(body["n"]), at=at, origin=origin)
            return Heard(origin, logged=event)
        if body["t"] == "g":
            identity = Identity(str(body["i"]), str(body["u"]))
            return Heard(origin, GrantChanged(str(body["id"]), identity, str(body["p"]), GrantChange(body["ch"])))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"not an event payload ({type(exc).__name__})") from None
    raise ValueError("not an event payload (unknown type)")

"""Everything that speaks ACP: reading capabilities, sending elicitation/create and elicitation/complete.

This is the only module that imports `acp`. It works on top of the official SDK's connection objects
and papers over the SDK's gaps here rather than forking it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from acp.exceptions import RequestError
from acp.interfaces import Client
from acp.schema import (
    AcceptElicitationResponse,
    CancelElicitationResponse,
    ClientCapabilities,
    DeclineElicitationResponse,
    ElicitationUrlRequestMode,
    ElicitationUrlSessionMode,
)
from pydantic import ValidationError

from .scopes import ElicitationScope, SessionScope

log = logging.getLogger("service.acp")

# What the agent holds for its client: `acp.AgentSideConnection`, typed by the SDK's protocol.
AgentConnection = Client


def url_mode_advertised(capabilities: ClientCapabilities | Mapping[str, Any] | None) -> bool:
    """True only when the client advertised URL-mode elicitation with an explicit, non-null `url` object.

    Accepts the SDK's `ClientCapabilities` model or the raw JSON object (`clientCapabilities` in ACP v1,
    `capabilities` in v2). An omitted or null `elicitation`, `{}`, and `{"url": null}` advertise nothing.
    """
    if capabilities is None:
        return False
    if isinstance(capabilities, ClientCapabilities):
        elicitation = capabilities.elicitation
        return elicitation is not None and elicitation.url is not None
    raw = capabilities.get("elicitation")
    if not isinstance(raw, Mapping):
        return False
    return isinstance(raw.get("url"), Mapping)


class AnswerKind(StrEnum):
    ACCEPT = "accept"
    DECLINE = "decline"
    CANCEL = "cancel"
    ERROR = "error"  # the client answered with a JSON-RPC error, or an answer we cannot parse
    DISCONNECTED = "disconnected"


@dataclass(frozen=True, slots=True)
class ElicitationAnswer:
    kind: AnswerKind
    error_code: int | None = None
    error_message: str | None = None


async def send_url_elicitation(
    conn: AgentConnection, *, elicitation_id: str, url: str, message: str, scope: ElicitationScope
) -> ElicitationAnswer:
    """Send `elicitation/create` in URL mode and translate the client's answer."""
    mode: ElicitationUrlSessionMode | ElicitationUrlRequestMode
    if isinstance(scope, SessionScope):
        mode = ElicitationUrlSessionMode(
            session_id=scope.session_id,
            tool_call_id=scope.tool_call_id,
            elicitation_id=elicitation_id,
            url=url,
        )
    else:
        mode = ElicitationUrlRequestMode(
            request_id=scope.request_id,
            elicitation_id=elicitation_id,
            url=url,
        )
    try:
        response = await conn.create_elicitation(message, mode)
    except RequestError as exc:
        log.info("elicitation/create answered with error %s", exc.code, extra={"elicitation_id": elicitation_id})
        return ElicitationAnswer(AnswerKind.ERROR, error_code=exc.code, error_message=str(exc))
    except ConnectionError:
        return ElicitationAnswer(AnswerKind.DISCONNECTED)
    except ValidationError:
        return ElicitationAnswer(
            AnswerKind.ERROR, error_code=-32602, error_message="client sent an invalid elicitation response"
        )
    if isinstance(response, AcceptElicitationResponse):
        return ElicitationAnswer(AnswerKind.ACCEPT)
    if isinstance(response, DeclineElicitationResponse):
        return ElicitationAnswer(AnswerKind.DECLINE)
    if isinstance(response, CancelElicitationResponse):
        return ElicitationAnswer(AnswerKind.CANCEL)
    return ElicitationAnswer(AnswerKind.ERROR, error_message="unrecognised elicitation response")


async def send_completion(conn: AgentConnection, elicitation_id: str) -> bool:
    """Send `elicitation/complete`; False (and nothing sent) when the connection is gone."""
    if connection_closed(conn):
        return False
    try:
        await conn.complete_elicitation(elicitation_id=elicitation_id)
    except ConnectionError:
        return False
    return True


def connection_closed(conn: AgentConnection) -> bool:
    """Whether the connection's peer has gone away.

    The SDK (0.12) has no public "closed" signal, so this reads the flags its `Connection` keeps.
    Anything other than an SDK connection is assumed open; sending will tell.
    """
    inner = getattr(conn, "_conn", None)
    return bool(getattr(inner, "_disconnected", False) or getattr(inner, "_closed", False))

"""The elicitation messages: `elicitation/create` in URL mode (and what the client answered), `elicitation/complete`."""

from __future__ import annotations

import logging

from acp.exceptions import RequestError
from acp.schema import (
    AcceptElicitationResponse,
    CancelElicitationResponse,
    DeclineElicitationResponse,
    ElicitationUrlRequestMode,
    ElicitationUrlSessionMode,
)
from pydantic import ValidationError

from service.core.lifecycle import AnswerKind, ClientAnswer
from service.core.scopes import ElicitationScope, SessionScope

from .adapter import AgentConnection
from .link import AcpLink

log = logging.getLogger("service.acp")


async def send_url_elicitation(
    conn: AgentConnection, *, elicitation_id: str, url: str, message: str, scope: ElicitationScope
) -> ClientAnswer:
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
        mode = ElicitationUrlRequestMode(request_id=scope.request_id, elicitation_id=elicitation_id, url=url)
    try:
        response = await conn.create_elicitation(message, mode)
    except RequestError as exc:
        log.info("elicitation/create answered with error %s", exc.code, extra={"elicitation_id": elicitation_id})
        return ClientAnswer(AnswerKind.ERROR, error_code=exc.code)
    except ConnectionError:
        return ClientAnswer(AnswerKind.DISCONNECTED)
    except ValidationError:
        return ClientAnswer(AnswerKind.ERROR, error_code=-32602, message="client sent an invalid elicitation response")
    if isinstance(response, AcceptElicitationResponse):
        return ClientAnswer(AnswerKind.ACCEPT)
    if isinstance(response, DeclineElicitationResponse):
        return ClientAnswer(AnswerKind.DECLINE)
    if isinstance(response, CancelElicitationResponse):
        return ClientAnswer(AnswerKind.CANCEL)
    return ClientAnswer(AnswerKind.ERROR, message="unrecognised elicitation response")


async def send_completion(link: AcpLink, elicitation_id: str) -> bool:
    """Send `elicitation/complete`; False (and nothing sent) when the connection is gone."""
    if link.closed():
        return False
    try:
        await link.conn.complete_elicitation(elicitation_id=elicitation_id)
    except ConnectionError:
        return False
    return True

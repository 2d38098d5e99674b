"""The elicitation messages: `elicitation/create` in URL mode (and what the client answered), `elicitation/complete`.

The request is built with the SDK's models; the answer is read from the raw result, so that an unknown `action` can
be named and a cancel's `_meta.message` (a client refusing by its own policy) is kept. What the answer means for the
elicitation is decided in `service.core.answers` (`ending_of`, applied by `Elicitations.answered`), not here.
"""

from __future__ import annotations

import logging
from typing import Any

from acp.exceptions import RequestError
from acp.schema import CreateUrlRequestElicitationRequest, CreateUrlSessionElicitationRequest

from service.core.answers import AnswerKind, ClientAnswer
from service.core.scopes import ElicitationScope, SessionScope

from .link import AcpLink
from .wire import MALFORMED

log = logging.getLogger("service.acp")

CREATE = "elicitation/create"
COMPLETE = "elicitation/complete"


def create_params(*, elicitation_id: str, url: str, message: str, scope: ElicitationScope) -> dict[str, Any]:
    """The params of a URL-mode `elicitation/create`, scoped to a session (and tool call) or a request."""
    request: CreateUrlSessionElicitationRequest | CreateUrlRequestElicitationRequest
    if isinstance(scope, SessionScope):
        request = CreateUrlSessionElicitationRequest(
            mode="url",
            message=message,
            session_id=scope.session_id,
            tool_call_id=scope.tool_call_id,
            elicitation_id=elicitation_id,
            url=url,
        )
    else:
        request = CreateUrlRequestElicitationRequest(
            mode="url", message=message, request_id=scope.request_id, elicitation_id=elicitation_id, url=url
        )
    return request.model_dump(mode="json", by_alias=True, exclude_none=True)


async def send_url_elicitation(
    link: AcpLink, *, elicitation_id: str, url: str, message: str, scope: ElicitationScope
) -> ClientAnswer:
    """Send `elicitation/create` in URL mode and read the client's answer."""
    params = create_params(elicitation_id=elicitation_id, url=url, message=message, scope=scope)
    try:
        result = await link.request(CREATE, params)
    except RequestError as exc:
        data = exc.data if isinstance(exc.data, dict) else {}
        if data.get("connector") == MALFORMED:
            return ClientAnswer(AnswerKind.ERROR, message=f"malformed_response: {data.get('problem')}")
        log.info("elicitation/create answered with error %s", exc.code, extra={"elicitation_id": elicitation_id})
        return ClientAnswer(AnswerKind.ERROR, error_code=exc.code)
    except ConnectionError:
        return ClientAnswer(AnswerKind.DISCONNECTED)
    return read_answer(result)


def read_answer(result: Any) -> ClientAnswer:
    """What a client's result for `elicitation/create` says."""
    if not isinstance(result, dict):
        return ClientAnswer(AnswerKind.ERROR, message="malformed_response: the result is not an object")
    action = result.get("action")
    if action == "accept":
        return ClientAnswer(AnswerKind.ACCEPT)
    if action == "decline":
        return ClientAnswer(AnswerKind.DECLINE)
    if action == "cancel":
        meta = result.get("_meta")
        reason = meta.get("message") if isinstance(meta, dict) else None
        return ClientAnswer(AnswerKind.CANCEL, client_message=reason if isinstance(reason, str) else None)
    if not isinstance(action, str):
        return ClientAnswer(AnswerKind.ERROR, message="malformed_response: action is missing or not a string")
    return ClientAnswer(AnswerKind.UNKNOWN_ACTION, action=action)


async def send_completion(link: AcpLink, elicitation_id: str) -> bool:
    """Send `elicitation/complete`; False (and nothing sent) when the connection is gone."""
    conn = link.conn
    if link.closed or conn is None:
        return False
    try:
        await conn.complete_elicitation(elicitation_id=elicitation_id)
    except ConnectionError:
        return False
    return True

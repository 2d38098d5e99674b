"""The outermost middleware: a request id on every log line written while a request is served.

The id is random (a client cannot choose what it is logged under), returned in `X-Request-Id` so a user can quote
it, and kept in `request.state.request_id`. The access log line (uvicorn's, written when the response starts)
also gets `duration_ms`, the time until then.
"""

from __future__ import annotations

import secrets
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..logs import bound

REQUEST_ID_HEADER = b"x-request-id"


def new_request_id() -> str:
    return secrets.token_hex(8)


class RequestContext:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = new_request_id()
        scope.setdefault("state", {})["request_id"] = request_id
        started = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            if message["type"] != "http.response.start":
                await send(message)
                return
            message["headers"] = [*message.get("headers", []), (REQUEST_ID_HEADER, request_id.encode())]
            with bound(duration_ms=round((time.perf_counter() - started) * 1000, 1)):
                await send(message)

        with bound(request_id=request_id):
            await self.app(scope, receive, send_with_id)

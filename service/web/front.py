"""The one ASGI middleware in front of the app: what every HTTP request goes through before a route sees it.

In order, for each request:
1. a request id: random (a client cannot choose what it is logged under), bound to every log line written while
   the request is served, kept in `request.state.request_id` and returned in `X-Request-Id`; the access log line
   (uvicorn's, written when the response starts) also gets `duration_ms`, the time until then;
2. the client address: the TCP peer kept, the address a trusted proxy forwarded believed (`ForwardedClient`), and
   made known to `AuditBudget` (`CURRENT_CLIENT`);
3. the rate limits (`RateLimit`): every request counts, malformed ones included;
4. the input checks (`InputGuard`): path, query and declared body size; a streamed body is counted as it comes;
5. the app.
The security headers go on every response, an error page included; an exception no handler took becomes the
error page (when nothing was sent yet) and is raised again for the server to log, as Starlette's
`ServerErrorMiddleware` does.

The server may answer a request itself while the app still works on it: uvicorn answers `400` and closes when the
body turns out malformed (bad chunked framing), and marks the request disconnected only a loop turn later. An app
answer sent in between is refused by the protocol (h11: `Response` in state `MUST_CLOSE`); it is dropped with one
warning line, as a send to a disconnected client is, instead of becoming an "unhandled error" with a traceback.

One layer with one `send` wrapper instead of one per concern: each wrapper is a coroutine call per message and
a closure per request, on every request the connector serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable

import h11
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..core.errors import FlowRefused
from ..logs import bound
from ..rate_limiter import CURRENT_CLIENT
from .client_address import ForwardedClient, client_address
from .inputs import BodyOverLimit, InputGuard, too_large
from .ratelimit import RateLimit
from .security import security_headers, with_security_headers

log = logging.getLogger("service.web")
access_log = logging.getLogger("uvicorn.access")  # uvicorn's access log, written when a response starts

REQUEST_ID_HEADER = b"x-request-id"
DISCONNECT_WAIT_SECONDS = 5.0  # the server closes at once after its own answer: a bound, never reached

Refuse = Callable[[Request, FlowRefused], Awaitable[Response]]
OnError = Callable[[Request, Exception], Awaitable[Response]]


def new_request_id() -> str:
    return secrets.token_hex(8)


class Front:
    def __init__(
        self,
        app: ASGIApp,
        *,
        https: bool,
        forwarded: ForwardedClient,
        rate_limit: RateLimit,
        inputs: InputGuard,
        refuse: Refuse,
        on_error: OnError,
    ) -> None:
        self.app = app
        self.headers = security_headers(https=https)
        self.forwarded = forwarded
        self.rate_limit = rate_limit
        self.inputs = inputs
        self.refuse = refuse
        self.on_error = on_error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = new_request_id()
        scope.setdefault("state", {})["request_id"] = request_id
        started = time.perf_counter()
        response_started = False
        defaults = self.headers
        id_header = (REQUEST_ID_HEADER, request_id.encode())

        answered_by_server = False

        async def send_framed(message: Message) -> None:
            nonlocal response_started, answered_by_server
            if answered_by_server:
                return
            if message["type"] != "http.response.start":
                await send(message)
                return
            response_started = True
            headers = with_security_headers(message.get("headers", ()), defaults)
            headers.append(id_header)
            message["headers"] = headers
            # The access line is written inside this send; where it is filtered out, nothing needs the duration.
            timed = (
                bound(duration_ms=round((time.perf_counter() - started) * 1000, 1))
                if access_log.isEnabledFor(logging.INFO)
                else contextlib.nullcontext()
            )
            with timed:
                try:
                    await send(message)
                except h11.LocalProtocolError:
                    answered_by_server = True
                    log.warning(
                        "the server already answered this request (a malformed body): the app's answer is dropped: "
                        "%s %s",
                        scope["method"],
                        scope["path"],
                    )

        with bound(request_id=request_id):
            request = Request(scope)  # reads the scope when asked: it sees what `apply` changes
            token = None
            try:
                await self.forwarded.apply(scope)
                token = CURRENT_CLIENT.set(client_address(request))
                await self._serve(scope, request, receive, send_framed, lambda: response_started)
                if answered_by_server:
                    # Return only once the server has noticed its own close: it would log an app that returned
                    # "without completing response" otherwise.
                    await _until_disconnected(receive)
            except Exception as exc:
                error_page = await self.on_error(request, exc)  # it logs the error, also when too late to answer
                if not response_started:
                    await error_page(scope, receive, send_framed)
                raise
            finally:
                if token is not None:
                    CURRENT_CLIENT.reset(token)

    async def _serve(
        self, scope: Scope, request: Request, receive: Receive, send: Send, responded: Callable[[], bool]
    ) -> None:
        refused = await self.rate_limit.check(request, scope)
        if refused is not None:
            await refused(scope, receive, send)
            return
        limit = self.inputs.limit_for(scope["path"])
        content_length = chunked = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                content_length = value if content_length is None else content_length
            elif name == b"transfer-encoding":
                chunked = value
        try:
            self.inputs.check(scope, limit, content_length)
        except FlowRefused as exc:
            await (await self.refuse(request, exc))(scope, receive, send)
            return
        # With a Content-Length within the limit the server stops the body there; with neither header there is no
        # body (RFC 9112 6.3). Only a chunked body is counted as it comes.
        counted = receive if chunked is None else _counted(receive, limit)
        try:
            await self.app(scope, counted, send)
        except BodyOverLimit:
            if responded():
                raise
            await (await self.refuse(request, too_large(limit)))(scope, receive, send)
        except ClientDisconnect:
            # A malformed body (the server answered 400 and closed) or a client gone mid-body: nobody to answer.
            log.warning("request body ended early (malformed or disconnected): %s %s", scope["method"], scope["path"])


async def _until_disconnected(receive: Receive) -> None:
    async with asyncio.timeout(DISCONNECT_WAIT_SECONDS):
        while (await receive())["type"] != "http.disconnect":
            pass


def _counted(receive: Receive, limit: int) -> Receive:
    received = 0

    async def counted_receive() -> Message:
        nonlocal received
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > limit:
                raise BodyOverLimit
        return message

    return counted_receive
